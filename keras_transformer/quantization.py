"""int8 weight storage for exported SavedModels.

Every float matrix of the model (kernels and embedding tables) is stored as
int8 with a float32 scale per output channel (symmetric, absmax:
`w ~ q * scale`, `q = round(w / scale)` in [-127, 127], `scale =
max|w| / 127` over the reduced axis). A served call first rebuilds the
float32 matrices from them (one multiply each, before decoding starts) and
runs the same graph as the float32 export inside a `keras.StatelessScope`
that maps each Keras variable to its rebuilt value; biases and LayerNorm
parameters stay float32. The SavedModel is about a quarter of the float32
one, uses core TensorFlow ops only (`Cast`, `Mul`), and computes in float32.

Reduced axis: the input axis (0) of a kernel, so each output unit has its
own scale; the width axis (-1) of an embedding table, so each token's row
has its own (a tied table is also the output projection, whose output
units are its rows).
"""

import keras
import numpy as np
import tensorflow as tf


def quantize_int8(weights, axis):
    """`(q int8, scale float32)` with `weights ~ q * scale`, the scale
    reduced over `axis` (kept as size 1) and `q` in [-127, 127].

    >>> import numpy as np
    >>> q, scale = quantize_int8(np.array([[0.5, -2.0], [0.25, 1.0]], "float32"), axis=0)
    >>> q.tolist(), scale.ravel().tolist()
    ([[127, -127], [64, 64]], [0.003937007859349251, 0.015748031437397003])
    """
    weights = np.asarray(weights, np.float32)
    scale = np.max(np.abs(weights), axis=axis, keepdims=True) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    q = np.clip(np.round(weights / scale), -127, 127).astype(np.int8)
    return q, scale


def _reduced_axis(variable):
    return -1 if variable.path.endswith("embeddings") else 0


class Int8Weights(tf.Module):
    """The int8 copies of a model's float matrices, and the scope that
    serves the model from them.

    Args:
        model: a built Keras model (float32 variables).

    Attributes:
        quantized: list of `(keras_variable, q tf.Variable int8, scale
            tf.Variable float32)`.
    """

    def __init__(self, model, name="int8_weights"):
        super().__init__(name=name)
        self.quantized = []
        seen = set()
        for variable in model.weights:
            if id(variable) in seen or len(variable.shape) < 2 or "float" not in str(variable.dtype):
                continue
            seen.add(id(variable))
            q, scale = quantize_int8(keras.ops.convert_to_numpy(variable.value), _reduced_axis(variable))
            stem = variable.path.replace("/", "__")
            self.quantized.append((
                variable,
                tf.Variable(q, trainable=False, name=f"{stem}__int8"),
                tf.Variable(scale, trainable=False, name=f"{stem}__scale"),
            ))
        self._int8_variables = [v for _, q, s in self.quantized for v in (q, s)]

    def scope(self):
        """A `keras.StatelessScope` in which the model's matrices read as
        their int8 copies times the scales (float32 tensors)."""
        return keras.StatelessScope(state_mapping=[
            (variable, tf.cast(q, tf.float32) * scale) for variable, q, scale in self.quantized
        ])

    def size_bytes(self):
        """Bytes of the int8 matrices and their scales."""
        return sum(int(np.prod(q.shape)) + 4 * int(np.prod(s.shape)) for _, q, s in self.quantized)
