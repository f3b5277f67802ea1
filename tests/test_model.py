"""The assembled seq2seq model: masks end to end, saving, training sanity.

Backend-neutral: `tests/test_backends.py` re-runs this file on jax and torch.
"""

import functools
import os

import keras
import numpy as np
import pytest

from conftest import to_numpy
from keras_transformer import MaskedAccuracy
from keras_transformer import MaskedSparseCategoricalCrossentropy
from keras_transformer import WarmupSchedule
from keras_transformer import build_from_preset
from keras_transformer import build_transformer
from keras_transformer import causal_mask
from keras_transformer import masked_loss

START, END, PAD = 2, 3, 0


def small_model(**kwargs):
    keras.utils.set_random_seed(0)
    config = dict(num_layers=2, d_model=16, num_heads=2, dff=32, dropout_rate=0.0, sequence_length=12)
    config.update(kwargs)
    return build_transformer(30, 40, **config)


def inputs(source, target):
    return {"encoder_inputs": np.array(source, "int32"), "decoder_inputs": np.array(target, "int32")}


def test_model_io_shapes_and_dtype():
    model = small_model()
    logits = model(inputs([[5, 6, 7, END, PAD]], [[START, 8, 9]]))
    assert tuple(logits.shape) == (1, 3, 40)
    assert "float32" in str(logits.dtype)


def test_source_and_target_padding_do_not_change_real_outputs():
    model = small_model()
    short = to_numpy(model(inputs([[5, 6, END]], [[START, 8, 9]])))
    padded = to_numpy(model(inputs([[5, 6, END, PAD, PAD]], [[START, 8, 9, PAD, PAD, PAD]])))
    np.testing.assert_allclose(padded[:, :3], short, atol=1e-5)


def test_c03_later_target_token_never_changes_earlier_logits():
    """C03 on the whole model: position 3 does not leak into 0-2."""
    model = small_model()
    a = to_numpy(model(inputs([[5, 6, END]], [[START, 7, 8, 9]])))
    b = to_numpy(model(inputs([[5, 6, END]], [[START, 7, 8, 21]])))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-6)
    assert np.abs(a[:, 3] - b[:, 3]).max() > 1e-4  # the last one does change


def test_c08_all_padding_row_finite_loss_and_gradients():
    """C08: a row of only padding gives finite logits, loss and gradients."""
    model = small_model()
    x = inputs([[5, 6, 7, END], [PAD, PAD, PAD, PAD]], [[START, 8, 9], [START, PAD, PAD]])
    labels = np.array([[8, 9, END], [PAD, PAD, PAD]], "int32")
    logits = to_numpy(model(x))
    assert np.isfinite(logits).all()
    alone = to_numpy(model(inputs([[5, 6, 7, END]], [[START, 8, 9]])))
    np.testing.assert_allclose(logits[:1], alone, atol=1e-5)
    loss, grads = loss_and_gradients(model, x, labels, training=True)
    assert np.isfinite(loss)
    assert all(np.isfinite(g).all() for g in grads)


