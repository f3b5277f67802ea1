"""Data-parallel training: one step on two devices equals one step on one.

Each backend runs in a subprocess, because the device count is fixed when
the backend starts: tensorflow gets two logical CPU devices, jax two host
devices (`--xla_force_host_platform_device_count=2`).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import jax_compiling_fast
from keras_transformer.distribution import data_parallel_scope


def backend_env(backend):
    """The subprocess environment: on jax, two host devices, and collectives
    that wait rather than abort (on 2 cores with other work beside it, one
    device's thread can reach an all-reduce long after the other, and XLA's
    CPU rendezvous gives up after tens of seconds by default). tensorflow
    splits its CPU in the script itself."""
    env = dict(os.environ, KERAS_BACKEND=backend)
    if backend == "jax":
        env["XLA_FLAGS"] = " ".join([
            "--xla_force_host_platform_device_count=2",
            "--xla_cpu_collective_timeout_seconds=900",
            "--xla_cpu_collective_call_terminate_timeout_seconds=900",
        ])
        jax_compiling_fast(env)
    return env


SCRIPT = r"""
import json, os
backend = os.environ["KERAS_BACKEND"]
if backend == "tensorflow":
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import numpy as np
from keras_transformer import MaskedSparseCategoricalCrossentropy, build_transformer
from keras_transformer.distribution import data_parallel_scope, num_replicas
from keras_transformer.optimizers import Adam

def make(optimizer=None):
    keras.utils.set_random_seed(0)
    model = build_transformer(30, 30, num_layers=1, d_model=16, num_heads=2, dff=32,
                              dropout_rate=0.0, sequence_length=8)
    model.compile(optimizer or keras.optimizers.SGD(0.5),
                  MaskedSparseCategoricalCrossentropy(label_smoothing=0.1))
    return model

# Global batch of 4: rows 0-1 go to device 0, rows 2-3 to device 1; each
# half holds 8 real target tokens.
src = np.array([[5, 6, 7, 3, 0, 0], [8, 9, 3, 0, 0, 0], [4, 5, 6, 7, 8, 3], [9, 3, 0, 0, 0, 0]], "int32")
lab = np.array([[11, 12, 13, 14, 3, 0], [15, 16, 3, 0, 0, 0], [17, 18, 19, 3, 0, 0], [20, 21, 22, 3, 0, 0]], "int32")
dec = np.concatenate([np.full((4, 1), 2, "int32"), lab[:, :-1]], axis=1) * (lab > 0)
dec[:, 0] = 2
x = {"encoder_inputs": src, "decoder_inputs": dec}

single = make()
w0 = single.get_weights()
single.fit(x, lab, batch_size=4, epochs=1, shuffle=False, verbose=0)
w1 = single.get_weights()
with data_parallel_scope("data_parallel"):
    replicas = num_replicas("data_parallel")
    parallel = make()
    parallel.set_weights(w0)
    parallel.fit(x, lab, batch_size=4, epochs=1, shuffle=False, verbose=0)
w2 = parallel.get_weights()
kernel = parallel.get_layer("logits").kernel.value
if backend == "tensorflow":
    placed = len(getattr(kernel, "values", ()))  # a MirroredVariable holds one copy per device
else:
    placed = len(kernel.sharding.device_set)  # replicated over the mesh
# Our Adam (a fused kernel per variable on tensorflow) updates each replica's
# copy as Keras's Adam does.
adam = []
for optimizer in (Adam, keras.optimizers.Adam):
    with data_parallel_scope("data_parallel"):
        model = make(optimizer(0.01))
        model.set_weights(w0)
        model.fit(x, lab, batch_size=4, epochs=1, shuffle=False, verbose=0)
    adam.append(model.get_weights())
# Float ids and labels are refused in each replica's step (Keras traces the
# model on the replicas' float64 mean first, for shapes, unchecked).
refused = []
for data, labels in (({**x, "decoder_inputs": dec + 0.5}, lab), (x, lab + 0.5)):
    with data_parallel_scope("data_parallel"):
        model = make()
        try:
            model.fit(data, labels, batch_size=4, epochs=1, shuffle=False, verbose=0)
        except TypeError as error:
            refused.append("must be integer token ids" in str(error))
print("RESULT " + json.dumps({
    "refused": refused,
    "replicas": replicas,
    "placed": placed,
    "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(w1, w2)),
    "moved": max(float(np.abs(a - b).max()) for a, b in zip(w0, w1)),
    "adam_diff": max(float(np.abs(a - b).max()) for a, b in zip(*adam)),
    "adam_moved": max(float(np.abs(a - b).max()) for a, b in zip(w0, adam[0])),
}))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_one_data_parallel_step_on_two_devices_equals_one_device(backend):
    pytest.importorskip(backend)
    env = backend_env(backend)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["replicas"] == 2 and result["placed"] == 2  # really on two devices
    assert result["moved"] > 1e-3  # the step did change the weights
    assert result["max_diff"] < 1e-5, result
    assert result["adam_moved"] > 1e-3 and result["adam_diff"] < 1e-5, result
    assert result["refused"] == [True, True], result


