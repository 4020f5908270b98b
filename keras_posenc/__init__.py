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

# Where README installs from: no release is on PyPI yet.
_SOURCE = "git+https://github.com/keras-posenc/keras-posenc"


# README's line for PyTorch's CPU build: PyPI's for Linux is CUDA's.
_TORCH_CPU_LINE = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def _install_line(backend):
    """README's command that installs the package with `backend`'s extra."""
    return f'pip install "keras-posenc[{backend}] @ {_SOURCE}"'


def _missing_backend_message(backend, missing):
    """What to do when `backend`'s library `missing` is not installed.

    Names the `KERAS_BACKEND` of each other backend whose library is
    installed, which works as it is, and README's install line.
    """
    import importlib.util

    installed = [
        other
        for other in BACKENDS
        if other != backend and importlib.util.find_spec(other) is not None
    ]
    message = (
        f"Keras chose the {backend!r} backend (KERAS_BACKEND, else "
        f"~/.keras/keras.json, else tensorflow), whose library {missing} is "
        "not installed."
    )
    install = f"install {backend} with: {_install_line(backend)}"
    if backend == "torch":
        install += f" (PyTorch's CPU build first: {_TORCH_CPU_LINE})"
    if not installed:
        return f"{message} To use it, {install}"
    settings = " or ".join(f"KERAS_BACKEND={other}" for other in installed)
    verb = "is" if len(installed) == 1 else "are"
    return (
        f"{message} {' and '.join(installed)} {verb} installed: set "
        f"{settings} before importing keras to use it, or {install}"
    )


try:
    import keras  # noqa: E402,F401
except ModuleNotFoundError as error:
    missing = (error.name or "").split(".")[0]
    if missing not in _BACKEND_OF_MODULE:
        raise
    raise ImportError(
        _missing_backend_message(_BACKEND_OF_MODULE[missing], missing)
    ) from None

# Importing the layers registers them with Keras, so that
# `keras.saving.load_model` finds them after `import keras_posenc`.
from keras_posenc import layers  # noqa: E402
from keras_posenc import ops  # noqa: E402
from keras_posenc import rope_scaling  # noqa: E402
from keras_posenc.layers import *  # noqa: E402,F401,F403

# Above the layers: Hugging Face configs and state dicts to built layers.
from keras_posenc import hf_attention  # noqa: E402,F401

# The one list of the public layers is `keras_posenc.layers.__all__`.
__all__ = [*layers.__all__, "ops", "rope_scaling"]
