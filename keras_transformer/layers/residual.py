"""The residual connection around every sub-layer (section 3.1 and 5.4)."""

import keras
from keras import ops

from keras_transformer import kernels
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.layer_normalization import LayerNormalization


def make_layer_norm(epsilon, dtype, name):
    """A LayerNormalization over the last axis, as every block uses."""
    return LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)


def _fusable(inputs, result, norm, dropout, training):
    """Whether the post-LN `norm(inputs + dropout(result))` can run as one
    fused kernel (`kernels.fused_residual_layer_norm`): training on
    TensorFlow outside XLA, float32 throughout (or bfloat16 throughout, cast
    to float32 for the kernel and back), this package's LayerNorm on its
    fast path and its Dropout at rate 0 or on its fast path."""
    if training is not True or not isinstance(norm, LayerNormalization):
        return False
    if not isinstance(dropout, Dropout) or (dropout.rate and not dropout.fast_path(training)):
        return False
    if not norm._fast_path(inputs) or tuple(inputs.shape) != tuple(result.shape):
        return False
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in (inputs, result)}
    dtypes.add(norm.compute_dtype)
    # bfloat16 (mixed_bfloat16) runs the float32 kernel between casts.
    return dtypes in ({"float32"}, {"bfloat16"}) and kernels.usable()


def residual(inputs, sublayer, norm, dropout, norm_first, training=None):
    """Wrap `sublayer` in dropout, a residual add and layer normalization.

    Post-LN, the paper's arrangement (section 3.1): `LayerNorm(x +
    Dropout(Sublayer(x)))`. Pre-LN (`norm_first=True`, Xiong et al., 2020):
    `x + Dropout(Sublayer(LayerNorm(x)))`, which trains without warm-up
    trouble in deep stacks; the stack then needs one final LayerNorm.

    In post-LN training on TensorFlow, the dropout, add and LayerNorm run as
    one fused kernel where it is built (`keras_transformer.kernels`).

    Args:
        inputs: float tensor `(batch, length, d_model)`.
        sublayer: callable mapping a `(batch, length, d_model)` tensor to one
            of the same shape, or to a tuple whose first item is that tensor
            (the rest is passed back, e.g. attention weights).
        norm: the `LayerNormalization` layer.
        dropout: the `Dropout` layer on the sub-layer output (section 5.4).
        norm_first: bool, pre-LN instead of post-LN.

    Returns:
        `(outputs, extras)`: the block output and whatever else `sublayer`
        returned (a tuple, possibly empty).
    """
    result = sublayer(norm(inputs) if norm_first else inputs)
    extras = ()
    if isinstance(result, tuple):
        result, extras = result[0], result[1:]
    if not norm_first and _fusable(inputs, result, norm, dropout, training):
        seed = dropout.next_seed() if dropout.rate else ops.zeros((2,), "int32")
        outputs = kernels.fused_residual_layer_norm(
            ops.cast(inputs, "float32"),
            ops.cast(result, "float32"),
            ops.convert_to_tensor(norm.gamma),
            ops.convert_to_tensor(norm.beta),
            float(dropout.rate),
            seed,
            float(norm.epsilon),
        )
        return ops.cast(outputs, norm.compute_dtype), extras
    outputs = ops.add(inputs, dropout(result, training=training))
    if not norm_first:
        outputs = norm(outputs)
    return outputs, extras
