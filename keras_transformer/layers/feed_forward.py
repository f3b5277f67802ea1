"""Position-wise feed-forward network (section 3.3)."""

import keras


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2`, applied at every position.

    Args:
        dff: int, inner width (2048 in the paper's base model).
        activation: activation of the inner layer, default `"relu"`.
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: float tensor `(batch, length, d_model)`.

    Returns:
        float tensor `(batch, length, d_model)`.

    References:
        Vaswani et al. (2017), section 3.3, equation (2).
    """

    def __init__(
        self, dff, activation="relu", kernel_initializer="glorot_uniform", **kwargs
    ):
        super().__init__(**kwargs)
        if int(dff) <= 0:
            raise ValueError(f"FeedForward needs a positive `dff`; got {dff}.")
        self.dff = int(dff)
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
        self.built = True

    def call(self, inputs):
        return self.output_dense(self.intermediate_dense(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "dff": self.dff,
                "activation": keras.activations.serialize(self.activation),
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
