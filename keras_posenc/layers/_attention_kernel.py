"""The attention's kernel: one reference, and its fast paths chosen in one place.

`PositionalMultiHeadAttention` hands its projected heads here with the
call's `AttentionContext`: `heads` normalises (`qk_norm`), transforms (the
scheme's `transform_query_key`) and scales them in one step, and `attend`
asks `PATHS` in order, with one `Capabilities` of the backend and its device and what the
scheme contributes (`AttentionPosition.contributions`), and runs the first
that accepts the call:

- `"flex"`: PyTorch's FlexAttention on GPUs, the scheme's `score_bias`
  computed inside it, the masks its block mask; never by blocks.
- `"reference"`: the logits whole, in float32, the scheme's bias and value
  term, Keras' masked softmax, dropout and the scores. Every other path
  equals it (the tests compare them).
- `"reference_blocks"`: the reference over blocks of queries, one after
  another, so that no tensor of the logits' size is ever whole: memory
  linear in length, on TensorFlow and on JAX's CPU.
- `"fused"`: the backend's fused attention (PyTorch's SDPA, JAX's
  `dot_product_attention`, flash where asked), for a scheme that changes
  the queries and keys only, and with a scheme's bias where that bias (or
  on JAX the logits, which its kernel writes) is small enough whole.
- `"fused_blocks"`: the fused attention over blocks of queries, each with
  its block's bias, so that no bias of the logits' size is ever whole.
"""

import dataclasses
import functools
import math
import numbers

import keras

from keras_posenc import ops
from keras_posenc.ops import _backend

# The fewest queries per block of the reference path, where the scheme
# names no `query_block`: a block's logits at 8192 keys and 8 heads take
# 128 MiB in float32, an eighth of what the whole logits take at 8192
# queries.
QUERY_BLOCK = 512
# On the reference path, the logits are whole up to this many entries,
# 128 MiB in float32 (batch 4, 8 heads, 1024 queries and keys), and in blocks
# of at most that many, and of at least `QUERY_BLOCK` queries, beyond.
LOGITS_ELEMENTS = 2**25
# On the fused path, a block's bias holds at most this many entries, 32 MiB
# in float32: at 8192 keys and 8 heads, blocks of 128 queries; at 1024 keys,
# blocks of 1024. Where the kernel writes the logits (JAX's), they are
# bounded as the reference's, by `LOGITS_ELEMENTS`.
BLOCK_ELEMENTS = 2**23
# On a GPU, where each block is a launch of its own, a block's bias holds
# at most this many entries, 128 MiB in float32: at (4, 4096), 8 heads,
# blocks of 1024 queries; at 32768 keys, of 128.
GPU_BLOCK_ELEMENTS = 2**25
# Where each step writes a tensor of a block's size (eager PyTorch), and
# the call goes by blocks anyway, a block's bias, or logits, holds at most
# this many entries, 16 MiB: CoPE's bias takes about eight such steps.
EAGER_BLOCK_ELEMENTS = 2**22
SMALLEST_QUERY_BLOCK = 16
# Where XLA runs the logits, softmax and product with the values as one
# kernel (`_backend.fuses_attention`, JAX's CPU), smaller blocks keep its
# work in the processor's cache; a value term (Shaw's) reads a tensor of
# the block's size times its band, smaller again.
FUSED_XLA_QUERY_BLOCK = 128
FUSED_XLA_VALUE_TERM_QUERY_BLOCK = 32
# Under the causal mask at the default positions, the blocks of queries go
# in at most this many groups, each reading the keys up to its last query
# (`causal_groups`): the more groups, the fewer keys read, and the more
# loops compiled.
CAUSAL_GROUPS = 4
# Where the logits would be whole, a causal call still goes by blocks, one
# group each, if its blocks have at least this many queries: below, the
# loops cost more than the keys they skip.
CAUSAL_QUERY_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class Attention:
    """What the kernel reads of the attention layer, besides the heads.

    Attributes:
        position: the layer's `AttentionPosition`, or None.
        dropout: float. The rate of dropout on the attention weights.
        dropout_layer: the layer's dropout, called on the weights.
        flash_attention: bool. Whether the user asked for flash attention.
        sliding_window: None, or the window's size (Keras 3.15 and later).
        scores_dtype: the dtype of the scores returned.
        qk_norm: None, or the layer's `QKNorm`.
    """

    position: object
    dropout: float
    dropout_layer: object
    flash_attention: bool
    sliding_window: object
    scores_dtype: str
    qk_norm: object = None


@dataclasses.dataclass(frozen=True)
class QKNorm:
    """The attention's `qk_norm`: queries and keys over their root mean square.

    Attributes:
        kind: `"head"` or `"head_unscaled"`, over each head's features;
            `"projection"`, over all the heads' features at once.
        epsilon: float. Added to the mean square.
        after_position: bool. Whether after the scheme's transform of the
            queries and keys rather than before.
        query_scale: None, or the queries' learned scale, `(key_dim,)` or
            `(heads, key_dim)`.
        key_scale: None, or the keys' learned scale, likewise.
    """

    kind: str
    epsilon: float
    after_position: bool
    query_scale: object = None
    key_scale: object = None

    def __call__(self, query, key):
        """The queries and keys divided by their root mean square, times the scales.

        In float32, the scale too, then cast back, as Hugging Face's
        `Qwen3RMSNorm` and `Olmo2RMSNorm` compute it in float32 models.
        """
        axes = (-2, -1) if self.kind == "projection" else (-1,)

        def normalized(x, scale):
            x32 = keras.ops.cast(x, "float32")
            mean_square = keras.ops.mean(keras.ops.square(x32), axis=axes, keepdims=True)
            x32 = x32 * keras.ops.rsqrt(mean_square + self.epsilon)
            if scale is not None:
                x32 = x32 * scale
            return keras.ops.cast(x32, x.dtype)

        return normalized(query, self.query_scale), normalized(key, self.key_scale)


