"""Ensemble decoding: several models' mean distribution a step
(`decoding.ensemble.EnsembleParts`), checked against NumPy references built
from each model's own uncached full pass.

Backend-neutral apart from the tests marked for tensorflow.
"""

import os
import shutil

import keras
import numpy as np
import pytest

from conftest import to_numpy
from keras_transformer import TransformerParts
from keras_transformer import beam_search
from keras_transformer import build_transformer
from keras_transformer import greedy_search
from keras_transformer.decoding import EnsembleParts

START, END, PAD = 2, 3, 0
SOURCES = np.array([[5, 6, 7, END, PAD, PAD], [8, 9, 10, 11, 12, END]], "int32")
TENSORFLOW = keras.backend.backend() == "tensorflow"


def _model(seed, **sizes):
    keras.utils.set_random_seed(seed)
    settings = dict(num_layers=2, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, sequence_length=10)
    settings.update(sizes)
    return build_transformer(30, 25, **settings)


@pytest.fixture(scope="module")
def members():
    """Two models of other depth, width and heads, on one vocabulary."""
    return [TransformerParts(_model(0)), TransformerParts(_model(1, num_layers=1, d_model=24, num_heads=3))]


def _log_mean_softmax(logits):
    """NumPy: log of the mean of the softmax of each `(M, ..., vocab)` row."""
    logits = np.asarray(logits, "float64")
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.log(probs.mean(0))


def test_ensemble_step_is_the_log_of_the_members_mean_distribution(members):
    """Cached steps of the ensemble equal the log of the mean of the
    members' softmaxes over their own uncached full passes (NumPy)."""
    ensemble = EnsembleParts(members)
    target = np.array([[START, 4, 5, 6, 7], [START, 9, 9, 8, 4]], "int32")
    want = _log_mean_softmax([to_numpy(m.decode_uncached(SOURCES, target)) for m in members])
    np.testing.assert_allclose(to_numpy(ensemble.decode_uncached(SOURCES, target)), want, atol=1e-5)
    encoder_outputs, mask = ensemble.encode(SOURCES)
    assert tuple(encoder_outputs.shape) == (2, SOURCES.shape[1], 16 + 24)
    cross = ensemble.cross_caches(encoder_outputs)
    caches = ensemble.empty_self_caches(2, ensemble.target_sequence_length, "float32")
    assert len(caches) == 3  # 2 + 1 decoder layers
    weights = ensemble.decoding_weights()
    for t in range(target.shape[1]):
        log_probs, caches = ensemble.decode_step(target[:, t], t, caches, cross, mask, weights=weights)
        np.testing.assert_allclose(to_numpy(log_probs), want[:, t], atol=1e-5)
        np.testing.assert_allclose(np.exp(to_numpy(log_probs)).sum(-1), 1.0, atol=1e-5)


def test_ensemble_greedy_search_picks_the_argmax_of_the_mean_distribution(members):
    """Greedy decoding of the ensemble equals a NumPy loop that feeds each
    prefix to every member uncached and takes the argmax of their mean
    distribution; and the ensemble differs from each member alone here."""
    ensemble = EnsembleParts(members)
    tokens, scores = greedy_search(ensemble, SOURCES, start_id=START, end_id=END)
    tokens, scores = to_numpy(tokens), to_numpy(scores)
    length = ensemble.target_sequence_length
    for row in range(2):
        prefix, total = [START], 0.0
        for _ in range(length):
            padded = np.array([prefix + [PAD] * (length - len(prefix))], "int32")
            logits = [to_numpy(m.decode_uncached(SOURCES[row:row + 1], padded))[0, len(prefix) - 1]
                      for m in members]
            log_probs = _log_mean_softmax(logits)
            candidates = log_probs.copy()
            candidates[[PAD, START]] = -np.inf
            nxt = END if len(prefix) == length else int(candidates.argmax())
            total += log_probs[nxt]
            prefix.append(nxt)
            if nxt == END:
                break
        want = prefix[1:] + [PAD] * (length + 1 - len(prefix))
        np.testing.assert_array_equal(tokens[row], want)
        np.testing.assert_allclose(scores[row], total, atol=1e-4)
    alone = [to_numpy(greedy_search(m, SOURCES, start_id=START, end_id=END)[0]) for m in members]
    assert any(not np.array_equal(tokens, a) for a in alone)  # the reference is not one member's


def test_ensemble_of_one_model_twice_decodes_as_that_model():
    """The mean of two equal distributions is that distribution: beam
    search (3 beams, 2-best) gives the single model's ids and scores."""
    model = _model(2)
    twin = _model(3)
    twin.set_weights(model.get_weights())
    single = TransformerParts(model)
    ensemble = EnsembleParts([model, twin])
    kwargs = dict(start_id=START, end_id=END, beam_size=3, n_best=2, length_penalty=1.0)
    want = beam_search(single, SOURCES, **kwargs)
    got = beam_search(ensemble, SOURCES, **kwargs)
    np.testing.assert_array_equal(to_numpy(got[0]), to_numpy(want[0]))
    np.testing.assert_allclose(to_numpy(got[1]), to_numpy(want[1]), atol=1e-5)