def loss_and_gradients(model, x, labels, training):
    """`masked_loss` (label smoothing 0.1) and its gradients, as NumPy."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = masked_loss(labels, model(x, training=training), label_smoothing=0.1)
        grads = [tf.convert_to_tensor(g).numpy() for g in tape.gradient(loss, model.trainable_variables)]
    elif backend == "jax":
        import jax

        def loss_fn(trainable):
            out, _ = model.stateless_call(
                trainable, [v.value for v in model.non_trainable_variables], x, training=training
            )
            return masked_loss(labels, out, label_smoothing=0.1)

        loss, grads = jax.value_and_grad(loss_fn)([v.value for v in model.trainable_variables])
        grads = [np.asarray(g) for g in grads]
    else:
        for v in model.trainable_variables:
            v.value.grad = None
        loss = masked_loss(labels, model(x, training=training), label_smoothing=0.1)
        loss.backward()
        grads = [v.value.grad.cpu().numpy() for v in model.trainable_variables]
        loss = loss.detach()
    return float(to_numpy(loss)), grads


@pytest.mark.parametrize("norm_first", [False, True])
def test_fast_path_training_step_equals_the_padded_one(norm_first):
    """The training fast path skips padded positions and changes nothing else.

    With dropout 0, a training-mode call gives the inference-mode logits;
    on TensorFlow the fast path's forward pass (`fast_path.forward`, the
    position-wise layers on the real tokens only) gives them at the real
    positions (the padded ones are never computed: 0), and its loss,
    predictions and gradients are the plain model's, post-LN and pre-LN.
    """
    model = small_model(norm_first=norm_first)
    x = inputs(
        [[5, 6, 7, END, PAD], [8, END, PAD, PAD, PAD], [9, 10, 11, 12, END]],
        [[START, 8, 9, PAD], [START, PAD, PAD, PAD], [START, 13, 14, 15]],
    )
    labels = np.array([[8, 9, END, PAD], [END, PAD, PAD, PAD], [13, 14, 15, END]], "int32")
    real = labels != PAD
    trained = to_numpy(model(x, training=True))
    inferred = to_numpy(model(x, training=False))
    np.testing.assert_allclose(trained, inferred, atol=1e-5)
    loss_t, grads_t = loss_and_gradients(model, x, labels, training=True)
    loss_i, grads_i = loss_and_gradients(model, x, labels, training=False)
    assert abs(loss_t - loss_i) < 1e-5
    for variable, g_t, g_i in zip(model.trainable_variables, grads_t, grads_i):
        np.testing.assert_allclose(g_t, g_i, atol=1e-5, err_msg=variable.path)
    if keras.backend.backend() != "tensorflow":
        return
    import tensorflow as tf

    from keras_transformer import fast_path, masked_accuracy
    from keras_transformer.fast_path.forward import TrainingForward

    forward = TrainingForward(model)
    logits, unpadding = forward(x["encoder_inputs"], x["decoder_inputs"])
    fast = to_numpy(unpadding.pad(logits))
    np.testing.assert_allclose(fast[real], inferred[real], atol=1e-5)
    assert np.all(fast[~real] == 0.0)
    assert np.abs(inferred[~real]).max() > 1e-3
    with tf.GradientTape() as tape:
        loss, predicted = fast_path.loss_and_predictions(forward, x, labels, label_smoothing=0.1)
    grads = tape.gradient(loss, model.trainable_variables)
    assert abs(float(loss) - float(to_numpy(masked_loss(labels, inferred, label_smoothing=0.1)))) < 1e-5
    assert float(to_numpy(masked_accuracy(labels, predicted))) == float(
        to_numpy(masked_accuracy(labels, inferred)))
    _, grads_plain = loss_and_gradients(model, x, labels, training=True)
    for variable, g_fast, g_plain in zip(model.trainable_variables, grads, grads_plain):
        np.testing.assert_allclose(to_numpy(tf.convert_to_tensor(g_fast)), g_plain, atol=1e-5,
                                   err_msg=variable.path)


def test_real_label_over_padded_decoder_input_costs_log_vocab_on_the_fast_path():
    """A label under a padded decoder input: the fast path computes no logits
    there and counts log(vocab) for it (the cross-entropy of zero logits);
    the plain model's loss is its cross-entropy at the computed logits. The
    other positions agree."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the training fast path is TensorFlow's")
    from keras_transformer import fast_path
    from keras_transformer.fast_path.forward import TrainingForward

    model = small_model()
    x = inputs([[5, 6, END]], [[START, 8, PAD]])
    labels = np.array([[8, 9, END]], "int32")  # position 2 has a label but no input
    per_token = MaskedSparseCategoricalCrossentropy(label_smoothing=0.1, reduction=None)
    plain = to_numpy(per_token(labels, model(x, training=False)))[0]
    loss, _ = fast_path.loss_and_predictions(TrainingForward(model), x, labels, label_smoothing=0.1)
    np.testing.assert_allclose(float(loss), (plain[0] + plain[1] + np.log(40)) / 3, atol=1e-5)
    assert abs(plain[2] - np.log(40)) > 1e-3
    forward = TrainingForward(model)  # float labels and ids were cast to integers
    with pytest.raises(TypeError, match="The labels .* must be integer token ids; got float64"):
        fast_path.loss_and_predictions(forward, x, labels + 0.5)
    with pytest.raises(TypeError, match="PositionalEmbedding .* must be integer token ids; got float"):
        fast_path.loss_and_predictions(forward, dict(x, decoder_inputs=x["decoder_inputs"] + 0.5), labels)


def test_translator_on_another_backend_is_a_clear_error():
    """The Translator is a tf.Module: on jax and torch it says so up front."""
    if keras.backend.backend() == "tensorflow":
        pytest.skip("the Translator runs on tensorflow (tests/test_decoding.py)")
    from keras_transformer import Translator

    with pytest.raises(ValueError, match=f"tensorflow Keras backend; this process runs '{keras.backend.backend()}'"):
        Translator(small_model(), None, None)


def _compiled(model):
    model.compile(
        optimizer=keras.optimizers.Adam(WarmupSchedule(16, 10), beta_2=0.98, epsilon=1e-9),
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=0.1),
        metrics=[MaskedAccuracy()],
    )
    return model


