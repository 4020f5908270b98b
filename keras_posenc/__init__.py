"""Positional encodings for transformers, as Keras 3 layers on TensorFlow."""

import os


def _refuse_backend(backend):
    raise ImportError(
        "keras_posenc runs on the TensorFlow backend of Keras only. Set the "
        "environment variable KERAS_BACKEND=tensorflow before importing keras. "
        f"Current backend: {backend!r}"
    )


# Checked before importing keras, whose import fails on its own, less
# helpfully, when the requested backend's library is not installed.
if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    _refuse_backend(os.environ["KERAS_BACKEND"])

import keras  # noqa: E402

if keras.backend.backend() != "tensorflow":
    _refuse_backend(keras.backend.backend())

from keras_posenc import ops  # noqa: E402
from keras_posenc import rope_scaling  # noqa: E402
from keras_posenc.layers import AlibiBias  # noqa: E402
from keras_posenc.layers import PositionEmbedding  # noqa: E402
from keras_posenc.layers import PositionalMultiHeadAttention  # noqa: E402
from keras_posenc.layers import RelativePositionBias  # noqa: E402
from keras_posenc.layers import RelativePositionEmbedding  # noqa: E402
from keras_posenc.layers import RotaryEmbedding  # noqa: E402
from keras_posenc.layers import SinusoidalPositionEncoding  # noqa: E402
from keras_posenc.layers import TokenAndPositionEmbedding  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "AlibiBias",
    "PositionEmbedding",
    "PositionalMultiHeadAttention",
    "RelativePositionBias",
    "RelativePositionEmbedding",
    "RotaryEmbedding",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "ops",
    "rope_scaling",
]
