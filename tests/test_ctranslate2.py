"""Export to CTranslate2: the converted model decodes the ids ours does.

Issue 18: CTranslate2's built-in position table, LayerNorm epsilon and
special tokens differ from ours; a conversion that took its defaults would
translate differently. Greedy search is compared id for id.
"""

import os
import pathlib

import keras
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("ctranslate2")
if keras.backend.backend() != "tensorflow":
    pytest.skip("the Translator needs the tensorflow backend", allow_module_level=True)

from keras_transformer import Translator  # noqa: E402
from keras_transformer import build_transformer  # noqa: E402
from keras_transformer.cli import main  # noqa: E402
from keras_transformer.ctranslate2_export import CTranslate2Translator  # noqa: E402
from keras_transformer.ctranslate2_export import export_ctranslate2  # noqa: E402
from keras_transformer.data.synthetic import make_synthetic_corpus  # noqa: E402
from keras_transformer.data.text_files import read_lines  # noqa: E402
from keras_transformer.export import export_translator  # noqa: E402
from keras_transformer.languages import model_languages  # noqa: E402
from keras_transformer.loading import translator_from_saved_model  # noqa: E402
from keras_transformer.tokenizers import train_subword_tokenizer  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHIPPED = sorted(p for p in (REPO / "saved_models").iterdir() if (p / "saved_model.pb").exists())


def our_greedy_ids(translator, lines):
    """Greedy output ids of `Translator` (end and padding dropped)."""
    ids = [translator.src_tokenizer.tokenize(tf.constant([line]))[0].numpy().tolist() for line in lines]
    keep = translator.source_sequence_length - 1
    rows = [row[:keep] + [translator.src_tokenizer.end_id] for row in ids]
    width = max(map(len, rows))
    batch = np.array([row + [0] * (width - len(row)) for row in rows], np.int32)
    out = translator.serve_ids(batch)["target_ids"].numpy()
    end = translator.tgt_tokenizer.end_id
    rows = [list(map(int, row)) for row in out]
    return [row[: row.index(end)] if end in row else row for row in rows]


def ct2_greedy_ids(path, lines, max_decoding_length):
    ct2 = CTranslate2Translator(path)
    results = ct2.translate_pieces(ct2.tokenize(lines), beam_size=1, max_decoding_length=max_decoding_length)
    return [[ct2.tgt.piece_to_id(p) for p in r.hypotheses[0]] for r in results]


@pytest.fixture(scope="module")
def tokenizers():
    en, de = make_synthetic_corpus(600, seed=1)
    return train_subword_tokenizer(en, 150), train_subword_tokenizer(de, 180), en[:24]


@pytest.mark.parametrize("tie_embeddings,norm_first", [("none", False), ("target", True), ("all", False)])
def test_greedy_ids_equal_ours_for_each_architecture(tokenizers, tmp_path, tie_embeddings, norm_first):
    src, tgt, lines = tokenizers
    if tie_embeddings == "all":  # one vocabulary for both sides
        tgt = src
    keras.utils.set_random_seed(3)
    model = build_transformer(
        src.vocab_size, tgt.vocab_size, num_layers=2, d_model=32, num_heads=4, dff=64,
        dropout_rate=0.0, sequence_length=16, tie_embeddings=tie_embeddings, norm_first=norm_first,
    )
    translator = Translator(model, src, tgt, beam_size=1)
    ours = our_greedy_ids(translator, lines)
    paths = [export_ctranslate2(translator, str(tmp_path / "ct2"))]
    if tie_embeddings == "target":
        # Through the exported SavedModel too: weights and SentencePiece
        # models are read back from its variables and graph.
        saved = export_translator(translator, str(tmp_path / "saved_model"))
        paths.append(export_ctranslate2(saved, str(tmp_path / "ct2-from-saved")))
    for path in paths:
        theirs = ct2_greedy_ids(path, lines, max_decoding_length=15)
        assert theirs == ours
    assert any(len(row) > 3 for row in ours)  # not all trivially empty


