"""The exported SavedModel: strings in, strings out, core + tensorflow-text ops.

TensorFlow backend only (the Translator and tokenizers are TensorFlow).
"""

import json
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
if keras.backend.backend() != "tensorflow":
    pytest.skip("export needs the tensorflow backend", allow_module_level=True)

from keras_transformer import Translator  # noqa: E402
from keras_transformer import build_transformer  # noqa: E402
from keras_transformer.data.synthetic import make_synthetic_corpus  # noqa: E402
from keras_transformer.export import TENSORFLOW_TEXT_OPS  # noqa: E402
from keras_transformer.export import export_translator  # noqa: E402
from keras_transformer.export import saved_model_op_types  # noqa: E402
from keras_transformer.tokenizers import train_subword_tokenizer  # noqa: E402

INPUTS = ["A dog runs in the park.", "Two old women read.", "The child sleeps."]

LOADER = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401 -- what TF Serving links
assert "keras_transformer" not in sys.modules
out = {}
for name in sys.argv[1:]:
    serve = tf.saved_model.load(name).signatures["serving_default"]
    result = {}
    for key, batch in (("one", ["A dog runs in the park."]), ("three", %r), ("empty", [])):
        o = serve(text=tf.constant(batch, tf.string))
        assert o["translation"].dtype == tf.string and o["score"].dtype == tf.float32
        result[key] = [t.decode("utf-8") for t in o["translation"].numpy()]
        result[key + "_shape"] = list(o["translation"].shape)
    out[name] = result
