"""What a translator tells its caller about the sources it was given.

Two kinds of source translate without an error but not as the caller may
expect, so the command line says so on stderr and the Python translators
(`Translator.translate_lines`, `translate_n_best` and the SavedModel's
`load_translator`) warn with a `UserWarning`:

- a source longer than the encoder's `sequence_length` is cut to its first
  `sequence_length - 1` subword pieces (the end token takes the last
  position), the rule training applies;
- a source with characters the SentencePiece vocabulary lacks reads them as
  the unknown piece (`<unk>`, id 1): a model trained on other scripts
  (emoji, Chinese, Cyrillic for a Multi30k model) then translates text it
  cannot see, often with invented words, and its score does not show it.

Example:
>>> from keras_transformer.source_notices import SourceReport
>>> from keras_transformer.tokenizers import train_subword_tokenizer
>>> tokenizer = train_subword_tokenizer(["a dog runs in the snow"] * 20, vocab_size=30)
>>> report = SourceReport(limit=16)  # 15 pieces and the end token
>>> report.add(tokenizer, ["a dog runs", "a dog \N{DOG} runs in the snow", "the snow"])
>>> report.truncated, report.with_unknown, report.characters
(1, 1, ['\N{DOG}'])
>>> for message in report.messages(total=3):
...     print(message)  # doctest: +ELLIPSIS
1 of 3 sentences are longer than the model's source limit of 15 subword pieces; ...
1 of 3 sentences have characters that the model's vocabulary lacks ('\N{DOG}'); ...
"""

import warnings

import tensorflow as tf

from keras_transformer.tokenizers.subword_tokenizer import UNK_ID

# The unknown characters a message names; the rest are counted.
SHOWN_CHARACTERS = 10
# Lines tokenized at once when a list is counted.
CHUNK = 4096


def unknown_characters(tokenizer, texts):
    """The characters of `texts` that `tokenizer` reads as the unknown piece.

    Args:
        tokenizer: a `SubwordTokenizer`.
        texts: iterable of `str`.

    Returns:
        list of `str`, one character each, in order of first appearance.
    """
    seen = list(dict.fromkeys(c for text in texts for c in text if not c.isspace()))
    if not seen:
        return []
    ids = tokenizer.tokenize(tf.constant(seen, tf.string))
    unknown = tf.reduce_any(tf.equal(ids, UNK_ID), axis=-1).numpy()
    return [c for c, is_unknown in zip(seen, unknown) if is_unknown]


class SourceReport:
    """Counts, over batches of sources, those the source limit cuts and
    those with unknown characters, and words the notices.

    Args:
        limit: int, the encoder's `sequence_length` (None: nothing is cut).

    Attributes:
        truncated: int, sources of more than `limit - 1` pieces.
        with_unknown: int, sources with at least one unknown piece.
        characters: list of `str`, their unknown characters.
    """

    def __init__(self, limit):
        self.limit = limit
        self.truncated = 0
        self.with_unknown = 0
        self.characters = []

    def add(self, tokenizer, texts):
        """Count a batch.

        Args:
            tokenizer: the source `SubwordTokenizer`.
            texts: `tf.string` `(batch,)`, or a list of `str` of any
                length (tokenized in chunks of `CHUNK` lines).
        """
        if isinstance(texts, (list, tuple)):
            for start in range(0, len(texts), CHUNK):
                self.add(tokenizer, tf.constant(list(texts[start:start + CHUNK]), tf.string))
            return
        if texts.shape[0] == 0:
            return
        ids = tokenizer.tokenize(texts)
        if self.limit:
            self.truncated += int(tf.reduce_sum(tf.cast(ids.row_lengths() > self.limit - 1, tf.int32)))
        has_unknown = tf.reduce_any(tf.equal(ids, UNK_ID), axis=-1).numpy()
        if has_unknown.any():
            self.with_unknown += int(has_unknown.sum())
            lines = [t.decode("utf-8", "replace") for t, u in zip(texts.numpy(), has_unknown) if u]
            found = unknown_characters(tokenizer, lines)
            self.characters += [c for c in found if c not in self.characters]

    def messages(self, total):
        """The notices for `total` sources: a list of `str`, empty when
        no source was cut and none had unknown characters."""
        found = []
        if self.truncated:
            found.append(
                f"{self.truncated} of {total} sentences are longer than the model's source limit of "
                f"{self.limit - 1} subword pieces; only their first {self.limit - 1} pieces were "
                "translated. Split long sentences to translate them whole."
            )
        if self.with_unknown:
            shown = " ".join(repr(c) for c in self.characters[:SHOWN_CHARACTERS])
            more = len(self.characters) - SHOWN_CHARACTERS
            found.append(
                f"{self.with_unknown} of {total} sentences have characters that the model's vocabulary "
                f"lacks ({shown}{f' and {more} more' if more > 0 else ''}); the model reads them as "
                "unknown and may leave them out or translate them with invented words. Translate text in "
                "the scripts the model was trained on, or train one on text with these characters."
            )
        return found


def warn_about_sources(translator, lines):
    """A `UserWarning` for each notice `lines` (list of `str`) give the
    translator, as the command line says on stderr."""
    if not lines:  # nothing to count (and no tokenizer to rebuild)
        return
    report = SourceReport(translator.source_sequence_length)
    report.add(translator.src_tokenizer, list(lines))
    for message in report.messages(len(lines)):
        warnings.warn(message, stacklevel=3)