def test_ctranslate2_used_directly_runs_past_the_models_positions_and_gives_ours_within_them(tokenizers, tmp_path):
    """A new-user trial: `ctranslate2.Translator` on the exported folder, on
    its defaults, failed with "No position encodings are defined for
    positions >= 16" on a long source or a long output. The table now
    covers CTranslate2's defaults; with the model's limits it gives ours."""
    import ctranslate2
    import sentencepiece

    src, tgt, lines = tokenizers
    keras.utils.set_random_seed(5)
    model = build_transformer(src.vocab_size, tgt.vocab_size, num_layers=1, d_model=32, num_heads=4,
                              dff=64, dropout_rate=0.0, sequence_length=16)
    translator = Translator(model, src, tgt, beam_size=1)
    path = export_ctranslate2(translator, str(tmp_path / "ct2"))
    raw = ctranslate2.Translator(path)
    pieces = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, "source.model"))
    long = pieces.encode(" ".join(lines[:6]), out_type=str)
    assert len(long) > 40
    result = raw.translate_batch([long], beam_size=1, max_decoding_length=200, min_decoding_length=200,
                                 disable_unk=True)
    assert len(result[0].hypotheses[0]) == 200  # positions up to 200, past the model's 16
    # The model's limits: sources cut to 15 pieces (16 with the end id), 15 output tokens.
    cut = [pieces.encode(line, out_type=str)[:15] for line in lines]
    results = raw.translate_batch(cut, beam_size=1, max_decoding_length=15, disable_unk=True,
                                  suppress_sequences=[["<pad>"], ["<s>"]])
    target = sentencepiece.SentencePieceProcessor(model_file=os.path.join(path, "target.model"))
    theirs = [[target.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    assert theirs == our_greedy_ids(translator, lines)


def test_overwrite_quantization_and_errors(tokenizers, tmp_path, capsys):
    src, tgt, lines = tokenizers
    model = build_transformer(src.vocab_size, tgt.vocab_size, num_layers=1, d_model=32, num_heads=4,
                              dff=64, sequence_length=16)
    translator = Translator(model, src, tgt, beam_size=1)
    out = str(tmp_path / "ct2")
    export_ctranslate2(translator, out)
    with pytest.raises(FileExistsError, match="overwrite"):
        export_ctranslate2(translator, out)
    export_ctranslate2(translator, out, quantization="int8", overwrite=True)
    # The two float32 position tables (1,024 rows each, for CTranslate2's
    # defaults) are not quantized; the model's matrices are int8.
    tables = 2 * 1024 * 32 * 4
    assert os.path.getsize(os.path.join(out, "model.bin")) - tables < 0.5 * (4 * model.count_params())
    with pytest.raises(ValueError, match="quantization must be one of"):
        export_ctranslate2(translator, out, quantization="int4")
    with pytest.raises(ValueError, match="neither a run folder"):
        export_ctranslate2(str(tmp_path), str(tmp_path / "x"))
    # Never a folder of other files, even with overwrite (a new user's
    # folder was deleted), nor the model being converted.
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("keep me")
    with pytest.raises(ValueError, match="holds files but no CTranslate2 model"):
        export_ctranslate2(translator, str(precious), overwrite=True)
    assert (precious / "thesis.txt").read_text() == "keep me"
    saved = export_translator(translator, str(tmp_path / "saved_model"))
    with pytest.raises(ValueError, match="is the model being converted"):
        export_ctranslate2(saved, saved, overwrite=True)
    ct2 = CTranslate2Translator(out)
    with pytest.raises(TypeError, match=r"wrap it as \[text\]"):
        ct2.translate("A dog runs.")
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 model folder"):
        CTranslate2Translator(saved)
    with pytest.raises(SystemExit):
        main(["export", "--format", "ctranslate2", "--run", str(tmp_path), "--output", out, "--beam-size", "2"])
    assert "--beam-size does not apply to a CTranslate2 model" in capsys.readouterr().err
    (tmp_path / "s.en").write_text("A dog.\n")
    (tmp_path / "r.de").write_text("Ein Hund.\n")
    # A CTranslate2 folder (its config.json is CTranslate2's) passed as a run
    # or SavedModel was "a training run folder" and then "No trained model" (a
    # new-user trial), as an ensemble member and as an export's source too.
    for command in (["translate", "--saved-model", out, "A dog."], ["translate", "--run", out, "A dog."],
                    ["export", "--format", "ctranslate2", "--run", out, "--output", str(tmp_path / "again")],
                    ["evaluate", "--ensemble", saved, "--ensemble", out, "--src", str(tmp_path / "s.en"),
                     "--ref", str(tmp_path / "r.de"), "--no-language-check"]):
        with pytest.raises(SystemExit):
            main(command)
        assert f"{out} is a CTranslate2 model (export --format ctranslate2)" in capsys.readouterr().err, command
    # --checkpoint is for --run; with --saved-model it was ignored.
    with pytest.raises(SystemExit):
        main(["export", "--format", "ctranslate2", "--saved-model", saved, "--checkpoint", "last",
              "--output", str(tmp_path / "again")])
    assert "--checkpoint applies to --run only" in capsys.readouterr().err
    # `average --run SAVED_MODEL` advised --saved-model, which average does not take.
    with pytest.raises(SystemExit):
        main(["average", "--run", saved, "--last", "2"])
    err = capsys.readouterr().err
    assert "is an exported SavedModel, which holds one set of weights" in err and "--saved-model" not in err
    # A cut-off SavedModel is named, not an IndexError deep in TensorFlow.
    import shutil

    from keras_transformer.loading import SavedModelTranslator

    broken = tmp_path / "broken"
    shutil.copytree(saved, broken)
    data = next((broken / "variables").glob("variables.data-*"))
    data.write_bytes(data.read_bytes()[:1000])
    for load in (lambda: export_ctranslate2(str(broken), str(tmp_path / "again")),
                 lambda: SavedModelTranslator(str(broken))):
        with pytest.raises(ValueError, match=f"Could not read the SavedModel {broken}: .* damaged or cut off"):
            load()


@pytest.mark.slow
@pytest.mark.parametrize("saved_model", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_models_convert_exactly(saved_model, multi30k, tmp_path):
    """Greedy ids of the converted shipped model equal ours on the first 200
    test sentences."""
    source_language = saved_model.name.split("-")[-2]
    lines = read_lines(os.path.join(multi30k, f"test_2016_flickr.{source_language}.gz"))[:200]
    path = export_ctranslate2(str(saved_model), str(tmp_path / "ct2"))
    assert model_languages(path) == model_languages(str(saved_model)) == tuple(saved_model.name.split("-")[-2:])
    ours = our_greedy_ids(translator_from_saved_model(str(saved_model), beam_size=1), lines)
    # Up to the position table (63 output tokens after the start token):
    # ours forces the end token there, CTranslate2 stops.
    theirs = ct2_greedy_ids(path, lines, max_decoding_length=None)
    assert sum(a == b for a, b in zip(ours, theirs)) == len(lines)
    with pytest.raises(ValueError, match="max_decoding_length=200 is outside"):
        ct2_greedy_ids(path, lines[:1], max_decoding_length=200)