def test_c12_keras_save_reload_new_shapes(tmp_path):
    """C12: one step, save .keras, reload, call at other batch and lengths."""
    model = _compiled(small_model())
    x = inputs([[5, 6, END, PAD, PAD], [7, 8, 9, 10, END]], [[START, 8, 9, PAD, PAD], [START, 4, 5, 6, 7]])
    y = np.array([[8, 9, END, PAD, PAD], [4, 5, 6, 7, END]], "int32")
    model.fit(x, y, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    rng = np.random.default_rng(0)
    new = inputs(rng.integers(4, 30, (3, 7)), rng.integers(4, 40, (3, 6)))
    np.testing.assert_allclose(to_numpy(restored(new)), to_numpy(model(new)), atol=1e-5)
    # The optimizer and its schedule come back too.
    assert "WarmupSchedule" in str(restored.optimizer.get_config()["learning_rate"])
    assert type(restored.loss).__name__ == "MaskedSparseCategoricalCrossentropy"


@pytest.mark.parametrize("saved_under, loaded_under", [("mixed_float16", "float32"), ("float32", "mixed_bfloat16")])
def test_a_keras_file_reloads_with_the_policy_it_was_built_under(tmp_path, saved_under, loaded_under):
    """A model built under a global dtype policy (no `dtype=`) reloads with
    that policy whatever the global one is then, as Keras's own layers do;
    it came back with the loading process's policy (other logits)."""
    x = inputs([[5, 6, END, PAD]], [[START, 8, 9, PAD]])
    previous = keras.config.dtype_policy()
    try:
        keras.config.set_dtype_policy(saved_under)
        model = small_model()
        want = to_numpy(model(x))
        path = os.path.join(tmp_path, "model.keras")
        model.save(path)
        keras.config.set_dtype_policy(loaded_under)
        restored = keras.saving.load_model(path)
    finally:
        keras.config.set_dtype_policy(previous)
    assert restored.get_config()["dtype"] == saved_under
    assert {layer.dtype_policy.name for layer in restored.decoder_layers} == {saved_under}
    np.testing.assert_array_equal(to_numpy(restored(x)), want)


def test_c27_ragged_last_batch_fit_with_jit_then_predict():
    """C27: fit 2 steps with jit_compile on batches of 2 and 3, then predict.

    The case is XLA's (a causal mask tiled by the dynamic batch size fails
    under `jax.jit`): compiled on tensorflow and jax. On torch the ragged
    batch is trained eagerly, as in `test_cross_backend.py`: there
    jit_compile means `torch.compile`, whose tracing of Keras's torch
    layers (over 200 graph breaks) took 6 minutes for this model alone on
    a 2-core CPU and 23 beside the rest of the suite."""
    model = _compiled(small_model())
    model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(),
                  jit_compile=keras.backend.backend() != "torch")
    rng = np.random.default_rng(1)
    x = inputs(rng.integers(4, 30, (5, 6)), rng.integers(4, 40, (5, 5)))
    y = rng.integers(4, 40, (5, 5)).astype("int32")
    history = model.fit(x, y, batch_size=3, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert model.predict(x, batch_size=2, verbose=0).shape == (5, 5, 40)


@pytest.mark.parametrize("bad", ["encoder_inputs", "decoder_inputs", "labels"])
def test_ids_outside_the_vocabulary_stop_compiled_fit_evaluate_and_predict(bad):
    """XLA compiles TensorFlow's asserts to nothing and clamps gathers: with
    jit_compile=True an id outside the vocabulary trained on the table's
    last row without a word. It is an error in every compiled step."""
    model = small_model(num_layers=1)
    model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(),
                  jit_compile=keras.backend.backend() != "torch")
    x = inputs([[5, 6, 7, END]] * 4, [[START, 8, 9, 10]] * 4)
    y = np.array([[8, 9, 10, END]] * 4, "int32")
    if bad == "labels":
        y[3, 2] = 40  # tgt_vocab_size 40
    else:
        x[bad][3, 1] = 30 if bad == "encoder_inputs" else 40
    calls = {"fit": lambda: model.fit(x, y, batch_size=2, verbose=0),
             "evaluate": lambda: model.evaluate(x, y, batch_size=2, verbose=0)}
    if bad != "labels":
        calls["predict"] = lambda: model.predict(x, batch_size=2, verbose=0)
    for name, call in calls.items():
        before = [to_numpy(w) for w in model.weights]
        with pytest.raises(Exception, match=r"must be token ids in \[0, (30|40)\)"):
            call()
        if name != "fit":  # fit took one good step first
            for a, b in zip(before, model.weights):
                np.testing.assert_array_equal(a, to_numpy(b))
    assert model.jit_compile is (keras.backend.backend() != "torch")
    # The model is whole: on jax, Keras's loop had its variables in donated buffers.
    good = inputs([[5, 6, 7, END]] * 2, [[START, 8, 9, 10]] * 2)
    assert np.all(np.isfinite(model.predict(good, verbose=0)))


@pytest.mark.parametrize("jit_compile", [True, False])
@pytest.mark.parametrize("bad", ["too_long", "label_length"])
def test_a_batch_of_bad_shape_is_a_clear_error_and_the_model_stays_whole(bad, jit_compile):
    """A batch longer than `sequence_length`, or labels whose length is not
    the decoder inputs', is refused with the library's message in fit,
    evaluate and predict, and on every backend the model then trains and
    predicts as before (on jax, Keras's loop holds the variables in its
    step's state during a call; a step that fails while it is traced must
    hand them back)."""
    if jit_compile and keras.backend.backend() == "torch":
        pytest.skip("torch's compiled step is torch.compile, not tested here")
    model = small_model(num_layers=1)
    model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(),
                  metrics=[MaskedAccuracy()], jit_compile=jit_compile)
    x = inputs([[5, 6, 7, END]] * 4, [[START, 8, 9, 10]] * 4)
    y = np.array([[8, 9, 10, END]] * 4, "int32")
    model.fit(x, y, batch_size=2, verbose=0)
    before = [to_numpy(w) for w in model.weights]
    if bad == "too_long":  # sequence_length 12
        bad_x = inputs([[5, 6] * 7 + [END]] * 4, [[START, 8, 9, 10]] * 4)
        calls = {"fit": lambda: model.fit(bad_x, y, batch_size=2, verbose=0),
                 "evaluate": lambda: model.evaluate(bad_x, y, batch_size=2, verbose=0),
                 "predict": lambda: model.predict(bad_x, batch_size=2, verbose=0)}
        message = r"longer than its sequence_length=12"
    else:
        bad_y = np.array([[8, 9, 10, 11, END]] * 4, "int32")
        calls = {"fit": lambda: model.fit(x, bad_y, batch_size=2, verbose=0),
                 "evaluate": lambda: model.evaluate(x, bad_y, batch_size=2, verbose=0)}
        message = r"Labels and (predictions|`decoder_inputs`) differ in shape"
    for name, call in calls.items():
        with pytest.raises(Exception, match=message):
            call()
        for a, b in zip(before, model.weights):
            np.testing.assert_array_equal(a, to_numpy(b))
    want = model.predict(x, verbose=0)
    assert np.all(np.isfinite(want))
    model.fit(x, y, batch_size=2, verbose=0)
    assert not np.array_equal(to_numpy(model.weights[0]), before[0])


