"""A shared battery of layer tests, in the spirit of KerasHub's
`TestCase.run_layer_test`: every layer of the package goes through it.

`run_layer_test(make_layer, inputs)` checks, on the current backend:

- an eager call gives finite outputs of the shape `compute_output_shape`
  (where the layer has one) and a symbolic call (`keras.Input`) reports;
- `get_config` -> `from_config` with the weights copied gives the same
  outputs, and `serialize_keras_object` round trips to the same class;
- a functional model around the layer saves to `.keras` and loads back with
  the same outputs (registration for serialization);
- one `fit` step changes every trainable weight (a gradient reaches it) and
  gives a finite loss;
- under the `mixed_float16` and `mixed_bfloat16` policies the layer computes
  in that dtype with float32 variables and stays close to float32 (same
  weights).
"""

import os
import tempfile

import keras
import numpy as np

from conftest import to_numpy


def _call(layer, inputs, **kwargs):
    return layer(*inputs, **kwargs)


def _outputs(result):
    return [to_numpy(x) for x in (result if isinstance(result, (list, tuple)) else [result])]


def _symbolic_inputs(inputs):
    return [keras.Input(shape=np.shape(x)[1:], dtype=str(np.asarray(x).dtype)) for x in inputs]


def run_layer_test(make_layer, inputs, *, call_kwargs=None, expect_mask=None, run_fit=True,
                   mixed_precision=True, tolerance=1e-5, mixed_tolerance=0.05):
    """Run the battery on `make_layer(**kwargs)` (a callable taking `dtype=`)
    called on `inputs` (list of NumPy arrays, the call's positional args).

    Args:
        make_layer: callable returning a fresh layer; it receives `dtype`.
        inputs: list of NumPy arrays.
        call_kwargs: extra keyword arguments of every call.
        expect_mask: None, or the bool array `compute_mask` must return for
            the first input (mask propagation).
        run_fit: run the `fit` step (layers without trainable weights skip).
        mixed_precision: run the mixed-precision checks.
        tolerance: of the round trips (they should be exact but for float
            summation order).
        mixed_tolerance: of mixed precision against float32, relative to the
            largest float32 output.

    Returns:
        `(output_shape, checks)`: the shape of the (first) eager output and
        the set of the checks that ran, for the caller to assert.
    """
    call_kwargs = call_kwargs or {}
    inputs = [np.asarray(x) for x in inputs]
    checks = set()

    # Eager call, finite outputs, output shape.
    layer = make_layer(dtype="float32")
    want = _outputs(_call(layer, inputs, **call_kwargs))
    for out in want:
        assert np.all(np.isfinite(out)), f"{type(layer).__name__} gave non-finite outputs"
    try:
        shape = layer.compute_output_shape(*[x.shape for x in inputs])
    except NotImplementedError:
        shape = None
    if shape is not None and len(want) == 1:
        assert tuple(shape) == want[0].shape, (shape, want[0].shape)
    checks.add("eager")
    if expect_mask is not None:
        mask = layer.compute_mask(*inputs)
        np.testing.assert_array_equal(to_numpy(mask), expect_mask)
        checks.add("mask")

    # Symbolic call.
    symbolic = _symbolic_inputs(inputs)
    symbolic_out = _call(layer, symbolic, **call_kwargs)
    first = symbolic_out[0] if isinstance(symbolic_out, (list, tuple)) else symbolic_out
    assert tuple(first.shape)[1:] == want[0].shape[1:]
    checks.add("symbolic")

    # Config round trip with the weights.
    clone = type(layer).from_config(layer.get_config())
    _call(clone, inputs, **call_kwargs)
    clone.set_weights(layer.get_weights())
    for got, expected in zip(_outputs(_call(clone, inputs, **call_kwargs)), want):
        np.testing.assert_allclose(got, expected, atol=tolerance)
    assert clone.get_config() == layer.get_config()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    checks.add("config")

    # .keras round trip of a functional model around the layer.
    model = keras.Model(symbolic if len(symbolic) > 1 else symbolic[0], symbolic_out)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "layer.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    for got, expected in zip(_outputs(loaded(inputs if len(inputs) > 1 else inputs[0])), want):
        np.testing.assert_allclose(got, expected, atol=tolerance)
    checks.add("keras_file")

    # One fit step moves every trainable weight.
    if run_fit and layer.trainable_weights:
        fresh = make_layer(dtype="float32")
        symbolic = _symbolic_inputs(inputs)
        out = _call(fresh, symbolic, **call_kwargs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        trainer = keras.Model(symbolic if len(symbolic) > 1 else symbolic[0], out)
        trainer.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        before = [to_numpy(w).copy() for w in fresh.trainable_weights]
        # A random target: a constant one gives a post-LN block's input an
        # exactly zero gradient (LayerNorm's backward removes it).
        target = np.random.default_rng(0).normal(size=want[0].shape).astype("float32")
        history = trainer.fit(inputs if len(inputs) > 1 else inputs[0], target, epochs=1, batch_size=len(target),
                              verbose=0)
        assert np.isfinite(history.history["loss"][0])
        for weight, old in zip(fresh.trainable_weights, before):
            assert not np.array_equal(to_numpy(weight), old), f"{weight.path} did not move in fit"
        checks.add("fit")

    # Mixed precision: compute dtype, float32 variables, close to float32.
    if mixed_precision:
        for policy in ("mixed_float16", "mixed_bfloat16"):
            mixed = make_layer(dtype=policy)
            _call(mixed, inputs, **call_kwargs)
            mixed.set_weights(layer.get_weights())
            assert mixed.compute_dtype == policy.split("_")[1]
            assert all(w.dtype == "float32" for w in mixed.weights)
            for got, expected in zip(_outputs(_call(mixed, inputs, **call_kwargs)), want):
                got = got.astype("float32")
                assert np.all(np.isfinite(got))
                scale = max(1.0, float(np.abs(expected).max()))
                np.testing.assert_allclose(got, expected, atol=mixed_tolerance * scale)
            checks.add(policy)
    return want[0].shape, checks
