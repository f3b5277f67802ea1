"""Sources cut to the limit, or with characters the vocabulary lacks, are
reported on every path: the command line's plain, scored, n-best and jsonl
output, and the Python translators' `translate_lines` / `translate_n_best`
(found by a new-user trial: the scored paths said nothing)."""

import json
import os
import warnings

import pytest

import keras_transformer as kt
from keras_transformer.cli import main
from keras_transformer.source_notices import SourceReport, unknown_characters

SHIPPED = os.path.join(os.path.dirname(__file__), "..", "saved_models", "multi30k-en-de")
LONG = " ".join(["A dog runs in the snow."] * 20)  # 140 words: over the 63-piece limit
STRANGE = "A dog 🐶 runs in the ❄ snow. Собака"


@pytest.fixture(scope="module")
def shipped():
    return kt.load_translator(SHIPPED)


def test_unknown_characters_are_those_the_vocabulary_lacks(shipped):
    found = unknown_characters(shipped.src_tokenizer, [STRANGE, "A dog runs."])
    # Cyrillic 'С', 'о', 'б', 'а', 'к' (the second 'а' once), and the emoji; no Latin letter.
    assert found == ["🐶", "❄", "С", "о", "б", "а", "к"]
    assert unknown_characters(shipped.src_tokenizer, ["A dog runs.", "  "]) == []


def test_report_counts_cut_and_unknown_sources(shipped):
    report = SourceReport(shipped.source_sequence_length)
    report.add(shipped.src_tokenizer, ["A dog runs.", LONG])
    report.add(shipped.src_tokenizer, [STRANGE, "", "Ein 🐶."])
    assert (report.truncated, report.with_unknown) == (1, 2)
    assert report.characters == ["🐶", "❄", "С", "о", "б", "а", "к"]
    cut, unknown = report.messages(5)
    assert cut.startswith("1 of 5 sentences are longer than the model's source limit of 63 subword pieces")
    assert unknown.startswith("2 of 5 sentences have characters that the model's vocabulary lacks "
                              "('🐶' '❄' 'С' 'о' 'б' 'а' 'к')")
    clean = SourceReport(shipped.source_sequence_length)
    clean.add(shipped.src_tokenizer, ["A dog runs.", ""])
    assert clean.messages(2) == []


def test_lists_are_counted_in_chunks(shipped, monkeypatch):
    import keras_transformer.source_notices as notices

    monkeypatch.setattr(notices, "CHUNK", 2)
    report = SourceReport(shipped.source_sequence_length)
    report.add(shipped.src_tokenizer, ["A dog.", "🐶", LONG, "", "Ein 🐶 и ❄."])
    assert (report.truncated, report.with_unknown) == (1, 2)
    assert report.characters == ["🐶", "и", "❄"]


def test_long_character_lists_are_shortened(shipped):
    report = SourceReport(None)
    report.add(shipped.src_tokenizer, ["Съешь же ещё этих мягких французских булок, да выпей чаю"])
    (message,) = report.messages(1)
    assert report.truncated == 0
    assert f"and {len(report.characters) - 10} more)" in message


# --scores, --n-best and --format jsonl share one path (`translate_n_best`): jsonl stands for the three.
@pytest.mark.parametrize("flags", [[], ["--format", "jsonl"]])
def test_cli_reports_both_kinds_on_every_output_format(flags, capsys):
    main(["translate", "--saved-model", SHIPPED, *flags, "A dog runs.", LONG, STRANGE])
    captured = capsys.readouterr()
    if flags == ["--format", "jsonl"]:
        assert [json.loads(line)["source"] for line in captured.out.splitlines()] == ["A dog runs.", LONG, STRANGE]
    assert "keras-transformer: 1 of 3 sentences are longer than the model's source limit of 63" in captured.err
    assert "keras-transformer: 1 of 3 sentences have characters that the model's vocabulary lacks" in captured.err
    main(["translate", "--saved-model", SHIPPED, *flags, "A dog runs."])
    assert capsys.readouterr().err == ""


def test_python_translators_warn_on_lines_and_n_best(shipped):
    with pytest.warns(UserWarning, match="1 of 2 sentences have characters that the model's vocabulary lacks"):
        shipped.translate_lines(["A dog runs.", STRANGE])
    with pytest.warns(UserWarning, match="1 of 1 sentences are longer than the model's source limit of 63"):
        shipped.translate_n_best(iter([LONG]), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(shipped.translate_n_best(["A dog runs."], 2)) == 1
