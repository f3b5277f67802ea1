"""Layer normalization (Ba et al., 2016): Keras's layer, under this package's name."""

import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization`, registered as
    `keras_transformer>LayerNormalization`.

    The same layer (arguments, variables `gamma` and `beta`, config,
    values): models saved by earlier versions of this package name this
    class, so it stays to load them. As in Keras, the arithmetic is float32
    whatever the compute dtype.

    Call arguments:
        inputs: float tensor `(..., d)`.

    Returns:
        A tensor of the shape of `inputs` in the layer's compute dtype.

    Example:
    >>> import numpy as np
    >>> layer = LayerNormalization(epsilon=1e-6)
    >>> y = layer(np.array([[1.0, 2.0, 3.0]], "float32"))
    >>> [round(float(v), 3) for v in np.asarray(y)[0]]
    [-1.225, 0.0, 1.225]

    References:
        Ba, Kiros and Hinton (2016), "Layer Normalization"; Vaswani et al.
        (2017), section 3.1.
    """


def layer_norm(inputs, gamma, beta, epsilon):
    """`LayerNormalization`'s values on the last axis, its `gamma` and
    `beta` given as tensors (read once, outside a decoding loop).

    `y = (x - mean) / sqrt(var + epsilon) * gamma + beta` over the last
    axis, in float32, returned in the dtype of `inputs`. On tensorflow it
    is written out in 10 graph ops with Keras's float operations in Keras's
    order (`inv = rsqrt(var + epsilon) * gamma`, `y = x * inv + (beta -
    mean * inv)`), so the values are bit-identical to the layer's, which
    takes 16 ops in a graph (two variable reads, two reshapes, a
    `StopGradient`, a negation); elsewhere it is
    `keras.ops.layer_normalization`, the layer's own function.

    Args:
        inputs: float tensor `(..., d)`.
        gamma, beta: float `(d,)`.
        epsilon: python float.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Example:
    >>> import numpy as np
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> x = np.array([[1.0, 2.0, 4.0]], "float32")
    >>> y = layer_norm(x, np.ones(3, "float32"), np.zeros(3, "float32"), 1e-6)
    >>> bool(np.array_equal(np.asarray(y), np.asarray(norm(x))))
    True

    References:
        Ba, Kiros and Hinton (2016), "Layer Normalization".
    """
    if keras.backend.backend() != "tensorflow":
        return keras.ops.layer_normalization(inputs, gamma, beta, axis=-1, epsilon=epsilon)
    import tensorflow as tf

    dtype = inputs.dtype
    x = tf.cast(inputs, tf.float32)
    mean = tf.reduce_mean(x, axis=-1, keepdims=True)
    variance = tf.reduce_mean(tf.math.squared_difference(x, mean), axis=-1, keepdims=True)
    inverse = tf.math.rsqrt(variance + epsilon) * tf.cast(gamma, tf.float32)
    return tf.cast(x * inverse + (tf.cast(beta, tf.float32) - mean * inverse), dtype)
