"""Access to the pieces of a built Transformer for step-by-step decoding."""

from keras import ops

from keras_transformer.decoding.growing_cache import empty_growing_cache
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.transformer_decoder import cached_step_masks
from keras_transformer.models.transformer import TransformerLayers


class TransformerParts:
    """The layers of a `build_transformer` model, wired for decoding.

    Reads the layers through `TransformerLayers`, runs the encoder once per
    source, and runs the decoder one token at a time against a key/value
    cache: self-attention keys and values are written into a fixed-size
    cache per layer, cross-attention keys and values are computed once per
    source. Everything uses `keras.ops`, so it works on every backend.

    Args:
        model: a model from `build_transformer` (or loaded from `.keras`).
        pad_id: int, padding id of the source.
        growing_cache: bool, self-attention caches that grow by one position
            a step instead of fixed-size ones (tensorflow backend without XLA
            only; see `keras_transformer.decoding.growing_cache`).

    Raises:
        ValueError: if `model` lacks the expected layers.
    """

    def __init__(self, model, pad_id=0, growing_cache=False):
        layers = TransformerLayers(model)
        self.encoder_embedding = layers.encoder_embedding
        self.decoder_embedding = layers.decoder_embedding
        self.logits_layer = layers.logits_layer
        self.encoder_layers = layers.encoder_layers
        self.decoder_layers = layers.decoder_layers
        self.encoder_final_norm = layers.encoder_final_norm
        self.decoder_final_norm = layers.decoder_final_norm
        self.model = model
        self.pad_id = pad_id
        self.growing_cache = bool(growing_cache)
        self.target_sequence_length = self.decoder_embedding.sequence_length
        self.source_sequence_length = self.encoder_embedding.sequence_length
        self.vocab_size = self.logits_layer.vocab_size
        first = self.decoder_layers[0]
        self.num_heads = first.num_heads
        self.key_dim = first.key_dim

    def encode(self, source_ids):
        """Encoder stack. Returns `(outputs (batch, S, d_model), mask (batch, S))`."""
        mask = padding_mask(source_ids, self.pad_id)
        x = self.encoder_embedding(source_ids)
        for layer in self.encoder_layers:
            x = layer(x, mask=mask)
        if self.encoder_final_norm is not None:
            x = self.encoder_final_norm(x)
        return x, mask

    def cross_caches(self, encoder_outputs):
        """Per decoder layer `(key (batch, heads, key_dim, S), value (batch,
        heads, S, key_dim))`."""
        return [layer.precompute_cross_attention_cache(encoder_outputs) for layer in self.decoder_layers]

    def empty_self_caches(self, batch_size, length, dtype):
        """Per decoder layer zero `(key (batch, heads, key_dim, length), value
        (batch, heads, length, key_dim))` caches."""
        if self.growing_cache:
            return [
                empty_growing_cache(batch_size, self.num_heads, self.key_dim, dtype)
                for _ in self.decoder_layers
            ]
        return [layer.empty_cache(batch_size, length, dtype) for layer in self.decoder_layers]

    def decoding_weights(self):
        """Per decoder layer `decoding_weights()`, plus the output projection.

        Build them once, before the decoding loop, and pass them to every
        `decode_step`.
        """
        return {
            "layers": [layer.decoding_weights() for layer in self.decoder_layers],
            "logits": self.logits_layer.output_weights(),
        }

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_outputs_mask,
                    return_attention_scores=False, weights=None):
        """One decoder position with the cache.

        Args:
            token_ids: int `(batch,)`, the tokens at position `index`, in
                `[0, vocab_size)` (not checked here: see `check_id_range`).
            index: scalar int, their position.
            self_caches: list of `(key, value)` from `empty_self_caches`.
            cross_caches: list of `(key, value)` from `cross_caches`.
            encoder_outputs_mask: bool `(batch, S)`.
            weights: `decoding_weights()`; computed here if omitted.

        Returns:
            `(logits (batch, vocab) float32, new self_caches)`, plus the last
            layer's cross-attention weights `(batch, heads, S)` if asked.
        """
        weights = weights or self.decoding_weights()
        masks = cached_step_masks(
            index, ops.shape(self_caches[0][0])[-1], encoder_outputs_mask, growing=self.growing_cache
        )
        # The ids are the search's own outputs (and its start id, checked
        # once by the search): no range check on this per-step path.
        x = self.decoder_embedding(
            ops.expand_dims(token_ids, 1), start_index=index, check_ids=False
        )
        new_caches = []
        attention = None
        for layer, layer_weights, self_cache, cross_cache in zip(
            self.decoder_layers, weights["layers"], self_caches, cross_caches
        ):
            outputs = layer(
                x,
                encoder_outputs_mask=encoder_outputs_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
                return_attention_scores=return_attention_scores,
                decoding_weights=layer_weights,
                cache_masks=masks,
            )
            x = outputs[0]
            if return_attention_scores:
                attention = outputs[2]
            new_caches.append(outputs[1])
        x = x[:, 0, :]
        if self.decoder_final_norm is not None:
            x = self.decoder_final_norm(x)
        kernel, bias = weights["logits"]
        logits = ops.matmul(x, kernel)
        logits = ops.cast(logits if bias is None else logits + bias, "float32")
        if return_attention_scores:
            return logits, new_caches, attention
        return logits, new_caches

    def decode_uncached(self, source_ids, target_ids):
        """The full model on a whole prefix: logits `(batch, T, vocab)`."""
        return self.model(
            {"encoder_inputs": source_ids, "decoder_inputs": target_ids}, training=False
        )
