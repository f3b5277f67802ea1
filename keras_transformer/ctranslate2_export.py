"""Convert a trained model to a CTranslate2 model, and translate with it.

CTranslate2 (OpenNMT's C++ inference engine for Transformers on CPUs and
GPUs) decodes the same weights with its own kernels. `export_ctranslate2`
writes a CTranslate2 model folder from a run folder, a SavedModel written by
`export_translator`, or a `Translator`; `CTranslate2Translator` translates
strings with it, tokenizing with the run's SentencePiece models and the same
input normalisation as `Translator`.

A faithful conversion needs the model's own details, not CTranslate2's
defaults:

- the position table of section 3.5 is passed explicitly (CTranslate2's
  built-in table concatenates sines and cosines and starts at position 1;
  ours interleaves them from position 0), with rows up to CTranslate2's
  default limits; for our outputs, cut sources at the model's
  `sequence_length` (the end id included) and pass `max_decoding_length=
  sequence_length - 1`, as `CTranslate2Translator` does;
- the LayerNorm epsilon is ours (1e-6 by default; CTranslate2 assumes 1e-5);
- post-LN blocks (the paper's) or pre-LN blocks with final norms, as built;
- tied embeddings are written as copies of the one matrix, the output
  projection without bias;
- the source ends with the end id (`add_source_eos`), the target starts
  with the start id; the unknown, pad and start ids are never emitted.

CTranslate2 is an optional dependency: `pip install "keras-transformer[ctranslate2]"`.
"""

import json
import os
import shutil

import numpy as np

from keras_transformer.layers.positional_embedding import sinusoidal_encoding
from keras_transformer.loading import SavedModelContents
from keras_transformer.loading import read_saved_model
from keras_transformer.models.conversion import as_transformer

METADATA_FILE = "keras_transformer.json"  # what CTranslate2Translator reads
FORMAT = "keras_transformer.ctranslate2"
SOURCE_MODEL = "source.model"
TARGET_MODEL = "target.model"
QUANTIZATIONS = (None, "int8", "int8_float32", "int16", "float16")
# CTranslate2's `translate_batch` defaults: max_input_length 1024 and
# max_decoding_length 256 (positions 0 to 256 after the start token).
CTRANSLATE2_DEFAULT_POSITIONS = 1024


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ImportError(
            "CTranslate2 is not installed; install it with "
            "`pip install \"keras-transformer[ctranslate2]\"` (or `pip install ctranslate2`)."
        ) from None
    return ctranslate2


def _from_model(model, src_tokenizer, tgt_tokenizer):
    model = as_transformer(model)
    config = model.encoder_layers[0].get_config()
    return SavedModelContents(
        {weight.path: _value(weight) for weight in model.weights},
        src_tokenizer.proto,
        tgt_tokenizer.proto,
        src_tokenizer.lowercase,
        _special_ids(tgt_tokenizer),
        model.sequence_length,
        layer_norm_epsilon=config.get("layer_norm_epsilon", 1e-6),
        activation=config.get("activation", "relu"),
    )


def _value(weight):
    import keras

    return keras.ops.convert_to_numpy(weight.value)


def _special_ids(tokenizer):
    return {"pad_id": tokenizer.pad_id, "unk_id": tokenizer.unk_id,
            "start_id": tokenizer.start_id, "end_id": tokenizer.end_id}


def _attention_kernel(kernel):
    """`(d_model, heads, head_dim)` -> CTranslate2's `(heads * head_dim, d_model)`."""
    return kernel.reshape(kernel.shape[0], -1).T


def _set_norm(spec, weights, name):
    spec.gamma = weights[f"{name}/gamma"]
    spec.beta = weights[f"{name}/beta"]


def _set_attention(spec, weights, prefix, self_attention):
    q, k, v = (_attention_kernel(weights[f"{prefix}/{n}/kernel"]) for n in ("query", "key", "value"))
    qb, kb, vb = (weights[f"{prefix}/{n}/bias"].reshape(-1) for n in ("query", "key", "value"))
    out = weights[f"{prefix}/attention_output/kernel"]
    if self_attention:
        spec.linear[0].weight = np.concatenate([q, k, v])
        spec.linear[0].bias = np.concatenate([qb, kb, vb])
        last = spec.linear[1]
    else:
        spec.linear[0].weight, spec.linear[0].bias = q, qb
        spec.linear[1].weight = np.concatenate([k, v])
        spec.linear[1].bias = np.concatenate([kb, vb])
        last = spec.linear[2]
    last.weight = out.reshape(-1, out.shape[-1]).T.copy()
    last.bias = weights[f"{prefix}/attention_output/bias"]


