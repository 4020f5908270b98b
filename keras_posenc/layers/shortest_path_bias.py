import keras

from keras_posenc import ops
from keras_posenc.layers._schemes import HeadBias
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.layers._schemes import read_embeddings_initializer
from keras_posenc.layers._renamed import renamed_arguments


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments({"max_distance": "max_hops"})
class ShortestPathBias(HeadBias):
    """Graphormer's spatial encoding: a learned bias per head per hop count.

    On a graph, the relative position of two nodes is how far apart they
    are: Graphormer (Ying et al. 2021, section 3.1.2) adds to the attention
    logit of nodes `i` and `j` a learned scalar `b_h(phi(i, j))` per head,
    `phi` the number of edges on a shortest path between them. Hop counts
    from `max_hops` on share one entry, and pairs with no path between
    them (in different components of the graph, or padding) have their
    own. The hop counts are computed from the adjacency in the model, by
    boolean matrix products (see `keras_posenc.ops.hop_counts`).

    Give it as the `position` of `PositionalMultiHeadAttention`, whose
    `num_heads` it must equal, and call the attention with `adjacency=`:
    the attention is then over the nodes of each graph, queries and keys
    alike. Or call it on an adjacency to get the bias.

    The table, weight `"embeddings"` of shape `(max_hops + 2,
    num_heads)`, holds hop counts `0 .. max_hops` in its rows `0 ..
    max_hops` and the unreachable pairs in its last row. It is kept and
    read in float32 whatever the dtype policy, as is the bias.

    Args:
        num_heads: int. The attention's number of heads, one bias each.
        max_hops: int. The largest hop count with its own entry;
            farther pairs share it.
        embeddings_initializer: str or `keras.initializers.Initializer`. How
            the table starts. Defaults to `"uniform"`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        adjacency: tensor of shape `(batch, nodes, nodes)`: nonzero at `[b,
            i, j]` where nodes `i` and `j` are joined by an edge; symmetric.

    Returns:
        The bias to add to the attention logits: a float32 tensor of shape
        `(batch, num_heads, nodes, nodes)`.

    Example:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> path = np.eye(5, k=1) + np.eye(5, k=-1)  # 0 - 1 - 2 - 3 - 4
    >>> path = path[np.newaxis]
    >>> spatial = ShortestPathBias(num_heads=2, max_hops=3)
    >>> bias = spatial(path)
    >>> tuple(bias.shape)
    (1, 2, 5, 5)
    >>> bias = keras.ops.convert_to_numpy(bias)
    >>> table = keras.ops.convert_to_numpy(spatial.embeddings)
    >>> bool(bias[0, 0, 0, 2] == table[2, 0])  # two hops
    True
    >>> bool(bias[0, 0, 0, 4] == table[3, 0])  # four hops: clipped to 3
    True
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=spatial
    ... )
    >>> nodes = np.random.default_rng(0).normal(size=(1, 5, 16))
    >>> tuple(attention(nodes, nodes, adjacency=path).shape)
    (1, 5, 16)

    References:
        - [Ying et al., 2021](https://arxiv.org/abs/2106.05234)
    """

    # The attention passes it the adjacency in place of positions.
    takes_adjacency = True

    def __init__(
        self, num_heads, max_hops, embeddings_initializer="uniform", **kwargs
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("num_heads", num_heads)
        ops.check_positive_int("max_hops", max_hops)
        initializer = read_embeddings_initializer(embeddings_initializer)
        self.num_heads = num_heads
        self.max_hops = max_hops
        self.embeddings_initializer = initializer

    def build(self, input_shape=None):
        # Called on its own, on an adjacency.
        if input_shape is not None:
            ops.check_adjacency_shape(input_shape)
        super().build()

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.max_hops + 2, self.num_heads),
            initializer=self.embeddings_initializer,
            # Read in float32 even inside a mixed precision attention.
            autocast=False,
        )

    def logits_bias(self, query, key, context):
        adjacency = ops.read_adjacency(context.adjacency)  # (batch, nodes, nodes)
        hops = ops.hop_counts(adjacency, self.max_hops)  # (batch, nodes, nodes)
        bias = keras.ops.take(
            keras.ops.cast(self.embeddings, "float32"), hops, axis=0
        )  # (batch, nodes, nodes, heads)
        # Compiled code cannot raise on a bad adjacency: its graph shows it.
        bias = ops.nan_where_nan_graphs(bias, adjacency)
        # (batch, heads, nodes, nodes)
        return keras.ops.transpose(bias, (0, 3, 1, 2))

    def call(self, adjacency):
        return self.logits_bias(None, None, AttentionContext(adjacency=adjacency))

    def compute_output_shape(self, adjacency_shape):
        ops.check_adjacency_shape(adjacency_shape)
        batch, nodes = adjacency_shape[0], adjacency_shape[1]
        return (batch, self.num_heads, nodes, adjacency_shape[2] if nodes is None else nodes)

    def compute_output_spec(self, adjacency):
        return keras.KerasTensor(
            self.compute_output_shape(adjacency.shape), dtype="float32"
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "max_hops": self.max_hops,
                "embeddings_initializer": keras.initializers.serialize(
                    self.embeddings_initializer
                ),
            }
        )
        return config
