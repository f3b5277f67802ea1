"""Fused CPU kernels of the training fast path, built by an explicit step.

Several steps of every training step are chains of small element-wise ops
in TensorFlow, each a pass over memory. `fused_ops.cc` does each, forward
and backward, in one pass:

- `fused_dropout(x, rate, seed)`: `x * keep`, whose gradient is the same
  op on the upstream gradient (the mask is recomputed, not stored);
- `fused_residual_layer_norm(x, y, gamma, beta, rate, seed, epsilon)`: the
  post-LN residual connection `LayerNorm(x + Dropout(y))` around every
  sub-layer (Vaswani et al., 2017, sections 3.1 and 5.4), with `x_hat` and
  `1 / std` kept for the gradient, which gives `dx`, `dy`, `dgamma` and
  `dbeta` in one kernel;
- `fused_masked_softmax_dropout(scores, mask, rate, seed)`: the attention
  weights of equation (1) (blocked keys exactly 0, rows with none allowed
  all 0) and their dropout;
- `fused_softmax_cross_entropy(labels, logits, label_smoothing)`: the
  label-smoothed cross-entropy (section 5.4) and its gradient, recording
  the argmax that the accuracy reuses;
- the ops `KtGatherRows` and `KtGatherRowsFromParts`: the row gathers of
  `fast_path.unpadding`, where one index past the last row gives zeros (no
  copy of the input with a zero row appended), the second from Q/K/V parts
  without stacking them.

The kernels compute in float32. Under `mixed_bfloat16` the fast path runs them
on float32 casts of their bfloat16 tensors and cast the results back; the
gathers, which only move rows, also take bfloat16 directly.

The library (`fused_ops.cc`) is built by an explicit step, never inside
a training call: `keras-transformer build-kernels` (or `build()`; `train`
runs it before training and prints which path it takes). It is compiled with
the C++ compiler (`$CXX`, else `g++` or `c++`) against the installed
TensorFlow's headers into `$KERAS_TRANSFORMER_CACHE` (default
`~/.cache/keras_transformer`), under a name that hashes the source, the
TensorFlow version, the compiler, the flags and the CPU, and `load()` finds
it there afterwards. The flags are `-march=native -mno-avx512fp16` (Eigen's
AVX512-FP16 code, which `-march=native` turns on for CPUs that have it, does
not compile with g++ 12), then `-march=native` for compilers that do not
know that option. A failed build is remembered beside the library, with the
compiler's error, so that it is not retried until something in the hash
changes or `build(force=True)` (`build-kernels --force`) asks again.

Where the library is not built (not Linux, no compiler, a failed build,
`build()` never run) or is turned off with
`KERAS_TRANSFORMER_FUSED_KERNELS=0`, the fast path runs its TensorFlow-op
versions, as they do on a machine with a GPU. The kernels are used only in
training (`training=True`) and never under XLA, so SavedModels for serving
and inference graphs contain only TensorFlow's own ops. They have no
second-order gradients: set `KERAS_TRANSFORMER_FUSED_KERNELS=0` to
differentiate a training step twice.

Dropout masks come from a counter-based hash (SplitMix64's mixer) of the
element index and the layer's seed, in 16-bit steps: an element is dropped
with probability `round(rate * 2^16) / 2^16` and kept elements are scaled
by the inverse of the keep probability, as `fast_path.ops.dropout` does with
TensorFlow's random numbers (the two give different masks).
"""

import functools
import hashlib
import os
import shutil
import subprocess
import shlex
import sys
import tempfile
import threading
import warnings

from keras_transformer.devices import has_accelerator  # noqa: F401 (public here too)
from keras_transformer.devices import in_xla_context