@pytest.mark.parametrize("structure", ["labels_in_a_list", "loss_in_a_list", "loss_in_a_dict"])
def test_label_ids_are_checked_when_the_one_output_comes_in_a_list_or_dict(structure):
    """Keras takes `y=[labels]`, `loss=[loss]` and `loss={"logits": loss}`
    for a one-output model: the labels are checked in each form."""
    model = small_model(num_layers=1)
    loss = MaskedSparseCategoricalCrossentropy()
    loss = {"loss_in_a_list": [loss], "loss_in_a_dict": {"logits": loss}}.get(structure, loss)
    model.compile(optimizer="adam", loss=loss, jit_compile=keras.backend.backend() != "torch")
    x = inputs([[5, 6, 7, END]] * 4, [[START, 8, 9, 10]] * 4)
    y = np.array([[8, 9, 10, END]] * 4, "int32")
    y[3, 2] = 40  # tgt_vocab_size 40
    with pytest.raises(Exception, match=r"labels .* must be token ids in \[0, 40\)"):
        model.fit(x, [y] if structure == "labels_in_a_list" else y, batch_size=2, verbose=0)
    assert np.all(np.isfinite(model.predict(x, verbose=0)))


def test_tensorflow_xla_under_a_strategy_trains_with_keras_step_and_says_ids_are_unchecked():
    """Under a tf.distribute strategy the optimizer's cross-replica step
    cannot run in a function nested in `strategy.run`: fit takes Keras's own
    XLA step, and warns that the ids go unchecked there."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.distribute and XLA steps are TensorFlow's")
    from keras_transformer.distribution import data_parallel_scope

    rng = np.random.default_rng(4)
    x = inputs(rng.integers(4, 30, (4, 5)), rng.integers(4, 40, (4, 4)))
    y = rng.integers(4, 40, (4, 4)).astype("int32")
    with data_parallel_scope("data_parallel"):
        model = small_model(num_layers=1)
        model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(), jit_compile=True)
        with pytest.warns(UserWarning, match="tf.distribute strategy"):
            history = model.fit(x, y, batch_size=2, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and model.jit_compile is True


def test_tensorflow_xla_steps_checked_outside_are_compiled_and_equal_keras_own():
    """The checked steps are still XLA's, and train and evaluate exactly as
    Keras's own XLA steps do on in-range ids."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the checks around an XLA step are TensorFlow's (elsewhere the model's checks raise)")
    import tensorflow as tf

    rng = np.random.default_rng(3)
    x = inputs(rng.integers(4, 30, (6, 5)), rng.integers(4, 40, (6, 4)))
    y = rng.integers(0, 40, (6, 4)).astype("int32")

    def trained(keras_own_steps):
        model = small_model(num_layers=1)
        model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(), jit_compile=True)
        if keras_own_steps:
            model.train_step = functools.partial(keras.Model.train_step, model)
            model.test_step = functools.partial(keras.Model.test_step, model)
        history = model.fit(x, y, batch_size=3, epochs=2, verbose=0)
        return model, history.history["loss"], model.evaluate(x, y, batch_size=3, verbose=0)

    checked, losses, evaluated = trained(False)
    own, own_losses, own_evaluated = trained(True)
    assert "train_step" in checked._xla_steps and "train_step" not in own.__dict__.get("_xla_steps", {})
    np.testing.assert_allclose(losses, own_losses, rtol=1e-5)
    np.testing.assert_allclose(evaluated, own_evaluated, rtol=1e-5)
    for a, b in zip(checked.weights, own.weights):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-4, atol=1e-6)
    batch = ({k: tf.constant(v[:3]) for k, v in x.items()}, tf.constant(y[:3]))
    assert "HloModule" in checked._xla_steps["train_step"].experimental_get_compiler_ir(batch)(stage="hlo")
    assert checked.jit_compile is True


def test_c03_random_targets_stay_near_chance():
    """C03 training sanity: with random targets, accuracy stays near chance."""
    model = _compiled(small_model(num_layers=1))
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss=MaskedSparseCategoricalCrossentropy(), metrics=[MaskedAccuracy()])
    rng = np.random.default_rng(2)
    labels = rng.integers(4, 40, (64, 8)).astype("int32")
    decoder_inputs = np.concatenate([np.full((64, 1), START), labels[:, :-1]], 1).astype("int32")
    x = {"encoder_inputs": np.full((64, 4), 5, "int32"), "decoder_inputs": decoder_inputs}
    history = model.fit(x, labels, batch_size=16, epochs=12, verbose=0)  # 48 steps
    assert history.history["masked_accuracy"][-1] < 0.3


def test_presets_and_bad_arguments():
    model = build_from_preset("tiny", 50, 60, sequence_length=16)
    assert model.get_layer("decoder_layer_1").num_heads == 4
    with pytest.raises(ValueError, match="Unknown preset"):
        build_from_preset("huge", 50, 60)
    with pytest.raises(ValueError, match="must divide"):
        build_transformer(10, 10, d_model=10, num_heads=3)
    with pytest.raises(ValueError, match="positive"):
        build_transformer(0, 10)


@pytest.mark.parametrize("settings, message", [
    (dict(sequence_length=1), r"`sequence_length` of at least 2: a piece and the end id; got 1"),
    (dict(src_vocab_size=3), r"`src_vocab_size` of at least 5: ids 0-3 are padding"),
    (dict(src_vocab_size=100.5), r"positive whole `src_vocab_size`.*got 100.5"),
    (dict(num_layers=True), r"positive whole `num_layers`.*got True"),
    (dict(dropout_rate="0.1"), r"`dropout_rate` must be a number in \[0, 1\); got '0.1'"),
    (dict(dropout_rate=-0.1), r"`dropout_rate` must be a number in \[0, 1\); got -0.1"),
    (dict(attention_dropout_rate=float("nan")), r"`attention_dropout_rate` must be a number in \[0, 1\); got nan"),
])
def test_build_transformer_refuses_sizes_and_rates_it_cannot_use(settings, message):
    """These were built without a word (a position table of one row, a
    vocabulary of special ids only, 100.5 cut to 100, True taken as one
    layer) or failed deep inside Keras with a message that did not name the
    argument."""
    arguments = dict(src_vocab_size=30, tgt_vocab_size=40, num_layers=1, d_model=8, num_heads=2,
                     dff=16, sequence_length=8)
    arguments.update(settings)
    with pytest.raises(ValueError, match=message):
        build_transformer(**arguments)


