"""Positional encodings for transformers, as Keras 3 layers on TensorFlow."""

import keras

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        "keras_posenc runs on the TensorFlow backend of Keras only. Set the "
        "environment variable KERAS_BACKEND=tensorflow before importing keras. "
        f"Current backend: {keras.backend.backend()!r}"
    )

from keras_posenc import ops  # noqa: E402
from keras_posenc.layers import PositionEmbedding  # noqa: E402
from keras_posenc.layers import SinusoidalPositionEncoding  # noqa: E402
from keras_posenc.layers import TokenAndPositionEmbedding  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "PositionEmbedding",
    "SinusoidalPositionEncoding",
    "TokenAndPositionEmbedding",
    "ops",
]
