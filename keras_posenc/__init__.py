"""Positional encodings for transformers, as Keras 3 layers on every backend."""

import os

__version__ = "0.1.0"

BACKENDS = ("tensorflow", "jax", "torch")


def _refuse_backend(backend):
    raise ImportError(
        f"keras_posenc runs on Keras' {', '.join(BACKENDS)} backends. Set the "
        "environment variable KERAS_BACKEND to one of them (tensorflow, the "
        f"default, is the reference) before importing keras. Current backend: "
        f"{backend!r}"
    )


# Checked before importing keras, whose import fails on its own, less
# helpfully, when the requested backend's library is not installed.
if os.environ.get("KERAS_BACKEND", "tensorflow") not in BACKENDS:
    _refuse_backend(os.environ["KERAS_BACKEND"])

# The library each backend imports first, and the extra that installs it.
_BACKEND_OF_MODULE = {
    "tensorflow": "tensorflow",
    "jax": "jax",
    "jaxlib": "jax",
    "torch": "torch",
}

try:
    import keras  # noqa: E402,F401
except ModuleNotFoundError as error:
    missing = (error.name or "").split(".")[0]
    if missing not in _BACKEND_OF_MODULE:
        raise
    backend = _BACKEND_OF_MODULE[missing]
    raise ImportError(
        f"Keras chose the {backend!r} backend (KERAS_BACKEND, else "
        f"~/.keras/keras.json, else tensorflow), whose library {missing} is "
        f'not installed. Install it with: pip install "keras-posenc[{backend}]"'
    ) from None

# Importing the layers registers them with Keras, so that
# `keras.saving.load_model` finds them after `import keras_posenc`.
from keras_posenc import layers  # noqa: E402
from keras_posenc import ops  # noqa: E402
from keras_posenc import rope_scaling  # noqa: E402
from keras_posenc.layers import *  # noqa: E402,F401,F403

# The one list of the public layers is `keras_posenc.layers.__all__`.
__all__ = [*layers.__all__, "ops", "rope_scaling"]
