"""Token ids checked against the vocabulary on every backend."""

import keras
import numpy as np
from keras import ops


def _message(name, size, low, high):
    return (
        f"{name} must be token ids in [0, {size}); got ids from {low} to {high}. "
        "Encode text with the tokenizers the model was built for, and pad with "
        "an id inside the vocabulary."
    )


class TokenIdTypeError(TypeError, ValueError):
    """Token ids or labels of a dtype that is not an integer one.

    A `TypeError`, and a `ValueError` too (as NumPy's `AxisError` is both a
    `ValueError` and an `IndexError`), because Keras's `fit` on jax and torch
    passes a `ValueError` from its first symbolic call on unchanged and
    wraps any other error in "Unable to automatically build the model".
    """


def check_integer_ids(ids, name, fix="Tokenize to int32 ids first"):
    """Raises TypeError unless `ids` (an array, tensor or nested list) has an
    integer dtype: a float id would be cut to an integer without a word
    (Keras's functional inputs and `ops.cast` truncate 3.7 to 3), and a
    bool one read as 0 or 1.

    Args:
        ids: the ids, any shape.
        name: what the ids are, for the message (e.g. "`encoder_inputs`").
        fix: how to give integer ids, for the message.

    Not checked while Keras's `fit` traces the model for shapes under a
    tf.distribute strategy (`_traced_for_shapes_under_a_strategy`); each
    replica's step is.

    Raises:
        TokenIdTypeError: (a TypeError) for a float, bool or string dtype.

    Example:
    >>> import numpy as np
    >>> check_integer_ids(np.array([[1.5, 2.0]]), "`encoder_inputs`")
    Traceback (most recent call last):
    ...
    keras_transformer.layers.id_range.TokenIdTypeError: `encoder_inputs` must be integer token ids; got float64 ids. Tokenize to int32 ids first (a float id would be cut to an integer without a word).
    """
    dtype = getattr(ids, "dtype", None)
    if dtype is None:
        dtype = np.asarray(ids).dtype
    try:
        dtype = keras.backend.standardize_dtype(dtype)
    except ValueError:  # NumPy strings and objects
        dtype = str(dtype)
    if "int" not in dtype and not _traced_for_shapes_under_a_strategy():
        raise TokenIdTypeError(
            f"{name} must be integer token ids; got {dtype} ids. {fix} "
            "(a float id would be cut to an integer without a word)."
        )


def _traced_for_shapes_under_a_strategy():
    """Whether a TensorFlow graph is traced in a tf.distribute strategy's
    cross-replica context: there Keras's `fit` builds the model and its loss
    on the mean of a batch's replicas (float64 ids and labels) for their
    shapes alone. The replicas' steps are checked."""
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return (tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context()
            and not tf.executing_eagerly())


def check_id_range(ids, size, name):
    """`ids`, once every one of them is checked to lie in `[0, size)`.

    An id outside the vocabulary is an error on every backend. Left alone,
    tensorflow on CPU raises in its gather, tensorflow on GPU reads zeros,
    jax reads NaN (which then spreads into every weight) and torch wraps
    negative ids around.

    Args:
        ids: int tensor, any shape.
        size: python int, the vocabulary size.
        name: what the ids are, for the message (e.g. "encoder_inputs").

    Returns:
        `ids` (on tensorflow, with the check as a control dependency).

    Raises:
        ValueError: when the ids are known here (eager, torch, concrete
            arrays) and one is out of range.
        tf.errors.InvalidArgumentError: (tensorflow graph) at run time.
        jax.errors.JaxRuntimeError: (inside `jax.jit`) at run time, with
            the same message.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.executing_eagerly() and tf.size(ids) > 0:
            low, high = int(tf.reduce_min(ids)), int(tf.reduce_max(ids))
            if low < 0 or high >= size:
                raise ValueError(_message(name, size, low, high))
            return ids
        checks = [
            tf.debugging.assert_non_negative(ids, message=_message(name, size, "<0", "?")),
            tf.debugging.assert_less(
                ids, tf.cast(size, ids.dtype), message=_message(name, size, "?", f">={size}")
            ),
        ]
        with tf.control_dependencies(checks):
            return tf.identity(ids)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        if ids.size == 0:
            return ids
        if not isinstance(ids, jax.core.Tracer):
            # NumPy ids (a batch from the data pipeline) on the host, without
            # a copy to the device and a wait for it.
            low_high = (np.min, np.max) if isinstance(ids, np.ndarray) else (jnp.min, jnp.max)
            low, high = (int(f(ids)) for f in low_high)
            if low < 0 or high >= size:
                raise ValueError(_message(name, size, low, high))
            return ids

        def fail(low, high):
            raise ValueError(_message(name, size, int(low), int(high)))

        bad = jnp.logical_or(jnp.min(ids) < 0, jnp.max(ids) >= size)
        jax.lax.cond(
            bad, lambda: jax.debug.callback(fail, jnp.min(ids), jnp.max(ids)), lambda: None
        )
        return ids
    if ops.size(ids) > 0:
        low, high = int(ops.min(ids)), int(ops.max(ids))
        if low < 0 or high >= size:
            raise ValueError(_message(name, size, low, high))
    return ids


def check_label_ids(labels, size, pad_id):
    """`labels` with `pad_id` replaced by 0, once the rest are checked to lie
    in `[0, size)` (`check_id_range`). Padding may hold any id (e.g. -1).

    Args:
        labels: int tensor or NumPy array, any shape.
        size: python int, the vocabulary size.
        pad_id: int, the label id that marks padding.

    Returns:
        int labels of the same shape (NumPy for NumPy input, else int32
        tensors), 0 where `labels` is `pad_id`.

    Raises:
        As `check_id_range`.
    """
    if isinstance(labels, np.ndarray):  # a batch on the host: no device round trip
        safe = np.where(labels == pad_id, 0, labels)
    else:
        labels = ops.cast(labels, "int32")
        safe = ops.where(ops.equal(labels, pad_id), ops.zeros_like(labels), labels)
    return check_id_range(safe, size, "The labels (apart from pad_id)")
