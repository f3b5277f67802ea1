"""Decoding strategies as objects (issue 16): `decoding.strategies`, and the
`Translator` and command line taking one."""

import keras
import numpy as np
import pytest

from conftest import to_numpy
from keras_transformer import TransformerParts
from keras_transformer import beam_search
from keras_transformer import build_transformer
from keras_transformer import greedy_search
from keras_transformer.decoding import strategies

START, END, PAD = 2, 3, 0
SOURCES = np.array([[5, 6, 7, END, PAD, PAD], [8, 9, 10, 11, 12, END]], "int32")


@pytest.fixture(scope="module")
def parts():
    keras.utils.set_random_seed(1)
    model = build_transformer(30, 25, num_layers=1, d_model=16, num_heads=2, dff=32,
                              dropout_rate=0.0, sequence_length=10)
    return TransformerParts(model)


def test_get_accepts_names_configs_and_objects_and_refuses_the_rest():
    assert strategies.get("greedy") == strategies.GreedySearch()
    assert strategies.get("beam", beam_size=5) == strategies.BeamSearch(5, 0.6, 1)
    beam = strategies.get({"name": "beam", "beam_size": 3, "length_penalty": 1.0, "n_best": 2})
    assert (beam.beam_size, beam.length_penalty, beam.n_best, beam.max_n_best) == (3, 1.0, 2, 3)
    assert strategies.get(beam) is beam
    assert strategies.get({"name": beam.name, **beam.get_config()}) == beam  # config round trip
    with pytest.raises(ValueError, match="Unknown decoding strategy 'sampling'.*beam.*greedy"):
        strategies.get("sampling")
    with pytest.raises(ValueError, match=r"'greedy' search: unknown settings \['beam_size'\]; it takes none"):
        strategies.get("greedy", beam_size=2)
    with pytest.raises(ValueError, match=r"unknown settings \['bogus'\]; it takes \['beam_size'"):
        strategies.get({"name": "beam", "beam_size": 3, "bogus": 1})
    with pytest.raises(ValueError, match="beam_size >= 2"):
        strategies.BeamSearch(1)
    with pytest.raises(ValueError, match="n_best"):
        strategies.BeamSearch(3, n_best=4)
    with pytest.raises(ValueError, match="length_penalty"):
        strategies.BeamSearch(3, length_penalty=float("nan"))


def test_strategies_return_what_the_search_functions_return(parts):
    ids = dict(start_id=START, end_id=END)
    tokens, scores = strategies.GreedySearch()(parts, SOURCES, **ids)
    want_tokens, want_scores = greedy_search(parts, SOURCES, **ids)
    np.testing.assert_array_equal(to_numpy(tokens)[:, 0], to_numpy(want_tokens))
    np.testing.assert_allclose(to_numpy(scores)[:, 0], to_numpy(want_scores), atol=1e-6)
    tokens, scores = strategies.BeamSearch(3, 0.6, n_best=2)(parts, SOURCES, **ids)
    want_tokens, want_scores = beam_search(parts, SOURCES, beam_size=3, n_best=2, **ids)
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(want_tokens))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(want_scores), atol=1e-6)
    with pytest.raises(ValueError, match="n_best=1"):
        strategies.GreedySearch()(parts, SOURCES, n_best=2, **ids)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="the Translator is TensorFlow")
def test_translator_takes_a_strategy():
    import tensorflow as tf

    from keras_transformer import Translator
    from keras_transformer.data.synthetic import make_synthetic_corpus
    from keras_transformer.tokenizers import train_subword_tokenizer

    en, de = make_synthetic_corpus(300, seed=0)
    src, tgt = train_subword_tokenizer(en, 120), train_subword_tokenizer(de, 120)
    keras.utils.set_random_seed(0)
    model = build_transformer(src.vocab_size, tgt.vocab_size, num_layers=1, d_model=16, num_heads=2,
                              dff=32, sequence_length=12)
    text = tf.constant(en[:3])
    by_settings = Translator(model, src, tgt, beam_size=3, length_penalty=1.0)
    by_object = Translator(model, src, tgt, search=strategies.BeamSearch(3, 1.0))
    by_name = Translator(model, src, tgt, search={"name": "beam", "beam_size": 3, "length_penalty": 1.0})
    want = by_settings(text).numpy().tolist()
    assert by_object(text).numpy().tolist() == want == by_name(text).numpy().tolist()
    assert by_object.beam_size == 3 and by_object.length_penalty == 1.0
    greedy = Translator(model, src, tgt, search="greedy")
    assert greedy.beam_size == 1
    assert greedy(text).numpy().tolist() == Translator(model, src, tgt, beam_size=1)(text).numpy().tolist()
    with pytest.raises(ValueError, match="either `search` or `beam_size`"):
        Translator(model, src, tgt, search="greedy", beam_size=4)
    with pytest.raises(ValueError, match="n_best=1 only"):
        greedy.translate_ids(src.tokenize(text).to_tensor(), n_best=2)


def test_command_line_search_flag_refuses_contradictions(tmp_path, capsys):
    from keras_transformer.cli import main

    for argv, message in (
        (["--search", "greedy", "--beam-size", "3"], "--search greedy keeps one hypothesis"),
        (["--search", "beam", "--beam-size", "1"], "--search beam needs --beam-size 2"),
    ):
        with pytest.raises(SystemExit):
            main(["translate", "--run", str(tmp_path), *argv, "A dog."])
        assert message in capsys.readouterr().err
