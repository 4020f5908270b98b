import functools
import math
import numbers
import warnings

import keras
import numpy as np

from keras_posenc import hf_config
from keras_posenc import ops
from keras_posenc.layers import _attention_kernel
from keras_posenc.layers._attention_cache import AttentionCache
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.ops import _backend
from keras_posenc.ops import _checks

# The private parts of Keras this layer uses, all read here and nowhere else,
# with the Keras versions that have them (every release from 3.8 to 3.15 was
# read for this list). The layer overrides `call` whole, as keras-hub's
# `CachedMultiHeadAttention` does, with Keras' own sublayers:
#
# - `_query_dense`, `_key_dense`, `_value_dense`, `_output_dense`: the
#   projections, which a scheme may also apply to a table of its own
#   (`AttentionContext.project_query`) (3.8 on).
# - `_gate_dense`, with `_use_gate`: the output's gate (3.15 on; earlier
#   versions have none).
# - `_dropout_layer`: the dropout on the attention weights (3.8 on).
# - `_flash_attention`: whether flash attention is on (3.8 on).
# - `_sliding_window`: the sliding window's size (3.15 on; earlier versions
#   have none).
# - `_get_common_kwargs_for_sublayer`, `_make_output_dense` and
#   `_build_attention`: the parts of Keras' `build` that grouped heads
#   reuse, building the key and value projections with fewer heads (3.8 on).
#
# With neither a position nor positions nor a cache, the call is Keras' own.


# What `qk_norm` takes: how the queries and keys are normalised.
QK_NORMS = ("head", "head_unscaled", "projection")


def _flash_attention(layer):
    return getattr(layer, "_flash_attention", False)


def _dropout_layer(layer):
    return layer._dropout_layer


def _sliding_window(layer):
    return getattr(layer, "_sliding_window", None)


# A Keras object, alive as long as the module, serialized to tell whether
# Keras tracks the objects it serializes (`_saving_shares_objects`).
_SHARING_PROBE = keras.initializers.Zeros()


def _saving_shares_objects():
    """Whether Keras is saving, the configs it serializes tracked for sharing.

    Keras keeps no public word of it: inside the scope it opens around
    `model.save` and `keras.saving.load_model`, an object serialized again
    comes back marked with a `shared_object_id`, and outside it never does.
    So a probe of its own is serialized twice, never the position.
    """
    keras.saving.serialize_keras_object(_SHARING_PROBE)
    again = keras.saving.serialize_keras_object(_SHARING_PROBE)
    return "shared_object_id" in again


def _check_batch_sizes(**tensors):
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


def _check_mask(name, mask, inputs, axis_name, meaning):
    """A `ValueError` unless `mask` is `(batch, length)` of `inputs`, where known."""
    _checks.check_not_text(name, mask, "bools (or 0 and 1)")
    expected = tuple(inputs.shape[:2])
    _checks.check_mask_shape(
        name, mask.shape, expected, f"(batch, {axis_name}), here {expected}, True for {meaning}"
    )


def _check_key_masks(keys, value_mask, key_mask):
    """A `ValueError` naming `value_mask` or `key_mask` unless `(batch, key)`."""
    for name, mask in (("value_mask", value_mask), ("key_mask", key_mask)):
        if mask is not None:
            _check_mask(
                name, keras.ops.convert_to_tensor(mask), keys, "key", "the keys attended to"
            )


def _query_projection(layer):
    """The query projection, `(batch, length, features)` to `(..., heads, key_dim)`."""
    return layer._query_dense


def _key_projection(layer):
    """The key projection, `(batch, length, features)` to `(..., heads, key_dim)`."""
    return layer._key_dense


def _value_projection(layer):
    """The value projection, `(batch, length, features)` to `(..., heads, value_dim)`."""
    return layer._value_dense


def _output_projection(layer):
    """The output projection, `(batch, length, heads, value_dim)` to the output."""
    return layer._output_dense


def _gate_projection(layer):
    """The output's gate, `(batch, length, features)` to `(..., heads, value_dim)`, or None."""
    return layer._gate_dense if getattr(layer, "_use_gate", False) else None


def _with_causal_mask(attention_mask, query, value):
    """`attention_mask` and Keras' causal mask, query `i` to keys `j <= i`."""
    ones = keras.ops.ones(
        (1, keras.ops.shape(query)[1], keras.ops.shape(value)[1]), dtype="int32"
    )
    # Keras' own construction, which TFLite's built-in ops convert.
    causal = keras.ops.greater_equal(
        keras.ops.cumsum(ones, axis=-2), keras.ops.cumsum(ones, axis=-1)
    )  # (1, query, key)
    if attention_mask is None:
        return causal
    return keras.ops.logical_and(keras.ops.cast(attention_mask, "bool"), causal)


def _combined_mask(attention_mask, value_mask, key_mask):
    """The keys' masks and `attention_mask`, combined as Keras combines them.

    Returns:
        None without any mask; else a boolean tensor of shape `(batch,
        query, key)`, or `(batch, heads | 1, query, key)` for an
        `attention_mask` of that rank.
    """
    heads = attention_mask is not None and len(attention_mask.shape) == 4
    masks = [] if attention_mask is None else [keras.ops.cast(attention_mask, "bool")]
    for mask in (value_mask, key_mask):
        if mask is not None:
            masks.append(keras.ops.cast(mask, "bool")[:, None, :])  # (b, 1, k)
    if heads:
        masks = masks[:1] + [mask[:, None] for mask in masks[1:]]
    return functools.reduce(keras.ops.logical_and, masks) if masks else None


