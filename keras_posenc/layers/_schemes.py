"""What the package's own schemes share beyond the public protocol (private).

The public protocol, `AttentionPosition`, holds what defines a scheme. The
hooks here are for speed only: the attention asks a scheme for them where it
has them (`getattr`), and a scheme without them gets the same numbers. A
bias of rank two (ALiBi's causal one) may come as columns that join the
product of queries and keys (`logits_factors`); a bias that varies little
over a few consecutive keys (ALiBi's) may give its largest value over each
block of them, for the softmax's maximum (`logits_bias_maxima`); and where
XLA fuses the attention whole, a scheme says how many queries to take at a
time (`fused_query_block`).
"""

import keras

from keras_posenc import ops
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.layers.attention_position import AttentionPosition

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


def key_distance(relative, bidirectional):
    """A key's distance to its query from `relative`, `key - query`.

    `|key - query|` when `bidirectional`, else `max(query - key, 0)`: the
    distance of a key before its query, and 0 for the keys after it, which
    a causal mask removes (KERPLE's and FIRE's decoder form).
    """
    if bidirectional:
        return keras.ops.abs(relative)
    return keras.ops.maximum(-relative, 0)


def read_initializer(name, initializer):
    """The Keras initializer `initializer`, or a `ValueError` naming `name`."""
    try:
        return keras.initializers.get(initializer)
    except ValueError as error:
        raise ValueError(
            f"`{name}` must be a Keras initializer. Received: "
            f"{name}={initializer!r}"
        ) from error


def read_embeddings_initializer(embeddings_initializer):
    """The Keras initializer of a scheme's table, or a `ValueError` naming it."""
    return read_initializer("embeddings_initializer", embeddings_initializer)


class FastPaths:
    """The speed-only hooks of the package's schemes, apart from the protocol.

    A mixin before `AttentionPosition`; each hook may return None, and then
    the attention takes its plain path.
    """

    # Where XLA runs the logits, softmax and product with the values as one
    # kernel (`_backend.fuses_attention`, JAX's CPU), the attention takes
    # this many queries at a time, so that a scheme's tensors are one
    # block's (a bias read from a table, which that kernel cannot take,
    # among them) and the kernel's work stays in the cache; None attends
    # to all queries at once (a scheme without this attribute).
    fused_query_block = 128
    # On every backend, the attention takes this many queries at a time
    # (where the queries divide into two blocks or more), so that a scheme's
    # tensors wider than the keys (Transformer-XL's relative logits) are a
    # block's; a block's context keeps `consecutive`, its query positions
    # running from the block's first. None attends to all at once.
    query_block = None

    def logits_bias_maxima(self, context):
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
            context: the call's `AttentionContext`, positions of one axis.

        Returns:
            None, or a tuple `(block_size, maxima)`: an int dividing the
            number of keys, and a float32 tensor of shape `(batch or 1,
            heads, query, key / block_size)`: for each query and block of
            `block_size` consecutive keys, at least every value of
            `logits_bias` there and at most `BIAS_SPREAD` above any.
        """
        return None

    def logits_factors(self, context):
        """A bias of rank two, as columns to join the queries and keys, or None.

        A scheme whose bias is `sum_c u_c(i) v_c(j)`, a few columns `c`, can
        have the product of queries and keys add it: the attention puts the
        columns `u` before each head's (scaled) query and `v` before its
        key, and adds no `logits_bias`. The logits-sized bias is then never
        written, and XLA has one (batch, heads, query, key) pass fewer.
        Asked only where the logits are a float32 product; elsewhere the
        attention adds `logits_bias`, which must give the same bias.

        Args:
            context: the call's `AttentionContext`, positions of one axis.

        Returns:
            None, or a tuple of float32 tensors `(u, v)` of shapes `(batch
            or 1, query, heads, columns)` and `(batch or 1, key, heads,
            columns)`.
        """
        return None


class HeadBias(FastPaths, AttentionPosition):
    """Base of the schemes whose contribution is a bias per head (ALiBi, T5, Swin).

    Subclasses set `num_heads` and implement `logits_bias`; called on their
    own, `layer(query_positions, key_positions)` returns that bias, with
    rows and columns for the `num_prefix_tokens` first.
    """

    def check_attention(self, num_heads, key_dim, value_dim):
        self._check_num_heads(num_heads)

    def call(self, query_positions, key_positions):
        return self.logits_bias(
            None,
            None,
            AttentionContext(
                query_positions=query_positions, key_positions=key_positions
            ),
        )

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
