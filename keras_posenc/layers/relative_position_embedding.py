import keras

from keras_posenc import ops
from keras_posenc.ops import _backend
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.layers._schemes import largest_divisor
from keras_posenc.layers._schemes import read_embeddings_initializer
from keras_posenc.layers._renamed import renamed_arguments


def _block_size(keys):
    """The block of keys of the sums by band, or None where they do not apply.

    At the attention's default positions the sums per distance read a band
    of `2k - 1` entries per query, the sums of the blocks of keys before a
    key, and the entries of its block: the largest divisor of `keys` up to
    `keys / 16` and 64, if at least 8. Longer blocks leave fewer sums and
    more entries to read, and took less memory in about the same time.
    None for a length unknown when traced, under 128,
    or without such a divisor (a prime, say): the segment sum then serves,
    whose copy of the weights is small where the keys are few.
    """
    if keys is None:
        return None
    return largest_divisor(keys, 8, min(64, keys // 16))


def _read_by_distance(per_distance, rows):
    """Each query's entry of the distance of each key.

    Args:
        per_distance: float tensor of shape `(batch, query, 2k + 1, heads)`.
        rows: int32 tensor of shape `(batch, query, key)`, entries in
            `[0, 2k]`.

    Returns:
        A tensor of shape `(batch, heads, query, key)`.
    """
    # Heads last, so the gather reads contiguous rows and XLA fuses it, and
    # the transpose after it, into the tensor's consumer.
    return keras.ops.transpose(
        _backend.take_rows_per_query(per_distance, rows), [0, 3, 1, 2]
    )  # (batch, heads, query, key)


def _sum_by_band(values, max_relative_position, block):
    """The sums of each query's entries per clipped distance, `-k` to `k`.

    For queries at positions `0 .. query - 1` and keys at `0 .. key - 1`,
    query `i` has one key at each distance `d` with `|d| < k`, key `i + d`
    (if there is one): a band of `2k - 1` entries read where they are. The
    keys at distance `-k` or less are those up to `i - k`: the sums of whole
    blocks of `block` keys before the block of key `i - k`, plus that
    block's entries up to it. The keys at `k` or more have the rest of the
    row's sum. Nothing of the size of `values` is written.

    Args:
        values: float32 tensor of shape `(batch, heads, query, key)`.
        max_relative_position: int. The clipping distance `k`.
        block: int. A divisor of `key`.

    Returns:
        A float32 tensor of shape `(batch, heads, query, 2k + 1)`.
    """
    k = max_relative_position
    batch_size, heads, queries, _ = keras.ops.shape(values)
    keys = values.shape[3]

    def take(entries, indices):
        # Each query's entries `indices`, (query, n), of `entries`, (batch,
        # heads, query, any): (batch, heads, query, n).
        return keras.ops.take_along_axis(entries, indices[None, None], axis=3)

    query_index = keras.ops.arange(queries, dtype="int32")[:, None]  # (query, 1)
    near = query_index + keras.ops.arange(
        1 - k, k, dtype="int32"
    )  # (query, 2k - 1): key i + d
    band = keras.ops.where(
        (near >= 0) & (near < keys),
        take(values, keras.ops.clip(near, 0, keys - 1)),
        0.0,
    )  # (batch, heads, query, 2k - 1)
    blocks = keys // block
    block_sums = keras.ops.sum(
        keras.ops.reshape(values, (batch_size, heads, queries, blocks, block)),
        axis=-1,
    )  # (batch, heads, query, blocks)
    last = query_index - k  # (query, 1): the last key at -k or less
    last_block = keras.ops.clip(
        keras.ops.floor_divide(last, block), 0, blocks - 1
    )  # (query, 1)
    # The sums of the blocks before each: a cumulative sum from a zero.
    exclusive_sums = keras.ops.cumsum(
        keras.ops.pad(block_sums, [[0, 0], [0, 0], [0, 0], [1, 0]])[..., :-1],
        axis=-1,
    )  # (batch, heads, query, blocks)
    before = take(exclusive_sums, last_block)[
        ..., 0
    ]  # (batch, heads, query): the blocks before `last_block`
    in_block = last_block * block + keras.ops.arange(
        block, dtype="int32"
    )  # (query, block)
    part = keras.ops.sum(
        keras.ops.where(in_block <= last, take(values, in_block), 0.0), axis=-1
    )  # (batch, heads, query)
    far_before = keras.ops.where(last[:, 0] >= 0, before + part, 0.0)
    far_after = (
        keras.ops.sum(block_sums, axis=-1)
        - far_before
        - keras.ops.sum(band, axis=-1)
    )  # (batch, heads, query)
    return keras.ops.concatenate(
        [far_before[..., None], band, far_after[..., None]], axis=-1
    )  # (batch, heads, query, 2k + 1)


def _by_band(query_positions, key_positions, max_relative_position, block):
    """`_read_by_distance` and the sums per distance, each the other's gradient.

    The two are adjoint: reading a table by distance and summing per
    distance. At the default positions each takes the other as its
    gradient, so that neither gradient scatters into a tensor of the
    logits' size, as TensorFlow's gradients of a gather do.

    Args:
        query_positions: int32 tensor of shape `(1, query)`, `0 .. query -
            1`.
        key_positions: int32 tensor of shape `(1, key)`, `0 .. key - 1`.
        max_relative_position: int. The clipping distance `k`.
        block: int. A divisor of `key`, the block of `_sum_by_band`.

    Returns:
        Two functions: `read(per_distance)`, `(batch, query, 2k + 1, heads)`
        to `(batch, heads, query, key)`, and `total(values)`, `(batch,
        heads, query, key)` to `(batch, query, 2k + 1, heads)`.
    """

    # The gradients take `upstream` as PyTorch's backend passes it, after
    # the function's arguments; TensorFlow and JAX pass it alone.
    @keras.ops.custom_gradient
    def read(per_distance):
        def gradient(*arguments, upstream=None):
            return total(arguments[-1] if upstream is None else upstream)

        rows = ops.clipped_distance_rows(
            query_positions,
            key_positions,
            max_relative_position,
            keras.ops.shape(per_distance)[0],
        )  # (batch, query, key)
        return _read_by_distance(per_distance, rows), gradient

    @keras.ops.custom_gradient
    def total(values):
        def gradient(*arguments, upstream=None):
            return read(arguments[-1] if upstream is None else upstream)

        sums = _sum_by_band(values, max_relative_position, block)
        return keras.ops.transpose(sums, [0, 2, 3, 1]), gradient

    return read, total


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments({"max_distance": "max_relative_position"})
class RelativePositionEmbedding(AttentionPosition):
    """Shaw et al.'s relative position representations, on keys and values.

    Relation-aware self-attention (Shaw, Uszkoreit and Vaswani 2018) gives
    each pair of query `i` and key `j` two learned vectors, `a^K_ij` and
    `a^V_ij`, read from tables of `2k + 1` rows by the clipped relative
    position `clip(j - i, -k, k)`, with `k = max_relative_position`
    (section 3.2, tensor2tensor's `max_relative_position`):
    every key more than `k` positions away shares the row of distance `k`
    (or `-k`). They enter the logits and the output (eq. 4 and 3):
    `e_ij = q_i (k_j + a^K_ij)^T / sqrt(d)` and
    `z_i = sum_j alpha_ij (v_j + a^V_ij)`. As in the paper, one pair of
    tables serves all heads.

    Inside `PositionalMultiHeadAttention`, which adds `q_i k_j^T / sqrt(d)`
    and `sum_j alpha_ij v_j` itself, this layer contributes the two position
    terms, split as in section 3.3 so that no `(query, key, key_dim)` tensor
    is ever formed: the logits term as the products of each query with all
    `2k + 1` rows of `a^K`, `(batch, heads, query, 2k + 1)`, gathered to
    `(batch, heads, query, key)`; the output term as the attention weights
    summed per clipped distance, `(batch, heads, query, 2k + 1)`, times
    `a^V`. At the attention's default positions, `0 .. query - 1` and
    `0 .. key - 1`, those sums are a band of `2k - 1` weights and two tails
    read from sums of blocks of keys, with no copy of the weights; other
    positions take a segment sum over the keys.

    Distances come from the positions of queries and keys, not from the
    lengths of their axes, so cached decoding (one query at its position
    against the keys so far), left padding and packed sequences need only
    their positions.

    The tables, weights `"key_embeddings"` of shape `(2k + 1, key_dim)` and
    `"value_embeddings"` of shape `(2k + 1, value_dim)`, are sized by the
    attention: they are made when `PositionalMultiHeadAttention` builds, or
    by `build_for_attention(num_heads, key_dim, value_dim)` for use on the
    layer's own. They are kept and read in float32 whatever the dtype
    policy, and both terms are computed in float32.

    Args:
        max_relative_position: int. The clipping distance `k`: relative
            positions beyond `k` either way share the table row of `k` (or
            `-k`). Shaw et al. use `16`.
        embeddings_initializer: str or `keras.initializers.Initializer`. How
            the two tables start. Defaults to `"uniform"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        query: float tensor of shape `(batch, query, heads, key_dim)`: the
            projected queries, already scaled by `1 / sqrt(key_dim)` as in
            the logits.
        query_positions: integer tensor of shape `(batch, query)`, or
            `(query,)` for positions shared by the batch.
        key_positions: integer tensor of shape `(batch, key)`, or `(key,)`.

    Returns:
        The logits term `q_i a^K_ij^T`: a float32 tensor of shape
        `(batch, heads, query, key)`. A call on the layer's own needs the
        tables, so `build_for_attention` must come first.

    Example:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> shaw = RelativePositionEmbedding(max_relative_position=16)
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=shaw
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> tuple(attention(tokens, tokens).shape)
    (1, 5, 16)
    >>> tuple(shaw.key_embeddings.shape), tuple(shaw.value_embeddings.shape)
    ((33, 8), (33, 8))
    >>> alone = RelativePositionEmbedding(max_relative_position=2)
    >>> alone.build_for_attention(num_heads=2, key_dim=4, value_dim=4)
    >>> queries = np.ones((1, 1, 2, 4), "float32")  # one query, 2 heads
    >>> tuple(alone(queries, np.array([10]), np.arange(11)).shape)  # keys 0 to 10
    (1, 2, 1, 11)

    References:
        - [Shaw et al., 2018](https://arxiv.org/abs/1803.02155)
    """

    # The tables are `(2k + 1, key_dim)` and `(2k + 1, value_dim)`.
    weight_sizes = ("key_dim", "value_dim")

    def __init__(
        self, max_relative_position, embeddings_initializer="uniform", **kwargs
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("max_relative_position", max_relative_position)
        initializer = read_embeddings_initializer(embeddings_initializer)
        self.max_relative_position = max_relative_position
        self.embeddings_initializer = initializer

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        rows = 2 * self.max_relative_position + 1
        self.key_embeddings = self.add_weight(
            name="key_embeddings",
            shape=(rows, key_dim),
            initializer=self.embeddings_initializer,
            # Read in float32 even inside a mixed precision attention.
            autocast=False,
        )
        self.value_embeddings = self.add_weight(
            name="value_embeddings",
            shape=(rows, value_dim),
            initializer=self.embeddings_initializer,
            autocast=False,
        )

    def _table_rows(self, query_positions, key_positions, batch_size):
        """The table row of every query and key: `clip(j - i, -k, k) + k`.

        Returns:
            An int32 tensor of shape `(batch_size, query, key)`.
        """
        # One row of indices per batch element, as the batched gather and
        # the segment sum below take them: 1 / heads of the logits' size.
        return ops.clipped_distance_rows(
            query_positions, key_positions, self.max_relative_position, batch_size
        )

    def logits_bias(self, query, key, context):
        query_positions = context.query_positions
        key_positions = context.key_positions
        # Section 3.3's second term for every distance at once.
        relative_logits = keras.ops.einsum(
            "btnd,rd->btrn", keras.ops.cast(query, "float32"), self.key_embeddings
        )  # (batch, query, 2k + 1, heads)
        block = _block_size(key_positions.shape[-1]) if context.consecutive else None
        if block is None:
            rows = self._table_rows(
                query_positions, key_positions, keras.ops.shape(query)[0]
            )  # (batch, query, key)
            return _read_by_distance(relative_logits, rows)
        read, _ = _by_band(
            query_positions, key_positions, self.max_relative_position, block
        )
        return read(relative_logits)  # (batch, heads, query, key)

    def value_term(self, attention_weights, context):
        query_positions = context.query_positions
        key_positions = context.key_positions
        weights = keras.ops.cast(attention_weights, "float32")
        block = _block_size(weights.shape[3]) if context.consecutive else None
        if block is None:
            rows = self._table_rows(
                query_positions, key_positions, keras.ops.shape(weights)[0]
            )  # (batch, query, key)
            summed = self._sum_by_segments(weights, rows)
        else:
            _, total = _by_band(
                query_positions, key_positions, self.max_relative_position, block
            )
            summed = total(weights)  # (batch, query, 2k + 1, heads)
        return keras.ops.einsum(
            "btrn,rd->btnd", summed, self.value_embeddings
        )  # (batch, query, heads, value_dim)

    def _sum_by_segments(self, weights, rows):
        """The weights summed per distance, for positions of any kind.

        Args:
            weights: float32 tensor of shape `(batch, heads, query, key)`.
            rows: int32 tensor of shape `(batch, query, key)`.

        Returns:
            A float32 tensor of shape `(batch, query, 2k + 1, heads)`.
        """
        batch_size, heads, queries, _ = keras.ops.shape(weights)
        distances = 2 * self.max_relative_position + 1
        if 0 in weights.shape[2:]:
            # No queries or no keys: nothing to sum (PyTorch's segment sum
            # refuses empty segment ids).
            return keras.ops.zeros((batch_size, queries, distances, heads), "float32")
        # One segment per batch element, query and distance. Segment sums
        # run over the leading axis, so heads go last: the transpose costs
        # one copy of the weights, where a one-hot product would need a
        # (query, key, 2k + 1) tensor.
        segments = (
            keras.ops.reshape(
                keras.ops.arange(batch_size * queries, dtype="int32"),
                (batch_size, queries, 1),
            )
            * distances
            + rows
        )  # (batch, query, key)
        summed = keras.ops.segment_sum(
            keras.ops.reshape(
                keras.ops.transpose(weights, [0, 2, 3, 1]), (-1, heads)
            ),
            keras.ops.reshape(segments, (-1,)),
            num_segments=batch_size * queries * distances,
        )  # (batch * query * (2k + 1), heads)
        # Heads given, not inferred: with no queries there is nothing to
        # infer them from.
        return keras.ops.reshape(
            summed, (batch_size, queries, distances, heads)
        )  # (batch, query, 2k + 1, heads)

    def call(self, query, query_positions, key_positions):
        key_dim = self.attention_sizes["key_dim"]
        if len(query.shape) != 4 or query.shape[-1] != key_dim:
            raise ValueError(
                "RelativePositionEmbedding takes queries of shape (batch, "
                f"query, heads, key_dim) with key_dim={key_dim}, the size it "
                f"was built for. Received: query of shape {tuple(query.shape)}"
            )
        return self.logits_bias(
            query,
            None,
            AttentionContext(
                query_positions=query_positions, key_positions=key_positions
            ),
        )

    def compute_output_shape(
        self, query_shape, query_positions_shape, key_positions_shape
    ):
        return (
            query_shape[0],
            query_shape[2],
            query_shape[1],
            key_positions_shape[-1],
        )

    def compute_output_spec(self, query, query_positions, key_positions):
        # Float32 whatever the policy, like the logits the term joins.
        return keras.KerasTensor(
            self.compute_output_shape(
                query.shape, query_positions.shape, key_positions.shape
            ),
            dtype="float32",
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_relative_position": self.max_relative_position,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
