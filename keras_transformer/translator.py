"""String-to-string translation: tokenize, decode with a cache, detokenize."""

import sys

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.data.packing import pack_source
from keras_transformer.decoding.beam_search import check_length_penalty
from keras_transformer.decoding import growing_cache
from keras_transformer.decoding import strategies
from keras_transformer.decoding.ensemble import EnsembleParts
from keras_transformer.decoding.model_parts import TransformerParts
from keras_transformer.layers.id_range import check_id_range, check_integer_ids
from keras_transformer.decoding.model_parts import transposed_output_table as transposed_output_table_of
from keras_transformer.precision import compute_dtype
from keras_transformer.source_notices import warn_about_sources
from keras_transformer.tokenizers.normalization import normalize_text
from keras_transformer.validation import check_count
from keras_transformer.validation import check_positive
from keras_transformer.models.conversion import as_transformer
from keras_transformer.precision import with_dtype_policy


class Translator(tf.Module):
    """Translate strings with a trained Transformer, in one TensorFlow graph.

    Tokenizes the source in-graph, packs it as the training pipeline does
    (`t[:sequence_length - 1] + [end_id]`), decodes with greedy search
    (`beam_size=1`) or beam search with the GNMT length penalty, both with a
    key/value cache, and detokenizes, dropping every special token. The
    whole path is a `tf.function`, so it exports to a SavedModel
    (`keras_transformer.export`) that needs only `tensorflow` and
    `tensorflow_text` to run.

    Input limit: a source longer than the encoder's `sequence_length` is
    truncated to its first `sequence_length - 1` subword tokens plus the end
    token, the rule the training pipeline applies; nothing is raised.

    Needs the tensorflow Keras backend (the tokenizers are TensorFlow ops);
    on jax and torch, `greedy_search` and `beam_search` decode token ids.

    Args:
        model: a `build_transformer` model, or a list of two or more
            that share the tokenizers: an ensemble, decoded with the log of
            their mean distribution a step
            (`decoding.ensemble.EnsembleParts`; not exportable). One with a
            mixed-precision dtype policy (`"mixed_bfloat16"`,
            `"mixed_float16"`) is decoded through a float32 copy
            (`self.model`; `self.models` for all), the same weights.
        src_tokenizer: `SubwordTokenizer` of the source language.
        tgt_tokenizer: `SubwordTokenizer` of the target language.
        beam_size: int, 1 for greedy decoding (default 4).
        length_penalty: float, GNMT `alpha` for beam search (default 0.6).
        search: instead of `beam_size` and `length_penalty`, a decoding
            strategy (`decoding.strategies.GreedySearch()`,
            `BeamSearch(beam_size, length_penalty)`) or its name or config
            for `decoding.strategies.get` (`"greedy"`, `{"name": "beam",
            "beam_size": 5}`).
        max_length: int, most output tokens; default the model's.
        length_ratio: optional float; outputs stop at
            `ceil(length_ratio * source_tokens) + 10` tokens if that is
            sooner.
        jit_compile: bool, compile the search loop with XLA (about 2x
            lower latency on a CPU for batch 1). Source lengths are then
            padded to a multiple of 8 so that few shapes get compiled. A
            SavedModel exported with it needs a TF Serving build with XLA.
        xla_max_batch_size: optional int >= 1, with `jit_compile=True`:
            batches of at most this many sentences take the XLA search and
            larger ones the plain graph search (growing caches), which is
            faster on a CPU from about batch 8 (see `docs/benchmarks.md`).
            Both give the same translations. Default: every batch takes XLA.
        parallel_searches: int >= 1 (default 1), for the plain graph
            search: a batch of at least this many sentences is split into
            this many interleaved parts, each decoded by its own search
            loop; TensorFlow runs the loops at the same time on its
            inter-op threads. Same translations. Faster on a CPU with as
            many inter-op threads and one intra-op thread each
            (`tf.config.threading`; TF Serving's
            `--tensorflow_inter_op_parallelism=2
            --tensorflow_intra_op_parallelism=1`); about even with
            TensorFlow's default threads (see `docs/benchmarks.md`).
        allow_unk: bool, let the search output the unknown id (which
            detokenizes as " ⁇ "). By default it is never a candidate, as
            pad and start never are, so translations hold no special token.
        transposed_output_table: bool (default False). True: copy a tied
            output projection's token table, transposed, once here
            (`decoding.transposed_output_table`), and have every search
            multiply by the copy: about a fifth less time a sentence at
            batch 1 with XLA on a CPU (see `docs/benchmarks.md`), the same
            translations, and `d_model * vocab` more stored numbers. The
            copy is a snapshot: build the Translator again after the
            model's weights change. Exports (`export_translator`) take it;
            it does nothing for a model with an untied, quantized or LoRA
            output projection.

    Call arguments:
        text: a `str`, a list of `str`, or a `tf.string` tensor of rank 0
            or 1.

    Returns:
        `tf.string` translations of the shape of `text` (scalar in, scalar
        out; `(batch,)` in, `(batch,)` out).

    Raises:
        TypeError: if a tokenizer is not one (a path, say).
        ValueError: on a Keras backend other than tensorflow, for
            `beam_size` (or `parallel_searches`) not a whole number, below
            1, or `beam_size` above the target vocabulary, a
            `length_penalty` that is negative or not finite, `max_length`
            below 1, `length_ratio` not a finite number above 0,
            `xla_max_batch_size` not a whole number >= 1 or without
            `jit_compile=True`,
            `parallel_searches` below 1 or with an XLA-only search, or
            tokenizers that do not fit the model.

    Example:
    >>> from keras_transformer import build_transformer
    >>> from keras_transformer.data.synthetic import make_synthetic_corpus
    >>> from keras_transformer.tokenizers import train_subword_tokenizer
    >>> english, german = make_synthetic_corpus(300, seed=0)
    >>> src_tok = train_subword_tokenizer(english, 120)
    >>> tgt_tok = train_subword_tokenizer(german, 120)
    >>> model = build_transformer(src_tok.vocab_size, tgt_tok.vocab_size, num_layers=1,
    ...                           d_model=16, num_heads=2, dff=32, sequence_length=16)
    >>> translator = Translator(model, src_tok, tgt_tok, beam_size=2)
    >>> translator(["A dog runs.", "Two cats sleep."]).shape  # untrained: random words
    TensorShape([2])
    """

    def __init__(
        self,
        model,
        src_tokenizer,
        tgt_tokenizer,
        *,
        beam_size=None,
        length_penalty=None,
        search=None,
        max_length=None,
        length_ratio=None,
        jit_compile=False,
        xla_max_batch_size=None,
        parallel_searches=1,
        allow_unk=False,
        transposed_output_table=False,
        name=None,
    ):
        super().__init__(name=name)
        if keras.backend.backend() != "tensorflow":
            raise ValueError(
                "Translator is a tf.Module of tf.functions (exported as a "
                "SavedModel), so it needs the tensorflow Keras backend; this "
                f"process runs {keras.backend.backend()!r}. Set "
                "KERAS_BACKEND=tensorflow and load the trained model there "
                "(`keras.saving.load_model` of the run's .keras file), or call "
                "`greedy_search` / `beam_search` with `TransformerParts`, which "
                "run on every backend."
            )
        for side, tokenizer in (("src_tokenizer", src_tokenizer), ("tgt_tokenizer", tgt_tokenizer)):
            if not all(hasattr(tokenizer, a) for a in ("vocab_size", "pad_id", "tokenize", "detokenize")):
                raise TypeError(
                    f"`{side}` must be a tokenizer such as a SubwordTokenizer "
                    "(`train_subword_tokenizer(...)`, or `SubwordTokenizer.load(path)` for a "
                    f"saved one); got {type(tokenizer).__name__} {tokenizer!r:.80}."
                )
        # Checked here, not when the search is first traced (where the error
        # would come wrapped in a dump of the traced function).
        search = self._strategy(search, beam_size, length_penalty)
        beam_size = getattr(search, "beam_size", 1)
        length_penalty = getattr(search, "length_penalty", 0.6 if length_penalty is None else length_penalty)
        length_penalty = check_length_penalty(length_penalty)
        if max_length is not None:  # 2.5 was cut to 2
            max_length = check_count(max_length, "max_length", unit=" of output tokens")
        if length_ratio is not None:  # True was read as 1.0
            length_ratio = check_positive(length_ratio, "length_ratio")
        if xla_max_batch_size is not None:
            if not jit_compile:
                raise ValueError("`xla_max_batch_size` chooses which batches take the XLA search; "
                                 "pass it with jit_compile=True (`--jit-compile`), or drop it.")
            # 2.7 was cut to 2
            xla_max_batch_size = check_count(xla_max_batch_size, "xla_max_batch_size", unit=" of sentences")
        parallel_searches = check_count(parallel_searches, "parallel_searches", unit=" of search loops")
        if parallel_searches > 1 and jit_compile and xla_max_batch_size is None:
            raise ValueError("`parallel_searches` splits the batches of the plain graph search, and with "
                             "jit_compile=True every batch takes XLA: pass xla_max_batch_size too "
                             "(XLA for small batches, parallel searches for larger ones), or drop one.")
        # Decoding runs in float32: a model trained under a mixed-precision
        # policy is copied with float32 compute (its variables are float32
        # already, so the weights are the same numbers).
        models = list(model) if isinstance(model, (list, tuple)) else [model]
        if not models:
            raise ValueError("`model` is an empty list: pass a model, or two or more for an ensemble.")
        models = [as_transformer(m) for m in models]  # one saved by an earlier version
        models = [m if compute_dtype(m) == "float32" else with_dtype_policy(m, "float32") for m in models]
        self.model = models[0]
        self.models = models
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        kernels = [transposed_output_table_of(m) if transposed_output_table else None for m in models]
        self._output_kernel = kernels[0]
        self._output_kernels = kernels

        def parts_for(jit):
            # Growing self-attention caches where the graph allows them (no XLA).
            members = [
                TransformerParts(m, pad_id=src_tokenizer.pad_id, growing_cache=growing_cache.available(jit),
                                 output_kernel=kernel)
                for m, kernel in zip(models, kernels)
            ]
            return members[0] if len(members) == 1 else EnsembleParts(members)

        self._parts = parts_for(jit_compile)
        for side, tokenizer, layer in (
            ("source", src_tokenizer, self._parts.encoder_embedding),
            ("target", tgt_tokenizer, self._parts.decoder_embedding),
        ):
            if tokenizer.vocab_size != layer.vocab_size:
                raise ValueError(
                    f"The {side} tokenizer has {tokenizer.vocab_size} pieces but the "
                    f"model's {layer.name} expects {layer.vocab_size}: pass the "
                    "tokenizers the model was trained with, source first."
                )
        if int(beam_size) > tgt_tokenizer.vocab_size:
            raise ValueError(
                f"`beam_size`={beam_size} exceeds the target vocabulary size "
                f"{tgt_tokenizer.vocab_size}: pass a smaller beam."
            )
        self.search = search
        self.beam_size = int(beam_size)
        self.length_penalty = float(length_penalty)
        self.max_length = max_length
        self.length_ratio = length_ratio
        self.source_sequence_length = self._parts.source_sequence_length
        self.jit_compile = bool(jit_compile)
        self.xla_max_batch_size = xla_max_batch_size
        self.parallel_searches = parallel_searches
        self.allow_unk = bool(allow_unk)
        self.transposed_output_table = bool(transposed_output_table)
        # The decoding code is graph code already (`keras.ops.while_loop`,
        # `tf.cond`): AutoGraph's rewriting of its Python source was three
        # quarters of the time to trace a search (and of an export), and
        # Keras traces its own steps without it too.
        self._search = tf.function(
            lambda source_ids, n_best: self._search_ids(self._parts, source_ids, n_best),
            jit_compile=self.jit_compile,
            autograph=False,
        )
        self._graph_search = None
        if xla_max_batch_size is not None:
            # Large batches: the plain graph, with the growing caches XLA cannot take.
            graph_parts = parts_for(False)
            self._graph_search = tf.function(
                lambda source_ids, n_best: self._search_ids(graph_parts, source_ids, n_best),
                autograph=False,
            )
        self._signatures = None

    def attention(self, text):
        """Deprecated: `attention_scores`."""
        import warnings

        warnings.warn("Translator.attention is renamed attention_scores; the old name will be removed.",
                      DeprecationWarning, stacklevel=2)
        return self.attention_scores(text)

    @property
    def source_max_length(self):
        """Deprecated: `source_sequence_length`."""
        return self.source_sequence_length

    def _search_kwargs(self):
        return dict(
            start_id=self.tgt_tokenizer.start_id,
            end_id=self.tgt_tokenizer.end_id,
            pad_id=self.tgt_tokenizer.pad_id,
            max_length=self.max_length,
            length_ratio=self.length_ratio,
            suppressed_ids=() if self.allow_unk else (self.tgt_tokenizer.unk_id,),
        )

    def encode_source(self, text):
        """`(batch,)` strings -> int32 `(batch, length)` packed source ids."""
        ids = self.src_tokenizer.tokenize(text)
        return pack_source(
            ids,
            self.source_sequence_length,
            end_id=self.src_tokenizer.end_id,
            pad_id=self.src_tokenizer.pad_id,
            pad_to_max_length=False,
        )

    def translate_ids(self, source_ids, n_best=1):
        """Decode packed source ids.

        Returns:
            `(tokens int32 (batch, n_best, length), scores float32 (batch,
            n_best))`; with `beam_size=1`, `n_best` must be 1 and scores
            are summed log-probabilities.

        Raises:
            TypeError: for ids of a float, bool or string dtype
                (`TokenIdTypeError`).
            ValueError: (eager) for `n_best` outside `[1, beam_size]` or an id
                outside the source vocabulary.
            tf.errors.InvalidArgumentError: (in a graph) the latter, at run
                time.
        """
        # Before the search's tf.function, whose trace would wrap the error.
        check_integer_ids(source_ids, "`source_ids`", fix="Pack int32 ids (`encode_source`)")
        if n_best > self.search.max_n_best or n_best < 1:
            if self.beam_size == 1:
                raise ValueError("Greedy decoding (beam_size=1) returns n_best=1 only.")
            raise ValueError(f"`n_best` must be in [1, beam_size={self.beam_size}]; got {n_best}.")
        if not self.jit_compile:
            return self._in_parallel(self._search, source_ids, n_best)
        # XLA drops the search's id checks (its Assert ops) and clamps the
        # embedding lookups, so an id outside the vocabulary decoded as the
        # table's first or last row: checked here, outside XLA.
        source_ids = check_id_range(tf.convert_to_tensor(source_ids), self.src_tokenizer.vocab_size,
                                    "`source_ids`")

        def compiled():
            length = tf.shape(source_ids)[1]
            padded = tf.minimum((length + 7) // 8 * 8, tf.maximum(self.source_sequence_length, length))
            return self._search(tf.pad(source_ids, [[0, 0], [0, padded - length]]), n_best)

        if self._graph_search is None:
            return compiled()
        return tf.cond(
            tf.shape(source_ids)[0] <= self.xla_max_batch_size,
            compiled,
            lambda: self._in_parallel(self._graph_search, source_ids, n_best),
        )

    def _in_parallel(self, search, source_ids, n_best):
        """`search(source_ids, n_best)`, as `parallel_searches` = p searches
        when the batch has at least p sentences: the sentences ordered by
        source length (stable), search i takes the i-th, (i + p)-th, ...,
        so that the parts are about equally long and end at about the same
        step; the outputs are put back in the batch's order."""
        parts = self.parallel_searches
        if parts == 1:
            return search(source_ids, n_best)
        batch = tf.shape(source_ids)[0]

        def split():
            lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, self.src_tokenizer.pad_id), tf.int32), axis=1)
            order = tf.argsort(lengths, stable=True)
            index = [order[i::parts] for i in range(parts)]
            outputs = [search(tf.gather(source_ids, rows), n_best) for rows in index]
            return tuple(tf.dynamic_stitch(index, [output[j] for output in outputs]) for j in range(2))

        return tf.cond(batch >= parts, split, lambda: search(source_ids, n_best))

    @staticmethod
    def _strategy(search, beam_size, length_penalty):
        """The decoding strategy the arguments ask for."""
        if search is not None:
            if beam_size is not None or length_penalty is not None:
                raise ValueError("Pass either `search` or `beam_size` / `length_penalty`, not both: "
                                 "set the beam on the strategy (BeamSearch(beam_size, length_penalty)).")
            return strategies.get(search)
        beam_size = 4 if beam_size is None else check_count(beam_size, "beam_size")
        if beam_size == 1:
            if length_penalty is not None:
                check_length_penalty(length_penalty)
            return strategies.GreedySearch()
        return strategies.BeamSearch(beam_size, 0.6 if length_penalty is None else length_penalty)

    def _search_ids(self, parts, source_ids, n_best):
        return self.search(parts, source_ids, n_best=n_best, **self._search_kwargs())

    def attention_scores(self, text):
        """The translation of one sentence with its cross-attention weights.

        The translation is this translator's own (beam search or greedy, as
        `__call__` gives it); the weights are those of the last decoder
        layer, per head, as in the paper's figures and the TF tutorial, for
        each output token, found by running the decoder on that translation
        (teacher forcing, with the cache).

        Args:
            text: `str`, one source sentence.

        Returns:
            dict with `"source_tokens"` (list of `str` pieces, the end token
            last), `"output_tokens"` (list of `str` pieces, the end token
            last), `"translation"` (`str`) and `"weights"`, a float32 NumPy
            array `(num_heads, len(output_tokens), len(source_tokens))`.
        """
        source_ids = self.encode_source(tf.constant([text]))
        tokens = self.translate_ids(source_ids)[0].numpy()[0, 0].tolist()
        if not normalize_text(tf.constant(text)).numpy():  # blank: translated to "", as translate_batch does
            tokens = [self.tgt_tokenizer.end_id]
        end = self.tgt_tokenizer.end_id
        n = tokens.index(end) + 1 if end in tokens else len(tokens)
        parts = self._parts
        encoder_outputs, encoder_outputs_mask = parts.encode(source_ids)
        cross = parts.cross_caches(encoder_outputs)
        caches = parts.empty_self_caches(1, parts.target_sequence_length, encoder_outputs.dtype)
        rows = []
        for index, token in enumerate([self.tgt_tokenizer.start_id] + tokens[: n - 1]):
            _, caches, weights = parts.decode_step(
                tf.constant([token], tf.int32), index, caches, cross, encoder_outputs_mask,
                return_attention_scores=True,
            )
            rows.append(tf.cast(weights, tf.float32).numpy()[0])  # (heads, source_length)
        source = source_ids.numpy()[0].tolist()
        translation = self.tgt_tokenizer.detokenize(tf.constant(tokens)).numpy().decode("utf-8")
        return {
            "source_tokens": [self.src_tokenizer.id_to_piece(i) for i in source],
            "output_tokens": [self.tgt_tokenizer.id_to_piece(i) for i in tokens[:n]],
            "translation": translation.strip(),
            "weights": np.stack(rows, axis=1),
        }

    def translate_batch(self, text, n_best=1):
        """`(batch,)` strings -> `(translations (batch, n_best), scores)`.

        An empty or blank source translates to the empty string with score 0.
        """
        source_ids = self.encode_source(text)
        tokens, scores = self.translate_ids(source_ids, n_best=n_best)
        shape = tf.shape(tokens)
        flat = tf.reshape(tokens, (shape[0] * shape[1], shape[2]))
        # Stripped: an output of pieces that detokenize to spaces (an
        # undertrained model) must not come back padded with blanks.
        texts = tf.strings.strip(tf.reshape(self.tgt_tokenizer.detokenize(flat), (shape[0], shape[1])))
        blank = tf.equal(tf.strings.length(normalize_text(text)), 0)[:, None]
        texts = tf.where(blank, tf.constant("", tf.string), texts)
        scores = tf.where(blank, tf.zeros_like(scores), scores)
        return texts, scores

    @property
    def signatures(self):
        """The serving functions of this translator
        (`keras_transformer.serving.ServingSignatures`), made on first use."""
        if self._signatures is None:
            from keras_transformer.serving import ServingSignatures

            self._signatures = ServingSignatures(self)
        return self._signatures

    def serve(self, text):
        """`serving_default`: `text` (batch,) -> `{"translation", "score"}`;
        see `ServingSignatures.serve`."""
        return self.signatures.serve(text)

    def translate_lines(self, lines, batch_size=64, progress=False):
        """Translate a list of `str`; see `translate_lines`. Warns
        (`UserWarning`, `keras_transformer.source_notices`) when sources
        were longer than the model takes or had characters its vocabulary
        lacks."""
        if hasattr(lines, "__next__"):  # read once, for both
            lines = list(lines)
        translations = translate_lines(
            lambda batch: self.serve(batch)["translation"], lines, batch_size, progress
        )
        warn_about_sources(self, lines)
        return translations

    def translate_n_best(self, lines, n, batch_size=64, distinct=True):
        """The `n <= beam_size` best translations of each `str` with their
        scores, each text once with `distinct`; see `translate_n_best`.
        Warns as `translate_lines` does."""
        if hasattr(lines, "__next__"):
            lines = list(lines)
        found = translate_n_best(self.serve_n_best, lines, n, batch_size, distinct)
        warn_about_sources(self, lines)
        return found

    def serve_n_best(self, text):
        """`translate_n_best`: `text` (batch,) -> `{"translations",
        "scores"}`, `(batch, beam_size)` each; see
        `ServingSignatures.serve_n_best`."""
        return self.signatures.serve_n_best(text)

    def serve_ids(self, source_ids):
        """`translate_ids`: int32 `source_ids` -> `{"target_ids", "score"}`;
        see `ServingSignatures.serve_ids`."""
        return self.signatures.serve_ids(source_ids)

    def _clip_source(self, source_ids):
        limit = self.source_sequence_length
        too_long = tf.shape(source_ids)[1] > limit
        end = self.src_tokenizer.end_id
        pad = self.src_tokenizer.pad_id

        def clip():
            head = source_ids[:, : limit - 1]
            # Rows that were cut get the end id; rows that ended earlier keep padding.
            cut = tf.reduce_any(tf.not_equal(source_ids[:, limit - 1 :], pad), axis=1)
            last = tf.where(cut, end, pad)[:, None]
            return tf.concat([head, tf.cast(last, source_ids.dtype)], axis=1)

        return tf.cond(too_long, clip, lambda: source_ids)

    def __call__(self, text):
        return translate_text(self.serve, text)


