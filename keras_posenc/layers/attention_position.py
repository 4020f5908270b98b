"""The protocol between `PositionalMultiHeadAttention` and its position scheme.

`PositionalMultiHeadAttention` knows no scheme's internals: it asks its
`position`, an `AttentionPosition`, for each of three contributions, which
default to nothing, and for the scale of the logits:

- `transform_query_key`: the projected queries and keys, changed by their
  positions (RoPE rotates them);
- `logits_bias`: a term added to the logits, which may read the queries and
  the keys (ALiBi, T5 and Swin add a bias per head; Shaw et al. a product of
  the queries with a table; Transformer-XL a content and a position term);
- `value_term`: a term added to the weighted sum of values (Shaw et al.);
- `logits_scale`: what the queries are multiplied by, `1 / sqrt(key_dim)` by
  default (DeBERTa divides by more).

Each hook receives this call's `AttentionContext` as an argument: the
positions of the queries and keys, the graph on graphs, whether the mask is
causal, the cache offset, and the attention's own projections. A scheme
implements only the hooks that define it; see the "Write your own scheme"
page of the documentation for a complete one.

A scheme is built one way: the attention's build calls the base's
`build_for_attention` with its sizes, which checks them (`check_attention`),
records them (`attention_sizes`, the scheme's build config in a `.keras`
file) and makes the weights by `build_weights`, once.

What a scheme overrides is what it contributes (`contributions`), and the
attention's kernel picks its path from that: a scheme that changes the
queries and keys only runs on the backend's fused attention (PyTorch's
SDPA, JAX's `dot_product_attention` on GPUs and TPUs, flash attention
where asked); one that adds a bias runs there with its bias, a block of
queries at a time; one with a value term runs the reference kernel, by
blocks of queries. Three optional parts let a scheme go faster without
changing its maths: `query_block`, `logits_factors` and
`logits_bias_maxima`.
"""

import dataclasses
import math
from typing import Any, Callable, Optional

import keras

from keras_posenc import ops
from keras_posenc.layers._attention_cache import AttentionCache

# The attention's sizes that `build_for_attention` records.
SIZES = ("num_heads", "key_dim", "value_dim", "features")


