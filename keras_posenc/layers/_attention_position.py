"""What a relative position scheme contributes to attention (private).

`PositionalMultiHeadAttention` knows no scheme's internals: it asks its
`position` layer, an `AttentionPosition`, for each of four contributions,
which default to nothing. RoPE transforms the projected queries and keys,
ALiBi and T5 add a bias to the logits, Shaw et al. add a content term to the
logits and a term to the values; a bias of rank two (ALiBi's causal one) may
instead come as columns that join the product of queries and keys, and a
bias that varies little over a few consecutive keys (ALiBi's) may give its
largest value over each block of them, for the softmax's maximum. Where
XLA fuses the attention whole, a scheme says how many queries to take at
a time (`fused_query_block`).

Every scheme says how many coordinates a position has, `num_axes` (1 for
text; 2 or 3 on image and video grids), and how many tokens lead the
sequence without one, `num_prefix_tokens` (class or register tokens before
a grid, as in timm). Positions reach these methods as int32 tensors,
`query_positions` of shape `(batch or 1, query)` and `key_positions` of
shape `(batch or 1, key)` for one axis, `(batch or 1, query, num_axes)` and
`(batch or 1, key, num_axes)` for more, covering the tokens after the first
`num_prefix_tokens` only: `query` and `key` count the tokens that have
positions, while the tensors the methods take and return cover all tokens,
prefix ones first. The relative distance is always `key_position -
query_position`, per axis on a grid.

A scheme on graphs (`takes_adjacency`) has no positions to count: the
attention is over a graph's nodes, and both `query_positions` and
`key_positions` are the graph's adjacency, `(batch, nodes, nodes)`, as the
attention's caller gave it.
"""

import keras

from keras_posenc import ops

# The most a bias may vary within a block of keys of `logits_bias_maxima`.
# The number the softmax subtracts is then at most this above the true
# maximum of the biased logits, the largest exponential at least exp(-32),
# about 1e-14: far from float32's smallest normal number, exp(-87), so the
# exponentials that count keep their full precision.
BIAS_SPREAD = 32.0


def largest_divisor(number, smallest, largest):
    """The largest divisor of `number` from `smallest` to `largest`, or None.

    The block of keys a scheme splits them into at the default positions
    (Shaw's sums by band, ALiBi's maxima); None for a `number` unknown when
    traced (None), or without such a divisor.
    """
    if number is None:
        return None
    sizes = [size for size in range(smallest, largest + 1) if number % size == 0]
    return max(sizes) if sizes else None


def read_embeddings_initializer(embeddings_initializer):
    """The Keras initializer of a scheme's table, or a `ValueError` naming it."""
    try:
        return keras.initializers.get(embeddings_initializer)
    except ValueError as error:
        raise ValueError(
            "`embeddings_initializer` must be a Keras initializer. Received: "
            f"embeddings_initializer={embeddings_initializer!r}"
        ) from error