@pytest.mark.parametrize("training", [True, False])
def test_encoder_and_decoder_batch_sizes_must_match(training):
    """A decoder batch of 1 against an encoder batch of 2 was broadcast on
    tensorflow in training: output (1, 5, V), no error."""
    model = build_transformer(50, 50, num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=8)
    inputs = {"encoder_inputs": np.ones((2, 5), "int32"), "decoder_inputs": np.ones((1, 5), "int32")}
    with pytest.raises(ValueError, match="same batch size"):
        model(inputs, training=training)


def test_batch_mismatch_known_only_at_run_time_is_an_error_in_fit():
    """Inside `fit`'s traced step the batch sizes are unknown until run time."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tensorflow graphs only; other backends trace with static shapes")
    import tensorflow as tf

    model = build_transformer(50, 50, num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=8)
    model.compile(optimizer="sgd", loss=MaskedSparseCategoricalCrossentropy())
    spec = tf.TensorSpec((None, None), tf.int32)
    batch = ({"encoder_inputs": np.ones((2, 5), "int32"), "decoder_inputs": np.ones((1, 5), "int32")},
             np.ones((1, 5), "int32"))
    dataset = tf.data.Dataset.from_generator(
        lambda: iter([batch]),
        output_signature=({"encoder_inputs": spec, "decoder_inputs": spec}, spec),
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="same batch size"):
        model.fit(dataset, verbose=0)


def test_max_length_is_the_deprecated_name_of_sequence_length():
    """`sequence_length` (the position tables' rows) was `max_length`: the
    old name still works with a DeprecationWarning, models saved under it
    load silently, and both names at once are an error."""
    from keras_transformer import PositionalEmbedding
    from keras_transformer.config import TrainingConfig

    with pytest.warns(DeprecationWarning, match="sequence_length"):
        old = build_transformer(50, 50, num_layers=1, d_model=16, num_heads=2, dff=32, max_length=8)
    new = build_transformer(50, 50, num_layers=1, d_model=16, num_heads=2, dff=32, sequence_length=8)
    for model in (old, new):
        assert model.get_layer("encoder_embedding").get_config()["sequence_length"] == 8
        assert model.get_layer("decoder_embedding").sequence_length == 8
    with pytest.raises(TypeError, match="both"):
        build_transformer(50, 50, sequence_length=8, max_length=8)
    with pytest.warns(DeprecationWarning):
        assert PositionalEmbedding(10, 4, max_length=5).sequence_length == 5
    config = PositionalEmbedding(10, 4, sequence_length=5).get_config()
    config["max_length"] = config.pop("sequence_length")  # as an earlier version saved it
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert PositionalEmbedding.from_config(config).sequence_length == 5
    with pytest.warns(DeprecationWarning):
        assert TrainingConfig("a", "b", max_length=32).sequence_length == 32
    assert TrainingConfig("a", "b").sequence_length == 64


def test_fast_path_fit_logs_the_loss_and_accuracy_that_evaluate_gives(monkeypatch):
    """`fast_path.attach` gives `fit` the fast step: with dropout 0 and a
    learning rate of 0, one step logs the loss and accuracy that `evaluate`
    (the plain model) gives on the same batch, and the weights stay; label
    smoothing and pad_id come from the compiled loss; `detach` restores
    Keras's own step."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the training fast path is TensorFlow's")
    from keras_transformer import fast_path

    model = small_model()
    x = inputs(
        [[5, 6, 7, END, PAD], [8, END, PAD, PAD, PAD], [9, 10, 11, 12, END]],
        [[START, 8, 9, PAD], [START, PAD, PAD, PAD], [START, 13, 14, 15]],
    )
    labels = np.array([[8, 9, END, PAD], [END, PAD, PAD, PAD], [13, 14, 15, END]], "int32")
    model.compile(keras.optimizers.SGD(0.0), MaskedSparseCategoricalCrossentropy(label_smoothing=0.1),
                  metrics=[MaskedAccuracy()])
    traced = []
    real_step = fast_path.loss_and_predictions
    monkeypatch.setattr(fast_path, "loss_and_predictions",
                        lambda *a, **k: traced.append(1) or real_step(*a, **k))
    fast_path.attach(model)
    assert fast_path.is_attached(model)
    before = [w.copy() for w in model.get_weights()]
    fitted = model.fit(x, labels, batch_size=3, epochs=1, verbose=0).history
    evaluated = model.evaluate(x, labels, batch_size=3, verbose=0, return_dict=True)
    assert traced  # fit traced the fast step
    assert fitted["loss"][0] == pytest.approx(evaluated["loss"], abs=1e-5)
    assert fitted["masked_accuracy"][0] == pytest.approx(evaluated["masked_accuracy"], abs=1e-6)
    for got, want in zip(model.get_weights(), before):
        np.testing.assert_array_equal(got, want)
    fast_path.detach(model)
    assert not fast_path.is_attached(model)
    with pytest.raises(ValueError, match="compiled model"):
        fast_path.attach(small_model())
    other = small_model()
    other.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="MaskedSparseCategoricalCrossentropy"):
        fast_path.attach(other)
    plain = model.fit(x, labels, batch_size=3, epochs=1, verbose=0).history
    assert plain["loss"][0] == pytest.approx(evaluated["loss"], abs=1e-5)


