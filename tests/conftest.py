"""Shared fixtures and helpers for the test suite."""

import gc
import os
import pathlib

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = pathlib.Path(__file__).resolve().parents[1]


def jax_compiling_fast(env):
    """`env`, a jax subprocess's environment, with XLA compiling without
    LLVM's optimizations (unless its `XLA_FLAGS` sets the level): jax runs
    each operation of an eager call as a program of its own, compiled for
    each new shape, and the tests' small models run each program a few
    times, so compiling was most of their time (the backend-neutral files
    took 365 s of CPU on jax with it and 644 s without; the jax training
    subprocesses of test_distribution 105 s against 161 s). Returns `env`."""
    flags = env.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in flags:
        env["XLA_FLAGS"] = (flags + " --xla_backend_optimization_level=0").strip()
    return env


def multi30k_dir():
    """The Multi30k folder: $MULTI30K_DIR, else ../shared/data/multi30k.

    A test that needs the corpus fails (not skips) when CI is set and the
    corpus is missing; elsewhere it is skipped.
    """
    path = pathlib.Path(
        os.environ.get("MULTI30K_DIR", REPO.parent / "shared" / "data" / "multi30k")
    )
    if not (path / "train.en.gz").exists():
        message = f"Multi30k corpus not found at {path} (set MULTI30K_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _runs_backends(item):
    return item.path.name == "test_backends.py"


def pytest_collection_modifyitems(session, config, items):
    """The jax and torch runs of `test_backends.py` wait at the end, so that
    their processes (started in `pytest_collection_finish`) run beside the
    tensorflow tests rather than after them."""
    items[:] = [item for item in items if not _runs_backends(item)] + [
        item for item in items if _runs_backends(item)
    ]


def _on_tensorflow():
    return os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow"


def _is_xdist_worker(config):
    return hasattr(config, "workerinput")


def pytest_configure(config):
    """The process that runs the session (pytest-xdist's controller, or the
    only process) names a folder for the jax and torch runs, made when they
    start, in the environment that xdist workers inherit."""
    if _on_tensorflow() and _is_xdist_worker(config):
        # One intra-op thread a worker: two workers (and the jax and torch
        # runs) share the cores already, and TensorFlow's own pools fought
        # over them (the suite alone: 1,413 s against 1,600 s, CPU time
        # 2,424 s against 2,693 s, one run each).
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
    if _on_tensorflow() and not _is_xdist_worker(config):
        import tempfile
        import uuid

        from test_backends import RUNS_FOLDER_VARIABLE

        os.environ[RUNS_FOLDER_VARIABLE] = os.path.join(
            tempfile.gettempdir(), f"keras-transformer-backends-{uuid.uuid4().hex}"
        )
        config.backend_runs = None


def _start_backend_runs(config, nodeids):
    if config.backend_runs is not None or config.option.collectonly:
        return
    if not any(nodeid.split("::")[0].endswith("test_backends.py") for nodeid in nodeids):
        return
    from test_backends import RUNS_FOLDER_VARIABLE, start_backend_runs

    folder = os.environ[RUNS_FOLDER_VARIABLE]
    os.makedirs(folder, exist_ok=True)
    config.backend_runs = start_backend_runs(folder)


def pytest_collection_finish(session):
    """Without xdist: start the jax and torch runs once collection holds
    `test_backends.py`."""
    if _on_tensorflow() and not _is_xdist_worker(session.config):
        _start_backend_runs(session.config, [item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """With pytest-xdist: the controller starts the jax and torch runs once,
    when the first worker's collection holds `test_backends.py`."""
    if _on_tensorflow():
        _start_backend_runs(node.config, ids)


def pytest_sessionfinish(session):
    runs = getattr(session.config, "backend_runs", None)
    if runs is not None:
        from test_backends import stop_backend_runs

        stop_backend_runs(runs)


@pytest.fixture(scope="session", autouse=True)
def fused_kernels():
    """Builds the fused CPU training kernels once, as `train` does, so that
    training steps in the tests take the same path as `train`'s."""
    import keras

    if keras.backend.backend() == "tensorflow":
        from keras_transformer.fast_path import kernels

        return kernels.build()
    return None


@pytest.fixture(scope="module", autouse=True)
def heap_frozen_after_each_module():
    """After each test module, its garbage is collected once and what
    survives is frozen out of later collections (`gc.freeze`).

    Without this, the objects that earlier modules leave alive (traced
    TensorFlow functions and graphs in caches, about two million after
    `test_export.py`) are scanned by every full collection, and Keras runs
    one for each variable it deletes: `model.quantize("int8")` of a
    one-layer model took 55 s late in the suite against 3.5 s alone.
    Objects made in a module stay collectable within it."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture
def multi30k():
    return multi30k_dir()


def to_numpy(x):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(x))


def pytest_report_header(config):
    import keras

    return f"keras backend={keras.backend.backend()}"


def gradient_of(fn, x):
    """d fn(x) / dx on the current backend, as NumPy."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x).numpy()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(fn)(x))
    import torch

    x = torch.tensor(x, requires_grad=True)
    fn(x).backward()
    return x.grad.numpy()
