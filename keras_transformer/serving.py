"""The serving signatures of a `Translator`: what a SavedModel exports.

`ServingSignatures(translator)` holds three `tf.function`s with fixed input
signatures, `serve` (`serving_default`), `serve_n_best`
(`translate_n_best`) and `serve_ids` (`translate_ids`); `export_translator`
saves their concrete functions. With `weights` (`quantization.Int8Weights`)
each runs inside the scope that rebuilds the model's matrices from int8.
"""

import functools

import tensorflow as tf

# The string signatures take a string or a batch of strings. The rank is left
# open on purpose: with a fixed `[None]`, graph optimisations trust that rank,
# and a scalar sent by a client would crash deep in the graph instead of
# being translated.
TEXT_SPEC = tf.TensorSpec(None, tf.string, name="text")


def as_batch(text):
    """A `tf.string` tensor of rank 0 or 1 of UTF-8 text as a `(batch,)`
    vector.

    Raises:
        tf.errors.InvalidArgumentError: (in the graph) for rank 2 or more,
            or for elements that are not valid UTF-8 (their indices in the
            batch are in the message). Such bytes, from a client that sends
            Latin-1 say, would otherwise reach the tokenizer as U+FFFD and
            be translated without them.
    """
    check = tf.debugging.assert_less_equal(
        tf.rank(text),
        1,
        message="`text` must be a string or a 1-D batch of strings; flatten it first",
    )
    with tf.control_dependencies([check]):
        batch = tf.reshape(text, [-1])
    valid = tf.equal(
        tf.strings.unicode_transcode(batch, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD), batch
    )
    utf8 = tf.debugging.Assert(
        tf.reduce_all(valid),
        ["`text` must be UTF-8; encode it as UTF-8 (not Latin-1 or another encoding). "
         "Elements at these batch indices are not valid UTF-8:", tf.where(tf.logical_not(valid))[:, 0]],
    )
    with tf.control_dependencies([utf8]):
        return tf.identity(batch)


# Same for the id signature: a row `(length,)` is a batch of one.
IDS_SPEC = tf.TensorSpec(None, tf.int32, name="source_ids")


def as_id_batch(source_ids, vocab_size, end_id, pad_id, start_id=None):
    """An int32 id tensor of rank 1 or 2 as a `(batch, length)` matrix.

    Raises:
        tf.errors.InvalidArgumentError: (in the graph, before any other op
            uses the ids) for rank 0 or 3+, for an id outside
            `[0, vocab_size)`, or for a row whose last id before the
            padding (`pad_id`) is not `end_id` (the encoder was trained on
            sources that end with it; without it the translation runs on to
            the length limit), padding before a row's end id, a second end
            id, or `start_id` (given: the encoder never reads it). A row is
            the source's pieces, then `end_id`, then only padding; a row of
            padding alone is a blank source.
    """
    rank = tf.rank(source_ids)
    checks = [
        tf.debugging.assert_greater_equal(
            rank, 1,
            message="`source_ids` must be a row of ids (length,) or a batch "
            "(batch, length), not a scalar",
        ),
        tf.debugging.assert_less_equal(
            rank, 2,
            message="`source_ids` must be a row of ids (length,) or a batch "
            "(batch, length) padded with 0; flatten it first",
        ),
    ]
    with tf.control_dependencies(checks):
        shape = tf.shape(source_ids)
        rows = tf.where(tf.equal(rank, 1), 1, shape[0])
        batch = tf.reshape(source_ids, tf.stack([rows, shape[rank - 1]]))
    largest = tf.reduce_max(tf.concat([tf.reshape(batch, [-1]), [0]], 0))  # 0 if empty
    in_range = tf.debugging.assert_less(
        largest,
        vocab_size,
        message=f"`source_ids` must be ids of the source vocabulary, in [0, {vocab_size})",
    )
    non_negative = tf.debugging.assert_non_negative(
        batch, message="`source_ids` must not be negative"
    )
    # Each row's last id that is not padding (a column of padding added, so
    # that a row of length 0 has one to read).
    padded = tf.pad(batch, [[0, 0], [0, 1]], constant_values=pad_id)
    positions = tf.range(tf.shape(padded)[1])[None, :]
    last = tf.reduce_max(tf.where(tf.not_equal(padded, pad_id), positions, -1), axis=1)
    last_ids = tf.gather(padded, tf.maximum(last, 0), batch_dims=1)
    ends = tf.debugging.Assert(
        tf.reduce_all(tf.logical_or(last < 0, tf.equal(last_ids, end_id))),
        [f"`source_ids` rows must end with the end id {end_id} after their last "
         f"piece (then padding with {pad_id}): append it to the ids of each "
         "source, as the export's SentencePiece model gives them"],
    )
    layout = ("`source_ids` rows must be the source's pieces, then the end id "
              f"{end_id}, then only padding ({pad_id}): ")
    no_gap = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(tf.logical_and(tf.equal(padded, pad_id), positions < last[:, None]))),
        [layout + "a row has padding before its end id"],
    )
    one_end = tf.debugging.Assert(
        tf.reduce_all(tf.reduce_sum(tf.cast(tf.equal(batch, end_id), tf.int32), axis=1) <= 1),
        [layout + "a row has a second end id; give one source a row"],
    )
    checks = [in_range, non_negative, ends, no_gap, one_end]
    if start_id is not None:
        checks.append(tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(tf.equal(batch, start_id))),
            [layout + f"a row holds the start id {start_id}, which sources never hold; drop it"],
        ))
    with tf.control_dependencies(checks):
        return tf.identity(batch)


