"""Reading line-aligned text files (plain or gzip)."""

import gzip
import os

from keras_transformer.config import check_files  # noqa: F401 (public here too)


# Leading bytes of compressed files: gzip is read whatever the file's name;
# the others are named in the error (they read as text that is not UTF-8).
_GZIP_MAGIC = b"\x1f\x8b"
_OTHER_COMPRESSIONS = ((b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x28\xb5\x2f\xfd", "zstd"),
                       (b"PK\x03\x04", "zip"))


def _is_gzip(path):
    """True for a `.gz` name (any case) or gzip data under another name;
    False for plain text.

    Raises:
        ValueError: for a file compressed otherwise (bzip2, xz, zstd, zip),
            which would read as text that is not UTF-8.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError:
        head = b""  # the open that follows reports it
    if os.fspath(path).lower().endswith(".gz") or head.startswith(_GZIP_MAGIC):
        return True
    for magic, name in _OTHER_COMPRESSIONS:
        if head.startswith(magic):
            raise ValueError(f"{os.fspath(path)} is {name}-compressed, which is not read: decompress it, "
                             "or compress it with gzip (plain text and gzip are read).")
    return False


def read_lines(path):
    """Reads a UTF-8 text file (plain or `.gz`) into a list of lines.

    Lines are split on `"\\n"` only (as `tf.data.TextLineDataset` does, so
    both give the same line count); the line terminator (`"\\n"` or
    `"\\r\\n"`) is stripped, and so is a byte-order mark (U+FEFF) that
    starts the file; leading/trailing spaces are kept.

    Args:
        path: str or path-like. Files whose name ends with `.gz` (in any
            case) or that hold gzip data are decompressed.

    Returns:
        list of `str`, one per line.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: if the file is not UTF-8 text, is compressed otherwise
            than with gzip (bzip2, xz, zstd, zip), or a `.gz` name holds no
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
        named = "ends with .gz" if os.fspath(path).lower().endswith(".gz") else "starts as gzip data"
        raise ValueError(f"{os.fspath(path)} {named} but is not a complete gzip file ({error}); "
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
    """Returns a `tf.data.Dataset` of the lines of a plain or `.gz` file:
    the lines of `read_lines` (a byte-order mark that starts the file
    removed too).

    Args:
        path: str or path-like. `compression_type="GZIP"` is used for the
            files `read_lines` decompresses.

    Returns:
        `tf.data.Dataset` of scalar `tf.string` (line terminator removed).

    Example:

    ```python
    ds = text_line_dataset("multi30k/val.en.gz").map(tokenizer.tokenize)
    ```
    """
    import tensorflow as tf

    lines = tf.data.TextLineDataset(os.fspath(path), compression_type="GZIP" if _is_gzip(path) else "")
    # A byte-order mark starts a file only: the first line's is dropped.
    first = lines.take(1).map(lambda line: tf.strings.regex_replace(line, "^\ufeff", ""))
    return first.concatenate(lines.skip(1))
