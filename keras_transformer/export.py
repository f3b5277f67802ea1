"""Export a Translator as a SavedModel that TF Serving can run."""

import json
import os

import tensorflow as tf

# Ops the export needs beyond core TensorFlow: tensorflow-text's
# SentencePiece kernels (the tokenizer runs inside the graph). TF Serving
# builds that link tensorflow-text (the official image does) and a Python
# process that runs `import tensorflow_text` have them.
TENSORFLOW_TEXT_OPS = (
    "SentencepieceOp",
    "SentencepieceTokenizeOp",
    "SentencepieceDetokenizeOp",
)
METADATA_FILE = "keras_transformer.json"


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


def export_translator(translator, path):
    """Write `translator` as a SavedModel with a string-to-string signature.

    The signature `serving_default` takes `text` (`tf.string`, shape
    `[None]`) and returns `translation` (`tf.string`, `[None]`, no special
    tokens) and `score` (`float32`, `[None]`: the length-normalised
    log-probability of the translation under beam search, the summed
    log-probability under greedy decoding).

    The graph holds core TensorFlow ops plus the three tensorflow-text
    SentencePiece ops in `TENSORFLOW_TEXT_OPS`, so it loads with
    `tf.saved_model.load` in a process that has imported `tensorflow` and
    `tensorflow_text`, as TF Serving does; neither Keras nor this library is
    needed. `keras_transformer.json` beside `saved_model.pb` records the
    signature, the decoding settings and those custom ops.

    Args:
        translator: a `keras_transformer.Translator`.
        path: output folder (created; an existing SavedModel is replaced).

    Returns:
        `path`.
    """
    serve = translator.serve.get_concrete_function()
    os.makedirs(path, exist_ok=True)
    tf.saved_model.save(translator, path, signatures={"serving_default": serve})
    metadata = {
        "signatures": {
            "serving_default": {
                "inputs": {"text": "string [None]"},
                "outputs": {"translation": "string [None]", "score": "float32 [None]"},
            }
        },
        "decoding": {
            "beam_size": translator.beam_size,
            "length_penalty": translator.length_penalty,
            "source_max_length": translator.source_max_length,
        },
        "custom_ops": {"tensorflow_text": list(TENSORFLOW_TEXT_OPS)},
    }
    with open(os.path.join(path, METADATA_FILE), "w") as f:
        json.dump(metadata, f, indent=2)
    return path
