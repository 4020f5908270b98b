import keras

from keras_posenc import ops
from keras_posenc.layers._schemes import HeadBias
from keras_posenc.layers._schemes import key_distance
from keras_posenc.layers._schemes import read_initializer

FORMS = ("log", "power")
# Chi et al.'s constraints, as their repository applies them: both
# coefficients at least 1e-2, and the power at most 2 (a conditionally
# positive definite kernel needs 0 < r2 <= 2).
SMALLEST = 1e-2
LARGEST_POWER = 2.0


class _ClampedCoefficients(keras.constraints.Constraint):
    """Keeps a weight within `[smallest, largest]` after each training step.

    What KERPLE's repository does to its coefficients in place, before each
    forward pass, done where Keras applies constraints: after the optimizer's
    update.

    Args:
        smallest: float. The least value.
        largest: float or None. The greatest value; None for no bound.
    """

    def __init__(self, smallest, largest=None):
        self.smallest = smallest
        self.largest = largest

    def __call__(self, w):
        return keras.ops.clip(
            w, self.smallest, float("inf") if self.largest is None else self.largest
        )

    def get_config(self):
        return {"smallest": self.smallest, "largest": self.largest}


def _clamped(weight, smallest, largest):
    """`weight` clipped to `[smallest, largest]`, with the gradient of `weight`.

    KERPLE's repository clamps its coefficients' values, outside the graph,
    so their gradient is the unclamped one's: the same here, a value that
    only initial weights or weights set by hand can take outside the range.
    """
    weight = keras.ops.cast(weight, "float32")
    clipped = keras.ops.clip(weight, smallest, largest)
    return weight + keras.ops.stop_gradient(clipped - weight)