def _shape_text(shape):
    return "(" + ", ".join("None" if size is None else str(size) for size in shape) + ")"


def transformed(position, query, key, context):
    """`position.transform_query_key`, checked: a `ValueError` naming the hook.

    A scheme of the user's that returns tensors of other shapes would
    otherwise fail deep in the kernel with the backend's own message.
    """
    outputs = position.transform_query_key(query, key, context)
    if not (isinstance(outputs, (tuple, list)) and len(outputs) == 2):
        raise ValueError(
            f"{type(position).__name__}.transform_query_key must return a "
            "tuple (query, key) of the shapes it was given. Received: "
            f"{type(outputs).__name__}"
        )
    for name, given, returned in zip(("query", "key"), (query, key), outputs):
        if tuple(returned.shape) != tuple(given.shape):
            raise ValueError(
                f"{type(position).__name__}.transform_query_key must return "
                f"the {name} in its shape, {_shape_text(given.shape)}. "
                f"Received: {name} of shape {_shape_text(returned.shape)}"
            )
    return outputs


def heads(attention, query, key, context):
    """The projected queries and keys as the logits read them, in one step.

    Normalised by `attention.qk_norm` before the scheme's
    `transform_query_key` (`transformed`), or after it where the norm says
    so; then the queries multiplied by the scheme's `logits_scale`
    (`scaled`).

    Returns:
        `(query, key)`, of the shapes given: `(batch, query, heads,
        key_dim)` and `(batch, key, key/value heads, key_dim)`.
    """
    norm = attention.qk_norm
    if norm is not None and not norm.after_position:
        query, key = norm(query, key)
    if attention.position is not None:
        query, key = transformed(attention.position, query, key, context)
    if norm is not None and norm.after_position:
        query, key = norm(query, key)
    return scaled(attention, query), key


def scaled(attention, query):
    """The queries times the scheme's `logits_scale`, `1 / sqrt(key_dim)` without one."""
    position = attention.position
    key_dim = query.shape[-1]
    scale = (
        1.0 / math.sqrt(key_dim)
        if position is None
        else checked_scale(position, position.logits_scale(key_dim))
    )
    return query * keras.ops.cast(scale, query.dtype)


def checked_bias(position, bias, query, key):
    """A scheme's bias, or a `ValueError` naming its hook where it cannot fit.

    It must broadcast to `(batch, heads, query, key)`: four axes, each of
    the logits' size or 1 where known.
    """
    if bias is None:
        return None
    expected = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
    if not (keras.ops.is_tensor(bias) or isinstance(bias, keras.KerasTensor)):
        raise ValueError(
            f"{type(position).__name__}.logits_bias must return None or a "
            "float tensor broadcastable to (batch, heads, query, key), here "
            f"{_shape_text(expected)}. Received: {type(bias).__name__}"
        )
    shape = tuple(bias.shape)
    fits = len(shape) == 4 and all(
        size is None or wanted is None or size in (wanted, 1)
        for size, wanted in zip(shape, expected)
    )
    dtype = keras.backend.standardize_dtype(bias.dtype)
    if not fits or not dtype.startswith(("float", "bfloat")):
        raise ValueError(
            f"{type(position).__name__}.logits_bias must return None or a "
            "float tensor broadcastable to (batch, heads, query, key), here "
            f"{_shape_text(expected)}. Received: a tensor of shape "
            f"{_shape_text(shape)} and dtype {dtype}"
        )
    # The logits are float32: a bias of another float dtype joins them so.
    return keras.ops.cast(bias, "float32")


def checked_scale(position, scale):
    """A scheme's `logits_scale`, or a `ValueError` naming the hook."""
    if isinstance(scale, bool) or not (
        isinstance(scale, numbers.Real)
        or (
            keras.ops.is_tensor(scale)
            and len(scale.shape) == 0
            and keras.backend.standardize_dtype(scale.dtype).startswith(
                ("float", "bfloat")
            )
        )
    ):
        raise ValueError(
            f"{type(position).__name__}.logits_scale must return a number, "
            f"the factor of the queries. Received: {scale!r}"
        )
    return scale


def checked_value_term(position, term, output):
    """A scheme's value term, or a `ValueError` naming the hook where it cannot fit."""
    if term is None:
        return None
    expected = tuple(output.shape)
    if not keras.ops.is_tensor(term) or any(
        size is not None and wanted is not None and size != wanted
        for size, wanted in zip(term.shape, expected)
    ) or len(term.shape) != len(expected):
        shape = tuple(term.shape) if hasattr(term, "shape") else type(term).__name__
        raise ValueError(
            f"{type(position).__name__}.value_term must return None or a "
            "tensor of shape (batch, query, heads, value_dim), here "
            f"{_shape_text(expected)}. Received: {shape}"
        )
    return term


def _four_axes(attention_mask):
    """The caller's mask as bools of shape `(batch, heads | 1, query, key)`.

    Keras takes (batch, query, key) and (batch, heads | 1, query, key); a
    head axis where there is none, as its masked softmax.
    """
    mask = keras.ops.cast(attention_mask, "bool")
    while len(mask.shape) < 4:
        mask = keras.ops.expand_dims(mask, -3)
    return mask


