"""One decoder block: causal self-attention, cross-attention, feed-forward."""

import warnings

import keras
from keras import ops

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.layer_normalization import layer_norm
from keras_transformer.layers.masks import causal_mask
from keras_transformer.layers.masks import key_padding_to_attention_mask
from keras_transformer.layers.masks import merge_masks
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.multi_head_attention import single_query_attention
from keras_transformer.layers.residual import make_layer_norm
from keras_transformer.layers.residual import residual
from keras_transformer.layers.transformer_block import TransformerBlock


def cached_step_masks(index, cache_length, encoder_outputs_mask=None, growing=False):
    """The masks of one cached decoding step, shared by all decoder layers.

    `TransformerDecoder` builds them itself from
    `self_attention_cache_update_index` and `encoder_outputs_mask`; a search
    that runs several layers a step builds them once and passes them as
    `cache_masks`. All are bool (no float that mixed precision would cast).

    Args:
        index: scalar int, position of the new token.
        cache_length: int, slots in the self-attention cache (unused when
            `growing`).
        encoder_outputs_mask: optional bool `(batch, source_length)`.
        growing: the caches hold positions `0..index - 1` only and the new
            key and value are appended (`decoding.growing_cache`): then
            `"slot"` and `"self"` are None.

    Returns:
        dict: `"slot"` bool `(length,)`, True at `index` (where the new key
        and value go); `"self"` bool `(length,)`, True for slots `<= index`
        (the causal mask); `"cross"` bool `(batch, 1, 1, source_length)` (or
        None) and `"keep"` bool `(batch, 1, 1, 1)` (or None), False for
        sources with no token at all.
    """
    masks = {"slot": None, "self": None, "cross": None, "keep": None}
    if not growing:
        positions = ops.arange(cache_length, dtype="int32")
        masks["slot"] = ops.equal(positions, index)
        masks["self"] = ops.less_equal(positions, index)
    if encoder_outputs_mask is not None:
        encoder_outputs_mask = ops.cast(encoder_outputs_mask, "bool")
        masks["cross"] = encoder_outputs_mask[:, None, None, :]
        masks["keep"] = ops.any(encoder_outputs_mask, axis=-1)[:, None, None, None]
    return masks


_BATCH_MESSAGE = (
    "TransformerDecoder: the decoder inputs and the encoder outputs must "
    "have the same batch size (one source per target sequence)"
)


