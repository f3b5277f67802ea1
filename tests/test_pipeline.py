"""Tests for keras_transformer.data (text files and make_dataset)."""

import gzip
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data import auto_bucket_boundaries
from keras_transformer.data import make_dataset
from keras_transformer.data import make_synthetic_corpus
from keras_transformer.data import padding_share
from keras_transformer.data import read_lines
from keras_transformer.data import read_parallel
from keras_transformer.data import text_line_dataset
from keras_transformer.tokenizers import END_ID
from keras_transformer.tokenizers import PAD_ID
from keras_transformer.tokenizers import START_ID
from keras_transformer.tokenizers import train_subword_tokenizer
from conftest import multi30k_dir

@pytest.fixture(scope="module")
def corpus():
    en, de = make_synthetic_corpus(600, seed=0)
    # A pair with an empty side and a whitespace-only side: both dropped.
    return en + ["", "A dog runs."], de + ["Ein Hund läuft.", "   "]


@pytest.fixture(scope="module")
def tokenizers(corpus):
    en, de = corpus
    return (
        train_subword_tokenizer(en, vocab_size=150),
        train_subword_tokenizer(de, vocab_size=150),
    )


def collect(ds):
    return [
        (x["encoder_inputs"].numpy(), x["decoder_inputs"].numpy(), y.numpy())
        for x, y in ds
    ]


def test_element_spec_shapes_and_dtypes(corpus, tokenizers):
    en, de = corpus
    ds = make_dataset(en, de, *tokenizers, batch_size=32, sequence_length=10)
    spec_inputs, spec_labels = ds.element_spec
    assert set(spec_inputs) == {"encoder_inputs", "decoder_inputs"}
    for spec in (*spec_inputs.values(), spec_labels):
        assert spec.dtype == tf.int32
        assert spec.shape.as_list() == [None, None]
    batches = collect(ds)
    assert sum(len(b[0]) for b in batches) == 600  # two pairs dropped
    for enc, dec, lab in batches:
        assert enc.shape[0] == dec.shape[0] == lab.shape[0] <= 32
        assert dec.shape == lab.shape
        assert enc.shape[1] <= 10 and dec.shape[1] <= 10
        # Padded to the longest sequence of the batch, not beyond.
        assert (enc[:, -1] != PAD_ID).any() and (dec[:, -1] != PAD_ID).any()


def test_the_stages_compose_into_make_dataset(corpus, tokenizers):
    """read -> tokenize -> batch, called one by one, give make_dataset's
    batches (no shuffle), and each stage's output has its documented form."""
    from keras_transformer.data import batch_examples
    from keras_transformer.data import read_pairs
    from keras_transformer.data import resolve_bucket_boundaries
    from keras_transformer.data import tokenize_pairs

    en, de = corpus
    src, tgt = read_pairs(en, de)
    assert len(src) == len(tgt) == 600 and src[:3] == en[:3]  # the blank-sided pairs dropped
    examples = tokenize_pairs(src, tgt, *tokenizers, sequence_length=8)
    first = next(iter(examples))
    assert [t.shape.rank for t in first] == [1, 1, 1] and first[1].shape == first[2].shape
    assert first[0][-1] == END_ID and first[1][0] == START_ID
    boundaries = resolve_bucket_boundaries(None, 8, tokens_per_batch=64)
    assert boundaries == auto_bucket_boundaries(8)
    pads = tuple(tf.constant(PAD_ID, tf.int32) for _ in range(3))
    staged = [tuple(t.numpy() for t in b) for b in batch_examples(
        examples, pads, sequence_length=8, tokens_per_batch=64, bucket_boundaries=boundaries)]
    whole = collect(make_dataset(en, de, *tokenizers, sequence_length=8, tokens_per_batch=64,
                                 shuffle=False))
    assert len(staged) == len(whole) > 10
    for a, b in zip(staged, whole):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_teacher_forcing_invariants(corpus, tokenizers):
    en, de = corpus
    ds = make_dataset(en, de, *tokenizers, batch_size=64, sequence_length=8)
    truncated = 0
    for enc, dec, lab in collect(ds):
        assert (dec[:, 0] == START_ID).all()
        assert not (dec == END_ID).any()
        assert ((lab == END_ID).sum(axis=1) == 1).all()
        assert ((enc == END_ID).sum(axis=1) == 1).all()
        real = dec[:, 1:] != PAD_ID
        np.testing.assert_array_equal(lab[:, :-1][real], dec[:, 1:][real])
        # Pads only after the end id.
        lab_len = (lab != PAD_ID).sum(axis=1)
        assert (lab[np.arange(len(lab)), lab_len - 1] == END_ID).all()
        assert ((dec != PAD_ID).sum(axis=1) == lab_len).all()
        truncated += int((lab_len == 8).sum())
    assert truncated > 0  # sequence_length=8 truncates some targets