print("JSON" + json.dumps(out))
""" % (INPUTS,)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    en, de = make_synthetic_corpus(600, seed=1)
    src = train_subword_tokenizer(en, 150)
    tgt = train_subword_tokenizer(de, 180)
    keras.utils.set_random_seed(0)
    model = build_transformer(
        src.vocab_size, tgt.vocab_size, num_layers=1, d_model=32, num_heads=4, dff=64,
        dropout_rate=0.0, sequence_length=12,
    )
    tied = build_transformer(
        src.vocab_size, tgt.vocab_size, num_layers=1, d_model=32, num_heads=4, dff=64,
        dropout_rate=0.0, sequence_length=12, tie_embeddings="target",
    )
    root = tmp_path_factory.mktemp("export")
    translators = {
        "greedy": Translator(model, src, tgt, beam_size=1),
        "beam": Translator(model, src, tgt, beam_size=3),
        # The output projection is the decoder embedding (section 3.4).
        "tied": Translator(tied, src, tgt, beam_size=3),
    }
    # The beam export records its language pair; the others record none.
    paths = {name: export_translator(t, str(root / name), languages=("en", "de") if name == "beam" else None)
             for name, t in translators.items()}
    return translators, paths


def test_c15_ops_are_core_or_tensorflow_text(exported):
    """C15: every op in both exports is core TF or one of the documented tf-text ops."""
    _, paths = exported
    ops = {name: saved_model_op_types(path) for name, path in paths.items()}
    # One process for every export (each start imports TensorFlow).
    script = (
        "import json, sys\n"
        "from tensorflow.python.framework import op_def_registry\n"
        "ops = json.loads(sys.argv[1])\n"
        "print(json.dumps({n: [o for o in found if op_def_registry.get(o) is None] for n, found in ops.items()}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(ops)], capture_output=True, text=True, check=True
    )
    not_core = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(not_core) == sorted(paths)
    for name, path in paths.items():
        assert set(not_core[name]) <= set(TENSORFLOW_TEXT_OPS), (name, not_core[name])
        assert "SentencepieceOp" in ops[name]
        with open(os.path.join(path, "keras_transformer.json")) as f:
            assert json.load(f)["custom_ops"]["tensorflow_text"] == list(TENSORFLOW_TEXT_OPS)


def test_read_saved_model_reads_the_variables_that_loading_restores(exported):
    """`read_saved_model` reads the variables from the checkpoint without
    restoring the SavedModel's functions (3.7 s against 0.12 s for the
    shipped en-de): names and values are those of
    `tf.saved_model.load(path).variables` (as float32), for float32 exports
    and the float16-stored shipped model with its transposed output table."""
    from keras_transformer.loading import read_saved_model

    _, paths = exported
    shipped = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "saved_models", "multi30k-en-de")
    for path in [*paths.values(), shipped]:
        want = {v.name.rsplit(":", 1)[0]: v.numpy() for v in tf.saved_model.load(path).variables}
        got = read_saved_model(path).weights  # float32 arrays
        assert sorted(got) == sorted(want) and len(want) > 10
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value.astype("float32"), err_msg=name)
    assert any(name.endswith("output_kernel_transposed") for name in got)
    assert {value.dtype for value in want.values()} == {np.dtype("float16")}  # the shipped model's


@pytest.mark.parametrize("graph, variables", [("greedy", "tied"), ("tied", "greedy")])
def test_read_saved_model_refuses_the_variables_of_another_export(exported, tmp_path, graph, variables):
    """A SavedModel whose `variables/` come from another export (the tied
    model has one table fewer, so the object graphs differ) is a clear
    ValueError naming a variable, never weights read from the wrong tensors."""
    import shutil

    from keras_transformer.loading import read_saved_model

    _, paths = exported
    mixed = tmp_path / "mixed"
    shutil.copytree(paths[graph], mixed)
    shutil.rmtree(mixed / "variables")
    shutil.copytree(os.path.join(paths[variables], "variables"), mixed / "variables")
    with pytest.raises(ValueError, match=r"the variable '.+' of saved_model.pb .+ do not belong together"):
        read_saved_model(str(mixed))


def test_metadata_gives_the_declared_signature_shapes(exported):
    """`keras_transformer.json` states each output's declared shape (here
    `target_ids` is `[None, 12]`, the decoder's `sequence_length`), and the inputs
    are rank-open, as the README says."""
    _, paths = exported
    for path in paths.values():
        with open(os.path.join(path, "keras_transformer.json")) as f:
            meta = json.load(f)["signatures"]
        loaded = tf.saved_model.load(path)
        assert set(meta) == set(loaded.signatures)
        for name, spec in meta.items():
            signature = loaded.signatures[name]
            for key, text in spec["outputs"].items():
                dims = text.split("[", 1)[1].split("]", 1)[0].split(", ")
                want = [None if dim == "None" else int(dim) for dim in dims]
                assert signature.structured_outputs[key].shape.as_list() == want, (name, key)
            inputs = signature.structured_input_signature[1]
            assert set(inputs) == set(spec["inputs"])
            assert all(inputs[key].shape.rank is None for key in inputs)
        assert meta["translate_ids"]["outputs"]["target_ids"] == "int32 [None, 12]"


def test_c15_c16_fresh_process_with_only_tensorflow_and_text(exported):
    """C15/C16: greedy and beam exports load and translate in a fresh process
    that imports only tensorflow and tensorflow_text, equal to the eager run."""
    translators, paths = exported
    result = subprocess.run(
        [sys.executable, "-c", LOADER, *paths.values()],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = [l for l in result.stdout.splitlines() if l.startswith("JSON")][-1]
    out = json.loads(line[4:])
    for name, translator in translators.items():
        got = out[paths[name]]
        assert got["one_shape"] == [1] and got["three_shape"] == [3] and got["empty_shape"] == [0]
        want = [t.decode("utf-8") for t in translator(INPUTS).numpy()]
        assert got["three"] == want
        assert got["one"] == want[:1]
        for text in got["three"]:
            for special in ("<s>", "</s>", "<pad>"):
                assert special not in text


def test_c15_without_tensorflow_text_the_error_names_the_op(exported):
    """C15: a loader without tensorflow-text fails naming the missing op."""
    _, paths = exported
    script = "import tensorflow as tf, sys; tf.saved_model.load(sys.argv[1])"
    result = subprocess.run([sys.executable, "-c", script, paths["beam"]], capture_output=True, text=True)
    assert result.returncode != 0
    assert any(op in result.stderr for op in TENSORFLOW_TEXT_OPS), result.stderr[-2000:]


def test_c17_scalar_vector_empty_string_and_empty_batch(exported):
    """C17: scalar in -> scalar out; n in -> n out; "" and [] handled."""
    translators, _ = exported
    translator = translators["beam"]
    scalar = translator(tf.constant("ein Hund"))
    assert scalar.shape == () and scalar.dtype == tf.string
    assert translator(["ein Hund"]).shape == (1,)
    empty_string = translator([""])
    assert empty_string.shape == (1,) and empty_string.dtype == tf.string
    assert translator(tf.constant([], tf.string)).shape == (0,)
    assert translator("A dog.").numpy() == translator(["A dog."]).numpy()[0]


def test_c17_saved_signatures_take_a_scalar_and_refuse_a_matrix_clearly(exported):
    """A client that sends one string rather than a batch gets its
    translation (a batch of one), from both string signatures; a rank-2
    tensor gets an error that says what to send, not a crash in the graph."""
    translators, paths = exported
    loaded = tf.saved_model.load(paths["beam"])
    serve = loaded.signatures["serving_default"]
    want = translators["beam"]("A dog runs.").numpy()
    out = serve(text=tf.constant("A dog runs."))
    assert out["translation"].shape == (1,) and out["translation"].numpy()[0] == want
    assert out["score"].shape == (1,)
    n_best = loaded.signatures["translate_n_best"](text=tf.constant("A dog runs."))
    assert n_best["translations"].shape == (1, 3) and n_best["translations"].numpy()[0, 0] == want
    with pytest.raises(tf.errors.InvalidArgumentError, match="1-D batch of strings"):
        serve(text=tf.constant([["A dog runs."]]))


def test_string_signatures_refuse_bytes_that_are_not_utf8(exported):
    """A client that sent Latin-1 (b"Caf\\xe9") got a translation of
    "Caf\\ufffd": the byte became U+FFFD in the graph and the word was
    translated without it. Both string signatures now name the elements;
    valid UTF-8, U+FFFD itself included, translates as before."""
    translators, paths = exported
    loaded = tf.saved_model.load(paths["beam"])
    latin1 = tf.constant(["A dog.", "Caf\xe9 au lait".encode("latin-1"), b"ok \xed\xa0\x80"])
    for name in ("serving_default", "translate_n_best"):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"must be UTF-8.*not valid UTF-8:.*\[1 2\]"):
            loaded.signatures[name](text=latin1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be UTF-8"):
        translators["beam"](tf.constant(b"\xff"))
    fine = ["Café au lait", "a \ufffd b", "ein Hund"]
    out = loaded.signatures["serving_default"](text=tf.constant(fine))["translation"].numpy()
    assert list(out) == list(translators["beam"](fine).numpy())


def test_id_signature_takes_a_row_and_refuses_bad_ids_clearly(exported):
    """`translate_ids`: one row of ids (rank 1) is a batch of one with the
    batch's answer; a scalar, rank 3, an id past the vocabulary, a
    negative id and a row without its end id each get an error naming the
    problem, not a graph crash ("slice index 1 of dimension 0 out of
    bounds", "indices ... not in") or 60 tokens of repetition."""
    translators, paths = exported
    translator = translators["beam"]
    loaded = tf.saved_model.load(paths["beam"])
    by_ids = loaded.signatures["translate_ids"]
    row = translator.encode_source(tf.constant(["A dog runs."]))[0]
    one = by_ids(source_ids=row)
    batch = by_ids(source_ids=row[None])
    assert one["target_ids"].shape[0] == 1
    np.testing.assert_array_equal(one["target_ids"].numpy(), batch["target_ids"].numpy())
    np.testing.assert_allclose(one["score"].numpy(), batch["score"].numpy(), atol=1e-6)
    # Padding after the end id, and rows of padding alone, are fine.
    padded = by_ids(source_ids=tf.concat([row, tf.zeros([3], row.dtype)], 0)[None])
    np.testing.assert_array_equal(padded["target_ids"].numpy(), batch["target_ids"].numpy())
    assert by_ids(source_ids=tf.zeros([2, 4], tf.int32))["target_ids"].shape[0] == 2
    vocab = translator.src_tokenizer.vocab_size
    for bad, message in [
        (tf.constant(5), "not a scalar"),
        (row[None, None], "flatten it first"),
        (tf.constant([[5, vocab, 3]]), rf"in \[0, {vocab}\)"),
        (tf.constant([[5, -1, 3]]), "must not be negative"),
        (tf.constant([[5, 6, 7]]), "rows must end with the end id 3"),
        (tf.constant([[5, 6, 3, 0], [5, 6, 0, 0]]), "rows must end with the end id 3"),
        # Found by a new-user trial: these decoded with ordinary scores.
        (tf.constant([[5, 0, 6, 3]]), "padding before its end id"),
        (tf.constant([[5, 3, 6, 3]]), "a second end id"),
        (tf.constant([[2, 5, 3]]), "the start id 2"),
    ]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            by_ids(source_ids=bad)


def test_c09_long_source_is_truncated_by_the_documented_rule(exported):
    """C09: a source longer than sequence_length is cut to sequence_length - 1 tokens + end."""
    translators, _ = exported
    translator = translators["greedy"]
    long_text = " ".join(["the dog runs in the park"] * 6)
    ids = translator.encode_source(tf.constant([long_text])).numpy()
    assert ids.shape == (1, translator.source_sequence_length)
    assert ids[0, -1] == translator.src_tokenizer.end_id
    full = translator.src_tokenizer.tokenize(tf.constant([long_text])).to_list()[0]
    np.testing.assert_array_equal(ids[0, :-1], full[: translator.source_sequence_length - 1])
    assert translator([long_text]).shape == (1,)
    # translate_lines says so, as the command line does; a short line alone does not warn.
    limit = translator.source_sequence_length - 1
    for lines in ([long_text, "A dog."], iter([long_text, "A dog."])):
        with pytest.warns(UserWarning, match=rf"1 of 2 sentences are longer than the model's source limit of {limit} "):
            assert len(translator.translate_lines(lines)) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translator.translate_lines(["A dog."])


def test_float16_weight_storage_halves_variables_and_keeps_translations(exported, tmp_path):
    """Export with float16 storage: float16 variables, float32 compute, and the
    reloaded SavedModel translates like the in-process float16-storage copy."""
    from keras_transformer.export import with_weights_dtype

    translators, _ = exported
    translator = translators["greedy"]
    path = export_translator(translator, str(tmp_path / "f16"), weights_dtype="float16")
    copy = with_weights_dtype(translator.model, "float16")
    assert {v.dtype for v in copy.weights} == {"float16"}
    inputs = {"encoder_inputs": np.array([[5, 6, 3]]), "decoder_inputs": np.array([[2, 7]])}
    np.testing.assert_allclose(copy(inputs).numpy(), translator.model(inputs).numpy(), atol=5e-3)
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    dtypes = {d for n, d in reader.get_variable_to_dtype_map().items() if "OBJECT_GRAPH" not in n}
    assert dtypes == {tf.float16}
    loaded = tf.saved_model.load(path)
    want = Translator(copy, translator.src_tokenizer, translator.tgt_tokenizer, beam_size=1)(INPUTS)
    got = loaded.signatures["serving_default"](text=tf.constant(INPUTS))["translation"]
    assert got.numpy().tolist() == want.numpy().tolist()
    with pytest.raises(ValueError, match="weights_dtype"):
        export_translator(translator, str(tmp_path / "bad"), weights_dtype="int4")


@pytest.mark.parametrize("name", ["tied"])
def test_int8_weight_storage_serves_the_dequantized_model(exported, tmp_path, name):
    """Issue 18: `weights_dtype="int8"` stores each matrix as int8 with a
    per-channel scale; the SavedModel translates exactly as the model whose
    matrices are `q * scale` does in process, with core ops only."""
    from keras_transformer.quantization import quantize_int8

    translators, paths = exported
    translator = translators[name]
    path = export_translator(translator, str(tmp_path / "int8"), weights_dtype="int8")
    reader = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    # Matrices are int8; their scales keep the reduced axis with size 1.
    matrices = {n for n, shape in shapes.items() if "OBJECT_GRAPH" not in n and len(shape) >= 2 and min(shape) > 1}
    assert matrices and all(dtypes[n] == tf.int8 for n in matrices)

    def stored_bytes(folder):
        return os.path.getsize(os.path.join(folder, "variables", "variables.data-00000-of-00001"))

    assert stored_bytes(path) < 0.45 * stored_bytes(paths[name])
    ops = set(saved_model_op_types(path))
    assert ops <= set(saved_model_op_types(paths[name])) | {"Cast", "Mul"}

    rebuilt = keras.models.clone_model(translator.model)
    values = []
    for variable in translator.model.weights:
        value = variable.numpy()
        if value.ndim >= 2:
            q, scale = quantize_int8(value, -1 if variable.path.endswith("embeddings") else 0)
            value = q.astype("float32") * scale
        values.append(value)
    rebuilt.set_weights(values)
    assert not np.array_equal(values[0], translator.model.weights[0].numpy())
    want = Translator(rebuilt, translator.src_tokenizer, translator.tgt_tokenizer,
                      search=translator.search)(INPUTS).numpy().tolist()
    loaded = tf.saved_model.load(path)
    got = loaded.signatures["serving_default"](text=tf.constant(INPUTS))["translation"].numpy().tolist()
    assert got == want
    ids = loaded.signatures["translate_ids"](source_ids=tf.constant([[5, 6, 3]]))["target_ids"]
    assert ids.dtype == tf.int32
    # A model cannot be rebuilt from it (ensembles, CTranslate2, another
    # search): a clear error, not KeyError 'encoder_embedding/...' (a new-user trial).
    from keras_transformer.loading import translator_from_saved_model

    with pytest.raises(ValueError, match=r"stores its matrices in int8 .* Use the run folder"):
        translator_from_saved_model(path, beam_size=2)


def test_n_best_and_token_id_signatures(exported):
    """The n-best signature returns beam_size distinct, sorted hypotheses whose
    first equals serving_default; the id signature equals tokenizing by hand."""
    translators, paths = exported
    loaded = tf.saved_model.load(paths["beam"])
    default = loaded.signatures["serving_default"](text=tf.constant(INPUTS))
    n_best = loaded.signatures["translate_n_best"](text=tf.constant(INPUTS))
    assert n_best["translations"].shape == (3, 3) and n_best["scores"].shape == (3, 3)
    assert n_best["translations"][:, 0].numpy().tolist() == default["translation"].numpy().tolist()
    np.testing.assert_allclose(n_best["scores"][:, 0].numpy(), default["score"].numpy(), atol=1e-5)
    assert (np.diff(n_best["scores"].numpy(), axis=1) <= 1e-6).all()
    translator = translators["beam"]
    source_ids = translator.encode_source(tf.constant(INPUTS))
    by_ids = loaded.signatures["translate_ids"](source_ids=source_ids)
    texts = translator.tgt_tokenizer.detokenize(by_ids["target_ids"]).numpy().tolist()
    assert texts == default["translation"].numpy().tolist()
    # An over-long id row is cut to sequence_length - 1 ids + end, like text input.
    long_ids = tf.concat([source_ids[:1, :-1]] * 10 + [source_ids[:1, -1:]], axis=1)
    long_text = " ".join([INPUTS[0]] * 10)
    got = loaded.signatures["translate_ids"](source_ids=long_ids)["target_ids"]
    want = translator.translate_ids(translator.encode_source(tf.constant([long_text])))[0][:, 0]
    assert long_ids.shape[1] > translator.source_sequence_length
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_blank_input_gives_empty_translation_and_bad_pairings_are_refused(exported):
    """A blank source translates to ""; swapped tokenizers and a bare string
    instead of a list are clear errors, not crashes or per-character output."""
    translators, _ = exported
    translator = translators["beam"]
    out = translator(["", "   ", INPUTS[0]]).numpy().tolist()
    assert out[:2] == [b"", b""] and out[2] != b""
    with pytest.raises(ValueError, match="tokenizers the model was trained with"):
        Translator(translator.model, translator.tgt_tokenizer, translator.src_tokenizer)
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate_lines("A dog runs.")


@pytest.mark.parametrize("settings, message", [
    ({"length_penalty": float("nan")}, "finite number >= 0"),
    ({"length_penalty": -1.0}, "finite number >= 0"),
    ({"beam_size": 1000}, r"exceeds the target vocabulary size \d+: pass a smaller beam"),
    ({"max_length": 0}, r"`max_length` must be a whole number of output tokens >= 1; got 0"),
    ({"max_length": 2.5}, r"`max_length` must be a whole number of output tokens >= 1; got 2.5"),  # was cut to 2
    ({"length_ratio": 0.0}, "finite number > 0"),
    ({"length_ratio": float("nan")}, "finite number > 0"),
    ({"length_ratio": True}, r"`length_ratio` must be a finite number > 0; got True"),  # was read as 1.0
    ({"length_ratio": "abc"}, r"`length_ratio` must be a finite number > 0; got 'abc'"),  # float()'s error
])
def test_bad_decoding_settings_are_refused_when_the_translator_is_made(exported, settings, message):
    """Before, these passed the constructor and failed at the first call,
    wrapped in a dump of the traced function, or (NaN) translated to
    garbage."""
    translator = exported[0]["beam"]
    with pytest.raises(ValueError, match=message):
        Translator(translator.model, translator.src_tokenizer, translator.tgt_tokenizer, **settings)


def test_translate_ids_gives_blank_rows_the_empty_output(exported):
    """A row of only the end id or only padding is a blank source: the end
    id alone and score 0, as a blank string gets "" and 0 from
    `serving_default` (it used to get a made-up sentence). Other rows are
    unchanged."""
    translators, paths = exported
    translator = translators["beam"]
    loaded = tf.saved_model.load(paths["beam"])
    real = translator.encode_source(tf.constant(INPUTS[:1]))[0].numpy()
    end, pad = translator.src_tokenizer.end_id, translator.src_tokenizer.pad_id
    rows = np.full((3, len(real)), pad, "int32")
    rows[0, 0] = end
    rows[2] = real
    out = loaded.signatures["translate_ids"](source_ids=tf.constant(rows))
    tokens, scores = out["target_ids"].numpy(), out["score"].numpy()
    empty = np.full(tokens.shape[1], translator.tgt_tokenizer.pad_id)
    empty[0] = translator.tgt_tokenizer.end_id
    np.testing.assert_array_equal(tokens[:2], [empty, empty])
    np.testing.assert_array_equal(scores[:2], [0.0, 0.0])
    solo = loaded.signatures["translate_ids"](source_ids=tf.constant(real[None]))
    np.testing.assert_array_equal(tokens[2], solo["target_ids"].numpy()[0])
    text = loaded.signatures["serving_default"](text=tf.constant(["", INPUTS[0]]))
    assert text["translation"].numpy()[0] == b"" and text["score"].numpy()[0] == 0.0
    assert translator.tgt_tokenizer.detokenize(tokens[:1]).numpy()[0] == b""


@pytest.mark.parametrize("transposed", [False, True])
def test_xla_compiled_search_gives_the_same_translations(exported, transposed):
    """jit_compile=True (XLA, sources padded to a multiple of 8) changes speed
    only; so does a stored transposed output table."""
    translators, _ = exported
    for name, translator in translators.items():
        fast = Translator(translator.model, translator.src_tokenizer, translator.tgt_tokenizer,
                          beam_size=translator.beam_size, jit_compile=True,
                          transposed_output_table=transposed)
        assert fast(INPUTS).numpy().tolist() == translator(INPUTS).numpy().tolist(), name
    # XLA dropped the search's id checks: an id outside the vocabulary decoded
    # as the table's last row (a new-user trial); now as without XLA, an error.
    vocab = fast.src_tokenizer.vocab_size
    for bad in (vocab, -5):
        with pytest.raises(ValueError, match=rf"`source_ids` must be token ids in \[0, {vocab}\)"):
            fast.translate_ids(tf.constant([[bad, 3]]))
    # Float or bool ids were a StagingError from inside the search's trace
    # (a new-user trial); now the id check's error, with and without XLA.
    for search in (fast, translator):
        for ids in (np.array([[5.0, 3.0]]), np.array([[True, False]])):
            with pytest.raises(TypeError, match=f"`source_ids` must be integer token ids; got {ids.dtype}"):
                search.translate_ids(ids)


@pytest.mark.parametrize("weights_dtype", ["float32", "float16"])
def test_tied_export_stores_the_transposed_table_and_its_search_reads_it(exported, tmp_path, weights_dtype):
    """A tied output projection (section 3.4) is exported with a copy of the
    token table's transpose, in the storage dtype, equal to it value for
    value; the serving search multiplies by that copy (zeroing it changes
    the translations, restoring it brings them back); an untied model and
    the int8 export store none."""
    translators, paths = exported
    translator = translators["tied"]
    path = export_translator(translator, str(tmp_path / weights_dtype), weights_dtype=weights_dtype)
    loaded = tf.saved_model.load(path)
    copies = [v for v in loaded.variables if v.name.startswith("output_kernel_transposed")]
    assert len(copies) == 1
    copy = copies[0]
    table = translator.model.decoder_embedding.token_embedding.embeddings.numpy()
    assert copy.dtype == weights_dtype and copy.shape == (table.shape[1], table.shape[0])
    np.testing.assert_array_equal(copy.numpy(), table.T.astype(weights_dtype))
    with open(os.path.join(path, "keras_transformer.json")) as f:
        assert json.load(f)["decoding"]["transposed_output_table"] is True
    serve = loaded.signatures["serving_default"]
    want = serve(text=tf.constant(INPUTS))["translation"].numpy().tolist()
    assert want == translator(INPUTS).numpy().tolist()
    saved = copy.numpy()
    copy.assign(np.zeros_like(saved))
    assert serve(text=tf.constant(INPUTS))["translation"].numpy().tolist() != want
    copy.assign(saved)
    assert serve(text=tf.constant(INPUTS))["translation"].numpy().tolist() == want
    for name, dtype in (("beam", "float32"), ("tied", "int8")):
        other = export_translator(translators[name], str(tmp_path / f"{name}-{dtype}"), weights_dtype=dtype)
        assert not [v for v in tf.saved_model.load(other).variables if "transposed" in v.name]


def test_transposed_output_table_holds_the_transpose_and_fits_only_tied_models(exported):
    """`Translator(transposed_output_table=True)` copies the table's
    transpose once and translates as the plain one. `TransformerParts(output_kernel=...)` refuses an untied model and
    a copy of another shape."""
    from keras_transformer.decoding import TransformerParts
    from keras_transformer.decoding import transposed_output_table

    translators, _ = exported
    plain = translators["tied"]
    model = plain.model
    fast = Translator(model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3,
                      transposed_output_table=True)
    assert fast(INPUTS).numpy().tolist() == plain(INPUTS).numpy().tolist()
    table = model.decoder_embedding.token_embedding.embeddings
    np.testing.assert_array_equal(fast._output_kernel.numpy(), table.numpy().T)
    untied = translators["beam"].model
    assert transposed_output_table(untied) is None
    untied_fast = Translator(untied, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3,
                             transposed_output_table=True)
    assert untied_fast._output_kernel is None
    with pytest.raises(ValueError, match="tie_embeddings='none'"):
        TransformerParts(untied, output_kernel=transposed_output_table(model))
    with pytest.raises(ValueError, match=r"must have shape \(32, "):
        TransformerParts(model, output_kernel=keras.Variable(np.zeros((32, 7), "float32")))


@pytest.mark.parametrize("change", ["lora", "int8"])
def test_a_table_changed_after_its_transposed_copy_is_refused(change):
    """The transposed copy is a snapshot of a plain table: once the table is
    given LoRA weights or quantized, the copy no longer equals what the
    model's projection computes, so `decoding_weights` refuses it with a
    ValueError that says to build the parts again, rather than decoding
    with stale logits. Built again, the parts decode the changed model.
    A tied table cannot be quantized at all (the projection reads it in
    float): that ValueError comes first."""
    from keras_transformer.decoding import TransformerParts
    from keras_transformer.decoding import transposed_output_table

    keras.utils.set_random_seed(0)
    model = build_transformer(40, 40, num_layers=1, d_model=8, num_heads=2, dff=16,
                              sequence_length=8, tie_embeddings="all")
    parts = TransformerParts(model, output_kernel=transposed_output_table(model))
    assert parts.decoding_weights()["logits"][0].shape == (8, 40)
    table = model.decoder_embedding.token_embedding
    if change == "int8":  # a tied table cannot be quantized: the projection needs it in float
        model.quantize("int8")
        assert transposed_output_table(model) is None
        with pytest.raises(ValueError, match=r"quantized \(int8\) and also the tied output projection"):
            parts.decoding_weights()
        return
    table.enable_lora(2)
    assert transposed_output_table(model) is None
    with pytest.raises(ValueError, match="quantized or given LoRA weights after `output_kernel`"):
        parts.decoding_weights()
    # A LoRA update that moves the logits; parts built again decode it.
    table.lora_embeddings_b.assign(np.full(table.lora_embeddings_b.shape, 0.5, "float32"))
    again = TransformerParts(model, output_kernel=transposed_output_table(model))
    assert again.output_kernel is None
    source = np.array([[5, 6, 7, 0], [9, 8, 0, 0]], "int32")
    target = np.array([[1, 4, 5], [1, 9, 3]], "int32")
    full = keras.ops.convert_to_numpy(again.decode_uncached(source, target))
    encoder_outputs, mask = again.encode(source)
    cross = again.cross_caches(encoder_outputs)
    caches = again.empty_self_caches(2, again.target_sequence_length, "float32")
    weights = again.decoding_weights()
    for t in range(target.shape[1]):
        logits, caches = again.decode_step(target[:, t], t, caches, cross, mask, weights=weights)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(logits), full[:, t], atol=1e-5)


