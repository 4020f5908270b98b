"""The checks of `PositionalMultiHeadAttention`'s arguments and inputs.

Each raises a `ValueError` that names the argument, says what was expected
and what was received, where it is known before the attention runs.
"""

import numbers

import keras
import numpy as np

from keras_posenc import ops
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.ops import _checks

# What `qk_norm` takes: how the queries and keys are normalised.
QK_NORMS = ("head", "head_unscaled", "projection")


def describe(position):
    """The scheme, its axes and prefix tokens, for messages."""
    if position is None:
        return "no `position`"
    if position.takes_adjacency:
        return f"{type(position).__name__}, a position on graphs"
    return (
        f"{type(position).__name__}(num_axes={position.num_axes}, "
        f"num_prefix_tokens={position.num_prefix_tokens})"
    )


def on_a_line(position):
    """Whether `position` takes positions on one line (no grid, prefix, graph)."""
    return not (
        position.num_axes > 1 or position.num_prefix_tokens or position.takes_adjacency
    )


def check_qk_norm(qk_norm):
    if qk_norm is not None and qk_norm not in QK_NORMS:
        raise ValueError(
            "`qk_norm` must be None or one of "
            f"{', '.join(map(repr, QK_NORMS))}. Received: qk_norm={qk_norm!r}"
        )


def _sequence_axis_only(attention_axes):
    # Axis 1 (or -2) of the projected (batch, seq, heads, dim).
    return attention_axes is None or tuple(attention_axes) in ((1,), (-2,))


def check_num_key_value_heads(num_key_value_heads, num_heads, attention_axes):
    """`num_key_value_heads` as an int (`num_heads` for None), once it fits."""
    if num_key_value_heads is None:
        num_key_value_heads = num_heads
    if (
        isinstance(num_key_value_heads, bool)
        or not isinstance(num_key_value_heads, numbers.Integral)
        or num_key_value_heads < 1
        or num_heads % num_key_value_heads
    ):
        raise ValueError(
            "`num_key_value_heads` must be a positive integer dividing "
            f"`num_heads` ({num_heads}), or None for `num_heads`. "
            f"Received: num_key_value_heads={num_key_value_heads!r}"
        )
    if num_key_value_heads != num_heads and not _sequence_axis_only(attention_axes):
        raise ValueError(
            "Grouped heads (`num_key_value_heads` below `num_heads`) "
            "need attention over the sequence axis only. Received: "
            f"attention_axes={attention_axes} with "
            f"num_key_value_heads={num_key_value_heads}"
        )
    return int(num_key_value_heads)


def check_position(position, attention_axes, flash_attention, sliding_window):
    """A `ValueError` unless `position` is None or a scheme this attention takes."""
    if position is None:
        return
    if not isinstance(position, AttentionPosition):
        raise ValueError(
            "`position` must be None or a position scheme, a layer "
            "subclassing keras_posenc.AttentionPosition. Received: "
            f"position={position!r}"
        )
    if not _sequence_axis_only(attention_axes):
        raise ValueError(
            "A `position` needs attention over the sequence axis "
            f"only. Received: attention_axes={attention_axes}"
        )
    if flash_attention and {"logits_bias", "value_term"} & position.contributions:
        raise ValueError(
            f"{type(position).__name__} adds to the logits or the "
            "values, which flash attention does not expose: it "
            "takes a `position` that changes the queries and keys "
            "only (RotaryEmbedding, XPosEmbedding, "
            "AttentionTemperature). Received: flash_attention=True "
            f"with position={type(position).__name__}"
        )
    if sliding_window is not None and not on_a_line(position):
        raise ValueError(
            "A sliding window compares positions on a line: it needs "
            "a `position` of one axis and no prefix tokens. Received: "
            f"sliding_window={sliding_window} with {describe(position)}"
        )


def check_sequence_inputs(reason, **shapes):
    """A `ValueError` unless each of `shapes` is `(batch, sequence, features)`."""
    for name, shape in shapes.items():
        if len(shape) != 3:
            raise ValueError(
                f"With {reason}, PositionalMultiHeadAttention takes inputs "
                "of shape (batch, sequence, features). Received: "
                f"{name}={tuple(shape)}"
            )


