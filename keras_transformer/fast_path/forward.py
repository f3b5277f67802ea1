"""The Transformer's training forward pass on the real tokens only.

The same function as calling a `build_transformer` model with
`training=True`, computed from the same layers and weights, with the
position-wise work (projections, feed-forward nets, residual adds, dropout,
LayerNorm, the output projection) on the `(tokens, d_model)` matrix of the
real tokens (`Unpadding`); only attention runs on the padded `(batch,
heads, length, depth)` layout. Its element-wise steps are `fast_path.ops`.
"""

from keras import ops

from keras_transformer.fast_path import ops as fast_ops
from keras_transformer.fast_path.unpadding import Unpadding
from keras_transformer.layers.masks import causal_mask
from keras_transformer.layers.masks import key_padding_to_attention_mask
from keras_transformer.layers.masks import merge_masks
from keras_transformer.layers.transformer_decoder import check_same_batch
from keras_transformer.models.transformer import Transformer


def _matmul(x, kernel, bias):
    x = ops.matmul(x, kernel)
    return x if bias is None else x + bias


def _heads_mask(mask):
    """A `(batch, query, key)`-broadcastable bool mask with a heads axis."""
    return None if mask is None else ops.expand_dims(ops.cast(mask, "bool"), 1)


def self_attention(layer, x, unpadding, mask):
    """`layer(x, x, attention_mask=mask, training=True)` on real tokens.

    Args:
        layer: a `MultiHeadAttention`.
        x: `(tokens, d_model)`, the real tokens of `unpadding`.
        unpadding: the `Unpadding` of the sequence.
        mask: bool, broadcastable to `(batch, length, length)`.

    Returns:
        `(tokens, output_dim)`.
    """
    heads = layer.num_heads
    if layer.key_dim == layer.value_dim:
        kernel, bias = layer.input_projection(("query", "key", "value"), scale_query=True)
        q, k, v = unpadding.pad_heads(_matmul(x, kernel, bias), heads, parts=3)
    else:
        q, k, v = (
            unpadding.pad_heads(_matmul(x, *layer.input_projection((part,), scale_query=True)),
                                heads)[0]
            for part in ("query", "key", "value")
        )
    attended = fast_ops.attention(q, k, v, _heads_mask(mask), layer.attention_dropout)
    return _matmul(unpadding.unpad_heads(attended), *layer.output_projection())


def cross_attention(layer, x, unpadding, memory, memory_unpadding, mask):
    """`layer(x, memory, attention_mask=mask, training=True)` on real tokens.

    Args:
        layer: a `MultiHeadAttention`.
        x: `(tokens, d_model)`, the real target tokens of `unpadding`.
        memory: `(source_tokens, d_model)`, the real tokens of the encoder
            output, of `memory_unpadding`.
        mask: bool, broadcastable to `(batch, target_length,
            source_length)`.

    Returns:
        `(tokens, output_dim)`.
    """
    heads = layer.num_heads
    kernel, bias = layer.input_projection(("query",), scale_query=True)
    (q,) = unpadding.pad_heads(_matmul(x, kernel, bias), heads)
    if layer.key_dim == layer.value_dim:
        kernel, bias = layer.input_projection(("key", "value"), scale_query=False)
        k, v = memory_unpadding.pad_heads(_matmul(memory, kernel, bias), heads, parts=2)
    else:
        k, v = (
            memory_unpadding.pad_heads(
                _matmul(memory, *layer.input_projection((part,), scale_query=False)), heads
            )[0]
            for part in ("key", "value")
        )
    attended = fast_ops.attention(q, k, v, _heads_mask(mask), layer.attention_dropout)
    return _matmul(unpadding.unpad_heads(attended), *layer.output_projection())


def feedforward(layer, x):
    """`layer(x, training=True)` for a `FeedForward` layer."""
    hidden = layer.intermediate_dense(x)
    if layer.activation_dropout is not None:
        hidden = fast_ops.dropout(hidden, layer.activation_dropout)
    return layer.output_dense(hidden)


