"""A deterministic toy English->German parallel corpus.

The demo's embedded default data: sentences are generated from a small
bilingual lexicon and a few templates, with the German grammar a tiny
Transformer has to learn (gender and case agreement of articles and
adjectives, plural forms, verb agreement, contractions such as
"in dem" -> "im"). Example pair:

    "The small dog runs in the park."  ->  "Der kleine Hund läuft im Park."

Templates (subject = article + optional adjective + noun, singular or
plural):

    subject intransitive-verb [place].
    subject transitive-verb object [place].
"""

import os
import random

# Nouns: English singular, English plural, German gender ("m", "f", "n"),
# German singular, German plural, and the German accusative singular when
# it differs from the nominative (weak nouns such as "Junge").
_PEOPLE = (
    ("man", "men", "m", "Mann", "Männer", None),
    ("woman", "women", "f", "Frau", "Frauen", None),
    ("child", "children", "n", "Kind", "Kinder", None),
    ("boy", "boys", "m", "Junge", "Jungen", "Jungen"),
    ("girl", "girls", "n", "Mädchen", "Mädchen", None),
    ("teacher", "teachers", "m", "Lehrer", "Lehrer", None),
    ("doctor", "doctors", "m", "Arzt", "Ärzte", None),
)
_ANIMALS = (
    ("dog", "dogs", "m", "Hund", "Hunde", None),
    ("cat", "cats", "f", "Katze", "Katzen", None),
    ("horse", "horses", "n", "Pferd", "Pferde", None),
    ("bird", "birds", "m", "Vogel", "Vögel", None),
)
_THINGS = (
    ("ball", "balls", "m", "Ball", "Bälle", None),
    ("book", "books", "n", "Buch", "Bücher", None),
    ("apple", "apples", "m", "Apfel", "Äpfel", None),
    ("bag", "bags", "f", "Tasche", "Taschen", None),
    ("hat", "hats", "m", "Hut", "Hüte", None),
    ("flower", "flowers", "f", "Blume", "Blumen", None),
    ("bicycle", "bicycles", "n", "Fahrrad", "Fahrräder", None),
    ("guitar", "guitars", "f", "Gitarre", "Gitarren", None),
    ("car", "cars", "n", "Auto", "Autos", None),
)
_SUBJECT_NOUNS = _PEOPLE + _ANIMALS
_OBJECT_NOUNS = _PEOPLE + _ANIMALS + _THINGS

# Adjectives: English, German stem (declension ending appended), and the
# kinds of noun it is used with ("p"eople, "a"nimals, "t"hings), so the
# corpus has no "tired hat" and no skin colours.
_ADJECTIVES = (
    ("small", "klein", "pat"),
    ("big", "groß", "pat"),
    ("old", "alt", "pat"),
    ("young", "jung", "pa"),
    ("happy", "fröhlich", "pa"),
    ("tired", "müd", "pa"),
    ("black", "schwarz", "at"),
    ("white", "weiß", "at"),
    ("brown", "braun", "at"),
    ("red", "rot", "t"),
)


def _noun_kind(noun):
    if noun in _PEOPLE:
        return "p"
    return "a" if noun in _ANIMALS else "t"


# Verbs: English 3rd singular, English plural, German 3rd singular, plural.
_INTRANSITIVE_VERBS = (
    ("runs", "run", "läuft", "laufen"),
    ("sleeps", "sleep", "schläft", "schlafen"),
    ("plays", "play", "spielt", "spielen"),
    ("sits", "sit", "sitzt", "sitzen"),
    ("waits", "wait", "wartet", "warten"),
    ("sings", "sing", "singt", "singen"),
    ("dances", "dance", "tanzt", "tanzen"),
    ("jumps", "jump", "springt", "springen"),
)
_TRANSITIVE_VERBS = (
    ("sees", "see", "sieht", "sehen"),
    ("holds", "hold", "hält", "halten"),
    ("carries", "carry", "trägt", "tragen"),
    ("finds", "find", "findet", "finden"),
)

# Prepositional phrases of place (German dative, contractions included).
_PLACES = (
    ("in the park", "im Park"),
    ("in the garden", "im Garten"),
    ("on the street", "auf der Straße"),
    ("at the beach", "am Strand"),
    ("in the kitchen", "in der Küche"),
    ("next to the house", "neben dem Haus"),
    ("in the snow", "im Schnee"),
    ("by the river", "am Fluss"),
)

_DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
}
_INDEFINITE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein"},
    "acc": {"m": "einen", "f": "eine", "n": "ein"},
}
# Adjective endings after the definite article (weak declension).
_WEAK_ENDINGS = {
    "nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
    "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
}
# After the indefinite article (mixed declension).
_MIXED_ENDINGS = {
    "nom": {"m": "er", "f": "e", "n": "es"},
    "acc": {"m": "en", "f": "e", "n": "es"},
}
# Without article, plural only (strong declension).
_STRONG_PLURAL_ENDING = {"nom": "e", "acc": "e"}

# Noun-phrase forms: (article kind, plural).
_NP_FORMS = (("def", False), ("indef", False), ("def", True), ("none", True))


