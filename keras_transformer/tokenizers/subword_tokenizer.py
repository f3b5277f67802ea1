"""SentencePiece subword tokenizer that runs in-graph.

The Transformer of Vaswani et al. (2017) reads and writes subword units
(Section 5.1: byte-pair encoding with a shared source-target vocabulary of
about 37000 tokens). This module trains such a vocabulary with the
SentencePiece trainer and tokenizes with `tensorflow_text`'s
`SentencepieceTokenizer`, so tokenization runs inside `tf.function`,
`tf.data` and an exported SavedModel.

Special ids are fixed for the whole library:

| id | piece   | constant   | meaning                                      |
|----|---------|------------|----------------------------------------------|
| 0  | `<pad>` | `PAD_ID`   | padding; masked out of attention and losses  |
| 1  | `<unk>` | `UNK_ID`   | unknown character (detokenizes as " ⁇ ")     |
| 2  | `<s>`   | `START_ID` | decoder start token                          |
| 3  | `</s>`  | `END_ID`   | end of sequence                              |

Special-token rule (one rule, no exceptions): `<pad>`, `<s>` and `</s>`
are SentencePiece *control symbols*. Control symbols are never produced
from text, so a user who types `"</s>"` or `"<pad>"` gets it encoded as
ordinary pieces (literal text, never `END_ID`/`PAD_ID`), and
`detokenize` renders those pieces back as the same literal text when the
characters are in the vocabulary. Special ids only enter a sequence
through the packing functions in `keras_transformer.data`. Lowercasing
is applied to the *input text* only, so the special pieces keep their exact
case in the vocabulary.
"""

import hashlib
import json
import numbers
import os

import numpy as np
import sentencepiece as spm
import tensorflow as tf
import tensorflow_text as tf_text

from keras_transformer.tokenizers.normalization import prepare_text

PAD_ID = 0
UNK_ID = 1
START_ID = 2
END_ID = 3

PAD_PIECE = "<pad>"
UNK_PIECE = "<unk>"
START_PIECE = "<s>"
END_PIECE = "</s>"

_SPECIALS = {
    PAD_ID: PAD_PIECE,
    UNK_ID: UNK_PIECE,
    START_ID: START_PIECE,
    END_ID: END_PIECE,
}

_METADATA_FORMAT = "keras_transformer.SubwordTokenizer"