@pytest.mark.parametrize("metric", ["accuracy", keras.metrics.SparseCategoricalAccuracy(),
                                    keras.metrics.SparseTopKCategoricalAccuracy(k=2)])
def test_fast_path_refuses_metrics_that_need_logits(metric):
    """The fast step gives the compiled metrics predicted ids: a metric
    that needs logits (Keras's "accuracy" counted padding and the ids
    as scores, 0.0625 against 0.0208; `SparseCategoricalAccuracy` crashed
    in the graph) is refused clearly, at `attach` and, for a model
    compiled again after it, at the step."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the training fast path is TensorFlow's")
    from keras_transformer import fast_path, masked_accuracy

    x = inputs([[5, 6, 7, END, PAD]], [[START, 8, 9, PAD]])
    labels = np.array([[8, 9, END, PAD]], "int32")
    model = small_model()
    model.compile("sgd", MaskedSparseCategoricalCrossentropy(), metrics=[MaskedAccuracy(), metric])
    with pytest.raises(ValueError, match="need logits.*MaskedAccuracy"):
        fast_path.attach(model)
    assert not fast_path.is_attached(model)
    model.compile("sgd", MaskedSparseCategoricalCrossentropy(), weighted_metrics=[masked_accuracy])
    fast_path.attach(model)
    model.compile("sgd", MaskedSparseCategoricalCrossentropy(), metrics=[metric])
    with pytest.raises(ValueError, match="need logits"):
        model.fit(x, labels, epochs=1, verbose=0)
    fast_path.detach(model)
    assert np.isfinite(model.fit(x, labels, epochs=1, verbose=0).history["loss"][0])


def test_fast_path_refuses_another_loss_quantity_and_follows_a_recompile():
    """The fast step computes the unweighted mean over real tokens: a loss
    with `reduction="sum"` trained on the mean while `fit` logged 3.55 and
    the plain step 564.8, and `loss_weights=2.0` went unscaled (a new-user
    trial); both are refused, at `attach` and, compiled again after it, at
    the step. A recompile with another label smoothing is followed (the
    step kept the smoothing of `attach`'s time)."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the training fast path is TensorFlow's")
    from keras_transformer import fast_path

    x = inputs([[5, 6, 7, END, PAD], [8, END, PAD, PAD, PAD]], [[START, 8, 9, PAD], [START, 13, PAD, PAD]])
    labels = np.array([[8, 9, END, PAD], [13, END, PAD, PAD]], "int32")
    for compiled, says in (
        (dict(loss=MaskedSparseCategoricalCrossentropy(reduction="sum")), "reduction='sum'"),
        (dict(loss=MaskedSparseCategoricalCrossentropy(), loss_weights=2.0), "loss_weights=2.0"),
    ):
        model = small_model()
        model.compile(keras.optimizers.SGD(0.0), **compiled)
        with pytest.raises(ValueError, match=says):
            fast_path.attach(model)
        model.compile(keras.optimizers.SGD(0.0), MaskedSparseCategoricalCrossentropy())
        fast_path.attach(model)
        model.compile(keras.optimizers.SGD(0.0), **compiled)
        with pytest.raises(ValueError, match=says):
            model.fit(x, labels, epochs=1, verbose=0)
    model = small_model()
    model.compile(keras.optimizers.SGD(0.0), MaskedSparseCategoricalCrossentropy(label_smoothing=0.0))
    fast_path.attach(model)
    model.compile(keras.optimizers.SGD(0.0), MaskedSparseCategoricalCrossentropy(label_smoothing=0.3))
    fitted = model.fit(x, labels, batch_size=2, epochs=1, verbose=0).history["loss"][0]
    assert fitted == pytest.approx(model.evaluate(x, labels, batch_size=2, verbose=0), abs=1e-5)


@pytest.mark.parametrize("settings", [
    dict(),
    dict(tie_embeddings="all", norm_first=True, num_decoder_layers=1),
    dict(tie_embeddings="target"),
], ids=["untied", "all-tied-pre-ln", "target-tied"])
def test_model_decodes_step_by_step_as_its_full_call(settings):
    """The model's own `call_encoder` and `call_decoder_with_cache`, one
    position at a time, give the full model's logits at every position."""
    if settings.get("tie_embeddings") == "all":
        keras.utils.set_random_seed(0)
        model = build_transformer(40, 40, num_layers=2, d_model=16, num_heads=2, dff=32,
                                  dropout_rate=0.0, sequence_length=12, **settings)
    else:
        model = small_model(**settings)
    assert model.encoder_layers and len(model.decoder_layers) == settings.get("num_decoder_layers", 2)
    assert set(map(id, model.layers)) >= set(map(id, model.encoder_layers + model.decoder_layers))
    source = np.array([[5, 6, 7, END, PAD], [8, 9, END, PAD, PAD]], "int32")
    target = np.array([[START, 8, 9, 10], [START, 11, 12, 13]], "int32")
    full = to_numpy(model(inputs(source, target)))
    encoder_outputs, mask = model.call_encoder(source)
    assert to_numpy(mask).tolist() == (source != PAD).tolist()
    cross = model.compute_cross_attention_caches(encoder_outputs)
    # A tied output projection either transposed once (the default) or
    # multiplied by the transposed table in each step (issue 18: what XLA
    # folds into the product): the table itself, not a copy.
    for fold in (False, True):
        caches = model.empty_self_attention_caches(2, 12)
        weights = model.decoding_weights(fold_tied_transpose=fold)
        kernel, bias, transposed = weights["logits"]
        tied = model.logits_layer is model.decoder_embedding
        assert transposed == (fold and tied)
        assert (kernel is weights["embedding"]) == (fold and tied)
        if tied and not fold:
            np.testing.assert_array_equal(to_numpy(kernel), to_numpy(weights["embedding"]).T)
        for t in range(target.shape[1]):
            logits, caches = model.call_decoder_with_cache(
                target[:, t], caches, t, cross, mask, decoding_weights=weights)
            np.testing.assert_allclose(to_numpy(logits), full[:, t], rtol=1e-4, atol=1e-4)


def test_model_config_round_trip_and_keras_file(tmp_path):
    """`Transformer.from_config(get_config())` is the same architecture, and a
    `.keras` file loads back as a `Transformer` with the same outputs."""
    from keras_transformer import Transformer

    model = small_model(tie_embeddings="target", norm_first=True, activation="gelu",
                        attention_dropout_rate=0.05, dtype="float32", name="round_trip")
    config = model.get_config()
    assert config["tie_embeddings"] == "target" and config["activation"] == "gelu"
    copy = Transformer.from_config(config)
    assert copy.get_config() == config
    assert [w.path for w in copy.weights] == [w.path for w in model.weights]
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    assert type(restored) is Transformer and restored.get_config() == config
    x = inputs([[5, 6, END, PAD]], [[START, 8, 9]])
    np.testing.assert_allclose(to_numpy(restored(x)), to_numpy(model(x)), atol=1e-6)


def test_a_model_saved_by_an_earlier_version_converts(tmp_path):
    """Earlier versions built a plain functional model with the same layer
    names: its weight files have the same paths, and `as_transformer`
    rebuilds it as a `Transformer` with the same outputs."""
    import h5py

    from keras_transformer import Transformer
    from keras_transformer import as_transformer
    from keras_transformer.decoding import TransformerParts

    model = small_model(norm_first=True)
    old = keras.Model(model.inputs, model.outputs, name=model.name)  # what earlier versions built
    assert type(old) is not Transformer
    new_path, old_path = (os.path.join(tmp_path, f"{n}.weights.h5") for n in ("new", "old"))
    model.save_weights(new_path)
    old.save_weights(old_path)

    def keys(path):
        found = []
        with h5py.File(path) as f:
            f.visit(found.append)
        return found

    assert keys(new_path) == keys(old_path)
    keras_path = os.path.join(tmp_path, "old.keras")
    old.save(keras_path)
    loaded = keras.saving.load_model(keras_path)
    assert type(loaded) is not Transformer
    converted = as_transformer(loaded)
    assert type(converted) is Transformer and as_transformer(converted) is converted
    assert converted.get_config() == {**model.get_config(), "dtype": converted.get_config()["dtype"]}
    x = inputs([[5, 6, 7, END, PAD]], [[START, 8, 9]])
    np.testing.assert_allclose(to_numpy(converted(x)), to_numpy(model(x)), atol=1e-6)
    # An old weights file loads into a new model unchanged.
    keras.utils.set_random_seed(1)
    fresh = build_transformer(30, 40, num_layers=2, d_model=16, num_heads=2, dff=32,
                              dropout_rate=0.0, sequence_length=12, norm_first=True)
    fresh.load_weights(old_path)
    np.testing.assert_allclose(to_numpy(fresh(x)), to_numpy(model(x)), atol=1e-6)
    assert TransformerParts(loaded).model.get_config()["num_layers"] == 2
    with pytest.raises(ValueError, match="Expected a keras_transformer Transformer"):
        as_transformer(keras.Sequential([keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match="pads with id 5"):
        TransformerParts(model, pad_id=5)
    if keras.backend.backend() == "tensorflow":
        from keras_transformer.fast_path.forward import TrainingForward

        with pytest.raises(ValueError, match="converts with keras_transformer.as_transformer"):
            TrainingForward(loaded)


def test_copy_weights_refuses_another_architecture():
    from keras_transformer.models import copy_weights

    with pytest.raises(ValueError, match="weights differ"):
        copy_weights(small_model(), small_model(num_layers=1))
    with pytest.raises(ValueError, match="shape"):
        copy_weights(small_model(), small_model(d_model=8, num_heads=2))


def test_step_by_step_decoding_checks_its_python_arguments():
    """`call_decoder_with_cache` with an index past the caches failed in a
    gather, took -1 silently, and took tokens of another batch than the
    caches (a new-user trial); `empty_self_attention_caches` took more
    positions than the decoder encodes."""
    model = small_model()
    source = np.array([[5, 6, END, PAD], [7, END, PAD, PAD], [8, 9, 10, END]], "int32")
    outputs, mask = model.call_encoder(source)
    cross = model.compute_cross_attention_caches(outputs)
    caches = model.empty_self_attention_caches(3, 12)
    tokens = np.full((3,), START, "int32")
    logits, _ = model.call_decoder_with_cache(tokens, caches, 0, cross, mask)
    assert tuple(logits.shape) == (3, 40)
    for index in (12, 20, -1):
        with pytest.raises(ValueError, match=rf"must be a position in \[0, 12\) \(the caches' 12 slots\); got {index}"):
            model.call_decoder_with_cache(tokens, caches, index, cross, mask)
    with pytest.raises(ValueError, match="`token_ids` has 2 rows and the self-attention caches 3"):
        model.call_decoder_with_cache(tokens[:2], caches, 0, cross, mask)
    with pytest.raises(ValueError, match="`token_ids` has 1 rows, and `encoder_outputs_mask` 3 sources"):
        model.call_decoder_with_cache(tokens[:1], model.empty_self_attention_caches(1, 12), 0, cross, mask)
    with pytest.raises(ValueError, match="`length` is at most the decoder's sequence_length, 12; got 13"):
        model.empty_self_attention_caches(3, 13)


@pytest.mark.parametrize("argument, message", [
    ({"pad_id": None}, "needs `pad_id`, the padding id of both sides, .* got None"),
    ({"pad_id": 30}, r"below both vocabulary sizes \(30, 40\); got 30"),
    ({"pad_id": -1}, "got -1"),
    ({"dtype": "int32"}, "`dtype` is a float dtype policy .* got 'int32'"),
    ({"norm_first": "False"}, r"`norm_first` must be a bool \(True or False\); got 'False' \(str\)"),
])
def test_build_transformer_refuses_a_pad_id_or_dtype_it_cannot_use(argument, message):
    """`pad_id=None` failed in `int()`, and `dtype="int32"` in a tensor
    conversion deep in the first layer (a new-user trial)."""
    with pytest.raises(ValueError, match=message):
        small_model(**argument)
    with pytest.raises(ValueError, match="causal_mask needs a `query_length` of 0 or more; got -1"):
        causal_mask(-1)


def test_predict_refuses_inputs_of_different_row_counts():
    """Keras's predict failed on them with "'str' object has no attribute
    'shape'" (fit and evaluate say "Data cardinality is ambiguous"), a
    new-user trial; inputs that agree predict the model's own logits."""
    model = small_model()
    x = inputs([[5, 6, END], [7, END, PAD]], [[START, 8, 9], [START, 8, PAD]])
    np.testing.assert_allclose(model.predict(x, verbose=0), to_numpy(model(x)), atol=1e-5)
    with pytest.raises(ValueError, match=r"one row per sentence each; got \{'encoder_inputs': 2, 'decoder_inputs': 1\}"):
        model.predict({"encoder_inputs": x["encoder_inputs"], "decoder_inputs": x["decoder_inputs"][:1]}, verbose=0)
    # No row: Keras's predict failed with "UnboundLocalError: ... 'batch_outputs'" (a new-user trial).
    empty = model.predict({"encoder_inputs": np.zeros((0, 3), "int32"), "decoder_inputs": np.zeros((0, 4), "int32")},
                          verbose=0)
    assert empty.shape == (0, 4, model.tgt_vocab_size) and empty.dtype == np.float32


def test_ids_that_are_not_integers_are_refused_by_the_model_and_its_loss_and_metric():
    """Keras's functional inputs cast float ids to int32 (3.7 read as 3) and
    the loss and accuracy cast float labels, all without a word (a new-user
    trial); integer ids of any width give the same logits."""
    model = small_model()
    x = inputs([[5, 6, END], [7, END, PAD]], [[START, 8, 9], [START, 8, PAD]])
    labels = np.array([[8, 9, END], [8, END, PAD]], "int32")
    expected = to_numpy(model(x))
    for name in x:
        for bad, dtype in ((x[name] + 0.7, "float64"), (x[name] > 5, "bool")):
            data = dict(x, **{name: bad})
            with pytest.raises(TypeError, match=f"`{name}` must be integer token ids; got {dtype} ids"):
                model(data)
            with pytest.raises(TypeError, match=f"`{name}` must be integer token ids; got {dtype[:5]}"):
                model.predict(data, verbose=0)  # Keras's data adapter makes float64 float32
    np.testing.assert_allclose(to_numpy(model({k: v.astype("int64") for k, v in x.items()})), expected, atol=1e-6)

    float_labels = labels.astype("float32") + 0.3
    with pytest.raises(TypeError, match=r"The labels \(`y_true`\) must be integer token ids; got float32"):
        masked_loss(float_labels, expected)
    with pytest.raises(TypeError, match=r"The labels \(`y_true`\) must be integer token ids; got float32"):
        MaskedSparseCategoricalCrossentropy()(float_labels, expected)
    with pytest.raises(TypeError, match=r"The labels \(`y_true`\) must be integer token ids; got float32"):
        MaskedAccuracy().update_state(float_labels, expected)
    model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(), metrics=[MaskedAccuracy()])
    with pytest.raises(TypeError, match="must be integer token ids; got float32"):
        model.fit(x, float_labels, epochs=1, verbose=0)
    weights = [to_numpy(w) for w in model.weights]
    with pytest.raises(TypeError, match="`decoder_inputs` must be integer token ids; got float32"):
        model.fit(dict(x, decoder_inputs=x["decoder_inputs"].astype("float32")), labels, epochs=1, verbose=0)
    for before, after in zip(weights, model.weights):
        np.testing.assert_array_equal(before, to_numpy(after))


def test_jit_compile_on_torch_falls_back_with_a_warning():
    """torch.compile of the training step failed after minutes with a
    KeyError ('inputs_mask') from torch's dynamo (a new-user trial): on torch
    `jit_compile=True` compiles without it and says so; fit then trains."""
    if keras.backend.backend() != "torch":
        pytest.skip("jit_compile=True is torch.compile on torch only")
    model = small_model()
    model.compile(optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(), jit_compile=True)
    x = inputs([[5, 6, END]], [[START, 8, 9]])
    with pytest.warns(UserWarning, match="running with jit_compile=False"):
        history = model.fit(x, np.array([[8, 9, END]], "int32"), epochs=2, verbose=0)
    assert model.jit_compile is False
    assert np.isfinite(history.history["loss"]).all()
