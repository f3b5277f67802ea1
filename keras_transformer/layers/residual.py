"""The residual connection around every sub-layer (section 3.1 and 5.4)."""

from keras import ops

from keras_transformer.layers.layer_normalization import LayerNormalization


def make_layer_norm(epsilon, dtype, name):
    """A LayerNormalization over the last axis, as every block uses."""
    return LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)


def residual(inputs, sublayer, norm, dropout, norm_first, training=None):
    """Wrap `sublayer` in dropout, a residual add and layer normalization.

    Post-LN, the paper's arrangement (section 3.1): `LayerNorm(x +
    Dropout(Sublayer(x)))`. Pre-LN (`norm_first=True`, Xiong et al., 2020):
    `x + Dropout(Sublayer(LayerNorm(x)))`, which trains without warm-up
    trouble in deep stacks; the stack then needs one final LayerNorm.

    Args:
        inputs: float tensor `(batch, length, d_model)`.
        sublayer: callable mapping a `(batch, length, d_model)` tensor to one
            of the same shape, or to a tuple whose first item is that tensor
            (the rest is passed back, e.g. attention weights).
        norm: the `LayerNormalization` layer.
        dropout: the `Dropout` layer on the sub-layer output (section 5.4).
        norm_first: bool, pre-LN instead of post-LN.
        training: bool, enables the dropout.

    Returns:
        `(outputs, extras)`: the block output and whatever else `sublayer`
        returned (a tuple, possibly empty).
    """
    result = sublayer(norm(inputs) if norm_first else inputs)
    extras = ()
    if isinstance(result, tuple):
        result, extras = result[0], result[1:]
    outputs = ops.add(inputs, dropout(result, training=training))
    if not norm_first:
        outputs = norm(outputs)
    return outputs, extras
