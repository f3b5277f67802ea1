"""`tf.data` pipeline from parallel text to batched model inputs.

`make_dataset` runs four stages, each a function of its own:

1. `read_pairs`: files or lists -> aligned lines, pairs with a blank side
   dropped;
2. `tokenize_pairs`: lines -> a dataset of packed examples
   (`pack_source`, `pack_target`; batched, in-graph);
3. (cache -> shuffle -> repeat);
4. `batch_examples`: length bucketing (`resolve_bucket_boundaries`) or
   padded batching; then the model's input dict and prefetch.

Element spec of the returned dataset (batch size and lengths dynamic):

    ({"encoder_inputs": tf.TensorSpec((None, None), tf.int32),   # (B, S)
      "decoder_inputs": tf.TensorSpec((None, None), tf.int32)},  # (B, T)
     tf.TensorSpec((None, None), tf.int32))                      # labels (B, T)

Length semantics: `sequence_length` is the model's maximum sequence length.
`S <= sequence_length` (the source end id included) and `T <= sequence_length`
(decoder inputs start with the start id, labels end with the end id; the
packed target is `sequence_length + 1` long before the teacher-forcing shift).
Each batch is padded with the pad id to its longest sequence (or to its
bucket's upper length with `pad_to_bucket_boundary=True`).
"""

import numbers
import os

import tensorflow as tf

from keras_transformer.data.packing import pack_source_ragged
from keras_transformer.data.packing import pack_target_ragged
from keras_transformer.data.text_files import read_lines
from keras_transformer.data.text_files import read_parallel
from keras_transformer.deprecation import renamed_argument
from keras_transformer.tokenizers.subword_tokenizer import check_alpha
from keras_transformer.validation import check_count

_TOKENIZE_CHUNK = 1024


# Batches made ahead of the training step (`Dataset.prefetch`).
_PREFETCH_BATCHES = 2


