"""Packing token ids into fixed-length model inputs and shifted labels.

Truncation happens *before* the special ids are added, so the end id is
never cut off: a model trained on these labels always sees where a
sentence stops (the TF tutorial truncated after adding the end token and
lost it on long sentences: tensorflow/text#1132).

Teacher forcing (Vaswani et al., 2017, Section 3.1, "the output embeddings
are offset by one position"): for target tokens `t1..tn`,

    packed          = [start, t1, ..., tn, end]
    decoder_inputs  = [start, t1, ..., tn]        = packed[:-1]
    labels          = [t1, ..., tn, end]          = packed[1:]

so `labels[i] == decoder_inputs[i + 1]`, every label row holds the end id
exactly once and decoder inputs never hold it. All functions are TF ops
and run inside `tf.data` and `tf.function`.
"""

import tensorflow as tf


def _as_ragged_batch(token_ids):
    """Returns `(ragged int32 (batch, None), was_rank_1)`."""
    if isinstance(token_ids, tf.RaggedTensor):
        if token_ids.shape.rank != 2:
            raise ValueError(
                "Expected token ids of shape (batch, None). Received a "
                f"RaggedTensor of shape {token_ids.shape}."
            )
        return tf.cast(token_ids, tf.int32), False
    if isinstance(token_ids, (list, tuple)):
        if not token_ids:  # An empty batch.
            return (
                tf.RaggedTensor.from_row_lengths(
                    tf.zeros([0], tf.int32), tf.zeros([0], tf.int64)
                ),
                False,
            )
        if any(isinstance(row, (list, tuple)) for row in token_ids):
            ragged = tf.ragged.constant(
                token_ids, dtype=tf.int32, ragged_rank=1
            )
            return ragged, False
    token_ids = tf.convert_to_tensor(token_ids)
    if not token_ids.dtype.is_integer:
        raise ValueError(
            f"Token ids must be integers. Received dtype {token_ids.dtype}."
        )
    token_ids = tf.cast(token_ids, tf.int32)
    rank = token_ids.shape.rank
    if rank == 1:
        return tf.RaggedTensor.from_tensor(token_ids[tf.newaxis, :]), True
    if rank == 2:
        return tf.RaggedTensor.from_tensor(token_ids), False
    raise ValueError(
        "Expected token ids of shape (length,) or (batch, None) "
        f"(ragged). Received shape {token_ids.shape}."
    )


def _column(ragged, value):
    """A `(batch, 1)` ragged column of `value`, matching `ragged`'s rows."""
    nrows = ragged.nrows(out_type=tf.int64)
    column = tf.fill(tf.stack([nrows, 1]), tf.constant(value, tf.int32))
    return tf.RaggedTensor.from_tensor(
        column, row_splits_dtype=ragged.row_splits.dtype
    )


def _to_dense(ragged, pad_id, width):
    if width is None:
        return ragged.to_tensor(default_value=pad_id)
    return ragged.to_tensor(default_value=pad_id, shape=[None, width])


def _check_max_length(max_length, minimum):
    if not isinstance(max_length, int) or max_length < minimum:
        raise ValueError(
            f"`max_length` must be a Python int >= {minimum} (room for the "
            f"special ids). Received: max_length={max_length!r}."
        )


def pack_sequence(
    token_ids,
    max_length,
    *,
    start_id=None,
    end_id=None,
    pad_id=0,
    pad_to_max_length=True,
):
    """Adds optional start/end ids to each row, truncating first, then pads.

    Each row becomes `[start_id] + t[:max_length - k] + [end_id]`, where `k`
    is the number of special ids requested, so the special ids always
    survive truncation.

    Args:
        token_ids: `tf.RaggedTensor` `(batch, None)`, a list of lists, a
            dense `(batch, length)` tensor (every entry is a token), or a
            1-D tensor `(length,)` for a single sequence.
        max_length: int. Length of a packed row, special ids included.
        start_id: optional int prepended to every row.
        end_id: optional int appended to every row.
        pad_id: int used for padding. Defaults to 0.
        pad_to_max_length: bool. If `True` (default) pad to exactly
            `max_length`; otherwise pad to the longest packed row.

    Returns:
        `int32` tensor `(batch, max_length)` (or `(batch, longest)`), or
        `(max_length,)` / `(packed_length,)` for 1-D input.

    Raises:
        ValueError: if `max_length` is too small for the special ids or the
            input has the wrong rank or dtype.

    Example:

    ```python
    pack_sequence([[7, 8, 9]], 4, start_id=2, end_id=3)  # [[2, 7, 8, 3]]
    ```
    """
    specials = (start_id is not None) + (end_id is not None)
    _check_max_length(max_length, max(specials, 1))
    ragged, was_rank_1 = _as_ragged_batch(token_ids)
    parts = []
    if start_id is not None:
        parts.append(_column(ragged, start_id))
    parts.append(ragged[:, : max_length - specials])
    if end_id is not None:
        parts.append(_column(ragged, end_id))
    packed = tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]
    dense = _to_dense(packed, pad_id, max_length if pad_to_max_length else None)
    return dense[0] if was_rank_1 else dense


