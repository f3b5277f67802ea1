"""Attention masks: padding, causal (look-ahead) and their combination.

Convention used everywhere in this library (the Keras one): a boolean mask
value of `True` means "this query may attend to this key", `False` means
"blocked". This is the opposite of the TF tutorial's hand-written attention,
where 1 meant blocked; mixing the two conventions trains a decoder that only
sees the future.

Masks are built by broadcasting, never by tiling over a concrete batch size,
so they trace under `jax.jit`, `tf.function` and XLA.
"""

import keras
import numpy as np
from keras import ops


def padding_mask(token_ids, pad_id=0):
    """Boolean mask of real (non-padding) tokens.

    Args:
        token_ids: int tensor, shape `(batch, length)`.
        pad_id: int, the padding id.

    Returns:
        bool tensor, shape `(batch, length)`, `True` at real tokens.
    """
    return ops.not_equal(token_ids, pad_id)


def causal_mask(query_length, key_length=None, offset=0):
    """Lower-triangular "may attend" mask of the decoder's self-attention.

    Query position `i` (counted from `offset`) may attend to key positions
    `j <= i + offset`. Section 3.2.3 of Vaswani et al. (2017): "We need to
    prevent leftward information flow in the decoder".

    Args:
        query_length: int or scalar int tensor, number of query positions.
        key_length: int or scalar int tensor, number of key positions;
            defaults to `query_length`.
        offset: int or scalar int tensor, the absolute position of query 0
            (used by cached decoding, where one query attends to a cache).

    Returns:
        bool tensor, shape `(1, query_length, key_length)`; broadcasts over the
        batch, so it does not depend on the batch size.

    Raises:
        TypeError: for a length or offset that is not an integer (a Python
            or NumPy int, or an integer tensor).
        ValueError: for a negative length known here.
    """
    if key_length is None:
        key_length = query_length
    # 0-d NumPy integers as Python ints (torch's arange takes no ndarray).
    query_length, key_length, offset = (
        int(v) if isinstance(v, np.ndarray) and v.ndim == 0 and np.issubdtype(v.dtype, np.integer) else v
        for v in (query_length, key_length, offset)
    )
    for name, value in (("query_length", query_length), ("key_length", key_length), ("offset", offset)):
        dtype = getattr(value, "dtype", None)
        if isinstance(value, bool) or not (
            isinstance(value, (int, np.integer))
            or (dtype is not None and "int" in keras.backend.standardize_dtype(dtype))
        ):  # 2.5 made a mask of 3 on jax and torch and failed on tensorflow
            raise TypeError(f"causal_mask needs an integer `{name}`; got {value!r} ({type(value).__name__}).")
        if isinstance(value, (int, np.integer)) and value < 0 and name != "offset":
            # np.int64(-1) gave an empty mask on jax and failed in a Range op elsewhere
            raise ValueError(f"causal_mask needs a `{name}` of 0 or more; got {value}.")
    if not isinstance(offset, (int, np.integer)):
        offset = ops.cast(offset, "int32")  # an int64 tensor failed in the add on tensorflow
    rows = ops.expand_dims(ops.arange(query_length, dtype="int32") + offset, 1)
    cols = ops.expand_dims(ops.arange(key_length, dtype="int32"), 0)
    return ops.expand_dims(ops.greater_equal(rows, cols), 0)


def as_bool_mask(mask, name="mask"):
    """`mask` as a bool tensor: `True` (or 1) where attention is allowed.

    Args:
        mask: bool or integer (0 / 1) array or tensor.
        name: str, the argument's name in the error.

    Returns:
        bool tensor of `mask`'s shape.

    Raises:
        ValueError: `mask` is a floating-point array. Its meaning is
            ambiguous: an additive mask (0 where allowed, -1e9 where
            blocked, as in the TF tutorial) cast to bool would allow
            exactly the blocked keys.
    """
    if not hasattr(mask, "dtype"):
        mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if "float" in dtype:
        raise ValueError(
            f"`{name}` must be a bool mask (True where a query may attend to a key) or 0/1 integers; "
            f"got {dtype}. A float mask is ambiguous: an additive one (0 where allowed, -1e9 where "
            f"blocked) would be read backwards. Pass `additive_mask == 0` for an additive mask, or "
            f"`mask > 0.5` for a 0/1 float mask."
        )
    return ops.cast(mask, "bool")


def merge_masks(*masks):
    """Logical AND of broadcastable boolean masks, skipping `None`.

    Returns:
        The combined bool tensor, or `None` if every mask is `None`.

    Raises:
        ValueError: a mask is floating-point (`as_bool_mask`).
    """
    result = None
    for mask in masks:
        if mask is None:
            continue
        mask = as_bool_mask(mask)
        result = mask if result is None else ops.logical_and(result, mask)
    return result


def key_padding_to_attention_mask(key_mask):
    """Turn a `(batch, key_length)` key mask into `(batch, 1, key_length)`.

    The result broadcasts along the query axis: every query sees the same
    keys. This is the shape cross-attention needs with the *source* padding
    and self-attention needs with the sequence's own padding.

    Raises:
        ValueError: `key_mask` is floating-point (`as_bool_mask`).
    """
    if key_mask is None:
        return None
    return ops.expand_dims(as_bool_mask(key_mask), 1)