def test_xla_for_small_batches_and_the_graph_for_larger_ones(exported, tmp_path):
    """xla_max_batch_size=2: batches of one or two sentences take the XLA
    search, larger ones the graph search; the translations are the plain
    ones either way, in the Translator and in its export."""
    translators, _ = exported
    plain = translators["beam"]
    hybrid = Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3,
                        jit_compile=True, xla_max_batch_size=2)
    three = plain.encode_source(tf.constant(INPUTS))
    for rows, xla_traces in ((three, 0), (three[:2], 1), (three[:1], 2)):
        tokens, scores = hybrid.translate_ids(rows)
        want_tokens, want_scores = plain.translate_ids(rows)
        assert hybrid._search.experimental_get_tracing_count() == xla_traces  # which path ran
        np.testing.assert_array_equal(tokens.numpy(), want_tokens.numpy())
        np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-5, atol=1e-5)
    path = export_translator(hybrid, str(tmp_path / "hybrid"))
    with open(os.path.join(path, "keras_transformer.json")) as f:
        metadata = json.load(f)
    decoding = metadata["decoding"]
    assert decoding["jit_compile"] is True and decoding["xla_max_batch_size"] == 2
    assert metadata["tf_serving_flags"] == ["--xla_cpu_compilation_enabled=true"]
    assert metadata["tf_serving_env"] == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    serve = tf.saved_model.load(path).signatures["serving_default"]
    for batch in (INPUTS[:1], INPUTS):
        got = serve(text=tf.constant(batch))["translation"].numpy().tolist()
        assert got == plain(batch).numpy().tolist()