def _fused_attention_fails(layer):
    """Whether Keras' `dot_product_attention` path fails for this layer.

    On JAX it does for values of another head size than the keys'
    (`_backend.dot_product_attention_needs_equal_head_sizes`).
    """
    return (
        layer.value_dim != layer.key_dim
        and not _flash_attention(layer)
        and _backend.dot_product_attention_needs_equal_head_sizes()
    )


def _check_int32(positions, name):
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


def _describe(position):
    """The scheme, its axes and prefix tokens, for messages."""
    if position is None:
        return "no `position`"
    if position.takes_adjacency:
        return f"{type(position).__name__}, a position on graphs"
    return (
        f"{type(position).__name__}(num_axes={position.num_axes}, "
        f"num_prefix_tokens={position.num_prefix_tokens})"
    )


def _on_a_line(position):
    """Whether `position` takes positions on one line (no grid, prefix, graph)."""
    return not (
        position.num_axes > 1 or position.num_prefix_tokens or position.takes_adjacency
    )


def _looks_like_grid(positions, length):
    """Whether refused one-axis positions have the shape of grid positions."""
    shape = positions.shape if hasattr(positions, "shape") else np.shape(positions)
    shape = tuple(shape)
    if len(shape) == 3:
        return shape[-1] not in (1, None)
    return len(shape) == 2 and length is not None and (
        shape[0] == length and shape[-1] != length
    )


