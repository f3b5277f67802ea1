"""Run the backend-neutral test files on jax and torch as well.

Keras fixes its backend at import, so each backend runs in its own pytest
process. Layers, model, decoding, losses, metrics and the schedule must
pass on all three backends. The processes start right after collection
(`conftest.py`; with pytest-xdist, once, in the controller) and run beside
the tensorflow tests at a lower priority; these tests run last and wait for
them. Each run writes its output and, when it ends, its exit status to files
in one folder, so that the test that waits for it may run in another process
than the one that started it.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO
from conftest import jax_compiling_fast

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


# The folder of the runs this session started; set by `conftest.py` before
# any xdist worker starts, so the workers inherit it.
RUNS_FOLDER_VARIABLE = "KERAS_TRANSFORMER_TEST_BACKEND_RUNS"

# Runs one command, then writes its exit status to the file named first.
_STATUS_WRITER = (
    "import subprocess, sys\n"
    "status = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1] + '.tmp', 'w').write(str(status))\n"
    "import os; os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
)


def start_backend_runs(folder):
    """Start one pytest process per backend over `NEUTRAL_FILES`, at a lower
    CPU priority, each in its own process group, writing its output to
    `folder/<backend>.out` and `.err` (files, so that neither blocks on a
    full pipe) and its exit status to `folder/<backend>.status` when it
    ends. `conftest.py` calls this as soon as collection ends, so the runs
    use the cores the tensorflow tests leave idle; the tests below, which
    pytest runs last, wait for them.

    Returns:
        list of the `subprocess.Popen` that were started.
    """
    processes = []
    for backend in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=backend)
        env.pop(RUNS_FOLDER_VARIABLE, None)
        if backend == "jax":
            jax_compiling_fast(env)
        base = os.path.join(folder, backend)
        with open(base + ".out", "w") as out, open(base + ".err", "w") as err:
            processes.append(subprocess.Popen(
                [sys.executable, "-c", _STATUS_WRITER, base + ".status",
                 sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--durations=15", *NEUTRAL_FILES],
                cwd=REPO, env=env, stdout=out, stderr=err, text=True,
                preexec_fn=lambda: os.nice(10), start_new_session=True,
            ))
    return processes


def stop_backend_runs(processes):
    """Kill the runs that are still going (their whole process groups)."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_backend_run(folder, backend, timeout):
    """`(exit status, stdout, stderr)` of the run of `backend` in `folder`,
    once it has ended. Raises TimeoutError after `timeout` seconds."""
    base = os.path.join(folder, backend)
    deadline = time.monotonic() + timeout
    while not os.path.exists(base + ".status"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {backend} run in {folder} did not end in {timeout} s")
        time.sleep(1)
    with open(base + ".status") as status, open(base + ".out") as out, open(base + ".err") as err:
        return int(status.read()), out.read(), err.read()


@pytest.fixture(scope="module")
def backend_runs(tmp_path_factory):
    """The folder of the runs `conftest.py` started after collection, or
    (when this module's tests were selected some other way) of new ones."""
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        pytest.skip("already running on another backend")
    folder = os.environ.get(RUNS_FOLDER_VARIABLE)
    if folder and all(os.path.exists(os.path.join(folder, f"{b}.out")) for b in BACKENDS):
        yield folder
        return
    folder = str(tmp_path_factory.mktemp("backends"))
    processes = start_backend_runs(folder)
    yield folder
    stop_backend_runs(processes)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_neutral_files_pass_on_backend(backend, backend_runs):
    returncode, stdout, stderr = wait_for_backend_run(backend_runs, backend, timeout=1500)
    tail = stdout[-3000:] + stderr[-2000:]
    assert returncode == 0, tail
    assert " passed" in stdout and " failed" not in stdout, tail
    assert f"keras backend={backend}" in stdout, tail