@pytest.mark.parametrize("settings, message", [
    (dict(xla_max_batch_size=4), "pass it with jit_compile=True"),
    (dict(jit_compile=True, xla_max_batch_size=0), "`xla_max_batch_size` must be a whole number of sentences >= 1; got 0"),
    (dict(jit_compile=True, xla_max_batch_size=2.7), "a whole number of sentences >= 1; got 2.7"),  # was cut to 2
])
def test_bad_xla_max_batch_size_is_refused(exported, settings, message):
    plain = exported[0]["beam"]
    with pytest.raises(ValueError, match=message):
        Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3, **settings)


MORE_INPUTS = INPUTS + ["A man rides a red bike.", "Children play.", "The women walk home.", "A cat."]


def test_parallel_searches_decode_interleaved_parts_and_stitch_them_back(exported):
    """`_in_parallel` orders the sentences by source length and hands each
    search every p-th of them, then puts the outputs back in the batch's
    order; a batch smaller than p is one search."""
    plain = exported[0]["beam"]
    translator = Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3,
                            parallel_searches=3)
    seen = []

    def search(source_ids, n_best):  # a sentence's "output" is its first id, repeated
        seen.append(source_ids[:, 0].numpy().tolist())
        tokens = tf.tile(source_ids[:, None, :1], [1, n_best, 5])
        return tokens, tf.cast(source_ids[:, :n_best], tf.float32)

    # Row r starts with id r + 1 and holds lengths[r] ids, then padding (0).
    lengths = [3, 1, 4, 2, 3, 1, 2]
    ids = np.zeros((7, 4), np.int32)
    for row, length in enumerate(lengths):
        ids[row, :length] = row + 1
    ids = tf.constant(ids)
    tokens, scores = translator._in_parallel(search, ids, 2)
    # By length (stable): rows 1, 5, 3, 6, 0, 4, 2; every third of them per search.
    assert seen == [[2, 7, 3], [6, 1], [4, 5]]
    np.testing.assert_array_equal(tokens.numpy(), np.tile(ids.numpy()[:, None, :1], [1, 2, 5]))
    np.testing.assert_array_equal(scores.numpy(), ids.numpy()[:, :2])
    seen.clear()
    translator._in_parallel(search, ids[:2], 1)
    assert seen == [[1, 2]]