TRAIN_SCRIPT = r"""
import json, os, sys
if os.environ["KERAS_BACKEND"] == "tensorflow":
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from keras_transformer.data.synthetic import make_synthetic_corpus
from keras_transformer.training import TrainingConfig, train
# 21 pairs in one bucket of length 8: one batch of 21 rows, padded to 22 for
# the two replicas, and one batch shape (each shape compiles anew on jax,
# about 20 s with two devices on 2 cores).
en, de = make_synthetic_corpus(21, seed=0)
out = sys.argv[1]
for name, lines in (("src.txt", en), ("tgt.txt", de)):
    with open(os.path.join(out, name), "w") as f:
        f.write("\n".join(lines) + "\n")
config = TrainingConfig(
    os.path.join(out, "src.txt"), os.path.join(out, "tgt.txt"), output_dir=os.path.join(out, "run"),
    preset="tiny", num_layers=1, sequence_length=8, src_vocab_size=100, tgt_vocab_size=100,
    tokens_per_batch=2000, epochs=1, distribution="data_parallel",
)
if sys.argv[2] == "odd":
    # 400 pairs in buckets of 4,096 tokens: the first training batch has 37
    # rows and a validation batch 1 (odd sizes, which Keras's first-batch
    # build under a tf.distribute strategy cannot split in two).
    from keras_transformer.data.synthetic import write_synthetic_corpus
    write_synthetic_corpus(out, n_train=400, n_val=40, seed=1)
    config = TrainingConfig(
        os.path.join(out, "train.en"), os.path.join(out, "train.de"),
        val_src=os.path.join(out, "val.en"), val_tgt=os.path.join(out, "val.de"),
        output_dir=os.path.join(out, "run"), preset="tiny", num_layers=1, sequence_length=24,
        src_vocab_size=150, tgt_vocab_size=180, epochs=1, distribution="data_parallel",
    )
model, _, _ = train(config, verbose=0)
logs = open(os.path.join(out, "run", "log.csv")).read().splitlines()
row = dict(zip(logs[0].split(","), logs[-1].split(",")))
print("RESULT " + json.dumps({"epochs_logged": len(logs) - 1, "loss": float(row["loss"]),
                              "jit_compile": model.jit_compile}))
"""


@pytest.mark.parametrize("backend, data", [
    ("tensorflow", "small"), ("jax", "small"), ("tensorflow", "odd"), ("jax", "odd"),
])
def test_train_with_data_parallel_on_two_devices_runs_an_epoch(backend, data, tmp_path):
    """`train(distribution="data_parallel")`: bucketed batches of any size,
    padded with all-padding rows to an even split, train for an epoch (with
    validation for "odd") and log a finite loss. On jax the step is compiled
    (an eager step, which `jit_compile=False` gave, ran each op's all-reduce
    on its own, and the "odd" run stalled in XLA's CPU rendezvous)."""
    pytest.importorskip(backend)
    env = backend_env(backend)
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_SCRIPT, str(tmp_path), data], env=env, capture_output=True,
        text=True, timeout=600,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["epochs_logged"] == 1
    assert 0 < result["loss"] < 20, result  # finite, and a cross-entropy
    if backend == "jax":
        assert result["jit_compile"] is True, result


def test_unknown_strategy_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown distribution strategy 'mirrored'"):
        data_parallel_scope("mirrored")


MULTI_WORKER_SCRIPT = r"""
import json, os, sys
from keras_transformer.data.synthetic import write_synthetic_corpus
from keras_transformer.training import TrainingConfig, train
out = sys.argv[1]
write_synthetic_corpus(out, n_train=200, n_val=20, seed=1)
config = TrainingConfig(
    os.path.join(out, "train.en"), os.path.join(out, "train.de"), output_dir=os.path.join(out, "run"),
    preset="tiny", num_layers=1, sequence_length=16, src_vocab_size=100, tgt_vocab_size=100,
    epochs=1, distribution="multi_worker",
)
train(config, verbose=0)
import jax
logs = open(os.path.join(out, "run", "log.csv")).read().splitlines()
row = dict(zip(logs[0].split(","), logs[-1].split(",")))
print("RESULT " + json.dumps({"loss": float(row["loss"]), "processes": jax.process_count(),
                              "initialized": jax.distributed.is_initialized()}))
"""


def test_multi_worker_on_jax_initializes_the_processes_before_counting_devices(tmp_path):
    """`train(distribution="multi_worker")` on jax, as one process of a
    one-process job on localhost: `keras.distribution.initialize()` runs
    before anything queries the devices. Before, `train` counted the
    devices first, and the initialization failed with
    "jax.distributed.initialize() must be called before any JAX calls"."""
    pytest.importorskip("jax")
    import socket

    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, KERAS_BACKEND="jax", KERAS_DISTRIBUTION_JOB_ADDRESSES=f"localhost:{port}",
               KERAS_DISTRIBUTION_NUM_PROCESSES="1", KERAS_DISTRIBUTION_PROCESS_ID="0")
    done = subprocess.run([sys.executable, "-c", MULTI_WORKER_SCRIPT, str(tmp_path)], env=jax_compiling_fast(env),
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["initialized"] is True and result["processes"] == 1, result
    assert 0 < result["loss"] < 20, result


def test_multi_worker_on_tensorflow_is_refused_with_the_reason():
    """Two tensorflow workers on localhost failed inside Keras's `fit`
    (MultiWorkerMirroredStrategy.reduce of the dict of inputs), after
    creating the strategy too late ("Collective ops must be configured at
    program startup"): `train` now refuses it first, and says what to use."""
    import keras

    from keras_transformer.distribution import initialize

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the tensorflow strategy")
    with pytest.raises(ValueError, match=r"multi_worker.*tensorflow.*KERAS_BACKEND=jax.*data_parallel"):
        initialize("multi_worker")
