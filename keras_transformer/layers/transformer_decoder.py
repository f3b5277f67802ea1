"""One decoder block: causal self-attention, cross-attention, feed-forward."""

import keras
from keras import ops

from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import causal_mask
from keras_transformer.layers.masks import key_padding_to_attention_mask
from keras_transformer.layers.masks import merge_masks
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.residual import make_layer_norm
from keras_transformer.layers.residual import residual
from keras_transformer.layers.transformer_block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerDecoder(TransformerBlock):
    """Transformer decoder block (section 3.1, figure 1 right).

    Three sub-layers, each in a residual connection with dropout and layer
    normalization (post-LN as in the paper, pre-LN with `norm_first=True`):

    1. masked self-attention: the causal mask lets position `i` see only
       positions `<= i` (section 3.2.3), combined with the padding of the
       target;
    2. cross-attention ("encoder-decoder attention") over the encoder
       output, masked by the padding of the *source* and broadcast along the
       query axis, so it works for any source and target lengths (C01);
    3. the position-wise feed-forward net.

    Masks arrive as the Keras masks of `inputs` and `encoder_outputs` (set by
    `PositionalEmbedding` and carried by the encoder) or explicitly as
    `inputs_mask` and `encoder_outputs_mask`. The block's output carries the
    target mask on (C05).

    For incremental decoding, `call_cached` runs one new position against a
    fixed-size key/value cache; it gives the same values as `call` on the
    whole prefix.

    Args:
        num_heads: int, attention heads; must divide `d_model`.
        dff: int, inner width of the feed-forward net.
        dropout_rate: float, dropout on every sub-layer output.
        attention_dropout_rate: float, dropout on attention weights;
            defaults to `dropout_rate`.
        activation: feed-forward activation, default `"relu"`.
        layer_norm_epsilon: float, LayerNormalization epsilon.
        norm_first: bool, pre-LN instead of the paper's post-LN.
        kernel_initializer: initializer of all kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: float tensor `(batch, target_length, d_model)`.
        encoder_outputs: float tensor `(batch, source_length, d_model)`.
        inputs_mask: optional bool `(batch, target_length)`.
        encoder_outputs_mask: optional bool `(batch, source_length)`.
        use_causal_mask: bool, default True.
        training: bool, enables dropout.
        return_attention_scores: bool, also return a dict with
            `"self_attention"` `(batch, heads, target_length, target_length)`
            and `"cross_attention"` `(batch, heads, target_length,
            source_length)` float32 weights.

    Returns:
        float tensor `(batch, target_length, d_model)`.

    Raises:
        ValueError: if `num_heads` does not divide `d_model`, or
            `encoder_outputs` is missing.

    Example:
    >>> block = TransformerDecoder(num_heads=2, dff=32)
    >>> y = block(np.ones((2, 7, 16), "float32"), np.ones((2, 5, 16), "float32"))
    >>> tuple(y.shape)
    (2, 7, 16)

    References:
        Vaswani et al. (2017), sections 3.1, 3.2.3.
    """

    def build(self, inputs_shape, encoder_outputs_shape=None):
        self._check_d_model(inputs_shape[-1])
        if encoder_outputs_shape is None:
            encoder_outputs_shape = inputs_shape
        dtype = self.dtype_policy

        def attention(name):
            return MultiHeadAttention(
                num_heads=self.num_heads,
                key_dim=self.key_dim,
                dropout_rate=self.attention_dropout_rate,
                kernel_initializer=self.kernel_initializer,
                dtype=dtype,
                name=name,
            )

        def norm_and_dropout(prefix):
            norm = make_layer_norm(
                self.layer_norm_epsilon, dtype, f"{prefix}_layer_norm"
            )
            norm.build(inputs_shape)
            drop = keras.layers.Dropout(
                self.dropout_rate, dtype=dtype, name=f"{prefix}_dropout"
            )
            return norm, drop

        self.self_attention = attention("self_attention")
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_layer_norm, self.self_attention_dropout = (
            norm_and_dropout("self_attention")
        )
        self.cross_attention = attention("cross_attention")
        self.cross_attention.build(inputs_shape, encoder_outputs_shape)
        self.cross_attention_layer_norm, self.cross_attention_dropout = (
            norm_and_dropout("cross_attention")
        )
        self.feedforward = FeedForward(
            self.dff,
            activation=self.activation,
            kernel_initializer=self.kernel_initializer,
            dtype=dtype,
            name="feedforward",
        )
        self.feedforward.build(inputs_shape)
        self.feedforward_layer_norm, self.feedforward_dropout = norm_and_dropout(
            "feedforward"
        )
        self.built = True

    def _cross_and_feedforward(
        self, x, cross_attend, training, weights
    ):
        x, (weights["cross_attention"],) = residual(
            x,
            cross_attend,
            self.cross_attention_layer_norm,
            self.cross_attention_dropout,
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
        return x

    def call(
        self,
        inputs,
        encoder_outputs=None,
        inputs_mask=None,
        encoder_outputs_mask=None,
        use_causal_mask=True,
        training=None,
        return_attention_scores=False,
    ):
        if encoder_outputs is None:
            raise ValueError(
                "TransformerDecoder needs `encoder_outputs`, the output of the "
                "encoder stack, shape (batch, source_length, d_model)."
            )
        target_length = ops.shape(inputs)[1]
        self_mask = merge_masks(
            key_padding_to_attention_mask(inputs_mask),
            causal_mask(target_length) if use_causal_mask else None,
        )
        cross_mask = key_padding_to_attention_mask(encoder_outputs_mask)
        weights = {}

        def self_attend(x):
            return self.self_attention(
                x,
                x,
                attention_mask=self_mask,
                return_attention_scores=True,
                training=training,
            )

        def cross_attend(x):
            return self.cross_attention(
                x,
                encoder_outputs,
                attention_mask=cross_mask,
                return_attention_scores=True,
                training=training,
            )

        x, (weights["self_attention"],) = residual(
            inputs,
            self_attend,
            self.self_attention_layer_norm,
            self.self_attention_dropout,
            self.norm_first,
            training,
        )
        x = self._cross_and_feedforward(x, cross_attend, training, weights)
        if return_attention_scores:
            return x, weights
        return x

    # -- incremental decoding ------------------------------------------------
    def precompute_cross_attention_cache(self, encoder_outputs):
        """Keys and values of the cross-attention, computed once per source.

        Args:
            encoder_outputs: float `(batch, source_length, d_model)`.

        Returns:
            `(key, value)`, each `(batch, source_length, num_heads, key_dim)`.
        """
        return self.cross_attention.project_key_value(encoder_outputs)

    def call_cached(
        self,
        inputs,
        self_key_cache,
        self_value_cache,
        index,
        cross_key,
        cross_value,
        encoder_mask=None,
        return_attention_scores=False,
    ):
        """Run one new target position against a key/value cache.

        The new position's key and value are written into the fixed-size
        self-attention cache at `index`; the query attends to cache slots
        `0..index` only. Cross-attention uses keys and values from
        `precompute_cross_attention_cache`. No dropout (inference only).

        Args:
            inputs: float `(batch, 1, d_model)`, the embedded new token.
            self_key_cache: `(batch, max_length, num_heads, key_dim)`.
            self_value_cache: `(batch, max_length, num_heads, key_dim)`.
            index: scalar int, the position of the new token.
            cross_key: `(batch, source_length, num_heads, key_dim)`.
            cross_value: `(batch, source_length, num_heads, key_dim)`.
            encoder_mask: optional bool `(batch, source_length)`.
            return_attention_scores: bool, also return the cross-attention
                weights `(batch, num_heads, 1, source_length)`.

        Returns:
            `(outputs (batch, 1, d_model), self_key_cache, self_value_cache)`,
            plus the cross-attention weights if asked for.
        """
        cache_length = ops.shape(self_key_cache)[1]
        self_mask = causal_mask(1, cache_length, offset=index)
        cross_mask = key_padding_to_attention_mask(encoder_mask)
        start = [0, index, 0, 0]
        caches = {}

        def self_attend(x):
            query = self.self_attention.project_query(x)
            key, value = self.self_attention.project_key_value(x)
            caches["key"] = ops.slice_update(
                self_key_cache, start, ops.cast(key, self_key_cache.dtype)
            )
            caches["value"] = ops.slice_update(
                self_value_cache, start, ops.cast(value, self_value_cache.dtype)
            )
            return self.self_attention.attend(
                query, caches["key"], caches["value"], mask=self_mask
            )

        def cross_attend(x):
            query = self.cross_attention.project_query(x)
            return self.cross_attention.attend(
                query, cross_key, cross_value, mask=cross_mask
            )

        weights = {}
        x, _ = residual(
            inputs,
            self_attend,
            self.self_attention_layer_norm,
            self.self_attention_dropout,
            self.norm_first,
            False,
        )
        x = self._cross_and_feedforward(x, cross_attend, False, weights)
        outputs = (x, caches["key"], caches["value"])
        if return_attention_scores:
            outputs += (weights["cross_attention"],)
        return outputs

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)
