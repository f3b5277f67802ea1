"""Tests for keras_transformer.losses (backend-agnostic)."""

import re
import keras
import numpy as np
import pytest
from keras import ops

from conftest import gradient_of
from conftest import to_numpy
from keras_transformer.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.losses import masked_loss
from keras_transformer.losses import per_token_loss

PAD = 0
SMOOTHED_C23 = 0.490753  # CE against 0.9*onehot + 0.1/4, CASES.md C23
UNSMOOTHED_C23 = 0.340753


def np_token_nll(labels, logits):
    """Unsmoothed per-token NLL in float64 NumPy."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]


# --- C23: label smoothing with sparse labels ---------------------------------


def c23_inputs():
    labels = np.array([[2, PAD]], dtype="int32")
    logits = np.array(
        [[[0.0, 0.0, 2.0, 0.0], [3.0, -1.0, 0.5, 7.0]]], dtype="float32"
    )
    return labels, logits


def test_c23_smoothed_and_unsmoothed_values():
    """C23: 0.490753 with label_smoothing=0.1, 0.340753 without."""
    labels, logits = c23_inputs()
    smoothed = masked_loss(labels, logits, label_smoothing=0.1)
    plain = masked_loss(labels, logits, label_smoothing=0.0)
    assert float(to_numpy(smoothed)) == pytest.approx(SMOOTHED_C23, abs=1e-5)
    assert float(to_numpy(plain)) == pytest.approx(UNSMOOTHED_C23, abs=1e-5)
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.1)
    assert float(to_numpy(loss(labels, logits))) == pytest.approx(
        SMOOTHED_C23, abs=1e-5
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradient_is_softmax_minus_smoothed_target_over_real_tokens(eps):
    """d loss / d logits = (softmax - ((1 - eps) onehot + eps / V)) / n_real
    at real tokens and 0 at padding (NumPy reference), and the loss value
    matches the reference too."""
    rng = np.random.default_rng(3)
    labels = rng.integers(1, 7, size=(3, 5)).astype("int32")
    labels[0, 3:] = PAD
    labels[2, 1:] = PAD
    logits = (3 * rng.normal(size=(3, 5, 7))).astype("float32")
    real = labels != PAD
    shifted = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    softmax = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
    target = (1 - eps) * np.eye(7)[labels] + eps / 7
    expected = (softmax - target) * real[..., None] / real.sum()
    expected_loss = np.sum(-(target * np.log(softmax)).sum(-1) * real) / real.sum()

    def loss(x):
        return masked_loss(labels, x, label_smoothing=eps)

    np.testing.assert_allclose(float(to_numpy(loss(logits))), expected_loss, rtol=1e-5)
    np.testing.assert_allclose(gradient_of(loss, logits), expected, atol=1e-6)


def test_c23_pad_position_contributes_zero():
    """C23: the pad position's loss is 0 and it is left out of the mean."""
    labels, logits = c23_inputs()
    per_token = MaskedSparseCategoricalCrossentropy(
        label_smoothing=0.1, reduction=None
    )(labels, logits)
    np.testing.assert_allclose(
        to_numpy(per_token), [[SMOOTHED_C23, 0.0]], atol=1e-5
    )
    losses, mask = per_token_loss(labels, logits, label_smoothing=0.1)
    np.testing.assert_array_equal(to_numpy(mask), [[True, False]])
    np.testing.assert_allclose(to_numpy(losses), [[SMOOTHED_C23, 0.0]], 1e-5)


