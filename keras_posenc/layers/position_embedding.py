import numbers

import keras
import numpy as np

from keras_posenc import ops
from keras_posenc.ops import _backend
from keras_posenc.layers._absolute import AbsoluteEncoding
from keras_posenc.layers._grid_config import add_grid_arguments
from keras_posenc.layers._renamed import renamed_arguments

_LINE_INTERPOLATIONS = ("linear",)
_GRID_INTERPOLATIONS = ("bilinear", "bicubic")


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments({"initializer": "embeddings_initializer"})
class PositionEmbedding(AbsoluteEncoding):
    """A learned position embedding, as in BERT, GPT-2 and ViT.

    A trainable table holds one vector per position; position `p` is encoded
    by row `p`. On a line (`sequence_length`) the table covers positions
    `0 .. sequence_length - 1` only: a longer sequence (or a `start_index` or
    `positions` reaching past the end) raises an error naming
    `sequence_length` rather than reading outside the table. Where the
    positions are known only when the program runs, a TensorFlow graph
    raises then; compiled code cannot raise (XLA drops run-time checks, a
    JAX trace has none), and there a position outside the table, or a grid
    coordinate outside the grid, reads a row of NaN (and a `start_index`
    that runs past the table, every row), never another position's row.

    On a grid (`grid_shape=(height, width)`, or `(time, height, width)`, as
    ViT, DeiT and timm's `pos_embed`) the table has
    `num_prefix_tokens + prod(grid_shape)` rows: the prefix tokens' rows
    (class, register) first, then one row per grid cell in row-major order,
    so a timm or Hugging Face checkpoint's table loads as it is. Called on
    another grid, the grid rows are resized on the fly, the prefix rows left
    as they are, as timm's `resample_abs_pos_embed` and Hugging Face's
    `interpolate_pos_encoding` do:
    `torch.nn.functional.interpolate(..., align_corners=False)`, bicubic
    with PyTorch's kernel (`a = -0.75`, not `tf.image.resize`'s `-0.5`).
    `antialias=False` gives Hugging Face's numbers, `antialias=True` timm's
    (its default). A grid of the table's own shape reads the table as it is.
    `resized_embeddings(grid_shape)` returns the resized table, to fine-tune
    at a new resolution with a layer of its own.

    Inputs of shape `(batch, height, width, features)` (or with a time axis)
    take their positions from their grid axes, row-major, and come back in
    that shape; token inputs `(batch, sequence, features)` hold the
    `num_prefix_tokens` first, then the grid's cells (the table's grid, or
    the `grid_shape` call argument's). Masks pass through unchanged.

    Args:
        sequence_length: int or None. The number of positions of a line
            table. Exactly one of `sequence_length` and `grid_shape` is set.
            Defaults to `None`.
        embeddings_initializer: str, `keras.initializers.Initializer` or
            `"sinusoidal"`. How the table starts. `"sinusoidal"` starts a
            table from the fixed interleaved sinusoidal encoding of
            Vaswani et al. (on a grid, one block per coordinate, one per
            coordinate, as `SinusoidalPositionEncoding(num_axes=...)`;
            prefix rows from zeros). Defaults to `"glorot_uniform"`.
        merge_mode: str or None. `"add"` adds the embedding to the inputs,
            `"concat"` appends an embedding of width `output_dim` to the
            features, `None` returns the embedding alone, broadcast to the
            batch. Defaults to `"add"`.
        output_dim: int or None. The embedding width for
            `merge_mode="concat"` (required) or `None` (defaults to the input
            width). Must be `None` for `"add"`. Defaults to `None`.
        grid_shape: list or tuple of ints, or None. The grid the table
            covers, two axes or more, such as `(14, 14)` for a ViT at 224
            pixels with patches of 16. Defaults to `None`.
        num_prefix_tokens: int. The number of tokens before those with
            positions (class and register tokens), each with a learned row
            of its own at the top of the table, never resized. Defaults to
            `0`.
        interpolation: str or None. How the table is resized for another
            grid or line: `"bicubic"` or `"bilinear"` on a grid, `"linear"`
            on a line, `None` to refuse with an error. `"auto"` resolves to
            `"bicubic"` for a grid table (as timm and Hugging Face) and to
            `None` for a line table, whose rows past its end stay an error.
            On a line, `"linear"` stretches the table to a sequence longer
            than it (consecutive positions from `0`) and to the `grid_shape`
            call argument. Defaults to `"auto"`.
        antialias: bool. PyTorch's `antialias` when the table shrinks or
            grows: `False` as Hugging Face's `interpolate_pos_encoding`,
            `True` as timm's `resample_abs_pos_embed`. Defaults to `False`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor of shape `(batch, sequence, features)`, or
            `(batch, *grid, features)` for a grid table.
        start_index: int or integer scalar tensor. The position of the first
            element, for cached decoding on a line. Defaults to `0`.
        positions: optional integer tensor of shape `(sequence,)` or
            `(batch, sequence)` (a line) or `(sequence, num_axes)` or
            `(batch, sequence, num_axes)` (coordinates on the table's grid),
            for the tokens after the prefix. Overrides `start_index`: left
            padding, packed sequences.
        grid_shape: optional list of ints or integer scalar tensors: token
            inputs hold the cells of this grid after the prefix; the table is
            resized to it if it differs from the table's.

    Returns:
        A tensor in the layer's compute dtype: the inputs plus the embedding,
        the inputs and the embedding concatenated, or the embedding alone of
        shape `(batch, sequence, output_dim)` (or `(batch, *grid,
        output_dim)`).

    Example:

    >>> layer = PositionEmbedding(
    ...     sequence_length=16, embeddings_initializer="sinusoidal"
    ... )
    >>> encoded = layer(np.zeros((2, 10, 8), "float32"))
    >>> tuple(encoded.shape)
    (2, 10, 8)
    >>> first = keras.ops.convert_to_numpy(encoded[0, 1, :2])
    >>> [round(float(v), 4) for v in first]  # sin(1), cos(1)
    [0.8415, 0.5403]

    A ViT's table for a 4 x 4 grid of patches and a class token, called at a
    6 x 6 grid, then made the table of a new layer to fine-tune at 6 x 6:

    >>> layer = PositionEmbedding(grid_shape=(4, 4), num_prefix_tokens=1)
    >>> tokens = np.zeros((2, 1 + 6 * 6, 8), "float32")  # class token first
    >>> tuple(layer(tokens, grid_shape=(6, 6)).shape)
    (2, 37, 8)
    >>> table = layer.resized_embeddings((6, 6))  # (1 + 36, 8)
    >>> finer = PositionEmbedding(grid_shape=(6, 6), num_prefix_tokens=1)
    >>> finer.build((None, 37, 8))
    >>> _ = finer.embeddings.assign(table)
    >>> tuple(finer(tokens).shape)
    (2, 37, 8)

    References:
        - [Devlin et al., 2018](https://arxiv.org/abs/1810.04805)
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Dosovitskiy et al., 2020 (ViT)](https://arxiv.org/abs/2010.11929)
        - [Touvron et al., 2019 (FixRes)](https://arxiv.org/abs/1906.06423)
    """

    def __init__(
        self,
        sequence_length=None,
        embeddings_initializer="glorot_uniform",
        merge_mode="add",
        output_dim=None,
        grid_shape=None,
        num_prefix_tokens=0,
        interpolation="auto",
        antialias=False,
        **kwargs,
    ):
        if (sequence_length is None) == (grid_shape is None):
            raise ValueError(
                "Pass exactly one of `sequence_length` (a line) and "
                "`grid_shape` (a grid). Received: "
                f"sequence_length={sequence_length!r}, grid_shape={grid_shape!r}"
            )
        if grid_shape is not None:
            if (
                not isinstance(grid_shape, (list, tuple))
                or len(grid_shape) < 2
                or any(keras.ops.is_tensor(size) for size in grid_shape)
            ):
                raise ValueError(
                    "`grid_shape` must be a list or tuple of two or more "
                    "positive integers (use `sequence_length` for a line). "
                    f"Received: grid_shape={grid_shape!r}"
                )
            ops.check_grid_shape(grid_shape)
            grid_shape = tuple(int(size) for size in grid_shape)
        else:
            ops.check_positive_int("sequence_length", sequence_length)
        super().__init__(
            merge_mode=merge_mode,
            output_dim=output_dim,
            num_axes=1 if grid_shape is None else len(grid_shape),
            num_prefix_tokens=num_prefix_tokens,
            **kwargs,
        )
        self.sequence_length = sequence_length
        self.grid_shape = grid_shape
        if embeddings_initializer == "sinusoidal":
            self.embeddings_initializer = embeddings_initializer
        else:
            try:
                self.embeddings_initializer = keras.initializers.get(
                    embeddings_initializer
                )
            except ValueError as error:
                raise ValueError(
                    "`embeddings_initializer` must be a Keras initializer or "
                    "'sinusoidal'. Received: "
                    f"embeddings_initializer={embeddings_initializer!r}"
                ) from error
        if grid_shape is None:
            allowed = _LINE_INTERPOLATIONS
        else:
            allowed = _GRID_INTERPOLATIONS
        if interpolation == "auto":
            interpolation = None if grid_shape is None else "bicubic"
        ops.check_interpolation(interpolation, allowed=allowed)
        self.interpolation = interpolation
        ops.check_bool("antialias", antialias)
        self.antialias = antialias

    @property
    def _table_grid(self):
        """The grid of the rows after the prefix; `(sequence_length,)` on a line."""
        return self.grid_shape or (self.sequence_length,)

    def build(self, input_shape):
        dim = self._encoding_dim(input_shape)
        if self.embeddings_initializer == "sinusoidal":
            initializer = self._sinusoidal_initializer
        else:
            initializer = self.embeddings_initializer
        cells = 1
        for size in self._table_grid:
            cells *= size
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_prefix_tokens + cells, dim),
            initializer=initializer,
        )

    def _sinusoidal_initializer(self, shape, dtype=None):
        """The sinusoidal table of `shape` (prefix rows zero), as a start."""
        _, dim = shape
        positions = ops.grid_positions(self._table_grid)  # (cells, num_axes)
        if self.grid_shape is None:
            positions = positions[:, 0]  # (cells,)
        elif dim % self.num_axes:
            raise ValueError(
                "embeddings_initializer='sinusoidal' on a grid of "
                f"num_axes={self.num_axes} "
                f"needs a width that is a multiple of {self.num_axes}. "
                f"Received a table of shape {tuple(shape)}"
            )
        table = ops.sinusoidal(
            positions, dim, num_axes=self.num_axes
        )  # (cells, dim)
        table = keras.ops.concatenate(
            [keras.ops.zeros((self.num_prefix_tokens, dim), "float32"), table],
            axis=0,
        )  # (prefix + cells, dim)
        return keras.ops.cast(table, dtype or "float32")

    def _grid_rows(self):
        """The table's rows after the prefix: `(cells, dim)`."""
        return self.embeddings[self.num_prefix_tokens :]

    def _encode_prefix(self, dim):
        return self.embeddings[: self.num_prefix_tokens]  # (prefix, dim)

    def _stretches(self, inputs, start_index):
        """Whether consecutive positions on a line read a stretched table."""
        return (
            self.grid_shape is None
            and self.interpolation is not None
            and isinstance(start_index, numbers.Integral)
            and start_index == 0
        )

    def _positions(self, inputs, start_index, positions):
        length = inputs.shape[1]
        if (
            positions is None
            and length is not None
            and isinstance(start_index, numbers.Integral)
            and not (
                self._stretches(inputs, start_index)
                and length > self.sequence_length
            )
        ):
            self._check_range(start_index, start_index + length - 1)
        return super()._positions(inputs, start_index, positions)

    def _encode(self, positions, dim):
        if not _backend.is_integer(positions):
            dtype = keras.backend.standardize_dtype(positions.dtype)
            raise ValueError(
                "PositionEmbedding needs integer `positions`. "
                f"Received positions of dtype {dtype}"
            )
        limits = keras.ops.convert_to_tensor(self._table_grid, positions.dtype)
        if self.grid_shape is None:
            limits = limits[0]
        in_range = (positions >= 0) & (positions < limits)  # (..., seq[, axes])
        if self.grid_shape is not None:
            in_range = keras.ops.all(in_range, axis=-1)  # (..., seq)
        if _backend.static_value(in_range) is not None:
            self._check_positions(positions, in_range)
            return keras.ops.take(
                self._grid_rows(), self._rows(positions), axis=0
            )  # (..., seq, dim)
        # Compiled: one gather of rows clipped into the table; a row read
        # for a position outside it is NaN (and a TensorFlow graph raises).
        rows = self._rows(keras.ops.clip(positions, 0, limits - 1))  # (..., seq)
        embedding = _backend.take_in_range(self._grid_rows(), rows)  # (..., seq, dim)
        return _backend.checked_or_nan(
            embedding, in_range[..., None], self._range_message()
        )

    def _rows(self, positions):
        """The table rows of positions in range: `(...)` from `(...[, axes])`."""
        if self.grid_shape is None:
            return positions
        strides = [1]
        for size in reversed(self.grid_shape[1:]):
            strides.insert(0, strides[0] * size)
        return keras.ops.sum(
            keras.ops.cast(positions, "int32")
            * keras.ops.convert_to_tensor(strides, "int32"),
            axis=-1,
        )  # (..., seq): row-major index

    def _encode_consecutive(self, inputs, start_index, dim):
        # A slice of the table, not a gather of its rows: XLA copies gathered
        # rows to a buffer of their own before adding them, and reads a slice
        # in place.
        positions = self._positions(inputs, start_index, None)  # (seq,)
        length = keras.ops.shape(positions)[0]
        if self._stretches(inputs, start_index):
            static_length = inputs.shape[1]
            if static_length is not None:
                if static_length > self.sequence_length:
                    return self._resized_rows([static_length])
            else:
                # Resized to at least the table's length (exactly the table
                # at that length), then cut: no branch on the length.
                stretched = self._resized_rows(
                    [keras.ops.maximum(length, self.sequence_length)]
                )  # (max(seq, sequence_length), dim)
                return stretched[:length]  # (seq, dim)
        start = keras.ops.cast(start_index, "int32")
        in_range = (positions >= 0) & (positions < self.sequence_length)  # (seq,)
        if _backend.static_value(in_range) is not None:
            self._check_positions(positions, in_range)
            return keras.ops.slice(
                self._grid_rows(), (start, 0), (length, dim)
            )  # (seq, dim)
        # Compiled: the slice starts where it fits in the table, so one
        # position outside it moves every row: all are NaN then (and a
        # TensorFlow graph raises).
        start = keras.ops.clip(
            start, 0, keras.ops.maximum(self.sequence_length - length, 0)
        )
        rows = keras.ops.slice(self._grid_rows(), (start, 0), (length, dim))
        return _backend.checked_or_nan(
            rows, keras.ops.all(in_range), self._range_message()
        )  # (seq, dim)

    def _default_grid_shape(self, inputs):
        return list(self.grid_shape)

    def _encode_grid(self, grid_shape, dim):
        table_grid = list(self._table_grid)
        static = [_backend.static_value(size) for size in grid_shape]
        if None not in static:
            if [int(size) for size in static] == table_grid:
                return self._grid_rows()  # (cells, dim)
            self._check_interpolation([int(size) for size in static])
            return self._resized_rows(grid_shape)  # (new cells, dim)
        if self.interpolation is None:
            same = keras.ops.all(
                keras.ops.stack(
                    [
                        keras.ops.equal(keras.ops.cast(size, "int32"), table_size)
                        for size, table_size in zip(grid_shape, table_grid)
                    ]
                )
            )
            return _backend.checked(
                self._grid_rows(), same, self._refusal_message("another grid")
            )
        # A grid known only when the graph runs is always resized: to the
        # table's own grid that is exactly the table (weights 1 and 0).
        return self._resized_rows(grid_shape)  # (cells, dim)

    def _resized_rows(self, grid_shape):
        """The table's rows after the prefix, resized to `grid_shape`."""
        return ops.resize_grid(
            self._grid_rows(),
            self._table_grid,
            grid_shape,
            self.interpolation,
            self.antialias,
        )  # (prod(grid_shape), dim)

    def _refusal_message(self, new_grid):
        name = "grid_shape" if self.grid_shape is not None else "sequence_length"
        return (
            f"PositionEmbedding's table covers {name}="
            f"{self.grid_shape or self.sequence_length} and interpolation=None "
            f"does not resize it; it was called on {new_grid}. Pass "
            "interpolation='bicubic' (or 'bilinear' for a grid, 'linear' for "
            "a line) to resize it on the fly, or build a layer for the new "
            "grid from `resized_embeddings`."
        )

    def _check_interpolation(self, grid_shape):
        if self.interpolation is None:
            raise ValueError(
                self._refusal_message(f"grid_shape={tuple(grid_shape)}")
            )

    def resized_embeddings(self, grid_shape):
        """The table resized to `grid_shape`: prefix rows, then the grid's.

        The rows for a new resolution, to fine-tune there: build a layer with
        `grid_shape` (or `sequence_length`) set to the new size and the same
        `num_prefix_tokens`, and assign them to its `embeddings` (see the
        class example). The prefix rows are copied as they are; the grid rows
        are resized with the layer's `interpolation` and `antialias`.

        Args:
            grid_shape: list or tuple of ints, one per axis of the table
                (`(length,)` for a line table).

        Returns:
            A float32 tensor of shape
            `(num_prefix_tokens + prod(grid_shape), width)`.
        """
        ops.check_grid_shape(grid_shape, num_axes=self.num_axes)
        if list(grid_shape) == list(self._table_grid):
            rows = keras.ops.cast(self._grid_rows(), "float32")
        else:
            self._check_interpolation(grid_shape)
            rows = self._resized_rows(list(grid_shape))
        return keras.ops.concatenate(
            [keras.ops.cast(self._encode_prefix(None), "float32"), rows], axis=0
        )  # (prefix + cells, width)

    def _check_positions(self, positions, in_range):
        """Fail, naming the positions, where `in_range` (known) is not all true.

        Args:
            positions: integer tensor of shape `(...)` (a line) or
                `(..., num_axes)` (a grid), its value known.
            in_range: bool tensor of shape `(...)`, its value known.
        """
        if np.all(_backend.static_value(in_range)):
            return
        values = _backend.static_value(positions)
        if values is None:
            raise ValueError(self._range_message())
        if self.grid_shape is not None:
            coordinates = np.reshape(values, (-1, self.num_axes))
            raise ValueError(
                f"{self._range_message()} Received coordinates from "
                f"{coordinates.min(0).tolist()} to "
                f"{coordinates.max(0).tolist()}"
            )
        self._check_range(int(values.min()), int(values.max()))

    def _range_message(self):
        if self.grid_shape is not None:
            return (
                "PositionEmbedding holds coordinates 0 to "
                f"{tuple(size - 1 for size in self.grid_shape)} "
                f"(grid_shape={self.grid_shape}); a coordinate outside that "
                "range was requested."
            )
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
        if self.embeddings_initializer == "sinusoidal":
            initializer = self.embeddings_initializer
        else:
            initializer = keras.initializers.serialize(self.embeddings_initializer)
        config.update(
            {
                "sequence_length": self.sequence_length,
                "embeddings_initializer": initializer,
            }
        )
        return add_grid_arguments(
            config,
            {
                "grid_shape": (
                    None if self.grid_shape is None else list(self.grid_shape)
                ),
                "interpolation": self.interpolation,
                "antialias": self.antialias,
            },
            {"grid_shape": None, "interpolation": None, "antialias": False},
            on_a_grid=self.grid_shape is not None,
        )