def _signature(spec):
    """A `tf.function` of one argument with input signature `[spec]`, run
    inside the weights' scope when the signatures have int8 weights."""

    def decorate(method):
        @functools.wraps(method)
        def scoped(self, argument):
            if self.weights is None:
                return method(self, argument)
            with self.weights.scope():
                return method(self, argument)

        return tf.function(scoped, input_signature=[spec], autograph=False)

    return decorate


class ServingSignatures(tf.Module):
    """The serving functions of `translator`.

    Args:
        translator: a `keras_transformer.Translator`.
        weights: optional `quantization.Int8Weights` of `translator.model`:
            the functions then read its matrices from their int8 copies.
    """

    def __init__(self, translator, weights=None, name="serving_signatures"):
        super().__init__(name=name)
        self.translator = translator
        self.weights = weights
        if weights is not None:
            # The search inlines into each function, so that it reads the
            # rebuilt matrices of that function's scope.
            translator._search = lambda source_ids, n_best: translator._search_ids(
                translator._parts, source_ids, n_best)

    @_signature(TEXT_SPEC)
    def serve(self, text):
        """The serving signature: `text` (batch,) -> translation, score.

        `text` may also be a scalar string (a batch of one; the outputs are
        then of shape (1,)); a higher rank is an `InvalidArgumentError` that
        says so, raised before any other op runs.
        """
        translations, scores = self.translator.translate_batch(as_batch(text))
        return {"translation": translations[:, 0], "score": scores[:, 0]}

    @_signature(TEXT_SPEC)
    def serve_n_best(self, text):
        """N-best signature: `text` (batch,) -> `translations` (batch, n) and
        `scores` (batch, n), best first, with n = `beam_size`. A scalar
        `text` is a batch of one, as in `serve`."""
        translations, scores = self.translator.translate_batch(as_batch(text), n_best=self.translator.beam_size)
        return {"translations": translations, "scores": scores}

    @_signature(IDS_SPEC)
    def serve_ids(self, source_ids):
        """Token-id signature for clients that tokenize themselves.

        `source_ids` int32 (batch, length): source subword ids, each row
        ending with `end_id` and padded with `pad_id` (0); longer rows than
        the encoder's `sequence_length` are cut to `sequence_length - 1` ids + `end_id`.
        A single row `(length,)` is a batch of one.
        Returns `target_ids` int32 (batch, length): output ids ending with
        `end_id` then `pad_id`, no `start_id`; and `score` float32 (batch,).
        A row without source tokens (only `end_id` and padding) gives the
        end id alone and score 0, as a blank string does in `serve`.

        Raises:
            tf.errors.InvalidArgumentError: for rank 0 or 3+, an id
                outside `[0, source vocab_size)`, a row that does not end
                with `end_id` before its padding, padding before a row's
                end id, a second end id, or `start_id` in a row, before
                decoding starts.
        """
        tokenizer = self.translator.src_tokenizer
        source_ids = as_id_batch(source_ids, tokenizer.vocab_size, tokenizer.end_id, tokenizer.pad_id,
                                 start_id=tokenizer.start_id)
        source_ids = self.translator._clip_source(source_ids)
        tokens, scores = self.translator.translate_ids(source_ids)
        tokens, scores = tokens[:, 0], scores[:, 0]
        # A row with no source token (only the end id and padding) gets the
        # empty output, as a blank `text` does: the end id alone, score 0.
        special = tf.logical_or(
            tf.equal(source_ids, self.translator.src_tokenizer.pad_id),
            tf.equal(source_ids, self.translator.src_tokenizer.end_id),
        )
        blank = tf.reduce_all(special, axis=1)
        empty = tf.one_hot(
            0, tf.shape(tokens)[1], on_value=self.translator.tgt_tokenizer.end_id,
            off_value=self.translator.tgt_tokenizer.pad_id, dtype=tokens.dtype,
        )
        tokens = tf.where(blank[:, None], empty[None, :], tokens)
        scores = tf.where(blank, tf.zeros_like(scores), scores)
        return {"target_ids": tokens, "score": scores}
