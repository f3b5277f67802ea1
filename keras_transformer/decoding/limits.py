"""How long decoding may run for each sentence, and which ids it may emit."""

from keras import ops


def decode_limits(source_mask, max_length, length_ratio=None, length_offset=10):
    """Per-sentence limit on output tokens (the end token included).

    Each sentence stops at `max_length` tokens, the model's positional
    limit, or earlier at `ceil(length_ratio * source_length) +
    length_offset` when `length_ratio` is given; whichever is smaller. At the
    limit the end token is forced, so every output is terminated.

    Args:
        source_mask: bool `(batch, source_length)`, real source tokens.
        max_length: int, hard limit (at most the model's `max_length`).
        length_ratio: optional float, limit relative to the source length.
        length_offset: int, added to the relative limit.

    Returns:
        int32 `(batch,)`.
    """
    source_length = ops.sum(ops.cast(source_mask, "int32"), axis=-1)
    limit = ops.full_like(source_length, max_length)
    if length_ratio is not None:
        # Capped in float32 before the cast: a ratio of 1e9 overflowed int32
        # and made every output empty.
        relative = ops.ceil(ops.cast(source_length, "float32") * length_ratio) + float(length_offset)
        relative = ops.minimum(relative, float(max_length))
        limit = ops.minimum(limit, ops.cast(relative, "int32"))
    return ops.maximum(limit, 1)


def flatten_caches(caches):
    """[(k, v), ...] -> [k, v, ...] for loop variables."""
    return [tensor for pair in caches for tensor in pair]


def unflatten_caches(flat):
    """[k, v, ...] -> [(k, v), ...]."""
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


# A finite "impossible" log-probability: -inf would give inf - inf = NaN.
NEG_LOG_PROB = -1e9


def suppress_ids(log_probs, vocab_size, ids):
    """`log_probs` `(..., vocab_size)` with the entries of `ids` set to
    `NEG_LOG_PROB`, so a search never picks them, and the others unchanged
    (not renormalized: a hypothesis's score stays the model's own
    log-probability of it, the teacher-forced one).

    The searches suppress `pad_id` and `start_id` at every step: neither is
    an output token (a pad inside a sentence would also be masked by the
    full model, though the cache attends to it), and the `Translator`
    suppresses `unk_id` unless asked to allow it.
    """
    ids = sorted({int(i) for i in ids if i is not None})
    if not ids:
        return log_probs
    blocked = ops.any(
        ops.equal(ops.arange(vocab_size, dtype="int32")[:, None], ops.convert_to_tensor(ids, "int32")[None, :]),
        axis=1,
    )
    return ops.where(blocked, NEG_LOG_PROB, log_probs)
