"""keras-transformer: the Transformer of "Attention Is All You Need" for Keras 3.

Layers work on the tensorflow, jax and torch backends; tokenization, the
`tf.data` pipeline, the string `Translator` and SavedModel export use
TensorFlow.
"""

from keras_transformer.decoding import TransformerParts
from keras_transformer.decoding import beam_search
from keras_transformer.decoding import greedy_search
from keras_transformer.layers import FeedForward
from keras_transformer.layers import MultiHeadAttention
from keras_transformer.layers import OutputProjection
from keras_transformer.layers import PositionalEmbedding
from keras_transformer.layers import TransformerDecoder
from keras_transformer.layers import TransformerEncoder
from keras_transformer.layers import causal_mask
from keras_transformer.layers import padding_mask
from keras_transformer.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.losses import masked_loss
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.metrics import masked_accuracy
from keras_transformer.models import PRESETS
from keras_transformer.models import build_from_preset
from keras_transformer.models import build_transformer
from keras_transformer.optimizers import Adam
from keras_transformer.schedules import WarmupSchedule

__version__ = "0.1.0"


def __getattr__(name):
    # TensorFlow-only parts load lazily, so `import keras_transformer` stays
    # backend-neutral (jax and torch users need not import tensorflow-text).
    if name == "Translator":
        from keras_transformer.translator import Translator

        return Translator
    if name == "export_translator":
        from keras_transformer.export import export_translator

        return export_translator
    if name in ("SubwordTokenizer", "train_subword_tokenizer"):
        from keras_transformer import tokenizers

        return getattr(tokenizers, name)
    if name in ("load_translator", "SavedModelTranslator"):
        from keras_transformer import loading

        return getattr(loading, name)
    if name == "load_run":
        from keras_transformer.training import load_run

        return load_run
    if name == "make_dataset":
        from keras_transformer.data import make_dataset

        return make_dataset
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
