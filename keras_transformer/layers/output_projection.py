"""The pre-softmax linear transformation (section 3.4)."""

import keras



def vocabulary_logits(project, inputs):
    """float32 logits `project(inputs)`.

    The one implementation of the pre-softmax linear transformation's
    output, shared by `OutputProjection` and by a tied embedding
    (`PositionalEmbedding(..., reverse=True)`, section 3.4).

    Args:
        project: callable mapping `(..., d_model)` to `(..., vocab_size)`.
        inputs: float tensor `(batch, length, d_model)`.

    Returns:
        float32 tensor `(batch, length, vocab_size)`.
    """
    return keras.ops.cast(project(inputs), "float32")


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

    Returns:
        float32 tensor `(batch, length, vocab_size)` of logits.
    """

    def __init__(self, vocab_size, **kwargs):
        kwargs.pop("units", None)
        super().__init__(units=int(vocab_size), **kwargs)
        self.vocab_size = int(vocab_size)

    def call(self, inputs):
        return vocabulary_logits(super().call, inputs)

    def output_weights(self):
        """`(kernel (d_model, vocab_size), bias (vocab_size,) or None)` in
        the compute dtype, for step-by-step decoding."""
        dtype = self.compute_dtype
        bias = keras.ops.cast(self.bias, dtype) if self.use_bias else None
        return keras.ops.cast(self.kernel, dtype), bias

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.pop("units", None)
        config["vocab_size"] = self.vocab_size
        return config
