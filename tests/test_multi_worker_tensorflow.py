"""Two TensorFlow workers on localhost train to one worker's weights.

`MultiWorkerMirroredStrategy` with a custom training step
(`tests/multi_worker_child.py`; Keras' `fit` does not run under this
strategy, keras-team/keras#20585), every attention scheme of the package
in the model. One worker killed in the middle of training: both restart
from the chief's `tf.train.CheckpointManager` checkpoint and end with the
weights of a run that was never interrupted.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.backend import tensorflow_only
from tests.distribution_child import assert_same_weights
from tests.distribution_child import weights

pytestmark = tensorflow_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for probe in sockets:
        probe.bind(("localhost", 0))
    ports = [probe.getsockname()[1] for probe in sockets]
    for probe in sockets:
        probe.close()
    return ports


def start(out, index, ports, *extra):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.multi_worker_child", str(out), str(index), *map(str, ports), *map(str, extra)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process, returncode=0):
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == returncode, stderr[-4000:]


def two_workers(out, exit_after=None):
    ports = free_ports(2)
    chief = start(out, 0, ports)
    worker = start(out, 1, ports, *([exit_after] if exit_after else []))
    return chief, worker, ports


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    finish(start(out, -1, [0, 0]))
    return weights(out / "weights--1.npz")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("two")
    chief, worker, _ = two_workers(out)
    finish(chief)
    finish(worker)
    return weights(out / "weights-0.npz"), weights(out / "weights-1.npz")


def test_two_workers_train_to_one_workers_weights(one_worker, uninterrupted):
    chief, worker = uninterrupted
    assert_same_weights(worker, chief, rtol=0, atol=0)
    # All-reduced gradients summed in another order than one worker's.
    assert_same_weights(chief, one_worker, rtol=1e-5, atol=1e-6)


def test_a_killed_worker_resumes_from_the_checkpoint_with_nothing_lost(
    uninterrupted, tmp_path
):
    chief, worker, _ = two_workers(tmp_path, exit_after=5)
    finish(worker, returncode=3)
    # The chief waits on its peer in the next step: stopped, as a cluster
    # manager restarting the job would.
    time.sleep(2)
    chief.kill()
    chief.communicate(timeout=60)
    assert not (tmp_path / "weights-0.npz").exists()
    chief, worker, _ = two_workers(tmp_path)
    finish(chief)
    finish(worker)
    assert_same_weights(weights(tmp_path / "weights-0.npz"), uninterrupted[0], rtol=0, atol=0)
    assert_same_weights(weights(tmp_path / "weights-1.npz"), uninterrupted[1], rtol=0, atol=0)
