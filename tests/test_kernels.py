"""The fused CPU training kernels (`keras_transformer.fast_path.kernels`): values
against NumPy, gradients against TensorFlow's autodiff of the same formula,
the dropout mask against a NumPy copy of its hash, and where they run."""

import os

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow kernels"
)

tf = pytest.importorskip("tensorflow")

from keras_transformer.fast_path import kernels  # noqa: E402

MASK64 = (1 << 64) - 1


@pytest.fixture(scope="module")
def module():
    built = kernels.build()
    if not built.available:
        message = f"fused kernels unavailable: {built.reason}"
        if os.environ.get("CI") and not kernels._disabled():
            pytest.fail(message)
        pytest.skip(message)
    return kernels.load()


def mix64(z):
    """SplitMix64's output function, as in fused_ops.cc."""
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def numpy_keep(shape, rate, seed):
    """The keep factors the header of fused_ops.cc defines, element by element."""
    threshold, scale = kernels.dropout_constants(rate)
    key = mix64(mix64(seed[0] & MASK64) ^ (seed[1] & MASK64))
    size = int(np.prod(shape))
    keep = np.empty(size, "float32")
    for i in range(size):
        field = (mix64((key + i // 4) & MASK64) >> (16 * (i % 4))) & 0xFFFF
        keep[i] = scale if field >= threshold else 0.0
    return keep.reshape(shape)


def numpy_layer_norm(z, gamma, beta, epsilon):
    mean = z.mean(-1, keepdims=True)
    var = ((z - mean) ** 2).mean(-1, keepdims=True)
    return (z - mean) / np.sqrt(var + epsilon) * gamma + beta


def test_dropout_constants():
    assert kernels.dropout_constants(0.1) == (6554, 65536 / (65536 - 6554))
    assert kernels.dropout_constants(0.0) == (0, 1.0)
    with pytest.raises(ValueError, match="rate"):
        kernels.dropout_constants(1.0)


def test_dropout_mask_is_the_documented_hash(module):
    """7 x 5 (35 elements: groups of 4 cut at both ends of every row)."""
    for seed in ([3, 9], [-1, 123456789]):
        for rate in (0.1, 0.5):
            keep = kernels.fused_dropout(tf.ones((7, 5)), rate, tf.constant(seed))
            np.testing.assert_array_equal(keep.numpy(), numpy_keep((7, 5), rate, seed))


def test_dropout_rate_scale_and_seed(module):
    """Values are 0 or 1/(1-p); the drop share is p within 5 standard
    deviations over 409,600 elements; a seed fixes the mask."""
    x = tf.ones((64, 4, 40, 40))
    threshold, scale = kernels.dropout_constants(0.1)
    p = threshold / 65536
    y = kernels.fused_dropout(x, 0.1, tf.constant([1, 2])).numpy()
    assert set(np.unique(y)) == {0.0, np.float32(scale)}
    dropped = (y == 0).mean()
    assert abs(dropped - p) < 5 * np.sqrt(p * (1 - p) / y.size)
    again = kernels.fused_dropout(x, 0.1, tf.constant([1, 2])).numpy()
    other = kernels.fused_dropout(x, 0.1, tf.constant([1, 3])).numpy()
    np.testing.assert_array_equal(y, again)
    assert (y != other).mean() > 0.1
    # The expectation is kept: mean of kept-and-scaled ones is about 1.
    assert abs(y.mean() - 1.0) < 0.01


def test_dropout_gradient_is_the_same_mask(module):
    x = tf.random.normal((33, 7))
    w = tf.random.normal((33, 7))
    seed = tf.constant([5, 6])
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(kernels.fused_dropout(x, 0.3, seed) * w)
    keep = numpy_keep((33, 7), 0.3, [5, 6])
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), w.numpy() * keep, rtol=1e-6)


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("shape", [(13, 10), (2, 5, 24)])
def test_residual_layer_norm_forward_and_gradient(module, rate, shape):
    """LayerNorm(x + Dropout(y)) against NumPy, and its four gradients
    against TensorFlow's autodiff of the same formula with the same mask."""
    rng = np.random.default_rng(0)
    d = shape[-1]
    x, y, upstream = (rng.normal(size=shape).astype("float32") * 3 for _ in range(3))
    gamma, beta = (rng.normal(size=d).astype("float32") for _ in range(2))
    seed = [11, 12]
    keep = numpy_keep(shape, rate, seed)
    tensors = [tf.constant(v) for v in (x, y, gamma, beta)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        out = kernels.fused_residual_layer_norm(*tensors, rate, tf.constant(seed), 1e-3)
    grads = tape.gradient(out, tensors, output_gradients=tf.constant(upstream))
    np.testing.assert_allclose(
        out.numpy(), numpy_layer_norm(x + y * keep, gamma, beta, 1e-3), rtol=1e-5, atol=1e-5
    )
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        tx, ty, tg, tb = tensors
        z = tx + ty * keep
        mean = tf.reduce_mean(z, -1, keepdims=True)
        var = tf.reduce_mean(tf.square(z - mean), -1, keepdims=True)
        reference = (z - mean) * tf.math.rsqrt(var + 1e-3) * tg + tb
    expected = tape.gradient(reference, tensors, output_gradients=tf.constant(upstream))
    for got, want in zip(grads, expected):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_rows_with_a_zero_row(module, dtype):
    values = np.arange(12, dtype="float32").reshape(4, 3) + 0.5  # exact in bfloat16
    params = tf.cast(values, dtype)
    index = np.array([2, 4, 0, 4, 3], "int32")  # 4 = the zero row
    expected = np.concatenate([values, np.zeros((1, 3), "float32")])[index]
    got = module.kt_gather_rows(params, index)
    assert got.dtype == params.dtype
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), expected)
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        module.kt_gather_rows(params, np.array([5], "int32"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        module.kt_gather_rows(params, np.array([-1], "int32"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_rows_from_parts(module, dtype):
    """Rows of the stacked parts (2, 0 and 3 rows) without stacking them."""
    values = [np.arange(6, dtype="float32").reshape(2, 3), np.zeros((0, 3), "float32"),
              100 + np.arange(9, dtype="float32").reshape(3, 3)]
    parts = [tf.cast(v, dtype) for v in values]
    stacked = np.concatenate(values + [np.zeros((1, 3), "float32")])
    index = np.array([4, 0, 5, 2, 1, 3], "int32")  # 5 = the zero row
    got = module.kt_gather_rows_from_parts(parts, index)
    assert got.dtype == parts[0].dtype
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), stacked[index])
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        module.kt_gather_rows_from_parts(parts, np.array([6], "int32"))


def test_zero_sized_inputs(module):
    """No real token at all: every gathered row is the zero row (never
    uninitialized memory), and empty batches go through every kernel."""
    out = module.kt_gather_rows(np.zeros((0, 3), "float32"), np.array([0, 0], "int32"))
    np.testing.assert_array_equal(out.numpy(), np.zeros((2, 3)))
    out = module.kt_gather_rows_from_parts(
        [np.zeros((0, 3), "float32")] * 2, np.array([0, 0, 0], "int32")
    )
    np.testing.assert_array_equal(out.numpy(), np.zeros((3, 3)))
    seed = tf.constant([1, 2])
    assert kernels.fused_dropout(tf.zeros((0, 4)), 0.1, seed).shape == (0, 4)
    out = kernels.fused_residual_layer_norm(
        tf.zeros((0, 4)), tf.zeros((0, 4)), tf.ones(4), tf.zeros(4), 0.1, seed, 1e-6
    )
    assert out.shape == (0, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="empty"):
        module.kt_residual_layer_norm(
            tf.zeros((2, 0)), tf.zeros((2, 0)), tf.constant([1, 2], tf.int64),
            tf.zeros(0), tf.zeros(0), threshold=0, scale=1.0, epsilon=1e-6,
        )


def test_all_padding_training_step_is_finite(module):
    """A batch whose every token is padding gives a zero loss and all-zero
    gradients through the fused path (no uninitialized memory)."""
    from keras_transformer import fast_path
    from keras_transformer.fast_path.forward import TrainingForward

    model = small_model(0.1)
    forward = TrainingForward(model)
    x = {"encoder_inputs": np.zeros((2, 5), "int32"), "decoder_inputs": np.zeros((2, 5), "int32")}
    y = np.zeros((2, 5), "int32")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss, _ = fast_path.loss_and_predictions(forward, x, y)
        return loss, tape.gradient(loss, model.trainable_variables)

    for _ in range(3):  # fresh buffers each time: garbage would show
        loss, grads = step(x, y)
        assert float(loss) == 0.0
        for g in grads:
            if g is not None:
                np.testing.assert_array_equal(tf.convert_to_tensor(g).numpy(), 0.0)


def test_kernels_reject_bad_inputs(module):
    with pytest.raises(tf.errors.InvalidArgumentError, match="seed"):
        module.kt_dropout(tf.ones((2, 2)), tf.constant([1], tf.int64), threshold=1, scale=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="differ in shape"):
        module.kt_residual_layer_norm(
            tf.ones((2, 4)), tf.ones((3, 4)), tf.constant([1, 2], tf.int64),
            tf.ones(4), tf.ones(4), threshold=0, scale=1.0, epsilon=1e-6,
        )


def small_model(dropout_rate, vocab=40, dtype=None):
    from keras_transformer import build_transformer

    keras.utils.set_random_seed(0)
    return build_transformer(
        vocab, vocab, num_layers=1, d_model=16, num_heads=2, dff=32,
        dropout_rate=dropout_rate, sequence_length=9, dtype=dtype,
    )


def batch():
    rng = np.random.default_rng(1)
    src = rng.integers(4, 40, (4, 9)).astype("int32")
    tgt = rng.integers(4, 40, (4, 9)).astype("int32")
    src[:, 6:] = 0
    tgt[1:, 5:] = 0
    return {"encoder_inputs": src, "decoder_inputs": tgt}, tgt


# The fused ops of a training step (forward and gradient) of `small_model`.
TRAINING_STEP_OPS = {
    "KtResidualLayerNorm", "KtResidualLayerNormGrad", "KtMaskedSoftmaxDropout",
    "KtMaskedSoftmaxDropoutGrad", "KtGatherRows", "KtGatherRowsFromParts",
    "KtSoftmaxCrossEntropy", "KtSoftmaxCrossEntropyGrad",
}


def train_step_ops_and_gradients(model, use_kernels, monkeypatch, path="fast"):
    """The op types, loss and gradients of one training step: the fast path
    (`keras_transformer.fast_path`) with or without the kernels, or with
    `path="plain"` the model's own call and loss."""
    from keras_transformer import fast_path, masked_loss
    from keras_transformer.fast_path.forward import TrainingForward

    if not use_kernels:
        monkeypatch.setattr(kernels, "load", lambda: None)
    x, y = batch()
    forward = TrainingForward(model)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            if path == "plain":
                loss = masked_loss(y, model(x, training=True), label_smoothing=0.1)
            else:
                loss, _ = fast_path.loss_and_predictions(forward, x, y, label_smoothing=0.1)
        return loss, tape.gradient(loss, model.trainable_variables)

    graph_def = step.get_concrete_function(x, y).graph.as_graph_def()
    op_types = {node.op for node in graph_def.node}
    op_types |= {node.op for f in graph_def.library.function for node in f.node_def}
    loss, grads = step(x, y)
    monkeypatch.undo()
    return op_types, loss.numpy(), [g.numpy() for g in grads]


def test_training_step_runs_the_kernels_and_matches_without_them(module, monkeypatch):
    """At dropout 0 the fused step gives the loss and every gradient of the
    TensorFlow-op step, and both those of the plain Keras model; the fused
    ops are in the fast path's training graph only."""
    model = small_model(0.0)
    fused_ops, fused_loss, fused_grads = train_step_ops_and_gradients(model, True, monkeypatch)
    plain_ops, plain_loss, plain_grads = train_step_ops_and_gradients(model, False, monkeypatch)
    keras_ops, keras_loss, keras_grads = train_step_ops_and_gradients(
        model, True, monkeypatch, path="plain")
    assert TRAINING_STEP_OPS <= fused_ops
    assert not any(op.startswith("Kt") for op in plain_ops | keras_ops)
    np.testing.assert_allclose(fused_loss, plain_loss, rtol=1e-5)
    np.testing.assert_allclose(fused_loss, keras_loss, rtol=1e-5)
    for got, want, plain in zip(fused_grads, plain_grads, keras_grads):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(got, plain, rtol=1e-3, atol=1e-5)
    x, _ = batch()
    inference = tf.function(lambda x: model(x, training=False)).get_concrete_function(x)
    assert not any(op.type.startswith("Kt") for op in inference.graph.get_operations())


def test_fast_path_dropout_uses_the_kernel_outside_xla(module):
    from keras_transformer.fast_path import ops as fast_ops
    from keras_transformer.layers import Dropout

    layer = Dropout(0.1)
    graph = tf.function(lambda x: fast_ops.dropout(x, layer)).get_concrete_function(
        tf.TensorSpec((None, 8), tf.float32)
    ).graph
    assert "KtDropout" in {op.type for op in graph.get_operations()}
    graph = tf.function(lambda x: fast_ops.dropout(x, layer), jit_compile=True).get_concrete_function(
        tf.TensorSpec((4, 8), tf.float32)
    ).graph
    assert "KtDropout" not in {op.type for op in graph.get_operations()}
    # The layer itself is Keras's: no kernel.
    graph = tf.function(lambda x: layer(x, training=True)).get_concrete_function(
        tf.TensorSpec((None, 8), tf.float32)
    ).graph
    assert not any(op.type.startswith("Kt") for op in graph.get_operations())


def test_fit_then_export_has_no_fused_ops(module, tmp_path):
    """A model trained with the kernels exports a SavedModel of core and
    tensorflow-text ops only (TF Serving has no Kt* kernels)."""
    from keras_transformer import MaskedSparseCategoricalCrossentropy, Translator, fast_path
    from keras_transformer.export import export_translator, saved_model_op_types
    from keras_transformer.tokenizers import train_subword_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a b c {w} d e" for w in "fghijklmnopq") + "\n")
    tok = train_subword_tokenizer(str(corpus), 40)
    model = small_model(0.1, tok.vocab_size)
    model.compile("adam", MaskedSparseCategoricalCrossentropy())
    fast_path.attach(model)
    x, y = batch()
    x = {k: v % tok.vocab_size for k, v in x.items()}
    y = y % tok.vocab_size
    model.fit(x, y, epochs=1, verbose=0)
    path = export_translator(Translator(model, tok, tok, beam_size=1), str(tmp_path / "sm"))
    assert not [op for op in saved_model_op_types(path) if op.startswith("Kt")]


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    assert kernels.load() is None
    built = kernels.build()
    assert not built.available and kernels.ENV_SWITCH in built.reason


FAILING_COMPILER = """#!/bin/sh
echo called >> "{calls}"
echo "In file included from x.h:1," >&2
echo "x.h:9:5: error: expected initializer before '<' token" >&2
echo "compilation terminated." >&2
exit 1
"""


def test_a_failed_build_is_remembered_with_the_compilers_error_line(monkeypatch, tmp_path):
    """A build that fails reports the compiler's error line (not its
    trailing notes), falls back to TensorFlow ops, and is not retried by
    later calls (nor by other processes, which read the cache) until
    `force=True`; `load()` never compiles."""
    calls = tmp_path / "calls"
    compiler = tmp_path / "cxx"
    compiler.write_text(FAILING_COMPILER.format(calls=calls))
    compiler.chmod(0o755)
    monkeypatch.setenv(kernels.ENV_SWITCH, "1")
    monkeypatch.setenv(kernels.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(compiler))
    assert kernels.load() is None and not calls.exists()
    first = kernels.build()
    assert not first.available
    assert "error: expected initializer before '<' token" in first.reason
    attempts = len(calls.read_text().splitlines())
    assert attempts == len(kernels.ARCH_FLAGS)  # each flag set once, then give up
    again = kernels.build()
    assert again.reason == first.reason and kernels.status().reason == first.reason
    assert len(calls.read_text().splitlines()) == attempts  # remembered, not retried
    assert kernels.load() is None
    kernels.build(force=True)
    assert len(calls.read_text().splitlines()) == 2 * attempts


def test_error_line_is_the_first_error():
    log = "In file included from a.h:3,\n  b.h:2: error: boom\nc.h:1: error: later\nnote: x\n"
    assert kernels.error_line(log) == "b.h:2: error: boom"
    assert kernels.error_line("ld: cannot find -lfoo\n") == "ld: cannot find -lfoo"


@pytest.mark.slow
def test_flags_compile_on_a_cpu_with_avx512_fp16(tmp_path):
    """On Intel CPUs with AVX512-FP16, `-march=native` made g++ 12 compile
    Eigen's float16 packet code, which it rejects ("expected initializer
    before '<'" in PacketMathFP16.h): every build failed there. The first
    flag set, with that CPU's `-march`, compiles the kernels' headers."""
    import subprocess

    compiler = kernels._compiler()
    if not compiler:
        pytest.skip("no C++ compiler")
    probe = subprocess.run([*compiler, "-march=sapphirerapids", "-E", "-x", "c++", "/dev/null"],
                           capture_output=True)
    if probe.returncode:
        pytest.skip("this compiler does not know -march=sapphirerapids")
    flags = [f for f in kernels.ARCH_FLAGS[0] if f != "-march=native"]
    source = tmp_path / "headers.cc"
    source.write_text('#include "tensorflow/core/framework/op_kernel.h"\n'
                      '#include "unsupported/Eigen/CXX11/Tensor"\nint f() { return 0; }\n')
    done = subprocess.run(
        [*compiler, "-fsyntax-only", "-march=sapphirerapids", *flags, *kernels.CXX_FLAGS[2:],
         str(source), *tf.sysconfig.get_compile_flags()],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, kernels.error_line(done.stderr)


def numpy_masked_softmax(scores, mask):
    blocked = np.where(mask, scores, -np.inf)
    top = blocked.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(mask, np.exp(scores - top), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_masked_softmax_dropout_forward_and_gradient(module, rate):
    """Against NumPy and against TensorFlow's autodiff of `masked_softmax`
    times the same mask, with a causal + padding mask that blocks one query
    row entirely (C08: zeros, no NaN)."""
    from keras_transformer.layers import masked_softmax

    rng = np.random.default_rng(2)
    shape = (2, 3, 5, 7)
    scores = (rng.normal(size=shape) * 4).astype("float32")
    mask = np.tril(np.ones((5, 7), bool))[None, None] & (rng.random((2, 1, 1, 7)) > 0.2)
    mask = np.broadcast_to(mask, shape).copy()
    mask[1, 2, 3] = False  # a row with no allowed key
    seed = [7, 8]
    keep = numpy_keep(shape, rate, seed)
    up_w, up_d = (rng.normal(size=shape).astype("float32") for _ in range(2))
    s = tf.constant(scores)
    with tf.GradientTape() as tape:
        tape.watch(s)
        weights, dropped = kernels.fused_masked_softmax_dropout(s, mask, rate, tf.constant(seed))
        loss = tf.reduce_sum(weights * up_w) + tf.reduce_sum(dropped * up_d)
    got = tape.gradient(loss, s).numpy()
    expected = numpy_masked_softmax(scores, mask)
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dropped.numpy(), expected * keep, rtol=1e-5, atol=1e-7)
    assert np.all(weights.numpy()[1, 2, 3] == 0) and np.all(np.isfinite(got))
    with tf.GradientTape() as tape:
        tape.watch(s)
        reference = masked_softmax(s, mask)
        loss = tf.reduce_sum(reference * up_w) + tf.reduce_sum(reference * keep * up_d)
    np.testing.assert_allclose(got, tape.gradient(loss, s).numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_softmax_cross_entropy_against_numpy(module, eps):
    """Loss against NumPy's log-softmax, gradient against TensorFlow's
    autodiff of the same formula, argmax against NumPy's (first index on
    ties), and a NaN logit gives a NaN loss (not a silently finite one)."""
    rng = np.random.default_rng(3)
    n, v = 37, 101
    x = (rng.normal(size=(n, v)) * 5).astype("float32")
    x[4, [10, 20]] = x[4].max() + 1.0  # a tie for the largest logit
    x[5] = 0.0  # a row that is all ties
    labels = rng.integers(0, v, n).astype("int32")
    upstream = rng.normal(size=n).astype("float32")
    logits = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss, argmax = kernels.fused_softmax_cross_entropy(labels, logits, eps)
    got = tape.gradient(loss, logits, output_gradients=tf.constant(upstream)).numpy()
    shifted = x - x.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted.astype("float64")).sum(-1, keepdims=True))
    expected = -(1 - eps) * log_p[np.arange(n), labels] - eps * log_p.mean(-1)
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(argmax.numpy(), x.argmax(-1))
    with tf.GradientTape() as tape:
        tape.watch(logits)
        target = (1 - eps) * tf.one_hot(labels, v) + eps / v
        reference = -tf.reduce_sum(target * tf.nn.log_softmax(logits), -1)
    want = tape.gradient(reference, logits, output_gradients=tf.constant(upstream)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    x[7, 3] = np.nan
    loss = kernels.fused_softmax_cross_entropy(labels, tf.constant(x), eps)[0].numpy()
    assert np.isnan(loss[7]) and np.all(np.isfinite(np.delete(loss, 7)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="outside"):
        module.kt_softmax_cross_entropy(x, np.full(n, v, "int32"), label_smoothing=eps)


@pytest.mark.parametrize("dtype", [None, "mixed_bfloat16"])
def test_accuracy_reuses_the_loss_argmax(module, dtype):
    """The fast path's step computes the loss and the predicted ids in one
    kernel, and the accuracy takes the ids: no ArgMax op is left (under
    mixed_bfloat16 too, where the kernel runs on a float32 cast of the
    logits). Its value is NumPy's accuracy on the real tokens of the logits."""
    from keras_transformer import MaskedAccuracy, fast_path
    from keras_transformer.fast_path.forward import TrainingForward

    model = small_model(0.0, dtype=dtype)
    forward, metric = TrainingForward(model), MaskedAccuracy()
    x, y = batch()

    @tf.function
    def step(x, y):
        loss, predicted = fast_path.loss_and_predictions(forward, x, y)
        metric.update_state(y, predicted)
        return loss, predicted

    concrete = step.get_concrete_function(x, y)
    op_types = {op.type for op in concrete.graph.get_operations()}
    assert "KtSoftmaxCrossEntropy" in op_types and "ArgMax" not in op_types
    _, predicted = step(x, y)
    real = x["decoder_inputs"] != 0
    logits = tf.cast(model(x, training=False), tf.float32).numpy()
    if dtype is None:  # bfloat16 logits may tie differently
        np.testing.assert_array_equal(predicted.numpy()[real], logits.argmax(-1)[real])
    assert np.all(predicted.numpy()[~real] == 0)
    expected = (predicted.numpy() == y)[y != 0].mean()
    np.testing.assert_allclose(metric.result().numpy(), expected, rtol=1e-6)


def test_mixed_bfloat16_training_step_runs_the_kernels_between_casts(module, monkeypatch):
    """Under mixed_bfloat16 the residual LayerNorm, the attention softmax
    and the cross-entropy run the float32 kernels on float32 casts of the
    bfloat16 tensors, the gathers on bfloat16 rows. Against the float32
    step with the same weights, the fused bfloat16 step's loss and
    gradients are as close as bfloat16 allows,
    and closer overall than the TensorFlow-op bfloat16 step's (the fused
    residual add is float32, not bfloat16)."""
    reference = small_model(0.0)
    _, ref_loss, ref_grads = train_step_ops_and_gradients(reference, False, monkeypatch)
    model = small_model(0.0, dtype="mixed_bfloat16")
    fused_ops, fused_loss, fused_grads = train_step_ops_and_gradients(model, True, monkeypatch)
    plain_ops, plain_loss, plain_grads = train_step_ops_and_gradients(model, False, monkeypatch)
    assert TRAINING_STEP_OPS <= fused_ops
    assert not any(op.startswith("Kt") for op in plain_ops)
    np.testing.assert_allclose(fused_loss, ref_loss, rtol=1e-2)
    np.testing.assert_allclose(plain_loss, ref_loss, rtol=1e-2)
    fused_errors, plain_errors = [], []
    for variable, got, plain, want in zip(
        model.trainable_variables, fused_grads, plain_grads, ref_grads
    ):
        assert got.dtype == np.float32
        if variable.path.endswith("key/bias"):
            continue  # its exact gradient is 0 (softmax ignores a shift)
        norm = np.linalg.norm(want)
        fused_errors.append(np.linalg.norm(got - want) / norm)
        plain_errors.append(np.linalg.norm(plain - want) / norm)
    assert max(fused_errors) < 0.15, fused_errors
    assert np.mean(fused_errors) < np.mean(plain_errors), (fused_errors, plain_errors)


def test_mixed_bfloat16_dropout_uses_the_kernel_with_the_float32_mask(module, monkeypatch):
    from keras_transformer.fast_path import ops as fast_ops
    from keras_transformer.layers import Dropout

    x = tf.random.uniform((6, 50), 1.0, 2.0)
    seed = tf.constant([7, 11], tf.int32)
    want = kernels.fused_dropout(x, 0.25, seed)
    layer = Dropout(0.25, dtype="mixed_bfloat16")
    monkeypatch.setattr(fast_ops, "next_seed", lambda _: seed)
    graph = tf.function(lambda x: fast_ops.dropout(x, layer)).get_concrete_function(
        tf.TensorSpec((None, 50), tf.bfloat16)
    ).graph
    assert "KtDropout" in {op.type for op in graph.get_operations()}
    got = fast_ops.dropout(tf.cast(x, tf.bfloat16), layer)
    assert got.dtype == tf.bfloat16
    np.testing.assert_array_equal(got.numpy() == 0, want.numpy() == 0)
    np.testing.assert_allclose(
        tf.cast(got, tf.float32).numpy(), want.numpy(), rtol=2 ** -6
    )
