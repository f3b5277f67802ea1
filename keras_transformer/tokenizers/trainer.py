"""Training a SentencePiece vocabulary for a `SubwordTokenizer`.

`train_subword_tokenizer` reads sentences (a list, a file or files, plain
or `.gz`), normalises them as the tokenizer will at use
(`normalization.prepare_lines`), trains a SentencePiece model in memory with
the special ids of `subword_tokenizer` fixed, and returns the tokenizer.
"""

import io
import os
import warnings

import sentencepiece as spm

from keras_transformer.data.text_files import read_lines
from keras_transformer.tokenizers.normalization import prepare_lines
from keras_transformer.tokenizers.subword_tokenizer import END_ID
from keras_transformer.tokenizers.subword_tokenizer import END_PIECE
from keras_transformer.tokenizers.subword_tokenizer import PAD_ID
from keras_transformer.tokenizers.subword_tokenizer import PAD_PIECE
from keras_transformer.tokenizers.subword_tokenizer import START_ID
from keras_transformer.tokenizers.subword_tokenizer import START_PIECE
from keras_transformer.tokenizers.subword_tokenizer import UNK_ID
from keras_transformer.tokenizers.subword_tokenizer import UNK_PIECE
from keras_transformer.tokenizers.subword_tokenizer import SubwordTokenizer
from keras_transformer.tokenizers.subword_tokenizer import _SPECIALS
from keras_transformer.validation import check_bool
from keras_transformer.validation import check_count

# SentencePiece's default `max_sentence_length`, in UTF-8 bytes.
_MAX_SENTENCE_BYTES = 4192

# SentencePiece's byte_fallback adds a piece for each byte value, <0x00> to <0xFF>.
_BYTE_PIECES = 256

# Trainer settings owned by `subword_tokenizer`: the special ids and pieces must
# not be overridden through `**trainer_kwargs`.
_PROTECTED_TRAINER_KEYS = (
    "pad_id",
    "unk_id",
    "bos_id",
    "eos_id",
    "pad_piece",
    "unk_piece",
    "bos_piece",
    "eos_piece",
    "vocab_size",
    "model_type",
    "sentence_iterator",
    "model_writer",
    "input",
    "model_prefix",
)


def _is_path(item):
    return isinstance(item, os.PathLike) or (
        isinstance(item, str) and os.path.isfile(item)
    )


def _collect_sentences(data):
    if isinstance(data, (str, os.PathLike)):
        if not _is_path(data):
            raise ValueError(
                f"`data` is a single string but not an existing file: "
                f"{os.fspath(data)!r}. Pass a list of sentences or a path."
            )
        return read_lines(data)
    if not isinstance(data, (list, tuple)):
        raise ValueError(
            "`data` must be a list of sentences, a path (plain or .gz) or a "
            f"list of paths. Received: type(data)={type(data).__name__}."
        )
    if data and all(_is_path(item) for item in data):
        sentences = []
        for path in data:
            sentences.extend(read_lines(path))
        return sentences
    if any(_is_path(item) for item in data):
        # A list of paths with one wrong would otherwise train on the paths'
        # own text as two or three "sentences".
        missing = [item for item in data if not _is_path(item)]
        shown = repr(missing[0])
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise ValueError(
            f"`data` mixes paths of existing files with {len(missing)} item(s) that are not "
            f"files, such as {shown}: fix the path(s) (a directory is not "
            "a file), or pass only sentences."
        )
    for item in data:
        if not isinstance(item, str):
            raise ValueError(
                "A list passed as `data` must hold only sentences (`str`) or "
                f"only paths. Found an item of type {type(item).__name__}."
            )
    return list(data)