def pack_source(
    token_ids, max_length, *, end_id, pad_id, pad_to_max_length=True
):
    """Packs encoder inputs: `t[:max_length - 1] + [end_id]`, then pads.

    The end id is always kept as the last real token of each row.

    Args:
        token_ids: `tf.RaggedTensor` `(batch, None)` (or a list of lists, or
            a 1-D tensor for one sequence) of source token ids.
        max_length: int. Maximum encoder sequence length, end id included.
        end_id: int. End-of-sequence id.
        pad_id: int. Padding id.
        pad_to_max_length: bool. Pad to exactly `max_length` (default) or to
            the longest row of the batch.

    Returns:
        `int32` tensor `(batch, max_length)` (or `(batch, longest)`);
        `(length,)` for 1-D input.

    Example:

    ```python
    pack_source([[5, 6, 7, 8]], 3, end_id=3, pad_id=0)  # [[5, 6, 3]]
    ```
    """
    return pack_sequence(
        token_ids,
        max_length,
        end_id=end_id,
        pad_id=pad_id,
        pad_to_max_length=pad_to_max_length,
    )


def pack_target(
    token_ids,
    max_length,
    *,
    start_id,
    end_id,
    pad_id,
    pad_to_max_length=True,
):
    """Packs target ids and splits them into decoder inputs and labels.

    The packed row is `[start_id] + t[:max_length - 2] + [end_id]` padded
    to `max_length`; `decoder_inputs = packed[:, :-1]` and
    `labels = packed[:, 1:]`, except that the end id is never copied into
    `decoder_inputs` (pad takes its place in short rows), so the decoder
    never reads the end token and each label row holds it exactly once.

    Args:
        token_ids: `tf.RaggedTensor` `(batch, None)` (or a list of lists, or
            a 1-D tensor for one sequence) of target token ids.
        max_length: int >= 2. Length of the packed row *before* the shift;
            the outputs are one shorter.
        start_id: int. Decoder start id.
        end_id: int. End-of-sequence id.
        pad_id: int. Padding id.
        pad_to_max_length: bool. Pad to exactly `max_length - 1` (default)
            or to the longest row of the batch.

    Returns:
        `(decoder_inputs, labels)`: two `int32` tensors of shape
        `(batch, max_length - 1)` (or `(batch, longest)`); `(length,)` each
        for 1-D input.

    Example:

    ```python
    dec, lab = pack_target([[7, 8]], 5, start_id=2, end_id=3, pad_id=0)
    # dec == [[2, 7, 8, 0]], lab == [[7, 8, 3, 0]]
    ```

    References:
        - [Vaswani et al., 2017. Attention Is All You Need, Section 3.1](
          https://arxiv.org/abs/1706.03762)
    """
    _check_max_length(max_length, 2)
    ragged, was_rank_1 = _as_ragged_batch(token_ids)
    decoder_inputs, labels = pack_target_ragged(
        ragged, max_length, start_id=start_id, end_id=end_id
    )
    width = max_length - 1 if pad_to_max_length else None
    decoder_inputs = _to_dense(decoder_inputs, pad_id, width)
    labels = _to_dense(labels, pad_id, width)
    if was_rank_1:
        return decoder_inputs[0], labels[0]
    return decoder_inputs, labels


def pack_source_ragged(token_ids, max_length, *, end_id):
    """`pack_source` without padding: ragged `(batch, None)` in and out."""
    _check_max_length(max_length, 1)
    tokens = tf.cast(token_ids, tf.int32)[:, : max_length - 1]
    return tf.concat([tokens, _column(tokens, end_id)], axis=1)


def pack_target_ragged(token_ids, max_length, *, start_id, end_id):
    """`pack_target` without padding: ragged `(batch, None)` in, two out."""
    _check_max_length(max_length, 2)
    tokens = tf.cast(token_ids, tf.int32)[:, : max_length - 2]
    decoder_inputs = tf.concat([_column(tokens, start_id), tokens], axis=1)
    labels = tf.concat([tokens, _column(tokens, end_id)], axis=1)
    return decoder_inputs, labels
