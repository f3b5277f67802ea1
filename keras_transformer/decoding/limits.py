"""How long decoding may run for each sentence."""

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
        relative = ops.cast(
            ops.ceil(ops.cast(source_length, "float32") * length_ratio), "int32"
        ) + length_offset
        limit = ops.minimum(limit, relative)
    return ops.maximum(limit, 1)


def flatten_caches(caches):
    """[(k, v), ...] -> [k, v, ...] for loop variables."""
    return [tensor for pair in caches for tensor in pair]


def unflatten_caches(flat):
    """[k, v, ...] -> [(k, v), ...]."""
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
