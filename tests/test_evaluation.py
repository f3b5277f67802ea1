"""Tests for keras_transformer.evaluation (scores come from sacreBLEU)."""

import pytest
import sacrebleu

from keras_transformer.evaluation import corpus_scores

HYPOTHESES = [
    "The cat sat on the mat.",
    "A man is riding a bicycle down the street.",
    "two dogs play in the snow",
]
REFERENCES = [
    "the cat sat on the mat.",
    "A man rides a bike down the street.",
    "Two dogs are playing in the snow.",
]


def test_perfect_match_scores_100():
    scores = corpus_scores(REFERENCES, REFERENCES)
    assert scores["bleu"] == pytest.approx(100.0)
    assert scores["bleu_lowercase"] == pytest.approx(100.0)
    assert scores["chrf"] == pytest.approx(100.0)
    assert scores["num_segments"] == 3


def test_no_overlap_scores_0():
    scores = corpus_scores(["xyz qqq"], ["the cat sat on the mat."])
    assert scores["bleu"] == 0.0
    assert scores["bleu_lowercase"] == 0.0


def test_matches_sacrebleu_directly():
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    assert scores["bleu"] == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-9
    )
    assert scores["bleu_lowercase"] == pytest.approx(
        sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True).score,
        abs=1e-9,
    )
    assert scores["chrf"] == pytest.approx(
        sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-9
    )
    assert 0.0 < scores["bleu"] < scores["bleu_lowercase"] < 100.0


def test_case_only_difference():
    """Cased BLEU penalises case, lowercased BLEU does not."""
    scores = corpus_scores(["The Cat sat on the mat ."],
                           ["the cat sat on the mat ."])
    assert scores["bleu"] < 100.0
    assert scores["bleu_lowercase"] == pytest.approx(100.0)


def test_signatures_record_settings():
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    assert "tok:13a" in scores["bleu_signature"]
    assert "case:mixed" in scores["bleu_signature"]
    assert "case:lc" in scores["bleu_lowercase_signature"]
    assert "nc:6" in scores["chrf_signature"]
    assert f"version:{sacrebleu.__version__}" in scores["bleu_signature"]


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 hypotheses and 3 references"):
        corpus_scores(HYPOTHESES[:2], REFERENCES)


@pytest.mark.parametrize(
    "hypotheses, references, match",
    [
        ("the cat", ["the cat"], "single string"),
        ([], [], "empty"),
        ([["the", "cat"]], ["the cat"], "detokenized strings"),
    ],
)
def test_bad_inputs_raise(hypotheses, references, match):
    with pytest.raises(ValueError, match=match):
        corpus_scores(hypotheses, references)


def test_decomposed_references_beside_composed_translations_are_warned_about():
    """A reference file in Unicode NFD scored 36.5 BLEU where the same text
    in NFC scored 45.6, without a word (a new-user trial): sacreBLEU compares
    code points. The scores stay sacreBLEU's; a warning says why they drop."""
    import unicodedata
    import warnings

    composed = ["Die Frau läuft über die Straße.", "Ein Mädchen spielt."]
    decomposed = [unicodedata.normalize("NFD", line) for line in composed]
    with pytest.warns(UserWarning, match="2 of 2 references are not in Unicode NFC.*Normalize the references"):
        scores = corpus_scores(composed, decomposed)
    assert scores["bleu"] < 50 < corpus_scores(composed, composed)["bleu"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        corpus_scores(composed, composed)
        corpus_scores(decomposed, decomposed)  # both sides alike: nothing to say
