"""The package's layers, one public layer per file, and the scheme protocol's context."""

import keras

from keras_posenc import BACKENDS
from keras_posenc import _refuse_backend

# The backend may come from ~/.keras/keras.json rather than KERAS_BACKEND.
if keras.backend.backend() not in BACKENDS:
    _refuse_backend(keras.backend.backend())

from keras_posenc.layers.alibi_bias import AlibiBias
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.layers.attention_temperature import AttentionTemperature
from keras_posenc.layers.contextual_position import ContextualPosition
from keras_posenc.layers.disentangled_position import DisentangledPosition
from keras_posenc.layers.fire_bias import FireBias
from keras_posenc.layers.grid_relative_position_bias import (
    GridRelativePositionBias,
)
from keras_posenc.layers.kerple_bias import KerpleBias
from keras_posenc.layers.laplacian_position_encoding import (
    LaplacianPositionEncoding,
)
from keras_posenc.layers.position_embedding import PositionEmbedding
from keras_posenc.layers.random_walk_position_encoding import (
    RandomWalkPositionEncoding,
)
from keras_posenc.layers.positional_multi_head_attention import (
    PositionalMultiHeadAttention,
)
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.layers.relative_position_embedding import (
    RelativePositionEmbedding,
)
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.shortest_path_bias import ShortestPathBias
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)
from keras_posenc.layers.transformer_xl_position import TransformerXLPosition
from keras_posenc.layers.token_and_position_embedding import (
    TokenAndPositionEmbedding,
)
from keras_posenc.layers.x_pos_embedding import XPosEmbedding

__all__ = [
    "AlibiBias",
    "AttentionContext",
    "AttentionPosition",
    "AttentionTemperature",
    "ContextualPosition",
    "DisentangledPosition",
    "FireBias",
    "GridRelativePositionBias",
    "KerpleBias",
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
    "TransformerXLPosition",
    "XPosEmbedding",
]