@keras.saving.register_keras_serializable(package="keras_posenc")
class KerpleBias(HeadBias):
    """KERPLE: a learned, conditionally positive definite kernel on distance.

    Chi et al. (2022) add to the logit of query `i` and key `j` a bias per
    head that decays with their distance `d = |i - j|`, its shape learned
    through two coefficients per head, `r1` and `r2` (section 4):

    - `form="log"`: `-r1 * log(1 + r2 * d)`, the form that extrapolated best
      in the paper;
    - `form="power"`: `-r1 * d ** r2`, ALiBi with a learned slope and power.

    Both coefficients are kept at least `1e-2` and the power at most 2,
    which keeps each kernel conditionally positive definite, as the KERPLE
    repository does (`ParallelKerpleLog`, `ParallelKerplePower` in
    `megatron/mpu/layers.py`): there the values are clamped before each
    forward pass, here by the weights' constraint after each training step,
    and in the forward pass (with the unclamped gradient, as there) for
    values set otherwise. The initial values are the repository's: in the
    log form `r1` uniform on `[0, 2)` and `r2` on `[0, 1)`; in the power
    form `r1` uniform on `[0, 1)` and `r2` on `[0, 2)` (the repository's
    `bias_p` and `bias_a`, named there by their role in the power form: its
    `bias_p` is `r1` of the log form and `r2` of the power form).

    `bidirectional=False`, the paper's and the repository's form for
    decoders, reads `d = max(i - j, 0)`: keys after the query, which a
    causal mask removes, get the bias of distance 0, as the repository's
    lower-triangular distances give them. `bidirectional=True` reads `d =
    |i - j|`, the same penalty both ways, for encoders (T5's and ALiBi's
    name for it here).

    The bias is computed from the query and key positions, so cached
    decoding, left padding and packed sequences need only their positions.
    The weights `"r1"` and `"r2"`, of shape `(num_heads,)`, are made when
    `PositionalMultiHeadAttention` builds (or on the first call of the layer
    on its own) and read in float32 whatever the dtype policy, as is the
    bias.

    Args:
        num_heads: int. The attention's number of heads, two coefficients
            each.
        form: `"log"` or `"power"`. Which kernel. Defaults to `"log"`.
        bidirectional: bool. `False` for the causal distance `max(i - j,
            0)`, `True` for `|i - j|`. Defaults to `False`.
        r1_initializer: initializer of `r1`, or None for the repository's
            (uniform on `[0, 2)` in the log form, `[0, 1)` in the power
            form). Defaults to `None`.
        r2_initializer: initializer of `r2`, or None for the repository's
            (uniform on `[0, 1)` in the log form, `[0, 2)` in the power
            form). Defaults to `None`.
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

    >>> kerple = KerpleBias(
    ...     num_heads=2, r1_initializer="ones", r2_initializer="ones"
    ... )
    >>> bias = kerple(np.arange(4), np.arange(4))
    >>> tuple(bias.shape)
    (1, 2, 4, 4)
    >>> row = keras.ops.convert_to_numpy(bias)[0, 0, 3]  # query 3, head 0
    >>> (np.round(row.astype("float64"), 4) + 0.0).tolist()  # -log(1 + d), d = 3, 2, 1, 0
    [-1.3863, -1.0986, -0.6931, 0.0]
    >>> power = KerpleBias(2, form="power", r1_initializer="ones", r2_initializer="ones")
    >>> row = keras.ops.convert_to_numpy(power(np.arange(4), np.arange(4)))[0, 0, 3]
    >>> (row + 0.0).tolist()  # -d
    [-3.0, -2.0, -1.0, 0.0]

    References:
        - [Chi et al., 2022](https://arxiv.org/abs/2205.09921)
    """

    def __init__(
        self,
        num_heads,
        form="log",
        bidirectional=False,
        r1_initializer=None,
        r2_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        ops.check_positive_int("num_heads", num_heads)
        if form not in FORMS:
            raise ValueError(f"`form` must be one of {FORMS}. Received: form={form!r}")
        ops.check_bool("bidirectional", bidirectional)
        self.num_heads = num_heads
        self.form = form
        self.bidirectional = bidirectional
        self.r1_initializer = read_initializer("r1_initializer", r1_initializer)
        self.r2_initializer = read_initializer("r2_initializer", r2_initializer)

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        # The repository's: `torch.rand(heads) * scale`, r1 scaled by 2 in
        # the log form, r2 (the power) in the power form.
        r1_scale, r2_scale = (2.0, 1.0) if self.form == "log" else (1.0, 2.0)
        largest = LARGEST_POWER if self.form == "power" else None
        self.r1 = self.add_weight(
            name="r1",
            shape=(self.num_heads,),
            initializer=self.r1_initializer
            or keras.initializers.RandomUniform(0.0, r1_scale),
            constraint=_ClampedCoefficients(SMALLEST),
            autocast=False,
        )
        self.r2 = self.add_weight(
            name="r2",
            shape=(self.num_heads,),
            initializer=self.r2_initializer
            or keras.initializers.RandomUniform(0.0, r2_scale),
            constraint=_ClampedCoefficients(SMALLEST, largest),
            autocast=False,
        )

    def logits_bias(self, query, key, context):
        relative = ops.relative_position(
            context.query_positions, context.key_positions
        )  # (batch or 1, query, key): j - i
        if query is not None:
            # Inside attention, the distances of each batch element: the
            # bias then has the logits' own shape, and XLA computes it
            # inside their sum, where a bias shared by the batch (its
            # logarithms too dear to repeat, by XLA's measure) would be
            # written once and the sum beside the logits, twice their
            # memory.
            relative = keras.ops.broadcast_to(
                relative, (keras.ops.shape(query)[0],) + tuple(keras.ops.shape(relative)[1:])
            )  # (batch, query, key)
        return self.relative_bias(relative)

    def relative_bias(self, relative):
        distance = keras.ops.cast(key_distance(relative, self.bidirectional), "float32")
        r1, r2 = self._coefficients()
        return self._kernel(
            distance[:, None], r1[:, None, None], r2[:, None, None]
        )  # (batch or 1, heads, query, key)

    def score_bias(self, query, key, context):
        r1, r2 = self._coefficients()

        def bias(batch, head, query_index, key_index):
            relative = context.key_position_at(
                batch, key_index
            ) - context.query_position_at(batch, query_index)  # j - i
            distance = keras.ops.cast(key_distance(relative, self.bidirectional), "float32")
            return self._kernel(distance, ops.table_at(r1, head), ops.table_at(r2, head))

        return bias

    def _coefficients(self):
        """`r1` and `r2` per head, `(heads,)` each, clamped to their ranges."""
        r1 = _clamped(self.r1, SMALLEST, float("inf"))
        largest = float("inf") if self.form == "log" else LARGEST_POWER
        return r1, _clamped(self.r2, SMALLEST, largest)

    def _kernel(self, distance, r1, r2):
        """The bias at float32 distances, the coefficients broadcast to them."""
        if self.form == "log":
            return -r1 * keras.ops.log1p(r2 * distance)
        # d ** r2 for d >= 1, and 0 at d = 0 (r2 > 0), without the 0 * log 0
        # of the power's gradient there.
        powers = keras.ops.power(keras.ops.maximum(distance, 1.0), r2)
        return -r1 * keras.ops.where(distance > 0, powers, 0.0)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "form": self.form,
                "bidirectional": self.bidirectional,
                "r1_initializer": keras.initializers.serialize(self.r1_initializer),
                "r2_initializer": keras.initializers.serialize(self.r2_initializer),
            }
        )
        return config
