"""Translate with an exported SavedModel, importing only TensorFlow.

Run: python examples/load_saved_model.py [SAVED_MODEL_DIR] [TEXT ...]

This is what TF Serving does: neither Keras nor keras_transformer is
imported; tensorflow_text registers the SentencePiece ops in the graph.
"""

import sys

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

path = sys.argv[1] if len(sys.argv) > 1 else "saved_models/multi30k-en-de"
texts = sys.argv[2:] or ["A man in an orange hat starring at something.", "Two dogs play in the snow."]
serve = tf.saved_model.load(path).signatures["serving_default"]
outputs = serve(text=tf.constant(texts))
for text, translation, score in zip(texts, outputs["translation"].numpy(), outputs["score"].numpy()):
    print(f"{text}\n  -> {translation.decode('utf-8')}   (score {score:.3f})")
