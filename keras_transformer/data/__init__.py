"""Data: text files, packing, the tf.data pipeline and a synthetic corpus."""

from keras_transformer.data.packing import pack_sequence
from keras_transformer.data.packing import pack_source
from keras_transformer.data.packing import pack_target
from keras_transformer.data.pipeline import auto_bucket_boundaries
from keras_transformer.data.pipeline import batch_examples
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.pipeline import padding_share
from keras_transformer.data.pipeline import read_pairs
from keras_transformer.data.pipeline import resolve_bucket_boundaries
from keras_transformer.data.pipeline import tokenize_pairs
from keras_transformer.data.synthetic import make_synthetic_corpus
from keras_transformer.data.synthetic import write_synthetic_corpus
from keras_transformer.data.text_files import read_lines
from keras_transformer.data.text_files import read_parallel
from keras_transformer.data.text_files import text_line_dataset

__all__ = [
    "auto_bucket_boundaries",
    "batch_examples",
    "make_dataset",
    "make_synthetic_corpus",
    "pack_sequence",
    "pack_source",
    "pack_target",
    "padding_share",
    "read_lines",
    "read_pairs",
    "read_parallel",
    "resolve_bucket_boundaries",
    "text_line_dataset",
    "tokenize_pairs",
    "write_synthetic_corpus",
]
