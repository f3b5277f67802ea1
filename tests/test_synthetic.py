"""Tests for keras_transformer.data.synthetic (the demo corpus)."""

import re

import pytest

from keras_transformer.data import make_synthetic_corpus
from keras_transformer.data import read_parallel
from keras_transformer.data import write_synthetic_corpus


@pytest.fixture(scope="module")
def corpus():
    return make_synthetic_corpus(5000, seed=0)


def test_deterministic_and_prefix_stable(corpus):
    en, de = corpus
    assert len(en) == len(de) == 5000
    assert make_synthetic_corpus(5000, seed=0) == (en, de)
    short_en, short_de = make_synthetic_corpus(100, seed=0)
    assert short_en == en[:100] and short_de == de[:100]
    other_en, _ = make_synthetic_corpus(100, seed=1)
    assert other_en != short_en
    assert make_synthetic_corpus(0) == ([], [])


def test_sentences_look_real(corpus):
    en, de = corpus
    assert len(set(en)) == len(en)
    for sentence in en + de:
        assert sentence[0].isupper(), sentence
        assert sentence.endswith(".") and not sentence.endswith(" .")
        assert "  " not in sentence
    lengths = [len(s.split()) for s in en]
    assert min(lengths) >= 2 and max(lengths) <= 12
    assert any(ch in "".join(de) for ch in "äöüß")


@pytest.mark.parametrize(
    "english, german",
    [
        (r"The dog ", "Der Hund "),
        (r"A dog ", "Ein Hund "),
        (r"The small dog ", "Der kleine Hund "),
        (r"A small dog ", "Ein kleiner Hund "),
        (r"The girl ", "Das Mädchen "),
        (r"A tired girl ", "Ein müdes Mädchen "),
        (r"The cat ", "Die Katze "),
        (r"A cat ", "Eine Katze "),
        (r"Dogs ", "Hunde "),
        (r"The dogs ", "Die Hunde "),
        (r"The old dogs ", "Die alten Hunde "),
        (r"An old man ", "Ein alter Mann "),
    ],
)
def test_subject_agreement(corpus, english, german):
    en, de = corpus
    pairs = [(e, d) for e, d in zip(en, de) if e.startswith(english)]
    assert len(pairs) >= 2, f"no sentence starts with {english!r}"
    for e, d in pairs:
        assert d.startswith(german), (e, d)


_VERB = r"(sees|see|holds|hold|carries|carry|finds|find)"
_VERB_DE = r"(sieht|sehen|hält|halten|trägt|tragen|findet|finden)"


@pytest.mark.parametrize(
    "english, german",
    [
        # Accusative objects: "den" and "-en" for masculine singular only.
        (_VERB + r" the dog\b", _VERB_DE + r" den Hund\b"),
        (
            _VERB + r" the (small|big|old) dog\b",
            _VERB_DE + r" den \w+en Hund\b",
        ),
        (_VERB + r" a dog\b", _VERB_DE + r" einen Hund\b"),
        (_VERB + r" a cat\b", _VERB_DE + r" eine Katze\b"),
        (_VERB + r" the cat\b", _VERB_DE + r" die Katze\b"),
        (_VERB + r" a book\b", _VERB_DE + r" ein Buch\b"),
        (
            _VERB + r" an? (small|big|old) book\b",
            _VERB_DE + r" ein \w+es Buch\b",
        ),
        (_VERB + r" the boy\b", _VERB_DE + r" den Jungen\b"),
        (r" in the park\.$", r" im Park\.$"),
        (r" on the street\.$", r" auf der Straße\.$"),
    ],
)
def test_objects_and_places(corpus, english, german):
    en, de = corpus
    pairs = [(e, d) for e, d in zip(en, de) if re.search(english, e)]
    assert len(pairs) >= 3, f"no sentence matches {english!r}"
    for e, d in pairs:
        assert re.search(german, d), (e, d)


def test_plural_subjects_take_plural_verbs(corpus):
    en, de = corpus
    checked = 0
    for e, d in zip(en, de):
        if re.match(r"^(The )?(\w+ )?dogs run\b", e):
            assert re.match(r"^(Die )?(\w+ )?Hunde laufen\b", d), (e, d)
            checked += 1
        if re.match(r"^(The |A )?(\w+ )?dog runs\b", e):
            assert re.search(r"Hund läuft\b", d), (e, d)
            checked += 1
    assert checked >= 5


def test_write_synthetic_corpus(tmp_path):
    paths = write_synthetic_corpus(tmp_path / "toy", n_train=300, n_val=50)
    assert sorted(paths) == ["train.de", "train.en", "val.de", "val.en"]
    train_en, train_de = read_parallel(paths["train.en"], paths["train.de"])
    val_en, val_de = read_parallel(paths["val.en"], paths["val.de"])
    assert len(train_en) == 300 and len(val_en) == 50
    assert not set(val_en) & set(train_en)
    en, de = make_synthetic_corpus(350, seed=0)
    assert train_en + val_en == en and train_de + val_de == de