def test_c23_equals_keras_dense_categorical_crossentropy():
    """C23: equals CategoricalCrossentropy(label_smoothing=0.1) on one-hot."""
    dense = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1
    )
    onehot = np.array([[0.0, 0.0, 1.0, 0.0]], dtype="float32")
    logits = np.array([[0.0, 0.0, 2.0, 0.0]], dtype="float32")
    expected = float(to_numpy(dense(onehot, logits)))
    assert expected == pytest.approx(SMOOTHED_C23, abs=1e-5)
    ours = masked_loss(
        np.array([[2]]), logits[None], label_smoothing=0.1
    )
    assert float(to_numpy(ours)) == pytest.approx(expected, rel=1e-6)

    # Random logits, labels that include padding: per-token equality.
    rng = np.random.default_rng(0)
    vocab = 11
    logits = rng.normal(size=(3, 5, vocab)).astype("float32")
    labels = rng.integers(1, vocab, size=(3, 5)).astype("int32")
    labels[0, 3:] = PAD
    labels[2, 1:] = PAD
    dense_none = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1, reduction=None
    )
    expected = to_numpy(
        dense_none(np.eye(vocab, dtype="float32")[labels], logits)
    )
    real = labels != PAD
    per_token = MaskedSparseCategoricalCrossentropy(
        label_smoothing=0.1, reduction=None
    )(labels, logits)
    np.testing.assert_allclose(
        to_numpy(per_token), np.where(real, expected, 0.0), rtol=1e-5
    )
    mean = MaskedSparseCategoricalCrossentropy(label_smoothing=0.1)(
        labels, logits
    )
    assert float(to_numpy(mean)) == pytest.approx(
        expected[real].mean(), rel=1e-5
    )


def test_c23_probabilities_input_matches_keras():
    """from_logits=False agrees with Keras's dense loss on probabilities."""
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 3, 6)).astype("float32")
    probs = to_numpy(ops.softmax(logits, axis=-1))
    labels = np.array([[1, 2, 3], [4, 5, PAD]], dtype="int32")
    dense = keras.losses.CategoricalCrossentropy(
        from_logits=False, label_smoothing=0.1, reduction=None
    )
    expected = to_numpy(dense(np.eye(6, dtype="float32")[labels], probs))
    ours = masked_loss(labels, probs, label_smoothing=0.1, from_logits=False)
    assert float(to_numpy(ours)) == pytest.approx(
        expected[labels != PAD].mean(), rel=1e-5
    )


# --- C21: masked loss normalised by real tokens -----------------------------


def test_c21_normalised_by_real_tokens_not_all_positions():
    """C21: [[5, 6, pad, pad]] gives (L1 + L2) / 2, equal to [[5, 6]] and to
    the same row padded to length 8."""
    rng = np.random.default_rng(2)
    vocab = 10
    logits8 = rng.normal(size=(1, 8, vocab)).astype("float32")
    labels2 = np.array([[5, 6]], dtype="int32")
    l1, l2 = np_token_nll(labels2, logits8[:, :2])[0]

    labels4 = np.array([[5, 6, PAD, PAD]], dtype="int32")
    labels8 = np.array([[5, 6] + [PAD] * 6], dtype="int32")
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.0)
    value4 = float(to_numpy(loss(labels4, logits8[:, :4])))
    value2 = float(to_numpy(loss(labels2, logits8[:, :2])))
    value8 = float(to_numpy(loss(labels8, logits8)))
    assert value4 == pytest.approx((l1 + l2) / 2, rel=1e-5)
    assert value4 != pytest.approx((l1 + l2) / 4, rel=1e-3)
    assert value2 == pytest.approx(value4, rel=1e-6)
    assert value8 == pytest.approx(value4, rel=1e-6)
    for fn_value in [
        masked_loss(labels4, logits8[:, :4]),
        masked_loss(labels8, logits8),
    ]:
        assert float(to_numpy(fn_value)) == pytest.approx(value4, rel=1e-6)


def test_c21_mixed_lengths_give_token_weighted_mean():
    """C21: real lengths 1 and 3: (sum of the 4 token losses) / 4."""
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 4, 9)).astype("float32")
    labels = np.array([[3, PAD, PAD, PAD], [4, 5, 6, PAD]], dtype="int32")
    nll = np_token_nll(np.where(labels == PAD, 0, labels), logits)
    expected = nll[labels != PAD].sum() / 4
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.0)
    assert float(to_numpy(loss(labels, logits))) == pytest.approx(
        expected, rel=1e-5
    )
    # Not the mean of per-row means.
    row_means = (nll[0, 0] + nll[1, :3].mean()) / 2
    assert float(to_numpy(loss(labels, logits))) != pytest.approx(
        row_means, rel=1e-3
    )