def _set_feed_forward(spec, weights, prefix):
    for linear, name in ((spec.linear_0, "feedforward_intermediate_dense"),
                         (spec.linear_1, "feedforward_output_dense")):
        linear.weight = weights[f"{prefix}/feedforward/{name}/kernel"].T.copy()
        linear.bias = weights[f"{prefix}/feedforward/{name}/bias"]


def _embedding_names(weights):
    if "shared_embedding/token_embedding/embeddings" in weights:
        name = "shared_embedding/token_embedding/embeddings"
        return name, name
    return ("encoder_embedding/token_embedding/embeddings", "decoder_embedding/token_embedding/embeddings")


def _vocabulary(proto):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=proto)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())], processor


def _build_spec(source):
    _require_ctranslate2()
    from ctranslate2.specs import common_spec
    from ctranslate2.specs import transformer_spec

    weights = source.weights
    activations = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    if not isinstance(source.activation, str) or source.activation not in activations:
        raise ValueError(f"CTranslate2 export supports the relu and gelu activations; the model uses "
                         f"{source.activation!r}.")
    architecture = source.architecture()
    norm_first = architecture["norm_first"]
    spec = transformer_spec.TransformerSpec.from_config(
        (architecture["num_layers"], architecture["num_decoder_layers"]), architecture["num_heads"],
        pre_norm=norm_first, activation=activations[source.activation],
    )
    src_name, tgt_name = _embedding_names(weights)
    # Section 3.5's formula holds at any position. Rows past the model's own
    # (which `CTranslate2Translator` never reaches: it cuts sources and
    # outputs there, as ours does) let CTranslate2's own `translate_batch`
    # run on its defaults (sources cut at 1,024 tokens, 256 output tokens)
    # instead of failing on a long source or a long output.
    table = sinusoidal_encoding(max(source.max_positions, CTRANSLATE2_DEFAULT_POSITIONS), architecture["d_model"])
    for stack, name in ((spec.encoder, src_name), (spec.decoder, tgt_name)):
        embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
        embeddings.weight = weights[name]
        embeddings.multiply_by_sqrt_depth = True
        stack.scale_embeddings = True
        stack.position_encodings.encodings = table
        if norm_first:
            _set_norm(stack.layer_norm, weights, "encoder_final_norm" if stack is spec.encoder else "decoder_final_norm")
    for i, layer in enumerate(spec.encoder.layer):
        prefix = f"encoder_layer_{i}"
        _set_attention(layer.self_attention, weights, f"{prefix}/self_attention", True)
        _set_norm(layer.self_attention.layer_norm, weights, f"{prefix}/self_attention_layer_norm")
        _set_feed_forward(layer.ffn, weights, prefix)
        _set_norm(layer.ffn.layer_norm, weights, f"{prefix}/feedforward_layer_norm")
    for i, layer in enumerate(spec.decoder.layer):
        prefix = f"decoder_layer_{i}"
        _set_attention(layer.self_attention, weights, f"{prefix}/self_attention", True)
        _set_norm(layer.self_attention.layer_norm, weights, f"{prefix}/self_attention_layer_norm")
        _set_attention(layer.attention, weights, f"{prefix}/cross_attention", False)
        _set_norm(layer.attention.layer_norm, weights, f"{prefix}/cross_attention_layer_norm")
        _set_feed_forward(layer.ffn, weights, prefix)
        _set_norm(layer.ffn.layer_norm, weights, f"{prefix}/feedforward_layer_norm")
    if "logits/kernel" in weights:
        spec.decoder.projection.weight = weights["logits/kernel"].T.copy()
        if "logits/bias" in weights:
            spec.decoder.projection.bias = weights["logits/bias"]
    else:  # tied: the decoder's embedding matrix is the output projection
        spec.decoder.projection.weight = weights[tgt_name]
    src_vocab, _ = _vocabulary(source.src_proto)
    tgt_vocab, _ = _vocabulary(source.tgt_proto)
    ids = source.special_ids
    spec.config.unk_token = tgt_vocab[ids["unk_id"]]
    spec.config.bos_token = tgt_vocab[ids["start_id"]]
    spec.config.eos_token = tgt_vocab[ids["end_id"]]
    spec.config.decoder_start_token = tgt_vocab[ids["start_id"]]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = source.layer_norm_epsilon
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec


