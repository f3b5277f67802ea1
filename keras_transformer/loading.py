"""Load a trained model for translation in one line: a run or a SavedModel."""

import json
import os
import re

import numpy as np

from keras_transformer.config import check_saved_model_folder
from keras_transformer.translator import translate_lines
from keras_transformer.translator import translate_n_best
from keras_transformer.source_notices import warn_about_sources


def exported_parallel_searches(path):
    """The `parallel_searches` the SavedModel at `path` was exported with
    (from its `keras_transformer.json`; 1 if it records none)."""
    try:
        with open(os.path.join(path, "keras_transformer.json"), encoding="utf-8") as f:
            return int(json.load(f)["decoding"].get("parallel_searches") or 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 1


def set_search_threads(parallel_searches):
    """Give each of `parallel_searches` search loops a core of its own: that
    many TensorFlow inter-op threads of one intra-op thread each (what an
    export's `tf_serving_flags` ask TF Serving for).

    TensorFlow takes thread settings only before it runs its first op; after
    that, unless they already are these, a `UserWarning` says how to set them.
    Does nothing for `parallel_searches` 1.

    Args:
        parallel_searches: int, the search loops of a batch.

    Returns:
        bool, whether TensorFlow now runs with those threads.
    """
    if parallel_searches <= 1:
        return True
    import tensorflow as tf

    threading = tf.config.threading
    try:
        threading.set_inter_op_parallelism_threads(parallel_searches)
        threading.set_intra_op_parallelism_threads(1)
        return True
    except RuntimeError:
        if (threading.get_inter_op_parallelism_threads(),
                threading.get_intra_op_parallelism_threads()) == (parallel_searches, 1):
            return True
        import warnings

        warnings.warn(
            f"This model splits each batch into {parallel_searches} search loops, which run at the "
            f"same time only with {parallel_searches} TensorFlow inter-op threads of one intra-op "
            "thread each, and TensorFlow has already started with other threads, so they share its "
            "default pool (about as fast as one search). Load the model before TensorFlow runs an "
            f"op, or call tf.config.threading.set_inter_op_parallelism_threads({parallel_searches}) "
            "and set_intra_op_parallelism_threads(1) first.",
            stacklevel=3,
        )
        return False


def _damaged_saved_model(path, error):
    """The `ValueError` for a SavedModel at `path` whose files could not be
    read (`error`: TensorFlow's or protobuf's own, which names no file)."""
    first_line = (str(error).strip().splitlines() or [""])[0]
    return ValueError(
        f"Could not read the SavedModel {path}: are its saved_model.pb or variables/ files damaged "
        f"or cut off? ({type(error).__name__}: {first_line}). Export it again (keras-transformer "
        "export), or copy it again."
    )


class SavedModelTranslator:
    """A SavedModel written by `export_translator` (or `keras-transformer
    export`), loaded to translate strings; it needs only TensorFlow and
    tensorflow_text, as TF Serving does. The search (beam size, length
    penalty) is the one fixed at export. An export with `parallel_searches`
    N sets TensorFlow's threads to N inter-op of one intra-op each, as TF
    Serving's flags for it do (see `set_search_threads`).

    Args:
        path: str, the SavedModel folder (it holds `saved_model.pb`).

    Raises:
        FileNotFoundError: if `path` holds no `saved_model.pb`.
        ValueError: if its files are damaged or cut off (naming `path`).
    """

    def __init__(self, path):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

        check_saved_model_folder(path)
        set_search_threads(exported_parallel_searches(path))
        self.path = path
        try:
            self._loaded = tf.saved_model.load(path)
        except Exception as error:
            raise _damaged_saved_model(path, error) from error
        self._signatures = self._loaded.signatures
        self._src_tokenizer = None

    @property
    def source_sequence_length(self):
        """int, the most source pieces translated, the end token included
        (longer sources are cut), as recorded at export; None if not
        recorded."""
        try:
            with open(os.path.join(self.path, "keras_transformer.json")) as f:
                decoding = json.load(f).get("decoding", {})
        except (OSError, ValueError):
            return None
        # Exports of earlier versions name it source_max_length.
        return decoding.get("source_sequence_length") or decoding.get("source_max_length")

    @property
    def src_tokenizer(self):
        """The source `SubwordTokenizer` inside the SavedModel, rebuilt from
        its SentencePiece model (to count a source's pieces in Python)."""
        if self._src_tokenizer is None:
            from tensorflow.core.protobuf import saved_model_pb2

            from keras_transformer.tokenizers import SubwordTokenizer

            proto = saved_model_pb2.SavedModel()
            with open(os.path.join(self.path, "saved_model.pb"), "rb") as f:
                proto.ParseFromString(f.read())
            try:
                with open(os.path.join(self.path, "keras_transformer.json")) as f:
                    lowercase = json.load(f).get("lowercase", False)
            except (OSError, ValueError):
                lowercase = False
            self._src_tokenizer = SubwordTokenizer(
                _sentencepiece_model(proto, "src_tokenizer"), lowercase=lowercase
            )
        return self._src_tokenizer

    def serve(self, text):
        """`serving_default`: `text` tf.string `(batch,)` -> `{"translation":
        tf.string (batch,), "score": float32 (batch,)}`."""
        return self._signatures["serving_default"](text=text)

    def serve_n_best(self, text):
        """`translate_n_best`: `text` tf.string `(batch,)` -> `{"translations":
        tf.string (batch, beam_size), "scores": float32 (batch, beam_size)}`."""
        return self._signatures["translate_n_best"](text=text)

    def __call__(self, text):
        """Translations of `text`, as `Translator.__call__` gives them: a
        `str` (or scalar tf.string) -> a scalar tf.string; a list of `str`
        (or a `(batch,)` tf.string tensor) -> tf.string `(batch,)`.

        Raises:
            ValueError: for a rank above 1.
        """
        from keras_transformer.translator import translate_text

        return translate_text(self.serve, text)

    def translate_lines(self, lines, batch_size=64, progress=False):
        """Translate a list of `str`; see `translator.translate_lines`. Warns
        (`UserWarning`, `keras_transformer.source_notices`) when sources
        were longer than the model takes or had characters its vocabulary
        lacks."""
        if hasattr(lines, "__next__"):  # read once, for both
            lines = list(lines)
        translations = translate_lines(lambda batch: self.serve(batch)["translation"], lines,
                                       batch_size, progress)
        warn_about_sources(self, lines)
        return translations

    def translate_n_best(self, lines, n, batch_size=64, distinct=True):
        """`n` best translations with scores, each text once with `distinct`;
        see `translator.translate_n_best`. Warns as `translate_lines` does."""
        if hasattr(lines, "__next__"):
            lines = list(lines)
        found = translate_n_best(self.serve_n_best, lines, n, batch_size, distinct)
        warn_about_sources(self, lines)
        return found


def load_translator(path, checkpoint=None, **decoding):
    """A translator of lists of strings from a shipped or exported
    SavedModel, or from a run folder written by `train`.

    Args:
        path: str, a SavedModel folder (such as `saved_models/multi30k-en-de`)
            or a run folder (the `--output-dir` of `keras-transformer train`).
        checkpoint: for a run, `"best"` (None), `"last"` or `"averaged"`;
            a SavedModel holds one model, so it takes none.
        **decoding: for a run, `Translator` settings (`beam_size`,
            `length_penalty`, ...; `transposed_output_table` defaults to
            True: the model is loaded for this translator); a SavedModel
            keeps those of its export.

    Returns:
        `SavedModelTranslator` or `Translator`; both have
        `translate_lines(list of str) -> list of str`,
        `translate_n_best(lines, n)` and `__call__`.

    Raises:
        FileNotFoundError: if `path` is neither.
        ValueError: for a `checkpoint` or decoding settings given with a
            SavedModel, or an unknown `checkpoint`.

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
        if checkpoint is not None:
            raise ValueError(
                f"`checkpoint` applies to a run only: the SavedModel {path} holds the one model it "
                f"was exported from; got checkpoint={checkpoint!r}. Leave it out, or pass the run "
                "folder to choose 'best', 'last' or 'averaged'."
            )
        return SavedModelTranslator(path)
    if os.path.exists(os.path.join(path, "config.json")):
        from keras_transformer.training import load_run

        checkpoint = "best" if checkpoint is None else checkpoint
        if checkpoint not in ("best", "last", "averaged"):
            raise ValueError(f"`checkpoint` must be 'best', 'last' or 'averaged'; got {checkpoint!r}.")
        from keras_transformer.translator import Translator

        model, source, target, _ = load_run(path, which=checkpoint)
        decoding.setdefault("transposed_output_table", True)
        return Translator(model, source, target, **decoding)
    raise FileNotFoundError(
        f"{path} is neither a SavedModel folder (saved_model.pb) nor a training run "
        "(config.json): pass saved_models/<name>, an `export --output` folder or a "
        "`train --output-dir` folder."
    )


class SavedModelContents:
    """A trained model's parts, as NumPy arrays and bytes (`read_saved_model`).

    Attributes:
        weights: dict of float32 arrays by Keras variable path
            (`"encoder_layer_0/self_attention/query/kernel"`, ...).
        src_proto, tgt_proto: serialized SentencePiece models (bytes).
        lowercase: whether the tokenizers lowercase their input.
        special_ids: dict with `pad_id`, `unk_id`, `start_id`, `end_id`.
        max_positions: rows of the position table (the model's
            `max_length`).
        layer_norm_epsilon: float.
        activation: the feed-forward activation's name.
    """

    def __init__(self, weights, src_proto, tgt_proto, lowercase, special_ids, max_positions,
                 layer_norm_epsilon=1e-6, activation="relu"):
        self.weights = {name: np.asarray(value, dtype=np.float32) for name, value in weights.items()}
        self.src_proto = src_proto
        self.tgt_proto = tgt_proto
        self.lowercase = bool(lowercase)
        self.special_ids = special_ids
        self.max_positions = int(max_positions)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation = activation

    def count(self, stack):
        """Blocks of `stack` (`"encoder"` or `"decoder"`)."""
        indices = {int(m.group(1)) for name in self.weights for m in [re.match(rf"{stack}_layer_(\d+)/", name)] if m}
        return max(indices) + 1 if indices else 0

    def architecture(self):
        """The `build_transformer` settings the weight names and shapes
        imply: layers, heads, widths, tying, pre-LN."""
        w = self.weights
        tie = ("all" if "shared_embedding/token_embedding/embeddings" in w
               else "none" if "logits/kernel" in w else "target")
        embedding = "shared_embedding" if tie == "all" else "encoder_embedding"
        return {
            "num_layers": self.count("encoder"),
            "num_decoder_layers": self.count("decoder"),
            "d_model": int(w[f"{embedding}/token_embedding/embeddings"].shape[1]),
            "num_heads": int(w["encoder_layer_0/self_attention/query/kernel"].shape[1]),
            "dff": int(w["encoder_layer_0/feedforward/feedforward_intermediate_dense/kernel"].shape[1]),
            "tie_embeddings": tie,
            "norm_first": "encoder_final_norm/gamma" in w,
        }


def read_saved_model(path):
    """The weights, tokenizers and settings of a SavedModel written by
    `export_translator`, without Keras: `SavedModelContents`.

    Raises:
        FileNotFoundError: if `path` holds no `saved_model.pb`.
        ValueError: for a SavedModel that `export_translator` did not write,
            one with int8 weights (they cannot be rebuilt into a model), or
            one whose files are damaged or cut off (naming `path`).
    """
    if not os.path.exists(os.path.join(path, "saved_model.pb")):
        raise FileNotFoundError(f"{path} is not a SavedModel folder (no saved_model.pb).")
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        with open(os.path.join(path, "keras_transformer.json")) as f:
            metadata = json.load(f)
    except (OSError, ValueError):
        metadata = {}
    if "decoding" not in metadata or "special_ids" not in metadata:
        raise ValueError(f"{path} has no readable keras_transformer.json written by export_translator (missing "
                         "or damaged); read only SavedModels exported by keras-transformer.")
    if metadata.get("weights_dtype") == "int8":
        raise ValueError(
            f"{path} stores its matrices in int8 (export --weights-dtype int8), from which a model "
            "cannot be rebuilt (for an ensemble, a CTranslate2 conversion or a new search). Use "
            "the run folder it was exported from, or an export with float16 or float32 weights; "
            "load_translator serves the int8 export as it is."
        )
    proto = saved_model_pb2.SavedModel()
    try:
        with open(os.path.join(path, "saved_model.pb"), "rb") as f:
            proto.ParseFromString(f.read())
        weights = _saved_variables(proto, path)
    except ValueError:
        raise
    except Exception as error:  # a cut-off or damaged file: TensorFlow's or protobuf's own error
        raise _damaged_saved_model(path, error) from error
    src, tgt = (_sentencepiece_model(proto, name) for name in ("src_tokenizer", "tgt_tokenizer"))
    ids = dict(metadata.get("special_ids", {}))
    ids.setdefault("unk_id", 1)
    model = metadata.get("model", {})
    contents = SavedModelContents(
        weights, src, tgt, metadata.get("lowercase", False), ids,
        # Exports of earlier versions name these max_length and source_max_length.
        (model.get("sequence_length") or model.get("max_length")
         or metadata["decoding"].get("source_sequence_length")
         or metadata["decoding"]["source_max_length"]),
        layer_norm_epsilon=model.get("layer_norm_epsilon", 1e-6),
        activation=model.get("activation", "relu"),
    )
    if contents.activation is None:
        raise ValueError(f"{path} was exported from a model with a custom feed-forward activation, "
                         "which cannot be rebuilt from the SavedModel; use its run folder.")
    return contents


def _saved_variables(saved_model, path):
    """`{name: NumPy value}` of every variable of the SavedModel at `path`
    (`saved_model` its parsed `saved_model.pb`), read from its checkpoint
    without loading its functions (`tf.saved_model.load` restores every
    traced function first, which takes seconds).

    Node i of the SavedModel's object graph is node i of the checkpoint's
    object graph (the SavedModel's has more nodes after those), whose
    `VARIABLE_VALUE` attribute names the tensor that holds the variable's
    value (as `tf.saved_model.load` matches them).

    Raises:
        ValueError: for a variable the checkpoint does not hold, or holds
            with another shape or dtype (`variables/` of another export).
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    weights = {}
    for i, saved in enumerate(saved_model.meta_graphs[0].object_graph_def.nodes):
        if saved.WhichOneof("kind") != "variable":
            continue
        keys = [a.checkpoint_key for a in graph.nodes[i].attributes if a.name == "VARIABLE_VALUE"] \
            if i < len(graph.nodes) else []
        value = reader.get_tensor(keys[0]) if keys else None
        shape = None if saved.variable.shape.unknown_rank else [dim.size for dim in saved.variable.shape.dim]
        fits = value is not None and value.dtype == tf.as_dtype(saved.variable.dtype) and (
            shape is None or (len(shape) == value.ndim and all(a in (-1, b) for a, b in zip(shape, value.shape))))
        if not fits:
            found = "is not in its checkpoint" if value is None else (
                f"is {tf.as_dtype(saved.variable.dtype).name} {shape} there but "
                f"{value.dtype.name} {list(value.shape)} in its checkpoint")
            raise ValueError(f"{path}: the variable {saved.variable.name!r} of saved_model.pb {found}: "
                             "saved_model.pb and variables/ do not belong together. Export it again.")
        weights[saved.variable.name] = value
    return weights


def _sentencepiece_model(saved_model, child):
    """The serialized SentencePiece model of the root's `child` tokenizer:
    the `model` attribute of the `SentencepieceOp` in the function that
    creates its resource (root -> child -> _tokenizer -> _model_resource)."""
    meta = saved_model.meta_graphs[0]
    nodes = meta.object_graph_def.nodes

    def child_of(node_id, name):
        for ref in nodes[node_id].children:
            if ref.local_name == name:
                return ref.node_id
        raise ValueError(f"the SavedModel has no {name!r} under node {node_id}; was it written by "
                         "keras_transformer's export_translator?")

    node = child_of(child_of(child_of(child_of(0, child), "_tokenizer"), "_model_resource"), "_create_resource")
    creators = set(nodes[node].function.concrete_functions)
    for function in meta.graph_def.library.function:
        if function.signature.name in creators:
            for op in function.node_def:
                if op.op == "SentencepieceOp":
                    return op.attr["model"].s
    raise ValueError(f"no SentencePiece model found for {child}")

def translator_from_saved_model(path, **decoding):
    """A `Translator` (any search, n-best, attention weights) on the weights
    and tokenizers of the SavedModel at `path`, rebuilt as a Keras model.

    Args:
        path: a SavedModel folder written by `export_translator`.
        **decoding: `Translator` settings (`beam_size`, `length_penalty`,
            ...; `transposed_output_table` defaults to True: the model is
            rebuilt for this translator).

    Returns:
        `keras_transformer.Translator`.
    """
    from keras_transformer.translator import Translator

    model, src, tgt = _model_of_saved_model(path)
    decoding.setdefault("transposed_output_table", True)
    return Translator(model, src, tgt, **decoding)


def _model_of_saved_model(path):
    """`(model, src_tokenizer, tgt_tokenizer)` rebuilt from the SavedModel
    at `path` (`read_saved_model`)."""
    from keras_transformer.models.transformer import build_transformer
    from keras_transformer.tokenizers import SubwordTokenizer

    contents = read_saved_model(path)
    src = SubwordTokenizer(contents.src_proto, lowercase=contents.lowercase)
    tgt = SubwordTokenizer(contents.tgt_proto, lowercase=contents.lowercase)
    model = build_transformer(
        src.vocab_size, tgt.vocab_size, **contents.architecture(), sequence_length=contents.max_positions,
        dropout_rate=0.0, layer_norm_epsilon=contents.layer_norm_epsilon, activation=contents.activation,
    )
    for variable in model.weights:
        variable.assign(contents.weights[variable.path])
    return model, src, tgt


def load_ensemble(paths, checkpoint="best", **decoding):
    """One `Translator` over several models that share their tokenizers,
    decoded as an ensemble (`decoding.ensemble.EnsembleParts`: the log of
    the members' mean distribution a step).

    Args:
        paths: list of two or more SavedModel folders or run folders
            (mixed as you like), each model rebuilt in this process.
        checkpoint: for each run folder, `"best"`, `"last"` or `"averaged"`.
        **decoding: `Translator` settings (`beam_size`, `length_penalty`,
            ...); a SavedModel's exported search is not used.

    Returns:
        `keras_transformer.Translator` of the ensemble (not exportable).

    Raises:
        FileNotFoundError: if a path is neither a SavedModel nor a run.
        TypeError: for one path (a str) instead of a list.
        ValueError: for fewer than two paths, a member whose source or
            target pieces (or lowercasing) differ from the first's, or one
            whose recorded language pair (`languages.model_languages`)
            differs from another's.
    """
    from keras_transformer.languages import check_same_direction
    from keras_transformer.translator import Translator

    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError(f"`paths` must be a list of two or more model folders; got one: {paths!r}. "
                        "Pass [path_a, path_b, ...].")
    paths = list(paths)
    if len(paths) < 2:
        raise ValueError(f"An ensemble needs two or more models; got {len(paths)} ({paths}). "
                         "Translate with one model through --run or --saved-model.")
    if checkpoint not in ("best", "last", "averaged"):
        raise ValueError(f"`checkpoint` must be 'best', 'last' or 'averaged'; got {checkpoint!r}.")
    check_same_direction(paths)  # one shared vocabulary serves en-de and de-en alike
    members = []
    for path in paths:
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            members.append(_model_of_saved_model(path))
        elif os.path.exists(os.path.join(path, "config.json")):
            from keras_transformer.training import load_run

            members.append(load_run(path, which=checkpoint)[:3])
        else:
            raise FileNotFoundError(
                f"{path} is neither a SavedModel folder (saved_model.pb) nor a training run "
                "(config.json): each ensemble member is one of them."
            )
    _, src, tgt = members[0]
    for path, (_, other_src, other_tgt) in zip(paths[1:], members[1:]):
        for side, mine, theirs in (("source", src, other_src), ("target", tgt, other_tgt)):
            if mine.vocabulary() != theirs.vocabulary() or mine.lowercase != theirs.lowercase:
                raise ValueError(
                    f"{path} has another {side} tokenizer than {paths[0]}: the models of an ensemble "
                    "read and write the same pieces. Ensemble models trained with the same "
                    "vocabulary (the same corpus and vocabulary settings)."
                )
    decoding.setdefault("transposed_output_table", True)
    return Translator([model for model, _, _ in members], src, tgt, **decoding)
