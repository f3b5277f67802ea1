"""The language pair of a model from its training files' names
(`keras_transformer.languages`), and the checks built on it. No backend
needed: run and SavedModel folders are written here as their JSON files."""

import json

import pytest

from keras_transformer.languages import check_file_languages
from keras_transformer.languages import check_same_direction
from keras_transformer.languages import language_of_file
from keras_transformer.languages import model_languages
from keras_transformer.languages import pair_of_files


@pytest.mark.parametrize("path, code", [
    ("data/multi30k/train.en.gz", "en"),
    ("test_2016_flickr.DE", "de"),
    ("newstest2014.fr.xz", "fr"),
    ("corpus.zh.bz2", "zh"),
    ("corpus.src", None),        # not a language code
    ("corpus.txt.gz", None),
    ("de", None),                # a bare code is no corpus name
    (".en", None),
    ("data.en/train.tok", None),  # the folder's suffix does not count
    ("train.xx", None),          # not ISO 639-1
    ("test.no", "nb"),           # an alias, as its current code
])
def test_language_of_file(path, code):
    assert language_of_file(path) == code


def test_pair_of_files_needs_two_different_codes():
    assert pair_of_files("train.en.gz", "train.de.gz") == ("en", "de")
    assert pair_of_files("train.en", "train.en") is None
    assert pair_of_files("train.en", "train.tgt") is None


def _run(folder, src, tgt):
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"training": {"train_src": src, "train_tgt": tgt}}))
    return str(folder)


def _saved_model(folder, languages):
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"")
    metadata = {"special_ids": {}} if languages is None else {"languages": languages}
    (folder / "keras_transformer.json").write_text(json.dumps(metadata))
    return str(folder)


def test_model_languages_of_runs_and_saved_models(tmp_path):
    assert model_languages(_run(tmp_path / "a", "/d/train.en.gz", "/d/train.de.gz")) == ("en", "de")
    assert model_languages(_run(tmp_path / "b", "/d/source.txt", "/d/target.txt")) is None
    assert model_languages(_saved_model(tmp_path / "c", {"source": "de", "target": "en"})) == ("de", "en")
    assert model_languages(_saved_model(tmp_path / "d", None)) is None
    assert model_languages(str(tmp_path)) is None  # neither
    # A shipped model without the key: its metrics.json "pair".
    shipped = _saved_model(tmp_path / "e", None)
    (tmp_path / "e" / "metrics.json").write_text(json.dumps({"pair": "en-fr"}))
    assert model_languages(shipped) == ("en", "fr")
    assert model_languages(_saved_model(tmp_path / "f", {"source": "EN", "target": "No"})) == ("en", "nb")
    # A CTranslate2 export: its keras_transformer.json; no metrics.json fallback.
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    (ct2 / "keras_transformer.json").write_text(json.dumps({"format": "keras_transformer.ctranslate2",
                                                            "languages": {"source": "en", "target": "fr"}}))
    assert model_languages(str(ct2)) == ("en", "fr")
    (ct2 / "keras_transformer.json").write_text(json.dumps({"format": "keras_transformer.ctranslate2"}))
    (ct2 / "metrics.json").write_text(json.dumps({"pair": "en-fr"}))
    assert model_languages(str(ct2)) is None


@pytest.mark.parametrize("name, text", [
    ("keras_transformer.json", json.dumps({"languages": ["en", "de"]})),
    ("keras_transformer.json", json.dumps({"languages": "en-de"})),
    ("keras_transformer.json", json.dumps([1, 2])),
    ("keras_transformer.json", "{not json"),
    ("metrics.json", json.dumps({"pair": ["en", "de"]})),
    ("metrics.json", json.dumps({"pair": "en-de-fr"})),
    ("config.json", json.dumps({"training": None})),
    ("config.json", json.dumps({"training": {"train_src": 3, "train_tgt": "a.de"}})),
    ("config.json", "[]"),
])
def test_model_languages_of_files_in_another_form_is_none(tmp_path, name, text):
    """A hint the checks only read: a file of another shape gives no pair,
    never a traceback."""
    folder = tmp_path / "model"
    folder.mkdir()
    if name != "config.json":
        (folder / "saved_model.pb").write_bytes(b"")
    (folder / name).write_text(text)
    assert model_languages(str(folder)) is None


def test_an_ensemble_of_two_directions_is_refused_and_unknown_members_pass(tmp_path):
    en_de = _run(tmp_path / "en-de", "train.en.gz", "train.de.gz")
    de_en = _saved_model(tmp_path / "de-en", {"source": "de", "target": "en"})
    unknown = _saved_model(tmp_path / "old", None)
    other_en_de = _saved_model(tmp_path / "en-de-2", {"source": "en", "target": "de"})
    check_same_direction([en_de, unknown, other_en_de])
    with pytest.raises(ValueError, match=r"de-en translates de->en and .*en-de en->de: the models of an "
                                         r"ensemble translate in one direction"):
        check_same_direction([en_de, unknown, de_en])


def test_evaluation_files_of_the_other_direction_are_refused(tmp_path):
    model = _run(tmp_path / "run", "train.en.gz", "train.de.gz")
    check_file_languages(model, "val.en.gz", "val.de.gz")
    check_file_languages(model, "val.en.gz", None)
    check_file_languages(model, "sources.txt", "references.txt")  # names without codes
    with pytest.raises(ValueError, match=r"--src val.de.gz is named as 'de' text, and .*run translates "
                                         r"en->de: pass the en file as --src and the de file as --ref"):
        check_file_languages(model, "val.de.gz", "val.en.gz")
    with pytest.raises(ValueError, match=r"--ref val.fr.gz is named as 'fr' text"):
        check_file_languages(model, "val.en.gz", "val.fr.gz")
    check_file_languages(_saved_model(tmp_path / "old", None), "val.de.gz", "val.en.gz")  # pair unknown
