"""Run the backend-neutral test files on jax and torch as well.

Keras fixes its backend at import, so each backend runs in its own pytest
process. Layers, model, decoding, losses, metrics and the schedule must
pass on all three backends. The processes start right after collection
(`conftest.py`) and run beside the tensorflow tests at a lower priority;
these tests run last and wait for them.
"""

import os
import subprocess
import sys

import pytest

from conftest import REPO

NEUTRAL_FILES = [
    "tests/test_layers.py",
    "tests/test_layer_battery.py",
    "tests/test_model.py",
    "tests/test_decoding.py",
    "tests/test_losses.py",
    "tests/test_metrics.py",
    "tests/test_schedules.py",
    "tests/test_tying_and_averaging.py",
]


BACKENDS = ["jax", "torch"]


def start_backend_runs(folder):
    """Start one pytest process per backend over `NEUTRAL_FILES`, at a lower
    CPU priority, writing to files in `folder` (so that neither blocks on a
    full pipe). `conftest.py` calls this as soon as collection ends, so the
    runs use the cores the tensorflow tests leave idle; the tests below,
    which pytest runs last, wait for them.

    Returns:
        dict backend -> (process, stdout file, stderr file).
    """
    runs = {}
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend)
        out = open(os.path.join(folder, f"{backend}.out"), "w+")
        err = open(os.path.join(folder, f"{backend}.err"), "w+")
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--durations=15", *NEUTRAL_FILES],
            cwd=REPO, env=env, stdout=out, stderr=err, text=True, preexec_fn=lambda: os.nice(10),
        )
        runs[backend] = (process, out, err)
    return runs


def stop_backend_runs(runs):
    for process, out, err in runs.values():
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
        err.close()


@pytest.fixture(scope="module")
def backend_runs(request, tmp_path_factory):
    """The runs `conftest.py` started after collection, or (when this
    module's tests were selected some other way) new ones."""
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        pytest.skip("already running on another backend")
    runs = getattr(request.config, "backend_runs", None)
    if runs is not None:
        yield runs
        return
    runs = start_backend_runs(tmp_path_factory.mktemp("backends"))
    yield runs
    stop_backend_runs(runs)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_neutral_files_pass_on_backend(backend, backend_runs):
    process, out, err = backend_runs[backend]
    returncode = process.wait(timeout=1500)
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read(), err.read()
    tail = stdout[-3000:] + stderr[-2000:]
    assert returncode == 0, tail
    assert " passed" in stdout and " failed" not in stdout, tail
    assert f"keras backend={backend}" in stdout, tail
