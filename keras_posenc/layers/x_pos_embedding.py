import copy
import math
import numbers

import keras

from keras_posenc import ops
from keras_posenc import rope_scaling
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.layers._schemes import read_rotation_arguments

# The positions a layer serves: within this many `scale_base` of its
# `scale_center`. There the largest scale, `(7 / 2) ** 64`, about 7e34, and
# the smallest, its inverse, are normal float32 (and bfloat16) numbers with
# room for the features they multiply; beyond, the tables are NaN.
SCALE_RANGE = 64
# The same under a float16 policy, whose largest number is 65504:
# `(7 / 2) ** 7`, about 6400.
FLOAT16_SCALE_RANGE = 7
# The grid arguments of `RotaryEmbedding` and their one-axis values, which
# alone xPos takes (left out of its config, as a 1-D `RotaryEmbedding`'s).
ONE_AXIS = {
    "num_axes": 1,
    "axis_layout": "blocks",
    "axis_sections": None,
    "learned_frequencies": False,
    "num_prefix_tokens": 0,
}


@keras.saving.register_keras_serializable(package="keras_posenc")
class XPosEmbedding(AttentionPosition):
    """xPos: rotary embedding with a decay per pair, for causal attention.

    xPos (Sun et al. 2022) is RoPE whose query at position `n` is also
    multiplied, pair `i` of its `d` rotated features, by `zeta_i ** ((n - c)
    / scale_base)`, and whose key at position `m` by `zeta_i ** (-(m - c) /
    scale_base)`, with `zeta_i = (2i / d + 0.4) / 1.4`, from 2/7 for the
    fastest pair to nearly 1 for the slowest. The product of a query and a
    key then turns by `n - m` as in RoPE and decays by `zeta_i ** ((n - m) /
    scale_base)`: the farther a key lies before its query, the less its fast
    pairs count, which keeps the attention stable at lengths past the
    trained one. The centre `c` (`scale_center`) cancels out of the logits.

    The decay shrinks logits only for keys at or before their query: a key
    after it would be amplified without bound. The layer therefore serves
    causal attention only: inside `PositionalMultiHeadAttention`, a call
    without `use_causal_mask=True` raises a `ValueError`.

    The scales are folded into RoPE's tables of cosines and sines (the
    queries' times the scale, the keys' divided by it), so xPos costs what
    RoPE costs. A key is scaled once, when the attention's cache stores it,
    so the centre is fixed per layer, not per call. Float32 holds the
    scales for positions `p` within `64 * scale_base` of `scale_center`
    (`7 * scale_base` under a `float16` policy): there `|p - c| * log(7 /
    2) / scale_base`, the largest exponent, is at most 80, below float32's
    largest, 88. Beyond, the layer makes the positions' tables NaN, so any
    output that reads them is NaN, never a plausible wrong number. At the
    default `scale_base=512` and `scale_center=0`, positions `-32768` to
    `32768`; set `scale_center` to the middle of the positions you serve.

    The rotation is RoPE's, made by the same ops as `RotaryEmbedding`'s,
    with its frequencies and scalings. Features pair as there:
    `pairing="interleaved"` matches rotary-embedding-torch (`use_xpos=True`)
    and torchscale's xPos, whose checkpoints pair `2i` with `2i + 1`; the
    default, `"half"`, the rest of this package. Only the first `rotary_dim` features are rotated and
    scaled, `d` being `rotary_dim`, as rotary-embedding-torch's `dim`.
    Angles, scales and the rotation are float32 whatever the dtype policy,
    cast to the compute dtype at the end.

    Args:
        scale_base: float. `gamma`, the distance over which pair `i` decays
            by `zeta_i`: `xpos_scale_base` in rotary-embedding-torch.
            Defaults to `512.0`.
        scale_center: int. The position `c` where the scales are 1; the
            layer serves positions within `64 * scale_base` of it. Defaults
            to `0`.
        max_wavelength: float. The base of RoPE's frequencies. Defaults to
            `10000.0`.
        pairing: str. Which features form a pair: `"half"` (`i` with `i +
            d / 2`) or `"interleaved"` (`2i` with `2i + 1`). Defaults to
            `"half"`.
        rotary_dim: int or None. Rotate and scale only the first
            `rotary_dim` features, even; `None` all. Defaults to `None`.
        scaling: dict or None. A Hugging Face style `rope_scaling` dict for
            the frequencies, as in `RotaryEmbedding`; the decay is not
            scaled. Defaults to `None`.
        sequence_axis: int. The axis of positions, for the layer called on
            its own. Defaults to `1`.
        feature_axis: int. The axis of features, likewise. Defaults to `-1`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc. Positions of one axis only:
            `RotaryEmbedding`'s grid arguments (`num_axes` and the others)
            raise a `ValueError` unless they have their one-axis values.

    Call arguments:
        query: float tensor with a sequence and a feature axis, typically
            `(batch, query, heads, head_dim)`.
        key: float tensor like `query`, `(batch, key, heads, head_dim)`.
        query_positions: optional integer or float tensor of shape
            `(query,)` or `(batch, query)`. Defaults to the last positions of
            the keys, `key - query + 0, 1, ...`, as for queries decoded after
            cached keys.
        key_positions: optional tensor of shape `(key,)` or `(batch, key)`.
            Defaults to `0 .. key - 1`.

    Called on its own, the layer takes the queries and the keys together,
    which xPos scales inversely: one tensor alone has no meaning.

    Returns:
        A tuple `(query, key)`, rotated and scaled, of the inputs' shapes, in
        the layer's compute dtype.

    Example:

    >>> queries = np.ones((2, 6, 4, 16), "float32")  # (batch, seq, heads, dim)
    >>> keys = np.ones((2, 6, 4, 16), "float32")
    >>> xpos = XPosEmbedding(scale_base=512.0, pairing="interleaved")
    >>> turned_queries, turned_keys = xpos(queries, keys)
    >>> tuple(turned_queries.shape), tuple(turned_keys.shape)
    ((2, 6, 4, 16), (2, 6, 4, 16))

    Inside the attention, causal:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=4, key_dim=16, position=XPosEmbedding()
    ... )
    >>> tokens = np.ones((2, 6, 64), "float32")
    >>> tuple(attention(tokens, tokens, use_causal_mask=True).shape)
    (2, 6, 64)

    References:
        - [Sun et al., 2022](https://arxiv.org/abs/2212.10554)
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
    """

    def __init__(
        self,
        scale_base=512.0,
        scale_center=0,
        max_wavelength=10000.0,
        pairing="half",
        rotary_dim=None,
        scaling=None,
        sequence_axis=1,
        feature_axis=-1,
        **kwargs,
    ):
        for name, value in ONE_AXIS.items():
            received = kwargs.pop(name, value)
            if received != value:
                raise ValueError(
                    "XPosEmbedding decays along positions of one axis (text): "
                    f"`{name}` must be {value!r}, or left out. Received: "
                    f"{name}={received!r}"
                )
        if (
            isinstance(scale_base, bool)
            or not isinstance(scale_base, numbers.Real)
            or not scale_base > 0
            or not math.isfinite(scale_base)
        ):
            raise ValueError(
                "`scale_base` must be a finite positive number. Received: "
                f"scale_base={scale_base!r}"
            )
        if isinstance(scale_center, bool) or not isinstance(
            scale_center, numbers.Integral
        ):
            raise ValueError(
                "`scale_center` must be an integer position. Received: "
                f"scale_center={scale_center!r}"
            )
        scaling = read_rotation_arguments(
            max_wavelength, pairing, rotary_dim, scaling, sequence_axis, feature_axis
        )
        # Float positions are call arguments that Keras would otherwise
        # round to the compute dtype (bfloat16) before angles are formed;
        # the layer casts inputs and outputs itself.
        super().__init__(autocast=False, **kwargs)
        self.scale_base = float(scale_base)
        self.scale_center = int(scale_center)
        self.max_wavelength = float(max_wavelength)
        self.pairing = pairing
        self.rotary_dim = rotary_dim
        self.scaling = copy.deepcopy(scaling)
        self.sequence_axis = sequence_axis
        self.feature_axis = feature_axis
        self.supports_masking = True

    def _axes(self, input_shape):
        """`(sequence_axis, feature_axis, rotated)` for inputs of this shape."""
        axes = ops.rotary_axes(
            input_shape, self.sequence_axis, self.feature_axis, self.rotary_dim
        )
        rope_scaling.check_scaling(self.scaling, axes[2])
        return axes

    def _positions(self, inputs, sequence_axis, start_index, positions):
        """Positions as `ops.read_positions` reads them, else `start_index + 0, 1, ...`."""
        length = inputs.shape[sequence_axis]
        if positions is not None:
            # Per-batch positions need a batch axis before the sequence axis.
            return ops.read_positions(
                positions,
                1,
                length=length,
                batch_size=inputs.shape[0],
                per_batch=sequence_axis > 0,
            )
        if length is None:
            length = keras.ops.shape(inputs)[sequence_axis]
        return ops.position_ids(length, start_index)

    def check_attention(self, num_heads, key_dim, value_dim):
        sequence_axis, feature_axis, _ = self._axes((None, None, num_heads, key_dim))
        if (sequence_axis, feature_axis) != (1, 3):
            raise ValueError(
                "Inside attention, XPosEmbedding rotates projected heads of "
                "shape (batch, sequence, heads, key_dim), so it needs "
                "sequence_axis=1 and feature_axis=-1. Received: "
                f"sequence_axis={self.sequence_axis}, "
                f"feature_axis={self.feature_axis}"
            )

    def build(self, query_shape, key_shape):
        _, feature_axis, _ = self._axes(query_shape)
        self._axes(key_shape)
        if query_shape[feature_axis] != key_shape[feature_axis]:
            raise ValueError(
                "XPosEmbedding needs queries and keys of the same features. "
                f"Received: query of shape {tuple(query_shape)} and key of "
                f"shape {tuple(key_shape)}"
            )

    def __call__(self, query, key, query_positions=None, key_positions=None, **kwargs):
        # Keras converts NumPy arguments before `call` sees them: JAX
        # wraps int64 positions past int32. Checked here first.
        ops.positions.check_given(query_positions, "query_positions")
        ops.positions.check_given(key_positions, "key_positions")
        return super().__call__(
            query,
            key,
            query_positions=query_positions,
            key_positions=key_positions,
            **kwargs,
        )

    def call(self, query, key, query_positions=None, key_positions=None):
        sequence_axis, feature_axis, rotated = self._axes(query.shape)
        last = len(query.shape) - 1
        if feature_axis != last:
            query, key = (keras.ops.moveaxis(x, feature_axis, last) for x in (query, key))
            if sequence_axis > feature_axis:
                sequence_axis -= 1
        key_positions = self._positions(key, sequence_axis, 0, key_positions)
        start = 0
        if query_positions is None:
            # The queries at the keys' last positions, as after a cache.
            key_length, query_length = (
                x.shape[sequence_axis] for x in (key, query)
            )
            if key_length is not None and query_length is not None:
                if query_length > key_length:
                    raise ValueError(
                        "Without `query_positions`, the queries take the "
                        "keys' last positions, so they must be no more than "
                        "the keys: pass `query_positions`. Received: "
                        f"query of shape {tuple(query.shape)} and key of "
                        f"shape {tuple(key.shape)}"
                    )
                start = key_length - query_length
            else:
                start = keras.ops.shape(key)[sequence_axis] - keras.ops.shape(
                    query
                )[sequence_axis]
        query_positions = self._positions(query, sequence_axis, start, query_positions)
        length = rope_scaling.current_length(
            self.scaling, query_positions, key_positions
        )
        outputs = (
            self._scaled_rotation(query, sequence_axis, rotated, query_positions, length, 1.0),
            self._scaled_rotation(key, sequence_axis, rotated, key_positions, length, -1.0),
        )
        if feature_axis != last:
            outputs = tuple(keras.ops.moveaxis(x, last, feature_axis) for x in outputs)
        return outputs

    def compute_output_shape(self, query_shape, key_shape):
        self._axes(query_shape)
        self._axes(key_shape)
        return tuple(query_shape), tuple(key_shape)

    def transform_query_key(self, query, key, context):
        if not context.causal:
            raise ValueError(
                "XPosEmbedding decays logits with the distance of a key before "
                "its query and would amplify keys after it: call the attention "
                "with use_causal_mask=True. Received: use_causal_mask=False"
            )
        length = rope_scaling.current_length(
            self.scaling, context.query_positions, context.key_positions
        )
        rotated = self._axes(query.shape)[2]
        return (
            self._scaled_rotation(query, 1, rotated, context.query_positions, length, 1.0),
            self._scaled_rotation(key, 1, rotated, context.key_positions, length, -1.0),
        )

    def _scale_range(self):
        """How far from `scale_center` the scales hold, in positions."""
        multiple = (
            FLOAT16_SCALE_RANGE if self.compute_dtype == "float16" else SCALE_RANGE
        )
        return multiple * self.scale_base

    def _scaled_rotation(
        self, inputs, sequence_axis, rotated, positions, length, direction
    ):
        """Rotate and scale `inputs`, features last: queries `direction=1`, keys -1.

        Positions `([batch,] seq)`; the first `rotated` features turn, the
        rest pass through.
        """
        rank = len(inputs.shape)
        frequencies, attention_factor = rope_scaling.rope_parameters(
            self.scaling, rotated, self.max_wavelength, length
        )
        angles = ops.angles(positions, frequencies)  # ([batch,] seq, rotated / 2)
        pairs = keras.ops.arange(0, rotated, 2, dtype="float32")  # (rotated / 2,): 2i
        zeta = (pairs + 0.4 * rotated) / (1.4 * rotated)  # (rotated / 2,)
        offsets = (
            keras.ops.cast(positions, "float32") - float(self.scale_center)
        )  # ([batch,] seq): p - c
        exponents = (
            offsets[..., None] * (keras.ops.log(zeta) * (direction / self.scale_base))
        )  # ([batch,] seq, rotated / 2)
        scales = keras.ops.exp(exponents) * attention_factor
        # Beyond the range float32 holds, NaN: shown, never a wrong number.
        outside = keras.ops.abs(offsets) > self._scale_range()  # ([batch,] seq)
        scales = keras.ops.where(outside[..., None], float("nan"), scales)
        cos = keras.ops.cos(angles) * scales  # ([batch,] seq, rotated / 2)
        sin = keras.ops.sin(angles) * scales
        batched = len(angles.shape) == 3
        table_axes = {sequence_axis, rank - 1} | ({0} if batched else set())
        for axis in range(rank):
            if axis not in table_axes:
                cos = keras.ops.expand_dims(cos, axis)
                sin = keras.ops.expand_dims(sin, axis)
        # (batch | 1, seq, 1, rotated / 2) for 4-D inputs
        selected = keras.ops.cast(inputs[..., :rotated], "float32")
        turned = ops.rotate_by_tables(selected, cos, sin, self.pairing)
        outputs = keras.ops.cast(turned, self.compute_dtype)
        if rotated < inputs.shape[-1]:
            outputs = keras.ops.concatenate(
                [outputs, keras.ops.cast(inputs[..., rotated:], self.compute_dtype)],
                -1,
            )
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "pairing": self.pairing,
                "rotary_dim": self.rotary_dim,
                "scaling": copy.deepcopy(self.scaling),
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
                "scale_base": self.scale_base,
                "scale_center": self.scale_center,
            }
        )
        return config
