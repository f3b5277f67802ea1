"""Tests for keras_transformer.tokenizers (SubwordTokenizer, training)."""

import collections
import inspect
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from keras_transformer.data import make_synthetic_corpus
from keras_transformer.data import read_lines
from keras_transformer.tokenizers import END_ID
from keras_transformer.tokenizers import PAD_ID
from keras_transformer.tokenizers import START_ID
from keras_transformer.tokenizers import UNK_ID
from keras_transformer.tokenizers import SubwordTokenizer
from keras_transformer.tokenizers import train_subword_tokenizer
from conftest import multi30k_dir


# Extra training text: mixed case, and the characters of the special pieces
# so that a user typing "</s>" round-trips as literal text.
EXTRA = [
    "Hello World",
    "hello world",
    "HELLO WORLD, hello again.",
    "a < b and c > d, x/y or s/t.",
    "Read <these> and </those> and <pad> and <s>.",
] * 20


@pytest.fixture(scope="module")
def corpus():
    _, german = make_synthetic_corpus(1500, seed=0)
    return german + EXTRA


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_subword_tokenizer(corpus, vocab_size=300)


@pytest.fixture(scope="module")
def lower_tokenizer(corpus):
    return train_subword_tokenizer(corpus, vocab_size=300, lowercase=True)


def to_lists(ragged):
    return [list(row) for row in ragged.to_list()]


