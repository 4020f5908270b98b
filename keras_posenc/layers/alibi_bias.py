import math
import numbers

import keras
import numpy as np

from keras_posenc import ops
from keras_posenc.ops import _backend
from keras_posenc.layers._schemes import BIAS_SPREAD
from keras_posenc.layers._schemes import HeadBias
from keras_posenc.layers._schemes import largest_divisor
from keras_posenc.layers._renamed import renamed_arguments


def _powers_of_two(slopes):
    """Whether every slope of a float32 NumPy array is a power of two."""
    return all(math.frexp(float(slope))[0] == 0.5 for slope in slopes)


def _maxima_block_size(keys, steepest):
    """The block of keys of `logits_bias_maxima`, or None.

    The largest divisor of `keys` up to 64 over which the bias of slope
    `steepest` varies by at most `BIAS_SPREAD`, if at least 32: the maxima
    are then at most 1/32 of the logits. None for a length unknown when
    traced, or without such a divisor.
    """
    return largest_divisor(keys, 32, min(64, int(BIAS_SPREAD / steepest) + 1))


def _float_distance(query_positions, key_positions):
    """`j - i` as a float32 difference of two broadcast vectors.

    What XLA on JAX computes inside its fused attention, where an int32
    `j - i` of the logits' size is a tensor of its own
    (`AttentionContext.fused`). Both are counted from the first query,
    in int32, so the difference is exact, as the int32 one cast to float32
    is, while every position lies within 2 ** 24 of that query's.

    Args:
        query_positions: int32 tensor of shape `(batch or 1, query)`.
        key_positions: int32 tensor of shape `(batch or 1, key)`.

    Returns:
        A float32 tensor of shape `(batch or 1, query, key)`.
    """
    origin = query_positions[:, :1]  # (batch or 1, 1)
    i = keras.ops.cast(query_positions - origin, "float32")[:, :, None]
    j = keras.ops.cast(key_positions - origin, "float32")[:, None, :]
    return j - i


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments({"symmetric": "bidirectional"})
class AlibiBias(HeadBias):
    """Attention with linear biases (ALiBi): a per-head penalty on distance.

    Rather than encode positions in the tokens, ALiBi adds to the logit of
    query `i` and key `j` a bias proportional to their distance, `-m_h *
    (i - j)` for head `h` (Press et al. 2022, section 3). The slopes `m_h`
    are geometric, from `2 ** (-8 / num_heads)` down to `2 ** -8` (see
    `keras_posenc.ops.alibi_slopes`), so that each head attends over its own
    range. Models trained with it extrapolate to sequences longer than those
    they were trained on.

    `bidirectional=False`, the paper's form for decoders, gives
    `-m_h * (i - j) = m_h * (j - i)`: a penalty growing with the distance to
    earlier keys, and a growing reward for later keys, so it is only right
    under a causal mask, which removes them. keras-hub's `AlibiBias`, which
    adds `m_h * (j - (key_length - 1))`, differs from it by a constant per
    query, which the softmax ignores: it is this causal form, and in an
    encoder without a causal mask it favours the last keys, not the near
    ones. `bidirectional=True` gives `-m_h * |i - j|`, the same penalty on
    both sides: the form for encoders, whose queries attend both ways (T5's
    name for it, as in `RelativePositionBias(bidirectional=True)`).

    The bias is computed from the query and key positions, not from their
    indices, so that a query at position 10 against cached keys `0 .. 10`
    gets the bias of position 10 (cached decoding), and left padding and
    packed sequences need only their positions. It is float32 whatever the
    dtype policy, as the attention logits it is added to are. The layer has
    no weights.

    Give it as the `position` of `PositionalMultiHeadAttention`, whose
    `num_heads` it must equal; or call it on positions to get the bias.

    Args:
        num_heads: int. The attention's number of heads, one slope each.
        bidirectional: bool. `False` for the causal bias `-m (i - j)`,
            `True` for `-m |i - j|`, the same both ways. Defaults to
            `False`.
        slopes: list of floats or None. One positive slope per head, to use
            instead of the geometric ones (a checkpoint trained with other
            slopes, say). Defaults to `None`.
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

    >>> alibi = AlibiBias(num_heads=2)  # slopes 1/16 and 1/256
    >>> bias = alibi(np.arange(4), np.arange(4))
    >>> tuple(bias.shape)
    (1, 2, 4, 4)
    >>> keras.ops.convert_to_numpy(bias)[0, 0, 3].tolist()  # query 3, head 0
    [-0.1875, -0.125, -0.0625, 0.0]
    >>> bidirectional = AlibiBias(num_heads=2, bidirectional=True)
    >>> bias = bidirectional(np.arange(4), np.arange(4))
    >>> keras.ops.convert_to_numpy(bias)[0, 0, 1].tolist()
    [-0.0625, 0.0, -0.0625, -0.125]

    References:
        - [Press et al., 2022](https://arxiv.org/abs/2108.12409)
    """

    def __init__(self, num_heads, bidirectional=False, slopes=None, **kwargs):
        super().__init__(**kwargs)
        ops.check_positive_int("num_heads", num_heads)
        ops.check_bool("bidirectional", bidirectional)
        if slopes is not None and (
            not isinstance(slopes, (list, tuple))
            or len(slopes) != num_heads
            or not all(
                isinstance(slope, numbers.Real)
                and not isinstance(slope, bool)
                and math.isfinite(slope)
                and slope > 0
                for slope in slopes
            )
        ):
            raise ValueError(
                "`slopes` must be None or a list of `num_heads` "
                f"({num_heads}) positive numbers. Received: slopes={slopes!r}"
            )
        self.num_heads = num_heads
        self.bidirectional = bidirectional
        self.slopes = None if slopes is None else [float(slope) for slope in slopes]
        # The float32 slopes, known when traced (a JAX trace has no values):
        # the blocks of `logits_bias_maxima` and the columns of
        # `logits_factors` are chosen from them.
        self._slope_values = (
            _backend.static_value(ops.alibi_slopes(num_heads))
            if slopes is None
            else np.asarray(self.slopes, "float32")
        )
        # Made once: a compiler tracing a call (PyTorch's) cannot make a
        # tensor of a NumPy array or a list there, and breaks its graph.
        self._slope_tensor = keras.ops.convert_to_tensor(self._slope_values, "float32")

    def logits_bias(self, query, key, context):
        query_positions = context.query_positions
        key_positions = context.key_positions
        if (
            query is not None
            and query_positions.shape[-1] != 0
            and context.fused
        ):
            distance = _float_distance(query_positions, key_positions)
        else:
            distance = ops.relative_position(
                query_positions, key_positions
            )  # (batch or 1, query, key): j - i
        return self.relative_bias(distance)

    def relative_bias(self, relative):
        distance = relative
        if self.bidirectional:
            distance = -keras.ops.abs(distance)
        slopes = self._slopes()
        return (
            slopes[:, None, None] * keras.ops.cast(distance, "float32")[:, None]
        )  # (batch or 1, heads, query, key)

    def score_bias(self, query, key, context):
        slopes = self._slopes()

        def bias(batch, head, query_index, key_index):
            distance = context.key_position_at(
                batch, key_index
            ) - context.query_position_at(batch, query_index)  # j - i
            if self.bidirectional:
                distance = -keras.ops.abs(distance)
            return ops.table_at(slopes, head) * keras.ops.cast(distance, "float32")

        return bias

    def logits_bias_maxima(self, context):
        # Within a block of B consecutive keys the bias is `m (j - i)`, from
        # its first key to its last, or `-m |j - i|`, largest at the key
        # nearest the query: either way at most the smaller of the two
        # ends plus m (B - 1), the most it varies there, and no less than
        # its largest value. The ends are read from the bias itself, not
        # computed from the positions, which TensorFlow would fold into a
        # constant of the compiled program: from a slice of the whole bias
        # XLA computes those entries alone, as it runs.
        slopes = self._slopes()
        block = _maxima_block_size(
            context.key_positions.shape[-1], max(self._slope_values)
        )
        if block is None:
            return None
        bias = self.logits_bias(
            None, None, context
        )  # (batch or 1, heads, query, key)
        ends = keras.ops.minimum(
            bias[..., ::block], bias[..., block - 1 :: block]
        )  # (batch or 1, heads, query, key / block)
        return block, ends + (block - 1) * slopes[:, None, None]

    def logits_factors(self, context):
        # The causal bias m (j - i) is of rank two: [m, -m i] . [j, 1]. Only
        # where every product m i and m j is exact, slopes that are powers
        # of two (the default ones of a power-of-two number of heads) and
        # positions below 2 ** 24: then m j - m i is the exact m (j - i).
        # The bidirectional -m |j - i| is not of low rank.
        if self.bidirectional or not _powers_of_two(self._slope_values):
            return None
        m = self._slopes()[:, None]  # (heads, 1)
        i = keras.ops.cast(context.query_positions, "float32")[
            ..., None, None
        ]  # (batch or 1, query, 1, 1)
        j = keras.ops.cast(context.key_positions, "float32")[
            ..., None, None
        ]  # (batch or 1, key, 1, 1)
        query_factors = keras.ops.concatenate(
            [keras.ops.broadcast_to(m, keras.ops.shape(m * i)), -m * i], axis=-1
        )  # (batch or 1, query, heads, 2): [m, -m i]
        j = keras.ops.broadcast_to(
            j, keras.ops.shape(j * m)
        )  # (batch or 1, key, heads, 1)
        key_factors = keras.ops.concatenate(
            [j, keras.ops.ones_like(j)], axis=-1
        )  # (batch or 1, key, heads, 2): [j, 1]
        return query_factors, key_factors

    def _slopes(self):
        return self._slope_tensor

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "bidirectional": self.bidirectional,
                "slopes": None if self.slopes is None else list(self.slopes),
            }
        )
        return config
