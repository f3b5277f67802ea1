"""keras_transformer.optimizers.Adam against Keras's Adam and the paper's formula."""

import keras
import numpy as np
import pytest

from keras_transformer import WarmupSchedule
from keras_transformer.optimizers import Adam

SHAPES = [(3, 4), (5,), (6, 2)]


def numpy_adam(weights, gradients, learning_rates, beta_1, beta_2, epsilon):
    """Kingma & Ba (2015), algorithm 1 in the epsilon-hat form, in float64."""
    weights = [w.astype(np.float64) for w in weights]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    for t, (step_gradients, lr) in enumerate(zip(gradients, learning_rates), start=1):
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        for i, g in enumerate(step_gradients):
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            weights[i] = weights[i] - alpha * m[i] / (np.sqrt(v[i]) + epsilon)
    return weights


def run(optimizer, weights, gradients):
    variables = [keras.Variable(w) for w in weights]
    for step_gradients in gradients:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step_gradients], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_equals_keras_adam_and_the_numpy_formula(amsgrad):
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=s).astype("float32") for s in SHAPES]
    # Gradients of very different sizes, zeros and a sign flip between steps.
    gradients = [
        [rng.normal(scale=10.0 ** rng.integers(-4, 2), size=s).astype("float32") for s in SHAPES]
        for _ in range(4)
    ]
    gradients[1][1][:] = 0.0
    gradients[2][0] = -gradients[1][0]
    schedule = WarmupSchedule(d_model=16, warmup_steps=3)
    arguments = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9, amsgrad=amsgrad)

    ours = run(Adam(schedule, **arguments), weights, gradients)
    theirs = run(keras.optimizers.Adam(schedule, **arguments), weights, gradients)
    for a, b, w in zip(ours, theirs, weights):
        assert a.dtype == np.float32
        assert np.abs(a - w).max() > 1e-3  # the steps moved the weights
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    if not amsgrad:
        rates = [float(keras.ops.convert_to_numpy(schedule(step))) for step in range(4)]
        expected = numpy_adam(weights, gradients, rates, 0.9, 0.98, 1e-9)
        for a, e in zip(ours, expected):
            np.testing.assert_allclose(a, e, rtol=0, atol=2e-6)


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="the fused kernel; jax without x64 has no float64, Keras's torch update rounds to float32",
)
def test_adam_in_float64_equals_the_numpy_formula_to_float64_rounding():
    rng = np.random.default_rng(3)
    weights = [rng.normal(size=(4, 3))]
    gradients = [[rng.normal(size=(4, 3))] for _ in range(3)]
    variables = [keras.Variable(weights[0], dtype="float64")]
    optimizer = Adam(0.1, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    for (gradient,) in gradients:
        optimizer.apply([keras.ops.convert_to_tensor(gradient, "float64")], variables)
    rate = float(np.float32(0.1))  # Keras keeps the learning rate in a float32 variable
    (expected,) = numpy_adam(weights, gradients, [rate] * 3, 0.9, 0.98, 1e-9)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(variables[0]), expected, rtol=1e-12)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="tf.IndexedSlices")
def test_adam_takes_the_sparse_gradient_of_an_embedding_as_dense():
    import tensorflow as tf

    rng = np.random.default_rng(1)
    table = rng.normal(size=(6, 3)).astype("float32")
    rows = rng.normal(size=(4, 3)).astype("float32")
    indices = np.array([1, 4, 1, 0])  # row 1 twice: the slices add up
    sparse = tf.IndexedSlices(tf.constant(rows), tf.constant(indices), tf.constant([6, 3]))
    dense = np.zeros_like(table)
    np.add.at(dense, indices, rows)

    results = []
    for optimizer, gradient in ((Adam(0.1), sparse), (keras.optimizers.Adam(0.1), dense)):
        variable = keras.Variable(table)
        optimizer.apply([gradient], [variable])
        optimizer.apply([gradient], [variable])
        results.append(keras.ops.convert_to_numpy(variable))
    # Keras's twelve separate float32 operations round differently from the
    # fused kernel: about 1e-5 of a 0.1 step.
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=5e-6)
    np.testing.assert_array_equal(results[0][[2, 3, 5]], table[[2, 3, 5]])  # no gradient there
    assert np.abs(results[0][[0, 1, 4]] - table[[0, 1, 4]]).min() > 0.05


def test_adam_config_round_trip():
    schedule = WarmupSchedule(d_model=16, warmup_steps=3)
    optimizer = Adam(schedule, beta_2=0.98, epsilon=1e-9)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is Adam
    assert restored.get_config() == optimizer.get_config()


