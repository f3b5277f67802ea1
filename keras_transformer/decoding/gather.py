"""The gathers a search makes every step, in one graph op on tensorflow.

Keras's `ops.take_along_axis` on tensorflow handles every case (indices
broadcast against the input, negative indices, any axis) in about 17 graph
ops, and `ops.take` adds six for negative indices. A search's indices have
the input's rank (`take_along_last_axis`) or pick rows (`take_rows`), and
are in range: one `GatherV2` each. On the other backends the calls are
Keras's.

>>> import numpy as np
>>> from keras import ops
>>> x = np.array([[10, 11, 12], [20, 21, 22]])
>>> ops.convert_to_numpy(take_along_last_axis(x, np.array([[2, 0], [1, 1]], "int32"))).tolist()
[[12, 10], [21, 21]]
"""

import keras
from keras import ops


def take_along_last_axis(x, indices):
    """`ops.take_along_axis(x, indices, axis=-1)` for search indices.

    Args:
        x: tensor `(*lead, n)`.
        indices: int32 `(*lead, m)`, the same leading axes as `x`, each in
            `[0, n)` (not checked).

    Returns:
        `(*lead, m)` of the dtype of `x`: `x[..., indices]` row by row.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.take_along_axis(x, indices, axis=-1)
    import tensorflow as tf

    return tf.gather(x, indices, batch_dims=len(x.shape) - 1)


def take_rows(x, rows):
    """`ops.take(x, rows, axis=0)` for row indices in `[0, len(x))` (not
    checked): `(len(rows), *x.shape[1:])`."""
    if keras.backend.backend() != "tensorflow":
        return ops.take(x, rows, axis=0)
    import tensorflow as tf

    return tf.gather(x, rows)
