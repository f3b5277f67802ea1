"""keras-transformer: the Transformer of "Attention Is All You Need" for Keras 3.

Layers work on the tensorflow, jax and torch backends; tokenization, the
`tf.data` pipeline, the string `Translator` and SavedModel export use
TensorFlow.
"""

import importlib
import os
import sys

__version__ = "0.1.0"

# Public names and the modules that define them. The backend-neutral ones are
# imported with the package (which also registers the layers for
# `keras.saving.load_model`); the TensorFlow-only ones on first use, so
# `import keras_transformer` stays backend-neutral (jax and torch users need
# not import tensorflow-text).
_NEUTRAL = {
    "TransformerParts": "keras_transformer.decoding",
    "beam_search": "keras_transformer.decoding",
    "greedy_search": "keras_transformer.decoding",
    "FeedForward": "keras_transformer.layers",
    "MultiHeadAttention": "keras_transformer.layers",
    "OutputProjection": "keras_transformer.layers",
    "PositionalEmbedding": "keras_transformer.layers",
    "TransformerDecoder": "keras_transformer.layers",
    "TransformerEncoder": "keras_transformer.layers",
    "causal_mask": "keras_transformer.layers",
    "padding_mask": "keras_transformer.layers",
    "MaskedSparseCategoricalCrossentropy": "keras_transformer.losses",
    "masked_loss": "keras_transformer.losses",
    "MaskedAccuracy": "keras_transformer.metrics",
    "masked_accuracy": "keras_transformer.metrics",
    "PRESETS": "keras_transformer.models",
    "build_from_preset": "keras_transformer.models",
    "build_transformer": "keras_transformer.models",
    "Transformer": "keras_transformer.models",
    "as_transformer": "keras_transformer.models",
    "Adam": "keras_transformer.optimizers",
    "WarmupSchedule": "keras_transformer.schedules",
    "TrainingConfig": "keras_transformer.config",
}
_TENSORFLOW = {
    "Translator": "keras_transformer.translator",
    "export_translator": "keras_transformer.export",
    "SubwordTokenizer": "keras_transformer.tokenizers",
    "train_subword_tokenizer": "keras_transformer.tokenizers",
    "load_translator": "keras_transformer.loading",
    "load_ensemble": "keras_transformer.loading",
    "SavedModelTranslator": "keras_transformer.loading",
    "load_run": "keras_transformer.training",
    "make_dataset": "keras_transformer.data",
}


def _starting_command_line():
    """Whether this import starts the `keras-transformer` command (or
    `python -m keras_transformer.cli`): it then imports Keras only for a
    command that runs, so `--help`, `--version` and usage errors come back
    at once."""
    first = sys.argv[0] if sys.argv else ""
    return os.path.basename(first) in ("keras-transformer", "keras-transformer.exe") or first == "-m"


def __getattr__(name):
    module = _NEUTRAL.get(name) or _TENSORFLOW.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NEUTRAL) | set(_TENSORFLOW))


if not _starting_command_line():
    for _name in _NEUTRAL:
        __getattr__(_name)
    del _name