ENV_SWITCH = "KERAS_TRANSFORMER_FUSED_KERNELS"
ENV_CACHE = "KERAS_TRANSFORMER_CACHE"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_ops.cc")
# The math flags let sums vectorize (reassociation); they keep NaN and
# infinity semantics.
CXX_FLAGS = (
    "-shared", "-fPIC", "-O3", "-fno-math-errno", "-fassociative-math",
    "-fno-signed-zeros", "-fno-trapping-math", "-Wno-deprecated-declarations",
)
# Tried in order. -march=native: the cache name includes the CPU, so a
# library is only loaded on the kind of CPU it was built for. On CPUs with
# AVX512-FP16 (Intel Sapphire Rapids and later) it makes Eigen include its
# float16 packet code, which g++ 12 rejects; -mno-avx512fp16 keeps it out,
# and compilers older than that option (g++ < 12) have no such code.
ARCH_FLAGS = (("-march=native", "-mno-avx512fp16"), ("-march=native",))
LEVELS = 1 << 16


def _cpu_signature():
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return ""


def _cache_dir():
    root = os.environ.get(ENV_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "keras_transformer",
    )
    return os.path.join(root, "kernels")


def _disabled():
    return os.environ.get(ENV_SWITCH, "1").strip().lower() in ("0", "false", "no", "off")


def _compiler():
    return shlex.split(os.environ.get("CXX", "")) or [
        c for c in (shutil.which("g++") or shutil.which("c++"),) if c
    ]


def error_line(stderr):
    """The line of compiler output `stderr` that says what went wrong: the
    first one with "error" in it, else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower():
            return line
    return lines[-1] if lines else "the compiler exited with an error and printed nothing"


def _target():
    """`(compiler, tf_flags, path)`: the library's cached path for this
    source, TensorFlow, compiler, flags and CPU."""
    return _target_for(os.environ.get("CXX", ""), _cache_dir())


@functools.lru_cache(maxsize=None)
def _target_for(cxx, cache_dir):
    import tensorflow as tf

    compiler = _compiler()
    flags = tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    arch = [flag for option in ARCH_FLAGS for flag in option]
    for part in (tf.__version__, *compiler, *CXX_FLAGS, *arch, *flags, _cpu_signature()):
        digest.update(part.encode() + b"\0")
    name = f"fused_ops-{digest.hexdigest()[:16]}.so"
    return compiler, flags, os.path.join(cache_dir, name)


def _compile(compiler, flags, target):
    """Compiles `SOURCE` to `target` with the first of `ARCH_FLAGS` that
    builds, atomically (a temporary file, then a rename, so that concurrent
    builds cannot load a half-written file). Raises RuntimeError with the
    first attempt's compiler output when none builds."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    errors = []
    try:
        for arch in ARCH_FLAGS:
            done = subprocess.run(
                [*compiler, *CXX_FLAGS, *arch, SOURCE, "-o", temporary, *flags],
                capture_output=True,
                text=True,
            )
            if done.returncode == 0:
                os.replace(temporary, target)
                return
            errors.append(done.stderr or done.stdout)
        raise RuntimeError(errors[0])
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


class Status:
    """Where the fused kernels stand in this process.

    Attributes:
        available: bool, whether training can use them.
        path: str or None, the built library.
        reason: str, one line: why they are off, or where they came from.
    """

    def __init__(self, available, reason, path=None):
        self.available, self.reason, self.path = available, reason, path

    def __repr__(self):
        return f"Status(available={self.available}, reason={self.reason!r})"


_LOCK = threading.Lock()
_LOADED = {}


def _unavailable_reason():
    if _disabled():
        return f"turned off by {ENV_SWITCH}=0"
    if not sys.platform.startswith("linux"):
        return f"built on Linux only (this is {sys.platform})"
    if not _compiler():
        return "no C++ compiler (install g++ or set $CXX)"
    return None


def build(force=False):
    """Builds the fused kernels' library once for this machine, or finds it
    built, and loads it.

    The result is cached (see the module docstring): a built library is
    reused by every later process, and so is a failed build, whose error is
    kept beside it and reported again without compiling.

    Args:
        force: bool, compile again even when a build, or a failed one, is
            cached.

    Returns:
        `Status`: `available` True with the library's `path`, or False with
        the `reason` in one line (for a failed build, the compiler's first
        error line).
    """
    reason = _unavailable_reason()
    if reason:
        return Status(False, reason)
    compiler, flags, target = _target()
    failed = target + ".failed"
    with _LOCK:
        if force:
            _LOADED.pop(target, None)
            for path in (target, failed):
                if os.path.exists(path):
                    os.remove(path)
        if not os.path.exists(target) and not os.path.exists(failed):
            try:
                _compile(compiler, flags, target)
            except (RuntimeError, OSError) as error:
                with open(failed, "w") as f:
                    f.write(str(error))
        if os.path.exists(failed):
            with open(failed) as f:
                line = error_line(f.read())
            return Status(False, f"the build failed ({line}); full log: {failed}")
    if load() is None:
        return Status(False, f"{target} could not be loaded: {_LOADED.get(target)}")
    return Status(True, f"built in {target}", target)


