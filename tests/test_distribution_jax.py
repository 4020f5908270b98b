"""Training under `keras.distribution` on JAX gives one device's weights.

Each run is a process of its own (`tests/distribution_child.py`) over 8
forced host CPU devices, standing in for a v2-8 TPU's 8 cores: one device
alone, `DataParallel` over the 8, `ModelParallel` on a 2 x 4 mesh with the
position tables sharded, a run killed in the middle of `fit` and resumed
by `BackupAndRestore`, and two processes joined by
`keras.distribution.initialize`. All train the same model (every position
table of the package) on the same global batches.
"""

import os
import socket
import subprocess
import sys

import pytest

from tests.backend import BACKEND
from tests.distribution_child import assert_same_weights
from tests.distribution_child import weights

pytestmark = pytest.mark.jax_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Float32 sums in another order across devices: within a few ulps of the
# weights' sizes after 16 SGD steps.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def run(mode, out, *arguments, devices=8, check=True):
    """Start the child in `mode`; its process (waited for when `check`)."""
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        # The devices, after the flags the run was given (the Makefile's).
        XLA_FLAGS=" ".join(
            os.environ.get("XLA_FLAGS", "").split()
            + [f"--xla_force_host_platform_device_count={devices}"]
        ),
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.distribution_child", mode, str(out), *map(str, arguments)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if check:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
    return process


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    run("one", out)
    return weights(out / "weights.npz")


@pytest.fixture(scope="module")
def data_parallel(tmp_path_factory):
    """The data-parallel run's directory: its weights, and the killed run's twin."""
    out = tmp_path_factory.mktemp("data")
    run("data", out)
    return out


def test_the_backend_is_jax():
    assert BACKEND == "jax"


def test_data_parallel_over_8_devices_trains_to_one_devices_weights(
    one_device, data_parallel
):
    assert_same_weights(weights(data_parallel / "weights.npz"), one_device, **TOLERANCE)


def test_model_parallel_with_sharded_tables_trains_to_one_devices_weights(
    one_device, tmp_path
):
    run("model", tmp_path)
    assert_same_weights(weights(tmp_path / "weights.npz"), one_device, **TOLERANCE)
    shardings = eval((tmp_path / "shardings.txt").read_text())  # {path: spec}
    tables = [path for path in shardings if "token_embedding" not in path]
    # Learned positions, T5, Shaw's keys and values, Swin, shortest paths.
    assert len(tables) == 6, shardings
    for path in tables:
        assert "model" in shardings[path], (path, shardings[path])


def test_a_killed_fit_resumes_with_backup_and_restore_to_the_same_weights(
    data_parallel, tmp_path
):
    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    killed = run("killed", interrupted, check=False)
    _, stderr = killed.communicate(timeout=600)
    assert killed.returncode == 3, stderr[-4000:]
    assert not (interrupted / "weights.npz").exists()
    run("resumed", interrupted)
    # The same program on the same devices: the same weights, bit for bit.
    assert_same_weights(
        weights(interrupted / "weights.npz"),
        weights(data_parallel / "weights.npz"),
        rtol=0,
        atol=0,
    )


def test_two_processes_train_to_one_processs_weights(one_device, tmp_path):
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    processes = [
        run("process", tmp_path, process_id, port, devices=4, check=False)
        for process_id in (0, 1)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr[-4000:]
    first = weights(tmp_path / "weights-0.npz")
    assert_same_weights(weights(tmp_path / "weights-1.npz"), first, rtol=0, atol=0)
    assert_same_weights(first, one_device, **TOLERANCE)