def check_alpha(alpha, name="alpha"):
    """Raises ValueError unless `alpha` is a number in (0, 1].

    The check of subword regularization's `alpha` (`SubwordTokenizer.sample`),
    reported under the argument's `name`.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not 0 < alpha <= 1:
        raise ValueError(
            f"`{name}` must be a number in (0, 1] (Kudo, 2018, used 0.1 to 0.5; with a unigram "
            f"model smaller samples more varied segmentations). Received: {name}={alpha!r}."
        )


class _SharedSentencepieceResource(tf.saved_model.experimental.TrackableResource):
    """The SentencePiece model resource under a shared name (see __init__)."""

    def __init__(self, proto, name):
        super().__init__()
        self._model = proto
        self._name = name
        _ = self.resource_handle  # creates the resource now

    def _create_resource(self):
        from tensorflow_text.python.ops.sentencepiece_tokenizer import (
            gen_sentencepiece_tokenizer,
        )

        with tf.name_scope(self._name):
            return gen_sentencepiece_tokenizer.sentencepiece_op(
                model=self._model, shared_name=self._name
            )


class SubwordTokenizer(tf.Module):
    """SentencePiece subword tokenizer usable in `tf.function` and `tf.data`.

    Wraps `tensorflow_text.SentencepieceTokenizer` around a serialized
    SentencePiece model proto. It is a `tf.Module`, so a model or
    translator that holds it as an attribute can be exported with
    `tf.saved_model.save`; the SavedModel then loads in a fresh process
    that imports only `tensorflow` and `tensorflow_text`.

    `tokenize` adds no start/end ids (see `keras_transformer.data` for
    packing). `detokenize` gives back the text as `tokenize` normalized it
    (`normalization.normalize_text`: Unicode NFC, each run of whitespace one
    space, no leading or trailing space, no zero-width or control
    characters) when the vocabulary covers it and the proto was trained by
    `train_subword_tokenizer` (SentencePiece's own normalization off); with
    `lowercase=True` the output is lowercased.

    Args:
        proto: bytes. A serialized SentencePiece `ModelProto` whose special
            ids are `<pad>`=0, `<unk>`=1, `<s>`=2, `</s>`=3, such as the one
            produced by `train_subword_tokenizer`.
        lowercase: bool. If `True`, inputs are lowercased with
            `tf.strings.lower(..., encoding="utf-8")` before encoding. Must
            match the setting the vocabulary was trained with. Defaults to
            `False`, the same default as `train_subword_tokenizer`.
        name: str. Optional `tf.Module` name.

    Call arguments (`tokenize`, also `__call__`):
        inputs: `tf.string` scalar or rank-1 tensor (or a Python `str` or
            list of `str`).

    Returns (`tokenize`):
        For a rank-1 input of shape `(batch,)`: a `tf.RaggedTensor` of
        dtype `int32` and shape `(batch, None)`. For a scalar input: a dense
        1-D `int32` tensor of shape `(length,)`. The empty string gives an
        empty row; an empty batch gives shape `(0, None)`.

    Raises:
        TypeError: if `proto` is not `bytes`.
        ValueError: if `proto` cannot be parsed, or its special ids/pieces
            differ from the fixed ones above.

    Example:

    ```python
    from keras_transformer.tokenizers import train_subword_tokenizer

    tokenizer = train_subword_tokenizer(
        ["the small dog runs .", "a big cat sleeps ."] * 50, vocab_size=40
    )
    ids = tokenizer.tokenize(["the dog runs ."])  # RaggedTensor int32
    text = tokenizer.detokenize(ids)  # [b"the dog runs ."]
    ```

    References:
        - [Kudo & Richardson, 2018. SentencePiece: A simple and language
          independent subword tokenizer and detokenizer for Neural Text
          Processing](https://arxiv.org/abs/1808.06226)
        - [Vaswani et al., 2017. Attention Is All You Need, Section 5.1](
          https://arxiv.org/abs/1706.03762)
    """

    pad_id = PAD_ID
    unk_id = UNK_ID
    start_id = START_ID
    end_id = END_ID

    def __init__(self, proto, lowercase=False, name=None):
        super().__init__(name=name)
        if isinstance(proto, bytearray):
            proto = bytes(proto)
        if not isinstance(proto, bytes):
            raise TypeError(
                "`proto` must be the serialized SentencePiece model as "
                f"`bytes`. Received: type(proto)={type(proto).__name__}. "
                "To read a saved tokenizer use `SubwordTokenizer.load(path)`."
            )
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(proto)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError.
            raise ValueError(
                "`proto` is not a valid serialized SentencePiece model "
                f"({len(proto)} bytes): {e}"
            ) from e
        for special_id, piece in _SPECIALS.items():
            if (
                special_id >= processor.get_piece_size()
                or processor.id_to_piece(special_id) != piece
            ):
                found = (
                    processor.id_to_piece(special_id)
                    if special_id < processor.get_piece_size()
                    else None
                )
                raise ValueError(
                    f"The SentencePiece model must have piece {piece!r} at id "
                    f"{special_id}; found {found!r}. Train it with "
                    "`train_subword_tokenizer`, which fixes <pad>=0, <unk>=1, "
                    "<s>=2, </s>=3."
                )
        self._proto = proto
        self._lowercase = bool(lowercase)
        self._processor = processor
        self._vocab_size = int(processor.get_piece_size())
        name = "sentencepiece_" + hashlib.sha1(proto).hexdigest()[:16]
        self._tokenizer = tf_text.SentencepieceTokenizer(
            model=proto, out_type=tf.int32, name=name
        )
        # tensorflow-text creates the model resource "private to the
        # kernel": clearing TensorFlow's eager kernel cache (which
        # `tf.random.set_seed` and `keras.utils.set_random_seed` do) deletes
        # it, and every later call fails with "Resource ... does not exist"
        # (upstream TODO b/318839908). A resource with a shared name lives in
        # the resource manager instead, so it survives. The name is unique to
        # the model, so two tokenizers never share a resource.
        self._tokenizer._model_resource = _SharedSentencepieceResource(
            proto, name
        )
        # Samplers built by `sample`, one per `alpha`; not tracked, so an
        # export after sampling saves what one before it saves.
        object.__setattr__(self, "_samplers", {})

    @property
    def vocab_size(self):
        """int. Number of pieces, special pieces included."""
        return self._vocab_size

    @property
    def lowercase(self):
        """bool. Whether inputs are lowercased before encoding."""
        return self._lowercase

    @property
    def proto(self):
        """bytes. The serialized SentencePiece model."""
        return self._proto

    def tokenize(self, inputs):
        """Encodes strings into subword ids (no start/end ids added).

        Args:
            inputs: `tf.string` tensor of rank 0 or 1, or a Python `str` /
                list of `str`.

        Returns:
            Rank-1 input `(batch,)`: `tf.RaggedTensor`, `int32`,
            `(batch, None)`. Scalar input: dense `int32` tensor
            `(length,)`.

        Raises:
            ValueError: if the input rank is unknown or greater than 1.
        """
        inputs = self._check_rank(inputs, "tokenize")
        return self._tokenizer.tokenize(prepare_text(inputs, self._lowercase))

    @staticmethod
    def _check_rank(inputs, method):
        inputs = tf.convert_to_tensor(inputs, dtype=tf.string)
        rank = inputs.shape.rank
        if rank is None or rank > 1:
            raise ValueError(
                f"`{method}` expects a scalar string or a rank-1 batch of "
                f"strings. Received a tensor with shape {inputs.shape}. "
                "Reshape it to `(batch,)` first."
            )
        return inputs

    def __call__(self, inputs):
        """Same as `tokenize`."""
        return self.tokenize(inputs)

    def sample(self, inputs, alpha):
        """Encodes strings into randomly sampled segmentations.

        Subword regularization (Kudo, 2018, Sections 2.1 and 3.3): each call draws
        one segmentation of each string from the unigram language model's
        lattice over all segmentations (`nbest_size=-1`), with
        probabilities `P(x)**alpha` renormalized (`alpha` is an inverse
        temperature: smaller is more random). With a BPE model,
        SentencePiece applies BPE-dropout with probability `alpha` instead
        (Provilkov et al., 2020): larger is more varied there. Every sample
        detokenizes to the same text as `tokenize`'s ids. The draws use
        SentencePiece's own random generator, not TensorFlow's seed, so they
        are not reproducible.
        Meant for training data only: translate with `tokenize`.

        Args:
            inputs: `tf.string` tensor of rank 0 or 1, or a Python `str` /
                list of `str`.
            alpha: float in `(0, 1]`. Kudo's smoothing parameter (about 0.1
                to 0.5 in the paper's experiments).

        Returns:
            The same shapes and dtype as `tokenize`.

        Raises:
            ValueError: if `alpha` is not in `(0, 1]`, or the input rank is
                unknown or greater than 1.

        References:
            - [Kudo, 2018. Subword Regularization: Improving Neural Network
              Translation Models with Multiple Subword Candidates](
              https://arxiv.org/abs/1804.10959)
        """
        check_alpha(alpha)
        inputs = self._check_rank(inputs, "sample")
        alpha = float(alpha)
        sampler = self._samplers.get(alpha)
        if sampler is None:
            sampler = tf_text.SentencepieceTokenizer(
                model=self._proto, out_type=tf.int32, nbest_size=-1, alpha=alpha
            )
            # The op reads the sampling settings from the Python object and
            # the model from its resource: share this tokenizer's resource
            # (see `__init__`) rather than keeping a second, kernel-private
            # one. One sampler per `alpha`, built on first use.
            sampler._model_resource = self._tokenizer._model_resource
            self._samplers[alpha] = sampler
        return sampler.tokenize(prepare_text(inputs, self._lowercase))

    def detokenize(self, ids):
        """Decodes subword ids back to text.

        Pad ids and start ids are dropped wherever they occur, and each row
        is cut at its first end id (the end id and everything after it are
        dropped). Ids outside `[0, vocab_size)` are dropped as well; unknown
        ids render as " ⁇ ".

        Args:
            ids: integer ids: a dense tensor of shape `(batch, length)`, a
                `tf.RaggedTensor` of shape `(batch, None)`, or a 1-D tensor
                `(length,)` for a single sequence. Python lists work too.

        Returns:
            `tf.string` tensor of shape `(batch,)` for rank-2 input, a
            scalar for rank-1 input.

        Raises:
            ValueError: if `ids` is not of rank 1 or 2.
        """
        if isinstance(ids, tf.RaggedTensor):
            if ids.shape.rank != 2:
                raise ValueError(
                    "`detokenize` expects ids of shape (batch, None). "
                    f"Received a RaggedTensor with shape {ids.shape}."
                )
            dense = ids.to_tensor(default_value=tf.cast(PAD_ID, ids.dtype))
            return self._detokenize_dense(dense)
        if not tf.is_tensor(ids) and np.size(ids) == 0:  # [] converts to float32
            ids = np.zeros(np.shape(ids), np.int32)
        ids = tf.convert_to_tensor(ids)
        if not ids.dtype.is_integer:
            raise ValueError(
                f"`detokenize` expects integer ids. Received dtype {ids.dtype}."
            )
        rank = ids.shape.rank
        if rank == 1:
            return self._detokenize_dense(ids[tf.newaxis, :])[0]
        if rank == 2:
            return self._detokenize_dense(ids)
        raise ValueError(
            "`detokenize` expects ids of shape (length,) or (batch, length). "
            f"Received shape {ids.shape}."
        )

    def _detokenize_dense(self, ids):
        # Ids outside the vocabulary become padding before the cast to int32,
        # which would wrap a large int64 id onto a valid one (2**32 + 20 -> 20).
        wide = tf.cast(ids, tf.int64)
        in_range = tf.logical_and(tf.greater_equal(wide, 0), tf.less(wide, self._vocab_size))
        ids = tf.where(in_range, tf.cast(wide, tf.int32), PAD_ID)
        is_end = tf.cast(tf.equal(ids, END_ID), tf.int32)
        before_end = tf.equal(tf.cumsum(is_end, axis=-1), 0)
        keep = (
            before_end
            & tf.not_equal(ids, PAD_ID)
            & tf.not_equal(ids, START_ID)
        )
        return self._tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))

    def id_to_piece(self, id):
        """Returns the piece (Python `str`) for one id."""
        id = int(id)
        if not 0 <= id < self._vocab_size:
            raise ValueError(
                f"id must be in [0, {self._vocab_size}). Received: id={id}."
            )
        return self._processor.id_to_piece(id)

    def piece_to_id(self, piece):
        """Returns the id of a piece (`UNK_ID` if it is not in the vocab)."""
        return int(self._processor.piece_to_id(piece))

    def vocabulary(self):
        """Returns all pieces as a Python list, indexed by id."""
        return [self._processor.id_to_piece(i) for i in range(self._vocab_size)]

    def save(self, path):
        """Writes `<prefix>.model` (the proto) and `<prefix>.json`.

        Args:
            path: `<prefix>` or `<prefix>.model`. Parent directories are
                created.

        Returns:
            str. The path of the written `.model` file.
        """
        prefix = _strip_model_suffix(path)
        directory = os.path.dirname(prefix)
        if directory:
            os.makedirs(directory, exist_ok=True)
        model_path = prefix + ".model"
        with open(model_path, "wb") as f:
            f.write(self._proto)
        metadata = {
            "format": _METADATA_FORMAT,
            "version": 1,
            "lowercase": self._lowercase,
            "vocab_size": self._vocab_size,
            "pad_id": PAD_ID,
            "unk_id": UNK_ID,
            "start_id": START_ID,
            "end_id": END_ID,
        }
        with open(prefix + ".json", "w", encoding="utf-8") as f:
            json.dump(metadata, f, indent=2)
        return model_path

    @classmethod
    def load(cls, path, lowercase=None):
        """Restores a tokenizer written by `save`.

        Args:
            path: `<prefix>` or `<prefix>.model`.
            lowercase: optional bool overriding the saved setting. When
                `None`, `<prefix>.json` decides; a bare `.model` without
                the JSON file loads with `lowercase=False`.

        Returns:
            `SubwordTokenizer`.

        Raises:
            FileNotFoundError: if `<prefix>.model` does not exist.
        """
        prefix = _strip_model_suffix(path)
        model_path = prefix + ".model"
        if not os.path.exists(model_path):
            raise FileNotFoundError(
                f"No tokenizer model at {model_path!r} (from path={path!r})."
            )
        with open(model_path, "rb") as f:
            proto = f.read()
        metadata_path = prefix + ".json"
        if lowercase is None:
            lowercase = False
            if os.path.exists(metadata_path):
                with open(metadata_path, encoding="utf-8") as f:
                    lowercase = bool(json.load(f).get("lowercase", False))
        return cls(proto, lowercase=lowercase)

    def __repr__(self):
        return (
            f"SubwordTokenizer(vocab_size={self._vocab_size}, "
            f"lowercase={self._lowercase})"
        )


def _strip_model_suffix(path):
    path = os.fspath(path)
    return path[: -len(".model")] if path.endswith(".model") else path