def test_all_padding_batch_gives_zero_not_nan():
    labels = np.full((2, 3), PAD, dtype="int32")
    logits = np.random.default_rng(4).normal(size=(2, 3, 5)).astype("float32")
    for value in [
        masked_loss(labels, logits, label_smoothing=0.1),
        MaskedSparseCategoricalCrossentropy()(labels, logits),
    ]:
        assert float(to_numpy(value)) == 0.0


def test_pad_id_outside_vocabulary():
    """A pad id of -1 (not a valid index) is masked, not gathered."""
    labels = np.array([[2, -1]], dtype="int32")
    logits = np.array([[[0.0, 0.0, 2.0, 0.0], [1.0, 2.0, 3.0, 4.0]]])
    value = masked_loss(labels, logits, pad_id=-1, label_smoothing=0.1)
    assert float(to_numpy(value)) == pytest.approx(SMOOTHED_C23, abs=1e-5)


def test_labels_with_trailing_unit_axis():
    labels, logits = c23_inputs()
    value = masked_loss(labels[..., None], logits, label_smoothing=0.1)
    assert float(to_numpy(value)) == pytest.approx(SMOOTHED_C23, abs=1e-5)


def test_rank_mismatch_raises():
    with pytest.raises(ValueError, match="one rank lower"):
        masked_loss(np.zeros((2, 3, 4), "int32"), np.zeros((2, 3, 5)))


@pytest.mark.parametrize("bad", [-5, 5])
def test_labels_outside_the_vocabulary_are_an_error(bad):
    """A real label outside [0, V): jax read NaN, torch wrapped -5 around
    to a valid class and reported a finite loss."""
    labels = np.array([[1, bad, PAD]], "int32")
    with pytest.raises(ValueError, match=r"labels .* must be token ids in \[0, 5\)"):
        masked_loss(labels, np.zeros((1, 3, 5), "float32"))


def test_length_mismatch_raises_before_any_op():
    """Labels (2, 3) against logits (2, 5, V) used to fail in a GatherV2 or
    SelectV2 node deep in the graph."""
    with pytest.raises(ValueError, match=r"labels \(2, 3\) against predictions \(2, 5, 4\)"):
        masked_loss(np.ones((2, 3), "int32"), np.zeros((2, 5, 4)))
    with pytest.raises(ValueError, match="axis 0"):
        MaskedSparseCategoricalCrossentropy()(np.ones((3, 5), "int32"), np.zeros((2, 5, 4)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_logits_computed_in_float32(dtype):
    """Mixed precision: float16/bfloat16 logits, float32 loss."""
    rng = np.random.default_rng(5)
    logits32 = (rng.normal(size=(2, 4, 7)) * 4).astype("float32")
    labels = np.array([[1, 2, 3, PAD], [4, 5, PAD, PAD]], dtype="int32")
    low = ops.cast(ops.convert_to_tensor(logits32), dtype)
    reference_logits = to_numpy(ops.cast(low, "float32"))
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.1)
    value = loss(labels, low)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    assert float(to_numpy(value)) == pytest.approx(
        float(to_numpy(loss(labels, reference_logits))), rel=1e-6
    )
    fn_value = masked_loss(labels, low, label_smoothing=0.1)
    assert keras.backend.standardize_dtype(fn_value.dtype) == "float32"


def test_sample_weight_scales_tokens_divisor_stays_real_tokens():
    rng = np.random.default_rng(6)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 2, PAD], [3, PAD, PAD]], dtype="int32")
    nll = np_token_nll(np.where(labels == PAD, 0, labels), logits)
    nll = np.where(labels == PAD, 0.0, nll)
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=0.0)
    weights = np.array([2.0, 0.5], dtype="float32")
    expected = (2.0 * nll[0].sum() + 0.5 * nll[1].sum()) / 3
    assert float(to_numpy(loss(labels, logits, weights))) == pytest.approx(
        expected, rel=1e-5
    )
    summed = MaskedSparseCategoricalCrossentropy(
        label_smoothing=0.0, reduction="sum"
    )
    assert float(to_numpy(summed(labels, logits))) == pytest.approx(
        nll.sum(), rel=1e-5
    )