def check_int32(positions, name):
    """A `ValueError` naming the first of integer `positions` past int32."""
    info = np.iinfo("int32")
    outside = (positions < info.min) | (positions > info.max)
    if outside.any():
        index = tuple(int(i) for i in np.argwhere(outside)[0])
        raise ValueError(
            f"`{name}` must fit in int32, from {info.min} to {info.max}: "
            f"positions are computed in int32. Received: {name}"
            f"[{', '.join(map(str, index))}]={positions[index]} "
            f"(dtype {positions.dtype})"
        )


def check_before_conversion(arguments):
    """The call's arguments that Keras' conversion would hide, checked first.

    Keras converts NumPy arguments before `call` sees them, an int64
    position past int32 wrapping on JAX, and text failing with its own
    message.
    """
    for name in ("query_positions", "key_positions"):
        given = arguments.get(name)
        if isinstance(given, (np.ndarray, list, tuple)):
            given = np.asarray(given)
            if given.dtype.kind in "iu" and given.size:
                check_int32(given, name)
    for name in ("attention_mask", "query_mask", "value_mask", "key_mask"):
        _checks.check_not_text(name, arguments.get(name), "bools (or 0 and 1)")


def check_batch_sizes(**tensors):
    """A `ValueError` naming the inputs whose known batch sizes differ."""
    shapes = {
        name: tuple(tensor.shape) for name, tensor in tensors.items() if tensor is not None
    }
    sizes = {shape[0] for shape in shapes.values() if shape and shape[0] is not None}
    if len(sizes) > 1:
        given = ", ".join(f"{name} of shape {shape}" for name, shape in shapes.items())
        raise ValueError(
            "`query`, `value` and `key` must have the same batch size, one "
            f"sequence of keys per sequence of queries. Received: {given}"
        )


def check_features(sizes, query, value, key):
    """A `ValueError` naming the input whose features are not `sizes`, those built on."""
    for name, inputs, features in zip(("query", "value", "key"), (query, value, key), sizes):
        if inputs is None:
            name, inputs = "value", value  # the keys are the values
        if None not in (features, inputs.shape[-1]) and inputs.shape[-1] != features:
            raise ValueError(
                f"`{name}` must have {features} features, those its "
                "projection was built for by the attention's first call. "
                f"Received: {name} of shape {tuple(inputs.shape)}"
            )


def check_mask(name, mask, inputs, axis_name, meaning):
    """A `ValueError` unless `mask` is `(batch, length)` of `inputs`, where known."""
    _checks.check_not_text(name, mask, "bools (or 0 and 1)")
    expected = tuple(inputs.shape[:2])
    _checks.check_mask_shape(
        name, mask.shape, expected, f"(batch, {axis_name}), here {expected}, True for {meaning}"
    )


def check_attention_mask(attention_mask, query, keys_length):
    """A `ValueError` unless `attention_mask` fits the queries and keys."""
    _checks.check_not_text("attention_mask", attention_mask, "bools (or 0 and 1)")
    shape = tuple(attention_mask.shape)
    batch_size, queries = query.shape[0], query.shape[1]
    if len(shape) not in (2, 3, 4) or (
        None not in (queries, shape[-2]) and shape[-2] not in (queries, 1)
    ) or (None not in (keys_length, shape[-1]) and shape[-1] != keys_length) or (
        len(shape) > 2 and None not in (batch_size, shape[0])
        and shape[0] not in (batch_size, 1)
    ):
        raise ValueError(
            "`attention_mask` must have shape (query, key), (batch, query, "
            "key) or (batch, heads or 1, query, key), here "
            f"batch={batch_size}, query={queries} and key={keys_length}, "
            "True where a query may attend to a key; for a padding mask of "
            "the keys, (batch, key), pass `value_mask` or mask the inputs. "
            f"Received: attention_mask of shape {shape}"
        )