@dataclasses.dataclass(frozen=True)
class AttentionContext:
    """What one call of `PositionalMultiHeadAttention` tells its position.

    The attention makes one per call (and one per block of queries, where it
    attends by blocks) and passes it to every hook of its `AttentionPosition`.
    Positions cover the tokens after the scheme's `num_prefix_tokens` only;
    the relative position of a key to a query is always `key_position -
    query_position` (per axis on a grid).

    Attributes:
        query_positions: int32 tensor of shape `(batch or 1, query)`, or
            `(batch or 1, query, num_axes)` when the scheme's `num_axes` > 1;
            None for a scheme on graphs.
        key_positions: int32 tensor of shape `(batch or 1, key)` or `(batch
            or 1, key, num_axes)`, likewise. With a cache, the positions of
            all its slots.
        adjacency: for a scheme on graphs (`takes_adjacency`), the graph the
            attention's caller gave, `(batch, nodes, nodes)`; else None.
        causal: bool. Whether the call masks keys after each query's
            position (`use_causal_mask=True`).
        cache_update_index: None without a cache; with one, the slot of the
            first new token (an int or an int32 scalar tensor), so that the
            queries sit at `cache_update_index + 0, 1, ...` when their
            positions are the default.
        project_query: the attention's own query projection, a function from
            features `(batch, length, features)` to heads `(batch, length,
            heads, key_dim)`: for
            a scheme that projects a table of its own with it (DeBERTa's
            `share_att_key`). None outside an attention.
        project_key: the attention's key projection, likewise.
        consecutive: bool. For speed only, and a scheme may ignore it:
            whether the positions are the defaults, `0 .. query - 1` and
            `0 .. key - 1` on one axis, whose structure a scheme may use
            (for a block of queries that a package scheme asks for, the
            block's consecutive positions).
        grid_shape: None, or a tuple of ints. For speed only, as
            `consecutive`: where the call took `grid_shape`, that grid, and
            the query and key positions are then both its cells, row-major,
            `ops.grid_positions(grid_shape)`, whose structure a scheme may
            use (None for a block of queries).
        fused: bool. For speed only, as `consecutive`, and set by the
            attention's kernel: whether XLA runs the attention whole as one
            fused kernel (JAX on the CPU), which takes in a bias computed
            element by element from vectors, and where a bias shared by the
            batch is the cheaper one.

    Example:

    >>> context = AttentionContext(
    ...     query_positions=keras.ops.arange(3, dtype="int32")[None],
    ...     key_positions=keras.ops.arange(5, dtype="int32")[None],
    ...     causal=True,
    ... )
    >>> tuple(context.query_positions.shape), context.causal
    ((1, 3), True)
    """

    query_positions: Any = None
    key_positions: Any = None
    adjacency: Any = None
    causal: bool = False
    cache_update_index: Any = None
    project_query: Optional[Callable] = None
    project_key: Optional[Callable] = None
    consecutive: bool = False
    grid_shape: Optional[tuple] = None
    fused: bool = False
    # The attention's `AttentionCache`, which says which slots hold a key;
    # for a context made with a `cache_update_index` alone, one made from
    # it and the positions.
    _cache: Optional[AttentionCache] = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self):
        if self._cache is not None:
            object.__setattr__(self, "cache_update_index", self._cache.update_index)
        elif self.cache_update_index is not None and not (
            self.query_positions is None or self.key_positions is None
        ):
            object.__setattr__(
                self,
                "_cache",
                AttentionCache(
                    update_index=self.cache_update_index,
                    new_length=keras.ops.shape(self.query_positions)[1],
                    slots=keras.ops.shape(self.key_positions)[1],
                ),
            )

    def replace(self, **changes):
        """A copy of this context with `changes` to its fields."""
        if "cache_update_index" in changes:
            changes.setdefault("_cache", None)  # made again from the new index
        return dataclasses.replace(self, **changes)

    def query_position_at(self, batch, index):
        """The position of query `index` of batch entry `batch`, pointwise.

        For `AttentionPosition.score_bias`: `batch` and `index` are integer
        tensors that broadcast together (whole grids, or one entry each
        inside a fused kernel). On a grid, a tuple of one tensor per axis.
        """
        return _position_at(self.query_positions, batch, index, self.consecutive)

    def key_position_at(self, batch, index):
        """The position of key `index` of batch entry `batch`, pointwise.

        As `query_position_at`, for the keys (a cache's slots included).
        """
        return _position_at(self.key_positions, batch, index, self.consecutive)


def _position_at(positions, batch, index, consecutive):
    """`positions[batch, index]`, batch 1 read for every entry; per axis on grids."""
    if consecutive and len(positions.shape) == 2:
        # Consecutive positions run on from the first by one per index.
        return ops.table_at(positions, 0, 0) + keras.ops.cast(index, "int32")
    row = batch if positions.shape[0] != 1 else 0
    if len(positions.shape) == 2:
        return ops.table_at(positions, row, index)
    # A list first: PyTorch's compiler cannot trace a generator.
    return tuple(
        [ops.table_at(positions, row, index, axis) for axis in range(positions.shape[2])]
    )


