"""Layer normalization (Ba et al., 2016) with a hand-written gradient on TensorFlow."""

import keras
from keras import ops


def _tf_layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis with its gradient written out.

    Forward: `x_hat = (x - mean) / sqrt(var + epsilon)`, `y = x_hat * gamma
    + beta`. Backward, with `g = dy * gamma`: `dx = (g - mean(g) - x_hat *
    mean(g * x_hat)) / sqrt(var + epsilon)`, `dgamma = sum(dy * x_hat)`,
    `dbeta = sum(dy)` over all but the last axis. TensorFlow's autodiff of
    the same forward pass runs about twice the ops.

    Args:
        x: float32 `(..., d)`.
        gamma, beta: float32 `(d,)`.
        epsilon: python float.

    Returns:
        float32 `(..., d)`.
    """
    import tensorflow as tf

    @tf.custom_gradient
    def layer_norm(x, gamma, beta):
        mean = tf.reduce_mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True)
        inverse_std = tf.math.rsqrt(variance + epsilon)
        x_hat = centered * inverse_std

        def grad(dy):
            scaled = dy * gamma
            mean_scaled = tf.reduce_mean(scaled, axis=-1, keepdims=True)
            mean_projected = tf.reduce_mean(scaled * x_hat, axis=-1, keepdims=True)
            dx = inverse_std * (scaled - mean_scaled - x_hat * mean_projected)
            depth = tf.shape(dy)[-1]
            dgamma = tf.reduce_sum(tf.reshape(dy * x_hat, (-1, depth)), axis=0)
            dbeta = tf.reduce_sum(tf.reshape(dy, (-1, depth)), axis=0)
            return dx, dgamma, dbeta

        return x_hat * gamma + beta, grad

    return layer_norm(x, gamma, beta)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization`, faster to train on TensorFlow.

    The same layer (arguments, variables `gamma` and `beta`, config, values
    to float rounding); normalizing over the last axis with both `center`
    and `scale` on the tensorflow backend, it runs `_tf_layer_norm`, whose
    gradient is written out rather than derived op by op. Every other case
    is the Keras layer's own `call`. As in Keras, the arithmetic is float32
    whatever the compute dtype.

    Call arguments:
        inputs: float tensor `(..., d)`.

    Returns:
        A tensor of the shape of `inputs` in the layer's compute dtype.

    References:
        Ba, Kiros and Hinton (2016), "Layer Normalization"; Vaswani et al.
        (2017), section 3.1.
    """

    def _fast_path(self, inputs):
        axis = list(self.axis) if isinstance(self.axis, (list, tuple)) else [self.axis]
        last = axis in ([-1], [len(inputs.shape) - 1])
        return (
            keras.backend.backend() == "tensorflow"
            and last
            and self.center
            and self.scale
            and not self.rms_scaling
        )

    def call(self, inputs):
        if not self._fast_path(inputs):
            return super().call(inputs)
        outputs = _tf_layer_norm(
            ops.cast(inputs, "float32"),
            ops.cast(self.gamma, "float32"),
            ops.cast(self.beta, "float32"),
            float(self.epsilon),
        )
        return ops.cast(outputs, self.compute_dtype)