@keras.saving.register_keras_serializable(package="keras_posenc")
class PositionalMultiHeadAttention(keras.layers.MultiHeadAttention):
    """Multi-head attention with a relative position scheme inside.

    A `keras.layers.MultiHeadAttention` with one more argument, `position`:
    a position scheme, any layer subclassing `AttentionPosition`. The
    package's own: a `RotaryEmbedding` or an `XPosEmbedding` (rotate the
    projected queries and keys, xPos scaling them too); an
    `AttentionTemperature` (Llama 4's layers without positions: scales the
    queries); an `AlibiBias`, a `RelativePositionBias`, a `KerpleBias`, a
    `FireBias`, a `GridRelativePositionBias` or a `ShortestPathBias` (add a
    bias per head to the logits); a `RelativePositionEmbedding` (Shaw et
    al.: a term on the logits and one on the values); a
    `TransformerXLPosition` (a content and a position term on the logits);
    a `DisentangledPosition` (DeBERTa's content-to-position and
    position-to-content terms); a `ContextualPosition` (CoPE: a table read
    at positions counted by gates of the logits). The layer asks its
    `position` for these contributions, handing each hook this call's
    `AttentionContext`, and knows nothing else of the scheme. With
    `position=None` it is the Keras layer: same weights, same outputs (on
    JAX, with a `value_dim` other than `key_dim`, those of Keras' path that
    returns the scores: its fused path fails there).

    On an image or video grid the scheme takes positions of `num_axes` > 1
    coordinates (a `GridRelativePositionBias`, or a rotary embedding of
    several axes): give `query_positions` and `key_positions` of shape
    `(sequence, num_axes)` or `(batch, sequence, num_axes)`, such as
    `keras_posenc.ops.grid_positions((height, width))`; they have no
    default. A scheme with `num_prefix_tokens` (class or register tokens)
    takes positions for the tokens after them only, `sequence` being the
    length of the inputs less `num_prefix_tokens`. A causal mask and a
    sliding window compare positions on a line: they need one axis and no
    prefix tokens.

    On a graph (a `ShortestPathBias`), the attention is over the nodes of
    each graph: call it with `adjacency`, `(batch, nodes, nodes)`, in place
    of positions, on queries and values of one node each. Mask padded nodes
    as Keras does, with the masks of the inputs or an `attention_mask`.

    Every scheme reads the positions of queries and keys, `query_positions`
    and `key_positions` (`0 .. length - 1` by default), so cached decoding
    (one query at its position against all keys so far), left padding and
    packed sequences work, and the causal mask of `use_causal_mask=True`
    compares positions: a query attends to keys at its position or before.
    The logits, their bias and the softmax are computed in float32 whatever
    the dtype policy. Masks of the inputs, `attention_mask` (of any shape
    Keras takes: `(batch, query, key)`, `(batch, heads, query, key)` or
    `(batch, 1, query, key)`) and the causal mask combine as in Keras.
    Queries or keys of length zero give outputs of length zero, or the
    output projection's bias where there are no keys, as in Keras.

    With `num_key_value_heads` below `num_heads`, the attention is
    grouped-query attention (GQA; multi-query attention with one key/value
    head), as Keras' `GroupQueryAttention` and Llama 3, Qwen, Mistral and
    Gemma compute it: the key and value projections have
    `num_key_value_heads` heads, and query head `h` reads key/value head
    `h // (num_heads // num_key_value_heads)`. A scheme's terms per head
    (ALiBi's slopes, T5's table, ...) are per query head; the cache holds
    the key/value heads only.

    With `qk_norm`, the projected queries and keys are normalised by their
    root mean square before the logits, as Qwen3, Llama 4 and OLMo 2 do:
    `"head"` over each head's features with a learned scale of `key_dim`
    shared by the heads (Qwen3's `q_norm` and `k_norm`); `"head_unscaled"`
    the same without a scale (Llama 4's `qk_norm`); `"projection"` over all
    the heads' features at once, with a learned scale of each (OLMo 2's).
    They are normalised before the position's change of the queries and
    keys (RoPE's rotation), or after it with `qk_norm_after_position=True`
    (Llama 4), in float32; the cache holds the keys normalised.

    For generation, the call takes a key/value `cache` in the layout of
    keras-hub's `CachedMultiHeadAttention`, `(batch, 2, slots,
    num_key_value_heads, key_dim)`, keys at index 0 of axis 1 and values at
    1, and
    `cache_update_index`, the slot of the first new token: it writes the new
    tokens' keys and values there, attends over all the slots, and returns
    the updated cache after the output. The keys are cached as the logits
    read them (RoPE rotates each key once, when it is written). The slots
    are the keys, at positions `0 .. slots - 1` by default (`key_positions`
    of shape `(slots,)` or `(batch, slots)` otherwise), and the new queries
    at `cache_update_index + 0, 1, ...`; slots after the last one written
    get no weight, so with `use_causal_mask=True` a prefill of the prompt
    and then one token per call equal one causal pass over the whole
    sequence. Under `jit_compile=True` an index read at run time compiles
    once. An index below 0, or whose new tokens run past the slots, raises
    an error in eager mode and when a TensorFlow graph runs; compiled code
    cannot raise (XLA drops the check, a JAX trace has none), and there the
    outputs are NaN, as is the cache but for the slots written.

    With a position, positions or a cache, the layer's `call` is its own,
    as keras-hub's `CachedMultiHeadAttention`'s is: Keras' projections,
    masks, dropout and output around this package's attention kernel, each
    call's state in its own arguments. Without, it is Keras' `call`. The
    attention itself runs on the backend's own kernel where the scheme
    allows: a scheme that changes the queries and keys only (RoPE, xPos,
    `AttentionTemperature`) on PyTorch's `scaled_dot_product_attention` or
    JAX's `dot_product_attention` on GPUs and TPUs, where
    `flash_attention=True` is accepted with it; a bias there a block of
    queries at a time; elsewhere, float32 logits by blocks of queries, so
    that memory grows linearly with the length on every backend.

    Args:
        num_heads: int. Number of attention heads.
        key_dim: int. Size of each head's queries and keys.
        position: an `AttentionPosition` layer (a position scheme), or None.
            Defaults to `None`.
        num_key_value_heads: int or None. Number of key and value heads, a
            divisor of `num_heads`: below it, grouped-query attention. Needs
            inputs of shape `(batch, sequence, features)`. Defaults to
            `None`, `num_heads`.
        qk_norm: None, `"head"`, `"head_unscaled"` or `"projection"`: how
            the queries and keys are normalised, as above. Defaults to
            `None`, not at all.
        qk_norm_after_position: bool. Whether they are normalised after the
            position's change of the queries and keys rather than before.
            Defaults to `False`.
        qk_norm_epsilon: float. Added to the mean square. Defaults to
            `1e-6`.
        **kwargs: the other arguments of `keras.layers.MultiHeadAttention`
            (`value_dim`, `dropout`, `use_bias`, `output_shape`,
            initializers, ...) and of `keras.layers.Layer`.

    Call arguments:
        query: tensor of shape `(batch, query, features)`.
        value: tensor of shape `(batch, key, features)`.
        key: optional tensor of shape `(batch, key, features)`; defaults to
            `value`.
        query_mask, value_mask, key_mask, attention_mask, training,
            use_causal_mask, return_attention_scores: as in
            `keras.layers.MultiHeadAttention`.
        query_positions: optional integer tensor of shape `(query,)` or
            `(batch, query)`, or `(query, num_axes)` or `(batch, query,
            num_axes)` for a scheme of `num_axes` > 1, where `query` is the
            query length less the scheme's `num_prefix_tokens`. Defaults to
            `0 .. query - 1` for one axis; required for more.
        key_positions: optional integer tensor of shape `(key,)` or
            `(batch, key)`, or `(key, num_axes)` or `(batch, key,
            num_axes)`, likewise. Defaults to `0 .. key - 1` for one axis;
            required for more. With a `cache`, one position per slot.
            Positions are computed in int32: an int64 position past it
            raises a `ValueError` where its value is known; in compiled
            code, which cannot raise, the whole output is NaN. (On JAX
            without 64-bit numbers, `jax.jit` converts int64 arguments to
            int32, wrapped, before any layer sees them.)
        cache: optional float tensor of shape `(batch, 2, slots,
            num_key_value_heads, key_dim)`: the keys and values of the
            tokens before these
            (needs `value_dim` equal to `key_dim`). With a cache, `query`
            and `value` are the new tokens, of the same length, and the
            masks of `value` and `key` are not taken: mask slots with an
            `attention_mask` of shape `(batch, query, slots)`.
        cache_update_index: int or integer scalar tensor. The slot where the
            new tokens' keys and values are written, the number of tokens
            cached before them; required with a `cache`.
        adjacency: tensor of shape `(batch, nodes, nodes)`, the graph whose
            nodes the queries and values are; required by a `position` on
            graphs (`ShortestPathBias`), refused by the others.
        grid_shape: optional list of `num_axes` ints, as the grid encodings
            take it: the queries and the keys are then the cells of that
            grid, row-major, both at `ops.grid_positions(grid_shape)`. Pass
            it or the positions, not both.

    Returns:
        The attention output of shape `(batch, query, features)` (or
        `output_shape`), and with `return_attention_scores=True` also the
        attention weights of shape `(batch, heads, query, key)` (`key`
        being the slots with a cache); with a `cache`, last, the updated
        cache.

    Example:

    >>> from keras_posenc import AlibiBias
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=AlibiBias(num_heads=2)
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> tuple(attention(tokens, tokens, use_causal_mask=True).shape)
    (1, 5, 16)
    >>> cache = np.zeros((1, 2, 8, 2, 8), "float32")  # 8 slots
    >>> prompt, cache = attention(
    ...     tokens[:, :4], tokens[:, :4], use_causal_mask=True,
    ...     cache=cache, cache_update_index=0,
    ... )
    >>> last, cache = attention(
    ...     tokens[:, 4:], tokens[:, 4:], use_causal_mask=True,
    ...     cache=cache, cache_update_index=4,
    ... )
    >>> full = attention(tokens, tokens, use_causal_mask=True)
    >>> last, full = keras.ops.convert_to_numpy(last), keras.ops.convert_to_numpy(full)
    >>> bool(np.allclose(last[:, 0], full[:, 4], atol=1e-6))
    True

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409)
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
        - [Raffel et al., 2020](https://arxiv.org/abs/1910.10683)
        - [Liu et al., 2021](https://arxiv.org/abs/2103.14030)
        - [Ying et al., 2021](https://arxiv.org/abs/2106.05234)
        - [Dai et al., 2019](https://arxiv.org/abs/1901.02860)
        - [He et al., 2021](https://arxiv.org/abs/2006.03654)
        - [Golovneva et al., 2024](https://arxiv.org/abs/2405.18719)
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        position=None,
        num_key_value_heads=None,
        qk_norm=None,
        qk_norm_after_position=False,
        qk_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(num_heads, key_dim, **kwargs)
        if qk_norm is not None and qk_norm not in QK_NORMS:
            raise ValueError(
                "`qk_norm` must be None or one of "
                f"{', '.join(map(repr, QK_NORMS))}. Received: qk_norm={qk_norm!r}"
            )
        ops.check_bool("qk_norm_after_position", qk_norm_after_position)
        ops.check_positive_number("qk_norm_epsilon", qk_norm_epsilon)
        self.qk_norm = qk_norm
        self.qk_norm_after_position = qk_norm_after_position
        self.qk_norm_epsilon = float(qk_norm_epsilon)
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
        self.num_key_value_heads = int(num_key_value_heads)
        if self._grouped and self.attention_axes is not None and tuple(
            self.attention_axes
        ) not in ((1,), (-2,)):
            raise ValueError(
                "Grouped heads (`num_key_value_heads` below `num_heads`) "
                "need attention over the sequence axis only. Received: "
                f"attention_axes={self.attention_axes} with "
                f"num_key_value_heads={num_key_value_heads}"
            )
        if position is not None:
            if not isinstance(position, AttentionPosition):
                raise ValueError(
                    "`position` must be None or a position scheme, a layer "
                    "subclassing keras_posenc.AttentionPosition. Received: "
                    f"position={position!r}"
                )
            # Axis 1 (or -2) of the projected (batch, seq, heads, dim).
            if self.attention_axes is not None and tuple(
                self.attention_axes
            ) not in ((1,), (-2,)):
                raise ValueError(
                    "A `position` needs attention over the sequence axis "
                    "only. Received: "
                    f"attention_axes={self.attention_axes}"
                )
            if _flash_attention(self) and (
                {"logits_bias", "value_term"} & position.contributions
            ):
                raise ValueError(
                    f"{type(position).__name__} adds to the logits or the "
                    "values, which flash attention does not expose: it "
                    "takes a `position` that changes the queries and keys "
                    "only (RotaryEmbedding, XPosEmbedding, "
                    "AttentionTemperature). Received: flash_attention=True "
                    f"with position={type(position).__name__}"
                )
            if _sliding_window(self) is not None and not _on_a_line(position):
                raise ValueError(
                    "A sliding window compares positions on a line: it needs "
                    "a `position` of one axis and no prefix tokens. Received: "
                    f"sliding_window={_sliding_window(self)} with "
                    f"{_describe(position)}"
                )
            position.check_attention(num_heads, key_dim, self.value_dim)
        self.position = position

    @property
    def _grouped(self):
        """Whether the key and value heads are fewer than the query heads."""
        return self.num_key_value_heads != self.num_heads

    def build(self, query_shape, value_shape, key_shape=None):
        # The features the projections take, which `_check_features` reads.
        self._feature_sizes = (
            query_shape[-1],
            value_shape[-1],
            (value_shape if key_shape is None else key_shape)[-1],
        )
        if self._grouped:
            self._build_grouped(query_shape, value_shape, key_shape)
        else:
            super().build(query_shape, value_shape, key_shape)
        if self.position is not None:
            if len(query_shape) != 3:
                raise ValueError(
                    "With a `position`, PositionalMultiHeadAttention takes "
                    "inputs of shape (batch, sequence, features). Received: "
                    f"query_shape={tuple(query_shape)}"
                )
            self.position.build_for_attention(
                self.num_heads, self.key_dim, self.value_dim, features=query_shape[-1]
            )
        if self.qk_norm in ("head", "projection"):
            if len(query_shape) != 3:
                raise ValueError(
                    "With `qk_norm`, PositionalMultiHeadAttention takes inputs "
                    "of shape (batch, sequence, features). Received: "
                    f"query_shape={tuple(query_shape)}"
                )
            for role, heads in (
                ("query", self.num_heads),
                ("key", self.num_key_value_heads),
            ):
                shape = (
                    (self.key_dim,)
                    if self.qk_norm == "head"
                    else (heads, self.key_dim)
                )
                setattr(
                    self,
                    f"{role}_norm_scale",
                    self.add_weight(
                        name=f"{role}_norm_scale",
                        shape=shape,
                        initializer="ones",
                        autocast=False,
                    ),
                )

    def _build_grouped(self, query_shape, value_shape, key_shape):
        """Keras' `build`, the key and value projections of `num_key_value_heads`."""
        key_shape = value_shape if key_shape is None else key_shape
        for name, shape in (
            ("query_shape", query_shape),
            ("value_shape", value_shape),
            ("key_shape", key_shape),
        ):
            if len(shape) != 3:
                raise ValueError(
                    "With grouped heads (`num_key_value_heads` below "
                    "`num_heads`), PositionalMultiHeadAttention takes inputs "
                    "of shape (batch, sequence, features). Received: "
                    f"{name}={tuple(shape)}"
                )
        if value_shape[1] != key_shape[1]:
            raise ValueError(
                "All dimensions of `value` and `key`, except the last one, "
                f"must be equal. Received: value_shape={tuple(value_shape)} "
                f"and key_shape={tuple(key_shape)}"
            )
        common = self._get_common_kwargs_for_sublayer()

        def projection(name, heads, size, shape, **kwargs):
            # Keras' projection of inputs of rank 3: `(batch, length,
            # features)` to `(batch, length, heads, size)`.
            dense = keras.layers.EinsumDense(
                "abc,cde->abde",
                output_shape=(None, heads, size),
                bias_axes="de" if self.use_bias else None,
                name=name,
                **kwargs,
                **common,
            )
            dense.build(shape)
            return dense

        # In Keras' order, so that the weights are listed as there.
        self._query_dense = projection(
            "query", self.num_heads, self.key_dim, query_shape
        )
        self._key_dense = projection(
            "key", self.num_key_value_heads, self.key_dim, key_shape
        )
        if getattr(self, "_use_gate", False):
            self._gate_dense = projection(
                "gate", self.num_heads, self.value_dim, query_shape,
                activation="sigmoid",
            )
        self._value_dense = projection(
            "value", self.num_key_value_heads, self.value_dim, value_shape
        )
        self._build_attention(4)
        self._output_dense = self._make_output_dense(
            query_shape, common, "attention_output"
        )
        self._output_dense.build(
            tuple(query_shape[:2]) + (self.num_heads, self.value_dim)
        )

    def __call__(self, *args, **kwargs):
        # Keras converts NumPy arguments before `call` sees them, an int64
        # position past int32 wrapping on JAX: checked here first.
        for name in ("query_positions", "key_positions"):
            given = kwargs.get(name)
            if isinstance(given, (np.ndarray, list, tuple)):
                given = np.asarray(given)
                if given.dtype.kind in "iu" and given.size:
                    _check_int32(given, name)
        for name in ("attention_mask", "query_mask", "value_mask", "key_mask"):
            _checks.check_not_text(name, kwargs.get(name), "bools (or 0 and 1)")
        return super().__call__(*args, **kwargs)

    def _positions(self, positions, inputs, name, past_int32, start_index=0):
        """`positions` as int32 `(batch or 1, length[, num_axes])`, or the default.

        `length` counts the tokens after the position's prefix tokens; the
        default on one axis is `start_index + 0, 1, ...`. Given positions
        append to the list `past_int32` whether they hold a value past
        int32 (`ops.past_int32`), read before the cast would wrap it.
        """
        position = self.position
        num_axes = 1 if position is None else position.num_axes
        num_prefix_tokens = 0 if position is None else position.num_prefix_tokens
        length = inputs.shape[1]
        if length is not None:
            if length < num_prefix_tokens:
                raise ValueError(
                    f"Inputs must hold at least the {num_prefix_tokens} prefix "
                    f"tokens of {_describe(position)}. Received: inputs of "
                    f"shape {tuple(inputs.shape)}"
                )
            length -= num_prefix_tokens
        if positions is None:
            if num_axes > 1:
                raise ValueError(
                    f"`{name}` has no default for {_describe(position)}: pass "
                    f"the grid's positions, e.g. `{name}="
                    "keras_posenc.ops.grid_positions((h, w))` for an h x w "
                    f"grid. Received: {name}=None"
                )
            return ops.position_ids(
                keras.ops.shape(inputs)[1] - num_prefix_tokens, start_index
            )[None]  # (1, length)
        try:
            positions = ops.read_positions(
                positions,
                num_axes,
                length=length,
                batch_size=inputs.shape[0],
                name=name,
                integer=True,
            )  # ([batch,] length[, num_axes])
        except ValueError as error:
            if num_axes == 1 and _looks_like_grid(positions, length):
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
        past_int32.append(ops.past_int32(positions))
        positions = keras.ops.cast(positions, "int32")
        if len(positions.shape) == (1 if num_axes == 1 else 2):
            positions = positions[None]
        return positions  # (batch or 1, length[, num_axes])

    def _check_causal(self, use_causal_mask):
        position = self.position
        if use_causal_mask and position is not None and not _on_a_line(position):
            raise ValueError(
                "A causal mask lets a query attend to keys at its position or "
                "before: it needs positions of one axis and no prefix tokens. "
                f"Received: use_causal_mask=True with {_describe(position)}"
            )

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        cache=None,
        cache_update_index=None,
        adjacency=None,
        grid_shape=None,
    ):
        if grid_shape is not None:
            query_positions, key_positions = self._grid_positions(
                grid_shape, query_positions, key_positions, adjacency
            )
        query_positions_given, key_positions_given = query_positions, key_positions
        _check_batch_sizes(query=query, value=value, key=key)
        self._check_features(query, value, key)
        if cache is None:
            _check_key_masks(value if key is None else key, value_mask, key_mask)
        attention_mask = self._with_query_mask(
            attention_mask, query_mask, query, value if key is None else key, cache
        )
        arguments = dict(
            key=key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        if cache is None and cache_update_index is not None:
            raise ValueError(
                "`cache_update_index` says where to write in a `cache`: it "
                "needs one. Received: cache=None with "
                f"cache_update_index={cache_update_index!r}"
            )
        on_graph = self._check_graph(
            adjacency, query, value, key, query_positions, key_positions, cache
        )
        if (
            self.position is None
            and query_positions is None
            and key_positions is None
            and cache is None
            and not self._grouped
            and self.qk_norm is None
        ):
            if use_causal_mask:
                # Handed to Keras as a mask: with the causal mask its only
                # mask, Keras 3.15 takes the backend's causal kernel, whose
                # slice TFLite's built-in ops lack.
                arguments["attention_mask"] = _with_causal_mask(
                    arguments["attention_mask"], query, value
                )
            if not return_attention_scores and _fused_attention_fails(self):
                # Keras' path that returns the scores computes the same
                # attention without `dot_product_attention`. Its softmax
                # warns of a single key, whose weight of 1 is right here.
                arguments["return_attention_scores"] = True
                with _backend.ignoring_warnings("You are using a softmax over axis"):
                    output, _ = super().call(query, value, **arguments)
                return output
            return super().call(query, value, **arguments)
        self._check_causal(use_causal_mask)
        start_index = 0
        if cache is not None:
            cache, query = AttentionCache.checked(
                self,
                cache,
                cache_update_index,
                query,
                value if key is None else key,
                value_mask is not None or key_mask is not None,
                _describe(self.position),
            )
            start_index = cache.update_index
        keys = value if key is None else key
        past_int32 = []
        if on_graph:
            query_positions = key_positions = None
        else:
            query_positions = self._positions(
                query_positions, query, "query_positions", past_int32, start_index
            )  # (batch or 1, query[, num_axes])
            # With a cache the keys are its slots, `0 .. slots - 1`.
            key_positions = self._positions(
                key_positions,
                keys if cache is None else cache.keys,
                "key_positions",
                past_int32,
            )  # (batch or 1, key[, num_axes])
        context = AttentionContext(
            query_positions=query_positions,
            key_positions=key_positions,
            adjacency=adjacency if on_graph else None,
            causal=bool(use_causal_mask),
            _cache=cache,
            project_query=_query_projection(self),
            project_key=_key_projection(self),
            # The defaults on one axis, 0 .. length - 1 for queries and
            # keys, whose structure a scheme may use for speed.
            consecutive=(
                query_positions_given is None
                and key_positions_given is None
                and cache is None
                and not on_graph
                and (self.position is None or _on_a_line(self.position))
            ),
            grid_shape=(
                tuple(int(size) for size in grid_shape)
                if grid_shape is not None and cache is None
                else None
            ),
        )
        # `attention_mask` holds the queries' mask (`_with_query_mask`).
        mask = _combined_mask(attention_mask, value_mask, key_mask)
        output, scores, cache = self._attend(
            query, keys, value, mask, context, cache, training, return_attention_scores
        )
        past_int32 = [past for past in past_int32 if past is not None]
        if past_int32:
            # Positions past int32, known only in compiled code, which
            # cannot raise: the output shows them as NaN rather than the
            # attention at their int32 wrap.
            output = keras.ops.where(
                functools.reduce(keras.ops.logical_or, past_int32),
                keras.ops.cast(float("nan"), output.dtype),
                output,
            )
        outputs = (output,)
        if return_attention_scores:
            outputs += (scores,)
        if cache is not None:
            outputs += (cache.tensor,)
        return outputs[0] if len(outputs) == 1 else outputs

    def _check_features(self, query, value, key):
        """A `ValueError` naming the input whose features are not those built on."""
        sizes = getattr(self, "_feature_sizes", (None, None, None))
        for name, inputs, features in zip(("query", "value", "key"), (query, value, key), sizes):
            if inputs is None:
                name, inputs = "value", value  # the keys are the values
            if None not in (features, inputs.shape[-1]) and inputs.shape[-1] != features:
                raise ValueError(
                    f"`{name}` must have {features} features, those its "
                    "projection was built for by the attention's first call. "
                    f"Received: {name} of shape {tuple(inputs.shape)}"
                )

    def _with_query_mask(self, attention_mask, query_mask, query, keys, cache):
        """`attention_mask`, checked, with the rows of `query_mask` in it.

        Keras' `call` reads the queries' mask from the tensor alone and
        drops the `query_mask` argument; here a query it masks attends to
        no key, as one whose tensor carries that mask.
        """
        batch_size = query.shape[0]
        if attention_mask is not None:
            attention_mask = keras.ops.convert_to_tensor(attention_mask)
            _checks.check_not_text("attention_mask", attention_mask, "bools (or 0 and 1)")
            shape = tuple(attention_mask.shape)
            queries = query.shape[1]
            keys_length = keys.shape[1] if cache is None else cache.shape[2]
            if len(shape) not in (2, 3, 4) or (
                None not in (queries, shape[-2]) and shape[-2] not in (queries, 1)
            ) or (None not in (keys_length, shape[-1]) and shape[-1] != keys_length) or (
                len(shape) > 2 and None not in (batch_size, shape[0])
                and shape[0] not in (batch_size, 1)
            ):
                raise ValueError(
                    "`attention_mask` must have shape (query, key), (batch, "
                    "query, key) or (batch, heads or 1, query, key), here "
                    f"batch={batch_size}, query={queries} and key={keys_length}, "
                    "True where a query "
                    "may attend to a key; for a padding mask of the keys, "
                    "(batch, key), pass `value_mask` or mask the inputs. "
                    f"Received: attention_mask of shape {shape}"
                )
        if query_mask is None:
            return attention_mask
        query_mask = keras.ops.convert_to_tensor(query_mask)
        _check_mask("query_mask", query_mask, query, "query", "the queries that attend")
        keys_length = (
            keras.ops.shape(keys)[1] if cache is None else keras.ops.shape(cache)[2]
        )
        rows = keras.ops.broadcast_to(
            keras.ops.cast(query_mask, "bool")[:, :, None],
            (keras.ops.shape(query)[0], keras.ops.shape(query)[1], keys_length),
        )  # (batch, query, key)
        if attention_mask is None:
            return rows
        attention_mask = keras.ops.cast(attention_mask, "bool")
        if len(attention_mask.shape) == 4:
            rows = rows[:, None]  # (batch, 1, query, key)
        return keras.ops.logical_and(attention_mask, rows)  # batch first

    def _grid_positions(self, grid_shape, query_positions, key_positions, adjacency):
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
        num_axes = 1 if self.position is None else self.position.num_axes
        if not isinstance(grid_shape, (list, tuple)) or len(grid_shape) != num_axes:
            raise ValueError(
                f"`grid_shape` needs one size per axis that "
                f"{_describe(self.position)} reads ({num_axes}): for a grid of "
                "h x w cells, pass a scheme of `num_axes=2`, such as "
                "RotaryEmbedding(num_axes=2). Received: "
                f"grid_shape={grid_shape!r}"
            )
        ops.check_grid_shape(grid_shape, num_axes=num_axes)
        positions = ops.grid_positions(grid_shape)  # (cells, num_axes)
        if num_axes == 1:
            positions = positions[:, 0]  # (cells,)
        return positions, positions

    def _check_graph(
        self, adjacency, query, value, key, query_positions, key_positions, cache
    ):
        """Whether this call is on a graph; a `ValueError` for a wrong mix."""
        position = self.position
        on_graph = position is not None and position.takes_adjacency
        if adjacency is None:
            if on_graph:
                raise ValueError(
                    f"{_describe(position)} reads the graph: pass `adjacency` "
                    "of shape (batch, nodes, nodes). Received: adjacency=None"
                )
            return False
        if not hasattr(adjacency, "shape"):
            adjacency = keras.ops.convert_to_tensor(adjacency)
        shape = tuple(adjacency.shape)
        if not on_graph:
            raise ValueError(
                "`adjacency` is read by a position on graphs, such as "
                f"ShortestPathBias; this attention has {_describe(position)}. "
                f"Received: adjacency of shape {shape}"
            )
        for name, given in (
            ("query_positions", query_positions),
            ("key_positions", key_positions),
            ("cache", cache),
        ):
            if given is not None:
                raise ValueError(
                    f"{_describe(position)} attends over the nodes of a graph, "
                    f"given by `adjacency`: it takes no `{name}`. Received: "
                    f"{name}={given!r}"
                )
        keys = value if key is None else key
        if None not in (query.shape[1], keys.shape[1]) and (
            query.shape[1] != keys.shape[1]
        ):
            raise ValueError(
                f"{_describe(position)} attends from each node of a graph to "
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

    def _attend(
        self, query, keys, value, mask, context, cache, training, returns_scores
    ):
        """Keras' order around the kernel: projections, attention, output.

        Args:
            query: tensor of shape `(batch, query, features)`.
            keys: tensor of shape `(batch, key, features)`.
            value: tensor of shape `(batch, key, features)`.
            mask: None, or the masks combined, `(batch, query, key)` or
                `(batch, heads | 1, query, key)`.
            context: the call's `AttentionContext`.
            cache: None, or the call's `AttentionCache`.
            training: bool or None.
            returns_scores: bool.

        Returns:
            `(output, scores, cache)`: the output, `(batch, query,
            features)`; the weights, `(batch, heads, query, key)`, or None
            unless `returns_scores`; the updated `AttentionCache`, or None.
        """
        # The masks are in `mask`; the projections take none and would
        # warn that they drop those the inputs carry. Keras' `__call__`
        # sets the queries' mask on the output.
        with _backend.ignoring_warnings("Layer .* was passed an input with a mask"):
            gate = _gate_projection(self)(query) if _gate_projection(self) else None
            query = _query_projection(self)(query)  # (batch, query, heads, key_dim)
            key = _key_projection(self)(keys)  # (batch, key, heads, key_dim)
            value = _value_projection(self)(value)  # (batch, key, heads, value_dim)
        position = self.position
        if self.qk_norm is not None and not self.qk_norm_after_position:
            query, key = self._qk_normalized(query, key)
        if cache is None:
            if position is not None:
                query, key = _attention_kernel.transformed(
                    position, query, key, context
                )
            if self.qk_norm is not None and self.qk_norm_after_position:
                query, key = self._qk_normalized(query, key)
        else:
            query, key, value, cache = self._update_cache(
                query, key, value, cache, context
            )
        scale = (
            1.0 / math.sqrt(self.key_dim)
            if position is None
            else _attention_kernel.checked_scale(
                position, position.logits_scale(self.key_dim)
            )
        )
        query = query * keras.ops.cast(scale, query.dtype)
        output, weights = _attention_kernel.attend(
            _attention_kernel.Attention(
                position=position,
                dropout=self.dropout,
                dropout_layer=_dropout_layer(self),
                flash_attention=bool(_flash_attention(self)),
                sliding_window=_sliding_window(self),
                scores_dtype=self.compute_dtype,
            ),
            query,
            key,
            value,
            mask,
            context,
            training,
            bool(returns_scores),
        )  # (batch, query, heads, value_dim)
        if gate is not None:
            output = keras.ops.multiply(output, gate)
        output = _output_projection(self)(output)
        return output, weights, cache

    def _qk_normalized(self, query, key):
        """The queries and keys divided by their root mean square, as `qk_norm` says.

        In float32, the scale too, then cast back, as Hugging Face's
        `Qwen3RMSNorm` and `Olmo2RMSNorm` compute it in float32 models.
        """
        axes = (-2, -1) if self.qk_norm == "projection" else (-1,)

        def normalized(x, scale):
            x32 = keras.ops.cast(x, "float32")
            mean_square = keras.ops.mean(keras.ops.square(x32), axis=axes, keepdims=True)
            x32 = x32 * keras.ops.rsqrt(mean_square + self.qk_norm_epsilon)
            if scale is not None:
                x32 = x32 * scale
            return keras.ops.cast(x32, x.dtype)

        if self.qk_norm == "head_unscaled":
            return normalized(query, None), normalized(key, None)
        return (
            normalized(query, self.query_norm_scale),
            normalized(key, self.key_norm_scale),
        )

    def _update_cache(self, query, key, value, cache, context):
        """Write the new keys and values in the cache, to attend over all of it.

        The new keys are transformed by the positions of the slots they go
        to before they are written (RoPE rotates each key once, when it is
        cached), so the cache holds keys as the logits read them.

        Returns:
            `(query, key, value, cache)`: the transformed queries, `(batch,
            query, heads, key_dim)`, the cache's keys and values after the
            update, `(batch, slots, heads, dim)` each, and the updated
            `AttentionCache`.
        """
        if self.position is not None:
            written = cache.new_positions(
                context.key_positions
            )  # the slots' positions, (batch or 1, new[, num_axes])
            query, key = _attention_kernel.transformed(
                self.position, query, key, context.replace(key_positions=written)
            )
        if self.qk_norm is not None and self.qk_norm_after_position:
            query, key = self._qk_normalized(query, key)
        cache = cache.updated(key, value)
        return query, cache.keys, cache.values, cache

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
        query_positions=None,
        key_positions=None,
        cache=None,
        cache_update_index=None,
        adjacency=None,
        grid_shape=None,
    ):
        if grid_shape is not None:
            query_positions, key_positions = self._grid_positions(
                grid_shape, query_positions, key_positions, adjacency
            )
        self._check_graph(
            adjacency, query, value, key, query_positions, key_positions, cache
        )
        self._check_causal(use_causal_mask)
        output_spec = super().compute_output_spec(query, value, key)
        outputs = (output_spec,)
        if return_attention_scores:
            weights_shape = (
                query.shape[0],
                self.num_heads,
                query.shape[1],
                value.shape[1] if cache is None else cache.shape[2],
            )
            outputs += (keras.KerasTensor(weights_shape, dtype=self.compute_dtype),)
        if cache is not None:
            outputs += (keras.KerasTensor(cache.shape, dtype=cache.dtype),)
        return outputs[0] if len(outputs) == 1 else outputs

    def get_config(self):
        config = super().get_config()
        config["num_key_value_heads"] = self.num_key_value_heads
        config["qk_norm"] = self.qk_norm
        config["qk_norm_after_position"] = self.qk_norm_after_position
        config["qk_norm_epsilon"] = self.qk_norm_epsilon
        config["position"] = None
        if self.position is not None:
            config["position"] = keras.saving.serialize_keras_object(self.position)
            if _saving_shares_objects():
                # Keras marks an object's config with a `shared_object_id`
                # when it serializes the object again, and loading makes one
                # object of the configs so marked; but the first attention's
                # config is copied before a second attention serializes the
                # position. Marked here from the first, a position serving
                # several attention layers (a table shared by the layers, as
                # Graphormer's) loads as one.
                config["position"]["shared_object_id"] = id(self.position)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("position") is not None:
            # Built by `build`, under this layer's name scope, as when first
            # made: built on deserialization, its weights would lose the
            # attention's prefix.
            position = {
                key: value
                for key, value in config["position"].items()
                if key != "build_config"
            }
            try:
                config["position"] = keras.saving.deserialize_keras_object(position)
            except TypeError as error:
                # Keras imports no package to find a class but its own.
                if "Could not locate" not in str(error):
                    raise
                name = position.get("registered_name", position.get("class_name"))
                raise TypeError(
                    f"`position` of this attention is {name!r}, which Keras "
                    "does not know: import the module that registers it (with "
                    "`keras.saving.register_keras_serializable`) before "
                    "loading, or pass it in `custom_objects`. Keras imports no "
                    f"package to find a class but its own. Keras said: {error}"
                ) from None
        return super().from_config(config)

    @staticmethod
    def positions_from_hf_config(config):
        """Deprecated: `keras_posenc.hf_config.positions_per_layer(config)`."""
        warnings.warn(
            "`PositionalMultiHeadAttention.positions_from_hf_config` moved: "
            "use `keras_posenc.hf_config.positions_per_layer(config)`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return hf_config.positions_per_layer(config)