def status():
    """`Status` of the fused kernels without building anything: available
    only when `build()` has built the library for this machine."""
    reason = _unavailable_reason()
    if reason:
        return Status(False, reason)
    _, _, target = _target()
    if os.path.exists(target + ".failed"):
        return build()  # reads the remembered failure, compiles nothing
    if not os.path.exists(target):
        return Status(False, "not built (run `keras-transformer build-kernels`)")
    if load() is None:
        return Status(False, f"{target} could not be loaded: {_LOADED.get(target)}")
    return Status(True, f"built in {target}", target)


def load():
    """The loaded op module, or None where the fused kernels are turned
    off or have not been built by `build()`. Never compiles."""
    if _unavailable_reason():
        return None
    _, _, target = _target()
    with _LOCK:
        if target not in _LOADED:
            if not os.path.exists(target):
                return None
            import tensorflow as tf

            try:
                _LOADED[target] = tf.load_op_library(target)
            except Exception as error:  # a library that cannot load: fall back, once
                _LOADED[target] = f"{type(error).__name__}: {error}"
                warnings.warn(
                    f"keras_transformer: the fused training kernels in {target} could "
                    f"not be loaded ({type(error).__name__}: {error}); training uses "
                    f"TensorFlow ops. `keras-transformer build-kernels --force` rebuilds.",
                    stacklevel=2,
                )
        module = _LOADED[target]
    return None if isinstance(module, str) else module


# The row gathers only move rows; they also take bfloat16 (mixed_bfloat16).
GATHER_DTYPES = ("float32", "bfloat16")


def usable(*tensors, dtypes=("float32",)):
    """Whether the fused kernels can run on these tensors here: TensorFlow
    backend on a machine with no GPU (the kernels are CPU ones), tensors of
    `dtypes` (float32; `GATHER_DTYPES` for the gathers), not inside an XLA
    compilation, library loaded."""
    import keras

    if keras.backend.backend() != "tensorflow" or has_accelerator():
        return False
    if any(keras.backend.standardize_dtype(t.dtype) not in dtypes for t in tensors):
        return False
    return not in_xla_context() and load() is not None


def dropout_constants(rate):
    """`(threshold, scale)` of dropout at `rate`: an element is dropped when
    its 16-bit random number is below `threshold = round(rate * 2^16)`, and
    kept ones are multiplied by `scale = 2^16 / (2^16 - threshold)`."""
    threshold = int(round(float(rate) * LEVELS))
    if not 0 <= threshold < LEVELS:
        raise ValueError(f"dropout rate must be in [0, 1); got {rate!r}.")
    return threshold, LEVELS / (LEVELS - threshold)


def _seed64(seed):
    import tensorflow as tf

    return tf.cast(tf.reshape(seed, [2]), tf.int64)


def fused_dropout(x, rate, seed):
    """Dropout of `x` at `rate` with the `(2,)` integer `seed`.

    Args:
        x: float32 tensor, any shape.
        rate: python float in [0, 1), rounded to a multiple of 2^-16.
        seed: int tensor `(2,)`; the same seed gives the same mask.

    Returns:
        float32 tensor of the shape of `x`: `x * keep`, keep = 0 or
        `2^16 / (2^16 - round(rate * 2^16))`.
    """
    import tensorflow as tf

    module = load()
    threshold, scale = dropout_constants(rate)
    seed = _seed64(seed)

    @tf.custom_gradient
    def dropout(x):
        def grad(upstream):
            return module.kt_dropout(upstream, seed, threshold=threshold, scale=scale)

        return module.kt_dropout(x, seed, threshold=threshold, scale=scale), grad

    return dropout(x)


