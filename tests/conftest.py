import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPU devices, so that tf.distribute.MirroredStrategy has two
# replicas to spread over on a machine without accelerators. This must happen
# before TensorFlow initialises its devices, hence at import time.
_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0],
    [tf.config.LogicalDeviceConfiguration()] * 2,
)


def pytest_report_header():
    """Which end of the version range this run is at."""
    return f"keras {keras.__version__}, tensorflow {tf.__version__}"


@pytest.fixture(autouse=True)
def _float32_policy():
    """Every test starts, and leaves, under the float32 policy."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
