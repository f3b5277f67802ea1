"""Tests for keras_transformer.schedules (backend-agnostic)."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.schedules import WarmupSchedule

PEAK_128_4000 = 0.00139754  # 128**-0.5 * 4000**-0.5, from CASES.md C11


def reference(step, d_model=128, warmup_steps=4000, scale=1.0):
    step = np.maximum(np.asarray(step, dtype=np.float64), 1.0)
    return (
        scale
        * d_model**-0.5
        * np.minimum(step**-0.5, step * warmup_steps**-1.5)
    )


def to_numpy(x):
    return np.asarray(ops.convert_to_numpy(x))


def test_c11_matches_numpy_reference():
    """C11: the paper's equation 3 at steps on both sides of the warmup."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    for step in [1, 2, 10, 100, 1000, 3999, 4000, 4001, 10000, 100000]:
        np.testing.assert_allclose(
            to_numpy(schedule(step)), reference(step), rtol=1e-6
        )
    scaled = WarmupSchedule(d_model=512, warmup_steps=100, scale=2.0)
    for step in [1, 50, 100, 1000]:
        np.testing.assert_allclose(
            to_numpy(scaled(step)),
            reference(step, d_model=512, warmup_steps=100, scale=2.0),
            rtol=1e-6,
        )


def test_c11_peak_at_warmup_steps():
    """C11: the peak at step 4000 is 128**-0.5 * 4000**-0.5 = 0.00139754."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    peak = float(to_numpy(schedule(4000)))
    assert peak == pytest.approx(PEAK_128_4000, rel=1e-5)
    assert peak == pytest.approx(128**-0.5 * 4000**-0.5, rel=1e-6)


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64")
@pytest.mark.parametrize(
    "step",
    [
        1,
        np.int32(1),
        np.int64(1),
        np.float32(1),
        "int32_tensor",
        "int64_tensor",
        "float32_tensor",
    ],
)
def test_c11_step_dtypes_return_float32(step):
    """C11: Python int, int32, int64 and float32 steps all give float32."""
    if isinstance(step, str):
        dtype = step.split("_")[0]
        step = ops.convert_to_tensor(np.array(1, dtype=dtype), dtype=dtype)
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    rate = schedule(step)
    assert keras.backend.standardize_dtype(rate.dtype) == "float32"
    assert float(to_numpy(rate)) == pytest.approx(
        128**-0.5 * 4000**-1.5, rel=1e-6
    )


def test_c11_optimizer_iteration_variable_step():
    """C11: the optimizer's own iterations variable is a valid step."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    optimizer = keras.optimizers.Adam(learning_rate=schedule)
    # Before the first update the counter is 0 and the rate is the step-1
    # rate: training starts at step 1.
    assert int(to_numpy(optimizer.iterations)) == 0
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(
        float(reference(1)), rel=1e-6
    )


def test_c11_rises_strictly_then_falls_strictly():
    """C11: strictly rising up to step 4000, strictly falling after."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    rising = to_numpy(schedule(np.arange(1, 4001, dtype="int32")))
    falling = to_numpy(schedule(np.arange(4000, 20001, dtype="int32")))
    assert np.all(np.diff(rising) > 0)
    assert np.all(np.diff(falling) < 0)
    assert rising.max() == rising[-1] == falling[0]


def test_c11_step_zero_is_finite_and_training_starts_at_step_1():
    """C11: no inf from rsqrt(0); step 0 gives the step-1 rate."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    at_zero = float(to_numpy(schedule(0)))
    assert math.isfinite(at_zero)
    assert at_zero > 0
    assert at_zero == float(to_numpy(schedule(1)))


def test_c11_from_config_round_trip():
    """C11: from_config(get_config()) gives the same rate (rel 1e-7)."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000, scale=2.0)
    config = schedule.get_config()
    assert config == {"d_model": 128, "warmup_steps": 4000, "scale": 2.0}
    restored = WarmupSchedule.from_config(config)
    for step in [1, 100, 4000, 10000]:
        np.testing.assert_allclose(
            to_numpy(restored(step)), to_numpy(schedule(step)), rtol=1e-7
        )


def test_c11_keras_serialization_round_trip():
    """C11: serialize_keras_object / deserialize_keras_object."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=4000)
    serialized = keras.saving.serialize_keras_object(schedule)
    restored = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(restored, WarmupSchedule)
    assert restored.get_config() == schedule.get_config()
    for step in [1, 100, 4000, 10000]:
        np.testing.assert_allclose(
            to_numpy(restored(step)), to_numpy(schedule(step)), rtol=1e-7
        )


