import keras

from keras_posenc import ops
from keras_posenc.layers._schemes import read_embeddings_initializer
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.ops import _backend


# Keys summed at a time by a product with a triangle of ones, as many
# multiplications per gate as the logits' product has per logit at key_dim
# 64: XLA's CPU computes such a product faster than its cumulative sum (a
# reduce-window) over the keys.
CUMSUM_BLOCK = 64


def _reversed_cumsum(gates):
    """`sum_{t >= j} gates[..., t]` for every `j`, by blocks of keys.

    Within each block of `CUMSUM_BLOCK` keys a product with a triangle of
    ones; across blocks, the totals of the blocks after it (a short axis,
    `key / CUMSUM_BLOCK`).

    Args:
        gates: float32 tensor of shape `(batch, heads, query, key)`.

    Returns:
        A float32 tensor of the same shape.
    """
    batch_size, heads, queries, keys = keras.ops.shape(gates)
    padding = -keys % CUMSUM_BLOCK
    blocks = keras.ops.reshape(
        keras.ops.pad(gates, [[0, 0], [0, 0], [0, 0], [0, padding]]),
        (batch_size, heads, queries, -1, CUMSUM_BLOCK),
    )  # (batch, heads, query, blocks, block)
    index = keras.ops.arange(CUMSUM_BLOCK, dtype="int32")
    triangle = keras.ops.cast(
        index[:, None] >= index[None, :], "float32"
    )  # (block, block): [c, d] = 1 where key c counts for key d
    within = keras.ops.einsum(
        "bntkc,cd->bntkd", blocks, triangle
    )  # sums from each key to its block's end
    del blocks  # freed here on the eager backends, as in the caller
    totals = within[..., 0]  # (batch, heads, query, blocks)
    later = keras.ops.sum(totals, axis=-1, keepdims=True) - keras.ops.cumsum(
        totals, axis=-1
    )  # the blocks after each one
    return keras.ops.reshape(
        within + later[..., None], (batch_size, heads, queries, keys + padding)
    )[..., :keys]


