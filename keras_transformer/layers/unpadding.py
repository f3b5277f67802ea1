"""Run the position-wise layers on real tokens only, padding removed.

Every sub-layer of the Transformer except attention acts on each position
alone: the Q/K/V and output projections of attention, the feed-forward net,
the residual adds, dropout and LayerNorm (sections 3.1-3.3). On a padded
batch these can run on the `(tokens, d_model)` matrix of the real tokens and
skip the padding, which in a batch of random lengths 8-40 padded to 40 is
40% of the positions. Only attention needs the `(batch, length, ...)` layout,
so the sequence is padded back around it. This is the "remove padding"
technique of Effective Transformer / FasterTransformer (flash-attn calls the
two moves `unpad_input` and `pad_input`).

It needs tensors whose size depends on the data, so it runs where a backend
allows them: TensorFlow graphs not compiled by XLA, and PyTorch. Under JAX,
and in TensorFlow functions with `jit_compile=True`, `Unpadding.create`
returns `None` and the layers keep the padded layout.
"""

import keras
from keras import ops


def dynamic_shapes_allowed():
    """Whether the current trace may build tensors of data-dependent size.

    True on PyTorch and in TensorFlow outside XLA compilation; False on JAX
    (every `jax.jit` shape is static) and inside a TensorFlow function
    compiled with `jit_compile=True`.
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "tensorflow":
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        if tf.executing_eagerly():
            return True
        graph = tf.compat.v1.get_default_graph()
        return not control_flow_util.GraphOrParentsInXlaContext(graph)
    return False


class Unpadding:
    """Where the real tokens of a padded batch are: drop and restore padding.

    Args:
        mask: bool tensor `(batch, length)`, True at real tokens.

    Attributes:
        batch, length: the padded shape (ints or scalar int tensors).
        indices: int `(tokens,)`, the flat positions `b * length + t` of the
            real tokens, in row-major order.

    Example:

    ```python
    u = Unpadding(np.array([[True, False], [True, True]]))
    x = np.arange(8, dtype="float32").reshape(2, 2, 2)
    u.unpad(x)         # [[0, 1], [4, 5], [6, 7]]: (3, 2)
    u.pad(u.unpad(x))  # x with the padded row [2, 3] set to [0, 0]
    ```
    """

    def __init__(self, mask):
        mask = ops.cast(mask, "bool")
        shape = ops.shape(mask)
        self.batch, self.length = shape[0], shape[1]
        self.indices = ops.nonzero(ops.reshape(mask, (-1,)))[0]

    @classmethod
    def create(cls, mask, training=None):
        """An `Unpadding` for a training step, or None where it cannot help.

        Returns None without a mask, outside training (inference keeps the
        padded layout, so its outputs at padded positions are unchanged),
        and where the backend needs static shapes (`dynamic_shapes_allowed`).
        """
        if mask is None or not training or not dynamic_shapes_allowed():
            return None
        return cls(mask)

    def unpad(self, x):
        """`(batch, length, ...)` -> `(tokens, ...)`, the real tokens only."""
        flat = ops.reshape(x, (-1,) + tuple(x.shape[2:]))
        return ops.take(flat, self.indices, axis=0)

    def pad(self, x):
        """`(tokens, ...)` -> `(batch, length, ...)`, zeros at padding."""
        features = tuple(x.shape[1:])
        shape = (self.batch * self.length,) + features
        indices = ops.expand_dims(self.indices, -1)
        if keras.backend.backend() == "torch":
            # Keras's `scatter` on torch loops over the indices in Python;
            # `scatter_update` is one indexed assignment.
            flat = ops.scatter_update(ops.zeros(shape, x.dtype), indices, x)
        else:
            flat = ops.scatter(indices, x, shape)  # tf.scatter_nd
        return ops.reshape(flat, (self.batch, self.length) + features)


# The logits of a training step are built from the real tokens' logits
# `(tokens, vocab)`, padded back to `(batch, length, vocab)` for the Keras
# API. The padded tensor carries the compact one along (as Keras carries
# `_keras_mask`), so the masked loss and accuracy can work on the real rows
# only and leave the padded tensor unused (TensorFlow then prunes it).
_UNPADDED = "_keras_transformer_unpadded"


def attach_unpadded(padded, unpadded, unpadding):
    """Record on `padded` that it is `unpadding.pad(unpadded)`; returns it."""
    try:
        setattr(padded, _UNPADDED, (unpadded, unpadding))
    except AttributeError:  # a tensor type without attributes: no shortcut
        pass
    return padded


def unpadded_of(tensor):
    """`(unpadded, unpadding)` recorded by `attach_unpadded`, or None."""
    return getattr(tensor, _UNPADDED, None)