def test_labels_detokenize_to_the_raw_targets(corpus, tokenizers):
    en, de = corpus
    _, de_tok = tokenizers
    ds = make_dataset(
        en[:50], de[:50], *tokenizers, sequence_length=64, shuffle=False
    )
    decoded = []
    for _, labels in ds:
        decoded += [
            s.decode("utf-8") for s in de_tok.detokenize(labels).numpy()
        ]
    assert decoded == de[:50]


def test_shuffle_is_seeded(corpus, tokenizers):
    en, de = corpus
    kwargs = dict(batch_size=16, sequence_length=12, seed=7)
    first = collect(make_dataset(en, de, *tokenizers, **kwargs))
    second = collect(make_dataset(en, de, *tokenizers, **kwargs))
    assert all(
        (a == b).all() for x, y in zip(first, second) for a, b in zip(x, y)
    )
    ordered = collect(
        make_dataset(en, de, *tokenizers, shuffle=False, **kwargs)
    )
    assert not all(
        a.shape == b.shape and (a == b).all()
        for x, y in zip(first, ordered)
        for a, b in zip(x, y)
    )


def test_autotune_is_off_and_epochs_repeat_the_same_batches_count(corpus, tokenizers):
    """tf.data's autotuner is off (it stalled `fit` for seconds at epoch
    boundaries, see `make_dataset`); each epoch still yields every example."""
    en, de = corpus
    ds = make_dataset(en, de, *tokenizers, batch_size=16, sequence_length=12, seed=7)
    assert ds.options().autotune.enabled is False
    counts = [sum(int(x["encoder_inputs"].shape[0]) for x, _ in ds) for _ in range(2)]
    assert counts[0] == counts[1] == len(collect(make_dataset(en, de, *tokenizers, batch_size=1, sequence_length=12, shuffle=False)))


def test_tokens_per_batch_bucketing(corpus, tokenizers):
    en, de = corpus
    ds = make_dataset(
        en, de, *tokenizers, sequence_length=16, tokens_per_batch=128, seed=0
    )
    batches = collect(ds)
    assert sum(len(b[0]) for b in batches) == 600
    boundaries = auto_bucket_boundaries(16)
    assert boundaries == [9, 13, 17]
    for enc, dec, _ in batches:
        longest = max(enc.shape[1], dec.shape[1])
        upper = next(b - 1 for b in boundaries if longest < b)
        assert len(enc) <= 128 // upper
        assert len(enc) * longest <= 128


def test_pad_to_bucket_boundary_gives_few_shapes(corpus, tokenizers):
    en, de = corpus
    ds = make_dataset(
        en,
        de,
        *tokenizers,
        batch_size=32,
        sequence_length=16,
        bucket_boundaries=[9, 13, 17],
        pad_to_bucket_boundary=True,
        seed=0,
    )
    lengths = {b[0].shape[1] for b in collect(ds)} | {
        b[1].shape[1] for b in collect(ds)
    }
    assert lengths <= {8, 12, 16}


def test_repeat_and_padding_share(corpus, tokenizers):
    en, de = corpus
    ds = make_dataset(en, de, *tokenizers, batch_size=32, repeat=True, seed=0)
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY
    share = padding_share(ds, n_batches=40)  # 40 * 32 > 600: wraps around
    assert 0.0 < share < 0.5
    with pytest.raises(ValueError, match="n_batches"):
        padding_share(ds)