@pytest.mark.parametrize("name", ["beam", "greedy"])
def test_parallel_searches_give_the_same_translations(exported, name, tmp_path):
    """parallel_searches=2 and 3: the tokens and scores of the one search,
    for batches larger and smaller than the number of parts, n-best lists
    included, in the Translator and in its export (whose metadata says so)."""
    plain = exported[0][name]
    ids = plain.encode_source(tf.constant(MORE_INPUTS))
    n_best = plain.beam_size
    for parts in (2, 3):
        split = Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer,
                           beam_size=plain.beam_size, parallel_searches=parts)
        for rows in (ids, ids[:2], ids[:1]):
            tokens, scores = split.translate_ids(rows, n_best=n_best)
            want_tokens, want_scores = plain.translate_ids(rows, n_best=n_best)
            np.testing.assert_array_equal(tokens.numpy(), want_tokens.numpy())
            np.testing.assert_allclose(scores.numpy(), want_scores.numpy(), rtol=1e-5, atol=1e-5)
    path = export_translator(split, str(tmp_path / "parallel"))
    with open(os.path.join(path, "keras_transformer.json")) as f:
        assert json.load(f)["decoding"]["parallel_searches"] == 3
    serve = tf.saved_model.load(path).signatures["serving_default"]
    got = serve(text=tf.constant(MORE_INPUTS))["translation"].numpy().tolist()
    assert got == plain(MORE_INPUTS).numpy().tolist()


