"""Greedy decoding with a key/value cache."""

from keras_transformer.decoding.search_loop import dynamic_decode
from keras_transformer.decoding.strategies import GreedySearch
from keras_transformer.deprecation import renamed_argument


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

    `GreedySearch` in the one decoding loop (`search_loop.dynamic_decode`):
    the encoder runs once; the decoder runs one position per step against a
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

    Raises:
        ValueError: for sources not of shape `(batch, source_length)` or
            ids outside the vocabularies, `start_id`, `end_id`, `pad_id` or
            a suppressed id among them.
        TypeError: for sources that are not integer ids.
    """
    return_attention = renamed_argument("greedy_search", "return_attention_scores",
                                        return_attention_scores or None, "return_attention",
                                        return_attention or None, False)
    tokens, scores, attention = dynamic_decode(
        parts, source_ids, GreedySearch(), start_id=start_id, end_id=end_id, pad_id=pad_id,
        max_length=max_length, length_ratio=length_ratio, length_offset=length_offset,
        suppressed_ids=suppressed_ids, return_attention_scores=return_attention,
    )
    if return_attention:
        return tokens, scores, attention
    return tokens, scores
