"""Export a Translator as a SavedModel that TF Serving can run."""

import json
import os

import keras
import tensorflow as tf

from keras_transformer.devices import decoding_environment
from keras_transformer.precision import with_dtype_policy

# Ops the export needs beyond core TensorFlow: tensorflow-text's
# SentencePiece kernels (the tokenizer runs inside the graph). TF Serving
# builds that link tensorflow-text (the official image does) and a Python
# process that runs `import tensorflow_text` have them.
TENSORFLOW_TEXT_OPS = (
    "NormalizeUTF8",
    "SentencepieceOp",
    "SentencepieceTokenizeOp",
    "SentencepieceDetokenizeOp",
)
METADATA_FILE = "keras_transformer.json"
# What a SavedModel folder holds (an export replaces these), with the files
# the shipped models keep beside them.
SAVED_MODEL_ENTRIES = frozenset({
    "saved_model.pb", "saved_model.pbtxt", "variables", "assets", "fingerprint.pb",
    METADATA_FILE, "metrics.json", "MODEL_CARD.md",
})


def serving_flags(translator):
    """The TF Serving flags that an export of `translator` needs or runs
    fastest with (written into its `keras_transformer.json`).

    XLA-compiled searches need `--xla_cpu_compilation_enabled=true`;
    `parallel_searches` p > 1 wants p inter-op threads of one intra-op
    thread each, so that each search loop keeps one core.

    Returns:
        list of `str`.

    >>> class Settings:
    ...     jit_compile, parallel_searches = False, 2
    >>> serving_flags(Settings())
    ['--tensorflow_inter_op_parallelism=2', '--tensorflow_intra_op_parallelism=1']
    """
    flags = []
    if translator.jit_compile:
        flags.append("--xla_cpu_compilation_enabled=true")
    if translator.parallel_searches > 1:
        flags += [f"--tensorflow_inter_op_parallelism={translator.parallel_searches}",
                  "--tensorflow_intra_op_parallelism=1"]
    return flags


def saved_model_op_types(path):
    """Every op type in a SavedModel's graphs and function library.

    Args:
        path: SavedModel folder.

    Returns:
        sorted list of op type names (`str`).
    """
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    ops = set()
    for meta_graph in proto.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    return sorted(ops)


class Float16StoragePolicy(keras.dtype_policies.DTypePolicy):
    """Variables stored in float16, all computation in float32.

    Halves a SavedModel's size at no measurable cost in accuracy: Keras
    casts each variable to float32 when a layer reads it, so activations,
    softmax and beam scores stay float32 (unlike `mixed_float16`, which
    computes in float16). Used only for export, never for training.
    """

    def __init__(self, name="float16_storage"):
        super().__init__("float32")
        self._variable_dtype = "float16"

    @property
    def name(self):
        return "float16_storage"


WEIGHTS_DTYPES = ("float32", "float16", "int8")


def with_weights_dtype(model, weights_dtype):
    """A copy of `model` whose variables are stored as `weights_dtype`.

    Args:
        model: a built `build_transformer` model.
        weights_dtype: `"float32"` (returns `model` itself) or `"float16"`.

    Returns:
        A functional model computing in float32.

    Raises:
        ValueError: for another `weights_dtype`.
    """
    if weights_dtype in ("float32", "int8"):  # int8: quantized at export (`serving.ServingSignatures`)
        return model
    if weights_dtype != "float16":
        raise ValueError(
            f"`weights_dtype` must be 'float32' or 'float16'; got {weights_dtype!r}."
        )
    weights = [w.astype("float16") for w in model.get_weights()]
    return with_dtype_policy(model, Float16StoragePolicy(), weights)


def _model_settings(translator):
    """What rebuilding the model from the SavedModel's variables needs
    beyond their names and shapes (`loading.read_saved_model`)."""
    block = translator.model.encoder_layers[0]
    activation = keras.activations.serialize(block.activation)
    return {
        "sequence_length": int(translator._parts.target_sequence_length),
        "layer_norm_epsilon": float(block.layer_norm_epsilon),
        "activation": activation if isinstance(activation, str) else None,
    }


def smoke_translate(server):
    """Translate one sentence with `server.serve` (the `serving_default`
    function about to be exported), so that a search that cannot run, such
    as an XLA program that fails to compile, fails the export rather than
    the SavedModel's first request. Under XLA this compiles the search for
    one sentence, as the first such request would.

    Args:
        server: `keras_transformer.serving.ServingSignatures`.

    Raises:
        RuntimeError: naming the TensorFlow error, if the translation fails.
    """
    try:
        server.serve(tf.constant(["a"]))
    except tf.errors.OpError as error:
        xla = server.translator.jit_compile
        raise RuntimeError(
            "The export's serving_default failed to translate one sentence, so the SavedModel "
            "would fail at its first request; nothing was written. "
            + ("Export without XLA (no --jit-compile, jit_compile=False) and report this. "
               if xla else "Please report this. ")
            + f"{type(error).__name__}: {_error_summary(error.message)}"
        ) from error