@pytest.mark.parametrize("shape, wrong", [((2, 3), "2 rows for 1 sentences"), ((3,), "3 rows for 1 sentences"),
                                          ((1, 4), "4 columns for 3 target tokens"),
                                          ((1, 3, 2), "a third size other than 1")])
def test_sample_weight_of_another_shape_is_refused(shape, wrong):
    """A weight whose rows or columns are not the batch's broadcast against
    the losses: (2, 3) weights for one sentence counted it twice, (3,)
    three times (a new-user trial); (1, 4) was a raw Mul error."""
    logits = np.zeros((1, 3, 5), "float32")
    labels = np.array([[1, 2, PAD]], "int32")
    message = re.escape(f"`sample_weight` has shape {shape}, {wrong}: give one weight a sentence, (1,), "
                        "or one a token, (1, 3)")
    with pytest.raises(ValueError, match=message):
        MaskedSparseCategoricalCrossentropy()(labels, logits, sample_weight=np.ones(shape, "float32"))
    with pytest.raises(ValueError, match=message):
        MaskedAccuracy().update_state(labels, logits, sample_weight=np.ones(shape, "float32"))
    for good in ((1,), (1, 3), (1, 3, 1), (1, 1)):
        MaskedSparseCategoricalCrossentropy()(labels, logits, sample_weight=np.ones(good, "float32"))


def test_per_sample_and_per_token_weights_in_one_compiled_model():
    """One compiled model fitted and evaluated with `(batch, T)` weights,
    then `(batch,)` weights (and back): Keras retraces with a weight of
    unknown rank, where `len(weight.shape)` raised. A per-sample weight
    equals the same weight repeated over the tokens."""
    keras.utils.set_random_seed(3)
    x, y = c21_batch()
    model = tiny_model(9, x.shape[1])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=MaskedSparseCategoricalCrossentropy(),
                  metrics=[MaskedAccuracy()])
    per_sample = np.array([2.0, 0.5, 1.0], "float32")
    per_token = np.repeat(per_sample[:, None], x.shape[1], axis=1)
    results = []
    for weight in (per_token, per_sample, per_token[..., None], per_sample):
        model.fit(x, y, sample_weight=weight, batch_size=3, epochs=1, verbose=0)
        results.append(model.evaluate(x, y, sample_weight=weight, batch_size=3, verbose=0))
    for result in results[1:]:
        np.testing.assert_allclose(result, results[0], rtol=1e-6)


# --- Keras integration -----------------------------------------------------


def tiny_model(vocab, length, mask_zero=False):
    inputs = keras.Input(shape=(length,), dtype="int32")
    hidden = keras.layers.Embedding(vocab, 8, mask_zero=mask_zero)(inputs)
    outputs = keras.layers.Dense(vocab)(hidden)
    return keras.Model(inputs, outputs)


def c21_batch():
    # Real lengths 1 and 3 (C21's mixed batch), plus an all-padding row.
    x = np.array([[7, 0, 0, 0], [7, 4, 5, 0], [0, 0, 0, 0]], dtype="int32")
    y = np.array([[3, 0, 0, 0], [4, 5, 6, 0], [0, 0, 0, 0]], dtype="int32")
    return x, y