def auto_bucket_boundaries(sequence_length):
    """Bucket boundaries used by `make_dataset(bucket_boundaries="auto")`.

    Bucket upper lengths are 8, 12, 16, ... (steps of 4, growing to a
    quarter of the length in multiples of 4 for long sequences) and end with
    `sequence_length`; boundaries follow `tf.data`'s convention (a bucket holds
    lengths `< boundary`), so they are the upper lengths plus one.

    Args:
        sequence_length: int. The model's maximum sequence length.

    Returns:
        list of int, strictly increasing, the last one `sequence_length + 1`.

    Example:

    ```python
    auto_bucket_boundaries(64)  # [9, 13, 17, 21, 25, 29, 33, 41, 49, 61, 65]
    ```
    """
    uppers = []
    upper = 8
    while upper < sequence_length:
        uppers.append(upper)
        upper += max(4, (upper // 4) // 4 * 4)
    uppers.append(sequence_length)
    return [u + 1 for u in uppers]


def _as_lines(data, name):
    if isinstance(data, (str, os.PathLike)):
        return read_lines(data)
    if isinstance(data, (list, tuple)):
        for index, line in enumerate(data):
            if not isinstance(line, str):
                raise ValueError(
                    f"`{name}` must hold sentences (`str`); item {index} is "
                    f"{type(line).__name__}: {line!r:.80}. Decode bytes and drop missing entries first."
                )
        return list(data)
    raise ValueError(
        f"`{name}` must be a path (plain or .gz) or a list of strings. "
        f"Received: type({name})={type(data).__name__}."
    )


def read_pairs(src, tgt):
    """Stage 1: aligned source and target lines, pairs with a blank side
    dropped.

    Args:
        src, tgt: paths (plain or `.gz`, one sentence a line) or lists of
            `str`, aligned line by line.

    Returns:
        `(src_lines, tgt_lines)`, two lists of `str` of one length.

    Raises:
        FileNotFoundError: for a path (or a sentence passed as one) that is
            not a file.
        ValueError: for another type, misaligned inputs, or no pair with
            both sides non-blank.
    """
    for data, name in ((src, "src"), (tgt, "tgt")):
        if isinstance(data, str) and not os.path.exists(data):
            raise FileNotFoundError(
                f"`{name}` is a single string but not an existing file: {data!r:.80}. Pass a path "
                "(plain or .gz, one sentence a line) or a list of sentences ([sentence] for one)."
            )
    if isinstance(src, (str, os.PathLike)) and isinstance(
        tgt, (str, os.PathLike)
    ):
        src_lines, tgt_lines = read_parallel(src, tgt)
    else:
        src_lines, tgt_lines = _as_lines(src, "src"), _as_lines(tgt, "tgt")
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            "`src` and `tgt` must be aligned, one translation per line. "
            f"Received {len(src_lines)} source and {len(tgt_lines)} target "
            "sentences."
        )
    if not any(s.strip() and t.strip() for s, t in zip(src_lines, tgt_lines)):
        raise ValueError(
            "`src` and `tgt` hold no sentence pair: they are empty or every "
            "pair has a blank side, so a model would train on nothing."
        )
    kept = [(s, t) for s, t in zip(src_lines, tgt_lines) if s.strip() and t.strip()]
    return [s for s, _ in kept], [t for _, t in kept]


def tokenize_pairs(src_lines, tgt_lines, src_tokenizer, tgt_tokenizer, sequence_length,
                   subword_alpha=None):
    """Stage 2: a dataset of packed training examples.

    Sources are packed as `t[:sequence_length - 1] + [end]`; targets as
    `[start] + t[:sequence_length - 1] + [end]`, shifted into decoder inputs
    (without the end id) and labels (without the start id). Lines are
    tokenized in chunks, in-graph; examples whose source or target
    tokenizes to nothing are dropped.

    Args:
        src_lines, tgt_lines: aligned lists of `str` (from `read_pairs`).
        src_tokenizer, tgt_tokenizer: tokenizers with `tokenize` (rank-1
            strings to ragged ids), `end_id` (and the target's `start_id`).
        sequence_length: int >= 2.
        subword_alpha: optional float in `(0, 1]`: tokenize with the
            tokenizers' `sample(lines, subword_alpha)` (subword
            regularization), a new segmentation on every pass over the
            dataset; a line whose sample would be cut at `sequence_length`
            where its `tokenize` ids would not keeps those. `None` (the
            default): `tokenize`.

    Returns:
        `tf.data.Dataset` of `(encoder_inputs, decoder_inputs, labels)`,
        int32 vectors of lengths `S <= sequence_length` and `T <=
        sequence_length` (decoder inputs and labels one length).
    """
    src_end = int(src_tokenizer.end_id)
    tgt_start, tgt_end = int(tgt_tokenizer.start_id), int(tgt_tokenizer.end_id)

    room = sequence_length - 1  # tokens a packed side keeps (with its start or end id)

    def tokenize(tokenizer, lines):
        fixed = tokenizer.tokenize(lines)
        if subword_alpha is None:
            return fixed
        # A sampled segmentation is longer than the fixed one; where it
        # would be cut (and the pair lose its alignment) but the fixed one
        # would not, the line keeps its fixed segmentation.
        sampled = tokenizer.sample(lines, subword_alpha)
        keep_fixed = tf.logical_and(sampled.row_lengths() > room, fixed.row_lengths() <= room)
        rows = tf.range(tf.shape(lines, out_type=tf.int64)[0])
        both = tf.concat([sampled, fixed], axis=0)
        return tf.gather(both, rows + tf.cast(keep_fixed, tf.int64) * tf.size(rows, out_type=tf.int64))

    def tokenize_and_pack(src_batch, tgt_batch):
        # Batched: ragged ops on a chunk are much faster than per example.
        encoder_inputs = pack_source_ragged(
            tokenize(src_tokenizer, src_batch), sequence_length, end_id=src_end
        )
        decoder_inputs, labels = pack_target_ragged(
            tokenize(tgt_tokenizer, tgt_batch),
            sequence_length + 1,
            start_id=tgt_start,
            end_id=tgt_end,
        )
        return encoder_inputs, decoder_inputs, labels

    def not_empty(encoder_inputs, decoder_inputs, labels):
        # Only the special id left: the side tokenized to nothing.
        return tf.logical_and(
            tf.size(encoder_inputs) > 1, tf.size(decoder_inputs) > 1
        )

    ds = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant(src_lines, dtype=tf.string, shape=[len(src_lines)]),
            tf.constant(tgt_lines, dtype=tf.string, shape=[len(tgt_lines)]),
        )
    )
    ds = ds.batch(_TOKENIZE_CHUNK).map(
        tokenize_and_pack, num_parallel_calls=tf.data.AUTOTUNE
    )
    # Unbatched ragged rows have a RaggedTensorSpec of ragged_rank 0; the
    # identity map turns them into plain tensors for padded batching.
    ds = ds.unbatch().filter(not_empty)
    return ds.map(
        lambda *parts: tuple(tf.identity(p) for p in parts),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def resolve_bucket_boundaries(bucket_boundaries, sequence_length, tokens_per_batch=None,
                              pad_to_bucket_boundary=False):
    """The bucket boundaries `make_dataset` uses, checked.

    Args:
        bucket_boundaries: None, `"auto"` or a list of ints (see
            `make_dataset`).
        sequence_length: int, the longest sequence.
        tokens_per_batch: optional int; implies `"auto"` for None.
        pad_to_bucket_boundary: bool (see `make_dataset`).

    Returns:
        a strictly increasing list of ints in `tf.data`'s convention, or None
        (plain padded batches).

    Raises:
        ValueError: for another string, a list that is empty, not strictly
            increasing or not positive, or `pad_to_bucket_boundary` without
            buckets or with a last boundary `<= sequence_length`.
    """
    if bucket_boundaries is None and tokens_per_batch is not None:
        bucket_boundaries = "auto"
    if isinstance(bucket_boundaries, str):
        if bucket_boundaries != "auto":
            raise ValueError(
                "`bucket_boundaries` must be None, 'auto' or a list of ints. "
                f"Received: {bucket_boundaries!r}."
            )
        bucket_boundaries = auto_bucket_boundaries(sequence_length)
    elif bucket_boundaries is not None:
        bucket_boundaries = [int(b) for b in bucket_boundaries]
        if (
            not bucket_boundaries
            or any(
                b <= a for a, b in zip(bucket_boundaries, bucket_boundaries[1:])
            )
            or bucket_boundaries[0] < 1
        ):
            raise ValueError(
                "`bucket_boundaries` must be a non-empty, strictly increasing "
                f"list of positive ints. Received: {bucket_boundaries}."
            )
    if pad_to_bucket_boundary and bucket_boundaries is None:
        raise ValueError(
            "`pad_to_bucket_boundary=True` needs `bucket_boundaries` "
            "(or `tokens_per_batch`)."
        )
    if pad_to_bucket_boundary and bucket_boundaries[-1] <= sequence_length:
        raise ValueError(
            "With `pad_to_bucket_boundary=True` the last boundary must be "
            f"greater than sequence_length={sequence_length} so every example fits a "
            f"bucket. Received: {bucket_boundaries}."
        )
    return bucket_boundaries


def batch_examples(examples, padding_values, *, sequence_length, batch_size=None,
                   tokens_per_batch=None, bucket_boundaries=None, pad_to_bucket_boundary=False):
    """Stage 4: batches of examples, padded.

    Args:
        examples: dataset of `(encoder_inputs, decoder_inputs, labels)`
            vectors (from `tokenize_pairs`).
        padding_values: int32 scalars `(source pad, target pad, target pad)`.
        sequence_length: int, the last bucket's upper length.
        batch_size: int, examples per batch without `tokens_per_batch`.
        tokens_per_batch: optional int, each bucket's batch size is
            `tokens_per_batch // its upper length`.
        bucket_boundaries: a list from `resolve_bucket_boundaries`, or None
            for plain padded batches.
        pad_to_bucket_boundary: bool, pad to the bucket's upper length.

    Returns:
        dataset of `(encoder_inputs (B, S), decoder_inputs (B, T), labels
        (B, T))` int32, bucketed by `max(S, T)`.
    """
    if bucket_boundaries is None:
        return examples.padded_batch(batch_size, padding_values=padding_values)
    uppers = [b - 1 for b in bucket_boundaries] + [sequence_length]
    if tokens_per_batch is None:
        batch_sizes = [batch_size] * len(uppers)
    else:
        batch_sizes = [max(1, tokens_per_batch // max(1, upper)) for upper in uppers]
    return examples.bucket_by_sequence_length(
        element_length_func=lambda src, dec, lab: tf.maximum(
            tf.shape(src)[0], tf.shape(dec)[0]
        ),
        bucket_boundaries=bucket_boundaries,
        bucket_batch_sizes=batch_sizes,
        padding_values=padding_values,
        pad_to_bucket_boundary=pad_to_bucket_boundary,
    )


def check_batching(sequence_length, tokens_per_batch, batch_size):
    """The checks `make_dataset` makes of its batching arguments, callable
    before any data is read.

    Raises:
        ValueError: for `sequence_length` not an int >= 2, `tokens_per_batch`
            below `sequence_length`, or (without `tokens_per_batch`) `batch_size`
            not a positive int.
    """
    def is_int(value):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if not is_int(sequence_length) or sequence_length < 2:
        raise ValueError(
            f"`sequence_length` must be an int >= 2. Received: {sequence_length!r}."
        )
    if tokens_per_batch is not None and not is_int(tokens_per_batch):
        raise ValueError(
            f"`tokens_per_batch` must be an int. Received: {tokens_per_batch!r}."
        )
    if tokens_per_batch is not None and tokens_per_batch < sequence_length:
        raise ValueError(
            f"`tokens_per_batch` ({tokens_per_batch}) must be at least "
            f"`sequence_length` ({sequence_length}) so every bucket holds one example."
        )
    if tokens_per_batch is None and (not is_int(batch_size) or batch_size < 1):
        raise ValueError(
            f"`batch_size` must be a positive int. Received: {batch_size!r}."
        )


def make_dataset(
    src,
    tgt,
    src_tokenizer,
    tgt_tokenizer,
    *,
    batch_size=64,
    sequence_length=None,
    shuffle=True,
    seed=None,
    bucket_boundaries=None,
    tokens_per_batch=None,
    pad_to_bucket_boundary=False,
    shuffle_buffer_size=None,
    repeat=False,
    cache=True,
    batch_multiple=1,
    max_length=None,
    subword_alpha=None,
):
    """Builds a batched translation dataset for `model.fit`.

    Sources are packed as `t[:sequence_length - 1] + [end]`; targets as
    `[start] + t[:sequence_length - 1] + [end]` and shifted into `decoder_inputs`
    (without the end id) and `labels` (without the start id), so the end id
    survives truncation and `labels[:, i] == decoder_inputs[:, i + 1]`.
    Pairs where either side is empty or whitespace only (or tokenizes to
    nothing) are dropped.

    With `bucket_boundaries`, examples are grouped with
    `tf.data.Dataset.bucket_by_sequence_length` by
    `max(source length, target length)`, which cuts padding. With
    `tokens_per_batch`, each bucket's batch size is
    `tokens_per_batch // bucket_upper_length`, so batches hold roughly a
    constant number of tokens (Vaswani et al. 2017, Section 5.1, used about
    25000 source and 25000 target tokens per batch).

    Args:
        src: source sentences: a path (plain or `.gz`, one per line) or a
            list of `str`.
        tgt: aligned target sentences, same forms as `src`.
        src_tokenizer: tokenizer with `tokenize` (rank-1 strings to ragged
            ids), `end_id` and `pad_id`, e.g. `SubwordTokenizer`.
        tgt_tokenizer: same for the target; `start_id` is used as well.
        batch_size: int. Examples per batch when `tokens_per_batch` is
            `None`. Defaults to 64.
        sequence_length: int >= 2. The model's maximum sequence length; sources,
            decoder inputs and labels are at most this long (KerasHub's name;
            `max_length` is its deprecated old name). Defaults to 64.
        shuffle: bool. Shuffle examples (before batching). Defaults to
            `True`.
        seed: optional int for a reproducible shuffle order.
        bucket_boundaries: `None` (no bucketing: plain padded batches),
            `"auto"` (see `auto_bucket_boundaries`) or a strictly increasing
            list of ints in `tf.data` convention (a bucket holds lengths
            `< boundary`).
        tokens_per_batch: optional int >= `sequence_length`. Token budget per
            batch (per side); implies `bucket_boundaries="auto"` when
            `bucket_boundaries` is `None`.
        pad_to_bucket_boundary: bool. Pad each batch to its bucket's upper
            length instead of its longest sequence: fewer distinct shapes
            (fewer XLA/JAX recompilations) at the cost of more padding.
            Needs bucketing; lengths above the last boundary are not
            allowed, so `"auto"` ends at `sequence_length + 1`.
        shuffle_buffer_size: optional int >= 1. Defaults to the dataset
            size (a full shuffle).
        repeat: bool. Repeat forever (before batching). Defaults to `False`.
        cache: bool. Cache the tokenized, packed examples in memory.
            Defaults to `True`.
        batch_multiple: int >= 1. Pad every batch with all-padding rows up to a
            multiple of this (the device count of data-parallel training,
            which needs an even split). Defaults to 1.
        subword_alpha: optional float in `(0, 1]`. Subword regularization
            (Kudo, 2018): every pass over the data tokenizes each line with
            a newly sampled segmentation (the tokenizers' `sample`), so
            `cache` keeps the lines instead of the tokenized examples. The
            number of batches of a pass then varies a little; unless
            `repeat`, each epoch is exactly as many batches as the
            deterministic tokenization gives, taken from a fresh pass (a
            short pass is topped up from the next one). `None` (the
            default): the deterministic segmentation (`tokenize`). For
            training data only.

    Returns:
        `tf.data.Dataset` with element spec
        `({"encoder_inputs": int32 (B, S), "decoder_inputs": int32 (B, T)},
        labels int32 (B, T))`, `S, T <= sequence_length`.

    Raises:
        ValueError: on misaligned inputs, items that are not strings, no
            pair that tokenizes to pieces on both sides, bad
            `sequence_length`, `tokens_per_batch`, `bucket_boundaries`,
            `subword_alpha`, `shuffle_buffer_size` or `batch_multiple`.

    Example:

    ```python
    ds = make_dataset(
        "train.en.gz", "train.de.gz", en_tokenizer, de_tokenizer,
        sequence_length=64, tokens_per_batch=4096, seed=0,
    )
    model.fit(ds, epochs=10)
    ```

    References:
        - [Vaswani et al., 2017. Attention Is All You Need, Section 5.1](
          https://arxiv.org/abs/1706.03762)
    """
    sequence_length = renamed_argument(
        "make_dataset", "sequence_length", sequence_length, "max_length", max_length, 64)
    check_batching(sequence_length, tokens_per_batch, batch_size)
    # NumPy ints are accepted; the rest of the pipeline gets python ints.
    sequence_length = int(sequence_length)
    tokens_per_batch = None if tokens_per_batch is None else int(tokens_per_batch)
    if tokens_per_batch is None:
        batch_size = int(batch_size)
    bucket_boundaries = resolve_bucket_boundaries(
        bucket_boundaries, sequence_length, tokens_per_batch, pad_to_bucket_boundary
    )
    if subword_alpha is not None:
        check_alpha(subword_alpha, "subword_alpha")
    if shuffle_buffer_size is not None:
        shuffle_buffer_size = check_count(shuffle_buffer_size, "shuffle_buffer_size")
    batch_multiple = check_count(batch_multiple, "batch_multiple")
    src_lines, tgt_lines = read_pairs(src, tgt)
    ds = tokenize_pairs(src_lines, tgt_lines, src_tokenizer, tgt_tokenizer, sequence_length)
    if not int(ds.take(1).reduce(0, lambda n, _: n + 1)):
        # Lines of zero-width or control characters alone are not blank to
        # `str.strip` but tokenize to nothing: a dataset of no batch would
        # train (or validate) on nothing without a word.
        raise ValueError(
            f"`src` and `tgt` hold no sentence pair that tokenizes to pieces on both sides: in each of "
            f"the {len(src_lines)} non-blank pairs one side normalizes to nothing (zero-width or control "
            "characters only). Check the files' contents."
        )
    if cache:
        ds = ds.cache()
    examples = ds
    if subword_alpha is not None:
        # Lines are constants in the graph already (the cache); tokenized
        # examples must not be cached, or every pass would repeat one sample.
        ds = tokenize_pairs(src_lines, tgt_lines, src_tokenizer, tgt_tokenizer,
                            sequence_length, subword_alpha=float(subword_alpha))
    if shuffle:
        buffer = shuffle_buffer_size or max(len(src_lines), 1)
        ds = ds.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()

    src_pad, tgt_pad = int(src_tokenizer.pad_id), int(tgt_tokenizer.pad_id)
    padding_values = (
        tf.constant(src_pad, tf.int32),
        tf.constant(tgt_pad, tf.int32),
        tf.constant(tgt_pad, tf.int32),
    )

    def batched(ds):
        return batch_examples(
            ds, padding_values, sequence_length=sequence_length, batch_size=batch_size,
            tokens_per_batch=tokens_per_batch, bucket_boundaries=bucket_boundaries,
            pad_to_bucket_boundary=pad_to_bucket_boundary,
        )

    ds = batched(ds)
    if not repeat:
        # The batches' number does not depend on the order (each bucket
        # gives ceil(examples / batch size)): counted once, without the
        # shuffle, and declared. With an unknown length, Keras's `fit` makes
        # one optimizer step more per epoch than it runs batches (the
        # warm-up and Adam's bias correction would run ahead).
        count = int(batched(examples).reduce(0, lambda n, _: n + 1))
        if subword_alpha is None:
            ds = ds.apply(tf.data.experimental.assert_cardinality(count))
        else:
            # A sampled pass has about `count` batches, not exactly: every
            # epoch starts a fresh pass (new order, new segmentations) and
            # takes `count` batches of it.
            ds = ds.repeat().take(count)

    if batch_multiple > 1:
        # Data-parallel training splits each batch evenly over the devices:
        # fill a batch up with all-padding rows, which the masked loss and
        # metrics ignore.
        def pad_rows(encoder_inputs, decoder_inputs, labels):
            extra = (-tf.shape(encoder_inputs)[0]) % batch_multiple
            return tuple(
                tf.pad(t, [[0, extra], [0, 0]], constant_values=value)
                for t, value in zip((encoder_inputs, decoder_inputs, labels), padding_values)
            )

        ds = ds.map(pad_rows, num_parallel_calls=tf.data.AUTOTUNE)

    def to_model_inputs(encoder_inputs, decoder_inputs, labels):
        inputs = {
            "encoder_inputs": encoder_inputs,
            "decoder_inputs": decoder_inputs,
        }
        return inputs, labels

    ds = ds.map(to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE)
    # With tf.data's autotuner on, `fit` stalled for about 4.7 s when an
    # epoch's iterator started or ended, in about half the epochs (the
    # demo's 5.5 s epochs took 10 or 15 s on 2 cores; the data alone showed
    # no stall). Off, each AUTOTUNE map runs one call per core, and the
    # prefetch buffer is fixed.
    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.prefetch(_PREFETCH_BATCHES).with_options(options)


def padding_share(dataset, n_batches=None, *, pad_id=0):
    """Fraction of pad tokens in a dataset built by `make_dataset`.

    Counts `encoder_inputs` and `decoder_inputs` positions (labels have the
    same padding as decoder inputs). Useful to report the effect of length
    bucketing.

    Args:
        dataset: `tf.data.Dataset` of `({"encoder_inputs", "decoder_inputs"},
            labels)`.
        n_batches: optional int. Number of batches to read; `None` reads the
            whole (finite) dataset.
        pad_id: int. Defaults to 0.

    Returns:
        float in `[0, 1]` (0.0 for an empty dataset).

    Raises:
        ValueError: if `n_batches` is `None` and the dataset is infinite.

    Example:

    ```python
    print(f"padding: {padding_share(ds, 100):.1%}")
    ```
    """
    if n_batches is None:
        if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
            raise ValueError("The dataset repeats forever; pass `n_batches`.")
    else:
        dataset = dataset.take(n_batches)
    pads = 0
    total = 0
    for inputs, _ in dataset:
        for key in ("encoder_inputs", "decoder_inputs"):
            ids = inputs[key].numpy()
            pads += int((ids == pad_id).sum())
            total += ids.size
    return pads / total if total else 0.0
