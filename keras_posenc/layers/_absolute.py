"""The shared skeleton of the absolute encodings (private).

`SinusoidalPositionEncoding` and `PositionEmbedding` differ only in how they
turn positions into an encoding table; argument checks, position handling
(a line or a grid, prefix tokens) and merging with the token embeddings live
here once.
"""

import numbers

import keras

from keras_posenc import ops
from keras_posenc.layers._grid_config import add_grid_arguments

MERGE_MODES = ("add", "concat", None)


def check_merge(merge_mode, output_dim):
    """Raise a `ValueError` for an unknown `merge_mode` or a bad `output_dim`."""
    if merge_mode not in MERGE_MODES:
        raise ValueError(
            f"`merge_mode` must be one of {MERGE_MODES}. "
            f"Received: merge_mode={merge_mode!r}"
        )
    ops.check_positive_int("output_dim", output_dim, allow_none=True)


def legacy_merge_mode(config):
    """`config` with the merge mode as saved, as Keras' `.h5` loader left it.

    Keras' legacy `.h5` loader turns a config string that names a function
    of `keras.layers` into that function before `from_config` runs
    (`class_and_config_for_serialized_keras_object` in
    keras/src/legacy/saving/serialization.py): "add" arrives as
    `keras.layers.add`. Only here is it read back as "add"; the constructors
    still refuse functions.
    """
    if config.get("merge_mode") is keras.layers.add:
        return {**config, "merge_mode": "add"}
    return config


