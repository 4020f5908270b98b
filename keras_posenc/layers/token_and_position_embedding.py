import keras
import numpy as np

from keras_posenc import ops
from keras_posenc.ops import _backend
from keras_posenc.ops import _checks
from keras_posenc.layers._renamed import renamed_arguments
from keras_posenc.layers.position_embedding import PositionEmbedding
from keras_posenc.layers.sinusoidal_position_encoding import (
    SinusoidalPositionEncoding,
)

POSITION_ENCODINGS = ("sinusoidal", "learned")


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments({"position": "position_encoding"})
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a position encoding, the input of a transformer.

    Token ids of shape `(batch, sequence)` are embedded by a
    `keras.layers.Embedding` and given positions by a
    `SinusoidalPositionEncoding` (fixed, any length) or a `PositionEmbedding`
    (learned, up to `sequence_length`), added to the token embeddings.

    With `mask_zero=True`, token id 0 is padding: the output carries a mask
    of shape `(batch, sequence)` that later layers (attention, pooling)
    honour.

    Args:
        vocabulary_size: int. The number of token ids.
        embedding_dim: int. The width of the embeddings.
        sequence_length: int or None. The number of positions a learned table
            holds; required for `position_encoding="learned"`, unused by
            `"sinusoidal"`. Defaults to `None`.
        position_encoding: str. `"sinusoidal"` or `"learned"`. Defaults to
            `"sinusoidal"`.
        mask_zero: bool. Whether token id 0 is padding, to be masked.
            Defaults to `False`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: integer tensor of shape `(batch, sequence)`.
        start_index: int or integer scalar tensor. The position of the first
            token, for cached decoding. Defaults to `0`.
        positions: optional tensor of shape `(sequence,)` or
            `(batch, sequence)`. Overrides `start_index`.

    Returns:
        A tensor of shape `(batch, sequence, embedding_dim)` in the layer's
        compute dtype.

    Example:

    >>> layer = TokenAndPositionEmbedding(
    ...     vocabulary_size=100, embedding_dim=16, mask_zero=True
    ... )
    >>> outputs = layer(np.array([[5, 9, 2, 0, 0]]))
    >>> tuple(outputs.shape)
    (1, 5, 16)
    >>> mask = layer.compute_mask(np.array([[5, 9, 2, 0, 0]]))
    >>> keras.ops.convert_to_numpy(mask).tolist()
    [[True, True, True, False, False]]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Devlin et al., 2018](https://arxiv.org/abs/1810.04805)
    """

    def __init__(
        self,
        vocabulary_size,
        embedding_dim,
        sequence_length=None,
        position_encoding="sinusoidal",
        mask_zero=False,
        **kwargs,
    ):
        # Float positions reach the position layer in float32, not rounded
        # to the compute dtype by Keras on the way in.
        super().__init__(autocast=False, **kwargs)
        ops.check_positive_int("vocabulary_size", vocabulary_size)
        ops.check_positive_int("embedding_dim", embedding_dim)
        ops.check_positive_int(
            "sequence_length", sequence_length, allow_none=True
        )
        if position_encoding not in POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {POSITION_ENCODINGS}. "
                f"Received: position_encoding={position_encoding!r}"
            )
        if position_encoding == "learned" and sequence_length is None:
            raise ValueError(
                "`sequence_length` is required when "
                "position_encoding='learned'. "
                "Received: sequence_length=None"
            )
        ops.check_bool("mask_zero", mask_zero)
        self.vocabulary_size = vocabulary_size
        self.embedding_dim = embedding_dim
        self.sequence_length = sequence_length
        self.position_encoding = position_encoding
        self.mask_zero = mask_zero
        self.token_embedding = keras.layers.Embedding(
            vocabulary_size,
            embedding_dim,
            mask_zero=mask_zero,
            dtype=self.dtype_policy,
            name="token_embedding",
        )
        if position_encoding == "learned":
            self.position_embedding = PositionEmbedding(
                sequence_length,
                dtype=self.dtype_policy,
                name="position_embedding",
            )
        else:
            self.position_embedding = SinusoidalPositionEncoding(
                dtype=self.dtype_policy, name="position_embedding"
            )
        self.supports_masking = True

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        if len(input_shape) != 2:
            raise ValueError(
                "TokenAndPositionEmbedding expects token ids of shape "
                f"(batch, sequence). Received inputs of shape {input_shape}"
            )
        self.token_embedding.build(input_shape)
        self.position_embedding.build(input_shape + (self.embedding_dim,))

    def __call__(self, inputs, *args, **kwargs):
        # Before Keras converts them: JAX parses strings of digits.
        _checks.check_not_text("inputs", inputs, "integer token ids")
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, start_index=0, positions=None):
        valid = keras.ops.logical_and(
            inputs >= 0, inputs < self.vocabulary_size
        )  # (batch, seq)
        message = (
            f"`inputs` must be token ids from 0 to {self.vocabulary_size - 1}, "
            f"rows of the table (vocabulary_size={self.vocabulary_size})."
        )
        known = _backend.static_value(valid)
        if known is not None and not known.all():
            index = tuple(int(i) for i in np.argwhere(~known)[0])
            value = _backend.static_value(inputs)[index]
            raise ValueError(
                f"{message} Received: inputs[{', '.join(map(str, index))}]={value}"
            )
        # A TensorFlow graph checks before the lookup, whose own error
        # names no argument.
        inputs = _backend.checked(inputs, valid, message)
        embedded = self.token_embedding(inputs)  # (batch, seq, embedding_dim)
        if known is None:
            # Compiled code cannot raise: a row past the table is NaN, where
            # XLA's lookup would read zeros or the last row.
            # expand_dims, not a slice: TFLite's built-in ops lack a
            # StridedSlice that adds an axis.
            embedded = keras.ops.where(
                keras.ops.expand_dims(valid, -1),
                embedded,
                keras.ops.cast(float("nan"), embedded.dtype),
            )
        return self.position_embedding(
            embedded, start_index=start_index, positions=positions
        )

    def compute_mask(self, inputs, mask=None):
        return self.token_embedding.compute_mask(inputs, mask)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.embedding_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "embedding_dim": self.embedding_dim,
                "sequence_length": self.sequence_length,
                "position_encoding": self.position_encoding,
                "mask_zero": self.mask_zero,
            }
        )
        return config