@pytest.mark.parametrize("settings, message", [
    (dict(parallel_searches=0), "whole number of search loops >= 1; got 0"),
    (dict(parallel_searches=1.5), "whole number of search loops >= 1; got 1.5"),
    (dict(parallel_searches="2"), "whole number of search loops >= 1; got '2'"),
    (dict(parallel_searches=2, jit_compile=True), "pass xla_max_batch_size too"),
])
def test_bad_parallel_searches_is_refused(exported, settings, message):
    plain = exported[0]["beam"]
    with pytest.raises(ValueError, match=message):
        Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3, **settings)


@pytest.mark.parametrize("beam_size", [2.5, "3", True, 0])
def test_a_beam_size_that_is_not_a_whole_number_is_refused(exported, beam_size):
    """`beam_size=2.5` was cut to a beam of 2 without a word, and "3" or
    True taken as 3 or 1."""
    plain = exported[0]["beam"]
    with pytest.raises(ValueError, match=r"`beam_size` must be a whole number >= 1; got "):
        Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=beam_size)


def test_wrong_objects_for_translator_and_export_are_clear_type_errors(exported, tmp_path):
    """A tokenizer's path instead of the tokenizer, or a model instead of a
    Translator, fail at once with what to pass, not with an AttributeError
    from inside; and an export into a folder of other files (a run folder)
    is refused before anything is written, while an earlier SavedModel is
    replaced."""
    plain = exported[0]["beam"]
    with pytest.raises(TypeError, match=r"`src_tokenizer` must be a tokenizer .*got str"):
        Translator(plain.model, "source.model", plain.tgt_tokenizer)
    with pytest.raises(TypeError, match=r"takes a keras_transformer.Translator, got Transformer"):
        export_translator(plain.model, str(tmp_path / "model"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.csv").write_text("epoch,loss\n")
    with pytest.raises(FileExistsError, match=r"holds files that are not a SavedModel's \(log.csv\)"):
        export_translator(plain, str(run))
    assert sorted(os.listdir(run)) == ["log.csv"]
    path = export_translator(plain, str(tmp_path / "again"))
    first = os.path.getmtime(os.path.join(path, "saved_model.pb"))
    os.utime(os.path.join(path, "saved_model.pb"), (first - 100, first - 100))
    export_translator(plain, path)
    assert os.path.getmtime(os.path.join(path, "saved_model.pb")) > first - 100


def test_parallel_searches_beside_xla_for_small_batches(exported):
    """jit_compile with xla_max_batch_size=2 and parallel_searches=2: small
    batches take XLA, larger ones two graph searches; same translations."""
    plain = exported[0]["beam"]
    hybrid = Translator(plain.model, plain.src_tokenizer, plain.tgt_tokenizer, beam_size=3,
                        jit_compile=True, xla_max_batch_size=2, parallel_searches=2)
    for batch in (MORE_INPUTS[:1], MORE_INPUTS):
        assert hybrid(batch).numpy().tolist() == plain(batch).numpy().tolist()


SAVED_MODEL_CLI = (
    "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; "
    "sys.argv[0] = 'saved_model_cli'; sys.exit(saved_model_cli.main())"
)


@pytest.mark.parametrize("name,weights_dtype", [("beam", "float32"), ("beam", "float16"), ("beam", "int8"),
                                                ("tied", "float16")])
def test_saved_model_cli_show_and_run_session_loader(exported, tmp_path, name, weights_dtype):
    """`saved_model_cli show` lists the signatures; `saved_model_cli run` loads
    the model with the TF1 session loader, the one TF Serving uses, and gives
    the same translation (a SavedModel tracking the Keras model object fails
    there with "Could not find variable"); the tied model's export holds the
    transposed output table too."""
    translators, paths = exported
    translator = translators[name]
    path = paths[name]
    if weights_dtype != "float32":
        path = export_translator(translator, str(tmp_path / weights_dtype), weights_dtype=weights_dtype)
    if (name, weights_dtype) == ("beam", "float32"):  # the same signatures in every export
        show = subprocess.run([sys.executable, "-c", SAVED_MODEL_CLI, "show", "--dir", path, "--all"],
                              capture_output=True, text=True, timeout=300)
        assert show.returncode == 0, show.stderr[-2000:]
        for signature in ("serving_default", "translate_n_best", "translate_ids", "inputs['text']",
                          "outputs['translation']"):
            assert signature in show.stdout
    run = subprocess.run(
        [sys.executable, "-c", SAVED_MODEL_CLI, "run", "--dir", path, "--tag_set", "serve",
         "--signature_def", "serving_default", "--input_exprs", f"text={INPUTS[:2]!r}"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = tf.saved_model.load(path).signatures["serving_default"]
    want = loaded(text=tf.constant(INPUTS[:2]))["translation"].numpy().tolist()
    # NumPy wraps a long array's repr across lines.
    assert "[" + " ".join(repr(t) for t in want) + "]" in " ".join(run.stdout.split())


def test_the_unknown_id_is_kept_out_of_translations_unless_allowed(exported):
    """With the unknown id's logit raised far above the rest, the default
    `Translator` never outputs it (no " ⁇ " in any served string); with
    `allow_unk=True` it does, and the export records the setting."""
    translators, paths = exported
    with open(os.path.join(paths["beam"], "keras_transformer.json")) as f:
        assert json.load(f)["decoding"]["allow_unk"] is False
    src, tgt = translators["greedy"].src_tokenizer, translators["greedy"].tgt_tokenizer
    keras.utils.set_random_seed(3)
    model = build_transformer(src.vocab_size, tgt.vocab_size, num_layers=1, d_model=32,
                              num_heads=4, dff=64, dropout_rate=0.0, sequence_length=12)
    kernel, bias = model.get_layer("logits").get_weights()
    bias[tgt.unk_id] += 50.0
    model.get_layer("logits").set_weights([kernel, bias])
    for beam_size in (1, 3):
        kept_out = Translator(model, src, tgt, beam_size=beam_size)
        texts = [t.decode("utf-8") for t in kept_out(INPUTS).numpy()]
        assert not any("\u2047" in text for text in texts), texts
        allowed = Translator(model, src, tgt, beam_size=beam_size, allow_unk=True)
        assert all("\u2047" in t.decode("utf-8") for t in allowed(INPUTS).numpy())


def test_attention_belongs_to_the_translation_that_is_returned(exported):
    """`Translator.attention` (behind `translate --plot-attention`) gives the
    translator's own translation, the beam search's with beam search (it was
    always the greedy one), and its weights: for greedy decoding the same as
    the search recorded; each row a distribution over the source."""
    from keras_transformer.decoding.greedy import greedy_search

    translators, _ = exported
    for name in ("beam", "greedy"):
        translator = translators[name]
        for text in INPUTS + ["", " \t "]:  # a blank source gave a made-up translation here
            found = translator.attention_scores(text)
            assert found["translation"] == translator([text]).numpy()[0].decode("utf-8")
            weights = found["weights"]
            assert weights.shape == (4, len(found["output_tokens"]), len(found["source_tokens"]))
            np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    greedy = translators["greedy"]
    source_ids = greedy.encode_source(tf.constant([INPUTS[1]]))
    _, _, recorded = greedy_search(greedy._parts, source_ids, return_attention_scores=True, **greedy._search_kwargs())
    found = greedy.attention_scores(INPUTS[1])
    n = len(found["output_tokens"])
    np.testing.assert_allclose(found["weights"], recorded.numpy()[0, :n].transpose(1, 0, 2), atol=1e-5)
    # The old names still answer, with a DeprecationWarning.
    with pytest.warns(DeprecationWarning, match="attention_scores"):
        old = greedy.attention(INPUTS[1])
    np.testing.assert_array_equal(old["weights"], found["weights"])
    with pytest.warns(DeprecationWarning, match="return_attention_scores"):
        _, _, again = greedy_search(greedy._parts, source_ids, return_attention=True, **greedy._search_kwargs())
    np.testing.assert_array_equal(again.numpy(), recorded.numpy())


def test_text_that_reads_the_same_translates_the_same(exported):
    """Issue 17's inputs. NFC and NFD spellings tokenize to the same ids
    (a 300-piece tokenizer gave 5 ids against 18 with two unknowns); leading,
    trailing, doubled, tab and no-break spaces translate as the plain
    sentence, in the Translator and in its SavedModel; blanks of any script
    give "" with score 0, as ASCII blanks do."""
    import unicodedata

    from keras_transformer.tokenizers import train_subword_tokenizer

    _, german = make_synthetic_corpus(400, seed=9)
    german = [unicodedata.normalize("NFC", s) for s in german] + ["Fröhliche Ärzte warten."] * 5
    tokenizer = train_subword_tokenizer(german, 300)
    sentences = german[:39] + ["Fröhliche Ärzte warten."]
    nfd = [unicodedata.normalize("NFD", s) for s in sentences]
    assert sum(a != b for a, b in zip(sentences, nfd)) >= 10
    assert tokenizer.tokenize(nfd).to_list() == tokenizer.tokenize(sentences).to_list()

    translators, paths = exported
    plain = INPUTS[:2]
    variants = []
    for text in plain:
        variants += [" " + text, text + " ", text.replace(" ", "  "), text.replace(" ", "\t", 1),
                     text.replace(" ", "\u00a0"), "\ufeff" + text, text.replace(" ", "\x00 ", 1) + "\x7f"]
    loaded = tf.saved_model.load(paths["beam"]).signatures["serving_default"]
    for serve in (translators["beam"].serve, lambda batch: loaded(text=batch)):
        want = [t for t in serve(tf.constant(plain))["translation"].numpy() for _ in range(7)]
        assert list(serve(tf.constant(variants))["translation"].numpy()) == want
        blanks = serve(tf.constant(["\u00a0", "\u3000", "\u2003", "\u200b", "\ufeff", " ", "", "\x00", "\x01\x9f"]))
        assert list(blanks["translation"].numpy()) == [b""] * 9
        assert list(blanks["score"].numpy()) == [0.0] * 9


def test_the_language_pair_is_recorded_and_an_ensemble_of_two_directions_is_refused(exported, tmp_path):
    """`languages=` lands in keras_transformer.json, `model_languages` reads
    it back, an unrecorded export has no pair, and `load_ensemble` refuses
    an en->de SavedModel beside a de->en run before loading either."""
    from keras_transformer.languages import model_languages
    from keras_transformer.loading import load_ensemble

    translators, paths = exported
    with open(os.path.join(paths["beam"], "keras_transformer.json")) as f:
        assert json.load(f)["languages"] == {"source": "en", "target": "de"}
    with open(os.path.join(paths["greedy"], "keras_transformer.json")) as f:
        assert "languages" not in json.load(f)
    assert model_languages(paths["beam"]) == ("en", "de")
    assert model_languages(paths["greedy"]) is None
    reverse = tmp_path / "run-de-en"
    reverse.mkdir()
    (reverse / "config.json").write_text(json.dumps(
        {"training": {"train_src": "data/train.de.gz", "train_tgt": "data/train.en.gz"}}))
    with pytest.raises(ValueError, match=r"run-de-en translates de->en and .*beam en->de"):
        load_ensemble([paths["beam"], str(reverse)])
    for languages in (("en", "en"), "en-de", ("en", "xx"), ("en",), {"source": "en", "target": "de"},
                      {"en", "de"}, ("en", 7)):
        with pytest.raises(ValueError, match="two different ISO 639-1 codes"):
            export_translator(translators["beam"], str(tmp_path / "bad"), languages=languages)
    assert not (tmp_path / "bad").exists()


def test_an_export_whose_search_fails_to_run_is_refused_before_anything_is_written(exported, tmp_path, monkeypatch):
    """An export translates one sentence before it writes: a search that
    traces but fails when it runs (as an XLA program that does not compile
    did, for greedy search at sequence lengths above 32) fails the export,
    not the SavedModel's first request, and leaves no folder behind."""
    translators, _ = exported
    import keras_transformer.serving as serving

    real = serving.as_batch

    def failing(text):
        batch = real(text)
        fail = tf.debugging.Assert(tf.equal(tf.size(batch), -1), ["a search that cannot run"])
        with tf.control_dependencies([fail]):
            return tf.identity(batch)

    monkeypatch.setattr(serving, "as_batch", failing)
    path = tmp_path / "broken"
    with pytest.raises(RuntimeError, match="failed to translate one sentence.*nothing was written.*"
                                           "InvalidArgumentError: .*a search that cannot run"):
        export_translator(translators["beam"], str(path))
    assert not path.exists()
    monkeypatch.setattr(serving, "as_batch", real)
    assert os.path.exists(os.path.join(export_translator(translators["beam"], str(path)), "saved_model.pb"))
