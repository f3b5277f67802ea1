"""Greedy decoding with a key/value cache."""

from keras import ops

from keras_transformer.decoding.limits import decode_limits
from keras_transformer.deprecation import renamed_argument
from keras_transformer.decoding.limits import flatten_caches
from keras_transformer.decoding.limits import suppress_ids
from keras_transformer.decoding.limits import unflatten_caches
from keras_transformer.layers.id_range import check_id_range


def greedy_search(
    parts,
    source_ids,
    *,
    start_id,
    end_id,
    pad_id=0,
    max_length=None,
    length_ratio=None,
    length_offset=10,
    return_attention_scores=False,
    suppressed_ids=(),
    return_attention=None,
):
    """Pick the most probable token at each step until `end_id`.

    The encoder runs once; the decoder runs one position per step against a
    key/value cache (`TransformerParts.decode_step`). The loop is
    `keras.ops.while_loop`, so it runs on every backend and traces into a
    `tf.function` / XLA graph on tensorflow. It stops when every sentence
    has produced `end_id` or reached its limit (`decode_limits`); the end
    token is forced at the limit, and only `pad_id` follows it. `pad_id`,
    `start_id` and `suppressed_ids` are never picked (`suppress_ids`).

    Args:
        parts: `TransformerParts` of the model.
        source_ids: int32 `(batch, source_length)`, padded with `pad_id`.
        start_id: int, first decoder input.
        end_id: int, stops a sentence.
        pad_id: int, fills positions after `end_id`.
        max_length: int, most output tokens; default and upper bound: the
            decoder's `sequence_length`.
        length_ratio: optional float, see `decode_limits`.
        length_offset: int, see `decode_limits`.
        return_attention_scores: bool, also return the last decoder layer's
            cross-attention weights (`return_attention` is its deprecated
            old name).
        suppressed_ids: ints never to output besides `pad_id` and
            `start_id` (the `Translator` passes the unknown id).

    Returns:
        `(tokens, scores)`: int32 `(batch, max_length)` output ids (the end
        token included, no start token) and float32 `(batch,)` sums of the
        chosen tokens' log-probabilities; with `return_attention_scores`, also
        float32 `(batch, max_length, num_heads, source_length)` weights of
        each output token over the source (zero after the end token).
    """
    return_attention = renamed_argument("greedy_search", "return_attention_scores",
                                        return_attention_scores or None, "return_attention",
                                        return_attention or None, False)
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    blocked = (pad_id, start_id, *suppressed_ids)
    length = (parts.target_sequence_length if max_length is None
              else min(int(max_length), parts.target_sequence_length))
    encoder_outputs, encoder_outputs_mask = parts.encode(source_ids)
    batch = ops.shape(source_ids)[0]
    limits = decode_limits(encoder_outputs_mask, length, length_ratio, length_offset)
    cross = parts.cross_caches(encoder_outputs)
    weights = parts.decoding_weights()  # once, outside the loop
    positions = ops.arange(length, dtype="int32")
    caches = flatten_caches(parts.empty_self_caches(batch, length, encoder_outputs.dtype))
    tokens = ops.full((batch, length), pad_id, "int32")
    last = check_id_range(ops.full((batch,), start_id, "int32"), parts.vocab_size, "`start_id`")
    finished = ops.zeros((batch,), "bool")
    scores = ops.zeros((batch,), "float32")
    source_length = ops.shape(source_ids)[1]
    # Carried through the loop only when asked for; a placeholder otherwise.
    attention_shape = (batch, length, parts.num_heads, source_length) if return_attention else (0,)
    attention = ops.zeros(attention_shape, "float32")

    def cond(t, last, tokens, finished, scores, attention, *caches):
        return ops.logical_and(t < length, ops.logical_not(ops.all(finished)))

    def body(t, last, tokens, finished, scores, attention, *caches):
        outputs = parts.decode_step(
            last, t, unflatten_caches(caches), cross, encoder_outputs_mask,
            return_attention_scores=return_attention, weights=weights,
        )
        logits, new_caches = outputs[0], outputs[1]
        if return_attention:
            step_weights = ops.where(
                ops.reshape(finished, (-1, 1, 1)), 0.0, ops.cast(outputs[2], "float32")
            )
            attention = ops.where(
                ops.reshape(ops.equal(positions, t), (1, -1, 1, 1)), ops.expand_dims(step_weights, 1), attention
            )
        log_probs = suppress_ids(ops.log_softmax(logits, axis=-1), parts.vocab_size, blocked)
        at_limit = ops.greater_equal(t + 1, limits)
        best = ops.cast(ops.argmax(log_probs, axis=-1), "int32")
        best = ops.where(at_limit, end_id, best)
        best = ops.where(finished, pad_id, best)
        gained = ops.take_along_axis(log_probs, best[:, None], axis=-1)[:, 0]
        scores = scores + ops.where(finished, 0.0, gained)
        # `where` on a position mask rather than `slice_update`: on tensorflow
        # the latter is an XLA op launched per call, the costliest op here.
        tokens = ops.where(ops.equal(positions, t)[None, :], best[:, None], tokens)
        finished = ops.logical_or(finished, ops.equal(best, end_id))
        return (t + 1, best, tokens, finished, scores, attention, *flatten_caches(new_caches))

    outputs = ops.while_loop(
        cond,
        body,
        (ops.convert_to_tensor(0, "int32"), last, tokens, finished, scores, attention, *caches),
    )
    if return_attention:
        return outputs[2], outputs[4], outputs[5]
    return outputs[2], outputs[4]
