"""What the package's own schemes share beyond the public protocol (private).

Helpers of the schemes' constructors and maths, and `HeadBias`, the base of
the schemes whose contribution is a bias per head.
"""

import keras

from keras_posenc import ops
from keras_posenc import rope_scaling
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.layers.attention_position import AttentionPosition

# The most a bias may vary within a block of keys of `logits_bias_maxima`.
# The number the softmax subtracts is then at most this above the true
# maximum of the biased logits, the largest exponential at least exp(-32),
# about 1e-14: far from float32's smallest normal number, exp(-87), so the
# exponentials that count keep their full precision.
BIAS_SPREAD = 32.0


def read_rotation_arguments(
    max_wavelength, pairing, rotary_dim, scaling, sequence_axis, feature_axis
):
    """The rotation's arguments checked, as RoPE and xPos take them.

    Returns:
        `scaling`, with Hugging Face's older `"type"` key read as
        `"rope_type"`.
    """
    ops.check_max_wavelength(max_wavelength)
    ops.check_pairing(pairing)
    ops.check_rotary_dim(rotary_dim)
    scaling = rope_scaling.read_legacy_type(scaling)
    rope_scaling.check_scaling(scaling, rotary_dim)
    ops.check_sequence_and_feature_axes(sequence_axis, feature_axis)
    return scaling


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


class HeadBias(AttentionPosition):
    """Base of the schemes whose contribution is a bias per head (ALiBi, T5, Swin).

    Subclasses set `num_heads` and implement `logits_bias`; called on their
    own, `layer(query_positions, key_positions)` returns that bias, with
    rows and columns for the `num_prefix_tokens` first. Their weights are
    sized by their constructor's arguments alone: `build_weights` makes
    them for an attention or for a call on their own, whichever comes
    first.
    """

    def check_attention(self, num_heads, key_dim, value_dim):
        self._check_num_heads(num_heads)

    def build(self, query_positions_shape=None, key_positions_shape=None):
        # Built already, for an attention, or by an earlier `build()`.
        if not self.built:
            self.build_weights(self.num_heads, None, None)

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