class AbsoluteEncoding(keras.layers.Layer):
    """Base of the layers that add an encoding of positions to embeddings.

    Subclasses implement `_encode(positions, dim)`, returning a table of shape
    `positions.shape + (dim,)` (one axis) or `positions.shape[:-1] + (dim,)`
    (`num_axes` > 1) in any float dtype, and may override
    `_encode_consecutive` for the default positions `start_index, ...`,
    `_encode_grid` for the cells of a whole grid and `_encode_prefix` for the
    `num_prefix_tokens` tokens before the positions (zeros here).

    Inputs are tokens `(batch, sequence, features)`, or, with `num_axes` > 1,
    a grid `(batch, *grid, features)` whose cells take their coordinates from
    its axes, row-major (`ops.grid_positions`).
    """

    def __init__(
        self,
        merge_mode="add",
        output_dim=None,
        num_axes=1,
        num_prefix_tokens=0,
        **kwargs,
    ):
        # Float positions are call arguments that Keras would otherwise
        # round to the compute dtype (bfloat16) before angles are formed.
        super().__init__(autocast=False, **kwargs)
        check_merge(merge_mode, output_dim)
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
        ops.check_num_axes(num_axes)
        if (
            isinstance(num_prefix_tokens, bool)
            or not isinstance(num_prefix_tokens, numbers.Integral)
            or num_prefix_tokens < 0
        ):
            raise ValueError(
                "`num_prefix_tokens` must be a non-negative integer. "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        self.merge_mode = merge_mode
        self.output_dim = output_dim
        self.num_axes = num_axes
        self.num_prefix_tokens = num_prefix_tokens
        self.supports_masking = True

    def _is_grid(self, input_shape):
        """Whether inputs of `input_shape` are a grid `(batch, *grid, features)`."""
        return self.num_axes > 1 and len(input_shape) == 2 + self.num_axes

    def _encoding_dim(self, input_shape):
        """The encoding width for inputs of `input_shape`."""
        input_shape = tuple(input_shape)
        if len(input_shape) != 3 and not self._is_grid(input_shape):
            grid = ""
            if self.num_axes > 1:
                grid = (
                    f", or (batch, {', '.join(['size'] * self.num_axes)}, "
                    f"features) for a grid of num_axes={self.num_axes}"
                )
            raise ValueError(
                f"{type(self).__name__} expects inputs of shape "
                f"(batch, sequence, features){grid}. "
                f"Received inputs of shape {input_shape}"
            )
        if self._is_grid(input_shape) and self.num_prefix_tokens:
            raise ValueError(
                "Grid inputs (batch, *grid, features) hold no prefix tokens: "
                "pass the tokens as (batch, sequence, features) with "
                f"num_prefix_tokens={self.num_prefix_tokens}, or use "
                "num_prefix_tokens=0. "
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
        """The positions to encode: `(seq,)`, `(batch, seq)` or `(..., seq, n)`.

        `inputs` are the tokens that have positions (after the prefix).
        """
        if positions is None:
            return ops.position_ids(keras.ops.shape(inputs)[1], start_index)
        return ops.read_positions(
            positions,
            self.num_axes,
            length=inputs.shape[1],
            batch_size=inputs.shape[0],
        )

    def _encode_consecutive(self, inputs, start_index, dim):
        """The encoding of positions `start_index, start_index + 1, ...`.

        Encodes `_positions(inputs, start_index, None)` with `_encode`; a
        subclass overrides it where consecutive positions cost less.
        """
        return self._encode(self._positions(inputs, start_index, None), dim)

    def _encode_grid(self, grid_shape, dim):
        """The encoding of every cell of `grid_shape`, row-major: `(cells, dim)`."""
        positions = ops.grid_positions(grid_shape)  # (cells, num_axes)
        if self.num_axes == 1:
            positions = positions[:, 0]  # (cells,)
        return self._encode(positions, dim)

    def _default_grid_shape(self, inputs):
        """The grid of token inputs called with neither positions nor grid_shape."""
        raise ValueError(
            f"{type(self).__name__} with num_axes={self.num_axes} needs the "
            "grid of token inputs (batch, sequence, features): pass "
            "`grid_shape` (the grid's sizes) or `positions` of shape "
            f"(sequence, {self.num_axes}), or call it on inputs of shape "
            f"(batch, *grid, features). Received inputs of shape {tuple(inputs.shape)}"
        )

    def _encode_prefix(self, dim):
        """The encoding of the prefix tokens: `(num_prefix_tokens, dim)`."""
        return keras.ops.zeros((self.num_prefix_tokens, dim), "float32")

    def _check_call(self, start_index, positions, grid_shape, grid_input):
        if positions is not None and grid_shape is not None:
            shape = tuple(keras.ops.convert_to_tensor(positions).shape)
            raise ValueError(
                "Pass `positions` or `grid_shape`, not both. Received: "
                f"positions of shape {shape} "
                f"and grid_shape={grid_shape!r}"
            )
        if grid_input and (positions is not None or grid_shape is not None):
            name = "positions" if positions is not None else "grid_shape"
            raise ValueError(
                "Grid inputs (batch, *grid, features) take their positions "
                f"from their grid axes: `{name}` is for token inputs "
                "(batch, sequence, features). Received inputs of rank "
                f"{2 + self.num_axes} and {name}"
            )
        if self.num_axes > 1 and not (
            isinstance(start_index, numbers.Integral)
            and not isinstance(start_index, bool)
            and start_index == 0
        ):
            raise ValueError(
                "`start_index` offsets positions on one axis only; with "
                f"num_axes={self.num_axes} pass `positions` instead. "
                f"Received: start_index={start_index!r}"
            )
        if grid_shape is not None:
            ops.check_grid_shape(grid_shape, num_axes=self.num_axes)

    def _encode_tokens(self, tokens, start_index, positions, grid_shape, dim):
        """The encoding of `tokens` (those after the prefix)."""
        if positions is not None:
            positions = self._positions(tokens, start_index, positions)
            return self._encode(positions, dim)  # (..., seq, dim)
        if grid_shape is None and self.num_axes > 1:
            grid_shape = self._default_grid_shape(tokens)
        if grid_shape is None:
            return self._encode_consecutive(tokens, start_index, dim)  # (seq, dim)
        cells = 1
        for size in grid_shape:
            cells = (
                None
                if keras.ops.is_tensor(size) or cells is None
                else cells * size
            )
        if cells is not None and tokens.shape[1] not in (None, cells):
            raise ValueError(
                f"grid_shape={tuple(grid_shape)} has {cells} cells, but the "
                f"inputs have {tokens.shape[1]} tokens after "
                f"num_prefix_tokens={self.num_prefix_tokens}. "
                f"Received inputs of shape {tuple(tokens.shape)}"
            )
        return self._encode_grid(list(grid_shape), dim)  # (cells, dim)

    def call(self, inputs, start_index=0, positions=None, grid_shape=None):
        inputs = keras.ops.cast(inputs, self.compute_dtype)
        dim = self._encoding_dim(inputs.shape)
        grid_input = self._is_grid(inputs.shape)
        self._check_call(start_index, positions, grid_shape, grid_input)
        if grid_input:
            # Static sizes as ints, the others as scalar tensors (TensorFlow).
            shape = keras.ops.shape(inputs)
            sizes = list(shape[:-1])  # batch, *grid
            tokens = keras.ops.reshape(
                inputs, (sizes[0], -1, shape[-1])
            )  # (batch, cells, features)
            encoding = self._encode_grid(sizes[1:], dim)  # (cells, dim)
            outputs = self._merge(tokens, encoding, dim)
            width = self.compute_output_shape(inputs.shape)[-1]
            return keras.ops.reshape(
                outputs, tuple(sizes) + (width if width is not None else -1,)
            )  # (batch, *grid, width)
        prefix = self.num_prefix_tokens
        if inputs.shape[1] is not None and inputs.shape[1] < prefix:
            raise ValueError(
                f"Inputs must hold at least the {prefix} prefix tokens "
                f"(num_prefix_tokens={prefix}). Received inputs of shape "
                f"{tuple(inputs.shape)}"
            )
        encoding = self._encode_tokens(
            inputs[:, prefix:] if prefix else inputs,
            start_index,
            positions,
            grid_shape,
            dim,
        )  # (seq, dim) or (batch, seq, dim)
        if prefix:
            prefix_encoding = keras.ops.cast(
                self._encode_prefix(dim), encoding.dtype
            )
            if len(encoding.shape) == 3:
                prefix_encoding = keras.ops.broadcast_to(
                    prefix_encoding, (keras.ops.shape(encoding)[0], prefix, dim)
                )  # (batch, prefix, dim)
            encoding = keras.ops.concatenate(
                [prefix_encoding, encoding], axis=-2
            )  # (..., prefix + seq, dim)
        return self._merge(inputs, encoding, dim)

    def _merge(self, inputs, encoding, dim):
        """The inputs `(batch, seq, features)` merged with their encoding."""
        encoding = keras.ops.cast(encoding, self.compute_dtype)
        if self.merge_mode == "add":
            return inputs + encoding
        encoding = keras.ops.broadcast_to(
            encoding, keras.ops.shape(inputs)[:2] + (dim,)
        )  # (batch, seq, dim)
        if self.merge_mode is None:
            return encoding
        return keras.ops.concatenate(
            [inputs, encoding], -1
        )  # (batch, seq, features + dim)

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
        return add_grid_arguments(
            config,
            {"num_prefix_tokens": self.num_prefix_tokens},
            {"num_prefix_tokens": 0},
            on_a_grid=self.num_axes > 1,
        )

    @classmethod
    def from_config(cls, config):
        return super().from_config(legacy_merge_mode(config))