def translate_text(serve, text):
    """The translations of `text` by `serve` (a `serving_default`): a `str`
    or scalar tf.string -> a scalar tf.string; a list of `str` or a
    `(batch,)` tf.string tensor -> tf.string `(batch,)`.

    Raises:
        ValueError: for a rank above 1.
    """
    text = tf.convert_to_tensor(text, tf.string)
    if text.shape.rank == 0:
        return serve(tf.reshape(text, (1,)))["translation"][0]
    if text.shape.rank != 1:
        raise ValueError(
            f"The translator takes a string or a rank-1 batch of strings; got shape {text.shape}."
        )
    return serve(text)["translation"]


def _check_lines(lines, batch_size):
    """`lines` as a list of `str` (any iterable of `str` is taken)."""
    if isinstance(lines, (str, bytes)):
        raise TypeError(
            "translate_lines takes a list of sentences, not one string; "
            "wrap it as [sentence]."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive int; got {batch_size!r}.")
    try:
        lines = list(lines)
    except TypeError:
        raise TypeError(
            f"translate_lines takes a list of sentences (str); got {type(lines).__name__}."
        ) from None
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(
                f"translate_lines takes sentences as str; item {i} is "
                f"{type(line).__name__} ({line!r:.40}). "
                + ("Decode bytes first: line.decode('utf-8')." if isinstance(line, bytes)
                   else "Pass '' for an empty line.")
            )
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(
                f"translate_lines: item {i} ({line!r:.60}) is not valid Unicode text: {error.reason} at "
                f"character {error.start} (a lone surrogate, as from bytes decoded with "
                "errors='surrogateescape'). Decode its bytes with the right encoding, or with "
                "errors='replace'."
            ) from None
    return lines


def _by_length(rows_of, lines, batch_size, progress):
    """`rows_of(tf.string batch)` (one result per row) over `lines` in
    batches of similar length; the results in the order of `lines`."""
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    results = [None] * len(lines)
    # Keras redraws the bar in place wherever it runs on POSIX; into a log
    # file (not a terminal) it writes one line at the end instead.
    interactive = getattr(sys.stdout, "isatty", lambda: False)()
    bar = keras.utils.Progbar(len(lines), unit_name="sentence", verbose=1 if interactive else 2) if progress else None
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        rows = rows_of(tf.constant([lines[i] for i in chunk], tf.string))
        for i, row in zip(chunk, rows):
            results[i] = row
        if bar is not None:
            bar.add(len(chunk))
    return results


def translate_lines(serve, lines, batch_size=64, progress=False):
    """Translate a list of `str` in batches of similar length.

    Sentences are sorted by length for batching (less padding) and the
    results are returned in the original order.

    Args:
        serve: callable from a `tf.string` tensor `(batch,)` to translated
            `tf.string` `(batch,)`: `Translator.serve` or a loaded
            SavedModel's signature wrapped to return the translation.
        lines: list of `str`.
        batch_size: int, sentences per batch.
        progress: bool, show a progress bar.

    Returns:
        list of `str`, aligned with `lines`.

    Raises:
        TypeError: if `lines` is one string rather than a list, or holds an
            item that is not a `str`.
        ValueError: if `batch_size` is not a positive int.
    """
    lines = _check_lines(lines, batch_size)
    return _by_length(
        lambda batch: [t.decode("utf-8") for t in serve(batch).numpy()], lines, batch_size, progress
    )


def translate_n_best(serve_n_best, lines, n, batch_size=64, distinct=True):
    """The `n` best translations of each of `lines`, with their scores.

    Hypotheses that differ only in their subword segmentation detokenize to
    the same text (common in models trained with subword regularization);
    with `distinct=True` a text is kept once, at its best score, so a
    sentence can get fewer than `n` translations.

    Args:
        serve_n_best: callable from a `tf.string` tensor `(batch,)` to
            `{"translations": tf.string (batch, k), "scores": float32
            (batch, k)}`, best first: `Translator.serve_n_best` or a
            SavedModel's `translate_n_best` signature.
        lines: list of `str`.
        n: int, how many of the `k` hypotheses to keep, `1 <= n <= k`.
        batch_size: int, sentences per batch.
        distinct: bool, drop a hypothesis whose text an earlier (better)
            one already has; False keeps the search's `n` best as they are.

    Returns:
        list (aligned with `lines`) of lists of pairs `(translation str,
        score float)`, best first: `n` of them, or with `distinct=True`
        between 1 and `n`, with no text twice. The score is the search's
        (log probability over the GNMT length penalty in beam search).

    Raises:
        TypeError, ValueError: as `translate_lines`, and a ValueError when
            the search keeps fewer than `n` hypotheses.
    """
    lines = _check_lines(lines, batch_size)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"`n` must be a positive int; got {n!r}.")

    def rows_of(batch):
        found = serve_n_best(batch)
        translations, scores = found["translations"].numpy(), found["scores"].numpy()
        if translations.shape[1] < n:
            raise ValueError(
                f"The search keeps {translations.shape[1]} hypothesis(es) per sentence (its beam "
                f"size), fewer than the {n} asked for: ask for at most {translations.shape[1]}, or "
                "decode with beam search and a larger beam (--search beam --beam-size N with a run; "
                "a SavedModel keeps the search it was exported with: export it again)."
            )
        rows = []
        for row_t, row_s in zip(translations, scores):
            found = [(t.decode("utf-8"), float(s)) for t, s in zip(row_t, row_s)]
            if distinct:  # best first: the first hypothesis of a text has its best score
                texts = [text for text, _ in found]
                found = [pair for i, pair in enumerate(found) if pair[0] not in texts[:i]]
            rows.append(found[:n])
        return rows

    return _by_length(rows_of, lines, batch_size, False)
