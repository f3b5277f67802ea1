"""Transformer layers, written with `keras.ops` for every Keras backend."""

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.layer_normalization import LayerNormalization
from keras_transformer.layers.masks import causal_mask
from keras_transformer.layers.masks import merge_masks
from keras_transformer.layers.masks import padding_mask
from keras_transformer.layers.multi_head_attention import MultiHeadAttention
from keras_transformer.layers.output_projection import OutputProjection
from keras_transformer.layers.multi_head_attention import masked_softmax
from keras_transformer.layers.multi_head_attention import (
    scaled_dot_product_attention,
)
from keras_transformer.layers.positional_embedding import PositionalEmbedding
from keras_transformer.layers.positional_embedding import embedding_lookup
from keras_transformer.layers.positional_embedding import sinusoidal_encoding
from keras_transformer.layers.transformer_decoder import TransformerDecoder
from keras_transformer.layers.transformer_encoder import TransformerEncoder
