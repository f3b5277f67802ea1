"""Position-wise feed-forward network (section 3.3)."""

import keras

from keras_transformer.layers.dropout import Dropout
from keras_transformer.validation import check_count


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2`, applied at every position.

    Args:
        dff: int, inner width (2048 in the paper's base model).
        activation: activation of the inner layer, default `"relu"`.
        activation_dropout_rate: float in [0, 1), dropout on the inner
            activation `max(0, x W1 + b1)` in training (fairseq's
            `activation_dropout`; the paper has none: 0).
        kernel_initializer: initializer of both kernels.
            An initializer with a fixed `seed` gives each kernel of one shape
            the same values, as in Keras's own layers (W^Q = W^K = W^V):
            for reproducible weights, leave it unseeded and call
            `keras.utils.set_random_seed`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: float tensor `(batch, length, d_model)`.
        training: bool, whether the activation dropout is applied.

    Returns:
        float tensor `(batch, length, d_model)`.

    Raises:
        ValueError: for a `dff` below 1 or a rate outside [0, 1).

    Example:
    >>> import numpy as np
    >>> layer = FeedForward(dff=32, activation_dropout_rate=0.1)
    >>> tuple(layer(np.zeros((2, 3, 8), "float32")).shape)
    (2, 3, 8)

    References:
        Vaswani et al. (2017), section 3.3, equation (2).
    """

    def __init__(
        self,
        dff,
        activation="relu",
        kernel_initializer="glorot_uniform",
        activation_dropout_rate=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count(dff, "dff")
        if not 0.0 <= float(activation_dropout_rate) < 1.0:
            raise ValueError(
                "FeedForward needs an `activation_dropout_rate` in [0, 1); "
                f"got {activation_dropout_rate!r}."
            )
        self.dff = int(dff)
        self.activation_dropout_rate = float(activation_dropout_rate)
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        init = self.kernel_initializer
        self.intermediate_dense = keras.layers.Dense(
            self.dff,
            activation=self.activation,
            kernel_initializer=init.__class__.from_config(init.get_config()),
            dtype=self.dtype_policy,
            name="feedforward_intermediate_dense",
        )
        self.intermediate_dense.build(input_shape)
        self.output_dense = keras.layers.Dense(
            input_shape[-1],
            kernel_initializer=init.__class__.from_config(init.get_config()),
            dtype=self.dtype_policy,
            name="feedforward_output_dense",
        )
        self.output_dense.build(tuple(input_shape[:-1]) + (self.dff,))
        self.activation_dropout = None
        if self.activation_dropout_rate > 0:
            self.activation_dropout = Dropout(
                self.activation_dropout_rate, dtype=self.dtype_policy,
                name="feedforward_activation_dropout",
            )
        self.built = True

    def call(self, inputs, training=None):
        hidden = self.intermediate_dense(inputs)
        if self.activation_dropout is not None:
            hidden = self.activation_dropout(hidden, training=training)
        return self.output_dense(hidden)

    def decoding_weights(self):
        """`((kernel (d_model, dff), bias (dff,)), (kernel (dff, d_model),
        bias (d_model,)))` in the compute dtype, for `step`: read them once,
        outside a decoding loop. None for quantized or LoRA `Dense` layers,
        which `step` then calls."""
        denses = (self.intermediate_dense, self.output_dense)
        if any(dense.quantization_mode is not None or dense.lora_enabled for dense in denses):
            return None
        dtype = self.compute_dtype
        return tuple((keras.ops.cast(dense.kernel, dtype), keras.ops.cast(dense.bias, dtype)) for dense in denses)

    def step(self, inputs, weights=None):
        """`call` without dropout on `(rows, d_model)`, with
        `decoding_weights()`: the same values (`Dense` is `x W + b`, then
        the activation), no variable read in the loop; the layer's own call
        when `weights` is None."""
        if weights is None:
            return self(inputs)
        (kernel_1, bias_1), (kernel_2, bias_2) = weights
        hidden = self.activation(keras.ops.matmul(inputs, kernel_1) + bias_1)
        return keras.ops.matmul(hidden, kernel_2) + bias_2

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "dff": self.dff,
                "activation": keras.activations.serialize(self.activation),
                "activation_dropout_rate": self.activation_dropout_rate,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