@keras.saving.register_keras_serializable(package="keras_posenc")
class AttentionPosition(keras.layers.Layer):
    """Base of the position schemes that `PositionalMultiHeadAttention` takes.

    Subclass it and override the hooks that define your scheme; the others
    contribute nothing. The attention calls, in order:

    1. `build_for_attention(num_heads, key_dim, value_dim, features)` when
       it builds. This base class's checks the sizes (`check_attention`),
       records them (`attention_sizes`) and, the first time, calls
       `build_weights` with them, where a scheme makes its weights. A
       scheme shared by several attentions is built once; set
       `weight_sizes` to the sizes its weights are made for, which the
       later attentions must then have too.
    2. `transform_query_key(query, key, context)` on the projected heads.
    3. `logits_scale(key_dim)`: the queries are multiplied by it.
    4. `logits_bias(query, key, context)`: added to `q . k` (the queries
       already scaled), in float32.
    5. `value_term(attention_weights, context)`: added to the weighted sum
       of the values.

    Tensors cover all tokens, the scheme's `num_prefix_tokens` first; the
    positions in the `AttentionContext` cover the tokens after them. Set
    the class attributes `num_axes` (the coordinates of a position, 1 by
    default: 2 or 3 on image and video grids), `num_prefix_tokens` (the
    leading tokens without a position, such as a class token: 0 by
    default) and `takes_adjacency` (True for a scheme on graphs, which
    reads `context.adjacency` and no positions).

    Save what the constructor takes in `get_config`, as every Keras layer
    does, and register the class
    (`keras.saving.register_keras_serializable`): an attention holding the
    scheme then saves to `.keras` and loads back. The sizes recorded when
    it was built are its build config, so a scheme saved on its own is
    built again for them when it loads. A scheme written before the build
    path was one, that overrides `build_for_attention` itself, still works.

    Example, a learned bias per head that decays with distance:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> class DistanceDecay(AttentionPosition):
    ...     weight_sizes = ("num_heads",)
    ...     def build_weights(self, num_heads, key_dim, value_dim, features=None):
    ...         self.rate = self.add_weight(shape=(num_heads,), initializer="ones")
    ...     def logits_bias(self, query, key, context):
    ...         distance = keras.ops.abs(
    ...             context.key_positions[:, None, :] - context.query_positions[:, :, None]
    ...         )  # (batch or 1, query, key)
    ...         return -self.rate[:, None, None] * keras.ops.cast(distance, "float32")[:, None]
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=4, position=DistanceDecay()
    ... )
    >>> tokens = np.ones((1, 5, 8), "float32")
    >>> tuple(attention(tokens, tokens).shape)
    (1, 5, 8)
    >>> attention.position.attention_sizes
    {'num_heads': 2, 'key_dim': 4, 'value_dim': 4, 'features': 8}
    """

    num_axes = 1
    num_prefix_tokens = 0
    takes_adjacency = False
    # Optional: the queries the kernel takes at a time where it goes by
    # blocks (None lets it choose). A scheme that sets it gets each block's
    # context with `consecutive` kept, its positions running on from the
    # block's first query.
    query_block = None
    # Optional: the sizes of the attention, among "num_heads", "key_dim",
    # "value_dim" and "features", that `build_weights` makes the weights
    # for. A later attention sharing the scheme must agree on them, and a
    # scheme with any has no weights before an attention's sizes.
    weight_sizes = ()
    # The attention's sizes once built for one, in `SIZES` order.
    _attention_sizes = None

    @property
    def contributions(self):
        """What this scheme contributes: the hooks its class overrides.

        A frozenset of the names among `"transform_query_key"`,
        `"logits_scale"`, `"logits_bias"`, `"relative_bias"`,
        `"score_bias"` and `"value_term"` that the scheme's class defines
        anew. The attention's kernel reads it: a scheme without
        `"logits_bias"` and `"value_term"` runs on the backend's fused
        attention, with `flash_attention=True` too; one with
        `"score_bias"` has its bias computed inside FlexAttention on
        PyTorch's GPUs; one with `"relative_bias"` has its bias computed
        once per relative position where the positions are consecutive.
        """
        return frozenset(
            name
            for name in (
                "transform_query_key",
                "logits_scale",
                "logits_bias",
                "relative_bias",
                "score_bias",
                "value_term",
            )
            if getattr(type(self), name) is not getattr(AttentionPosition, name)
        )

    def check_attention(self, num_heads, key_dim, value_dim):
        """Raise a `ValueError` unless this scheme can serve such attention.

        By default, unless the sizes are positive integers.

        Args:
            num_heads: int. The attention's number of heads.
            key_dim: int. The size of each head's queries and keys.
            value_dim: int. The size of each head's values.
        """
        for name, size in (
            ("num_heads", num_heads),
            ("key_dim", key_dim),
            ("value_dim", value_dim),
        ):
            ops.check_positive_int(name, size)

    def _check_num_heads(self, num_heads):
        """For schemes with a term per head: their heads must be the attention's."""
        if num_heads != self.num_heads:
            raise ValueError(
                f"`num_heads` of {type(self).__name__} must equal the "
                "attention's number of heads. Received: "
                f"num_heads={self.num_heads} for attention with "
                f"num_heads={num_heads}"
            )

    @property
    def attention_sizes(self):
        """The sizes of the attention this scheme was built for, or None.

        A dict of `"num_heads"`, `"key_dim"`, `"value_dim"` and
        `"features"` (None where the build had none), as the first
        `build_for_attention` received them; None before it.
        """
        if self._attention_sizes is None:
            return None
        return dict(zip(SIZES, self._attention_sizes))

    def build_for_attention(self, num_heads, key_dim, value_dim, features=None):
        """Check the sizes, record them and make the weights, once.

        The attention's one way to build its scheme: `check_attention`
        first, then, the first time, `build_weights` with these sizes,
        which `attention_sizes` then holds. Built already, for another
        attention, the scheme keeps its weights, and the sizes named in
        `weight_sizes` must equal those it was built for. Override
        `build_weights`, not this.

        Args:
            num_heads: int. The attention's number of heads.
            key_dim: int. The size of each head's queries and keys.
            value_dim: int. The size of each head's values.
            features: int or None. The size of the attention's query
                inputs, for a scheme whose table the attention's own
                projections read. Defaults to `None`.
        """
        self.check_attention(num_heads, key_dim, value_dim)
        ops.check_positive_int("features", features, allow_none=True)
        sizes = (num_heads, key_dim, value_dim, features)
        if self._attention_sizes is None:
            # A scheme built by a call on its own has its weights already.
            if not self.built:
                self.build_weights(num_heads, key_dim, value_dim, features)
            self._attention_sizes = sizes
        else:
            names = self.weight_sizes
            built_for = tuple(self.attention_sizes[name] for name in names)
            received = tuple(dict(zip(SIZES, sizes))[name] for name in names)
            if received != built_for:
                raise ValueError(
                    f"This {type(self).__name__} was built for attention with "
                    f"({', '.join(names)})={built_for}, the sizes of its "
                    f"weights. Received: ({', '.join(names)})={received}"
                )
        self.built = True

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        """Make the scheme's weights for an attention of these sizes.

        Called once, by `build_for_attention` after `check_attention` (or
        by the `build` of a scheme whose weights need no attention, when
        it is called on its own first): `self.add_weight(...)` here, as a
        Keras layer does in `build`. Makes none by default.

        Args:
            num_heads: int. The attention's number of heads.
            key_dim: int. The size of each head's queries and keys.
            value_dim: int. The size of each head's values.
            features: int or None. The size of the attention's query
                inputs, None where the build had none. Defaults to `None`.
        """

    def build(self, input_shape=None):
        # A call on its own: the weights of `weight_sizes` need an attention's.
        if self.weight_sizes and self._attention_sizes is None:
            raise ValueError(
                f"{type(self).__name__} sizes its weights by the attention's "
                f"{', '.join(self.weight_sizes)}: pass it to "
                "PositionalMultiHeadAttention as `position`, or call "
                "`build_for_attention(num_heads, key_dim, value_dim, "
                "features)` before calling it on its own. Received: a build "
                f"for inputs of shape {input_shape}"
            )

    def get_build_config(self):
        if self._attention_sizes is not None:
            return self.attention_sizes
        return super().get_build_config()

    def build_from_config(self, config):
        if config and "key_dim" in config:
            # Older files hold only the sizes the weights read: one head
            # and `value_dim=key_dim` stand for the others.
            key_dim = config["key_dim"]
            self.build_for_attention(
                config.get("num_heads", 1),
                key_dim,
                config.get("value_dim", key_dim),
                config.get("features"),
            )
        else:
            super().build_from_config(config)

    def logits_scale(self, key_dim):
        """The factor the queries are multiplied by: `1 / sqrt(key_dim)`.

        Args:
            key_dim: int. The size of each head's queries and keys.

        Returns:
            A Python float.
        """
        return 1.0 / math.sqrt(key_dim)

    def transform_query_key(self, query, key, context):
        """The projected queries and keys, transformed by their positions.

        Args:
            query: tensor of shape `(batch, num_prefix_tokens + query, heads,
                key_dim)`.
            key: tensor of shape `(batch, num_prefix_tokens + key, heads,
                key_dim)`. With a cache, the new keys only, whose positions
                are `context.key_positions`.
            context: the call's `AttentionContext`.

        Returns:
            A tuple `(query, key)` of the same shapes and dtypes.
        """
        return query, key

    def logits_bias(self, query, key, context):
        """A float32 term added to the attention logits, or None.

        Args:
            query: tensor of shape `(batch, num_prefix_tokens + query, heads,
                key_dim)`: the projected and transformed queries, already
                multiplied by `logits_scale(key_dim)` as in the logits.
            key: tensor of shape `(batch, num_prefix_tokens + key, heads,
                key_dim)`: the projected and transformed keys (all of the
                cache's slots, with a cache).
            context: the call's `AttentionContext`.

        Returns:
            None, or a float32 tensor broadcastable to `(batch, heads,
            num_prefix_tokens + query, num_prefix_tokens + key)`.
        """
        return None

    def score_bias(self, query, key, context):
        """Optional: `logits_bias` entry by entry, for a fused kernel, or None.

        For speed only. Returns a function `bias(batch, head, query_index,
        key_index)` of integer tensors that broadcast together, giving the
        float32 bias at those entries, or None. A fused kernel
        (FlexAttention on PyTorch's GPUs, as its `score_mod`) calls it with
        one entry of each and adds it to each logit inside the kernel, so
        that no tensor of the logits' size is written; the tests call it
        on whole grids and compare it with `logits_bias`, which it must
        equal. Write it with `keras.ops` element-wise ops, read positions
        with `context.query_position_at(batch, query_index)` and
        `context.key_position_at(batch, key_index)`, and small tables (per
        head, per distance, per query) with `keras_posenc.ops.table_at`:
        nothing of the logits' size. Returns None by default.

        Args:
            query: tensor of shape `(batch, query, heads, key_dim)`, as
                `logits_bias` takes it.
            key: tensor of shape `(batch, key, heads, key_dim)`.
            context: the call's `AttentionContext`.

        Returns:
            None, or a function of four integer tensors to a float32 tensor
            of their broadcast shape.
        """
        return None

    def value_term(self, attention_weights, context):
        """A term added to the attention's weighted sum of values, or None.

        Args:
            attention_weights: float32 tensor of shape `(batch, heads,
                num_prefix_tokens + query, num_prefix_tokens + key)`: the
                weights after the softmax and dropout, or each query's
                weights times one positive number (the attention may divide
                by the softmax's sums after this term joins the values'),
                so the term must be linear in them.
            context: the call's `AttentionContext`.

        Returns:
            None, or a tensor of shape `(batch, num_prefix_tokens + query,
            heads, value_dim)`.
        """
        return None

    def logits_factors(self, context):
        """Optional: the bias as columns to join the queries and keys, or None.

        For speed only. A scheme whose bias is `sum_c u_c(i) v_c(j)`, a few
        columns `c`, can have the product of queries and keys add it: the
        reference kernel puts the columns `u` before each head's (scaled)
        query and `v` before its key, and adds no `logits_bias`. The
        logits-sized bias is then never written. Asked only where the
        logits are an exact float32 product; elsewhere the kernel adds
        `logits_bias`, which must give the same bias. Returns None by
        default.

        Args:
            context: the call's `AttentionContext`.

        Returns:
            None, or a tuple of float32 tensors `(u, v)` of shapes `(batch
            or 1, query, heads, columns)` and `(batch or 1, key, heads,
            columns)`.
        """
        return None

    def logits_bias_maxima(self, context):
        """Optional: the bias's largest value over each block of keys, or None.

        For speed only. The softmax subtracts a number from each query's
        logits so that no exponential overflows; any number at least their
        maximum, and not far above it, does. With the bias's largest value
        over each block of consecutive keys, the reference kernel takes the
        unbiased logits' maximum there plus it, and adds the bias inside
        the exponentials, where adding it first would write the biased
        logits once more. Asked only at the default positions, without a
        mask. Returns None by default.

        Args:
            context: the call's `AttentionContext`, positions of one axis.

        Returns:
            None, or a tuple `(block_size, maxima)`: an int dividing the
            number of keys, and a float32 tensor of shape `(batch or 1,
            heads, query, key / block_size)`: for each query and block of
            keys, at least every value of `logits_bias` there and at most
            32 above any.
        """
        return None

    def relative_bias(self, relative):
        """Optional: `logits_bias` as a function of relative positions alone.

        For speed only. A scheme whose bias per head depends on `key -
        query` alone (ALiBi's, T5's, KERPLE's) may state it here too: at
        consecutive positions the kernel then evaluates it once per
        relative position and spreads it over the queries and keys (each
        diagonal of the bias is one value), where `logits_bias` would
        compute each of the query x key entries. It must equal
        `logits_bias` at the positions it is given. Returns None by
        default, and the kernel calls `logits_bias`.

        Args:
            relative: int32 tensor of shape `(batch or 1, query, key)`: the
                key's position less the query's.

        Returns:
            None, or a float32 tensor of shape `(batch or 1, heads, query,
            key)`, each entry computed from its relative position alone.
        """
        return None
