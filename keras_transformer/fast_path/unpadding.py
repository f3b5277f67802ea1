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
allows them: the training fast path (`keras_transformer.fast_path`) is
attached only on TensorFlow without XLA compilation.
"""

import math

import keras

from keras_transformer.devices import in_xla_context
from keras import ops

from keras_transformer.fast_path import kernels


def dynamic_shapes_allowed():
    """Whether the current trace may build tensors of data-dependent size.

    True on PyTorch and in TensorFlow outside XLA compilation; False on JAX
    (every `jax.jit` shape is static) and inside a TensorFlow function
    compiled with `jit_compile=True`.
    """
    return not in_xla_context()


class Unpadding:
    """Where the real tokens of a padded batch are: drop and restore padding.

    Every move is one row gather, and so is its gradient: `unpad` gathers
    the real rows, `pad` gathers them back with a zero row at padding, and
    each one's gradient is the other (on TensorFlow written out with
    `tf.custom_gradient`; TensorFlow's own gradient of a gather is a slower
    scatter-add, and `tf.scatter_nd`'s forward is slower than a gather).
    `pad_heads` and `unpad_heads` do the same for attention and move the
    heads axis in the same gather, so attention runs on `(batch, heads,
    length, depth)` with no transposes.

    Args:
        mask: bool tensor `(batch, length)`, True at real tokens.

    Attributes:
        mask: the bool `(batch, length)` mask it was made from.
        batch, length: the padded shape (ints or scalar int tensors).
        indices: int32 `(tokens,)`, the flat positions `b * length + t` of
            the real tokens, in row-major order.
        tokens: the number of real tokens (scalar int32 tensor).

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
        self.mask = mask
        shape = ops.shape(mask)
        self.batch, self.length = shape[0], shape[1]
        self._real = ops.reshape(mask, (-1,))
        self.indices = ops.cast(ops.nonzero(self._real)[0], "int32")
        self.tokens = ops.shape(self.indices)[0]
        # Row of each padded position among the real tokens.
        self._slots = ops.cumsum(ops.cast(self._real, "int32")) - 1
        self._gathers = {}

    def _head_gathers(self, parts, heads):
        """Row indices between `(tokens, parts, heads)` and `(parts, batch,
        heads, length)` layouts.

        Returns `(to_padded, to_tokens)`: int32 `(parts * batch * heads *
        length,)` rows of the token layout, `tokens * parts * heads` (a zero
        row) at padding; and int32 `(tokens * parts * heads,)` rows of the
        padded layout.
        """
        key = (parts, heads)
        if key not in self._gathers:
            part = ops.arange(parts, dtype="int32")
            head = ops.arange(heads, dtype="int32")
            # (parts, batch, heads, length)
            slots = ops.reshape(self._slots, (1, self.batch, 1, self.length))
            real = ops.reshape(self._real, (1, self.batch, 1, self.length))
            rows = (slots * parts + part[:, None, None, None]) * heads
            rows = rows + head[None, None, :, None]
            to_padded = ops.where(real, rows, self.tokens * parts * heads)
            # (tokens, parts, heads)
            b, t = self.indices // self.length, self.indices % self.length
            base = b * heads * self.length + t
            to_tokens = (
                base[:, None, None]
                + part[None, :, None] * (self.batch * heads * self.length)
                + head[None, None, :] * self.length
            )
            self._gathers[key] = (
                ops.reshape(to_padded, (-1,)),
                ops.reshape(to_tokens, (-1,)),
            )
        return self._gathers[key]

    def unpad(self, x):
        """`(batch, length, ...)` -> `(tokens, ...)`, the real tokens only."""
        features = tuple(x.shape[2:])
        to_padded, to_tokens = self._head_gathers(1, 1)
        rows = ops.reshape(x, (-1, math.prod(features)))
        rows = gather_rows(rows, to_tokens, to_padded, zero_row=False)
        return ops.reshape(rows, (-1,) + features)

    def pad(self, x):
        """`(tokens, ...)` -> `(batch, length, ...)`, zeros at padding."""
        features = tuple(x.shape[1:])
        to_padded, to_tokens = self._head_gathers(1, 1)
        rows = ops.reshape(x, (-1, math.prod(features)))
        rows = gather_rows(rows, to_padded, to_tokens, zero_row=True)
        return ops.reshape(rows, (self.batch, self.length) + features)

    def pad_heads(self, x, num_heads, parts=1):
        """`(tokens, parts * num_heads * depth)` -> `parts` tensors `(batch,
        num_heads, length, depth)`, zeros at padding.

        The feature axis is read as `(parts, num_heads, depth)`, the layout
        of a fused Q/K/V projection (`parts=3`) or a K/V one (`parts=2`).
        """
        depth = x.shape[-1] // (parts * num_heads)
        to_padded, to_tokens = self._head_gathers(parts, num_heads)
        rows = ops.reshape(x, (-1, depth))
        if keras.backend.backend() == "tensorflow" and kernels.usable(rows, dtypes=kernels.GATHER_DTYPES):
            return self._fused_pad_heads(rows, to_padded, to_tokens, num_heads, parts)
        rows = gather_rows(rows, to_padded, to_tokens, zero_row=True)
        rows = ops.reshape(rows, (parts, self.batch, num_heads, self.length, depth))
        return ops.unstack(rows, axis=0)  # gradient: one stack

    def _fused_pad_heads(self, rows, to_padded, to_tokens, num_heads, parts):
        """`pad_heads` with the fused row gathers: the gradient gathers the
        token rows from the parts' gradients directly, with no stack."""
        import tensorflow as tf

        module = kernels.load()
        depth = rows.shape[-1]
        shape = (parts, self.batch, num_heads, self.length, depth)

        @tf.custom_gradient
        def pad(rows):
            padded = tf.reshape(module.kt_gather_rows(rows, to_padded), shape)
            pieces = tf.unstack(padded, num=parts, axis=0)

            def grad(*upstream):
                flat = [
                    tf.reshape(tf.zeros_like(p) if u is None else u, (-1, depth))
                    for p, u in zip(pieces, upstream)
                ]
                return module.kt_gather_rows_from_parts(flat, to_tokens)

            return pieces, grad

        return pad(rows)

    def unpad_heads(self, x):
        """`(batch, num_heads, length, depth)` -> `(tokens, num_heads * depth)`,
        the real tokens with their heads concatenated."""
        num_heads, depth = x.shape[1], x.shape[-1]
        to_padded, to_tokens = self._head_gathers(1, num_heads)
        rows = ops.reshape(x, (-1, depth))
        rows = gather_rows(rows, to_tokens, to_padded, zero_row=False)
        return ops.reshape(rows, (-1, num_heads * depth))


