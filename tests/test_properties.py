"""Property-based tests (hypothesis) over arbitrary Unicode, control,
combining and private-use characters included: the tokenizer and the
string signatures never crash, never emit a special token, and give the
same output for the same input (tensorflow backend)."""

import keras
import numpy as np
import pytest

if keras.backend.backend() != "tensorflow":
    pytest.skip("the tokenizers and Translator are TensorFlow ops", allow_module_level=True)

import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from keras_transformer import Translator, build_transformer  # noqa: E402
from keras_transformer.data.synthetic import make_synthetic_corpus  # noqa: E402
from keras_transformer.tokenizers import train_subword_tokenizer  # noqa: E402

SPECIAL_PIECES = ("<pad>", "<unk>", "<s>", "</s>")
# Any code point but surrogates (not encodable as UTF-8): letters, marks
# (combining), controls (Cc), format (Cf), private use (Co), spaces.
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def translators():
    english, german = make_synthetic_corpus(300, seed=8)
    src, tgt = train_subword_tokenizer(english, 120), train_subword_tokenizer(german, 120)
    keras.utils.set_random_seed(8)
    model = build_transformer(src.vocab_size, tgt.vocab_size, num_layers=1, d_model=16, num_heads=2,
                              dff=32, dropout_rate=0.0, sequence_length=16)
    return src, {beam: Translator(model, src, tgt, beam_size=beam) for beam in (1, 3)}


@SETTINGS
@given(text=TEXT)
def test_tokenizer_round_trip_never_crashes_and_is_stable(translators, text):
    tokenizer = translators[0]
    ids = tokenizer.tokenize(tf.constant([text, text]))
    rows = ids.to_list()
    assert rows[0] == rows[1]
    assert all(0 <= i < tokenizer.vocab_size for i in rows[0])
    assert not {tokenizer.pad_id, tokenizer.start_id, tokenizer.end_id} & set(rows[0])
    back = tokenizer.detokenize(tf.ragged.constant([rows[0]], dtype=tf.int32)).numpy()[0].decode("utf-8")
    assert not any(piece in back for piece in SPECIAL_PIECES)


@SETTINGS
@given(texts=st.lists(TEXT, min_size=1, max_size=3))
def test_string_signatures_never_crash_or_emit_special_tokens(translators, texts):
    _, by_beam = translators
    for translator in by_beam.values():
        first = translator.serve(tf.constant(texts))
        again = translator.serve(tf.constant(texts))
        translations = [t.decode("utf-8") for t in first["translation"].numpy()]
        assert translations == [t.decode("utf-8") for t in again["translation"].numpy()]
        assert np.all(np.isfinite(first["score"].numpy()))
        for translation in translations:
            assert not any(piece in translation for piece in SPECIAL_PIECES)
            assert "\u2047" not in translation  # the unknown id's " ⁇ "
            assert translation == translation.strip()
