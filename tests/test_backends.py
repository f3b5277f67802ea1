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


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_neutral_files_pass_on_backend(backend):
    if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
        pytest.skip("already running on another backend")
    env = dict(os.environ, KERAS_BACKEND=backend)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *NEUTRAL_FILES],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500,
    )
    tail = result.stdout[-3000:] + result.stderr[-2000:]
    assert result.returncode == 0, tail
    assert " passed" in result.stdout and " failed" not in result.stdout, tail
    assert f"keras backend={backend}" in result.stdout, tail