def test_special_ids_and_pieces(tokenizer):
    assert (PAD_ID, UNK_ID, START_ID, END_ID) == (0, 1, 2, 3)
    assert tokenizer.pad_id == 0 and tokenizer.start_id == 2
    assert tokenizer.end_id == 3 and tokenizer.unk_id == 1
    assert tokenizer.vocabulary()[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tokenizer.id_to_piece(3) == "</s>"
    assert tokenizer.piece_to_id("<s>") == START_ID
    assert len(tokenizer.vocabulary()) == tokenizer.vocab_size
    assert 100 < tokenizer.vocab_size <= 300


def test_round_trip_is_lossless_on_training_text(tokenizer, corpus):
    """Lossless on normalized text; irregular whitespace comes back in its
    normalized form (issue 17: whitespace variants tokenize alike)."""
    sentences = corpus[:200] + ["Der  Hund   läuft. ", "Hello World"]
    ids = tokenizer.tokenize(sentences)
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.dtype == tf.int32
    decoded = [s.decode("utf-8") for s in tokenizer.detokenize(ids).numpy()]
    assert decoded == corpus[:200] + ["Der Hund läuft.", "Hello World"]


def test_tokenize_adds_no_special_ids(tokenizer):
    ids = tokenizer.tokenize(["Der kleine Hund läuft im Park."])
    flat = ids.flat_values.numpy()
    assert flat.size > 0
    assert not np.isin(flat, [PAD_ID, START_ID, END_ID]).any()


def test_c17_scalar_vector_empty_string_and_empty_batch(tokenizer):
    """C17: scalar in -> 1-D ids -> scalar out; n in -> n out; "" and []."""
    scalar_ids = tokenizer.tokenize(tf.constant("ein Hund"))
    assert isinstance(scalar_ids, tf.Tensor)
    assert scalar_ids.shape.rank == 1 and scalar_ids.dtype == tf.int32
    vector_ids = tokenizer.tokenize(tf.constant(["ein Hund"]))
    assert vector_ids.shape.as_list() == [1, None]
    assert vector_ids.to_list()[0] == scalar_ids.numpy().tolist()

    scalar_text = tokenizer.detokenize(scalar_ids)
    assert scalar_text.shape.rank == 0
    assert scalar_text.numpy() == b"ein Hund"
    vector_text = tokenizer.detokenize(vector_ids)
    assert vector_text.shape.as_list() == [1]
    assert vector_text.numpy().tolist() == [b"ein Hund"]

    empty = tokenizer.tokenize(tf.constant([""]))
    assert empty.to_list() == [[]]
    assert tokenizer.detokenize(empty).numpy().tolist() == [b""]
    assert tokenizer.tokenize(tf.constant("")).shape.as_list() == [0]

    no_rows = tokenizer.tokenize(tf.constant([], tf.string))
    assert no_rows.shape[0] == 0
    assert tokenizer.detokenize(no_rows).shape.as_list() == [0]
    dense_no_rows = tokenizer.detokenize(tf.zeros([0, 5], tf.int32))
    assert dense_no_rows.shape.as_list() == [0]

    three = tokenizer.detokenize(tokenizer.tokenize(["a", "", "Hund"]))
    assert three.numpy().tolist() == [b"a", b"", b"Hund"]


def test_tokenize_rejects_rank_2(tokenizer):
    with pytest.raises(ValueError, match="rank-1"):
        tokenizer.tokenize(tf.constant([["a", "b"]]))


def test_detokenize_drops_pad_start_and_everything_after_end(tokenizer):
    dog = tokenizer.tokenize("Hund").numpy().tolist()
    cat = tokenizer.tokenize("Katze").numpy().tolist()
    dense = tf.constant(
        [
            [START_ID] + dog + [END_ID] + cat + [PAD_ID],
            [START_ID] + cat + [PAD_ID] * (len(dog) + 2),
        ]
    )
    assert tokenizer.detokenize(dense).numpy().tolist() == [b"Hund", b"Katze"]
    ragged = tf.ragged.constant([dog + [END_ID] + cat, [START_ID] + cat])
    assert tokenizer.detokenize(ragged).numpy().tolist() == [b"Hund", b"Katze"]
    one = tokenizer.detokenize([START_ID] + cat + [END_ID] + dog)
    assert one.numpy() == b"Katze"
    # int64 input and out-of-range ids (dropped) are accepted.
    wide = tf.constant([cat + [tokenizer.vocab_size + 7]], tf.int64)
    assert tokenizer.detokenize(wide).numpy().tolist() == [b"Katze"]
    # An int64 id that an int32 cast would wrap onto a valid id (2**32 + d
    # -> d) is out of range too, as are ids below 0 in any integer dtype.
    wrapped = tf.constant([cat + [2**32 + dog[0], -(2**32) + dog[0]]], tf.int64)
    assert tokenizer.detokenize(wrapped).numpy().tolist() == [b"Katze"]
    assert tokenizer.detokenize(tf.constant([cat], tf.uint16)).numpy().tolist() == [b"Katze"]
    # An empty Python list is no ids, not float32 ones.
    assert tokenizer.detokenize([]).numpy() == b""
    assert tokenizer.detokenize([[]]).numpy().tolist() == [b""]


def test_c25_lowercase_gives_equal_ids_for_case_variants(
    tokenizer, lower_tokenizer
):
    """C25: lowercase=True folds case; lowercase=False keeps it."""
    assert lower_tokenizer.lowercase is True
    assert tokenizer.lowercase is False
    lower_ids = lower_tokenizer.tokenize(["Hello World", "hello world"])
    assert lower_ids.to_list()[0] == lower_ids.to_list()[1]
    cased_ids = tokenizer.tokenize(["Hello World", "hello world"])
    assert cased_ids.to_list()[0] != cased_ids.to_list()[1]
    decoded = lower_tokenizer.detokenize(lower_ids).numpy().tolist()
    assert decoded == [b"hello world", b"hello world"]
    # Lowercasing is UTF-8 aware (umlauts fold too).
    umlaut = lower_tokenizer.tokenize(["ÄPFEL", "äpfel"]).to_list()
    assert umlaut[0] == umlaut[1]


def test_c25_vocabulary_case_and_special_pieces(tokenizer, lower_tokenizer):
    """C25: the lowercase vocab has no capitals; specials keep exact case."""
    for tok in (tokenizer, lower_tokenizer):
        assert tok.vocabulary()[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    lower_pieces = lower_tokenizer.vocabulary()[4:]
    assert all(piece == piece.lower() for piece in lower_pieces)
    assert any(piece != piece.lower() for piece in tokenizer.vocabulary())


def test_c25_typed_special_strings_are_literal_text(tokenizer, lower_tokenizer):
    """C25: typed "</s>", "<pad>", "<s>" are literal text, not special ids."""
    text = "Hello </s> World <pad> and <s>"
    for tok, expected in (
        (tokenizer, text),
        (lower_tokenizer, text.lower()),
    ):
        ids = tok.tokenize(text).numpy()
        assert not np.isin(ids, [PAD_ID, UNK_ID, START_ID, END_ID]).any()
        assert tok.detokenize(ids).numpy().decode("utf-8") == expected
    # Upper-case "<S>" lowercased to "<s>" is still text, not START_ID.
    ids = lower_tokenizer.tokenize("a <S> b").numpy()
    assert START_ID not in ids
    assert lower_tokenizer.detokenize(ids).numpy() == b"a <s> b"


def test_c25_builder_and_tokenizer_default_lowercase_agree(corpus):
    builder_default = (
        inspect.signature(train_subword_tokenizer)
        .parameters["lowercase"]
        .default
    )
    tokenizer_default = (
        inspect.signature(SubwordTokenizer).parameters["lowercase"].default
    )
    assert builder_default is False
    assert tokenizer_default is builder_default
    trained = train_subword_tokenizer(corpus[:300], vocab_size=120)
    assert trained.lowercase is False
    assert SubwordTokenizer(trained.proto).lowercase is False


def test_training_is_deterministic(corpus):
    first = train_subword_tokenizer(corpus[:400], vocab_size=150)
    second = train_subword_tokenizer(corpus[:400], vocab_size=150)
    assert first.proto == second.proto


def test_training_from_plain_and_gzip_files(tmp_path, corpus):
    import gzip

    lines = corpus[:400]
    plain = tmp_path / "a.txt"
    plain.write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    packed = tmp_path / "b.txt.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines[200:]) + "\n")
    from_list = train_subword_tokenizer(lines, vocab_size=150)
    from_paths = train_subword_tokenizer([str(plain), packed], vocab_size=150)
    assert from_paths.proto == from_list.proto
    from_one = train_subword_tokenizer(str(plain), vocab_size=120)
    assert from_one.proto == train_subword_tokenizer(lines[:200], 120).proto
    limited = train_subword_tokenizer(lines, vocab_size=150, max_sentences=200)
    assert limited.proto == train_subword_tokenizer(lines[:200], 150).proto
    for bad in (-1, 0, 2.5):  # -1 trained on all but the last sentence (a new-user trial)
        with pytest.raises(ValueError, match=f"`max_sentences` must be a whole number >= 1; got {bad}"):
            train_subword_tokenizer(lines, vocab_size=150, max_sentences=bad)
    # A list of paths with one wrong (a typo, a folder) trained on the two
    # paths' own text as sentences, a vocabulary of 17 (a new-user trial).
    for wrong in (str(tmp_path / "missing.txt"), str(tmp_path)):
        with pytest.raises(ValueError, match="mixes paths of existing files with 1 item.*not files, such as "
                                             f"'{wrong}': fix the path"):
            train_subword_tokenizer([str(plain), wrong], vocab_size=120)


def test_sentences_longer_than_sentencepiece_takes_are_named(corpus):
    """SentencePiece skips sentences above `max_sentence_length` (4,192
    bytes) in training: all of them gave "INTERNAL: ...
    [!sentences_.empty()]", some were dropped without a word."""
    long = "ein hund " * 500  # 4,500 bytes
    with pytest.warns(UserWarning, match="2 of 202 sentences are longer than 4192 UTF-8 bytes"):
        some = train_subword_tokenizer(corpus[:200] + [long, long], vocab_size=120)
    assert some.proto == train_subword_tokenizer(corpus[:200], vocab_size=120).proto
    with pytest.raises(ValueError, match="Every sentence of `data` is longer than 4192 UTF-8 bytes"):
        train_subword_tokenizer([long] * 3, vocab_size=120)
    raised = train_subword_tokenizer([long] * 3, vocab_size=30, max_sentence_length=8192)
    assert raised.vocab_size > 4


def test_vocab_size_too_small_or_too_large():
    sentences = ["abc def", "ghi jkl", "mno pqr"] * 5
    with pytest.raises(ValueError, match="vocab_size=8 is too small"):
        train_subword_tokenizer(sentences, vocab_size=8)
    # Too large: hard_vocab_limit=False gives a smaller vocabulary.
    tok = train_subword_tokenizer(sentences, vocab_size=5000)
    assert 4 + 18 <= tok.vocab_size < 5000
    # byte_fallback adds 256 byte pieces: a vocabulary of 200 blamed the
    # corpus's characters (a new-user trial); now the pieces are named, and
    # one that the byte pieces fill is refused before training.
    with pytest.raises(ValueError, match=r"vocab_size=200 leaves no room for subwords with byte_fallback=True: "
                                         r"its 256 byte pieces and the 4 special pieces take 260 ids"):
        train_subword_tokenizer(sentences, vocab_size=200, byte_fallback=True)
    with pytest.raises(ValueError, match="vocab_size=270 is too small.*plus the 4 special pieces and the 256 byte "
                                         "pieces of byte_fallback"):
        train_subword_tokenizer(sentences, vocab_size=270, byte_fallback=True)
    assert train_subword_tokenizer(sentences, vocab_size=290, byte_fallback=True).vocab_size > 260
    with pytest.raises(ValueError, match="`byte_fallback` must be"):
        train_subword_tokenizer(sentences, vocab_size=290, byte_fallback="False")
    text = tok.detokenize(tok.tokenize(["abc pqr"])).numpy().tolist()
    assert text == [b"abc pqr"]
    with pytest.raises(ValueError, match="fixed by the library"):
        train_subword_tokenizer(sentences, vocab_size=30, eos_id=7)
    with pytest.raises(ValueError, match="no non-empty"):
        train_subword_tokenizer(["", "  "], vocab_size=30)


def test_bpe_model_type(corpus):
    tok = train_subword_tokenizer(
        corpus[:400], vocab_size=200, model_type="bpe"
    )
    sentence = corpus[5]
    assert tok.detokenize(tok.tokenize([sentence])).numpy()[0].decode() == (
        sentence
    )


def test_constructor_validates_proto(tokenizer):
    with pytest.raises(TypeError, match="bytes"):
        SubwordTokenizer("not bytes")
    with pytest.raises(ValueError, match="not a valid"):
        SubwordTokenizer(b"garbage proto")


def test_save_load_round_trip(tmp_path, tokenizer, lower_tokenizer, corpus):
    sentences = corpus[:20] + ["Hello World"]
    for tok, name in ((tokenizer, "cased"), (lower_tokenizer, "lower")):
        model_path = tok.save(str(tmp_path / "vocab" / name))
        assert model_path.endswith(f"{name}.model")
        with open(tmp_path / "vocab" / f"{name}.json") as f:
            assert json.load(f)["lowercase"] is tok.lowercase
        for path in (model_path, str(tmp_path / "vocab" / name)):
            restored = SubwordTokenizer.load(path)
            assert restored.lowercase is tok.lowercase
            assert restored.vocabulary() == tok.vocabulary()
            assert restored.tokenize(sentences).to_list() == (
                tok.tokenize(sentences).to_list()
            )
    with pytest.raises(FileNotFoundError):
        SubwordTokenizer.load(str(tmp_path / "missing"))


def test_usable_in_tf_function_and_tf_data(tokenizer, corpus):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(texts):
        ids = tokenizer.tokenize(texts)
        return ids.to_tensor(), tokenizer.detokenize(ids)

    dense, texts = round_trip(tf.constant(corpus[:4]))
    assert dense.dtype == tf.int32 and dense.shape[0] == 4
    assert [t.decode("utf-8") for t in texts.numpy()] == corpus[:4]

    ds = tf.data.Dataset.from_tensor_slices(corpus[:8]).map(tokenizer.tokenize)
    rows = [row.numpy().tolist() for row in ds]
    assert rows == tokenizer.tokenize(corpus[:8]).to_list()


class _Exported(tf.Module):
    def __init__(self, tokenizer):
        super().__init__()
        self.tokenizer = tokenizer

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, texts):
        return self.tokenizer.tokenize(texts).to_tensor()

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def detokenize(self, ids):
        return self.tokenizer.detokenize(ids)


def test_saved_model_round_trip_in_process(tmp_path, lower_tokenizer):
    texts = ["Hello World", "Der kleine Hund läuft."]
    export_dir = str(tmp_path / "tokenizer_sm")
    tf.saved_model.save(_Exported(lower_tokenizer), export_dir)
    loaded = tf.saved_model.load(export_dir)
    expected = lower_tokenizer.tokenize(texts).to_tensor()
    got = loaded.tokenize(tf.constant(texts))
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
    decoded = loaded.detokenize(got).numpy().tolist()
    assert decoded == [b"hello world", "der kleine hund läuft.".encode()]


@pytest.mark.slow
def test_saved_model_loads_with_only_tensorflow_text(tmp_path, tokenizer):
    """The export loads in a fresh process importing tensorflow(_text) only."""
    texts = ["Hello </s> World", "Die Katzen schlafen im Park."]
    export_dir = str(tmp_path / "tokenizer_sm")
    tf.saved_model.save(_Exported(tokenizer), export_dir)
    script = textwrap.dedent(
        f"""
        import json, sys
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the ops
        loaded = tf.saved_model.load({export_dir!r})
        ids = loaded.tokenize(tf.constant({texts!r}))
        text = loaded.detokenize(ids)
        assert "keras_transformer" not in sys.modules
        print("RESULT" + json.dumps(
            [ids.numpy().tolist(), [t.decode() for t in text.numpy()]]))
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = [s for s in result.stdout.splitlines() if s.startswith("RESULT")]
    ids, decoded = json.loads(line[0][len("RESULT") :])
    expected = tokenizer.tokenize(texts).to_tensor().numpy().tolist()
    assert ids == expected
    assert decoded == texts


@pytest.mark.corpus
def test_round_trip_is_lossless_on_multi30k():
    directory = multi30k_dir()
    for lang in ("de", "en"):
        train = read_lines(os.path.join(directory, f"train.{lang}.gz"))[:2000]
        val = read_lines(os.path.join(directory, f"val.{lang}.gz"))
        tok = train_subword_tokenizer(
            train, vocab_size=2000, byte_fallback=True
        )
        for sentences in (train[:500], val):
            ids = tok.tokenize(sentences)
            decoded = [s.decode("utf-8") for s in tok.detokenize(ids).numpy()]
            # Lossless up to the input normalization (the corpus has a few
            # doubled spaces, which come back single): nothing else changes.
            mismatches = [(a, b) for a, b in zip(sentences, decoded) if " ".join(a.split()) != b]
            assert mismatches == [], mismatches[:3]
        # Subwords, not characters: a sentence is a few pieces per word.
        words = sum(len(s.split()) for s in val)
        assert ids.flat_values.shape[0] < 2.0 * words


def test_tokenizer_survives_set_random_seed():
    """Seeding clears TF's kernel cache; the SentencePiece resource must survive.

    tensorflow-text's own resource is private to its kernel and is deleted
    by `tf.random.set_seed`, after which every call fails deep in the graph.
    """
    import keras

    from keras_transformer.data.synthetic import make_synthetic_corpus

    en, _ = make_synthetic_corpus(200, seed=3)
    tokenizer = train_subword_tokenizer(en, 100)
    before = tokenizer.tokenize(["A dog runs."]).to_list()
    keras.utils.set_random_seed(1)
    assert tokenizer.tokenize(["A dog runs."]).to_list() == before
    assert tokenizer.detokenize(before).numpy().tolist() == [b"A dog runs."]


def _segmentation_distribution(tokenizer, text, alpha):
    """Kudo (2018), Section 3.3: every segmentation x of `text` with probability
    P(x)**alpha / Z, P(x) the product of its pieces' unigram probabilities
    (the model's scores are their logs); all of them, from SentencePiece's
    n-best list."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(tokenizer.proto)
    segmentations = processor.nbest_encode_as_ids(text, 512)
    assert len(segmentations) < 512  # the list is complete
    log_p = np.array([sum(processor.GetScore(i) for i in s) for s in segmentations])
    q = np.exp(alpha * (log_p - log_p.max()))
    return [tuple(s) for s in segmentations], q / q.sum()


@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_sample_draws_segmentations_with_kudos_probabilities(tokenizer, alpha):
    text = "Hundekatzenpark"
    segmentations, q = _segmentation_distribution(tokenizer, text, alpha)
    draws = to_lists(tokenizer.sample([text] * 4000, alpha))
    counts = collections.Counter(tuple(d) for d in draws)
    assert sum(counts[s] for s in segmentations) == 4000  # nothing outside the lattice
    empirical = np.array([counts[s] / 4000 for s in segmentations])
    assert q.max() < 0.9  # a spread distribution, so the comparison means something
    assert 0.5 * np.abs(empirical - q).sum() < 0.05  # total variation
    # The other alpha's distribution is far from these draws.
    _, other = _segmentation_distribution(tokenizer, text, 0.4 - alpha)
    assert 0.5 * np.abs(empirical - other).sum() > 0.1


def test_sample_detokenizes_to_the_same_text_and_varies(tokenizer, lower_tokenizer, corpus):
    sentences = corpus[:200]
    fixed = tokenizer.tokenize(sentences)
    first, second = tokenizer.sample(sentences, 0.2), tokenizer.sample(sentences, 0.2)
    for ids in (first, second):
        assert ids.dtype == tf.int32
        assert tokenizer.detokenize(ids).numpy().tolist() == tokenizer.detokenize(fixed).numpy().tolist()
        assert sum(a != b for a, b in zip(to_lists(ids), to_lists(fixed))) > 50
    assert to_lists(first) != to_lists(second)
    # Smaller alpha: more varied, so longer, segmentations.
    lengths = {a: int(tokenizer.sample(sentences, a).flat_values.shape[0]) for a in (0.1, 0.5)}
    assert lengths[0.1] > lengths[0.5] > int(fixed.flat_values.shape[0])
    # Scalars as in `tokenize`; the lowercase setting applies.
    assert tokenizer.sample("Der Hund.", 0.5).shape.rank == 1
    text = lower_tokenizer.detokenize(lower_tokenizer.sample(["HELLO WORLD"], 0.2)).numpy()[0]
    assert text == b"hello world"


@pytest.mark.parametrize("alpha", [0, -0.1, 1.5, True, "0.1", None])
def test_sample_refuses_an_alpha_outside_0_1(tokenizer, alpha):
    with pytest.raises(ValueError, match=r"`alpha` must be a number in \(0, 1\]"):
        tokenizer.sample(["Der Hund."], alpha)


def test_sample_on_a_bpe_model_is_bpe_dropout(corpus):
    """With BPE, SentencePiece reads `alpha` as the dropout probability of
    merges (Provilkov et al., 2020): larger gives more, shorter pieces."""
    bpe = train_subword_tokenizer(corpus, vocab_size=300, model_type="bpe")
    sentences = corpus[:100]
    fixed = bpe.tokenize(sentences)
    lengths = {}
    for alpha in (0.1, 0.5):
        ids = bpe.sample(sentences, alpha)
        assert bpe.detokenize(ids).numpy().tolist() == bpe.detokenize(fixed).numpy().tolist()
        lengths[alpha] = int(ids.flat_values.shape[0])
    assert lengths[0.5] > lengths[0.1] > int(fixed.flat_values.shape[0])


def test_sampling_leaves_what_a_savedmodel_holds_unchanged(tokenizer, tmp_path):
    """`sample` keeps one sampler per alpha out of the tracked state: a
    tokenizer saved after sampling saves the same objects as before it, and
    still tokenizes with the fixed segmentation."""

    def saved_nodes(module, path):
        tf.saved_model.save(module, str(path))
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
        return len(proto.meta_graphs[0].object_graph_def.nodes)

    fresh = SubwordTokenizer(tokenizer.proto)
    before = saved_nodes(fresh, tmp_path / "before")
    for alpha in (0.1, 0.1, 0.5):
        fresh.sample(["Der Hund."], alpha)
    assert len(fresh._samplers) == 2  # built once per alpha
    assert saved_nodes(fresh, tmp_path / "after") == before
    sentences = ["Ein Hund rennt im Park.", "Zwei Kinder spielen."]
    assert to_lists(fresh.tokenize(sentences)) == to_lists(tokenizer.tokenize(sentences))
