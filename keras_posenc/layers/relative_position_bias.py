import keras

from keras_posenc import ops
from keras_posenc.ops import _backend
from keras_posenc.layers._schemes import HeadBias
from keras_posenc.layers._schemes import read_embeddings_initializer


@keras.saving.register_keras_serializable(package="keras_posenc")
class RelativePositionBias(HeadBias):
    """T5's relative position bias: a learned bias per head and distance bucket.

    The logit of query `i` and key `j` gets a learned scalar per head, read
    from a table of `num_buckets` rows by the bucket of the relative position
    `j - i` (Raffel et al. 2020, section 2.1). Each distance below
    `max_exact` has its own bucket; longer ones share buckets whose widths
    grow logarithmically up to `max_distance`, and all distances from there
    on share the last. With `bidirectional=True` (encoders) half the buckets
    hold keys at or before the query and half the keys after it; with
    `bidirectional=False` (decoders, under a causal mask) all hold keys at or
    before the query, and every later key falls in bucket 0. The bucketing is
    `keras_posenc.ops.relative_position_bucket`, Mesh TensorFlow's and
    Hugging Face's.

    The bias is computed from the query and key positions, not from the
    lengths of the query and key axes, so a query at position 10 against
    cached keys `0 .. 10` reads the buckets of distances `-10 .. 0` (cached
    decoding), where a bias built from the axes would treat that one query
    as position 0. Left padding and packed sequences need only their
    positions.

    The table, weight `"embeddings"` of shape `(num_buckets, num_heads)`, is
    what Hugging Face's T5 holds as `relative_attention_bias`; it is made
    when `PositionalMultiHeadAttention` builds, or on the first call of the
    layer on its own, and kept and read in float32 whatever the dtype policy,
    as is the bias, which joins the float32 logits.

    Args:
        num_heads: int. The attention's number of heads, one table column
            each.
        num_buckets: int. The number of buckets, the table's rows. At least
            2, or, if `bidirectional`, even and at least 4 (half per
            direction). Defaults to `32`.
        max_distance: int. The distance from which all fall in the last
            bucket of their direction. Must be greater than the number of
            exactly placed distances per direction, `max_exact`:
            `num_buckets // 4` if `bidirectional`, else `num_buckets // 2`;
            at or below it the log-spaced buckets are undefined. Defaults to
            `128`.
        bidirectional: bool. Whether keys after the query get buckets of
            their own. Defaults to `True`.
        embeddings_initializer: str or `keras.initializers.Initializer`. How
            the table starts. Defaults to `"uniform"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        query_positions: integer tensor of shape `(batch, query)`, or
            `(query,)` for positions shared by the batch.
        key_positions: integer tensor of shape `(batch, key)`, or `(key,)`.

    Returns:
        The bias to add to the attention logits: a float32 tensor of shape
        `(batch or 1, num_heads, query, key)`, batch 1 when both positions
        are shared.

    Example:

    >>> t5 = RelativePositionBias(num_heads=2, num_buckets=8, max_distance=16)
    >>> bias = keras.ops.convert_to_numpy(t5(np.arange(5), np.arange(5)))
    >>> bias.shape
    (1, 2, 5, 5)
    >>> tuple(t5.embeddings.shape)
    (8, 2)
    >>> cached = t5(np.array([4]), np.arange(5))  # query 4, keys 0 to 4
    >>> bool(np.array_equal(keras.ops.convert_to_numpy(cached)[0, :, 0], bias[0, :, 4]))
    True

    References:
        - [Raffel et al., 2020](https://arxiv.org/abs/1910.10683)
    """

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("num_heads", num_heads)
        ops.check_relative_position_buckets(num_buckets, max_distance, bidirectional)
        initializer = read_embeddings_initializer(embeddings_initializer)
        self.num_heads = num_heads
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = initializer

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
            # Read in float32 even inside a mixed precision attention.
            autocast=False,
        )

    def logits_bias(self, query, key, context):
        # Inside attention, one row of indices per batch element: the gather
        # then makes the bias of the logits' own shape, which XLA computes
        # inside the addition to the logits, reading contiguous rows of
        # heads, and the softmax reads that sum, where a bias shared by the
        # batch is written once and added twice, the logits kept alive
        # beside the sum. Where XLA fuses the attention whole
        # (`context.fused`), the gather is a tensor of its own
        # either way, and a bias shared by the batch is the smaller one.
        per_batch = query is not None and not context.fused
        rows = ops.clipped_distance_rows(
            context.query_positions,
            context.key_positions,
            self.max_distance,
            keras.ops.shape(query)[0] if per_batch else None,
        )  # (batch or 1, query, key)
        return self._bias_of_rows(rows)

    def relative_bias(self, relative):
        rows = (
            keras.ops.clip(relative, -self.max_distance, self.max_distance)
            + self.max_distance
        )  # (batch or 1, query, key)
        return self._bias_of_rows(rows)

    def score_bias(self, query, key, context):
        table = self._distance_table()  # (2 * max_distance + 1, heads)

        def bias(batch, head, query_index, key_index):
            relative = context.key_position_at(
                batch, key_index
            ) - context.query_position_at(batch, query_index)  # j - i
            rows = keras.ops.clip(relative, -self.max_distance, self.max_distance)
            return ops.table_at(table, rows + self.max_distance, head)

        return bias

    def _bias_of_rows(self, rows):
        """The bias read at `rows`, `clip(j - i) + max_distance`, per head."""
        return keras.ops.transpose(
            _backend.take_in_range(self._distance_table(), rows), [0, 3, 1, 2]
        )  # (batch or 1, heads, query, key)

    def _distance_table(self):
        """The bias of each clipped distance, `(2 * max_distance + 1, heads)`."""
        # Every distance from `max_distance` on falls in the last bucket of
        # its direction, so the bias is a table of the 2 * max_distance + 1
        # clipped distances, read by `clip(j - i)`: the buckets (and their
        # comparisons) are found for that table only.
        buckets = ops.relative_position_bucket(
            keras.ops.arange(-self.max_distance, self.max_distance + 1, dtype="int32"),
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
        )  # (2 * max_distance + 1,)
        # Each distance's row picked from the buckets' table by a sum over
        # its one-hot bucket, not by a gather: XLA fuses a gather into the
        # lookup of every logit below and repeats it there, one more
        # dependent read per logit, while a reduction it computes once.
        # Exact: one entry and zeros are summed, on any device.
        chosen = keras.ops.one_hot(
            buckets, self.num_buckets, dtype="bool"
        )  # (2 * max_distance + 1, num_buckets)
        table = keras.ops.sum(
            keras.ops.where(
                chosen[:, :, None],
                keras.ops.cast(self.embeddings, "float32")[None],
                0.0,
            ),
            axis=1,
        )  # (2 * max_distance + 1, heads)
        return table

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