def _take_rows(rows, index, zero_row):
    if keras.backend.backend() == "tensorflow" and kernels.usable(rows, dtypes=kernels.GATHER_DTYPES):
        # One pass: the index `R` gives a zero row, with no copy of `rows`
        # to append one (the fused kernels of `keras_transformer.kernels`).
        return kernels.load().kt_gather_rows(rows, index)
    if zero_row:
        zeros = ops.zeros((1, rows.shape[1]), rows.dtype)
        rows = ops.concatenate([rows, zeros], axis=0)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.gather(rows, index)
    return ops.take(rows, index, axis=0)


def gather_rows(rows, index, inverse, zero_row):
    """`rows[index]` for a gather that moves every row once; its gradient is
    the gather back.

    Args:
        rows: `(R, F)` tensor.
        index: int32 `(S,)`, rows to take; with `zero_row`, the index `R`
            gives a row of zeros.
        inverse: int32 `(R,)`: where each row of `rows` went, so that the
            gradient is `dy[inverse]` (with a zero row at `S` when not
            `zero_row`: a row of `rows` that was not taken gets 0).
        zero_row: bool, whether `index` may point at the zero row `R`.

    Returns:
        `(S, F)` tensor.
    """
    if keras.backend.backend() != "tensorflow":
        return _take_rows(rows, index, zero_row)
    import tensorflow as tf

    @tf.custom_gradient
    def gather(x):
        def grad(upstream):
            return _take_rows(upstream, inverse, not zero_row)

        return _take_rows(x, index, zero_row), grad

    return gather(rows)
