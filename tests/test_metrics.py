"""Tests for keras_transformer.metrics (backend-agnostic)."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.metrics import masked_accuracy

PAD = 0
VOCAB = 10


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def scores_for(predicted_ids):
    """Logits whose argmax is `predicted_ids`."""
    return np.eye(VOCAB, dtype="float32")[np.asarray(predicted_ids)] * 5.0


def test_c22_accuracy_ignores_padding():
    """C22: labels [[5, 6, pad, pad]], argmax [[5, 9, pad, pad]] -> 0.5,
    not the 0.75 that counting padding gives."""
    labels = np.array([[5, 6, PAD, PAD]], dtype="int32")
    y_pred = scores_for([[5, 9, PAD, PAD]])
    assert float(to_numpy(masked_accuracy(labels, y_pred))) == 0.5
    metric = MaskedAccuracy(pad_id=PAD)
    metric.update_state(labels, y_pred)
    assert float(to_numpy(metric.result())) == 0.5
    # What an unmasked accuracy reports on the same input.
    assert np.mean(labels == np.argmax(y_pred, -1)) == 0.75


def test_ties_and_random_logits_follow_numpy_argmax():
    """The prediction is the first largest logit (NumPy's argmax): a row of
    equal logits predicts id 0, so its label 3 is a miss, not a hit."""
    rng = np.random.default_rng(0)
    labels = rng.integers(1, VOCAB, size=(4, 6)).astype("int32")
    labels[:, 4:] = PAD
    y_pred = rng.normal(size=(4, 6, VOCAB)).astype("float32")
    y_pred[0, 0] = 0.0  # a tie: argmax 0
    labels[0, 0] = 3
    y_pred[1, 1, labels[1, 1]] = 9.0  # a sure hit
    real = labels != PAD
    expected = np.sum((np.argmax(y_pred, -1) == labels) & real) / np.sum(real)
    assert 0 < expected < 1
    np.testing.assert_allclose(to_numpy(masked_accuracy(labels, y_pred)), expected, rtol=1e-6)


def test_c22_all_padding_row_contributes_nothing_and_no_nan():
    """C22: an all-padding row changes nothing; all-padding alone gives 0."""
    labels = np.array([[5, 6, PAD, PAD], [PAD, PAD, PAD, PAD]], dtype="int32")
    y_pred = scores_for([[5, 9, PAD, PAD], [PAD, PAD, PAD, PAD]])
    assert float(to_numpy(masked_accuracy(labels, y_pred))) == 0.5
    metric = MaskedAccuracy()
    metric.update_state(labels, y_pred)
    assert float(to_numpy(metric.result())) == 0.5

    only_padding = np.zeros((2, 4), dtype="int32")
    value = float(to_numpy(masked_accuracy(only_padding, scores_for(
        only_padding))))
    assert value == 0.0 and not math.isnan(value)
    metric = MaskedAccuracy()
    assert float(to_numpy(metric.result())) == 0.0  # nothing counted yet
    metric.update_state(only_padding, scores_for(only_padding))
    result = float(to_numpy(metric.result()))
    assert result == 0.0 and not math.isnan(result)


def test_accumulates_tokens_across_batches():
    """Token-level over batches: 1/2 then 3/3 gives 4/5, not (0.5 + 1) / 2."""
    metric = MaskedAccuracy()
    metric.update_state(
        np.array([[5, 6, PAD]], "int32"), scores_for([[5, 9, PAD]])
    )
    metric.update_state(
        np.array([[1, 2, 3]], "int32"), scores_for([[1, 2, 3]])
    )
    assert float(to_numpy(metric.result())) == pytest.approx(0.8, rel=1e-7)
    metric.reset_state()
    assert float(to_numpy(metric.result())) == 0.0


def test_sample_weight_weighs_hits_and_counts():
    metric = MaskedAccuracy()
    labels = np.array([[5, 6, PAD], [1, 2, 3]], "int32")
    y_pred = scores_for([[5, 9, PAD], [1, 2, 3]])
    metric.update_state(labels, y_pred, sample_weight=np.array([3.0, 1.0]))
    # (3 * 1 + 1 * 3) / (3 * 2 + 1 * 3) = 6 / 9
    assert float(to_numpy(metric.result())) == pytest.approx(6 / 9, rel=1e-6)


def test_other_pad_id_and_trailing_unit_axis():
    labels = np.array([[5, 6, 1, 1]], dtype="int32")
    y_pred = scores_for([[5, 9, 1, 1]])
    assert float(to_numpy(
        masked_accuracy(labels[..., None], y_pred, pad_id=1)
    )) == 0.5


def c22_model():
    """Embedding whose output row for id i peaks at i: argmax == input."""
    inputs = keras.Input(shape=(4,), dtype="int32")
    embedding = keras.layers.Embedding(VOCAB, VOCAB)
    model = keras.Model(inputs, embedding(inputs))
    embedding.set_weights([np.eye(VOCAB, dtype="float32") * 5.0])
    return model


def test_c22_model_evaluate_reports_the_same_value():
    """C22: model.evaluate reports 0.5, with an all-padding row in its own
    batch contributing nothing."""
    model = c22_model()
    model.compile(
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=0.0),
        metrics=[MaskedAccuracy(pad_id=PAD)],
    )
    x = np.array([[5, 9, PAD, PAD], [PAD, PAD, PAD, PAD]], dtype="int32")
    y = np.array([[5, 6, PAD, PAD], [PAD, PAD, PAD, PAD]], dtype="int32")
    for batch_size in [1, 2]:
        logs = model.evaluate(
            x, y, batch_size=batch_size, verbose=0, return_dict=True
        )
        assert logs["masked_accuracy"] == pytest.approx(0.5, rel=1e-7)

    # Token-weighted across batches of different real lengths: 1/2 and 3/3.
    x = np.array([[5, 9, PAD, PAD], [1, 2, 3, PAD]], dtype="int32")
    y = np.array([[5, 6, PAD, PAD], [1, 2, 3, PAD]], dtype="int32")
    logs = model.evaluate(x, y, batch_size=1, verbose=0, return_dict=True)
    assert logs["masked_accuracy"] == pytest.approx(0.8, rel=1e-7)


def test_config_round_trip_and_saved_model(tmp_path):
    metric = MaskedAccuracy(pad_id=3, name="token_accuracy")
    config = metric.get_config()
    assert config["pad_id"] == 3
    assert config["name"] == "token_accuracy"
    restored = MaskedAccuracy.from_config(config)
    assert restored.get_config() == config
    serialized = keras.saving.serialize_keras_object(metric)
    assert serialized["registered_name"] == "keras_transformer>MaskedAccuracy"
    restored = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(restored, MaskedAccuracy)
    assert restored.pad_id == 3

    model = c22_model()
    model.compile(
        optimizer="adam",
        loss=MaskedSparseCategoricalCrossentropy(),
        metrics=[MaskedAccuracy()],
    )
    model.optimizer.build(model.trainable_variables)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = np.array([[5, 9, PAD, PAD]], dtype="int32")
    y = np.array([[5, 6, PAD, PAD]], dtype="int32")
    logs = loaded.evaluate(x, y, verbose=0, return_dict=True)
    assert logs["masked_accuracy"] == pytest.approx(0.5, rel=1e-7)


def test_invalid_pad_id_raises():
    with pytest.raises(ValueError, match="pad_id"):
        MaskedAccuracy(pad_id="0")
    assert MaskedAccuracy(pad_id=np.int32(0)).get_config()["pad_id"] == 0  # was refused
    for dtype in ("int32", "float16", "bfloat16"):  # 0.5 read as 0; counts stuck at 2,048 (a new-user trial)
        with pytest.raises(ValueError, match=f"counts tokens in its `dtype`, float32 or float64; got {dtype}"):
            MaskedAccuracy(dtype=dtype)
    with pytest.raises(ValueError, match="one rank lower"):
        masked_accuracy(np.zeros((1, 2, 3), "int32"), np.zeros((1, 2, 4)))
    # The message gives the labels' shape (it printed the literal "{tuple(y_true.shape)}").
    with pytest.raises(ValueError, match=r"y_true.shape=\(4,\), y_pred.shape=\(3, 4, 7\)"):
        MaskedAccuracy().update_state(np.zeros((4,), "int32"), np.zeros((3, 4, 7), "float32"))


def test_labels_of_another_batch_or_length_are_refused_not_broadcast():
    """(2, 1) labels against (2, 4, vocab) scores broadcast into an accuracy
    of 3.0, and (1, T) labels against 3 rows into 1.0, without a word; (2, 4)
    labels against (2, 6) scores failed inside jax and torch (a new-user
    trial). The loss said it clearly; so does the metric now."""
    scores = scores_for([[5, 5, 5, PAD]] * 2)
    for labels, axis in ((np.array([[5], [5]]), 1), (np.array([[5, 6, 7, PAD]]), 0)):
        with pytest.raises(ValueError, match=f"Labels and predictions differ in shape.*axis {axis}"):
            masked_accuracy(labels, scores)
        with pytest.raises(ValueError, match=f"Labels and predictions differ in shape.*axis {axis}"):
            MaskedAccuracy().update_state(labels, scores)
    with pytest.raises(ValueError, match=r"differ in shape: labels \(2, 3\) against predictions \(2, 4\)"):
        masked_accuracy(np.ones((2, 3), "int32"), np.ones((2, 4), "int32"))  # predicted ids


def test_the_function_metric_is_saved_and_loaded_with_a_model(tmp_path):
    """`metrics=[masked_accuracy]` saved, then `load_model` failed: "Could
    not locate function 'masked_accuracy'" (a new-user trial)."""
    model = c22_model()
    model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(), metrics=[masked_accuracy])
    x = np.array([[5, 9, PAD, PAD]], dtype="int32")
    y = np.array([[5, 6, PAD, PAD]], dtype="int32")
    model.fit(x, y, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    logs = loaded.evaluate(x, y, verbose=0, return_dict=True)
    assert logs["masked_accuracy"] == pytest.approx(model.evaluate(x, y, verbose=0, return_dict=True)["masked_accuracy"])