def test_c11_model_with_schedule_saves_and_loads(tmp_path):
    """C11: a model compiled with Adam(WarmupSchedule) saves to .keras and
    loads without custom_objects (the schedule is registered)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(3,))
    outputs = keras.layers.Dense(2)(inputs)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(
            WarmupSchedule(d_model=128, warmup_steps=4000)
        ),
        loss="mse",
    )
    x = np.ones((4, 3), dtype="float32")
    y = np.zeros((4, 2), dtype="float32")
    model.fit(x, y, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    learning_rate = loaded.optimizer.get_config()["learning_rate"]
    assert learning_rate["registered_name"] == (
        "keras_transformer>WarmupSchedule"
    )
    assert learning_rate["config"] == {
        "d_model": 128,
        "warmup_steps": 4000,
        "scale": 1.0,
    }
    restored = keras.saving.deserialize_keras_object(learning_rate)
    assert isinstance(restored, WarmupSchedule)
    np.testing.assert_allclose(
        to_numpy(loaded.optimizer.learning_rate),
        to_numpy(model.optimizer.learning_rate),
        rtol=1e-7,
    )
    np.testing.assert_allclose(
        to_numpy(loaded.predict(x, verbose=0)),
        to_numpy(model.predict(x, verbose=0)),
        rtol=1e-6,
    )


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"d_model": 0}, "d_model"),
        ({"d_model": -512}, "d_model"),
        ({"d_model": "512"}, "d_model"),
        ({"d_model": 512, "warmup_steps": 0}, "warmup_steps"),
        ({"d_model": 512, "warmup_steps": float("inf")}, "warmup_steps"),
        ({"d_model": 512, "scale": 0.0}, "scale"),
    ],
)
def test_invalid_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        WarmupSchedule(**kwargs)


def test_cooldown_falls_linearly_to_zero_at_total_steps():
    """With `total_steps` and `cooldown_steps` the rate is equation 3 times
    clip((total - step) / cooldown, 0, 1): unchanged before the cooldown,
    linear to 0 at `total_steps`, 0 after (a NumPy reference)."""
    schedule = WarmupSchedule(d_model=128, warmup_steps=100, scale=2.0, total_steps=1000, cooldown_steps=200)
    steps = np.array([0, 1, 50, 100, 500, 799, 800, 801, 900, 950, 999, 1000, 1001, 5000])
    factor = np.clip((1000 - np.maximum(steps, 1.0)) / 200, 0.0, 1.0)
    want = reference(steps, warmup_steps=100, scale=2.0) * factor
    got = np.array([float(to_numpy(schedule(int(step)))) for step in steps])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert got[-4] > 0 and not got[-3:].any()  # 999 > 0; 1000, 1001, 5000 give 0
    plain = WarmupSchedule(d_model=128, warmup_steps=100, scale=2.0)
    for step in (1, 100, 800):
        assert float(to_numpy(schedule(step))) == float(to_numpy(plain(step)))
    # A tensor step (the optimizer's int64 iterations) gives the same.
    np.testing.assert_allclose(to_numpy(schedule(ops.convert_to_tensor(900, "int64"))), want[8], rtol=1e-6)


def test_cooldown_survives_config_serialization_and_model_save(tmp_path):
    """The cooldown is in `get_config` (only when set: a schedule without one
    keeps its old three keys) and comes back through `from_config`, Keras
    serialization and a saved model's optimizer."""
    schedule = WarmupSchedule(d_model=64, warmup_steps=10, total_steps=40, cooldown_steps=20)
    config = schedule.get_config()
    assert config == {"d_model": 64, "warmup_steps": 10, "scale": 1.0, "total_steps": 40, "cooldown_steps": 20}
    for restored in (WarmupSchedule.from_config(config),
                     keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))):
        for step in (5, 25, 30, 39, 40):
            assert float(to_numpy(restored(step))) == float(to_numpy(schedule(step)))
    inputs = keras.Input(shape=(3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss="mse")
    model.fit(np.ones((4, 3), "float32"), np.zeros((4, 2), "float32"), epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert loaded.optimizer.get_config()["learning_rate"]["config"] == config


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"total_steps": 100}, "go together"),
        ({"cooldown_steps": 10}, "go together"),
        ({"total_steps": 100, "cooldown_steps": 0}, "cooldown_steps"),
        ({"total_steps": 100.5, "cooldown_steps": 10}, "total_steps"),
        ({"total_steps": True, "cooldown_steps": 1}, "total_steps"),
        ({"total_steps": 100, "cooldown_steps": 101}, "must not exceed"),
    ],
)
def test_bad_cooldown_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        WarmupSchedule(d_model=128, warmup_steps=10, **kwargs)


@pytest.mark.parametrize("settings", [
    {"d_model": 1e-300}, {"d_model": 1e300}, {"scale": 1e300}, {"warmup_steps": 1e300}, {"warmup_steps": 1e-300},
])
def test_settings_whose_rate_is_zero_or_inf_in_float32_are_refused(settings):
    """They passed the positive-and-finite checks and gave inf or 0 at every
    step, or an OverflowError when called (a new-user trial)."""
    arguments = dict({"d_model": 16, "warmup_steps": 10}, **settings)
    with pytest.raises(ValueError, match="gives learning rates of 0 or inf in float32"):
        WarmupSchedule(**arguments)
