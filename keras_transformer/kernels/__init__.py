"""Fused CPU kernels for training on TensorFlow, compiled on first use.

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
  the argmax that `MaskedAccuracy` reuses (`argmax_of`);
- the ops `KtGatherRows` and `KtGatherRowsFromParts`: the row gathers of
  `layers.unpadding`, where one index past the last row gives zeros (no
  copy of the input with a zero row appended), the second from Q/K/V parts
  without stacking them.

The kernels compute in float32. Under `mixed_bfloat16` the layers run them
on float32 casts of their bfloat16 tensors and cast the results back; the
gathers, which only move rows, also take bfloat16 directly.

On bench-small (`benchmarks/training.py`) they take a float32 training step
from about 288 to 253 ms on 2 cores (431 to 381 ms on an earlier CPU), and
a mixed_bfloat16 one from about 195 to 167 ms.

The library (`fused_ops.cc`) is built with the C++ compiler (`$CXX`, else
`g++` or `c++`) against the installed TensorFlow's headers the first time a
training step needs it (about 10 s), into `$KERAS_TRANSFORMER_CACHE`
(default `~/.cache/keras_transformer`), under a name that hashes the
source, the TensorFlow version, the flags and the CPU, and is loaded from
there afterwards. Where it cannot be had (not Linux, no compiler, a failed
build: a warning says which) or is turned off with
`KERAS_TRANSFORMER_FUSED_KERNELS=0`, the layers run their TensorFlow-op
versions, as they do on a machine with a GPU. They are used only in
training (`training=True`) and never under XLA, so SavedModels for serving
and inference graphs contain only TensorFlow's own ops. They have no
second-order gradients: set `KERAS_TRANSFORMER_FUSED_KERNELS=0` to
differentiate a training step twice.

Dropout masks come from a counter-based hash (SplitMix64's mixer) of the
element index and the layer's seed, in 16-bit steps: an element is dropped
with probability `round(rate * 2^16) / 2^16` and kept elements are scaled
by the inverse of the keep probability, as `layers.dropout` does with
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

ENV_SWITCH = "KERAS_TRANSFORMER_FUSED_KERNELS"
ENV_CACHE = "KERAS_TRANSFORMER_CACHE"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_ops.cc")
# -march=native: the cache name includes the CPU, so a library is only
# loaded on the kind of CPU it was built for. The math flags let sums
# vectorize (reassociation); they keep NaN and infinity semantics.
CXX_FLAGS = (
    "-shared", "-fPIC", "-O3", "-march=native", "-fno-math-errno",
    "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math",
    "-Wno-deprecated-declarations",
)
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


def _build(compiler, flags, target):
    """Compiles `SOURCE` with the `compiler` command (a list) to `target`,
    atomically: a temporary file, then a rename, so that concurrent builds
    cannot load a half-written file."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, temporary = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(target))
    os.close(fd)
    try:
        done = subprocess.run(
            [*compiler, *CXX_FLAGS, SOURCE, "-o", temporary, *flags],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(done.stderr.strip()[-2000:])
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


_LOCK = threading.Lock()


def load():
    """The compiled op module, or None where the fused kernels are off
    (see `_load`); one build even when threads ask at once."""
    with _LOCK:
        return _load()


@functools.lru_cache(maxsize=None)
def _load():
    """The compiled op module, or None where the fused kernels are off.

    Returns None when `KERAS_TRANSFORMER_FUSED_KERNELS=0`, off Linux, and
    (with a warning) when there is no C++ compiler or the build or the load
    fails. Builds the library on the first call (see the module docstring).
    """
    if _disabled() or not sys.platform.startswith("linux"):
        return None
    import tensorflow as tf

    compiler = shlex.split(os.environ.get("CXX", "")) or [
        c for c in (shutil.which("g++") or shutil.which("c++"),) if c
    ]
    if not compiler:
        warnings.warn(
            "keras_transformer: no C++ compiler (set $CXX or install g++), so "
            "training uses TensorFlow ops for dropout and LayerNorm (slower). "
            f"Set {ENV_SWITCH}=0 to silence this.",
            stacklevel=2,
        )
        return None
    flags = tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read())
    for part in (tf.__version__, *compiler, *CXX_FLAGS, *flags, _cpu_signature()):
        digest.update(part.encode() + b"\0")
    target = os.path.join(_cache_dir(), f"fused_ops-{digest.hexdigest()[:16]}.so")
    try:
        if not os.path.exists(target):
            _build(compiler, flags, target)
        return tf.load_op_library(target)
    except Exception as error:  # a failed build or load: fall back, loudly
        warnings.warn(
            f"keras_transformer: the fused training kernels could not be built "
            f"or loaded ({type(error).__name__}: {error}); training uses "
            f"TensorFlow ops instead (slower). Set {ENV_SWITCH}=0 to silence this.",
            stacklevel=2,
        )
        return None


def _in_xla():
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    graph = tf.compat.v1.get_default_graph()
    return control_flow_util.GraphOrParentsInXlaContext(graph)


@functools.lru_cache(maxsize=None)
def has_accelerator():
    """Whether TensorFlow sees a device other than the CPU (GPU, TPU)."""
    import tensorflow as tf

    return any(d.device_type != "CPU" for d in tf.config.list_logical_devices())


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
    return not _in_xla() and load() is not None


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

    The weights are `layers.masked_softmax(scores, mask)`: a softmax over
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


# The accuracy's argmax, computed by the loss kernel in the same pass over
# the logits, rides on the logits tensor (as `layers.unpadding` attaches the
# real-token logits), so that `MaskedAccuracy` need not read them again.
_ARGMAX = "_keras_transformer_argmax"


def argmax_of(logits):
    """int32 argmax over the last axis recorded by
    `fused_softmax_cross_entropy` on this very tensor, or None (also when
    it was recorded in another graph than the current one)."""
    import tensorflow as tf

    argmax = getattr(logits, _ARGMAX, None)
    if argmax is None:
        return None
    if tf.executing_eagerly():
        return None if tf.is_symbolic_tensor(argmax) else argmax
    if not tf.is_symbolic_tensor(argmax) or argmax.graph is not tf.compat.v1.get_default_graph():
        return None
    return argmax


def record_argmax(tensor, argmax):
    """Attach `argmax` (from `argmax_of` of a cast of `tensor`) to `tensor`,
    so that `argmax_of(tensor)` finds it; a cast to float32 does not move
    the largest logit. Does nothing for None or a tensor without attributes."""
    if argmax is None:
        return
    try:
        setattr(tensor, _ARGMAX, argmax)
    except AttributeError:
        pass


def fused_softmax_cross_entropy(labels, logits, label_smoothing):
    """Per-row softmax cross-entropy with label smoothing (section 5.4).

    The loss against the target `(1 - eps) * onehot(label) + eps / V`,
    `logsumexp(x) - (1 - eps) * x[label] - eps * mean(x)`, and its gradient
    `softmax(x) - target`, each in one pass over the logits. The first index
    of each row's largest logit is recorded on `logits` (`argmax_of`).

    Args:
        labels: int32 `(N,)`, in `[0, V)`.
        logits: float32 `(N, V)`.
        label_smoothing: python float, epsilon_ls in [0, 1).

    Returns:
        float32 `(N,)`.
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
    try:
        setattr(logits, _ARGMAX, argmax[0])
    except AttributeError:  # a tensor type without attributes: no shortcut
        pass
    return loss