@keras.saving.register_keras_serializable(package="keras_posenc")
class ContextualPosition(AttentionPosition):
    """CoPE, contextual position encoding: positions that count what the gates let through.

    Golovneva et al. (2024) measure the position of key `j` from query `i`
    not in tokens but in what the query counts: each key `t` between them
    adds a gate `g_it = sigmoid(q_i . k_t)` (section 3, eq. 3 and 4),

    `p_ij = sum_{t = j}^{i} g_it`,

    clamped at `max_positions - 1`, and the logit of query `i` and key `j`
    gains `q_i . e[p_ij]`, where `e` is a learned table of `max_positions`
    rows and a fractional `p` reads the two nearest rows, interpolated
    linearly (eq. 5). As the paper's Appendix computes it, `z_i[p] = q_i .
    e[p]` is taken for the integer positions first, a `(query,
    max_positions)` table per head, and the interpolation then reads two
    of its entries per key: no `(query, key, key_dim)` tensor is formed.

    As in the paper's code (its Appendix B) and x-transformers' `CoPE`, the
    gates are the sigmoid of the attention's own logits, the queries scaled
    by `1 / sqrt(key_dim)`; the table's term reads the queries unscaled;
    the table, `(max_positions, key_dim)`, is shared by the heads, each
    head counting with its own gates; and it starts at zero. Keys after
    the query count nothing: the scheme is causal and needs
    `use_causal_mask=True` (a key after the query by position, or a slot of
    a cache not yet written, has gate 0). Keys are counted in their order
    along the key axis, from `j` to the last key the query sees.

    Masks other than the causal one (padding, an `attention_mask`) do not
    reach the scheme: a masked key gets no weight, but still adds its gate
    to the positions of the keys before it. Padding at either end changes
    nothing for the real keys (left padding comes before them all, right
    padding after every real query); a key masked between a query and an
    earlier key counts, where x-transformers, masking before its gates,
    counts it as nothing.

    Inside the attention, queries go by blocks of `query_block` (256), so
    that the gates, their counts and the interpolation are a block's
    `(batch, heads, 256, key)` tensors.

    Args:
        max_positions: int. The rows of the table, `p_max` of the paper:
            positions are clamped at `max_positions - 1`.
        embeddings_initializer: str or `keras.initializers.Initializer`.
            How the table starts. Defaults to `"zeros"`, as the paper's
            and x-transformers' code.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        The scheme has no call of its own: `PositionalMultiHeadAttention`
        calls its hooks with the projected queries (scaled by
        `logits_scale`), the projected keys, and the positions of both; call
        the attention with `use_causal_mask=True`.

    Returns:
        Through `logits_bias`, the term `q_i . e[p_ij]`: a float32 tensor
        of shape `(batch, heads, query, key)`, added to the logits.

    Example:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> cope = ContextualPosition(max_positions=8, embeddings_initializer="normal")
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=cope
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> tuple(attention(tokens, tokens, use_causal_mask=True).shape)
    (1, 5, 16)
    >>> tuple(cope.embeddings.shape)  # e, shared by the heads
    (8, 8)

    References:
        - [Golovneva et al., 2024](https://arxiv.org/abs/2405.18719)
    """

    # The gates, their counts and the interpolation of a block of queries,
    # `(batch, heads, 256, key)` each.
    query_block = 256
    # The table is `(max_positions, key_dim)`.
    weight_sizes = ("key_dim",)

    def __init__(self, max_positions, embeddings_initializer="zeros", **kwargs):
        super().__init__(**kwargs)
        ops.check_positive_int("max_positions", max_positions)
        self.max_positions = max_positions
        self.embeddings_initializer = read_embeddings_initializer(
            embeddings_initializer
        )

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        # Read in float32 even inside a mixed precision attention.
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_positions, key_dim),
            initializer=self.embeddings_initializer,
            autocast=False,
        )

    def _counted(self, context):
        """Which keys each query counts: `(batch or 1, 1, query, key)`, bool.

        The keys at its position or before, and with a cache the slots
        written.
        """
        counted = (
            ops.relative_position(context.query_positions, context.key_positions) <= 0
        )  # (batch or 1, query, key)
        if context._cache is not None:
            counted = keras.ops.logical_and(
                counted, context._cache.written()[None, None]
            )  # the slots written, (1, 1, key)
        return counted[:, None]

    def logits_bias(self, query, key, context):
        if not context.causal:
            raise ValueError(
                "ContextualPosition counts the keys from each one to its "
                "query, and none after it: call the attention with "
                "`use_causal_mask=True`. Received: use_causal_mask=False"
            )
        if 0 in (query.shape[1], key.shape[1]):
            # No logits: the attention's output is empty, or its bias alone.
            return None
        # The attention's own product, written as it writes it, which XLA
        # then computes once for both.
        gates = keras.ops.sigmoid(
            keras.ops.cast(keras.ops.einsum("bsnh,btnh->bnts", key, query), "float32")
        )  # (batch, heads, query, key): sigmoid of the scaled logits
        gates = keras.ops.where(self._counted(context), gates, 0.0)
        # Clamped below at 0 too: the sums by blocks round to a little
        # under it past the query, where every gate is 0, and row -1 is
        # no row of the table.
        positions = keras.ops.clip(
            _reversed_cumsum(gates), 0.0, float(self.max_positions - 1)
        )  # (batch, heads, query, key): p_ij, clamped
        # Each tensor of the logits' size is let go once read: eager
        # backends (PyTorch) then free it before the next one is made.
        del gates
        floor = keras.ops.stop_gradient(keras.ops.floor(positions))
        fraction = positions - floor
        del positions
        # z_i[p] = q_i . e[p], the queries unscaled (the paper's Appendix).
        table = keras.ops.einsum(
            "btnd,pd->bntp",
            keras.ops.cast(query, "float32"),  # times logits_scale
            self.embeddings / self.logits_scale(self.attention_sizes["key_dim"]),
        )  # (batch, heads, query, max_positions)
        steps = keras.ops.concatenate(
            [table[..., 1:] - table[..., :-1], keras.ops.zeros_like(table[..., :1])],
            axis=-1,
        )  # z_i[p + 1] - z_i[p]; the last row's is never read with a fraction
        batch_size, heads, queries, count = keras.ops.shape(table)
        keys = keras.ops.shape(floor)[3]
        # Each query's own table read at its keys' rows, batch and heads
        # as one axis: on TensorFlow a gather with batch dimensions, which
        # XLA's CPU reads faster than one of the flattened tables.
        read = keras.ops.reshape(
            _backend.take_rows_per_query(
                keras.ops.reshape(
                    keras.ops.stack([table, steps], axis=-1),
                    (batch_size * heads, queries, count, 2),
                ),
                keras.ops.reshape(
                    # A NaN (from a NaN in the inputs) reads row 0: its
                    # fraction keeps the NaN, where its cast to int32 would
                    # be an index past the table.
                    keras.ops.cast(
                        keras.ops.where(keras.ops.isnan(floor), 0.0, floor), "int32"
                    ),
                    (batch_size * heads, queries, keys),
                ),
            ),
            (batch_size, heads, queries, keys, 2),
        )  # (batch, heads, query, key, 2)
        del floor
        return read[..., 0] + fraction * read[..., 1]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_positions": self.max_positions,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
