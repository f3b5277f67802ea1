"""Where the code runs: accelerators and XLA compilation.

The one place that asks TensorFlow about devices and compilation contexts;
the training fast path, `precision` and `train` call these.

Neither Keras nor TensorFlow is imported until a function runs.
"""


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
