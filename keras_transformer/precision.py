"""Training precision: float32 or a Keras mixed-precision policy.

`keras-transformer train --precision` (and `TrainingConfig.precision`) takes
one of `PRECISIONS`:

- `"float32"`: every layer computes and stores in float32.
- `"mixed_bfloat16"`: layers compute in bfloat16 and keep float32 variables
  (Keras's policy of that name); LayerNorm, the attention softmax, the loss
  and the optimizer stay float32. Faster on a CPU with bfloat16 dot-product
  instructions (`avx512_bf16` or `amx_bf16` in `/proc/cpuinfo`):
  bench-small trained at 8,162 against about 6,400 tokens/s in float32 on a
  2-core AMD EPYC with `avx512_bf16` (`python benchmarks/training.py`), and
  about 4x slower than float32 on a CPU without them, where bfloat16
  matmuls are emulated.
- `"mixed_float16"`: the GPU policy (float16 compute, with the loss scaling
  that `model.compile` adds for it). Not the default anywhere: on an H200
  the width-128 Multi30k model trained with float32's validation loss
  curve in it, but slower than in float32 on jax and torch (its matmuls
  are too small to pay for the casts; docs/benchmarks.md).
- `"auto"` (the default): `"mixed_bfloat16"` on the tensorflow backend when
  no GPU is visible, the CPU has bfloat16 instructions and `d_model` is at
  least `BFLOAT16_MIN_D_MODEL` (256); `"float32"` otherwise. That is the
  faster of the two on such a CPU: bfloat16 matmuls pay for their casts at
  d_model 256 and above, with the same validation loss curve, while the
  matmuls of smaller models are too small to gain what the casts cost
  (docs/benchmarks.md has the measurements).

Decoding always runs in float32 (`Translator` copies a mixed-precision model
to float32 compute; its variables are float32 already, so the weights are
unchanged): beam scores are sums of log-probabilities, and bfloat16 keeps 8
bits of mantissa.
"""

import os

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")

# When set, replaces every "auto" (the `train` default included).
ENVIRONMENT_VARIABLE = "KERAS_TRANSFORMER_PRECISION"

# /proc/cpuinfo flags of bfloat16 dot-product instructions (x86) that oneDNN,
# and so TensorFlow's CPU matmuls, use for bfloat16 inputs.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")

# The smallest model width that "auto" trains in mixed_bfloat16 (see above).
BFLOAT16_MIN_D_MODEL = 256


def cpu_has_bfloat16(cpuinfo="/proc/cpuinfo"):
    """Whether the CPU has bfloat16 dot-product instructions.

    Args:
        cpuinfo: path of the Linux CPU description to read.

    Returns:
        bool: True when a `flags` line names one of `BFLOAT16_CPU_FLAGS`;
        False when it does not, or the file cannot be read (not Linux).
    """
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[-1].split())
                    return any(flag in flags for flag in BFLOAT16_CPU_FLAGS)
    except OSError:
        pass
    return False


def _has_gpu():
    from keras_transformer.devices import has_accelerator

    return has_accelerator()


def resolve_precision(precision="auto", d_model=None):
    """The Keras dtype policy name that `precision` stands for.

    Args:
        precision: one of `PRECISIONS`. The environment variable
            `KERAS_TRANSFORMER_PRECISION` (`ENVIRONMENT_VARIABLE`), when
            set, replaces `"auto"`.
        d_model: the model width, for `"auto"`; None counts as wide enough.

    Returns:
        str: `"float32"`, `"mixed_bfloat16"` or `"mixed_float16"`.

    Raises:
        ValueError: for a name not in `PRECISIONS`, given or read from the
            environment variable (the message names which).
    """
    import keras

    if precision == "auto":
        chosen = os.environ.get(ENVIRONMENT_VARIABLE, "auto") or "auto"
        if chosen not in PRECISIONS:
            raise ValueError(
                f"The environment variable {ENVIRONMENT_VARIABLE} must be one of "
                f"{PRECISIONS}; got {chosen!r}. Correct or unset it."
            )
        precision = chosen
    if precision not in PRECISIONS:
        raise ValueError(
            f"`precision` must be one of {PRECISIONS}; got {precision!r}."
        )
    if precision != "auto":
        return precision
    if (
        keras.backend.backend() == "tensorflow"
        and (d_model is None or d_model >= BFLOAT16_MIN_D_MODEL)
        and not _has_gpu()
        and cpu_has_bfloat16()
    ):
        return "mixed_bfloat16"
    return "float32"


def precision_source(precision):
    """What decides `precision`: `"given"` (a name other than `"auto"`),
    `ENVIRONMENT_VARIABLE` (set, replacing `"auto"`) or `"auto"`."""
    if precision != "auto":
        return "given"
    if os.environ.get(ENVIRONMENT_VARIABLE, "auto") not in ("", "auto"):
        return ENVIRONMENT_VARIABLE
    return "auto"


def compute_dtype(model):
    """The compute dtype of `model`'s layers, or "mixed" when they differ."""
    import keras

    dtypes = {
        layer.dtype_policy.compute_dtype
        for layer in model.layers
        if not isinstance(layer, keras.layers.InputLayer)
    }
    return dtypes.pop() if len(dtypes) == 1 else "mixed"


def with_dtype_policy(model, policy, weights=None):
    """A copy of the functional `model` whose layers use `policy`.

    Args:
        model: a `Transformer` (as `build_transformer` returns) or another
            functional `keras.Model`.
        policy: a dtype policy name or `keras.DTypePolicy`.
        weights: the copy's weights (a list of arrays); `model`'s by default.

    Returns:
        A new model of `model`'s class, with its layer names and weights.
    """
    import keras

    from keras_transformer.models.transformer import Transformer

    if isinstance(model, Transformer):
        copy = Transformer(**{**model.get_config(), "dtype": policy})
        copy.set_weights(model.get_weights() if weights is None else weights)
        return copy

    def clone(layer):
        config = layer.get_config()
        if "dtype" in config and not isinstance(layer, keras.layers.InputLayer):
            config["dtype"] = policy
        return layer.__class__.from_config(config)

    copy = keras.models.clone_model(model, clone_function=clone)
    copy.set_weights(model.get_weights() if weights is None else weights)
    return copy
