"""Where the code runs: accelerators, XLA compilation, decoding's environment.

The one place that asks TensorFlow about devices and compilation contexts;
the training fast path, `precision` and `train` call these.

Neither Keras nor TensorFlow is imported until a function runs.
"""


# TensorFlow's own CPU kernels for decoding, not oneDNN's, which TensorFlow
# turns on by default on CPUs with AVX-512: a search's small matrix products
# ran 8-23% faster without it, with the same translations
# (docs/benchmarks.md).
DECODING_ENVIRONMENT = {"TF_ENABLE_ONEDNN_OPTS": "0"}


def decoding_environment():
    """The environment variables a TensorFlow process that decodes (a
    `Translator`, an exported SavedModel, TF Serving) runs fastest with on
    a CPU. Exports write them into their `keras_transformer.json`
    (`tf_serving_env`); `keras-transformer translate` and `evaluate` set
    them for themselves unless already set.

    TensorFlow reads them when it is imported: set them in the server's or
    the process's environment (`docker run -e TF_ENABLE_ONEDNN_OPTS=0 ...`).

    Returns:
        dict of `str` to `str`.

    >>> decoding_environment()
    {'TF_ENABLE_ONEDNN_OPTS': '0'}
    """
    return dict(DECODING_ENVIRONMENT)


def has_accelerator():
    """Whether TensorFlow sees a device other than the CPU (GPU, TPU); False
    on the other backends."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return any(d.device_type != "CPU" for d in tf.config.list_logical_devices())


def in_xla_context():
    """Whether the code being traced runs under XLA compilation: a
    TensorFlow function with `jit_compile=True` (False when executing
    eagerly), or always on JAX (every `jax.jit` is compiled by XLA); False
    on PyTorch."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        return True
    if backend != "tensorflow":
        return False
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def host_description(cpuinfo="/proc/cpuinfo"):
    """The machine in words, as run logs and model cards record where a
    model trained: the CPU's model name (from `cpuinfo` on Linux, else
    `platform.processor()`), its logical cores, and whether TensorFlow sees
    an accelerator (only asked where TensorFlow is already imported, so
    that this never imports it).

    Args:
        cpuinfo: path of the Linux CPU description to read.

    Returns:
        str, such as `"AMD EPYC, 2 cores, no GPU"`.

    >>> host_description(cpuinfo="/no/such/file").count(" cores, ")
    1
    """
    import os
    import platform
    import sys

    name = ""
    try:
        with open(cpuinfo) as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    name = name or platform.processor() or "unknown CPU"
    accelerator = "tensorflow" in sys.modules and has_accelerator()
    return f"{name}, {os.cpu_count()} cores, {'an accelerator' if accelerator else 'no GPU'}"
