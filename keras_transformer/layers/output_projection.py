"""The pre-softmax linear transformation (section 3.4)."""

import keras

from keras_transformer.layers.unpadding import Unpadding
from keras_transformer.layers.unpadding import attach_unpadded


def vocabulary_logits(project, inputs, mask=None, training=None):
    """float32 logits `project(inputs)`, on the real rows only in training.

    The one implementation of the pre-softmax linear transformation's
    output, shared by `OutputProjection` and by a tied embedding
    (`PositionalEmbedding(..., reverse=True)`, section 3.4).

    Args:
        project: callable mapping `(..., d_model)` to `(..., vocab_size)`.
        inputs: float tensor `(batch, length, d_model)`.
        mask: optional bool `(batch, length)`, the Keras mask of `inputs`.
        training: bool. In training with a mask, the logits of padded
            positions are not computed (they are 0), where the backend allows
            data-dependent shapes (`Unpadding`); the logits then carry the
            real rows along (`unpadding.attach_unpadded`).

    Returns:
        float32 tensor `(batch, length, vocab_size)`.
    """
    unpadding = Unpadding.create(mask, training)
    if unpadding is None:
        return keras.ops.cast(project(inputs), "float32")
    logits = keras.ops.cast(project(unpadding.unpad(inputs)), "float32")
    return attach_unpadded(unpadding.pad(logits), logits, unpadding)


@keras.saving.register_keras_serializable(package="keras_transformer")
class OutputProjection(keras.layers.Dense):
    """Linear map from `d_model` to vocabulary logits, ending the Keras mask.

    A `Dense` layer that computes in the layer's policy but, by default,
    returns float32 logits (so the softmax and the loss stay in float32
    under mixed precision) and attaches no Keras mask to them: the masked
    loss and accuracy find padding from the labels, and a mask on the logits
    would make Keras weight the loss a second time.

    Args:
        vocab_size: int, number of output classes.
        **kwargs: `keras.layers.Dense` arguments other than `units`.

    Call arguments:
        inputs: float tensor `(batch, length, d_model)`.
        mask: optional bool `(batch, length)` (the Keras mask of `inputs`).
        training: bool. In training with a mask, the logits of padded
            positions are not computed (they are 0), where the backend allows
            data-dependent shapes (`Unpadding`). The logits then carry the
            real rows along (`unpadding.attach_unpadded`), which the masked
            loss and accuracy use directly.

    Returns:
        float32 tensor `(batch, length, vocab_size)` of logits.
    """

    def __init__(self, vocab_size, **kwargs):
        kwargs.pop("units", None)
        super().__init__(units=int(vocab_size), **kwargs)
        self.vocab_size = int(vocab_size)

    def call(self, inputs, mask=None, training=None):
        return vocabulary_logits(super().call, inputs, mask, training)

    def output_weights(self):
        """`(kernel (d_model, vocab_size), bias (vocab_size,) or None)` in
        the compute dtype, for step-by-step decoding."""
        dtype = self.compute_dtype
        bias = keras.ops.cast(self.bias, dtype) if self.use_bias else None
        return keras.ops.cast(self.kernel, dtype), bias

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.pop("units", None)
        config["vocab_size"] = self.vocab_size
        return config
