"""Subword tokenization (SentencePiece, in-graph via tensorflow_text)."""

from keras_transformer.tokenizers.subword_tokenizer import END_ID
from keras_transformer.tokenizers.subword_tokenizer import END_PIECE
from keras_transformer.tokenizers.subword_tokenizer import PAD_ID
from keras_transformer.tokenizers.subword_tokenizer import PAD_PIECE
from keras_transformer.tokenizers.subword_tokenizer import START_ID
from keras_transformer.tokenizers.subword_tokenizer import START_PIECE
from keras_transformer.tokenizers.subword_tokenizer import UNK_ID
from keras_transformer.tokenizers.subword_tokenizer import UNK_PIECE
from keras_transformer.tokenizers.subword_tokenizer import SubwordTokenizer
from keras_transformer.tokenizers.trainer import train_subword_tokenizer

__all__ = [
    "END_ID",
    "END_PIECE",
    "PAD_ID",
    "PAD_PIECE",
    "START_ID",
    "START_PIECE",
    "UNK_ID",
    "UNK_PIECE",
    "SubwordTokenizer",
    "train_subword_tokenizer",
]
