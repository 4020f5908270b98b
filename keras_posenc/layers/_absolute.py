"""The shared skeleton of the absolute encodings (private).

`SinusoidalPositionEncoding` and `PositionEmbedding` differ only in how they
turn positions into an encoding table; argument checks, position handling and
merging with the token embeddings live here once.
"""

import keras
import tensorflow as tf

from keras_posenc import ops

MERGE_MODES = ("add", "concat", None)


class AbsoluteEncoding(keras.layers.Layer):
    """Base of the layers that add an encoding of positions to embeddings.

    Subclasses implement `_encode(positions, dim)`, returning a table of shape
    `positions.shape + (dim,)` in any float dtype, and may override
    `_encode_consecutive` for the default positions `start_index, ...`.
    """

    def __init__(self, merge_mode="add", output_dim=None, **kwargs):
        # Float positions are call arguments that Keras would otherwise
        # round to the compute dtype (bfloat16) before angles are formed.
        super().__init__(autocast=False, **kwargs)
        if merge_mode not in MERGE_MODES:
            raise ValueError(
                f"`merge_mode` must be one of {MERGE_MODES}. "
                f"Received: merge_mode={merge_mode!r}"
            )
        ops.check_positive_int("output_dim", output_dim, allow_none=True)
        if merge_mode == "concat" and output_dim is None:
            raise ValueError(
                "`output_dim` is required when merge_mode='concat'. "
                "Received: output_dim=None"
            )
        if merge_mode == "add" and output_dim is not None:
            raise ValueError(
                "`output_dim` must be None when merge_mode='add' (the encoding "
                "takes the width of the inputs). "
                f"Received: output_dim={output_dim!r}"
            )
        self.merge_mode = merge_mode
        self.output_dim = output_dim
        self.supports_masking = True

    def _encoding_dim(self, input_shape):
        """The encoding width for inputs of `input_shape`."""
        input_shape = tuple(input_shape)
        if len(input_shape) != 3:
            raise ValueError(
                f"{type(self).__name__} expects inputs of shape "
                "(batch, sequence, features). "
                f"Received inputs of shape {input_shape}"
            )
        if self.output_dim is not None:
            return self.output_dim
        if input_shape[-1] is None:
            raise ValueError(
                f"{type(self).__name__} needs the last (features) dimension of "
                "its inputs to be known, or `output_dim` to be set. "
                f"Received inputs of shape {input_shape}"
            )
        return input_shape[-1]

    def build(self, input_shape):
        self._encoding_dim(input_shape)

    def _positions(self, inputs, start_index, positions):
        """The positions to encode: `(seq,)` or `(batch, seq)`."""
        if positions is None:
            return ops.position_ids(tf.shape(inputs)[1], start_index)
        positions = tf.convert_to_tensor(positions)
        ops.check_positions(positions, inputs.shape[1], inputs.shape[0])
        return positions

    def _encode_consecutive(self, inputs, start_index, dim):
        """The encoding of positions `start_index, start_index + 1, ...`.

        Encodes `_positions(inputs, start_index, None)` with `_encode`; a
        subclass overrides it where consecutive positions cost less.
        """
        return self._encode(self._positions(inputs, start_index, None), dim)

    def call(self, inputs, start_index=0, positions=None):
        inputs = tf.cast(inputs, self.compute_dtype)
        dim = self._encoding_dim(inputs.shape)
        if positions is None:
            encoding = self._encode_consecutive(
                inputs, start_index, dim
            )  # (seq, dim)
        else:
            positions = self._positions(inputs, start_index, positions)
            encoding = self._encode(positions, dim)  # (..., seq, dim)
        encoding = tf.cast(encoding, self.compute_dtype)
        if self.merge_mode == "add":
            return inputs + encoding
        encoding = tf.broadcast_to(
            encoding, tf.concat([tf.shape(inputs)[:2], [dim]], 0)
        )  # (batch, seq, dim)
        if self.merge_mode is None:
            return encoding
        return tf.concat([inputs, encoding], -1)  # (batch, seq, features + dim)

    def compute_output_shape(self, input_shape):
        dim = self._encoding_dim(input_shape)
        if self.merge_mode == "add":
            return tuple(input_shape)
        if self.merge_mode is None:
            return tuple(input_shape[:-1]) + (dim,)
        features = input_shape[-1]
        return tuple(input_shape[:-1]) + (
            None if features is None else features + dim,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {"merge_mode": self.merge_mode, "output_dim": self.output_dim}
        )
        return config

    @classmethod
    def from_config(cls, config):
        # Keras' legacy `.h5` loader turns a config string that names a
        # function of `keras.layers` into that function before this runs
        # (`class_and_config_for_serialized_keras_object` in
        # keras/src/legacy/saving/serialization.py): "add" arrives as
        # `keras.layers.add`. Only here is it read back as "add"; the
        # constructor still refuses functions.
        if config.get("merge_mode") is keras.layers.add:
            config = {**config, "merge_mode": "add"}
        return super().from_config(config)
