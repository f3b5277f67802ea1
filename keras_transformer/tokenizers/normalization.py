"""The one normalization of input text, before tokenizing: training a
vocabulary, `make_dataset`, the `Translator` and every SavedModel signature
apply this same TensorFlow function."""

import tensorflow as tf

# Spaces that RE2's `\s` (ASCII whitespace) misses: vertical tab, next line,
# no-break spaces, the Unicode space separators, line/paragraph separators.
_SPACES = r"\x{000b}\x{0085}\x{00a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}"
# Invisible format characters: zero-width space, (non-)joiners, word
# joiner, and the byte-order mark / zero-width no-break space.
_INVISIBLE = r"\x{200b}-\x{200d}\x{2060}\x{feff}"
# Control characters that are not whitespace (C0 but tab, newlines and
# vertical tab; DEL; C1 but next line): no text holds them, and a model
# reads each as its unknown piece and invents words around it.
_CONTROLS = r"\x{0000}-\x{0008}\x{000e}-\x{001f}\x{007f}-\x{0084}\x{0086}-\x{009f}"


def normalize_text(text):
    """Unicode NFC, whitespace of any script as single ASCII spaces, no
    zero-width or control characters, no leading or trailing space.

    So that text which reads the same tokenizes the same: `"Fröhliche"`
    composed (NFC) or decomposed (NFD, an `o` and a combining diaeresis),
    with a leading, doubled, tab or no-break space, a byte-order mark or a
    stray control character such as NUL.
    Bytes that are not UTF-8 become U+FFFD first.

    Args:
        text: `tf.string` tensor of any shape (or what converts to one).

    Returns:
        `tf.string` tensor of the same shape. Uses `UnicodeTranscode`,
        `StaticRegexReplace` and `StringStrip` (core TensorFlow) and
        tensorflow-text's `NormalizeUTF8`.

    Example:
    >>> normalize_text(["  Fro\\u0308hliche\\u00a0\\u00a0Ärzte\\twarten.\\u200b "]).numpy()[0].decode()
    'Fröhliche Ärzte warten.'
    >>> normalize_text(["A dog\\x00 runs.\\x7f"]).numpy()[0].decode()
    'A dog runs.'
    """
    import tensorflow_text as tf_text

    text = tf.strings.unicode_transcode(
        tf.convert_to_tensor(text, tf.string), "UTF-8", "UTF-8", errors="replace"
    )
    text = tf_text.normalize_utf8(text, "NFC")
    text = tf.strings.regex_replace(text, f"[{_INVISIBLE}{_CONTROLS}]", "")
    text = tf.strings.regex_replace(text, rf"[\s{_SPACES}]+", " ")
    return tf.strings.strip(text)


def prepare_text(text, lowercase=False):
    """`normalize_text`, then lowercased (UTF-8 aware) if asked: what a
    `SubwordTokenizer` feeds SentencePiece, at training and at use."""
    text = normalize_text(text)
    return tf.strings.lower(text, encoding="utf-8") if lowercase else text


def prepare_lines(lines, lowercase=False, chunk_size=8192):
    """`prepare_text` of a list of `str`, eagerly: list of `str`."""
    prepared = []
    for start in range(0, len(lines), chunk_size):
        chunk = tf.constant(lines[start : start + chunk_size], tf.string)
        prepared.extend(s.decode("utf-8") for s in prepare_text(chunk, lowercase).numpy())
    return prepared
