"""Load a trained model for translation in one line: a run or a SavedModel."""

import os

from keras_transformer.translator import translate_lines
from keras_transformer.translator import translate_n_best


class SavedModelTranslator:
    """A SavedModel written by `export_translator` (or `keras-transformer
    export`), loaded to translate strings; it needs only TensorFlow and
    tensorflow_text, as TF Serving does. The search (beam size, length
    penalty) is the one fixed at export.

    Args:
        path: str, the SavedModel folder (it holds `saved_model.pb`).

    Raises:
        FileNotFoundError: if `path` holds no `saved_model.pb`.
    """

    def __init__(self, path):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        if not os.path.exists(os.path.join(path, "saved_model.pb")):
            raise FileNotFoundError(
                f"{path} is not a SavedModel folder (no saved_model.pb); pass a folder "
                "written by `keras-transformer export`, e.g. saved_models/multi30k-en-de."
            )
        self.path = path
        self._loaded = tf.saved_model.load(path)
        self._signatures = self._loaded.signatures

    def serve(self, text):
        """`serving_default`: `text` tf.string `(batch,)` -> `{"translation":
        tf.string (batch,), "score": float32 (batch,)}`."""
        return self._signatures["serving_default"](text=text)

    def serve_n_best(self, text):
        """`translate_n_best`: `text` tf.string `(batch,)` -> `{"translations":
        tf.string (batch, beam_size), "scores": float32 (batch, beam_size)}`."""
        return self._signatures["translate_n_best"](text=text)

    def __call__(self, text):
        """Translations of `text` (a `str`, a list of `str` or a tf.string
        tensor), as a tf.string tensor `(batch,)`."""
        import tensorflow as tf

        return self.serve(tf.constant(text, tf.string))["translation"]

    def translate_lines(self, lines, batch_size=64, progress=False):
        """Translate a list of `str`; see `translator.translate_lines`."""
        return translate_lines(lambda batch: self.serve(batch)["translation"], lines, batch_size, progress)

    def translate_n_best(self, lines, n, batch_size=64):
        """`n` best translations with scores; see `translator.translate_n_best`."""
        return translate_n_best(self.serve_n_best, lines, n, batch_size)


def load_translator(path, checkpoint="best", **decoding):
    """A translator of lists of strings from a shipped or exported
    SavedModel, or from a run folder written by `train`.

    Args:
        path: str, a SavedModel folder (such as `saved_models/multi30k-en-de`)
            or a run folder (the `--output-dir` of `keras-transformer train`).
        checkpoint: for a run, `"best"`, `"last"` or `"averaged"`.
        **decoding: for a run, `Translator` settings (`beam_size`,
            `length_penalty`, ...); a SavedModel keeps those of its export.

    Returns:
        `SavedModelTranslator` or `Translator`; both have
        `translate_lines(list of str) -> list of str`,
        `translate_n_best(lines, n)` and `__call__`.

    Raises:
        FileNotFoundError: if `path` is neither.
        ValueError: for decoding settings given with a SavedModel.

    Example:
    >>> translator = load_translator("saved_models/multi30k-en-de")  # doctest: +SKIP
    >>> translator.translate_lines(["A dog runs in the snow."])  # doctest: +SKIP
    ['Ein Hund rennt im Schnee.']
    """
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        if decoding:
            raise ValueError(
                f"{sorted(decoding)} apply to a run only: the SavedModel {path} decodes with the "
                "settings it was exported with. Export again to change them."
            )
        return SavedModelTranslator(path)
    if os.path.exists(os.path.join(path, "config.json")):
        from keras_transformer.training import load_run
        from keras_transformer.translator import Translator

        model, source, target, _ = load_run(path, which=checkpoint)
        return Translator(model, source, target, **decoding)
    raise FileNotFoundError(
        f"{path} is neither a SavedModel folder (saved_model.pb) nor a training run "
        "(config.json): pass saved_models/<name>, an `export --output` folder or a "
        "`train --output-dir` folder."
    )
