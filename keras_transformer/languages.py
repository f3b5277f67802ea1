"""The language pair of a model, read from the names of its training files.

Parallel corpora name each side's file by its ISO 639-1 language code
(the Moses and WMT convention: `train.en.gz` and `train.de.gz`,
`newstest2014.de`), so a run trained on `train.en.gz` -> `train.de.gz`
translates English to German. A run's `config.json` holds its training
files; an exported SavedModel records the pair in `keras_transformer.json`
(`"languages": {"source": "en", "target": "de"}`). Where the pair is known
it is checked at the two places where a mix-up gives a silently wrong
answer instead of an error: the members of an ensemble (en-de and de-en
models of one shared vocabulary decode together without complaint), and
`evaluate` on files whose names say the other direction. A name without a
language code (`corpus.src`) is not checked.

This module imports neither Keras nor TensorFlow.
"""

import json
import os

# ISO 639-1, the two-letter codes.
ISO_639_1 = frozenset("""
aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy
da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu
hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb
lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om
or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss st su sv sw
ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu
""".split())

# Codes that name the same language as another: the older or macro-language
# code to the one `language_of_file` reports.
ALIASES = {"no": "nb", "iw": "he", "in": "id", "ji": "yi"}

_COMPRESSED = (".gz", ".bz2", ".xz")


def _code(value):
    """A recorded language code as `language_of_file` reports it, or None."""
    if not isinstance(value, str):
        return None
    code = ALIASES.get(value.strip().lower(), value.strip().lower())
    return code if code in ISO_639_1 else None


def language_of_file(path):
    """The language code a corpus file's name ends with, or None.

    Args:
        path: str or path-like, such as `"data/train.de.gz"`.

    Returns:
        str: the ISO 639-1 code before any `.gz`, `.bz2` or `.xz`
        (`"de"`; an older alias such as `"no"` as its current code,
        `ALIASES`), or None when the name ends otherwise (`corpus.src`).

    Example:

    >>> language_of_file("multi30k/test_2016_flickr.de.gz")
    'de'
    >>> language_of_file("corpus.src") is None
    True
    """
    name = os.path.basename(os.fspath(path)).lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    stem, dot, code = name.rpartition(".")
    return _code(code) if dot and stem else None


def pair_of_files(src, tgt):
    """`(source_code, target_code)` of two aligned files, or None unless
    both names carry a code and the codes differ."""
    pair = (language_of_file(src), language_of_file(tgt))
    return pair if None not in pair and pair[0] != pair[1] else None


def _read_json(path):
    """The JSON object in `path`, or None if it is missing, unreadable or
    not an object: the checks here never fail on a file they only read
    for a hint."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def model_languages(path):
    """The language pair of a run folder or an exported model, or None.

    Args:
        path: a run folder (its `config.json` training files), a
            SavedModel folder (`"languages"` in its `keras_transformer.json`,
            else `"pair"`, such as `"en-de"`, in a shipped model's
            `metrics.json`) or a CTranslate2 folder written by
            `export_ctranslate2` (`"languages"` in its
            `keras_transformer.json`).

    Returns:
        `(source_code, target_code)`, or None where nothing records the
        pair (or a file holds it in another form).
    """
    facts = _read_json(os.path.join(path, "keras_transformer.json")) or {}
    exported = os.path.exists(os.path.join(path, "saved_model.pb"))
    if exported or facts.get("format") == "keras_transformer.ctranslate2":  # ctranslate2_export.FORMAT
        languages = facts.get("languages")
        if isinstance(languages, dict):
            pair = (_code(languages.get("source")), _code(languages.get("target")))
        else:
            shipped = (_read_json(os.path.join(path, "metrics.json")) or {}).get("pair") if exported else None
            parts = shipped.split("-") if isinstance(shipped, str) else []
            pair = (_code(parts[0]), _code(parts[1])) if len(parts) == 2 else (None, None)
        return pair if None not in pair and pair[0] != pair[1] else None
    training = (_read_json(os.path.join(path, "config.json")) or {}).get("training")
    if not isinstance(training, dict):
        return None
    src, tgt = training.get("train_src"), training.get("train_tgt")
    if not isinstance(src, str) or not isinstance(tgt, str):
        return None
    return pair_of_files(src, tgt)


def check_same_direction(paths):
    """Raise unless the models at `paths` whose pair is known share it.

    Raises:
        ValueError: naming two members of other directions.
    """
    known = [(path, model_languages(path)) for path in paths]
    known = [(path, pair) for path, pair in known if pair is not None]
    for path, pair in known[1:]:
        if pair != known[0][1]:
            first, first_pair = known[0]
            raise ValueError(
                f"{path} translates {pair[0]}->{pair[1]} and {first} {first_pair[0]}->{first_pair[1]}: "
                "the models of an ensemble translate in one direction. Ensemble models of the same "
                "language pair and direction."
            )


def check_file_languages(model_path, src, ref=None):
    """Raise when the names of the files to translate (and score against)
    say another direction than the model at `model_path` translates
    (`evaluate --no-language-check` skips this, for files whose names end
    in a code that is not their language).

    Args:
        model_path: a run or SavedModel folder.
        src: the source file; ref: the reference file, or None.

    Raises:
        ValueError: naming the file, its language and the model's pair,
            and saying which file to pass where.
    """
    pair = model_languages(model_path)
    if pair is None:
        return
    for flag, path, expected in (("--src", src, pair[0]), ("--ref", ref, pair[1])):
        found = None if path is None else language_of_file(path)
        if found is not None and found != expected:
            raise ValueError(
                f"{flag} {path} is named as {found!r} text, and {model_path} translates "
                f"{pair[0]}->{pair[1]}: pass the {pair[0]} file as --src and the {pair[1]} file "
                "as --ref, or a model of that direction (or --no-language-check, if the name's "
                "code is not the file's language)."
            )
