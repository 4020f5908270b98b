"""The positions of `PositionalMultiHeadAttention`'s queries and keys.

Read from the call's `query_positions` and `key_positions`, or its
`grid_shape`, or their defaults, as the int32 tensors its scheme reads.
"""

import functools

import keras

from keras_posenc import ops
from keras_posenc.layers._attention_checks import check_causal
from keras_posenc.layers._attention_checks import check_graph
from keras_posenc.layers._attention_checks import describe
from keras_posenc.layers._attention_checks import looks_like_grid
from keras_posenc.layers._attention_checks import on_a_line
from keras_posenc.layers.attention_position import AttentionContext


def positions(position, given, inputs, name, past_int32, start_index=0):
    """`given` as int32 `(batch or 1, length[, num_axes])`, or the default.

    `length` counts the tokens of `inputs` after the position's prefix
    tokens; the default on one axis is `start_index + 0, 1, ...`. Given
    positions append to the list `past_int32` whether they hold a value
    past int32 (`ops.past_int32`), read before the cast would wrap it.
    """
    num_axes = 1 if position is None else position.num_axes
    num_prefix_tokens = 0 if position is None else position.num_prefix_tokens
    length = inputs.shape[1]
    if length is not None:
        if length < num_prefix_tokens:
            raise ValueError(
                f"Inputs must hold at least the {num_prefix_tokens} prefix "
                f"tokens of {describe(position)}. Received: inputs of "
                f"shape {tuple(inputs.shape)}"
            )
        length -= num_prefix_tokens
    if given is None:
        if num_axes > 1:
            raise ValueError(
                f"`{name}` has no default for {describe(position)}: pass "
                f"the grid's positions, e.g. `{name}="
                "keras_posenc.ops.grid_positions((h, w))` for an h x w "
                f"grid. Received: {name}=None"
            )
        return ops.position_ids(
            keras.ops.shape(inputs)[1] - num_prefix_tokens, start_index
        )[None]  # (1, length)
    try:
        read = ops.read_positions(
            given,
            num_axes,
            length=length,
            batch_size=inputs.shape[0],
            name=name,
            integer=True,
        )  # ([batch,] length[, num_axes])
    except ValueError as error:
        if num_axes == 1 and looks_like_grid(given, length):
            scheme = (
                "PositionalMultiHeadAttention without a `position`"
                if position is None
                else type(position).__name__
            )
            raise ValueError(
                f"{error}. {scheme} takes positions of one axis "
                "(num_axes=1); grid positions need a scheme of as many "
                "axes as they have, such as GridRelativePositionBias."
            ) from None
        raise
    past_int32.append(ops.past_int32(read))
    read = keras.ops.cast(read, "int32")
    if len(read.shape) == (1 if num_axes == 1 else 2):
        read = read[None]
    return read  # (batch or 1, length[, num_axes])


def checked(position, query, value, key, positions, cache, adjacency, grid_shape, causal):
    """A call's positions, its grid's where `grid_shape` is given, checked.

    Args:
        positions: the call's `(query_positions, key_positions)`.
        causal: the call's `use_causal_mask`.

    Returns:
        `(query_positions, key_positions)`, and whether the scheme reads
        `adjacency`.

    Raises:
        ValueError: when the grid, the graph or the causal mask does not fit
            the scheme.
    """
    query_positions, key_positions = positions
    if grid_shape is not None:
        query_positions, key_positions = grid_positions(
            position, grid_shape, query_positions, key_positions, adjacency
        )
    on_graph = check_graph(
        position, adjacency, query, value, key, query_positions, key_positions, cache
    )
    check_causal(position, causal)
    return (query_positions, key_positions), on_graph


def grid_positions(position, grid_shape, query_positions, key_positions, adjacency):
    """The cells of `grid_shape`, row-major, as the queries' and keys' positions."""
    for name, given in (
        ("query_positions", query_positions),
        ("key_positions", key_positions),
        ("adjacency", adjacency),
    ):
        if given is not None:
            raise ValueError(
                "`grid_shape` gives the queries and keys the positions of "
                f"its cells: pass `grid_shape` or `{name}`, not both. "
                f"Received: grid_shape={grid_shape!r} and {name} as well"
            )
    num_axes = 1 if position is None else position.num_axes
    if not isinstance(grid_shape, (list, tuple)) or len(grid_shape) != num_axes:
        raise ValueError(
            f"`grid_shape` needs one size per axis that "
            f"{describe(position)} reads ({num_axes}): for a grid of "
            "h x w cells, pass a scheme of `num_axes=2`, such as "
            "RotaryEmbedding(num_axes=2). Received: "
            f"grid_shape={grid_shape!r}"
        )
    ops.check_grid_shape(grid_shape, num_axes=num_axes)
    cells = ops.grid_positions(grid_shape)  # (cells, num_axes)
    if num_axes == 1:
        cells = cells[:, 0]  # (cells,)
    return cells, cells


def nan_past_int32(output, past_int32):
    """`output`, NaN where `past_int32` (`positions`' flags) says a position wrapped.

    Positions past int32 are known there only in compiled code, which
    cannot raise: the output shows them as NaN rather than the attention
    at their int32 wrap.
    """
    past_int32 = [past for past in past_int32 if past is not None]
    if not past_int32:
        return output
    return keras.ops.where(
        functools.reduce(keras.ops.logical_or, past_int32),
        keras.ops.cast(float("nan"), output.dtype),
        output,
    )


def context(
    position,
    query,
    keys,
    query_positions,
    key_positions,
    *,
    start_index,
    adjacency,
    causal,
    cache,
    grid_shape,
    projections,
):
    """The call's `AttentionContext`, and the flags of positions past int32.

    Args:
        position: the attention's `AttentionPosition`, or None.
        query: tensor of shape `(batch, query, features)`.
        keys: tensor of shape `(batch, key, ...)`: the keys, or a cache's
            slots.
        query_positions: the positions given, or None.
        key_positions: the positions given, or None.
        start_index: the default queries' first position.
        adjacency: None, or the checked graph of a position on graphs.
        causal: bool. Whether the mask is causal.
        cache: None, or the call's checked `AttentionCache`.
        grid_shape: None, or the grid of the queries and keys.
        projections: `(query, key)`, the attention's projections.

    Returns:
        `(context, past_int32)`: the context, and the flags for
        `nan_past_int32`.
    """
    past_int32 = []
    defaults = query_positions is None and key_positions is None
    if adjacency is None:
        query_positions = positions(
            position, query_positions, query, "query_positions", past_int32, start_index
        )  # (batch or 1, query[, num_axes])
        key_positions = positions(
            position, key_positions, keys, "key_positions", past_int32
        )  # (batch or 1, key[, num_axes])
    return AttentionContext(
        query_positions=query_positions,
        key_positions=key_positions,
        adjacency=adjacency,
        causal=causal,
        _cache=cache,
        project_query=projections[0],
        project_key=projections[1],
        # The defaults on one axis, 0 .. length - 1 for queries and keys,
        # whose structure a scheme may use for speed.
        consecutive=(
            defaults
            and adjacency is None
            and cache is None
            and (position is None or on_a_line(position))
        ),
        grid_shape=None if grid_shape is None else tuple(int(size) for size in grid_shape),
    ), past_int32