def _error_summary(message):
    """The lines of a TensorFlow error message that say what failed,
    without the graph's call stack ("Detected at node ... defined at").

    >>> _error_summary('Graph execution error:\\n\\nDetected at node A defined at (most recent '
    ...                'call last):\\n  File "x.py", line 8\\n\\nassertion failed: [bad]\\n\\t [[{{node A}}]]')
    'assertion failed: [bad]'
    """
    kept = [line for line in (message or "").splitlines()
            if line.strip() and not line[0].isspace()
            and line != "Graph execution error:" and not line.startswith("Detected at node")]
    return " ".join(kept) or (message or "").strip()


def export_translator(translator, path, weights_dtype="float32", languages=None):
    """Write `translator` as a SavedModel with a string-to-string signature.

    Signatures:

    - `serving_default`: `text` (`tf.string`, `[None]`, or one string as a
      batch of one) -> `translation`
      (`tf.string`, `[None]`, no special tokens) and `score` (`float32`,
      `[None]`: the length-normalised log-probability under beam search,
      the summed log-probability under greedy decoding);
    - `translate_n_best`: `text` -> `translations` and `scores`, both
      `[None, beam_size]`, best first;
    - `translate_ids`: `source_ids` (`int32`, `[None, None]`, rows ending
      in the end id, padded with 0; one row `[None]` is a batch of one;
      ids outside the source vocabulary are an `InvalidArgumentError`) ->
      `target_ids` (`int32`, `[None, T]`, T the decoding limit, the
      decoder's `sequence_length` unless the translator sets a lower
      `max_length`; padded with 0
      after the end id) and `score`, for clients that tokenize themselves.

    The inputs are declared with an open rank (`saved_model_cli` shows
    `unknown_rank`) so that a scalar is accepted; a higher rank than
    listed is an `InvalidArgumentError` before any other op runs.

    The graph holds core TensorFlow ops plus the four tensorflow-text ops
    in `TENSORFLOW_TEXT_OPS` (Unicode normalization and SentencePiece), so it loads with
    `tf.saved_model.load` in a process that has imported `tensorflow` and
    `tensorflow_text`, as TF Serving does; neither Keras nor this library is
    needed. A tied output projection (section 3.4) is exported with a copy
    of its token table's transpose (`Translator(transposed_output_table=
    True)`; not for int8 weights), which the search multiplies by: `d_model
    * vocab` more stored numbers, the same translations, faster steps. `keras_transformer.json` beside `saved_model.pb` records the
    signature, the decoding settings and those custom ops.

    Args:
        translator: a `keras_transformer.Translator`.
        path: output folder: new, empty, or an earlier SavedModel, which
            is replaced.
        weights_dtype: `"float32"`; `"float16"` to store the weights in
            half the space while still computing in float32
            (`Float16StoragePolicy`); or `"int8"` to store the matrices as
            int8 with per-channel scales, about a quarter of the space,
            rebuilt to float32 at each call (`keras_transformer.quantization`).
        languages: `(source_code, target_code)` such as `("en", "de")`,
            recorded as `"languages"` in `keras_transformer.json` so that
            ensembles and `evaluate` can check the direction
            (`keras_transformer.languages`); None (default): not recorded.

    Returns:
        `path`.

    Raises:
        TypeError: if `translator` is not a `Translator`.
        ValueError: for another `weights_dtype`, int8 weights with XLA,
            an ensemble translator (several models), or `languages` that
            is not two different ISO 639-1 codes.
        FileExistsError: if `path` holds files other than a SavedModel's
            (a run folder, say), which the export would mix with its own.
        RuntimeError: if the signatures fail to translate one sentence
            (`smoke_translate`); nothing is written then.
    """
    from keras_transformer.translator import Translator

    if not isinstance(translator, Translator):
        raise TypeError(
            "export_translator takes a keras_transformer.Translator, got "
            f"{type(translator).__name__}: wrap the model first, "
            "`Translator(model, src_tokenizer, tgt_tokenizer, beam_size=4)`."
        )
    if len(translator.models) > 1:
        raise ValueError(
            f"The translator is an ensemble of {len(translator.models)} models, which export does not "
            "write; export one model (`Translator(model, ...)`), or use the ensemble in process "
            "(`keras-transformer translate --ensemble ...`)."
        )
    if os.path.isdir(path):
        others = sorted(set(os.listdir(path)) - SAVED_MODEL_ENTRIES)
        if others:
            raise FileExistsError(
                f"{path} holds files that are not a SavedModel's ({', '.join(others[:5])}"
                f"{', ...' if len(others) > 5 else ''}); export to a new or empty folder "
                "(an earlier SavedModel there is replaced)."
            )
    if weights_dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"`weights_dtype` must be one of {WEIGHTS_DTYPES}; got {weights_dtype!r}.")
    if languages is not None:
        from keras_transformer.languages import ISO_639_1

        given = languages
        languages = tuple(languages) if isinstance(languages, (list, tuple)) else None
        if (languages is None or len(languages) != 2 or languages[0] == languages[1]
                or not all(isinstance(code, str) and code in ISO_639_1 for code in languages)):
            raise ValueError(f"`languages` must be two different ISO 639-1 codes, (source, target) "
                             f"such as ('en', 'de'); got {given!r}.")
    # Rebuilt on the weights as stored, with the tied output table's
    # transpose copied once (the int8 export reads its table from int8).
    translator = Translator(
        with_weights_dtype(translator.model, weights_dtype),
        translator.src_tokenizer,
        translator.tgt_tokenizer,
        search=translator.search,
        max_length=translator.max_length,
        length_ratio=translator.length_ratio,
        allow_unk=translator.allow_unk,
        jit_compile=translator.jit_compile,
        xla_max_batch_size=translator.xla_max_batch_size,
        parallel_searches=translator.parallel_searches,
        transposed_output_table=weights_dtype != "int8",
    )
    if weights_dtype == "int8":
        if translator.jit_compile:
            raise ValueError("int8 weights are exported without XLA; pass a Translator with "
                             "jit_compile=False.")
        from keras_transformer.quantization import Int8Weights
        from keras_transformer.serving import ServingSignatures

        server = ServingSignatures(translator, Int8Weights(translator.model))
    else:
        server = translator.signatures
    signatures = {
        "serving_default": server.serve.get_concrete_function(),
        "translate_n_best": server.serve_n_best.get_concrete_function(),
        "translate_ids": server.serve_ids.get_concrete_function(),
    }
    smoke_translate(server)
    os.makedirs(path, exist_ok=True)
    # The root holds the tf.Variables the signatures capture (as
    # `keras.export.ExportArchive` does) and the tokenizers, not the Keras
    # model or its `keras.Variable` wrappers: such a SavedModel restores in
    # TF2's loader but not in the session-based loader of TF Serving and
    # `saved_model_cli run` ("Could not find variable ...").
    root = tf.__internal__.tracking.AutoTrackable()
    captured = {}
    for function in signatures.values():
        for variable in function.variables:  # the tf.Variables themselves
            captured.setdefault(id(variable), variable)
    root.variables = list(captured.values())
    if weights_dtype == "int8":
        kept = {id(v) for v in root.variables}
        if any(id(v.value) in kept for v, _, _ in server.weights.quantized):
            raise RuntimeError("the int8 export captured float32 matrices; please report this.")
    root.src_tokenizer = translator.src_tokenizer
    root.tgt_tokenizer = translator.tgt_tokenizer
    tf.saved_model.save(root, path, signatures=signatures)
    target_length = translator._parts.target_sequence_length
    if translator.max_length is not None:
        target_length = min(int(translator.max_length), target_length)
    metadata = {
        "signatures": {
            "serving_default": {
                "inputs": {"text": "string [None] (or one string)"},
                "outputs": {"translation": "string [None]", "score": "float32 [None]"},
            },
            "translate_n_best": {
                "inputs": {"text": "string [None] (or one string)"},
                "outputs": {
                    "translations": f"string [None, {translator.beam_size}]",
                    "scores": f"float32 [None, {translator.beam_size}]",
                },
            },
            "translate_ids": {
                "inputs": {"source_ids": "int32 [None, None] (or one row [None])"},
                "outputs": {
                    "target_ids": f"int32 [None, {target_length}]",
                    "score": "float32 [None]",
                },
            },
        },
        "special_ids": {
            "pad_id": translator.tgt_tokenizer.pad_id,
            "start_id": translator.tgt_tokenizer.start_id,
            "end_id": translator.tgt_tokenizer.end_id,
        },
        "decoding": {
            "search": {"name": translator.search.name, **translator.search.get_config()},
            "beam_size": translator.beam_size,
            "length_penalty": translator.length_penalty,
            "source_sequence_length": translator.source_sequence_length,
            "allow_unk": translator.allow_unk,
            "jit_compile": translator.jit_compile,
            "xla_max_batch_size": translator.xla_max_batch_size,
            "parallel_searches": translator.parallel_searches,
            "transposed_output_table": translator._output_kernel is not None,
        },
        "tf_serving_flags": serving_flags(translator),
        "tf_serving_env": decoding_environment(),
        "weights_dtype": weights_dtype,
        "lowercase": translator.src_tokenizer.lowercase,
        **({"languages": {"source": languages[0], "target": languages[1]}} if languages else {}),
        "model": _model_settings(translator),
        "custom_ops": {"tensorflow_text": list(TENSORFLOW_TEXT_OPS)},
    }
    with open(os.path.join(path, METADATA_FILE), "w") as f:
        json.dump(metadata, f, indent=2)
    return path
