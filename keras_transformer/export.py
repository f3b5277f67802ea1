"""Export a Translator as a SavedModel that TF Serving can run."""

import os

import tensorflow as tf


def export_translator(translator, path):
    """Write `translator` as a SavedModel with a string-to-string signature.

    The signature `serving_default` takes `text` (`tf.string`, shape
    `[None]`) and returns `translation` (`tf.string`, `[None]`, no special
    tokens) and `score` (`float32`, `[None]`). The graph holds only core
    TensorFlow ops and the tensorflow-text SentencePiece ops, so it loads
    with `tf.saved_model.load` in a process that imports only `tensorflow`
    and `tensorflow_text`, as TF Serving does.

    Args:
        translator: a `keras_transformer.Translator`.
        path: output folder (created; an existing SavedModel is replaced).

    Returns:
        `path`.
    """
    serve = translator.serve.get_concrete_function()
    os.makedirs(path, exist_ok=True)
    tf.saved_model.save(translator, path, signatures={"serving_default": serve})
    return path
