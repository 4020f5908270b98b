import math
import numbers

import keras

from keras_posenc import ops
from keras_posenc.ops import _backend
from keras_posenc.layers._schemes import HeadBias
from keras_posenc.layers._schemes import read_embeddings_initializer

# Rows of the table after the grid's, for prefix tokens, in BEiT's order.
_PREFIX_TO_GRID, _GRID_TO_PREFIX, _PREFIX_TO_PREFIX = 0, 1, 2
_PREFIX_ENTRIES = 3


@keras.saving.register_keras_serializable(package="keras_posenc")
class GridRelativePositionBias(HeadBias):
    """Swin's relative position bias on a grid: a learned bias per head and offset.

    The logit of query `i` and key `j` on a 2-D or 3-D grid (image patches,
    video tubelets) gets a learned scalar per head, read from a table with a
    row for each relative position in a window of `grid_shape` `(w_1, ...,
    w_n)`: `2 w_a - 1` offsets along each axis `a`, `prod(2 w_a - 1)` rows
    in all (Liu et al. 2021, section 3.2, equation 4). Row `sum_a (i_a - j_a
    + w_a - 1) * stride_a`, with row-major strides over the `2 w_a - 1`
    (Swin's `relative_position_index`, `keras_posenc.ops.
    grid_relative_position_index`), so a table laid out as Swin's or timm's
    `relative_position_bias_table` of shape `(rows, heads)` loads as it is.
    Offsets beyond `w_a - 1` are clipped per axis, so that the layer also
    serves grids larger than its window, whose far tokens share the edge
    rows. One axis works too (a 1-D window of `2 w - 1` clipped distances).

    With `num_prefix_tokens` > 0 (class or register tokens before the grid,
    which have no grid position) the table has three more rows, as BEiT's
    (Bao et al. 2022, section 2.3 and its code): after the grid's rows, the
    bias of a prefix query to a grid key, of a grid query to a prefix key,
    and of a prefix query to a prefix key, shared by all prefix tokens; the
    bias has rows and columns for the prefix tokens first.

    The bias is computed from the query and key positions, int32 of shape
    `(sequence, num_axes)` or `(batch, sequence, num_axes)`, such as
    `keras_posenc.ops.grid_positions(grid_shape)`, for the tokens after the
    prefix ones. Give the layer as the `position` of
    `PositionalMultiHeadAttention` with these as `query_positions` and
    `key_positions`, or call it on them to get the bias.

    The table, weight `"embeddings"`, is made when the attention builds, or
    on the first call of the layer on its own, and kept and read in float32
    whatever the dtype policy, as is the bias, which joins the float32
    logits. A table trained at one window serves another after
    `resized_embeddings`, bicubic per head over the `2 w_a - 1` offsets, as
    Swin's own code fine-tunes checkpoints at new windows (below).

    Args:
        num_heads: int. The attention's number of heads, one table column
            each.
        grid_shape: list or tuple of positive ints. The window `(w_1, ...,
            w_n)`, one size per axis; its length is `num_axes`.
        num_prefix_tokens: int. The tokens before the grid, without a
            position, that get BEiT's three learned biases. Defaults to `0`.
        embeddings_initializer: str or `keras.initializers.Initializer`. How
            the table starts. BEiT starts from zeros; Swin from
            `keras.initializers.TruncatedNormal(stddev=0.02)`. Defaults to
            `"zeros"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        query_positions: integer tensor of shape `(batch, query, num_axes)`,
            or `(query, num_axes)` for positions shared by the batch; for one
            axis also `(batch, query)` or `(query,)`.
        key_positions: integer tensor of shape `(batch, key, num_axes)`, or
            `(key, num_axes)`, likewise.

    Returns:
        The bias to add to the attention logits: a float32 tensor of shape
        `(batch or 1, num_heads, num_prefix_tokens + query,
        num_prefix_tokens + key)`, batch 1 when both positions are shared.

    Example:

    >>> swin = GridRelativePositionBias(num_heads=2, grid_shape=(3, 3))
    >>> positions = ops.grid_positions((3, 3))
    >>> tuple(swin(positions, positions).shape)
    (1, 2, 9, 9)
    >>> tuple(swin.embeddings.shape)  # (2 * 3 - 1) ** 2 offsets
    (25, 2)
    >>> beit = GridRelativePositionBias(2, (3, 3), num_prefix_tokens=1)
    >>> tuple(beit(positions, positions).shape)  # a class token first
    (1, 2, 10, 10)

    Fine-tuning at a larger window, from the trained table:

    >>> larger = GridRelativePositionBias(num_heads=2, grid_shape=(5, 5))
    >>> larger.build()
    >>> _ = larger.embeddings.assign(swin.resized_embeddings((5, 5)))
    >>> tuple(larger.embeddings.shape)
    (81, 2)

    References:
        - [Liu et al., 2021](https://arxiv.org/abs/2103.14030)
        - [Bao et al., 2022](https://arxiv.org/abs/2106.08254)
    """

    def __init__(
        self,
        num_heads,
        grid_shape,
        num_prefix_tokens=0,
        embeddings_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("num_heads", num_heads)
        _check_window(grid_shape, "grid_shape")
        if (
            not isinstance(num_prefix_tokens, numbers.Integral)
            or isinstance(num_prefix_tokens, bool)
            or num_prefix_tokens < 0
        ):
            raise ValueError(
                "`num_prefix_tokens` must be a non-negative integer. "
                f"Received: num_prefix_tokens={num_prefix_tokens!r}"
            )
        initializer = read_embeddings_initializer(embeddings_initializer)
        self.num_heads = num_heads
        self.grid_shape = tuple(int(size) for size in grid_shape)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.embeddings_initializer = initializer
        self.num_axes = len(self.grid_shape)

    @property
    def _grid_entries(self):
        """The table's rows for relative positions on the grid."""
        return math.prod(2 * size - 1 for size in self.grid_shape)

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        prefix_entries = _PREFIX_ENTRIES if self.num_prefix_tokens else 0
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self._grid_entries + prefix_entries, self.num_heads),
            initializer=self.embeddings_initializer,
            dtype="float32",
            # Read in float32 even inside a mixed precision attention.
            autocast=False,
        )

    def logits_bias(self, query, key, context):
        if context.grid_shape is not None:
            rows = _grid_rows(context.grid_shape, self.grid_shape)  # (1, query, key)
        else:
            distance = ops.relative_position(
                context.query_positions, context.key_positions, self.num_axes
            )  # (batch or 1, query, key[, num_axes]): key - query
            if self.num_axes == 1:
                distance = keras.ops.expand_dims(
                    distance, -1
                )  # (batch or 1, query, key, 1)
            rows = ops.grid_relative_position_index(
                distance, self.grid_shape
            )  # (batch or 1, query, key)
        if self.num_prefix_tokens:
            rows = self._with_prefix_rows(rows)  # (batch or 1, query, key)
        # Inside attention, one row of indices per batch element (as T5's
        # bias): the gather then makes the bias of the logits' own shape,
        # which XLA computes inside the addition to the logits, reading
        # contiguous rows of heads. A bias shared by the batch would be
        # written once and added twice, and its sum with the logits
        # written again for the softmax's maximum.
        if query is not None:
            rows = keras.ops.broadcast_to(
                rows, (keras.ops.shape(query)[0],) + tuple(keras.ops.shape(rows)[1:])
            )  # (batch, query, key)
        table = keras.ops.cast(self.embeddings, "float32")  # (rows, heads)
        return keras.ops.transpose(
            _backend.take_in_range(table, rows), [0, 3, 1, 2]
        )  # (batch or 1, heads, query, key)

    def score_bias(self, query, key, context):
        if self.num_prefix_tokens:
            # BEiT's rows of the prefix tokens: the whole bias's alone.
            return None
        table = keras.ops.cast(self.embeddings, "float32")  # (rows, heads)

        def bias(batch, head, query_index, key_index):
            query_position = context.query_position_at(batch, query_index)
            key_position = context.key_position_at(batch, key_index)
            if self.num_axes == 1:
                query_position, key_position = (query_position,), (key_position,)
            distance = tuple(
                [keys - queries for queries, keys in zip(query_position, key_position)]
            )  # key - query, per axis
            rows = ops.grid_relative_position_index(distance, self.grid_shape)
            return ops.table_at(table, rows, head)

        return bias

    def _with_prefix_rows(self, rows):
        """Grid rows `(b, q, k)` with BEiT's rows for the prefix tokens first."""
        prefix = self.num_prefix_tokens
        first = self._grid_entries
        rows = keras.ops.pad(
            rows, [[0, 0], [prefix, 0], [prefix, 0]]
        )  # (b, P + q, P + k)
        _, queries, keys = keras.ops.shape(rows)
        prefix_query = (
            keras.ops.arange(queries, dtype="int32")[:, None] < prefix
        )  # (P + q, 1)
        prefix_key = (
            keras.ops.arange(keys, dtype="int32")[None] < prefix
        )  # (1, P + k)
        return keras.ops.where(
            prefix_query & prefix_key,
            first + _PREFIX_TO_PREFIX,
            keras.ops.where(
                prefix_query,
                first + _PREFIX_TO_GRID,
                keras.ops.where(prefix_key, first + _GRID_TO_PREFIX, rows),
            ),
        )  # (b, P + q, P + k)

    def resized_embeddings(self, grid_shape, interpolation="bicubic", antialias=False):
        """The table resampled for a window of `grid_shape`, in float32.

        Each head's biases over the `2 w_a - 1` offsets per axis are
        resampled to `2 w'_a - 1` with `keras_posenc.ops.resize_grid`
        (PyTorch's `interpolate(..., align_corners=False)`): for two axes
        and `"bicubic"`, Swin's own code for fine-tuning a checkpoint at a
        new window, and timm's `resize_rel_pos_bias_table_simple` (timm's
        `resize_rel_pos_bias_table` follows BEiT's geometric spacing
        instead); for three axes, cubic along each. The prefix tokens' rows
        are kept as they are. Assign the result to the `embeddings` of a
        layer built with the new `grid_shape` (see the class example).

        Args:
            grid_shape: list or tuple of positive ints. The new window, as
                many sizes as `num_axes`.
            interpolation: `"bicubic"`, `"bilinear"` or `"linear"`.
                Defaults to `"bicubic"`.
            antialias: bool. PyTorch's `antialias=True`, for shrinking.
                Defaults to `False`.

        Returns:
            A float32 tensor of shape `(prod(2 w'_a - 1) + prefix rows,
            num_heads)`.
        """
        _check_window(grid_shape, "grid_shape", self.num_axes)
        ops.check_interpolation(interpolation, allow_none=False)
        ops.check_bool("antialias", antialias)
        if not self.built:
            raise ValueError(
                "The table is made when the layer builds: build it, or call "
                "it, before resizing it."
            )
        offsets = [2 * size - 1 for size in self.grid_shape]
        new_offsets = [2 * size - 1 for size in grid_shape]
        resized = ops.resize_grid(
            self.embeddings[: self._grid_entries],
            offsets,
            new_offsets,
            interpolation,
            antialias,
        )  # (prod(new_offsets), heads)
        return keras.ops.concatenate(
            [resized, self.embeddings[self._grid_entries :]], axis=0
        )  # (new rows, heads)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "grid_shape": list(self.grid_shape),
                "num_prefix_tokens": self.num_prefix_tokens,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config