def train_subword_tokenizer(
    data,
    vocab_size,
    *,
    lowercase=False,
    model_type="unigram",
    character_coverage=1.0,
    max_sentences=None,
    byte_fallback=False,
    num_threads=1,
    **trainer_kwargs,
):
    """Trains a SentencePiece vocabulary and returns a `SubwordTokenizer`.

    Runs the SentencePiece trainer (the same backend as
    `keras_hub.tokenizers.compute_sentence_piece_proto`, called directly
    because that helper cannot pass the options below) with the library's
    fixed special pieces `<pad>`=0, `<unk>`=1, `<s>`=2, `</s>`=3, on the
    text as the tokenizer normalizes it (`normalization.normalize_text`),
    with SentencePiece's own normalization off (identity rule, whitespace
    kept), so that detokenization gives back that normalized text (BLEU is
    computed on detokenized text against raw references). Training is deterministic: the same data and arguments
    give byte-identical protos (`num_threads=1` by default for that reason).

    Vocabulary size: `hard_vocab_limit=False` is used, so on a small corpus
    the trained vocabulary may be *smaller* than `vocab_size` (read
    `tokenizer.vocab_size`). A `vocab_size` smaller than the number of
    distinct characters plus the 4 special pieces raises a `ValueError`.

    Args:
        data: a list of sentences (`str`), a path to a text file (plain or
            `.gz`, one sentence per line, UTF-8) or a list of such paths.
            A string is treated as a path when it names an existing file
            (or is an `os.PathLike`); a list is a list of paths when every
            item is (a list that mixes existing files with other items is
            refused). Empty lines are ignored; sentences longer than
            SentencePiece's `max_sentence_length` (4,192 UTF-8 bytes) are
            left out of training with a `UserWarning`.
        vocab_size: int. Requested vocabulary size, special pieces included.
        lowercase: bool. Lowercase the training text with
            `tf.strings.lower(..., encoding="utf-8")` and return a tokenizer
            that does the same at inference. Defaults to `False`, the same
            default as `SubwordTokenizer`.
        model_type: str. `"unigram"` (default), `"bpe"`, `"word"` or
            `"char"`.
        character_coverage: float. Share of characters covered by the
            vocabulary; the rest map to `<unk>`. Defaults to `1.0`.
        max_sentences: optional int. Train on the first `max_sentences`
            sentences only (deterministic subsample for speed).
        byte_fallback: bool. Decompose unknown characters into UTF-8 byte
            pieces instead of `<unk>`, making detokenization lossless for
            any text. Adds 256 pieces. Defaults to `False`.
        num_threads: int. Trainer threads. Defaults to 1 (deterministic).
        **trainer_kwargs: further `sentencepiece.SentencePieceTrainer`
            options, overriding this function's defaults (for example
            `normalization_rule_name="nmt_nfkc"`). The special ids/pieces,
            `vocab_size` and `model_type` cannot be set here.

    Returns:
        `SubwordTokenizer`.

    Raises:
        ValueError: if `data` is empty or of the wrong type, mixes paths
            with items that are not files, holds only sentences longer than
            `max_sentence_length`, if `vocab_size`
            is too small for the corpus's characters (with `byte_fallback`,
            at most 260: the byte and special pieces alone), if
            `byte_fallback` is not a bool, if `model_type` is
            unknown, or if a protected trainer option is passed.

    Example:

    ```python
    tokenizer = train_subword_tokenizer(
        "train.de.gz", vocab_size=8000, max_sentences=100_000
    )
    tokenizer.save("vocab/de")  # vocab/de.model + vocab/de.json
    ```

    References:
        - [Kudo & Richardson, 2018. SentencePiece: A simple and language
          independent subword tokenizer and detokenizer for Neural Text
          Processing](https://arxiv.org/abs/1808.06226)
        - [Kudo, 2018. Subword Regularization (unigram language model)](
          https://arxiv.org/abs/1804.10959)
    """
    if model_type not in ("unigram", "bpe", "word", "char"):
        raise ValueError(
            "`model_type` must be one of 'unigram', 'bpe', 'word', 'char'. "
            f"Received: model_type={model_type!r}."
        )
    if not isinstance(vocab_size, int) or vocab_size <= len(_SPECIALS):
        raise ValueError(
            f"`vocab_size` must be an int greater than {len(_SPECIALS)} "
            f"(the special pieces). Received: vocab_size={vocab_size!r}."
        )
    byte_fallback = check_bool(byte_fallback, "byte_fallback")
    if byte_fallback and vocab_size <= len(_SPECIALS) + _BYTE_PIECES:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no room for subwords with byte_fallback=True: its "
            f"{_BYTE_PIECES} byte pieces and the {len(_SPECIALS)} special pieces take "
            f"{len(_SPECIALS) + _BYTE_PIECES} ids. Raise `vocab_size` (well above that), or drop byte_fallback."
        )
    protected = sorted(set(trainer_kwargs) & set(_PROTECTED_TRAINER_KEYS))
    if protected:
        raise ValueError(
            f"These trainer options are fixed by the library and cannot be "
            f"passed: {protected}. Use the function's own arguments."
        )
    # What `tokenize` will feed SentencePiece: the same TensorFlow ops.
    sentences = [s for s in prepare_lines(_collect_sentences(data), lowercase) if s]
    if max_sentences is not None:  # -1 dropped the last sentence
        sentences = sentences[: check_count(max_sentences, "max_sentences")]
    if not sentences:
        raise ValueError("`data` holds no non-empty sentence to train on.")

    options = dict(
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=START_ID,
        eos_id=END_ID,
        pad_piece=PAD_PIECE,
        unk_piece=UNK_PIECE,
        bos_piece=START_PIECE,
        eos_piece=END_PIECE,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        hard_vocab_limit=False,
        byte_fallback=byte_fallback,
        num_threads=num_threads,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    options.update(trainer_kwargs)
    # SentencePiece leaves longer sentences out of training without a word.
    limit = int(options.get("max_sentence_length", _MAX_SENTENCE_BYTES))
    too_long = sum(len(s.encode("utf-8")) > limit for s in sentences)
    if too_long == len(sentences):
        raise ValueError(
            f"Every sentence of `data` is longer than {limit} UTF-8 bytes, which SentencePiece "
            "skips in training: split the text into sentences (one a line), or raise the limit "
            "with max_sentence_length=..."
        )
    if too_long:
        warnings.warn(
            f"{too_long} of {len(sentences)} sentences are longer than {limit} UTF-8 bytes and are "
            "left out of the vocabulary's training (SentencePiece's max_sentence_length); split "
            "them, or raise the limit with max_sentence_length=...",
            stacklevel=2,
        )
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=writer, **options
        )
    except RuntimeError as e:
        message = str(e)
        if "smaller than required_chars" in message:
            raise ValueError(
                f"vocab_size={vocab_size} is too small for this corpus: the "
                "vocabulary must hold every character (at the requested "
                f"character_coverage) plus the {len(_SPECIALS)} special pieces"
                f"{f' and the {_BYTE_PIECES} byte pieces of byte_fallback' if byte_fallback else ''}. "
                "Raise `vocab_size` or lower `character_coverage`. Trainer said: "
                f"{message}"
            ) from e
        if "Vocabulary size too high" in message:
            raise ValueError(
                f"vocab_size={vocab_size} is too large for this corpus. "
                f"Lower `vocab_size`. Trainer said: {message}"
            ) from e
        raise ValueError(f"SentencePiece training failed: {message}") from e
    return SubwordTokenizer(writer.getvalue(), lowercase=lowercase)