def check_cache_index(cache, cache_update_index):
    """A `ValueError` for a `cache_update_index` without a `cache`."""
    if cache is None and cache_update_index is not None:
        raise ValueError(
            "`cache_update_index` says where to write in a `cache`: it "
            "needs one. Received: cache=None with "
            f"cache_update_index={cache_update_index!r}"
        )


def check_key_masks(keys, value_mask, key_mask):
    """A `ValueError` naming `value_mask` or `key_mask` unless `(batch, key)`."""
    for name, mask in (("value_mask", value_mask), ("key_mask", key_mask)):
        if mask is not None:
            check_mask(
                name, keras.ops.convert_to_tensor(mask), keys, "key", "the keys attended to"
            )


def check_call(sizes, query, value, key, value_mask, key_mask, cache, cache_update_index):
    """The checks of a call's inputs that do not concern positions.

    Args:
        sizes: the features the projections were built for, `(query,
            value, key)`, or `None`s before the first build.
        query, value, key, value_mask, key_mask, cache, cache_update_index:
            the call's arguments.

    Raises:
        ValueError: naming the argument whose batch size, features or mask
            does not fit, or a `cache_update_index` without a `cache`.
    """
    check_batch_sizes(query=query, value=value, key=key)
    check_features(sizes, query, value, key)
    if cache is None:
        check_key_masks(value if key is None else key, value_mask, key_mask)
    check_cache_index(cache, cache_update_index)


def check_causal(position, use_causal_mask):
    """A `ValueError` for a causal mask where positions are not on a line."""
    if use_causal_mask and position is not None and not on_a_line(position):
        raise ValueError(
            "A causal mask lets a query attend to keys at its position or "
            "before: it needs positions of one axis and no prefix tokens. "
            f"Received: use_causal_mask=True with {describe(position)}"
        )


def looks_like_grid(positions, length):
    """Whether refused one-axis positions have the shape of grid positions."""
    shape = positions.shape if hasattr(positions, "shape") else np.shape(positions)
    shape = tuple(shape)
    if len(shape) == 3:
        return shape[-1] not in (1, None)
    return len(shape) == 2 and length is not None and (
        shape[0] == length and shape[-1] != length
    )


def check_graph(
    position, adjacency, query, value, key, query_positions, key_positions, cache
):
    """Whether this call is on a graph; a `ValueError` for a wrong mix."""
    on_graph = position is not None and position.takes_adjacency
    if adjacency is None:
        if on_graph:
            raise ValueError(
                f"{describe(position)} reads the graph: pass `adjacency` "
                "of shape (batch, nodes, nodes). Received: adjacency=None"
            )
        return False
    if not hasattr(adjacency, "shape"):
        adjacency = keras.ops.convert_to_tensor(adjacency)
    shape = tuple(adjacency.shape)
    if not on_graph:
        raise ValueError(
            "`adjacency` is read by a position on graphs, such as "
            f"ShortestPathBias; this attention has {describe(position)}. "
            f"Received: adjacency of shape {shape}"
        )
    for name, given in (
        ("query_positions", query_positions),
        ("key_positions", key_positions),
        ("cache", cache),
    ):
        if given is not None:
            raise ValueError(
                f"{describe(position)} attends over the nodes of a graph, "
                f"given by `adjacency`: it takes no `{name}`. Received: "
                f"{name}={given!r}"
            )
    keys = value if key is None else key
    if None not in (query.shape[1], keys.shape[1]) and (
        query.shape[1] != keys.shape[1]
    ):
        raise ValueError(
            f"{describe(position)} attends from each node of a graph to "
            "each: queries and values must be the same nodes. Received: "
            f"query of shape {tuple(query.shape)} and value of shape "
            f"{tuple(keys.shape)}"
        )
    ops.check_adjacency_shape(shape, num_nodes=query.shape[1])
    if None not in (shape[0], query.shape[0]) and shape[0] not in (query.shape[0], 1):
        raise ValueError(
            "`adjacency` must hold one graph per sequence of queries, or "
            f"one for all: batch {query.shape[0]} or 1. Received: "
            f"adjacency of shape {shape} for query of shape "
            f"{tuple(query.shape)}"
        )
    return True
