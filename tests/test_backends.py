"""Run the backend-neutral test files on jax and torch as well.

Keras fixes its backend at import, so each backend runs in its own pytest
process. Layers, model, decoding, losses, metrics and the schedule must
pass on all three backends.
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


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    """One pytest process per backend, all started at once: they run side
    by side on the machine's cores while this process waits (their output
    goes to files, so neither blocks on a full pipe)."""
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        pytest.skip("already running on another backend")
    folder = tmp_path_factory.mktemp("backends")
    runs = {}
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend)
        out = open(folder / f"{backend}.out", "w+")
        err = open(folder / f"{backend}.err", "w+")
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *NEUTRAL_FILES],
            cwd=REPO, env=env, stdout=out, stderr=err, text=True,
        )
        runs[backend] = (process, out, err)
    yield runs
    for process, out, err in runs.values():
        if process.poll() is None:
            process.kill()
            process.wait()
        out.close()
        err.close()


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