def check_same_batch(inputs, encoder_outputs):
    """`inputs`, once its batch size is checked against the encoder's.

    Without the check, tensorflow broadcast a batch of 1 against the other
    in training and returned a wrong-sized output without an error.

    Raises:
        ValueError: when both batch sizes are known and differ.
        tf.errors.InvalidArgumentError: (tensorflow, in the graph) when
            they are known only at run time and differ.
    """
    target, source = inputs.shape[0], encoder_outputs.shape[0]
    if target is not None and source is not None:
        if target != source:
            raise ValueError(f"{_BATCH_MESSAGE}; got {target} and {source}.")
        return inputs
    if keras.backend.backend() != "tensorflow":
        return inputs
    import tensorflow as tf

    check = tf.debugging.assert_equal(
        tf.shape(inputs)[0], tf.shape(encoder_outputs)[0], message=_BATCH_MESSAGE
    )
    with tf.control_dependencies([check]):
        return tf.identity(inputs)


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
       query axis, so it works for any source and target lengths;
    3. the position-wise feed-forward net.

    Masks arrive as the Keras masks of `inputs` and `encoder_outputs` (set by
    `PositionalEmbedding` and carried by the encoder) or explicitly as
    `inputs_mask` and `encoder_outputs_mask`. The block's output carries the
    target mask on.

    For incremental decoding, the call takes a key/value cache as arguments,
    as KerasHub's `TransformerDecoder` does: with `self_attention_cache` and
    `self_attention_cache_update_index`, `inputs` is one new position, its
    key and value are written into the cache at that index, and the call
    returns the new cache beside the output. It gives the values of the
    uncached call on the whole prefix at that position.

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
        inputs: float tensor `(batch, target_length, d_model)`.
        encoder_outputs: float tensor `(batch, source_length, d_model)`.
        inputs_mask: optional bool `(batch, target_length)`.
        encoder_outputs_mask: optional bool `(batch, source_length)`.
        use_causal_mask: bool, default True.
        training: bool, enables dropout.
        return_attention_scores: bool, also return a dict with
            `"self_attention"` `(batch, heads, target_length, target_length)`
            and `"cross_attention"` `(batch, heads, target_length,
            source_length)` float32 weights (cached: the cross-attention
            weights `(batch, heads, source_length)` only).
        self_attention_cache: cached decoding: `(key (batch, heads, key_dim,
            cache_length), value (batch, heads, cache_length, key_dim))`, from
            `empty_cache` or the previous step (a growing cache,
            `decoding.growing_cache`, keeps keys `(batch, heads,
            cache_length, key_dim)`); `inputs` is then
            `(batch, 1, d_model)`, the embedded token at
            `self_attention_cache_update_index`. No dropout.
        self_attention_cache_update_index: scalar int, the new token's
            position (its cache slot).
        cross_attention_cache: `precompute_cross_attention_cache(
            encoder_outputs)`, computed once per source; computed from
            `encoder_outputs` if omitted.
        decoding_weights: optional `decoding_weights()`, the fused projection
            matrices; a decoding loop computes them once, outside the loop.
        cache_masks: optional `cached_step_masks(...)` of this step, shared by
            the layers of a step; built from the index and
            `encoder_outputs_mask` if omitted.
        beams_per_source: int (default 1), cached calls: rows of `inputs`
            per row of `cross_attention_cache` and `encoder_outputs_mask`.
            Beam search passes its beam size: row `b * beams_per_source +
            j` is hypothesis j of source b, and the beams of a source read
            its one cross-attention cache (no copy per hypothesis).

    Returns:
        float tensor `(batch, target_length, d_model)`; cached: the tuple
        `(outputs (batch, 1, d_model), self_attention_cache)`.

    Raises:
        ValueError: if `num_heads` does not divide `d_model`, `norm_first`
            is not a bool, if `encoder_outputs` (or, cached,
            `cross_attention_cache`) is
            missing, or for a cached call on more than one position or
            without `self_attention_cache_update_index`.

    Example:
    >>> import numpy as np
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
            drop = Dropout(
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
            activation_dropout_rate=self.activation_dropout_rate,
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
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        decoding_weights=None,
        cache_masks=None,
        beams_per_source=1,
    ):
        if self_attention_cache is not None:
            return self._call_with_cache(
                inputs, encoder_outputs, encoder_outputs_mask, self_attention_cache,
                self_attention_cache_update_index, cross_attention_cache,
                return_attention_scores, decoding_weights, cache_masks, int(beams_per_source),
            )
        if encoder_outputs is None:
            raise ValueError(
                "TransformerDecoder needs `encoder_outputs`, the output of the "
                "encoder stack, shape (batch, source_length, d_model)."
            )
        inputs = check_same_batch(inputs, encoder_outputs)
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
    # One new target position per call, against a fixed-size key/value
    # cache. The caches keep keys transposed, `(batch, heads, key_dim,
    # length)`, and values as `(batch, heads, length, value_dim)`, so each
    # attention is two plain batched matmuls with no transposes in the loop.
    # A growing cache (tensorflow without XLA) appends a position a step,
    # which on the transposed layout copies a few floats per key_dim row:
    # it keeps keys as `(batch, heads, length, key_dim)` instead.

    def empty_cache(self, batch_size, length, dtype=None):
        """Zero self-attention caches for `length` positions.

        Returns:
            `(key (batch, heads, key_dim, length), value (batch, heads,
            length, key_dim))` in `dtype` (default: the compute dtype).
        """
        dtype = dtype or self.compute_dtype
        heads, key_dim = self.num_heads, self.key_dim
        return (
            ops.zeros((batch_size, heads, key_dim, length), dtype),
            ops.zeros((batch_size, heads, length, key_dim), dtype),
        )

    def grow_cache(self, cache, length):
        """A fixed-size self-attention cache (`empty_cache`'s layout) padded
        with zero slots at the end to `length` slots."""
        key, value = cache
        missing = length - key.shape[-1]
        return (
            ops.pad(key, [(0, 0), (0, 0), (0, 0), (0, missing)]),
            ops.pad(value, [(0, 0), (0, 0), (0, missing), (0, 0)]),
        )

    def precompute_cross_attention_cache(self, encoder_outputs):
        """Keys and values of the cross-attention, computed once per source.

        Args:
            encoder_outputs: float `(batch, source_length, d_model)`.

        Returns:
            `(key (batch, heads, key_dim, source_length), value (batch,
            heads, source_length, key_dim))`.
        """
        key, value = self.cross_attention.project_key_value(encoder_outputs)
        return ops.transpose(key, (0, 2, 3, 1)), ops.transpose(value, (0, 2, 1, 3))

    def decoding_weights(self):
        """The projection matrices of a cached call, built once per search.

        Self-attention Q, K and V as one fused matrix, cross-attention Q,
        the query parts pre-scaled by `1 / sqrt(key_dim)` (see
        `MultiHeadAttention.fused_projection_weights`), the feed-forward
        matrices and the LayerNorm `gamma` and `beta`, read once. Compute
        them outside the decoding loop and pass them to every cached call
        as `decoding_weights`.
        """
        def norm(layer):
            return (ops.cast(layer.gamma, "float32"), ops.cast(layer.beta, "float32"))

        return {
            "self": self.self_attention.fused_projection_weights(),
            "cross": self.cross_attention.fused_projection_weights(include_key_value=False),
            "feedforward": self.feedforward.decoding_weights(),
            "norms": {
                "self": norm(self.self_attention_layer_norm),
                "cross": norm(self.cross_attention_layer_norm),
                "feedforward": norm(self.feedforward_layer_norm),
            },
        }

    def call_cached(self, inputs, self_key_cache, self_value_cache, index, cross_key,
                    cross_value, encoder_mask=None, return_attention_scores=False,
                    weights=None, masks=None):
        """Deprecated: call the layer with `self_attention_cache=(key, value)`,
        `self_attention_cache_update_index=index` and
        `cross_attention_cache=(cross_key, cross_value)`.

        Returns:
            `(outputs, self_key_cache, self_value_cache)`, plus the
            cross-attention weights if asked for.
        """
        warnings.warn(
            "TransformerDecoder.call_cached is deprecated; call the layer with "
            "self_attention_cache=, self_attention_cache_update_index= and "
            "cross_attention_cache=.", DeprecationWarning, stacklevel=2,
        )
        outputs = self(
            inputs, encoder_outputs_mask=encoder_mask,
            self_attention_cache=(self_key_cache, self_value_cache),
            self_attention_cache_update_index=index,
            cross_attention_cache=(cross_key, cross_value),
            return_attention_scores=return_attention_scores,
            decoding_weights=weights, cache_masks=masks,
        )
        return (outputs[0], *outputs[1], *outputs[2:])

    def _call_with_cache(self, inputs, encoder_outputs, encoder_outputs_mask, self_cache, index,
                         cross_cache, return_attention_scores, weights, masks, beams=1):
        """One new target position against the caches (see the class
        docstring); no dropout."""
        if index is None:
            raise ValueError(
                "A cached TransformerDecoder call needs `self_attention_cache_update_index`, "
                "the position of the new token (0 for the first)."
            )
        if inputs.shape[1] is not None and inputs.shape[1] != 1:
            raise ValueError(
                "A cached TransformerDecoder call decodes one position: `inputs` must be "
                f"(batch, 1, d_model); got {tuple(inputs.shape)}. Call without "
                "`self_attention_cache` for a whole sequence."
            )
        if cross_cache is None:
            if encoder_outputs is None:
                raise ValueError(
                    "A cached TransformerDecoder call needs `cross_attention_cache` "
                    "(from `precompute_cross_attention_cache`) or `encoder_outputs`."
                )
            cross_cache = self.precompute_cross_attention_cache(encoder_outputs)
        self_key_cache, self_value_cache = self_cache
        cross_key, cross_value = cross_cache
        weights = weights or self.decoding_weights()
        heads, key_dim = self.num_heads, self.key_dim
        if masks is None:
            masks = cached_step_masks(index, ops.shape(self_key_cache)[-1], encoder_outputs_mask)
        slot = masks["slot"]
        caches = {}
        # Reshapes name no dynamic batch size (-1 instead): each would cost
        # a `Shape`, a slice and a `Pack` in a TensorFlow graph, every step.

        def self_attend(x):
            projected = self.self_attention.step_projection(x, weights["self"])
            query, key, value = ops.split(projected, 3, axis=-1)
            value = ops.cast(ops.reshape(value, (-1, heads, 1, key_dim)), self_value_cache.dtype)
            if slot is None:  # a growing cache, keys `(batch, heads, length, key_dim)`: append
                key = ops.cast(ops.reshape(key, (-1, heads, 1, key_dim)), self_key_cache.dtype)
                caches["key"] = ops.concatenate([self_key_cache, key], axis=2)
                caches["value"] = ops.concatenate([self_value_cache, value], axis=2)
            else:  # a fixed-size cache, keys transposed: write the slot at `index`
                key = ops.cast(ops.reshape(key, (-1, heads, key_dim, 1)), self_key_cache.dtype)
                caches["key"] = ops.where(ops.reshape(slot, (1, 1, 1, -1)), key, self_key_cache)
                caches["value"] = ops.where(ops.reshape(slot, (1, 1, -1, 1)), value, self_value_cache)
            attended, _ = single_query_attention(
                ops.reshape(query, (-1, heads, 1, key_dim)),
                caches["key"],
                caches["value"],
                masks["self"],
                keys_transposed=slot is not None,
            )
            return self.self_attention.step_output(attended, weights["self"])

        def cross_attend(x):
            query = self.cross_attention.step_projection(x, weights["cross"], include_key_value=False)
            if beams == 1:
                query = ops.reshape(query, (-1, heads, 1, key_dim))
            else:  # the beams of a source as its queries: (sources, heads, beams, key_dim)
                query = ops.transpose(ops.reshape(query, (-1, beams, heads, key_dim)), (0, 2, 1, 3))
            attended, attention = single_query_attention(
                query, cross_key, cross_value, masks["cross"], masks["keep"]
            )
            if beams > 1:  # back to a row per hypothesis
                attended = ops.reshape(ops.transpose(attended, (0, 2, 1, 3)), (-1, heads, 1, key_dim))
                if return_attention_scores:
                    attention = ops.transpose(attention, (0, 2, 1, 3))
                    attention = ops.reshape(attention, (-1, heads, 1, ops.shape(attention)[-1]))
            return self.cross_attention.step_output(attended, weights["cross"]), attention

        def norm(name, layer):
            gamma, beta = weights["norms"][name]
            return lambda x: layer_norm(x, gamma, beta, layer.epsilon)

        # One position per row: work on (batch, d_model), no length axis.
        x, _ = residual(
            ops.reshape(inputs, (-1, inputs.shape[-1] or self.d_model)),  # a static width for LayerNorm
            self_attend,
            norm("self", self.self_attention_layer_norm),
            self.self_attention_dropout,
            self.norm_first,
            False,
        )
        x, (attention,) = residual(
            x,
            cross_attend,
            norm("cross", self.cross_attention_layer_norm),
            self.cross_attention_dropout,
            self.norm_first,
            False,
        )
        x, _ = residual(
            x,
            lambda x: self.feedforward.step(x, weights["feedforward"]),
            norm("feedforward", self.feedforward_layer_norm),
            self.feedforward_dropout,
            self.norm_first,
            False,
        )
        outputs = (ops.expand_dims(x, 1), (caches["key"], caches["value"]))
        if return_attention_scores:
            outputs += (attention[:, :, 0, :],)
        return outputs

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None):
        return tuple(inputs_shape)

    def compute_output_spec(self, inputs, encoder_outputs=None, inputs_mask=None,
                            encoder_outputs_mask=None, use_causal_mask=True, training=None,
                            return_attention_scores=False, self_attention_cache=None, **kwargs):
        if self_attention_cache is not None:
            raise ValueError(
                "TransformerDecoder's cached call (one decoding step) takes tensors, not "
                "keras.Input: call it inside the search (`keras_transformer.decoding`)."
            )
        if encoder_outputs is None:
            raise ValueError(
                "TransformerDecoder needs `encoder_outputs`, the output of the "
                "encoder stack, shape (batch, source_length, d_model)."
            )
        output = keras.KerasTensor(tuple(inputs.shape), dtype=self.compute_dtype)
        if not return_attention_scores:
            return output
        batch, length, source_length = inputs.shape[0], inputs.shape[1], encoder_outputs.shape[1]
        return output, {
            "self_attention": keras.KerasTensor((batch, self.num_heads, length, length), dtype="float32"),
            "cross_attention": keras.KerasTensor((batch, self.num_heads, length, source_length),
                                                 dtype="float32"),
        }