@pytest.mark.parametrize("mask_zero", [False, True])
def test_c21_fit_and_evaluate_report_the_manual_value(mask_zero):
    """C21: fit logs and evaluate equal the token-weighted manual mean.

    With `mask_zero=True` the logits carry a Keras mask (the input padding);
    the loss reads padding from the labels only, so the value is the same.
    """
    keras.utils.set_random_seed(7)
    vocab = 9
    x, y = c21_batch()
    model = tiny_model(vocab, x.shape[1], mask_zero=mask_zero)
    loss = MaskedSparseCategoricalCrossentropy(pad_id=PAD, label_smoothing=0.1)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=loss)

    logits = model.predict(x, verbose=0)
    manual = float(to_numpy(masked_loss(y, logits, label_smoothing=0.1)))
    nll = np_token_nll(y, logits)
    smooth = -(
        logits
        - np.log(np.exp(logits).sum(-1, keepdims=True))
    ).mean(-1)
    by_hand = (0.9 * nll + 0.1 * smooth)[y != PAD].sum() / 4
    assert manual == pytest.approx(by_hand, rel=1e-5)

    # One batch: the logged loss is the pre-update loss of that batch.
    history = model.fit(x, y, batch_size=len(x), epochs=1, verbose=0,
                        shuffle=False)
    assert history.history["loss"][0] == pytest.approx(manual, rel=1e-5)

    logits = model.predict(x, verbose=0)
    manual = float(to_numpy(masked_loss(y, logits, label_smoothing=0.1)))
    evaluated = model.evaluate(x, y, batch_size=len(x), verbose=0)
    assert evaluated == pytest.approx(manual, rel=1e-5)


def test_keras_mask_on_logits_that_differs_from_label_padding_is_ignored():
    """A Keras mask on y_pred that hides real labels does not change the
    value: padding is read from the labels only."""
    keras.utils.set_random_seed(8)
    vocab = 9
    # Input padding (Keras mask) at positions 2-3; labels real at 0-2.
    x = np.array([[7, 4, 0, 0]], dtype="int32")
    y = np.array([[3, 5, 6, 0]], dtype="int32")
    model = tiny_model(vocab, 4, mask_zero=True)
    model.compile(
        optimizer="sgd",
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=0.0),
    )
    logits = model.predict(x, verbose=0)
    manual = float(to_numpy(masked_loss(y, logits)))
    evaluated = model.evaluate(x, y, verbose=0)
    assert evaluated == pytest.approx(manual, rel=1e-5)


def test_config_round_trip_and_saved_model(tmp_path):
    loss = MaskedSparseCategoricalCrossentropy(
        pad_id=1, label_smoothing=0.2, from_logits=True, name="nmt_loss"
    )
    config = loss.get_config()
    assert config["pad_id"] == 1
    assert config["label_smoothing"] == 0.2
    assert config["from_logits"] is True
    restored = MaskedSparseCategoricalCrossentropy.from_config(config)
    assert restored.get_config() == config
    serialized = keras.saving.serialize_keras_object(loss)
    assert serialized["registered_name"] == (
        "keras_transformer>MaskedSparseCategoricalCrossentropy"
    )
    assert keras.saving.deserialize_keras_object(serialized).get_config() == (
        config
    )

    model = tiny_model(6, 3)
    model.compile(optimizer="adam", loss=loss)
    model.optimizer.build(model.trainable_variables)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    x = np.array([[2, 3, 1]], dtype="int32")
    y = np.array([[3, 4, 1]], dtype="int32")
    assert loaded.evaluate(x, y, verbose=0) == pytest.approx(
        model.evaluate(x, y, verbose=0), rel=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"label_smoothing": -0.1}, "label_smoothing"),
        ({"pad_id": 0.5}, "pad_id"),
        ({"reduction": "max"}, "reduction"),
        ({"from_logits": "False"}, "`from_logits` must be a bool"),  # truthy: read as logits
    ],
)
def test_invalid_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MaskedSparseCategoricalCrossentropy(**kwargs)


def test_a_numpy_pad_id_is_an_int_pad_id():
    """`pad_id=np.int64(0)` was refused as not an int token id (a new-user trial)."""
    loss = MaskedSparseCategoricalCrossentropy(pad_id=np.int64(0))
    assert loss.get_config()["pad_id"] == 0 and type(loss.pad_id) is int
    labels, logits = np.array([[2, 0]], "int32"), np.array([[[0.0, 1.0, 2.0], [5.0, 0.0, 0.0]]], "float32")
    assert float(to_numpy(loss(labels, logits))) == pytest.approx(
        float(to_numpy(MaskedSparseCategoricalCrossentropy(pad_id=0)(labels, logits))))
