"""Positional encodings for transformers, as Keras 3 layers on every backend."""

import importlib
import os
import sys

__version__ = "0.1.0"

__all__ = [
    "AlibiBias",
    "GridRelativePositionBias",
    "LaplacianPositionEncoding",
    "PositionEmbedding",
    "PositionalMultiHeadAttention",
    "RandomWalkPositionEncoding",
    "RelativePositionBias",
    "RelativePositionEmbedding",
    "RotaryEmbedding",
    "ShortestPathBias",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "ops",
    "rope_scaling",
]


BACKENDS = ("tensorflow", "jax", "torch")


def _refuse_backend(backend):
    raise ImportError(
        f"keras_posenc runs on Keras' {', '.join(BACKENDS)} backends. Set the "
        "environment variable KERAS_BACKEND to one of them (tensorflow, the "
        f"default, is the reference) before importing keras. Current backend: "
        f"{backend!r}"
    )


def _started_as_the_command():
    """Whether this process is `keras-posenc` or `python -m keras_posenc`.

    Both import this package before the command reads its arguments, and
    importing Keras imports its backend (seconds, and lines of C++ logging):
    the command imports them itself, for the subcommands that need them.
    """
    program = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    if program == "keras-posenc":
        return True
    # While `python -m` finds the module to run, sys.argv[0] is "-m".
    arguments = getattr(sys, "orig_argv", [])
    return (
        program == "-m"
        and "-m" in arguments[:-1]
        and arguments[arguments.index("-m") + 1] == "keras_posenc"
    )


# Checked before importing keras, whose import fails on its own, less
# helpfully, when the requested backend's library is not installed.
if os.environ.get("KERAS_BACKEND", "tensorflow") not in BACKENDS:
    _refuse_backend(os.environ["KERAS_BACKEND"])

if _started_as_the_command():

    def __getattr__(name):
        """The public API, imported on first use, in the command only."""
        if name in ("ops", "rope_scaling"):
            return importlib.import_module(f"keras_posenc.{name}")
        if name in __all__:
            return getattr(importlib.import_module("keras_posenc.layers"), name)
        raise AttributeError(f"module 'keras_posenc' has no attribute {name!r}")

else:
    # Importing the layers registers them with Keras, so that
    # `keras.saving.load_model` finds them after `import keras_posenc`.
    from keras_posenc import ops
    from keras_posenc import rope_scaling
    from keras_posenc.layers import AlibiBias
    from keras_posenc.layers import GridRelativePositionBias
    from keras_posenc.layers import LaplacianPositionEncoding
    from keras_posenc.layers import PositionEmbedding
    from keras_posenc.layers import PositionalMultiHeadAttention
    from keras_posenc.layers import RandomWalkPositionEncoding
    from keras_posenc.layers import RelativePositionBias
    from keras_posenc.layers import RelativePositionEmbedding
    from keras_posenc.layers import RotaryEmbedding
    from keras_posenc.layers import ShortestPathBias
    from keras_posenc.layers import SinusoidalPositionEncoding
    from keras_posenc.layers import TokenAndPositionEmbedding