def _residual(block, sublayer_name, x, sublayer):
    """`fast_ops.residual` around one of `block`'s sub-layers, with the
    block's LayerNorm and dropout of that sub-layer (`<name>_layer_norm`,
    `<name>_dropout`)."""
    return fast_ops.residual(
        x,
        sublayer,
        getattr(block, f"{sublayer_name}_layer_norm"),
        getattr(block, f"{sublayer_name}_dropout"),
        block.norm_first,
    )


def encoder_block(block, x, unpadding, mask):
    """A `TransformerEncoder` block on the real tokens `(tokens, d_model)`."""
    x = _residual(block, "self_attention", x,
                  lambda h: self_attention(block.self_attention, h, unpadding, mask))
    return _residual(block, "feedforward", x, lambda h: feedforward(block.feedforward, h))


def decoder_block(block, y, unpadding, self_mask, memory, memory_unpadding, cross_mask):
    """A `TransformerDecoder` block on the real target tokens."""
    y = _residual(block, "self_attention", y,
                  lambda h: self_attention(block.self_attention, h, unpadding, self_mask))
    y = _residual(block, "cross_attention", y, lambda h: cross_attention(
        block.cross_attention, h, unpadding, memory, memory_unpadding, cross_mask))
    return _residual(block, "feedforward", y, lambda h: feedforward(block.feedforward, h))


class TrainingForward:
    """The training forward pass of a `Transformer`.

    Args:
        model: a `Transformer` (from `build_transformer`); its layers are
            read through its attributes.

    Call arguments:
        source_ids: int `(batch, source_length)`.
        target_ids: int `(batch, target_length)`, the decoder inputs.

    Returns:
        `(logits, unpadding)`: float32 logits `(tokens, vocab_size)` of the
        real (non-padding) decoder inputs, in row-major order, and the
        target `Unpadding`, whose `pad` puts them back in `(batch,
        target_length, vocab_size)` with zeros at padding.

    Raises:
        ValueError: for a model that is not a `Transformer`.
    """

    def __init__(self, model):
        if not isinstance(model, Transformer):
            raise ValueError(
                f"The training fast path runs a keras_transformer Transformer (from "
                f"build_transformer); got {type(model).__name__} {getattr(model, 'name', '')!r}. "
                "A model saved by an earlier version converts with "
                "keras_transformer.as_transformer(model)."
            )
        self.layers = model
        self.pad_id = self.layers.decoder_embedding.pad_id or 0

    def _embed(self, embedding, dropout, ids, unpadding):
        x = unpadding.unpad(embedding(ids))
        return x if dropout is None else fast_ops.dropout(x, dropout)

    def __call__(self, source_ids, target_ids):
        layers = self.layers
        source_ids = ops.convert_to_tensor(source_ids)
        target_ids = check_same_batch(ops.convert_to_tensor(target_ids), source_ids)
        source_mask = ops.not_equal(source_ids, layers.encoder_embedding.pad_id or 0)
        target_mask = ops.not_equal(target_ids, self.pad_id)
        source, target = Unpadding(source_mask), Unpadding(target_mask)

        x = self._embed(layers.encoder_embedding, layers.encoder_embedding_dropout,
                        source_ids, source)
        encoder_mask = key_padding_to_attention_mask(source_mask)
        for block in layers.encoder_layers:
            x = encoder_block(block, x, source, encoder_mask)
        if layers.encoder_final_norm is not None:
            x = fast_ops.layer_norm(x, layers.encoder_final_norm)

        y = self._embed(layers.decoder_embedding, layers.decoder_embedding_dropout,
                        target_ids, target)
        self_mask = merge_masks(
            key_padding_to_attention_mask(target_mask), causal_mask(ops.shape(target_ids)[1])
        )
        for block in layers.decoder_layers:
            y = decoder_block(block, y, target, self_mask, x, source, encoder_mask)
        if layers.decoder_final_norm is not None:
            y = fast_ops.layer_norm(y, layers.decoder_final_norm)
        if layers.logits_layer is layers.decoder_embedding:  # tied (section 3.4)
            logits = layers.decoder_embedding(y, reverse=True)
        else:
            logits = layers.logits_layer(y)
        return ops.cast(logits, "float32"), target
