"""Exact top-k over long rows, as beam search needs it over the vocabulary.

`top_k(x, k)` returns what `keras.ops.top_k(x, k)` returns: the `k`
largest values of each row, best first, ties to the lower index. On
tensorflow, TensorFlow's CPU `TopKV2` walks each row element by element,
which made it the costliest op of a beam-search step (several times a
matrix product over the same rows); there, rows are searched in two
stages instead:

1. the maximum of each block of `BLOCK` consecutive entries;
2. the `k` blocks with the largest maxima (ties to the lower block), in
   index order, and the top `k` of their `k * BLOCK` entries.

The answer is the same, ties included: a block ranked above the block of
one of the top `k` entries holds an entry ranked above that entry, so all
`k` lie in the `k` best blocks, and gathering the blocks in index order
keeps the lower-index-first tie order.

>>> import numpy as np
>>> from keras import ops
>>> values, indices = top_k(np.array([[1.0, 3.0, 3.0, 0.0, 5.0]]), 3)
>>> ops.convert_to_numpy(values).tolist(), ops.convert_to_numpy(indices).tolist()
([[5.0, 3.0, 3.0]], [[4, 1, 2]])
"""

import keras
from keras import ops

BLOCK = 64


def top_k(x, k):
    """The `k` largest entries of each row of `x` and their indices.

    Args:
        x: float `(..., n)`.
        k: python int in `[1, n]`.

    Returns:
        `(values (..., k) of x's dtype, indices int32 (..., k))`, best
        first, ties to the lower index (as `keras.ops.top_k`).
    """
    n = x.shape[-1]
    if keras.backend.backend() != "tensorflow" or n is None or n < 4 * BLOCK or k * BLOCK >= n:
        values, indices = ops.top_k(x, k)
        return values, ops.cast(indices, "int32")
    import tensorflow as tf

    x = tf.convert_to_tensor(x)
    blocks = -(-n // BLOCK)
    if blocks * BLOCK != n:  # pad the rows with -inf: never above a real entry, and after it on ties
        x = tf.pad(x, [[0, 0]] * (x.shape.rank - 1) + [[0, blocks * BLOCK - n]], constant_values=float("-inf"))
    lead = tf.shape(x)[:-1]
    rows = tf.reshape(x, (-1, blocks, BLOCK))
    _, best_blocks = tf.math.top_k(tf.reduce_max(rows, axis=-1), k)
    best_blocks = tf.sort(best_blocks, axis=-1)
    candidates = tf.reshape(tf.gather(rows, best_blocks, batch_dims=1), (-1, k * BLOCK))
    values, position = tf.math.top_k(candidates, k)
    indices = tf.gather(best_blocks, position // BLOCK, batch_dims=1) * BLOCK + position % BLOCK
    shape = tf.concat([lead, [k]], axis=0)
    return tf.reshape(values, shape), tf.reshape(indices, shape)
