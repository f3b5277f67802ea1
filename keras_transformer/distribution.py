"""Data-parallel training on the engines Keras already has.

`data_parallel_scope(strategy)` wraps model building, `compile` and `fit`:

- tensorflow: `tf.distribute.MirroredStrategy` over the local devices;
  across hosts it raises (Keras's `fit` cannot build a model with dict
  inputs under `tf.distribute.MultiWorkerMirroredStrategy`);
- jax: `keras.distribution.DataParallel` over every device the jax runtime
  sees; across hosts (`"multi_worker"`), `initialize` calls
  `keras.distribution.initialize()` unless the caller did (it reads the
  coordinator address, process count and process id from the
  `KERAS_DISTRIBUTION_*` environment variables or its arguments);
- torch: not supported here; it raises.

The global batch is split along its first axis. On jax the loss is the mean
over every real target token of the global batch, exactly as on one device.
On tensorflow, Keras averages the replicas' losses, each the mean over its
own shard's real tokens; that equals the single-device loss when the shards
hold equal numbers of real tokens, and is a token-count-weighted variant of
it otherwise (the usual behaviour of `MirroredStrategy` with a masked mean).
"""

import contextlib

import keras

STRATEGIES = ("data_parallel", "multi_worker")


def num_replicas(strategy):
    """How many devices share each global batch under `strategy`.

    Args:
        strategy: None, `"data_parallel"` or `"multi_worker"`.

    Returns:
        int, 1 for None.
    """
    if strategy is None:
        return 1
    initialize(strategy)
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.device_count()
    if backend == "tensorflow":
        return _tf_strategy(strategy).num_replicas_in_sync
    raise ValueError(_TORCH_MESSAGE)


_TORCH_MESSAGE = (
    "Data-parallel training runs on the tensorflow backend (MirroredStrategy) or "
    "the jax backend (keras.distribution.DataParallel); set KERAS_BACKEND to one of "
    "them, or train without a distribution strategy."
)
_TF_MULTI_WORKER_MESSAGE = (
    "distribution='multi_worker' does not train on the tensorflow backend: Keras "
    "builds the model from the first batch reduced with "
    "MultiWorkerMirroredStrategy.reduce, which does not take the dict of model "
    "inputs (it fails with 'Attempt to convert a value ({...}) with an unsupported "
    "type (<class 'dict'>) to a Tensor'). Train across hosts on jax "
    "(KERAS_BACKEND=jax, docs/training.md), or on one host with "
    "distribution='data_parallel'."
)
_TF_STRATEGIES = {}


def _check(strategy):
    if strategy not in STRATEGIES:
        raise ValueError(
            f"Unknown distribution strategy {strategy!r}; use one of {STRATEGIES} or None."
        )


def _tf_strategy(strategy):
    # One strategy object per process ("data_parallel": `initialize` refuses
    # "multi_worker" on tensorflow).
    if strategy not in _TF_STRATEGIES:
        import tensorflow as tf

        _TF_STRATEGIES[strategy] = tf.distribute.MirroredStrategy()
    return _TF_STRATEGIES[strategy]


def initialize(strategy):
    """Set up `strategy` before anything else runs on the backend.

    `train` calls this first: on jax, `keras.distribution.initialize()`
    (for `"multi_worker"`) must run before anything queries the devices
    (`jax.distributed.initialize() must be called before any JAX calls`).
    On tensorflow it creates the `MirroredStrategy`. Calling it again is a
    no-op.

    Args:
        strategy: None (nothing to do), `"data_parallel"` or
            `"multi_worker"`.

    Raises:
        ValueError: for an unknown strategy, the torch backend, or
            `"multi_worker"` on tensorflow (the message says why, and
            what to use instead).
    """
    if strategy is None:
        return
    _check(strategy)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        if strategy == "multi_worker":
            raise ValueError(_TF_MULTI_WORKER_MESSAGE)
        _tf_strategy(strategy)
    elif backend == "jax":
        import jax

        if strategy == "multi_worker" and not jax.distributed.is_initialized():
            # Reads KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES and
            # _PROCESS_ID; afterwards jax sees the devices of every host.
            # (Skipped when the caller initialized jax's processes already.)
            keras.distribution.initialize()
    else:
        raise ValueError(_TORCH_MESSAGE)


def data_parallel_scope(strategy):
    """A context in which to build, compile and fit a data-parallel model.

    Args:
        strategy: None (a no-op context), `"data_parallel"` (all local
            devices) or `"multi_worker"` (all devices of all hosts; see the
            module docstring for how the hosts find each other).

    Returns:
        A context manager.

    Raises:
        ValueError: for an unknown strategy or the torch backend.

    Example:
    >>> from keras_transformer import build_from_preset
    >>> with data_parallel_scope(None):  # "data_parallel" on a machine with devices
    ...     model = build_from_preset("tiny", 50, 50, sequence_length=8)
    >>> model.name
    'transformer'
    """
    if strategy is None:
        return contextlib.nullcontext()
    initialize(strategy)
    if keras.backend.backend() == "tensorflow":
        return _tf_strategy(strategy).scope()
    return _jax_scope()


@contextlib.contextmanager
def _jax_scope():
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)
