"""One encoder block: self-attention and feed-forward (section 3.1)."""

import keras

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import key_padding_to_attention_mask
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.residual import make_layer_norm
from keras_transformer.layers.residual import residual
from keras_transformer.layers.transformer_block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerEncoder(TransformerBlock):
    """Transformer encoder block: self-attention, then a feed-forward net.

    Each of the two sub-layers sits in a residual connection with dropout and
    layer normalization, post-LN as in the paper or pre-LN with
    `norm_first=True`. Self-attention is masked by the padding of the
    sequence: the mask arrives as the Keras mask of `inputs` (set by
    `PositionalEmbedding`) or as `mask`, is broadcast along the query axis
   , and is passed on as this block's output mask.

    Args:
        num_heads: int, attention heads; must divide `d_model`.
        dff: int, inner width of the feed-forward net.
        dropout_rate: float, dropout on every sub-layer output.
        attention_dropout_rate: float, dropout on attention weights;
            defaults to `dropout_rate`.
        activation_dropout_rate: float, dropout on the feed-forward inner
            activation (`FeedForward`); default 0.
        activation: feed-forward activation, default `"relu"`.
        layer_norm_epsilon: float, LayerNormalization epsilon.
        norm_first: bool, pre-LN instead of the paper's post-LN.
        kernel_initializer: initializer of all kernels.
            An initializer with a fixed `seed` gives each kernel of one shape
            the same values, as in Keras's own layers (W^Q = W^K = W^V):
            for reproducible weights, leave it unseeded and call
            `keras.utils.set_random_seed`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: float tensor `(batch, length, d_model)`.
        mask: optional bool `(batch, length)`, `True` at real tokens;
            filled in from the Keras mask of `inputs`.
        training: bool, enables dropout.
        return_attention_scores: bool, also return the self-attention
            weights `(batch, num_heads, length, length)`.

    Returns:
        float tensor `(batch, length, d_model)` with the input's Keras mask.

    Raises:
        ValueError: if `num_heads` does not divide `d_model`, or
            `norm_first` is not a bool.

    Example:
    >>> import numpy as np
    >>> block = TransformerEncoder(num_heads=2, dff=32)
    >>> tuple(block(np.ones((2, 5, 16), "float32")).shape)
    (2, 5, 16)

    References:
        Vaswani et al. (2017), section 3.1 and figure 1 (left).
    """

    def build(self, input_shape):
        self._check_d_model(input_shape[-1])
        d_model = self.d_model
        dtype = self.dtype_policy
        self.self_attention = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=d_model // self.num_heads,
            dropout_rate=self.attention_dropout_rate,
            kernel_initializer=self.kernel_initializer,
            dtype=dtype,
            name="self_attention",
        )
        self.self_attention.build(input_shape, input_shape)
        self.self_attention_layer_norm = make_layer_norm(
            self.layer_norm_epsilon, dtype, "self_attention_layer_norm"
        )
        self.self_attention_layer_norm.build(input_shape)
        self.self_attention_dropout = Dropout(
            self.dropout_rate, dtype=dtype, name="self_attention_dropout"
        )
        self.feedforward = FeedForward(
            self.dff,
            activation=self.activation,
            activation_dropout_rate=self.activation_dropout_rate,
            kernel_initializer=self.kernel_initializer,
            dtype=dtype,
            name="feedforward",
        )
        self.feedforward.build(input_shape)
        self.feedforward_layer_norm = make_layer_norm(
            self.layer_norm_epsilon, dtype, "feedforward_layer_norm"
        )
        self.feedforward_layer_norm.build(input_shape)
        self.feedforward_dropout = Dropout(
            self.dropout_rate, dtype=dtype, name="feedforward_dropout"
        )
        self.built = True

    def compute_output_spec(self, inputs, mask=None, training=None, return_attention_scores=False):
        output = keras.KerasTensor(tuple(inputs.shape), dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        batch, length = inputs.shape[0], inputs.shape[1]
        return output, keras.KerasTensor((batch, self.num_heads, length, length), dtype="float32")

    def call(self, inputs, mask=None, training=None, return_attention_scores=False):
        attention_mask = key_padding_to_attention_mask(mask)

        def attend(x):
            return self.self_attention(
                x,
                x,
                attention_mask=attention_mask,
                return_attention_scores=True,
                training=training,
            )

        x, (weights,) = residual(
            inputs,
            attend,
            self.self_attention_layer_norm,
            self.self_attention_dropout,
            self.norm_first,
            training,
        )
        x, _ = residual(
            x,
            self.feedforward,
            self.feedforward_layer_norm,
            self.feedforward_dropout,
            self.norm_first,
            training,
        )
        if return_attention_scores:
            return x, weights
        return x