def test_paths_plain_and_gzip(tmp_path, corpus, tokenizers):
    en, de = corpus
    src = tmp_path / "train.en"
    src.write_text("\n".join(en) + "\n", encoding="utf-8")
    tgt = tmp_path / "train.de.gz"
    with gzip.open(tgt, "wt", encoding="utf-8") as f:
        f.write("\n".join(de) + "\n")
    assert read_lines(src) == en and read_lines(tgt) == de
    assert [
        t.decode() for t in text_line_dataset(tgt).as_numpy_iterator()
    ] == de
    from_files = collect(
        make_dataset(str(src), str(tgt), *tokenizers, shuffle=False)
    )
    from_lists = collect(make_dataset(en, de, *tokenizers, shuffle=False))
    assert len(from_files) == len(from_lists)
    for x, y in zip(from_files, from_lists):
        for a, b in zip(x, y):
            np.testing.assert_array_equal(a, b)


def test_read_lines_keeps_spaces_and_handles_crlf(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes(b" a b \r\nsecond\n\nlast")
    assert read_lines(path) == [" a b ", "second", "", "last"]
    lines = [t.decode() for t in text_line_dataset(path).as_numpy_iterator()]
    assert lines == read_lines(path)
    # A byte-order mark that starts the file: read_lines dropped it and the
    # dataset kept it (a new-user trial).
    path.write_bytes("\ufeffFirst\r\nsecond\n".encode("utf-8"))
    lines = [t.decode() for t in text_line_dataset(path).as_numpy_iterator()]
    assert lines == read_lines(path) == ["First", "second"]


def test_gzip_is_read_by_its_bytes_and_other_compressions_are_named(tmp_path):
    """`train.en.GZ`, or gzip data named `train.en`, was "not UTF-8 text
    (invalid start byte)"; so was a `.bz2` file, without saying why."""
    import bz2

    text = "Ein Hund.\nZwei Katzen.\n"
    for name in ("train.de.GZ", "train.de"):
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as f:
            f.write(text)
        assert read_lines(tmp_path / name) == ["Ein Hund.", "Zwei Katzen."]
        assert [t.decode() for t in text_line_dataset(tmp_path / name).as_numpy_iterator()] == read_lines(
            tmp_path / name)
    (tmp_path / "train.de.bz2").write_bytes(bz2.compress(text.encode()))
    for read in (read_lines, text_line_dataset):
        with pytest.raises(ValueError, match="train.de.bz2 is bzip2-compressed, which is not read: decompress it"):
            read(tmp_path / "train.de.bz2")


def test_misaligned_inputs_raise(tmp_path, tokenizers):
    a = tmp_path / "a.en"
    a.write_text("one\ntwo\n", encoding="utf-8")
    b = tmp_path / "b.de"
    b.write_text("eins\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"a\.en.* 2 lines .*b\.de.* 1"):
        read_parallel(a, b)
    with pytest.raises(ValueError, match="2 source and 1 target"):
        make_dataset(["x", "y"], ["z"], *tokenizers)
    # A sentence where a path belongs was a bare FileNotFoundError: 'A dog.' (a new-user trial).
    with pytest.raises(FileNotFoundError, match=r"`src` is a single string but not an existing file: 'A dog\.'.*\[sentence\]"):
        make_dataset("A dog.", "Ein Hund.", *tokenizers)
    with pytest.raises(FileNotFoundError, match=r"`tgt` is a single string but not an existing file: 'Ein Hund\.'"):
        make_dataset(["A dog."], "Ein Hund.", *tokenizers)
    with pytest.raises(ValueError, match="sequence_length"):
        make_dataset(["x"], ["y"], *tokenizers, sequence_length=1)
    with pytest.raises(ValueError, match="tokens_per_batch"):
        make_dataset(
            ["x"], ["y"], *tokenizers, sequence_length=64, tokens_per_batch=32
        )
    with pytest.raises(ValueError, match="bucket_boundaries"):
        make_dataset(["x"], ["y"], *tokenizers, bucket_boundaries=[9, 5])
    # A float budget failed with a TypeError inside tf.data.
    with pytest.raises(ValueError, match="`tokens_per_batch` must be an int"):
        make_dataset(["x"], ["y"], *tokenizers, sequence_length=16, tokens_per_batch=100.5)
    # None or a number among the sentences was an AttributeError ('strip'),
    # a negative shuffle buffer an error inside tf.data, and a batch
    # multiple of 0 or a shuffle buffer of 0 were taken without a word.
    for bad, kind in ((None, "NoneType"), (5, "int"), (b"x", "bytes")):
        with pytest.raises(ValueError, match=f"`src` must hold sentences \\(`str`\\); item 1 is {kind}"):
            make_dataset(["a dog", bad], ["x", "y"], *tokenizers)
    for bad in (-1, 0, 2.5):
        with pytest.raises(ValueError, match=f"`shuffle_buffer_size` must be a whole number >= 1; got {bad}"):
            make_dataset(["x"], ["y"], *tokenizers, shuffle_buffer_size=bad)
        with pytest.raises(ValueError, match=f"`batch_multiple` must be a whole number >= 1; got {bad}"):
            make_dataset(["x"], ["y"], *tokenizers, batch_multiple=bad)


def test_numpy_ints_are_accepted_as_sizes(tokenizers):
    """`sequence_length=np.int64(16)` was refused as "must be an int"; it gives
    the batches of `sequence_length=16`."""
    sources, targets = ["a b c", "d e", "f"], ["g h", "i j k", "l"]
    for numpy_size in (False, True):
        size = (lambda n: np.int64(n)) if numpy_size else int
        batches = list(make_dataset(sources, targets, *tokenizers, sequence_length=size(16),
                                    tokens_per_batch=size(64), shuffle=False))
        if not numpy_size:
            want = batches
    for (x, y), (wx, wy) in zip(batches, want):
        np.testing.assert_array_equal(x["encoder_inputs"], wx["encoder_inputs"])
        np.testing.assert_array_equal(y, wy)
    assert len(batches) == len(want) > 0


@pytest.mark.corpus
def test_bucketing_keeps_padding_low_on_multi30k():
    directory = multi30k_dir()
    en = read_lines(os.path.join(directory, "train.en.gz"))[:2000]
    de = read_lines(os.path.join(directory, "train.de.gz"))[:2000]
    en_tok = train_subword_tokenizer(en, vocab_size=1000)
    de_tok = train_subword_tokenizer(de, vocab_size=1000)
    bucketed = make_dataset(
        en, de, en_tok, de_tok, sequence_length=64, tokens_per_batch=1024, seed=0
    )
    plain = make_dataset(en, de, en_tok, de_tok, batch_size=32, seed=0)
    bucketed_share = padding_share(bucketed)
    plain_share = padding_share(plain)
    assert bucketed_share < 0.5
    assert bucketed_share < plain_share
    sizes = [len(y) for _, y in bucketed]
    assert sum(sizes) == 2000
    assert max(sizes) > min(sizes)  # batch size varies with length


def test_empty_corpus_is_a_clear_error(tmp_path):
    """Empty (or all-blank) files would train on nothing: refuse them."""
    from keras_transformer.data import make_dataset
    from keras_transformer.data.synthetic import make_synthetic_corpus
    from keras_transformer.tokenizers import train_subword_tokenizer

    en, _ = make_synthetic_corpus(100)
    tok = train_subword_tokenizer(en, 60)
    (tmp_path / "a.en").write_text("")
    (tmp_path / "a.de").write_text("")
    with pytest.raises(ValueError, match="no sentence pair"):
        make_dataset(str(tmp_path / "a.en"), str(tmp_path / "a.de"), tok, tok)
    with pytest.raises(ValueError, match="no sentence pair"):
        make_dataset(["", " "], ["x", ""], tok, tok)
    # Zero-width and control characters are not blank to `str.strip`, but
    # normalize to nothing: the dataset had no batch and `fit` trained on
    # nothing (validation files: no val_loss) without a word (a new-user trial).
    with pytest.raises(ValueError, match="no sentence pair that tokenizes to pieces on both sides: in each of "
                                         "the 2 non-blank pairs one side normalizes to nothing"):
        make_dataset(["\u200b", "\x00"], ["x y", "z"], tok, tok)
    kept = make_dataset(["\u200b", "x"], ["x y", "z"], tok, tok, shuffle=False)
    assert [y.shape[0] for _, y in kept] == [1]


def test_fit_makes_one_optimizer_step_per_batch():
    """`fit` on `make_dataset`'s batches made one step more per epoch than
    it ran batches (15 batches, 16 iterations), so the warm-up and Adam's
    bias correction ran ahead; the dataset now declares its length, and
    iterations equal batches run, with a shuffle and over epochs."""
    import keras

    import keras_transformer as kt
    from keras_transformer.data.synthetic import make_synthetic_corpus

    english, german = make_synthetic_corpus(300, seed=7)
    src = kt.train_subword_tokenizer(english, 100)
    tgt = kt.train_subword_tokenizer(german, 100)
    ds = kt.make_dataset(english, german, src, tgt, sequence_length=24, tokens_per_batch=512, seed=1)
    batches = sum(1 for _ in ds)
    assert int(ds.cardinality()) == batches == sum(1 for _ in ds)  # the same after a reshuffle
    model = kt.build_transformer(src.vocab_size, tgt.vocab_size, num_layers=1, d_model=16,
                                 num_heads=2, dff=32, sequence_length=24)
    model.compile(kt.Adam(1e-3), kt.MaskedSparseCategoricalCrossentropy())
    seen = []
    model.fit(ds, epochs=2, verbose=0, callbacks=[keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(batch))])
    assert len(seen) == 2 * batches
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2 * batches


def test_subword_alpha_resamples_every_epoch_in_a_fixed_number_of_batches(corpus, tokenizers):
    """Subword regularization: each epoch is a fresh pass with newly sampled
    segmentations, cut or topped up to the deterministic pass's batch count
    (a sampled pass's count varies, and `fit` needs one length)."""
    en, de = corpus
    en_tok, de_tok = tokenizers
    kwargs = dict(tokens_per_batch=256, sequence_length=32, seed=0)
    fixed = make_dataset(en, de, *tokenizers, **kwargs)
    sampled = make_dataset(en, de, *tokenizers, subword_alpha=0.2, **kwargs)
    count = int(fixed.cardinality())
    assert int(sampled.cardinality()) == count == len(collect(fixed))
    pairs = set(zip(en, de))
    fixed_ids = {p: None for p in pairs}
    for x, y in fixed:
        srcs = en_tok.detokenize(x["encoder_inputs"]).numpy()
        for s, t, ids in zip(srcs, de_tok.detokenize(y).numpy(), y.numpy()):
            fixed_ids[s.decode(), t.decode()] = tuple(ids[ids != PAD_ID])
    epochs = [collect(sampled) for _ in range(2)]
    changed = 0
    for batches in epochs:
        assert len(batches) == count
        for enc, dec, lab in batches:
            assert (dec[:, 0] == START_ID).all()
            srcs = en_tok.detokenize(tf.constant(enc)).numpy()
            for s, t, ids in zip(srcs, de_tok.detokenize(tf.constant(lab)).numpy(), lab):
                # Each example is a training pair, aligned, its text intact.
                assert (s.decode(), t.decode()) in pairs
                changed += tuple(ids[ids != PAD_ID]) != fixed_ids[s.decode(), t.decode()]
    examples = sum(len(b[0]) for batches in epochs for b in batches)
    assert changed > examples // 4
    assert [b[2].tolist() for b in epochs[0]] != [b[2].tolist() for b in epochs[1]]


@pytest.mark.parametrize("alpha", [0, 2.0, "0.2"])
def test_subword_alpha_outside_0_1_is_refused(corpus, tokenizers, alpha):
    en, de = corpus
    with pytest.raises(ValueError, match=r"`subword_alpha` must be a number in \(0, 1\]"):
        make_dataset(en, de, *tokenizers, subword_alpha=alpha)
