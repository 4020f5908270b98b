import os

# TensorFlow is the reference and the default; `make test-jax` and
# `make test-torch` run the suite with KERAS_BACKEND set to theirs.
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    import tensorflow as tf

    # Two logical CPU devices, so that tf.distribute.MirroredStrategy has
    # two replicas to spread over on a machine without accelerators. This
    # must happen before TensorFlow initialises its devices, hence at import
    # time.
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )


def pytest_report_header():
    """Which backend, and which end of the version range, this run is at."""
    versions = [f"keras {keras.__version__}"]
    if BACKEND == "tensorflow":
        versions.append(f"tensorflow {tf.__version__}")
    elif BACKEND == "jax":
        import jax

        versions.append(f"jax {jax.__version__}")
    else:
        import torch

        versions.append(f"torch {torch.__version__}")
    return f"backend {BACKEND}: " + ", ".join(versions)


def _runs_here(item):
    """Whether this backend and environment can run `item`."""
    if BACKEND != "tensorflow" and item.get_closest_marker("tensorflow_only"):
        return False
    if BACKEND != "jax" and item.get_closest_marker("jax_only"):
        return False
    if BACKEND != "torch" and item.get_closest_marker("torch_only"):
        return False
    if BACKEND == "tensorflow" and item.get_closest_marker("fused_backends_only"):
        return False
    if BACKEND == "jax" and item.get_closest_marker("float64"):
        return False
    # A crossing of backends, where no other backend is installed.
    callspec = getattr(item, "callspec", None)
    return not (callspec and "other_backend" in callspec.params and callspec.params["other_backend"] is None)


def pytest_collection_modifyitems(config, items):
    """Deselect what cannot run here: TensorFlow's own tests off TensorFlow,
    JAX's distribution off JAX, PyTorch's kernels off PyTorch, float64 on JAX, and crossings of backends
    where only one is installed."""
    kept, dropped = [], []
    for item in items:
        (kept if _runs_here(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts, and leaves, under the float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
