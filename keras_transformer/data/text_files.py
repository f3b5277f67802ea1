"""Reading line-aligned text files (plain or gzip)."""

import gzip
import os

from keras_transformer.config import check_files  # noqa: F401 (public here too)


def _is_gzip(path):
    return os.fspath(path).endswith(".gz")


def read_lines(path):
    """Reads a UTF-8 text file (plain or `.gz`) into a list of lines.

    Lines are split on `"\\n"` only (as `tf.data.TextLineDataset` does, so
    both give the same line count); the line terminator (`"\\n"` or
    `"\\r\\n"`) is stripped, and so is a byte-order mark (U+FEFF) that
    starts the file; leading/trailing spaces are kept.

    Args:
        path: str or path-like. Files whose name ends with `.gz` are
            decompressed.

    Returns:
        list of `str`, one per line.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: if the file is not UTF-8 text, or a `.gz` name holds no
            complete gzip data (naming the file).

    Example:

    ```python
    sentences = read_lines("multi30k/train.de.gz")
    ```
    """
    opener = gzip.open if _is_gzip(path) else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="\n") as f:
            return read_text_lines(f, path, "a UTF-8 text file, one sentence per line (plain or .gz)")
    except (gzip.BadGzipFile, EOFError) as error:
        raise ValueError(f"{os.fspath(path)} ends with .gz but is not a complete gzip file ({error}); "
                         "decompress it right, or name a plain text file without .gz.") from None


def read_text_lines(stream, name, expected="UTF-8 text, one sentence per line"):
    """The lines of an open text stream, split and stripped as `read_lines` does.

    Args:
        stream: a text stream opened with `encoding="utf-8", newline="\\n"`
            (e.g. `io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8",
            newline="\\n")`), so that a `"\\r\\n"` ending reaches this
            function and is stripped here.
        name: str, what the stream is, for the error message ("stdin").
        expected: str, what to pass instead, for the error message.

    Returns:
        list of `str`, one per line, without `"\\n"` or `"\\r\\n"`, and
        without the byte-order mark (U+FEFF) that some editors write at the
        start of a UTF-8 file.

    Raises:
        ValueError: if the stream is not UTF-8 text (naming `name`).
    """
    try:
        lines = [line.rstrip("\n").removesuffix("\r") for line in stream]
    except UnicodeDecodeError as error:
        raise ValueError(f"{name} is not UTF-8 text ({error.reason}); pass {expected}.") from None
    if lines:
        lines[0] = lines[0].removeprefix("\ufeff")
    return lines


def read_parallel(src_path, tgt_path):
    """Reads two line-aligned files (source and target translations).

    Args:
        src_path: str or path-like, plain or `.gz`.
        tgt_path: str or path-like, plain or `.gz`.

    Returns:
        `(src_lines, tgt_lines)`: two lists of `str` of equal length.

    Raises:
        ValueError: if the files have different line counts.

    Example:

    ```python
    en, de = read_parallel("train.en.gz", "train.de.gz")
    ```
    """
    src_lines = read_lines(src_path)
    tgt_lines = read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(
            "Parallel files must have the same number of lines, one "
            f"translation per line. {os.fspath(src_path)!r} has "
            f"{len(src_lines)} lines but {os.fspath(tgt_path)!r} has "
            f"{len(tgt_lines)}."
        )
    return src_lines, tgt_lines


def text_line_dataset(path):
    """Returns a `tf.data.Dataset` of the lines of a plain or `.gz` file.

    Args:
        path: str or path-like. `compression_type="GZIP"` is used when the
            name ends with `.gz`.

    Returns:
        `tf.data.Dataset` of scalar `tf.string` (line terminator removed).

    Example:

    ```python
    ds = text_line_dataset("multi30k/val.en.gz").map(tokenizer.tokenize)
    ```
    """
    import tensorflow as tf

    return tf.data.TextLineDataset(
        os.fspath(path), compression_type="GZIP" if _is_gzip(path) else ""
    )
