"""Translate with an exported SavedModel, importing only TensorFlow.

Run: python examples/load_saved_model.py [SAVED_MODEL_DIR] [TEXT ...]

This is what TF Serving does: neither Keras nor keras_transformer is
imported; tensorflow_text registers the SentencePiece ops in the graph.
"""

import argparse

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("saved_model", nargs="?", default="saved_models/multi30k-en-de",
                    help="SavedModel folder (default: %(default)s)")
parser.add_argument("texts", nargs="*", help="sentences to translate (default: two examples)")
args = parser.parse_args()

import tensorflow as tf  # noqa: E402  (after --help, which needs no TensorFlow)
import tensorflow_text  # noqa: E402,F401  (registers the SentencePiece ops)

path = args.saved_model
texts = args.texts or ["A man in an orange hat starring at something.", "Two dogs play in the snow."]
serve = tf.saved_model.load(path).signatures["serving_default"]
outputs = serve(text=tf.constant(texts))
for text, translation, score in zip(texts, outputs["translation"].numpy(), outputs["score"].numpy()):
    print(f"{text}\n  -> {translation.decode('utf-8')}   (score {score:.3f})")