def export_ctranslate2(source, output_dir, quantization=None, overwrite=False, which="best"):
    """Write a CTranslate2 model of `source` to `output_dir`.

    Args:
        source: a run folder (written by `train`), a SavedModel folder
            (written by `export_translator`), or a `Translator`.
        output_dir: folder to write: CTranslate2's `model.bin`, `config.json`
            and vocabularies, plus `source.model` / `target.model` (the
            SentencePiece models) and `keras_transformer.json` (input
            lowercasing, special ids, source length limit, and the
            language pair where the source records one:
            `keras_transformer.languages.model_languages`).
        quantization: None (float32 weights) or a CTranslate2 weight type:
            `"int8"`, `"int8_float32"`, `"int16"` or `"float16"`. The type can
            also be chosen when loading (`compute_type`).
        overwrite: replace an existing model in `output_dir`.
        which: the checkpoint of a run folder: `"best"`, `"last"` or
            `"averaged"`.

    Returns:
        `output_dir`.

    Raises:
        ImportError: when `ctranslate2` is not installed (says how to).
        FileExistsError: when `output_dir` holds a CTranslate2 model and not
            `overwrite`.
        ValueError: for an unknown `quantization`, a source that is none of
            the above, an `output_dir` that is the source, a file, or a
            folder of other files (never replaced, even with `overwrite`).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}; got {quantization!r}.")
    _require_ctranslate2()
    output_dir = os.fspath(output_dir).rstrip("/\\") or os.fspath(output_dir)
    _check_output(source, output_dir, overwrite)
    converted = _read_source(source, which)
    spec = _build_spec(converted)
    spec.validate()
    spec.optimize(quantization=quantization)
    # Written beside the old model, which is replaced only once the new one
    # is complete.
    staging = output_dir + ".export-staging"
    if os.path.exists(staging):
        shutil.rmtree(staging)
    os.makedirs(staging)
    spec.save(staging)
    for name, proto in ((SOURCE_MODEL, converted.src_proto), (TARGET_MODEL, converted.tgt_proto)):
        with open(os.path.join(staging, name), "wb") as f:
            f.write(proto)
    facts = {"format": FORMAT, "lowercase": converted.lowercase, "special_ids": converted.special_ids,
             "source_sequence_length": converted.max_positions, "quantization": quantization}
    if isinstance(source, (str, os.PathLike)):
        from keras_transformer.languages import model_languages

        languages = model_languages(os.fspath(source))
        if languages:
            facts["languages"] = {"source": languages[0], "target": languages[1]}
    with open(os.path.join(staging, METADATA_FILE), "w") as f:
        json.dump(facts, f, indent=2)
    if os.path.isdir(output_dir):
        shutil.rmtree(output_dir)
    os.replace(staging, output_dir)
    return output_dir


def _is_ctranslate2_model(path):
    return os.path.exists(os.path.join(path, "model.bin")) and os.path.exists(os.path.join(path, METADATA_FILE))


def _check_output(source, output_dir, overwrite):
    """Refuse to write where files would be lost: the source itself, a file,
    a folder of other files, or a CTranslate2 model without `overwrite`."""
    if isinstance(source, (str, os.PathLike)) and os.path.exists(output_dir) and \
            os.path.samefile(os.fspath(source), output_dir):
        raise ValueError(f"the output folder {output_dir} is the model being converted; choose another folder.")
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"{output_dir} is a file; the output must be a folder.")
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        if not _is_ctranslate2_model(output_dir):
            raise ValueError(f"{output_dir} holds files but no CTranslate2 model; choose an empty or new "
                             "folder (overwrite replaces only a CTranslate2 model folder).")
        if not overwrite:
            raise FileExistsError(f"{output_dir} already holds a CTranslate2 model; pass --overwrite "
                                  "(overwrite=True in Python) to replace it, or choose another folder.")


def _read_source(source, which):
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.exists(os.path.join(path, "saved_model.pb")):
            return read_saved_model(path)
        if os.path.exists(os.path.join(path, "config.json")):
            from keras_transformer.training import load_run

            model, src, tgt, _ = load_run(path, which=which)
            return _from_model(model, src, tgt)
        raise ValueError(f"{path} is neither a run folder (config.json) nor a SavedModel "
                         "(saved_model.pb).")
    if all(hasattr(source, name) for name in ("model", "src_tokenizer", "tgt_tokenizer")):
        return _from_model(source.model, source.src_tokenizer, source.tgt_tokenizer)
    raise ValueError(f"export_ctranslate2 takes a run folder, a SavedModel folder or a Translator; "
                     f"got {type(source).__name__}.")


class CTranslate2Translator:
    """Strings in, strings out, with a model written by `export_ctranslate2`.

    Input lines get `Translator`'s normalisation (`prepare_text`), are cut
    to the source length limit (the end id included), and decode with
    CTranslate2's beam search; the unknown, pad and start tokens are never
    emitted. CTranslate2's length penalty divides a finished hypothesis's
    log-probability by `length ** length_penalty` (not the GNMT form of
    `keras_transformer.decoding`).

    Args:
        path: folder written by `export_ctranslate2`.
        device: `"cpu"` or `"cuda"`.
        compute_type: CTranslate2's compute type (`"default"`, `"int8"`,
            `"float32"`, ...).
        intra_threads: threads per translation (0: CTranslate2's default).
    """

    def __init__(self, path, device="cpu", compute_type="default", intra_threads=0):
        ctranslate2 = _require_ctranslate2()
        import sentencepiece

        if not _is_ctranslate2_model(path):
            raise FileNotFoundError(f"{path} is not a CTranslate2 model folder (model.bin and {METADATA_FILE}); "
                                    "make one with `keras-transformer export --format ctranslate2`.")
        with open(os.path.join(path, METADATA_FILE)) as f:
            self.metadata = json.load(f)
        # Exports of earlier versions name it source_max_length.
        self._source_sequence_length = (self.metadata.get("source_sequence_length")
                                        or self.metadata["source_max_length"])
        self.translator = ctranslate2.Translator(path, device=device, compute_type=compute_type,
                                                 intra_threads=intra_threads)
        self.src = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, SOURCE_MODEL))
        self.tgt = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, TARGET_MODEL))
        ids = self.metadata["special_ids"]
        self._suppressed = [[self.tgt.id_to_piece(ids[n])] for n in ("pad_id", "start_id")]

    def tokenize(self, lines):
        """SentencePiece pieces of each line, as `Translator` tokenizes it."""
        from keras_transformer.tokenizers.normalization import prepare_lines

        keep = self._source_sequence_length - 1
        texts = prepare_lines(list(lines), self.metadata["lowercase"])
        return [self.src.encode(text, out_type=str)[:keep] if text else [] for text in texts]

    def translate_pieces(self, pieces, beam_size=4, length_penalty=1.0, max_decoding_length=None,
                         max_batch_size=0):
        """CTranslate2's results for pre-tokenized input.

        `max_decoding_length` (default and maximum: the model's
        `sequence_length` less one, for the start token) caps the output
        tokens; where ours forces the end token at that limit, CTranslate2
        stops there.

        Raises:
            ValueError: for a `max_decoding_length` beyond the model's
                positions.
        """
        limit = self._source_sequence_length - 1
        if max_decoding_length is None:
            max_decoding_length = limit
        elif not 1 <= int(max_decoding_length) <= limit:
            raise ValueError(
                f"max_decoding_length={max_decoding_length} is outside [1, {limit}]: the model was trained "
                f"on {limit + 1} positions, one of them for the start token. Pass at most {limit}."
            )
        return self.translator.translate_batch(
            pieces, beam_size=beam_size, length_penalty=length_penalty,
            max_decoding_length=int(max_decoding_length),
            disable_unk=True, suppress_sequences=self._suppressed, max_batch_size=max_batch_size,
        )

    def translate(self, lines, beam_size=4, length_penalty=1.0, max_decoding_length=None):
        """Translations of `lines` (list of str), one str each.

        Raises:
            TypeError: for one string instead of a list (wrap it: `[text]`).
        """
        if isinstance(lines, (str, bytes)):
            raise TypeError("translate takes a list of sentences, not one string; wrap it as [text].")
        pieces = self.tokenize(lines)
        out = [""] * len(pieces)
        todo = [i for i, p in enumerate(pieces) if p]
        if todo:
            results = self.translate_pieces([pieces[i] for i in todo], beam_size, length_penalty,
                                            max_decoding_length)
            for i, result in zip(todo, results):
                out[i] = self.tgt.decode(result.hypotheses[0]).strip()
        return out