def _grid_rows(grid_shape, window):
    """`grid_relative_position_index` of every pair of cells of `grid_shape`.

    The queries and keys both the grid's cells, row-major: the rows come
    from each axis' coordinates alone, which XLA computes inside the gather
    that reads them, where rows from position tensors are read from memory
    there, once per logit.

    Returns:
        An int32 tensor of shape `(1, cells, cells)`.
    """
    num_axes = len(grid_shape)
    rows = 0
    for axis, (size, width) in enumerate(zip(grid_shape, window)):
        coordinate = keras.ops.arange(size, dtype="int32")
        query_shape = [1] * (2 * num_axes)
        query_shape[axis] = size
        key_shape = [1] * (2 * num_axes)
        key_shape[num_axes + axis] = size
        # Swin's `coords_q - coords_k`, clipped to the window and shifted to
        # start from 0, as `ops.grid_relative_position_index` reads it.
        shifted = keras.ops.clip(
            keras.ops.reshape(coordinate, query_shape)
            - keras.ops.reshape(coordinate, key_shape),
            1 - width,
            width - 1,
        ) + (width - 1)  # (g_1 or 1, ..., g_n or 1) twice
        stride = math.prod(2 * later - 1 for later in window[axis + 1 :])
        rows = rows + shifted * stride  # (g_1, ..., g_n) for queries, then keys
    cells = math.prod(grid_shape)
    return keras.ops.reshape(rows, (1, cells, cells))  # (1, query, key)


def _check_window(grid_shape, name, num_axes=None):
    """A window's sizes: Python ints, as a config holds them."""
    ops.check_grid_shape(grid_shape, name, num_axes)
    if any(keras.ops.is_tensor(size) for size in grid_shape):
        raise ValueError(
            f"`{name}` must be a list or tuple of positive integers, not "
            f"tensors. Received: {name}={grid_shape!r}"
        )