def mask_of(attention, attention_mask, context):
    """Keras' mask, the cache's, the causal one and the sliding window.

    Args:
        attention: the call's `Attention`.
        attention_mask: None, or a mask of shape `(batch, query, key)` or
            `(batch, heads | 1, query, key)`, the inputs' masks in it.
        context: the call's (or block's) `AttentionContext`.

    Returns:
        None, or a boolean tensor of shape `(batch | 1, heads | 1, query,
        key)`.
    """
    masks = []
    if attention_mask is not None:
        masks.append(_four_axes(attention_mask))
    if context.adjacency is not None:
        # On a graph there are no positions to compare.
        return masks[0] if masks else None
    query_positions, key_positions = context.query_positions, context.key_positions
    if context._cache is not None:
        # A slot after the last one written holds no key yet.
        masks.append(context._cache.written()[None, None, None])  # (1, 1, 1, key)
    window = attention.sliding_window
    if context.causal or window is not None:
        distance = ops.relative_position(
            query_positions, key_positions
        )  # (batch or 1, query, key): key - query
        if context.causal:
            masks.append((distance <= 0)[:, None])  # (batch | 1, 1, query, key)
        if window is not None:
            # The window compares positions, as the causal mask does.
            masks.append((keras.ops.abs(distance) < window)[:, None])
    if not masks:
        return None
    return functools.reduce(keras.ops.logical_and, masks)


@dataclasses.dataclass(frozen=True)
class Call:
    """What the paths read of one call to choose among themselves."""

    attention: Attention
    query: object
    value: object
    context: object
    returns_scores: bool
    training: object
    capabilities: _backend.Capabilities

    @property
    def contributions(self):
        position = self.attention.position
        return frozenset() if position is None else position.contributions

    @property
    def dropout_in_training(self):
        return self.attention.dropout > 0.0 and bool(self.training)

    @property
    def blockable(self):
        """Whether the queries may go by blocks: nothing reads them whole."""
        position = self.attention.position
        return (
            not self.returns_scores
            and not self.dropout_in_training
            and self.context.cache_update_index is None
            and self.context.adjacency is None
            and not (position is not None and position.num_prefix_tokens)
            and self.query.shape[1] is not None
            and None not in self.query.shape[2:]
        )


def _flex_accepts(call):
    """FlexAttention, the scheme's `score_bias` inside it: PyTorch on GPUs.

    For a scheme with a `score_bias`, no value term and no prefix tokens,
    whole (never by blocks), of static shapes; on a device where it has
    no backward pass (the CPU), only where no gradient is recorded.
    """
    position = call.attention.position
    capabilities = call.capabilities
    if not (
        capabilities.flex
        and position is not None
        and "score_bias" in call.contributions
        and "value_term" not in call.contributions
        and not call.returns_scores
        and not call.dropout_in_training
        and call.context.adjacency is None
        and not position.num_prefix_tokens
        and None not in call.query.shape
        and None not in call.value.shape
        and (capabilities.flex_trains or not _backend.records_gradient())
    ):
        return None
    return "flex", None


