import math

import keras

from keras_posenc import ops
from keras_posenc.layers._schemes import HeadBias
from keras_posenc.layers._schemes import key_distance
from keras_posenc.layers._schemes import read_initializer
from keras_posenc.ops import _backend


def _rows_below(first, threshold, queries):
    """How many of the queries `first, first + 1, ...` lie below `threshold`.

    Known in eager mode only: 0 where either value is known only when the
    program runs, so that a compiled call reads every row entry by entry.
    """
    first = _backend.static_value(first)
    threshold = _backend.static_value(threshold)
    if first is None or threshold is None:
        return 0
    return int(min(max(math.ceil(float(threshold) - int(first)), 0), queries))


def _relative_window(first, queries, keys):
    """`key - query` over the diagonals of queries `first ..` and keys `0 ..`.

    Returns:
        An int32 tensor of shape `(query + key - 1,)`, the first query's
        row last, as `_backend.spread_diagonals` reads it.
    """
    return keras.ops.arange(queries + keys - 1, dtype="int32") - (first + queries - 1)


@keras.saving.register_keras_serializable(package="keras_posenc")
class FireBias(HeadBias):
    """FIRE: a learned function of the distance, interpolated by the position.

    Li et al. (2023) add to the logit of query `i` and key `j` a bias per
    head read from a small MLP `f` of one number, the distance divided by
    the query's position on a log scale (section 3):

    `b(i, j) = f(psi(i - j) / psi(max(i, L)))`, `psi(x) = log(c |x| + 1)`,

    so that every distance a query sees maps into `[0, 1]` whatever the
    length ("progressive interpolation"), with `c` and the threshold `L`
    learned: short sequences, below `L`, are divided by `psi(L)` rather than
    by their own small positions. The parametrization is that of the
    paper's appendix code: `f` a linear layer from 1 to `mlp_width`
    features, a ReLU, and a linear layer to one output per head; `c` a
    learned scalar, starting at `init_c`; `L = |multiplier * init_threshold|`
    with the multiplier a learned scalar starting at 1 (the code's
    `L_multiplier` of a fixed `init_L`); `eps` added to the divisor.

    The paper defines the causal form, `i >= j`. `bidirectional=False`
    reads `max(i - j, 0)` as the distance, so keys after the query, which a
    causal mask removes, read distance 0. The paper gives no other form for
    encoders; `bidirectional=True` reads `|i - j|` both ways, which is what
    the appendix code computes for every pair (it takes `psi` of the
    absolute distance).

    The MLP is evaluated as the piecewise linear function it is (one input,
    a ReLU): its `mlp_width` breakpoints `-hidden_bias / hidden_kernel`
    split the line into `mlp_width + 1` intervals, on each of which `f` is
    `a x + b` per head; the slopes and intercepts are computed once per
    call from the weights, and each pair counts the breakpoints below its
    `x` and reads its interval's. The same function as the MLP's, up to
    float32 rounding, and the same gradients (the interval is piecewise
    constant in `x`). Inside `PositionalMultiHeadAttention` the attention
    takes `query_block` queries at a time.

    Weights, made when the attention builds (or on the first call of the
    layer on its own), all read in float32 whatever the dtype policy:
    `"hidden_kernel"` and `"hidden_bias"` of shape `(mlp_width,)` (the first
    linear layer's, its one input), `"output_kernel"` of shape `(mlp_width,
    num_heads)`, `"c"` and `"threshold_multiplier"` (scalars). The appendix
    code's last linear layer has a bias too, a constant per head, which the
    softmax over the keys cancels: it never gets a gradient, and the layer
    has none.

    Args:
        num_heads: int. The attention's number of heads, one output of the
            MLP each.
        mlp_width: int. The MLP's hidden features. Defaults to `32`.
        init_c: float. The initial `c`. Defaults to `0.1`.
        init_threshold: float. The threshold `L` the learned multiplier
            scales (the appendix code's `init_L`). Defaults to `512.0`.
        eps: float. Added to the divisor `psi(max(i, L))`. Defaults to
            `1e-6`.
        bidirectional: bool. `False` for the causal distance `max(i - j,
            0)`, `True` for `|i - j|`. Defaults to `False`.
        kernel_initializer: initializer of both kernels, or None for
            PyTorch's `nn.Linear` default, uniform on `(-1 / sqrt(fan_in), 1
            / sqrt(fan_in))`. Defaults to `None`.
        bias_initializer: initializer of both biases, or None for PyTorch's
            `nn.Linear` default, as the kernels. Defaults to `None`.
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

    >>> fire = FireBias(num_heads=2)
    >>> bias = fire(np.arange(5), np.arange(5))
    >>> tuple(bias.shape)
    (1, 2, 5, 5)
    >>> tuple(fire.output_kernel.shape)
    (32, 2)
    >>> cached = fire(np.array([4]), np.arange(5))  # query 4, keys 0 to 4
    >>> bool(np.allclose(keras.ops.convert_to_numpy(cached)[0, :, 0], keras.ops.convert_to_numpy(bias)[0, :, 4]))
    True

    References:
        - [Li et al., 2023](https://arxiv.org/abs/2310.04418)
    """

    # The bias's intermediate tensors are a block's, `(block, key)` per
    # head, below the logits' size; smaller blocks take longer.
    query_block = 256

    def __init__(
        self,
        num_heads,
        mlp_width=32,
        init_c=0.1,
        init_threshold=512.0,
        eps=1e-6,
        bidirectional=False,
        kernel_initializer=None,
        bias_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("num_heads", num_heads)
        ops.check_positive_int("mlp_width", mlp_width)
        ops.check_positive_number("init_c", init_c)
        ops.check_positive_number("init_threshold", init_threshold)
        ops.check_positive_number("eps", eps)
        ops.check_bool("bidirectional", bidirectional)
        self.num_heads = num_heads
        self.mlp_width = mlp_width
        self.init_c = float(init_c)
        self.init_threshold = float(init_threshold)
        self.eps = float(eps)
        self.bidirectional = bidirectional
        self.kernel_initializer = read_initializer("kernel_initializer", kernel_initializer)
        self.bias_initializer = read_initializer("bias_initializer", bias_initializer)

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        def linear_default(fan_in):
            # PyTorch's nn.Linear: kernel and bias uniform within 1 / sqrt(fan_in).
            limit = 1.0 / math.sqrt(fan_in)
            return keras.initializers.RandomUniform(-limit, limit)

        def weight(name, shape, initializer):
            return self.add_weight(
                name=name, shape=shape, initializer=initializer, autocast=False
            )

        self.hidden_kernel = weight(
            "hidden_kernel", (self.mlp_width,), self.kernel_initializer or linear_default(1)
        )
        self.hidden_bias = weight(
            "hidden_bias", (self.mlp_width,), self.bias_initializer or linear_default(1)
        )
        self.output_kernel = weight(
            "output_kernel",
            (self.mlp_width, self.num_heads),
            self.kernel_initializer or linear_default(self.mlp_width),
        )
        self.c = weight("c", (), keras.initializers.Constant(self.init_c))
        self.threshold_multiplier = weight(
            "threshold_multiplier", (), keras.initializers.Constant(1.0)
        )

    def logits_bias(self, query, key, context):
        query_positions = ops.read_positions(
            context.query_positions, name="query_positions", integer=True
        )  # ([batch,] query)
        if len(query_positions.shape) == 1:
            query_positions = query_positions[None]  # (1, query)
        batch_size = None if query is None else keras.ops.shape(query)[0]
        threshold = self._threshold()
        queries = query_positions.shape[1]
        keys = context.key_positions.shape[-1]
        if context.consecutive and queries and keys:
            first = keras.ops.cast(query_positions[0, 0], "int32")
            below = _rows_below(first, threshold, queries)
            if below:
                # The queries before `L` share the normalizer `psi(L)`: their
                # bias is one value per relative position, spread over the
                # diagonals, where the later rows are read entry by entry.
                relative = _relative_window(first, below, keys)
                per_distance = self._evaluate(
                    (self._psi(key_distance(relative, self.bidirectional))
                     / (self._psi(threshold) + self.eps))[None, None]
                )  # (1, heads, 1, below + key - 1)
                if (
                    below < queries
                    and query_positions.shape[0] == 1
                    and _backend.writes_in_place(per_distance)
                ):
                    # Eager PyTorch: both parts written into one tensor,
                    # where joining them would copy both again.
                    bias = keras.ops.empty(
                        (1, self.num_heads, queries, keys), "float32"
                    )
                    _backend.spread_diagonals(
                        per_distance[:, :, 0], below, keys, out=bias[:, :, :below]
                    )
                    self._consecutive_bias(
                        first + below, queries - below, keys,
                        query_positions[:, below:], threshold, batch_size,
                        out=bias[:, :, below:],
                    )
                    return bias
                bias = _backend.spread_diagonals(
                    per_distance[:, :, 0], below, keys
                )  # (1, heads, below, key)
                if below == queries:
                    return bias
                later = self._consecutive_bias(
                    first + below, queries - below, keys, query_positions[:, below:],
                    threshold, batch_size,
                )  # (batch or 1, heads, query - below, key)
                bias = keras.ops.broadcast_to(
                    bias, (keras.ops.shape(later)[0],) + tuple(bias.shape[1:])
                )
                return keras.ops.concatenate([bias, later], axis=2)
            return self._consecutive_bias(
                first, queries, keys, query_positions, threshold, batch_size
            )
        relative = ops.relative_position(
            context.query_positions, context.key_positions
        )  # (batch or 1, query, key): j - i
        numerator = self._psi(key_distance(relative, self.bidirectional))
        return self._interpolated_bias(numerator, query_positions, threshold, batch_size)

    def score_bias(self, query, key, context):
        threshold = self._threshold()
        breakpoints, slopes, intercepts = self._pieces()

        def bias(batch, head, query_index, key_index):
            query_position = context.query_position_at(batch, query_index)
            relative = context.key_position_at(batch, key_index) - query_position
            normalizer = keras.ops.maximum(
                keras.ops.cast(query_position, "float32"), threshold
            )  # max(i, L)
            interpolated = self._psi(key_distance(relative, self.bidirectional)) / (
                self._psi(normalizer) + self.eps
            )
            # The breakpoints below, counted one unit at a time: a sum over
            # an axis is no element-wise op.
            interval = 0
            for unit in range(self.mlp_width):
                interval = interval + keras.ops.cast(
                    ops.table_at(breakpoints, unit) < interpolated, "int32"
                )
            return ops.table_at(slopes, head, interval) * interpolated + ops.table_at(
                intercepts, head, interval
            )

        return bias

    def _threshold(self):
        """`L`, learned as a multiple of `init_threshold`, in float32."""
        return keras.ops.abs(
            keras.ops.cast(self.threshold_multiplier, "float32") * self.init_threshold
        )

    def _psi(self, x):
        """`log(|c x| + 1)`, Eq. (6) with the appendix's absolute value."""
        c = keras.ops.cast(self.c, "float32")
        return keras.ops.log1p(keras.ops.abs(c * keras.ops.cast(x, "float32")))

    def _consecutive_bias(
        self, first, queries, keys, query_positions, threshold, batch_size, out=None
    ):
        """The bias of queries `first ..` and keys `0 ..`, entry by entry.

        `out` as `_backend.piecewise_linear` takes it.
        """
        # The numerator is one value per relative position, spread over the
        # diagonals.
        relative = _relative_window(first, queries, keys)
        numerator = _backend.spread_diagonals(
            self._psi(key_distance(relative, self.bidirectional)), queries, keys
        )[None]  # (1, query, key)
        return self._interpolated_bias(
            numerator, query_positions, threshold, batch_size, out
        )

    def _interpolated_bias(
        self, numerator, query_positions, threshold, batch_size, out=None
    ):
        """`f(numerator / psi(max(i, L)))` per head, `(batch, heads, query, key)`."""
        normalizer = keras.ops.maximum(
            keras.ops.cast(query_positions, "float32"), threshold
        )[:, :, None]  # (batch or 1, query, 1): max(i, L)
        interpolated = numerator / (
            self._psi(normalizer) + self.eps
        )  # (batch or 1, query, key), in [0, 1] for keys up to the query
        return self._evaluate(interpolated, batch_size, out)

    def _pieces(self):
        """The MLP as the piecewise linear function it is, from its weights.

        With one input and a ReLU, `f(x) = W2^T relu(w1 x + b1)` is
        linear between the units' breakpoints `t_u = -b1_u / w1_u`: on the
        interval `k` of the sorted breakpoints (those below `x` counted),
        `f(x) = a_k x + c_k`, the sums over the units active there. A unit
        with `w1_u > 0` is active above its breakpoint, one with `w1_u < 0`
        below it, one with `w1_u = 0` everywhere or nowhere (`relu(b1_u)`,
        its breakpoint at infinity, never counted).

        Returns:
            `(breakpoints, slopes, intercepts)`: float32 tensors of shapes
            `(width,)` (unsorted, no gradient), `(heads, width + 1)` and
            `(heads, width + 1)`, interval `k` holding the `x` with `k`
            breakpoints below them.
        """
        w1 = keras.ops.cast(self.hidden_kernel, "float32")
        b1 = keras.ops.cast(self.hidden_bias, "float32")
        w2 = keras.ops.cast(self.output_kernel, "float32")
        rising, falling = w1 > 0, w1 < 0
        sloped = keras.ops.logical_or(rising, falling)
        breakpoints = keras.ops.stop_gradient(
            keras.ops.where(
                sloped, -b1 / keras.ops.where(sloped, w1, 1.0), float("inf")
            )
        )  # (width,)
        # Each unit's place among the sorted breakpoints, ties in any order:
        # with `k` the count of breakpoints below `x`, `t_u < x` exactly
        # when the place of `u` is below `k` (tied breakpoints are all below
        # `x` or none is).
        rank = keras.ops.argsort(keras.ops.argsort(breakpoints))
        interval = keras.ops.arange(self.mlp_width + 1, dtype="int32")[:, None]
        rank = keras.ops.cast(rank, "int32")[None]
        active = keras.ops.where(
            rising,
            rank < interval,
            keras.ops.where(falling, interval <= rank, (b1 > 0)[None]),
        )  # (width + 1, width)
        active = keras.ops.cast(active, "float32")[:, :, None]
        # Sums of products, not a matrix product, which some devices take
        # in reduced precision.
        slopes = keras.ops.sum(active * (w1[:, None] * w2), axis=1)
        intercepts = keras.ops.sum(active * (b1[:, None] * w2), axis=1)
        return (
            breakpoints,
            keras.ops.transpose(slopes),
            keras.ops.transpose(intercepts),
        )  # (width,), (heads, width + 1) twice

    def _evaluate(self, interpolated, batch_size=None, out=None):
        """`f` of `interpolated`, `(batch or 1, query, key)`, per head.

        `batch_size`, inside attention, is the logits' batch; `out` as
        `_backend.piecewise_linear` takes it.
        """
        breakpoints, slopes, intercepts = self._pieces()
        interval = _backend.count_below(
            breakpoints, interpolated
        )  # (batch or 1, query, key): the breakpoints below each x
        return _backend.piecewise_linear(
            slopes, intercepts, interval, interpolated, batch_size, out
        )  # (batch, heads, query, key)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_width": self.mlp_width,
                "init_c": self.init_c,
                "init_threshold": self.init_threshold,
                "eps": self.eps,
                "bidirectional": self.bidirectional,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
