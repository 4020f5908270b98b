import numbers

import keras
import tensorflow as tf

from keras_posenc import ops
from keras_posenc.layers._absolute import AbsoluteEncoding


@keras.saving.register_keras_serializable(package="keras_posenc")
class PositionEmbedding(AbsoluteEncoding):
    """A learned position embedding, as in BERT and GPT-2.

    A trainable table of shape `(sequence_length, width)` holds one vector per
    position; position `p` is encoded by row `p`. The table covers positions
    `0 .. sequence_length - 1` only: a longer sequence (or a `start_index` or
    `positions` reaching past the end) raises an error naming
    `sequence_length` rather than reading outside the table.

    The layer takes token embeddings of shape `(batch, sequence, features)`
    and, by default, returns them with the position embedding added, so it
    stacks in a `keras.Sequential`. Masks pass through unchanged.

    Args:
        sequence_length: int. The number of positions the table holds.
        initializer: str, `keras.initializers.Initializer` or
            `"sinusoidal"`. How the table starts. `"sinusoidal"` starts it
            from the fixed interleaved sinusoidal encoding of Vaswani et al.
            Defaults to `"glorot_uniform"`.
        merge_mode: str or None. `"add"` adds the embedding to the inputs,
            `"concat"` appends an embedding of width `output_dim` to the
            features, `None` returns the embedding alone, broadcast to the
            batch. Defaults to `"add"`.
        output_dim: int or None. The embedding width for
            `merge_mode="concat"` (required) or `None` (defaults to the input
            width). Must be `None` for `"add"`. Defaults to `None`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor of shape `(batch, sequence, features)`.
        start_index: int or integer scalar tensor. The position of the first
            element, for cached decoding. Defaults to `0`.
        positions: optional integer tensor of shape `(sequence,)` or
            `(batch, sequence)`. Overrides `start_index`: left padding, packed
            sequences.

    Returns:
        A tensor in the layer's compute dtype: the inputs plus the embedding,
        the inputs and the embedding concatenated, or the embedding alone of
        shape `(batch, sequence, output_dim)`.

    Example:

    >>> layer = PositionEmbedding(sequence_length=16, initializer="sinusoidal")
    >>> encoded = layer(np.zeros((2, 10, 8), "float32"))
    >>> encoded.shape
    TensorShape([2, 10, 8])
    >>> [round(float(v), 4) for v in encoded[0, 1, :2]]  # sin(1), cos(1)
    [0.8415, 0.5403]

    References:
        - [Devlin et al., 2018](https://arxiv.org/abs/1810.04805)
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(
        self,
        sequence_length,
        initializer="glorot_uniform",
        merge_mode="add",
        output_dim=None,
        **kwargs,
    ):
        super().__init__(merge_mode=merge_mode, output_dim=output_dim, **kwargs)
        ops.check_positive_int("sequence_length", sequence_length)
        self.sequence_length = sequence_length
        if initializer == "sinusoidal":
            self.initializer = initializer
        else:
            try:
                self.initializer = keras.initializers.get(initializer)
            except ValueError as error:
                raise ValueError(
                    "`initializer` must be a Keras initializer or "
                    f"'sinusoidal'. Received: initializer={initializer!r}"
                ) from error

    def build(self, input_shape):
        dim = self._encoding_dim(input_shape)
        if self.initializer == "sinusoidal":
            initializer = _sinusoidal_initializer
        else:
            initializer = self.initializer
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.sequence_length, dim),
            initializer=initializer,
        )

    def _positions(self, inputs, start_index, positions):
        length = inputs.shape[1]
        if (
            positions is None
            and length is not None
            and isinstance(start_index, numbers.Integral)
        ):
            self._check_range(start_index, start_index + length - 1)
        return super()._positions(inputs, start_index, positions)

    def _encode(self, positions, dim):
        if not positions.dtype.is_integer:
            raise ValueError(
                "PositionEmbedding needs integer `positions`. "
                f"Received positions of dtype {positions.dtype.name}"
            )
        with tf.control_dependencies(self._range_assertions(positions)):
            positions = tf.identity(positions)
        return tf.gather(self.embeddings, positions)  # (..., dim)

    def _encode_consecutive(self, inputs, start_index, dim):
        # A slice of the table, not a gather of its rows: XLA copies gathered
        # rows to a buffer of their own before adding them, and reads a slice
        # in place.
        positions = self._positions(inputs, start_index, None)  # (seq,)
        with tf.control_dependencies(self._range_assertions(positions)):
            start = tf.identity(tf.cast(start_index, "int32"))
        return tf.slice(
            self.embeddings, [start, 0], [tf.shape(positions)[0], dim]
        )  # (seq, dim)

    def _range_assertions(self, positions):
        """Check that `positions` are rows of the table.

        Eagerly the check runs at once. In a graph its result is known only
        when the graph runs: the returned assertions are to run before the
        lookup. XLA drops them; the static and eager checks are the ones it
        keeps.

        Args:
            positions: integer tensor of any shape.

        Returns:
            A list of the graph's assertions, empty when eager.
        """
        in_range = tf.reduce_all(
            (positions >= 0) & (positions < self.sequence_length)
        )
        if not tf.executing_eagerly():
            return [tf.debugging.Assert(in_range, [self._range_message()])]
        if not in_range:
            self._check_range(
                int(tf.reduce_min(positions)), int(tf.reduce_max(positions))
            )
        return []

    def _range_message(self):
        return (
            f"PositionEmbedding holds positions 0 to {self.sequence_length - 1}"
            f" (sequence_length={self.sequence_length}); a position outside "
            "that range was requested. Raise `sequence_length` or shorten the "
            "input."
        )

    def _check_range(self, first, last):
        """Fail, naming `sequence_length`, on a position outside the table."""
        if first < 0 or last >= self.sequence_length:
            raise ValueError(
                f"{self._range_message()} Received positions {first} to {last}"
            )

    def get_config(self):
        config = super().get_config()
        if self.initializer == "sinusoidal":
            initializer = self.initializer
        else:
            initializer = keras.initializers.serialize(self.initializer)
        config.update(
            {"sequence_length": self.sequence_length, "initializer": initializer}
        )
        return config


def _sinusoidal_initializer(shape, dtype=None):
    """The interleaved sinusoidal table of `shape`, as a starting point."""
    length, dim = shape
    table = ops.sinusoidal(tf.range(length), dim)  # (length, dim)
    return tf.cast(table, dtype or "float32")