def _fused_accepts(call):
    """The backend's fused attention, the bias whole or by blocks of queries."""
    attention, query, value = call.attention, call.query, call.value
    position = attention.position
    contributions = call.contributions
    capabilities = call.capabilities
    dtype = keras.backend.standardize_dtype(query.dtype)
    if not (
        (capabilities.fused or attention.flash_attention)
        and not call.returns_scores
        and not call.dropout_in_training
        and "value_term" not in contributions
        and (
            attention.flash_attention
            or dtype == "float32"
            # On GPUs the kernels take bfloat16 and float16 at their own
            # precision, accumulating in float32, as Keras' attention does.
            or capabilities.low_precision_fused
        )
        and not (
            value.shape[-1] != query.shape[-1]
            and _backend.dot_product_attention_needs_equal_head_sizes()
        )
    ):
        return None
    # Blocks where the kernel would take a bias whole, each block's of
    # at most `BLOCK_ELEMENTS` entries, or write the logits itself
    # (XLA's implementation on JAX), each block's of at most
    # `LOGITS_ELEMENTS`, as the reference's.
    writes_logits = _backend.fused_attention_writes_logits(
        attention.flash_attention or _backend.takes_cudnn(dtype)
    )
    queries, keys = query.shape[1], value.shape[1]
    if (
        ("logits_bias" in contributions or writes_logits)
        and call.blockable
        and keys is not None
    ):
        per_query = query.shape[2] * keys  # a bias's entries, shared by the batch
        if writes_logits and query.shape[0] is not None:
            per_query *= query.shape[0]
        on_gpu = capabilities.device == "gpu"
        if writes_logits:
            budget = LOGITS_ELEMENTS
        else:
            budget = GPU_BLOCK_ELEMENTS if on_gpu else BLOCK_ELEMENTS
        block = max(SMALLEST_QUERY_BLOCK, budget // max(per_query, 1))
        if writes_logits and position is not None and position.query_block is not None:
            # A scheme's own block bounds its tensors beside the logits
            # (FIRE's pieces, Transformer-XL's relative logits).
            block = min(block, position.query_block)
        if queries > block and not on_gpu:
            # On a GPU, fewer blocks of more queries: no loop of small launches.
            block = _eager_block(block, per_query)
        if queries > block:
            return "fused_blocks", block
    return "fused", None


def _reference_accepts(call):
    """The reference, whole or by blocks of queries: every call."""
    query, value, context = call.query, call.value, call.context
    position = call.attention.position
    queries = query.shape[1]
    block = None if position is None else position.query_block
    if block is None:
        if _backend.fuses_attention():
            block = (
                FUSED_XLA_VALUE_TERM_QUERY_BLOCK
                if "value_term" in call.contributions
                else FUSED_XLA_QUERY_BLOCK
            )
        elif None in (query.shape[0], value.shape[1]):
            block = QUERY_BLOCK
        else:
            # Whole logits up to `LOGITS_ELEMENTS` (XLA's fastest order);
            # past them, blocks of logits that size, or of
            # `EAGER_BLOCK_ELEMENTS` where each step writes a tensor of the
            # block's logits.
            per_query = query.shape[0] * query.shape[2] * value.shape[1]
            block = max(QUERY_BLOCK, LOGITS_ELEMENTS // max(per_query, 1))
            if queries is not None and queries > block:
                block = _eager_block(block, per_query)
    if call.blockable and queries > block:
        return "reference_blocks", block
    if (
        call.blockable
        and context.causal
        and context.consecutive
        and queries // CAUSAL_GROUPS >= CAUSAL_QUERY_BLOCK
    ):
        # The logits would fit whole; in blocks, grouped, the keys after
        # each group's queries are never read (`causal_groups`).
        return "reference_blocks", queries // CAUSAL_GROUPS
    return "reference", None


# The kernel's paths, in the order they are asked: each accepts a call
# with its name and block of queries, or passes it on (None).
PATHS = (
    ("flex", _flex_accepts),
    ("fused", _fused_accepts),
    ("reference", _reference_accepts),
)


def choose(
    attention, query, value, context, returns_scores, training, capabilities=None,
    skip=(),
):
    """The path `attend` takes, and its block of queries: `(name, block)`.

    The first of `PATHS` that accepts the call, from one `Capabilities`
    of the backend and its device.

    Args:
        attention: the call's `Attention`.
        query: the scaled heads, `(batch, query, heads, key_dim)`.
        value: the values, `(batch, key, heads, value_dim)`.
        context: the call's `AttentionContext`.
        returns_scores: bool. Whether the weights are returned.
        training: bool or None.
        capabilities: None (the backend's own), or a `Capabilities`.
        skip: the names of paths not to ask (a path that declined the call).

    Returns:
        `(name, block)`: one of `"flex"`, `"fused"`, `"fused_blocks"`,
        `"reference"` and `"reference_blocks"`, and the queries of a block
        (None for the paths without blocks).
    """
    call = Call(
        attention, query, value, context, returns_scores, training,
        capabilities or _backend.capabilities(),
    )
    for name, accepts in PATHS[:-1]:
        if name not in skip:
            chosen = accepts(call)
            if chosen is not None:
                return chosen
    return _reference_accepts(call)


def _eager_block(block, per_query):
    """`block`, or fewer queries where each step writes a tensor of a block's size.

    For a call that goes by blocks anyway: on eager PyTorch, blocks of
    `EAGER_BLOCK_ELEMENTS` entries, `per_query` to a query.
    """
    if not _backend.writes_every_tensor():
        return block
    return min(block, max(SMALLEST_QUERY_BLOCK, EAGER_BLOCK_ELEMENTS // max(per_query, 1)))


def attend(
    attention, query, key, value, attention_mask, context, training, returns_scores
):
    """The attention of the scaled, transformed heads, by the path `choose` picks.

    Args:
        attention: the call's `Attention`.
        query: tensor of shape `(batch, query, heads, key_dim)`, multiplied
            by the scheme's `logits_scale`.
        key: tensor of shape `(batch, key, key/value heads, key_dim)`, the
            key/value heads dividing the query heads (grouped-query
            attention where fewer).
        value: tensor of shape `(batch, key, key/value heads, value_dim)`.
        attention_mask: None, or the inputs' and the caller's masks
            combined, `(batch, query, key)` or `(batch, heads | 1, query,
            key)`.
        context: the call's `AttentionContext`.
        training: bool or None.
        returns_scores: bool.

    Returns:
        `(output, weights)`: the output, `(batch, query, heads,
        value_dim)`, and the weights, `(batch, heads, query, key)`, or None
        where they are not asked for.
    """
    # The one answer of the backend that a scheme reads: whether XLA fuses
    # the attention whole (JAX on the CPU).
    context = context.replace(fused=_backend.fuses_attention())
    path, block = choose(attention, query, value, context, returns_scores, training)
    position = attention.position
    if path == "flex":
        output = flex(attention, query, key, value, attention_mask, context)
        if output is not None:
            return output, None
        # Declined (no bias from the scheme) or failed: the next path.
        path, block = choose(
            attention, query, value, context, returns_scores, training, skip=("flex",)
        )
        if path == "flex":  # a `choose` made to take it, in the tests
            path, block = "fused", None
    groups = query.shape[2] // key.shape[2]
    if groups > 1 and not (
        path == "fused"
        and (
            position is None
            or not {"logits_bias", "value_term"} & position.contributions
        )
    ):
        # Query head `h` reads key/value head `h // groups`. The fused
        # kernels take the groups as they are where nothing else reads the
        # keys; elsewhere each key/value head is repeated over its group.
        key = keras.ops.repeat(key, groups, axis=2)  # (batch, key, heads, key_dim)
        value = keras.ops.repeat(value, groups, axis=2)
    if path == "fused":
        first = 0 if context.consecutive else None
        return fused(attention, query, key, value, attention_mask, context, first), None
    if path == "reference":
        return reference(
            attention, query, key, value, attention_mask, context, training,
            returns_scores,
        )
    groups = causal_groups(query, key, block, context)
    if len(groups) == 1:
        return (
            by_blocks(
                attention,
                block,
                _one_block(path, attention, key, value, context, training, 0, True),
                query,
                value.shape,
                value.dtype,
                attention_mask,
                context,
            ),
            None,
        )
    outputs = []
    for start, stop, keys in groups:
        outputs.append(
            by_blocks(
                attention,
                block,
                # The keys first in the logits' product: XLA then lays
                # out the group's few queries, not its many keys, with
                # their features first.
                _one_block(
                    path, attention, key[:, :keys], value[:, :keys], context,
                    training, start, False,
                ),
                query[:, start:stop],
                value.shape,
                value.dtype,
                _mask_part(attention_mask, query, key, start, stop, keys),
                context.replace(
                    query_positions=context.query_positions[:, start:stop],
                    key_positions=context.key_positions[:, :keys],
                ),
            )
        )
    return keras.ops.concatenate(outputs, axis=1), None


def causal_groups(query, key, block, context):
    """The queries in groups, each with the keys it may see: `(start, stop, keys)`.

    Under the causal mask at the default positions, query `i` sees keys
    `0 .. i` alone: a group of queries ending before query `stop` reads
    the first `stop` keys only, and the softmax of a query is the same
    without the keys its mask removes. So the blocks of queries go in up
    to `CAUSAL_GROUPS` groups, each group's blocks reading its keys: about
    `(groups + 1) / (2 groups)` of the logits are computed, as a flash
    kernel skips the blocks of keys after its queries. Otherwise one
    group: every query, every key.

    Args:
        query: tensor of shape `(batch, query, heads, key_dim)`.
        key: tensor of shape `(batch, key, heads, key_dim)`.
        block: int. The queries of a block.
        context: the call's `AttentionContext`.

    Returns:
        A list of `(start, stop, keys)`, the groups in order, covering the
        queries.
    """
    queries, keys = query.shape[1], key.shape[1]
    whole = queries // block
    if not (context.causal and context.consecutive and keys is not None and whole > 1):
        return [(0, queries, keys)]
    groups = min(whole, CAUSAL_GROUPS)
    bounds = [block * (whole * index // groups) for index in range(groups + 1)]
    bounds[-1] = queries  # the queries past the last whole block join the last group
    return [
        (start, stop, min(keys, stop))
        for start, stop in zip(bounds[:-1], bounds[1:])
    ]


def _mask_part(attention_mask, query, key, start, stop, keys):
    """The rows `start:stop` and the first `keys` columns of the mask, where it has them."""
    if attention_mask is None:
        return None
    if attention_mask.shape[-2] == query.shape[1]:
        attention_mask = attention_mask[..., start:stop, :]
    if attention_mask.shape[-1] == key.shape[1]:
        attention_mask = attention_mask[..., :keys]
    return attention_mask


def _one_block(path, attention, key, value, context, training, offset, query_first):
    """The function of a block that `by_blocks` calls, on `path`.

    `offset` is the first query of the group the blocks belong to;
    `query_first` as `reference` takes it.
    """
    if path == "fused_blocks":

        def one_block(rows, mask, block_context, start):
            first = offset + start if context.consecutive else None
            return fused(attention, rows, key, value, mask, block_context, first)

        return one_block
    # The keys and values enter the loop laid out as XLA's products read
    # them, and are turned back inside it, which XLA cancels: else it
    # transposes them inside the loop, once per block. The keys `(batch,
    # heads, dim, key)`; the values `(batch, heads, key, dim)`, or where
    # XLA fuses Keras' order whole (`_backend.fuses_attention`) `(batch,
    # heads, dim, key)`, as its fused kernel reads them.
    keys = keras.ops.transpose(key, [0, 2, 3, 1])  # (batch, heads, dim, key)
    value_axes, value_back = [0, 2, 1, 3], [0, 2, 1, 3]
    if _backend.fuses_attention():
        value_axes, value_back = [0, 2, 3, 1], [0, 3, 1, 2]
    values = keras.ops.transpose(value, value_axes)

    def one_block(rows, mask, block_context, start):
        return reference(
            attention,
            rows,
            keras.ops.transpose(keys, [0, 3, 1, 2]),
            keras.ops.transpose(values, value_back),
            mask,
            block_context,
            training,
            False,
            query_first=query_first,
        )[0]

    return one_block


def flex(attention, query, key, value, attention_mask, context):
    """FlexAttention with the scheme's `score_bias` inside it, or None.

    The masks become FlexAttention's `mask_mod`: the caller's mask read
    entry by entry, the cache's empty slots, the causal mask and the
    sliding window from the positions. Where the positions are
    consecutive and nothing else masks, the blocks of queries and keys
    that the causal mask or the window empties are skipped. None where
    the scheme gives no `score_bias`, where there is a gradient to record
    and FlexAttention has no backward pass here, or where it fails (it
    warns once).

    Returns:
        None, or the output, `(batch, query, heads, value_dim)`.
    """
    position = attention.position
    capabilities = _backend.capabilities()
    if not capabilities.flex_trains and _backend.records_gradient():
        return None
    bias = position.score_bias(query, key, context)
    if bias is None:
        return None

    def score_mod(score, batch, head, query_index, key_index):
        # In float32, as the logits: a compiled kernel's scores are, and an
        # eager one's in bfloat16 would round a bias of 75 to a half.
        return keras.ops.cast(score, "float32") + bias(
            batch, head, query_index, key_index
        )

    mask = None if attention_mask is None else _four_axes(attention_mask)
    cache = context._cache
    window = attention.sliding_window
    causal = context.causal
    mask_mod = band = None
    if mask is not None or cache is not None or causal or window is not None:

        def mask_mod(batch, head, query_index, key_index):
            allowed = key_index >= 0
            if mask is not None:
                allowed = keras.ops.logical_and(
                    allowed,
                    ops.table_at(
                        mask,
                        batch if mask.shape[0] != 1 else 0,
                        head if mask.shape[1] != 1 else 0,
                        query_index,
                        key_index,
                    ),
                )
            if cache is not None:
                allowed = keras.ops.logical_and(allowed, cache.written_at(key_index))
            if causal or window is not None:
                distance = context.key_position_at(
                    batch, key_index
                ) - context.query_position_at(batch, query_index)  # j - i
                if causal:
                    allowed = keras.ops.logical_and(allowed, distance <= 0)
                if window is not None:
                    allowed = keras.ops.logical_and(
                        allowed, keras.ops.abs(distance) < window
                    )
            return allowed

        if (
            context.consecutive
            and mask is None
            and (cache is None or causal)
            and (causal or window is not None)
        ):
            # The keys from 0, the queries from their first position on.
            first = ops.table_at(context.query_positions, 0, 0) - ops.table_at(
                context.key_positions, 0, 0
            )
            low = None if window is None else 1 - window
            high = 0 if causal else (None if window is None else window - 1)
            band = (first, low, high)
    return _backend.flex_attention(
        keras.ops.cast(query, value.dtype),
        keras.ops.cast(key, value.dtype),
        value,
        score_mod,
        mask_mod,
        band,
        compiled=capabilities.flex_compiles,
        name=type(position).__name__,
    )


def fused(attention, query, key, value, attention_mask, context, first_query):
    """The backend's fused attention, with the scheme's bias where it adds one.

    `first_query` is the first query's position where the queries' and the
    keys' are consecutive (the keys' from 0), else None.
    """
    position = attention.position
    bias = None
    if position is not None and "logits_bias" in position.contributions:
        bias = bias_of(position, query, key, context, first_query)
    # The backends' causal kernels take no bias beside them.
    is_causal = (
        bias is None
        and context.causal
        and context.consecutive
        and attention_mask is None
        and attention.sliding_window is None
        and context.cache_update_index is None
    )
    mask = None
    if not is_causal:
        mask = mask_of(attention, attention_mask, context)
    # The kernels take one dtype: the values', the attention's compute
    # dtype (a scheme of another policy may return float32 queries).
    query = keras.ops.cast(query, value.dtype)
    key = keras.ops.cast(key, value.dtype)
    if bias is not None:
        bias = keras.ops.cast(bias, value.dtype)  # (batch | 1, heads, query, key)
    return _backend.fused_attention(
        query,
        key,
        value,
        bias=bias,
        mask=mask,
        is_causal=is_causal,
        flash_attention=attention.flash_attention,
    )  # (batch, query, heads, value_dim)


def bias_of(position, query, key, context, first_query):
    """The scheme's bias, `(batch or 1, heads, query, key)`, or None.

    From `relative_bias` where the scheme states it on a line: at
    consecutive positions (`first_query` not None) evaluated once per
    relative position, `first_query + query - 1` before the first key to
    `key - 1 - first_query` after it, and spread over the queries and keys,
    each diagonal of the bias one entry of that vector
    (`_backend.spread_diagonals`); else at every pair of positions.
    Otherwise `logits_bias`.
    """
    if (
        "relative_bias" in position.contributions
        and position.num_axes == 1
        and not position.num_prefix_tokens
        and context.adjacency is None
    ):
        queries, keys = query.shape[1], key.shape[1]
        # Spread from a vector of lengths known when traced, at least one.
        if first_query is None or not (queries and keys):
            bias = position.relative_bias(
                ops.relative_position(context.query_positions, context.key_positions)
            )  # (batch or 1, heads, query, key)
        else:
            relative = keras.ops.arange(
                queries + keys - 1, dtype="int32"
            ) - (first_query + queries - 1)  # (query + key - 1,)
            per_distance = position.relative_bias(
                relative[None, None]
            )  # (1, heads, 1, query + key - 1)
            bias = None
            if per_distance is not None:
                bias = _backend.spread_diagonals(
                    per_distance[:, :, 0], queries, keys
                )  # (1, heads, query, key)
        if bias is not None:
            return bias
    return checked_bias(position, position.logits_bias(query, key, context), query, key)


def by_blocks(
    attention, size, one_block, query, value_shape, value_dtype, attention_mask, context
):
    """`one_block` over blocks of `size` queries, one after another.

    Where the backend differentiates a write into a slice (JAX, PyTorch)
    and the output has the queries' shape, each block's output is written
    where its queries were, in the one tensor the loop carries; else (on
    TensorFlow, whose slice update has no gradient) the blocks go through
    `keras.ops.map` and are joined. The queries past the last whole block
    go last, as a block of their own. A block's context keeps `consecutive`
    only for a scheme whose `query_block` is the size: such a scheme reads
    a block's consecutive positions from its first one on.

    Args:
        attention: the call's `Attention`.
        size: int. The queries of a block.
        one_block: function of `(rows, mask, block_context, start)` to
            the block's output, `(batch, size, heads, value_dim)`; `start`
            is the block's first query.
        query: tensor of shape `(batch, query, heads, key_dim)`.
        value_shape: the values' shape, `(batch, key, heads, value_dim)`.
        value_dtype: the values' dtype, the output's.
        attention_mask: as `attend` takes it.
        context: the call's `AttentionContext`.

    Returns:
        The output, `(batch, query, heads, value_dim)`.
    """
    queries = query.shape[1]
    query_positions = context.query_positions
    keeps_consecutive = (
        attention.position is not None and attention.position.query_block == size
    )
    position_rows = keras.ops.shape(query_positions)[0]
    mask_rows = attention_mask is not None and attention_mask.shape[-2] == queries

    def run(start, length, queries_tensor):
        rows = keras.ops.slice(
            queries_tensor,
            (0, start, 0, 0),
            (keras.ops.shape(query)[0], length) + tuple(query.shape[2:]),
        )  # (batch, length, heads, key_dim)
        positions = keras.ops.slice(
            query_positions,
            (0, start) + (0,) * (len(query_positions.shape) - 2),
            (position_rows, length) + tuple(query_positions.shape[2:]),
        )
        mask = attention_mask
        if mask_rows:
            mask = keras.ops.slice(
                mask,
                (0,) * (len(mask.shape) - 2) + (start, 0),
                tuple(keras.ops.shape(mask)[:-2]) + (length, mask.shape[-1]),
            )
        block_context = context.replace(
            query_positions=positions,
            consecutive=context.consecutive and keeps_consecutive,
            grid_shape=None,
        )
        return one_block(rows, mask, block_context, start)  # (batch, length, heads, dim)

    whole = queries // size
    if _backend.differentiates_update_slices() and (
        tuple(value_shape[2:]) == tuple(query.shape[2:]) and value_dtype == query.dtype
    ):
        # Each block's output written where its queries were, in the one
        # tensor the loop carries and reads them from: no second buffer of
        # the output's size.
        def write(start, length, state):
            return keras.ops.slice_update(
                state,
                (0, start, 0, 0),
                keras.ops.cast(run(start, length, state), state.dtype),
            )

        output = keras.ops.fori_loop(
            0, whole, lambda index, state: write(index * size, size, state), query
        )
        if queries % size:
            output = write(whole * size, queries % size, output)
        return output
    blocks = keras.ops.map(
        _backend.unconverted(lambda index: run(index * size, size, query)),
        keras.ops.arange(whole, dtype="int32"),
    )  # (blocks, batch, size, heads, value_dim)
    batch_size = keras.ops.shape(query)[0]
    output = keras.ops.reshape(
        keras.ops.transpose(blocks, [1, 0, 2, 3, 4]),
        (batch_size, whole * size) + tuple(blocks.shape[3:]),
    )  # (batch, whole * size, heads, value_dim)
    if queries % size:
        tail = run(whole * size, queries % size, query)  # (batch, tail, heads, value_dim)
        output = keras.ops.concatenate([output, keras.ops.cast(tail, output.dtype)], axis=1)
    return output


def _broadcast_batch(factors, heads):
    """`factors` of batch 1 or `batch`, broadcast to the batch of `heads`."""
    shape = keras.ops.shape(factors)
    return keras.ops.broadcast_to(
        factors, (keras.ops.shape(heads)[0],) + tuple(shape[1:])
    )


def _last_axis_max(x, keepdims=False):
    """The largest entry over the last axis, `-inf` over none, as TensorFlow's.

    `keras.ops.max` refuses a tensor without entries (no queries or no
    keys), whose maxima the softmax never reads.
    """
    if 0 in x.shape:
        shape = tuple(keras.ops.shape(x)[:-1]) + ((1,) if keepdims else ())
        return keras.ops.full(shape, float("-inf"), dtype=x.dtype)
    return keras.ops.max(x, axis=-1, keepdims=keepdims)


def _biased_exponentials(logits, bias, block_size, bias_maxima):
    """`exp(logits + bias - c)`, `c` from the logits' maxima over blocks of keys.

    The softmax needs `c` at least each query's largest biased logit, so
    that no exponential overflows, and not far above it. The largest
    unbiased logit of each block of keys plus the bias's largest value
    there (`AttentionPosition.logits_bias_maxima`) is at least every biased
    logit of the block, and at most the bias's spread above one of them:
    their maximum over blocks is such a `c`. The logits are read once for
    the blocks' maxima and once for the exponentials, the bias computed
    inside that pass, where adding it first would write the biased logits
    for their maximum. The output does not depend on `c`: no gradient
    flows through it.

    Args:
        logits: float32 tensor of shape `(batch, heads, query, key)`.
        bias: float32 tensor broadcastable to it.
        block_size: int. Divides `key`.
        bias_maxima: float32 tensor of shape `(batch or 1, heads, query,
            key / block_size)`.

    Returns:
        A float32 tensor of the logits' shape.
    """
    batch, heads, queries, keys = keras.ops.shape(logits)
    block_maxima = _last_axis_max(
        keras.ops.reshape(
            logits, (batch, heads, queries, keys // block_size, block_size)
        )
    )  # (batch, heads, query, key / block_size)
    shift = keras.ops.stop_gradient(
        _last_axis_max(block_maxima + bias_maxima, keepdims=True)
    )  # (batch, heads, query, 1)
    return keras.ops.exp(logits + bias - shift)


def reference(
    attention,
    query,
    key,
    value,
    attention_mask,
    context,
    training,
    returns_scores,
    query_first=None,
):
    """The reference attention: float32 logits and softmax, every contribution.

    `query_first` orders the logits' product: XLA lays out its second
    operand with the features first, a transpose of the whole tensor, and
    the first with the features last, a cheap move of whole rows. So the
    queries come first unless they are the fewer (None: as their numbers
    say; a cached decoding step's one query goes second), or the keys
    were laid out once for every block of queries (True). Where XLA fuses
    Keras' order whole (`_backend.fuses_attention`), the keys come first,
    as there.

    Returns:
        `(output, weights)`, the weights None unless `returns_scores`.
    """
    position = attention.position
    mask = mask_of(attention, attention_mask, context)
    # Where a bias goes: without a mask, at the default positions, inside
    # the softmax's exponentials, if the scheme bounds it over blocks of
    # keys (`_biased_exponentials`); else, of rank two and in a float32
    # product, into the product as columns; else onto the logits. Where
    # XLA fuses Keras' own order whole (`_backend.fuses_attention`), in
    # that order: the bias onto the logits, the weights divided by their
    # sums before the values' product.
    fuses = _backend.fuses_attention()
    maxima = factors = None
    if position is not None and mask is None and context.consecutive and not fuses:
        maxima = position.logits_bias_maxima(context)
    if (
        position is not None
        and maxima is None
        and keras.backend.standardize_dtype(query.dtype) == "float32"
        and not fuses
        and _backend.float32_matmul_is_exact()
        and _backend.sums_product_columns_in_order()
    ):
        factors = position.logits_factors(context)
    query_with_factors, key_with_factors = query, key
    if factors is not None:
        # The bias joins the product as columns before each head's query
        # and key: `[u, q] . [v, k] = u . v + q . k`. First, so that the
        # sums over the head axis start with the bias's terms (ALiBi's
        # `m j - m i`, exact) before the small `q . k` ones.
        query_factors, key_factors = factors
        query_with_factors = keras.ops.concatenate(
            [_broadcast_batch(query_factors, query), query], axis=-1
        )  # (batch, query, heads, columns + key_dim)
        key_with_factors = keras.ops.concatenate(
            [_broadcast_batch(key_factors, key), key], axis=-1
        )  # (batch, key, heads, columns + key_dim)
    if query_first is None:
        query_first = None in (query.shape[1], key.shape[1]) or (
            query.shape[1] >= key.shape[1]
        )
    if query_first and not fuses:
        logits = keras.ops.einsum(
            "btnh,bsnh->bnts", query_with_factors, key_with_factors
        )
    else:
        logits = keras.ops.einsum(
            "bsnh,btnh->bnts", key_with_factors, query_with_factors
        )
    logits = keras.ops.cast(logits, "float32")  # (batch, heads, query, key)
    bias = None
    if position is not None and factors is None:
        bias = checked_bias(
            position, position.logits_bias(query, key, context), query, key
        )
        if bias is not None and maxima is None:
            logits = logits + bias
    # The softmax, normalized after the product with the values: with
    # `e = exp(logits - max)` and `z` its sum over keys, the output is
    # `(e @ value) / z`, one division per output feature, where dividing
    # the weights first, `(e / z) @ value`, takes one more pass over the
    # (batch, heads, query, key) logits. The dropout and a scheme's value
    # term are linear in the weights, so they take `e` as well. Under
    # float16 the sums `e @ value` may pass its largest value, 65504: it
    # divides first; and where XLA fuses Keras' order whole, the weights
    # are divided first as there (`sums` None).
    if maxima is not None:
        exponentials = _biased_exponentials(logits, bias, *maxima)
    elif mask is None:
        exponentials = keras.ops.exp(
            logits - _last_axis_max(logits, keepdims=True)
        )  # (batch, heads, query, key)
    else:
        # As Keras' masked softmax: a large negative number where masked,
        # then zero weight there (a query with no key left gets none).
        masked = keras.ops.where(mask, logits, -1e9)
        exponentials = keras.ops.where(
            mask,
            keras.ops.exp(masked - _last_axis_max(masked, keepdims=True)),
            0.0,
        )
    # Zero where every key is masked: that query's weights are all zero.
    sums = keras.ops.sum(exponentials, axis=-1, keepdims=True)  # (b, n, t, 1)
    if fuses and mask is None:
        # Keras' division: no sum is zero without a mask, and a check for
        # one would split the fusion.
        exponentials = exponentials / sums
        sums = None
    elif fuses or keras.backend.standardize_dtype(value.dtype) == "float16":
        exponentials = keras.ops.divide_no_nan(exponentials, sums)
        sums = None

    def normalized(exponentials):
        if sums is None:
            return exponentials
        return keras.ops.divide_no_nan(exponentials, sums)

    if returns_scores:
        weights = normalized(exponentials)
    if attention.dropout > 0.0:
        exponentials = attention.dropout_layer(exponentials, training=training)
        if returns_scores:
            weights = normalized(exponentials)
    output = keras.ops.einsum(
        "bnts,bsnh->btnh", keras.ops.cast(exponentials, value.dtype), value
    )  # (batch, query, heads, value_dim), times the sums
    if position is not None:
        term = checked_value_term(
            position, position.value_term(exponentials, context), output
        )
        if term is not None:
            output = output + keras.ops.cast(term, output.dtype)
    if sums is not None:
        output = keras.ops.cast(
            keras.ops.divide_no_nan(
                keras.ops.cast(output, "float32"),
                keras.ops.transpose(sums, [0, 2, 1, 3]),
            ),
            output.dtype,
        )  # (batch, query, heads, value_dim)
    if not returns_scores:
        return output, None
    return output, keras.ops.cast(weights, attention.scores_dtype)