def test_ensemble_refuses_bad_members(members):
    with pytest.raises(ValueError, match="two or more"):
        EnsembleParts(members[:1])
    other_vocab = build_transformer(30, 26, num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=10)
    with pytest.raises(ValueError, match="member 1 has target vocabulary size 26 but member 0 has 25"):
        EnsembleParts([members[0], TransformerParts(other_vocab)])
    with pytest.raises(ValueError, match="growing_cache"):
        EnsembleParts([members[0], TransformerParts(members[1].model, growing_cache=True)])
    ensemble = EnsembleParts(members)
    encoder_outputs, mask = ensemble.encode(SOURCES)
    caches = ensemble.empty_self_caches(2, 10, "float32")
    with pytest.raises(ValueError, match="no one set of attention weights"):
        ensemble.decode_step(np.array([START, START], "int32"), 0, caches, ensemble.cross_caches(encoder_outputs),
                             mask, return_attention_scores=True)


@pytest.mark.skipif(not TENSORFLOW, reason="a tensorflow graph fast path")
def test_ensemble_growing_caches_in_a_graph_give_the_fixed_caches_results(members):
    """The Translator's graph search (growing caches, sentences leaving the
    batch) gives the fixed caches' beams for an ensemble too."""
    import tensorflow as tf

    fixed = EnsembleParts(members)
    growing = EnsembleParts([TransformerParts(m.model, growing_cache=True) for m in members])
    varied = np.array([[5, END, 0, 0, 0, 0], [5, 6, 7, 8, 9, END], [8, 9, END, 0, 0, 0]], "int32")
    kwargs = dict(start_id=START, end_id=END, beam_size=3, n_best=2, length_ratio=0.5, length_offset=1)
    spec = [tf.TensorSpec([None, None], tf.int32)]
    results = [tf.function(lambda s, p=p: beam_search(p, s, **kwargs), input_signature=spec)(varied)
               for p in (fixed, growing)]
    np.testing.assert_array_equal(to_numpy(results[1][0]), to_numpy(results[0][0]))
    np.testing.assert_allclose(to_numpy(results[1][1]), to_numpy(results[0][1]), atol=1e-5)


SHIPPED = "saved_models/multi30k-en-de"


@pytest.mark.skipif(not TENSORFLOW, reason="Translator and the command line need tensorflow")
def test_cli_ensemble_of_the_shipped_model_twice_translates_as_the_shipped_model(tmp_path, capsys):
    """`translate --ensemble A --ensemble A` with the SavedModel's own search
    gives its translations; an ensemble refuses one member, tokenizers that
    differ and export; the Translator of two models (graph and XLA) agrees."""
    from keras_transformer import cli
    from keras_transformer.export import export_translator
    from keras_transformer.loading import load_ensemble
    from keras_transformer.loading import SavedModelTranslator

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shipped = os.path.join(root, SHIPPED)
    with open(os.path.join(shipped, "keras_transformer.json")) as f:
        import json

        search = json.load(f)["decoding"]
    lines = ["A dog runs.", "Two men are playing soccer in a park.", "A woman in a red coat reads a book."]
    want = SavedModelTranslator(shipped).translate_lines(lines)
    ensemble = load_ensemble([shipped, shipped], beam_size=search["beam_size"],
                             length_penalty=search["length_penalty"])
    assert len(ensemble.models) == 2
    assert ensemble.translate_lines(lines) == want
    xla = load_ensemble([shipped, shipped], beam_size=search["beam_size"],
                        length_penalty=search["length_penalty"], jit_compile=True)
    assert xla.translate_lines(lines[:1]) == want[:1]
    with pytest.raises(ValueError, match="ensemble of 2 models"):
        export_translator(ensemble, str(tmp_path / "export"))
    with pytest.raises(ValueError, match="two or more"):
        load_ensemble([shipped])
    # One path as a str was read character by character ("/ is neither a SavedModel").
    with pytest.raises(TypeError, match="a list of two or more model folders; got one"):
        load_ensemble(shipped)
    # The shipped en-de and de-en models share one vocabulary: their recorded
    # pairs keep them apart.
    with pytest.raises(ValueError, match="multi30k-de-en translates de->en and .*multi30k-en-de en->de"):
        load_ensemble([shipped, os.path.join(root, "saved_models/multi30k-de-en")])
    en_fr = os.path.join(root, "saved_models/multi30k-en-fr")
    with pytest.raises(ValueError, match="multi30k-en-fr translates en->fr and .*multi30k-en-de en->de"):
        load_ensemble([shipped, en_fr])
    # An export that records no pair (as older ones did) is held to the
    # tokenizers instead.
    unrecorded = tmp_path / "en-fr-unrecorded"
    shutil.copytree(en_fr, unrecorded)
    (unrecorded / "metrics.json").unlink(missing_ok=True)
    facts = json.loads((unrecorded / "keras_transformer.json").read_text())
    facts.pop("languages", None)
    (unrecorded / "keras_transformer.json").write_text(json.dumps(facts))
    with pytest.raises(ValueError, match="another source tokenizer"):
        load_ensemble([shipped, str(unrecorded)])
    cli.main(["translate", "--ensemble", shipped, "--ensemble", shipped, "--beam-size", str(search["beam_size"]),
              "--length-penalty", str(search["length_penalty"]), lines[1]])
    assert capsys.readouterr().out.strip() == want[1]
    with pytest.raises(SystemExit):
        cli.main(["translate", "--ensemble", shipped, "A dog runs."])
    assert "names one model; an ensemble needs two or more" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: not with --saved-model
        cli.main(["translate", "--ensemble", shipped, "--saved-model", shipped, "A dog runs."])