class AttentionPosition(keras.layers.Layer):
    """Base of the position layers that `PositionalMultiHeadAttention` takes.

    Subclasses that take grid positions or prefix tokens set the public
    attributes `num_axes` (the coordinates of a position, 1 by default) and
    `num_prefix_tokens` (the leading tokens without a position, 0 by
    default); those on graphs set `takes_adjacency` (False by default).
    """

    num_axes = 1
    num_prefix_tokens = 0
    takes_adjacency = False
    # For speed and memory only: where XLA runs the logits, softmax and
    # product with the values as one kernel (`_backend.fuses_attention`,
    # JAX's CPU), the attention takes this many queries at a time, so that
    # a scheme's tensors are one block's (a bias read from a table, which
    # that kernel cannot take, among them) and the kernel's work stays in
    # the cache; None attends to all queries at once.
    fused_query_block = 128

    def check_attention(self, num_heads, key_dim, value_dim):
        """Raise a `ValueError` unless this layer can serve such attention.

        Args:
            num_heads: int. The attention's number of heads.
            key_dim: int. The size of each head's queries and keys.
            value_dim: int. The size of each head's values.
        """

    def _check_num_heads(self, num_heads):
        """For schemes with a term per head: their heads must be the attention's."""
        if num_heads != self.num_heads:
            raise ValueError(
                f"`num_heads` of {type(self).__name__} must equal the "
                "attention's number of heads. Received: "
                f"num_heads={self.num_heads} for attention with "
                f"num_heads={num_heads}"
            )

    def build_for_attention(self, num_heads, key_dim, value_dim):
        """Check the sizes, then create the weights they call for.

        Args:
            num_heads: int. The attention's number of heads.
            key_dim: int. The size of each head's queries and keys.
            value_dim: int. The size of each head's values.
        """
        self.check_attention(num_heads, key_dim, value_dim)
        self.built = True

    def transform_query_key(self, query, key, query_positions, key_positions):
        """The projected queries and keys, transformed by their positions.

        Args:
            query: tensor of shape `(batch, num_prefix_tokens + query, heads,
                key_dim)`.
            key: tensor of shape `(batch, num_prefix_tokens + key, heads,
                key_dim)`.
            query_positions: int32 tensor of shape `(batch or 1, query)`, or
                `(batch or 1, query, num_axes)` when `num_axes` > 1.
            key_positions: int32 tensor of shape `(batch or 1, key)`, or
                `(batch or 1, key, num_axes)`.

        Returns:
            A tuple `(query, key)` of the same shapes and dtypes.
        """
        return query, key

    def logits_bias(self, query, query_positions, key_positions, consecutive=False):
        """A float32 term added to the attention logits, or None.

        Args:
            query: tensor of shape `(batch, num_prefix_tokens + query,
                heads, key_dim)`: the projected (and transformed) queries,
                already scaled by `1 / sqrt(key_dim)` as in the logits.
            query_positions: int32 tensor of shape `(batch or 1, query)`, or
                `(batch or 1, query, num_axes)` when `num_axes` > 1.
            key_positions: int32 tensor of shape `(batch or 1, key)`, or
                `(batch or 1, key, num_axes)`.
            consecutive: bool. Whether the positions are the attention's
                defaults, `0 .. query - 1` and `0 .. key - 1` on one axis,
                so that a scheme may use their structure. Defaults to
                `False`.

        Returns:
            None, or a float32 tensor broadcastable to `(batch, heads,
            num_prefix_tokens + query, num_prefix_tokens + key)`.
        """
        return None

    def logits_bias_maxima(self, query_positions, key_positions):
        """The bias's largest value over each block of keys, or None.

        The softmax subtracts a number from each query's logits before the
        exponentials, so that none overflows; the maximum of the biased
        logits is the usual one, but XLA's CPU backend reads a maximum from
        a tensor in memory, which makes a bias added to the logits a pass
        of its own. Any number at least that maximum, and not far above
        it, does as well: the attention takes the maximum of the unbiased
        logits over each block of keys plus the bias's largest value there,
        and adds the bias inside the exponentials. Where the bias varies by
        at most `s` within a block, that number is at most `s` above the
        maximum, and the largest exponential at least `exp(-s)`.

        Asked only at the attention's default positions, without a mask.

        Args:
            query_positions: int32 tensor of shape `(batch or 1, query)`.
            key_positions: int32 tensor of shape `(batch or 1, key)`.

        Returns:
            None, or a tuple `(block_size, maxima)`: an int dividing the
            number of keys, and a float32 tensor of shape `(batch or 1,
            heads, query, key / block_size)`: for each query and block of
            `block_size` consecutive keys, at least every value of
            `logits_bias` there and at most `BIAS_SPREAD` above any.
        """
        return None

    def logits_factors(self, query_positions, key_positions):
        """A bias of rank two, as columns to join the queries and keys, or None.

        A scheme whose bias is `sum_c u_c(i) v_c(j)`, a few columns `c`, can
        have the product of queries and keys add it: the attention puts the
        columns `u` before each head's (scaled) query and `v` before its
        key, and adds no `logits_bias`. The logits-sized bias is then never
        written, and XLA has one (batch, heads, query, key) pass fewer.
        Asked only where the logits are a float32 product; elsewhere the
        attention adds `logits_bias`, which must give the same bias.

        Args:
            query_positions: int32 tensor of shape `(batch or 1, query)`.
            key_positions: int32 tensor of shape `(batch or 1, key)`.

        Returns:
            None, or a tuple of float32 tensors `(u, v)` of shapes `(batch
            or 1, query, heads, columns)` and `(batch or 1, key, heads,
            columns)`.
        """
        return None

    def value_term(
        self, attention_weights, query_positions, key_positions, consecutive=False
    ):
        """A term added to the attention's weighted sum of values, or None.

        Args:
            attention_weights: float32 tensor of shape `(batch, heads,
                num_prefix_tokens + query, num_prefix_tokens + key)`, after
                the softmax and dropout.
            query_positions: int32 tensor of shape `(batch or 1, query)`, or
                `(batch or 1, query, num_axes)` when `num_axes` > 1.
            key_positions: int32 tensor of shape `(batch or 1, key)`, or
                `(batch or 1, key, num_axes)`.
            consecutive: bool. Whether the positions are the attention's
                defaults, `0 .. query - 1` and `0 .. key - 1` on one axis,
                so that a scheme may use their structure. Defaults to
                `False`.

        Returns:
            None, or a tensor of shape `(batch, num_prefix_tokens + query,
            heads, value_dim)`.
        """
        return None


class HeadBias(AttentionPosition):
    """Base of the schemes whose contribution is a bias per head (ALiBi, T5, Swin).

    Subclasses set `num_heads` and implement `logits_bias`; called on their
    own, `layer(query_positions, key_positions)` returns that bias, with
    rows and columns for the `num_prefix_tokens` first.
    """

    def check_attention(self, num_heads, key_dim, value_dim):
        self._check_num_heads(num_heads)

    def call(self, query_positions, key_positions):
        return self.logits_bias(None, query_positions, key_positions)

    def compute_output_shape(self, query_positions_shape, key_positions_shape):
        batch, queries, keys = ops.relative_position_shape(
            query_positions_shape, key_positions_shape, self.num_axes
        )[:3]
        queries, keys = (
            None if size is None else self.num_prefix_tokens + size
            for size in (queries, keys)
        )
        return (batch, self.num_heads, queries, keys)

    def compute_output_spec(self, query_positions, key_positions):
        # Float32 whatever the policy, like the logits the bias joins.
        return keras.KerasTensor(
            self.compute_output_shape(query_positions.shape, key_positions.shape),
            dtype="float32",
        )
