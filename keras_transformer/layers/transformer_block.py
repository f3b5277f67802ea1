"""What the encoder and decoder blocks share: arguments, config, masks."""

import keras

from keras_transformer.validation import check_bool
from keras_transformer.validation import check_count
from keras_transformer.validation import check_positive
from keras_transformer.validation import check_rate


class TransformerBlock(keras.layers.Layer):
    """Base of `TransformerEncoder` and `TransformerDecoder`.

    Holds the hyper-parameters both blocks take (see their docstrings), their
    config, the check that `num_heads` divides `d_model`, and passes the
    Keras mask of the block's first input on unchanged.
    """

    def __init__(
        self,
        *,
        num_heads,
        dff,
        dropout_rate=0.1,
        attention_dropout_rate=None,
        activation_dropout_rate=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        norm_first=False,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_count(num_heads, "num_heads")
        self.dff = check_count(dff, "dff")
        self.dropout_rate = check_rate(dropout_rate, "dropout_rate")
        self.attention_dropout_rate = (
            self.dropout_rate
            if attention_dropout_rate is None
            else check_rate(attention_dropout_rate, "attention_dropout_rate")
        )
        self.activation_dropout_rate = check_rate(activation_dropout_rate, "activation_dropout_rate")
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = check_positive(layer_norm_epsilon, "layer_norm_epsilon")
        self.norm_first = check_bool(norm_first, "norm_first")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def _check_d_model(self, d_model):
        if d_model % self.num_heads:
            raise ValueError(
                f"{type(self).__name__}: num_heads={self.num_heads} must divide "
                f"d_model={d_model}; pick num_heads among the divisors of d_model."
            )
        self.d_model = d_model
        # Built for this width: a later call with another says so (Keras's
        # input check) rather than failing inside a matrix product.
        self.input_spec = keras.InputSpec(axes={-1: d_model})
        self.key_dim = d_model // self.num_heads

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "dff": self.dff,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "activation_dropout_rate": self.activation_dropout_rate,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "norm_first": self.norm_first,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