def _noun_phrase(rng, nouns, case):
    """Returns (english words, german words, is_plural)."""
    noun = rng.choice(nouns)
    en_sg, en_pl, gender, de_sg, de_pl, de_oblique = noun
    article, plural = rng.choice(_NP_FORMS)
    kind = _noun_kind(noun)
    adjectives = [a for a in _ADJECTIVES if kind in a[2]]
    adjective = rng.choice(adjectives) if rng.random() < 0.5 else None

    key = "pl" if plural else gender
    en_noun = en_pl if plural else en_sg
    if plural:
        de_noun = de_pl
    elif case != "nom" and de_oblique:
        de_noun = de_oblique
    else:
        de_noun = de_sg

    en, de = [], []
    if article == "def":
        en.append("the")
        de.append(_DEFINITE[case][key])
        ending = _WEAK_ENDINGS[case][key]
    elif article == "indef":
        first = adjective[0] if adjective else en_noun
        en.append("an" if first[0] in "aeiou" else "a")
        de.append(_INDEFINITE[case][key])
        ending = _MIXED_ENDINGS[case][key]
    else:
        ending = _STRONG_PLURAL_ENDING[case]
    if adjective:
        en.append(adjective[0])
        de.append(adjective[1] + ending)
    en.append(en_noun)
    de.append(de_noun)
    return en, de, plural


def _sentence_pair(rng):
    subj_en, subj_de, plural = _noun_phrase(rng, _SUBJECT_NOUNS, "nom")
    number = 1 if plural else 0
    en, de = list(subj_en), list(subj_de)
    if rng.random() < 0.5:
        verb = rng.choice(_INTRANSITIVE_VERBS)
        en.append(verb[number])
        de.append(verb[2 + number])
        place_probability = 0.8
    else:
        verb = rng.choice(_TRANSITIVE_VERBS)
        obj_en, obj_de, _ = _noun_phrase(rng, _OBJECT_NOUNS, "acc")
        en += [verb[number]] + obj_en
        de += [verb[2 + number]] + obj_de
        place_probability = 0.4
    if rng.random() < place_probability:
        place_en, place_de = rng.choice(_PLACES)
        en.append(place_en)
        de.append(place_de)
    en_text = " ".join(en) + "."
    de_text = " ".join(de) + "."
    return en_text[0].upper() + en_text[1:], de_text[0].upper() + de_text[1:]


def make_synthetic_corpus(n_pairs, seed=0):
    """Generates a deterministic toy English->German parallel corpus.

    Sentences come from an embedded lexicon (20 nouns with German gender
    and plural, 10 adjectives, 12 verbs, 8 places) and two templates, with
    correct German agreement: `der/die/das`, `ein/eine`, adjective endings,
    accusative objects (`den kleinen Hund`), plural verbs and contractions
    (`im Park`). The first word is capitalised and the sentence ends with a
    period, as in Multi30k. All English sentences are distinct. The same
    `(n_pairs, seed)` always gives the same corpus, and a longer corpus
    with the same seed starts with the shorter one.

    Args:
        n_pairs: int. Number of sentence pairs (at most a few million).
        seed: int. Random seed. Defaults to 0.

    Returns:
        `(english, german)`: two lists of `n_pairs` aligned `str`.

    Raises:
        ValueError: if `n_pairs` is negative or too large for the lexicon.

    Example:

    ```python
    en, de = make_synthetic_corpus(3, seed=0)
    # en[i] -> de[i], e.g. "The small dog runs in the park."
    #                   -> "Der kleine Hund läuft im Park."
    ```
    """
    if not isinstance(n_pairs, int) or n_pairs < 0:
        raise ValueError(
            f"`n_pairs` must be a non-negative int. Received: {n_pairs!r}."
        )
    rng = random.Random(seed)
    seen = set()
    english, german = [], []
    attempts = 0
    max_attempts = 20 * n_pairs + 1000
    while len(english) < n_pairs:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"Could not generate {n_pairs} distinct pairs from the "
                f"lexicon (got {len(english)}). Ask for fewer pairs."
            )
        en, de = _sentence_pair(rng)
        if en in seen:
            continue
        seen.add(en)
        english.append(en)
        german.append(de)
    return english, german


def write_synthetic_corpus(directory, n_train, n_val, seed=0):
    """Writes `train.en/train.de/val.en/val.de` (plain UTF-8 text).

    The validation pairs never occur in the training pairs (all generated
    English sentences are distinct).

    Args:
        directory: str or path. Created if missing.
        n_train: int. Number of training pairs.
        n_val: int. Number of validation pairs.
        seed: int. Random seed. Defaults to 0.

    Returns:
        dict mapping `"train.en"`, `"train.de"`, `"val.en"`, `"val.de"` to
        the written paths.

    Example:

    ```python
    paths = write_synthetic_corpus("/tmp/toy", n_train=20000, n_val=500)
    ```
    """
    english, german = make_synthetic_corpus(n_train + n_val, seed=seed)
    os.makedirs(directory, exist_ok=True)
    splits = {
        "train": (english[:n_train], german[:n_train]),
        "val": (english[n_train:], german[n_train:]),
    }
    paths = {}
    for split, (en_lines, de_lines) in splits.items():
        for lang, lines in (("en", en_lines), ("de", de_lines)):
            name = f"{split}.{lang}"
            path = os.path.join(os.fspath(directory), name)
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.writelines(line + "\n" for line in lines)
            paths[name] = path
    return paths