@pytest.mark.parametrize("argument, message", [
    ({"beta_1": 1.5}, r"`beta_1` must be a number in \[0, 1\); got 1.5"),  # Keras's Adam took it
    ({"beta_2": 1.0}, r"`beta_2` must be a number in \[0, 1\); got 1.0"),  # divided by 1 - beta_2^t = 0
    ({"epsilon": 0.0}, r"`epsilon` must be a finite number > 0; got 0.0"),
])
def test_adam_refuses_moments_and_epsilon_it_cannot_use(argument, message):
    with pytest.raises(ValueError, match=message):
        Adam(1e-3, **argument)


@pytest.mark.skipif(
    keras.backend.backend() == "jax", reason="JAX applies LossScaleOptimizer statelessly only"
)
def test_adam_under_loss_scaling_equals_keras_adam():
    # Under loss scaling (mixed precision) the scaled gradients are unscaled
    # before the update: the same weights as Keras's Adam under it.
    rng = np.random.default_rng(2)
    weights = [rng.normal(size=(4, 3)).astype("float32")]
    gradients = [[rng.normal(size=(4, 3)).astype("float32")] for _ in range(3)]
    ours = run(keras.optimizers.LossScaleOptimizer(Adam(0.01)), weights, gradients)
    theirs = run(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)), weights, gradients)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=0, atol=1e-6)
    assert np.abs(ours[0] - weights[0]).max() > 1e-3


@pytest.mark.parametrize("optimizer_class", [Adam, keras.optimizers.Adam])
def test_one_adam_step_on_repeated_tokens_uses_their_summed_gradient(optimizer_class):
    """Token 1 occurs three times: Adam's second moment is the square of its
    summed gradient (Keras's own Adam squared each occurrence on TensorFlow)."""
    from keras_transformer.layers import PositionalEmbedding
    from keras_transformer.layers import sinusoidal_encoding

    ids = np.array([[1, 4, 1], [1, 5, 4]], "int32")  # no padding (id 0)
    inputs = keras.Input((3,), dtype="int32")
    layer = PositionalEmbedding(vocab_size=6, d_model=4, sequence_length=3)
    model = keras.Model(inputs, layer(inputs))
    model.compile(optimizer_class(0.1), loss="mse")
    table = keras.ops.convert_to_numpy(layer.embeddings).astype(np.float64)

    outputs = table[ids] * 2.0 + sinusoidal_encoding(3, 4)  # sqrt(d_model) = 2
    gradient = np.zeros_like(table)
    np.add.at(gradient, ids, 2.0 * outputs / outputs.size * 2.0)
    (expected,) = numpy_adam([table], [[gradient]], [0.1], 0.9, 0.999, 1e-7)

    model.train_on_batch(ids, np.zeros((2, 3, 4), "float32"))
    got = keras.ops.convert_to_numpy(layer.embeddings)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    assert np.abs(got - table)[1].min() > 0.09  # a full step of about lr


def test_accumulated_batches_equal_one_large_batch_with_the_schedule():
    """`gradient_accumulation_steps=3` over batches of 4 trains as batches
    of 12 (1e-5), the warm-up schedule included: the schedule and the bias
    correction count optimizer updates, not batches (Keras's count ended
    the warm-up 3x early)."""
    import keras_transformer as kt

    rng = np.random.default_rng(0)
    x = {"encoder_inputs": rng.integers(4, 30, (24, 6)).astype("int32"),
         "decoder_inputs": rng.integers(4, 30, (24, 5)).astype("int32")}
    y = rng.integers(4, 30, (24, 5)).astype("int32")  # no padding: equal token counts
    weights = {}
    for name, batch_size, accumulate in (("large", 12, None), ("accumulated", 4, 3)):
        keras.utils.set_random_seed(1)
        model = kt.build_transformer(30, 30, num_layers=1, d_model=16, num_heads=2, dff=32,
                                     dropout_rate=0.0, sequence_length=8)
        # scale=0.03: rates near 1e-3, where float32 rounding stays below 1e-5.
        schedule = kt.WarmupSchedule(d_model=16, warmup_steps=4, scale=0.03)
        model.compile(kt.Adam(schedule, gradient_accumulation_steps=accumulate),
                      kt.MaskedSparseCategoricalCrossentropy())
        model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
        weights[name] = model.get_weights()
    for large, accumulated in zip(weights["large"], weights["accumulated"]):
        np.testing.assert_allclose(accumulated, large, rtol=1e-5, atol=1e-5)