def fused_residual_layer_norm(x, y, gamma, beta, rate, seed, epsilon):
    """`LayerNorm(x + Dropout(y))` over the last axis (post-LN, section 3.1).

    The dropout mask is `fused_dropout`'s for the same seed and shape.

    Args:
        x: float32 `(..., d)`, the residual input.
        y: float32 `(..., d)`, the sub-layer output.
        gamma, beta: float32 `(d,)`.
        rate: python float in [0, 1).
        seed: int tensor `(2,)`.
        epsilon: python float.

    Returns:
        float32 `(..., d)`.
    """
    import tensorflow as tf

    module = load()
    threshold, scale = dropout_constants(rate)
    seed = _seed64(seed)
    constants = dict(threshold=threshold, scale=scale)
    # Read variables here, outside the custom-gradient function (in eager
    # mode it must not see a variable read).
    gamma, beta = (tf.identity(tf.convert_to_tensor(v)) for v in (gamma, beta))

    @tf.custom_gradient
    def residual_layer_norm(x, y, gamma, beta):
        out, x_hat, inv_std = module.kt_residual_layer_norm(
            x, y, seed, gamma, beta, epsilon=float(epsilon), **constants
        )

        def grad(upstream):
            return module.kt_residual_layer_norm_grad(
                upstream, x_hat, inv_std, gamma, seed, **constants
            )

        return out, grad

    return residual_layer_norm(x, y, gamma, beta)


def fused_masked_softmax_dropout(scores, mask, rate, seed):
    """Attention weights and their dropout in one pass (equation (1),
    section 5.4 on the weights).

    The weights are `layers.multi_head_attention.masked_softmax(scores, mask)`: a softmax over
    the allowed keys, exactly 0 at blocked ones and in a row with none
    allowed. The dropout mask is `fused_dropout`'s for the same seed.

    Args:
        scores: float32 `(..., query_length, key_length)`.
        mask: bool tensor broadcastable to `scores`, True where allowed.
        rate: python float in [0, 1).
        seed: int tensor `(2,)`.

    Returns:
        `(weights, dropped)`, both float32 of the shape of `scores`.
    """
    import tensorflow as tf

    module = load()
    threshold, scale = dropout_constants(rate)
    seed = _seed64(seed)
    constants = dict(threshold=threshold, scale=scale)
    mask = tf.broadcast_to(tf.cast(mask, tf.bool), tf.shape(scores))

    @tf.custom_gradient
    def softmax_dropout(scores):
        weights, dropped = module.kt_masked_softmax_dropout(scores, mask, seed, **constants)

        def grad(d_weights, d_dropped):
            return module.kt_masked_softmax_dropout_grad(
                weights, d_weights, d_dropped, seed, **constants
            )

        return (weights, dropped), grad

    return softmax_dropout(scores)


def fused_softmax_cross_entropy(labels, logits, label_smoothing):
    """Per-row softmax cross-entropy with label smoothing (section 5.4).

    The loss against the target `(1 - eps) * onehot(label) + eps / V`,
    `logsumexp(x) - (1 - eps) * x[label] - eps * mean(x)`, and its gradient
    `softmax(x) - target`, each in one pass over the logits, which also
    finds the first index of each row's largest logit (for the accuracy).

    Args:
        labels: int32 `(N,)`, in `[0, V)`.
        logits: float32 `(N, V)`.
        label_smoothing: python float, epsilon_ls in [0, 1).

    Returns:
        `(loss float32 (N,), argmax int32 (N,))`.
    """
    import tensorflow as tf

    module = load()
    eps = float(label_smoothing)
    labels = tf.cast(labels, tf.int32)

    argmax = []

    @tf.custom_gradient
    def cross_entropy(x):
        loss, log_sum_exp, index = module.kt_softmax_cross_entropy(x, labels, label_smoothing=eps)
        argmax.append(index)

        def grad(upstream):
            return module.kt_softmax_cross_entropy_grad(
                x, labels, log_sum_exp, upstream, label_smoothing=eps
            )

        return loss, grad

    loss = cross_entropy(logits)
    return loss, tf.stop_gradient(argmax[0])
