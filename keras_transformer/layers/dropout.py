"""Dropout (Srivastava et al., 2014) with cheaper random numbers on TensorFlow."""

import keras
from keras import ops

from keras_transformer import kernels

# Each random uint32 gives the keep decisions of two elements, one per
# 16-bit half: half the random numbers of a float per element.
_LEVELS = 1 << 16
# Rates whose rounding to a multiple of 2^-16 moves them by under 0.2%.
_FAST_RATES = (1.0 / 256, 255.0 / 256)


def _tf_dropout(inputs, rate, seed):
    """`inputs` with each element zeroed with probability `rate` (rounded
    to a multiple of 2^-16) and the rest scaled to keep the expectation.

    An element is dropped when its 16-bit random number is below
    `threshold = round(rate * 2^16)`, so it is dropped with probability
    `p = threshold / 2^16` (0.1000061 for `rate=0.1`), and kept elements
    are multiplied by `1 / (1 - p)`: `E[output] = inputs` exactly. The
    gradient is the same mask times the upstream gradient.

    Args:
        inputs: float tensor, any shape.
        rate: python float in [2^-8, 1 - 2^-8] (`_FAST_RATES`).
        seed: int32 `(2,)` tensor, the stateless seed.

    Returns:
        A tensor of the shape and dtype of `inputs`.
    """
    import tensorflow as tf

    threshold = int(round(rate * _LEVELS))
    size = tf.size(inputs)
    bits = tf.random.stateless_uniform(
        [(size + 1) // 2], seed=seed, minval=None, maxval=None, dtype=tf.uint32
    )
    halves = tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size]
    keep = tf.reshape(halves >= threshold, tf.shape(inputs))
    scale = tf.constant(_LEVELS / (_LEVELS - threshold), inputs.dtype)
    # One pass to a float mask, one multiply (forward and backward alike).
    return inputs * tf.where(keep, scale, tf.zeros((), inputs.dtype))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout`, with half the random numbers on TensorFlow.

    The same layer (arguments, config, no variables). In training on the
    tensorflow backend without `noise_shape`, it draws one random uint32
    per two elements and drops an element when its 16-bit half is below
    `round(rate * 2^16)` (`_tf_dropout`): the drop probability is `rate`
    rounded to a multiple of 2^-16 (0.1000061 for 0.1) and kept elements
    are scaled so that the expectation is unchanged; it runs fewer ops
    than Keras's dropout (`benchmarks/training.py` measures both). Where the fused kernels are
    built (`keras_transformer.kernels`), float32 training outside XLA runs
    `kernels.fused_dropout` instead: one pass, forward and backward, with
    the mask from a counter hash. Every other case (other backends,
    `noise_shape`, rates below 2^-8 or above 1 - 2^-8, where the rounding
    would matter) is the Keras layer's own `call`.

    Call arguments:
        inputs: float tensor, any shape.
        training: bool, dropout only in training.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    References:
        Srivastava et al. (2014), "Dropout"; Vaswani et al. (2017),
        section 5.4 (residual dropout, P_drop = 0.1).
    """

    def fast_path(self, training):
        """Whether `call` runs `_tf_dropout` (or the fused kernel) rather
        than Keras's dropout."""
        return (
            keras.backend.backend() == "tensorflow"
            and training is True
            and _FAST_RATES[0] <= self.rate <= _FAST_RATES[1]
            and self.noise_shape is None
        )

    def next_seed(self):
        """An int32 `(2,)` seed from the layer's SeedGenerator, whose state
        advances each call (as Keras's TensorFlow backend does)."""
        import tensorflow as tf

        seed = self.seed_generator.next()
        return tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)

    def call(self, inputs, training=False):
        if not self.fast_path(training):
            return super().call(inputs, training=training)
        seed = self.next_seed()
        if kernels.usable(inputs):
            return kernels.fused_dropout(inputs, float(self.rate), seed)
        if keras.backend.standardize_dtype(inputs.dtype) == "bfloat16" and kernels.usable():
            # mixed_bfloat16: the float32 kernel between casts (same mask).
            dropped = kernels.fused_dropout(ops.cast(inputs, "float32"), float(self.rate), seed)
            return ops.cast(dropped, inputs.dtype)
        return _tf_dropout(inputs, float(self.rate), seed)
