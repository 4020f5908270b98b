"""RoPE frequency schedules: how long-context models stretch rotary angles.

Each schedule is a pure function returning `(inverse_frequencies,
attention_factor)`: a float32 tensor of `dim / 2` angular frequencies, one per
rotated feature pair, and a Python float that multiplies the cosines and sines
(1 for all schedules but YaRN and LongRoPE). The formulas, names and defaults
are those of Hugging Face's `rope_scaling` configurations, so a model's
`config.json` carries over unchanged; `rope_parameters` dispatches on such a
dict. The trained context length is always `original_max_position_embeddings`.
The legacy rope type `"su"` (Phi-3 vision configs) is read as `"longrope"`.
"""

import math
import numbers
import warnings

import keras

from keras_posenc import ops
from keras_posenc.ops._renamed import renamed_arguments

ROPE_TYPES = (
    "default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"
)
# Older names that Hugging Face configs still carry, and the type each means.
_ALIASES = {"su": "longrope"}

# The keys each rope_type takes: (required, optional).
_KEYS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        (
            "beta_fast",
            "beta_slow",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
    ),
    "llama3": (
        (
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ),
        (),
    ),
    "longrope": (
        ("short_factor", "long_factor", "original_max_position_embeddings"),
        ("attention_factor", "factor"),
    ),
    "proportional": ((), ("factor", "partial_rotary_factor")),
}


def _exponents(dim):
    """`2i / dim` for each feature pair, in float32."""
    ops.check_positive_int("dim", dim)
    return keras.ops.arange(0, dim, 2, dtype="float32") / float(dim)  # (dim / 2,)


def _base_frequencies(dim, base):
    # base ** -(2i / dim), written as keras-hub's RotaryEmbedding writes it so
    # that the two agree bit for bit.
    return keras.ops.power(
        keras.ops.cast(base, "float32"), -_exponents(dim)
    )  # (dim / 2,)


def default(dim, max_wavelength):
    """The frequencies of Su et al. (2021): `max_wavelength ** (-2i / dim)`.

    Args:
        dim: int. The number of rotated features.
        max_wavelength: float. The base, `rope_theta` in Hugging Face configs.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`: a float32 tensor of
        shape `(dim / 2,)` and `1.0`.

    Example:

    >>> frequencies, attention_factor = default(4, 10000.0)
    >>> keras.ops.convert_to_numpy(frequencies), attention_factor
    (array([1.  , 0.01], dtype=float32), 1.0)
    """
    ops.check_max_wavelength(max_wavelength)
    return _base_frequencies(dim, max_wavelength), 1.0


def linear(dim, max_wavelength, factor):
    """Position interpolation (Chen et al. 2023): every frequency / `factor`.

    Positions `0 .. factor * L` then turn through the angles the model saw on
    `0 .. L` during training.

    Args:
        dim: int. The number of rotated features.
        max_wavelength: float. The base.
        factor: float. The context extension factor.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`.

    References:
        - [Chen et al., 2023](https://arxiv.org/abs/2306.15595)
    """
    _check_arguments("linear", {"factor": factor}, dim)
    frequencies, attention_factor = default(dim, max_wavelength)
    return frequencies / keras.ops.cast(factor, "float32"), attention_factor


@renamed_arguments({"sequence_length": "length"})
def dynamic(
    dim,
    max_wavelength,
    factor,
    original_max_position_embeddings,
    length=None,
):
    """Dynamic NTK scaling: a larger base once the length passes training's.

    At length `L > original_max_position_embeddings` the base becomes
    `base * (factor * L / original - (factor - 1)) ** (dim / (dim - 2))`;
    at or below it the frequencies are the default ones.

    Args:
        dim: int. The number of rotated features, at least 4.
        max_wavelength: float. The base.
        factor: float. The scaling factor.
        original_max_position_embeddings: int. The trained context length.
        length: optional int or scalar tensor. The current length, the
            largest position plus one. `None` means the trained length.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`.

    References:
        - [bloc97 and emozilla, 2023](https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/)
    """
    ops.check_max_wavelength(max_wavelength)
    _check_arguments(
        "dynamic",
        {
            "factor": factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        },
        dim,
    )
    original = float(original_max_position_embeddings)
    if length is None:
        length = original
    length = keras.ops.maximum(keras.ops.cast(length, "float32"), original)
    # factor * L / original - (factor - 1), written so that it is exactly 1
    # at the trained length instead of cancelling in float32.
    stretch = 1.0 + factor * (length - original) / original  # scalar
    base = float(max_wavelength) * keras.ops.power(stretch, dim / (dim - 2.0))
    return keras.ops.power(base, -_exponents(dim)), 1.0


def _yarn_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn(
    dim,
    max_wavelength,
    factor,
    original_max_position_embeddings,
    beta_fast=32.0,
    beta_slow=1.0,
    attention_factor=None,
    mscale=None,
    mscale_all_dim=None,
    truncate=True,
):
    """YaRN (Peng et al. 2023): interpolate only the long wavelengths.

    Feature pairs that turn more than `beta_fast` times over the trained
    length keep their frequency, those that turn fewer than `beta_slow` times
    are divided by `factor`, and a linear ramp joins the two (eq. 18-19). The
    attention factor `0.1 ln(factor) + 1` (eq. 22) scales cosines and sines.

    Args:
        dim: int. The number of rotated features.
        max_wavelength: float. The base.
        factor: float. The context extension factor.
        original_max_position_embeddings: int. The trained context length.
        beta_fast: float. Rotations above which a pair is left alone.
            Defaults to `32.0`.
        beta_slow: float. Rotations below which a pair is fully interpolated.
            Defaults to `1.0`.
        attention_factor: optional float. Overrides the computed factor.
        mscale: optional float. With `mscale_all_dim`, the DeepSeek form of
            the attention factor, `mscale(factor, mscale) /
            mscale(factor, mscale_all_dim)`.
        mscale_all_dim: optional float. See `mscale`.
        truncate: bool. Whether to round the ramp's ends to whole pairs.
            Defaults to `True`.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`.

    References:
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071)
    """
    ops.check_max_wavelength(max_wavelength)
    _check_arguments(
        "yarn",
        {
            "factor": factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "attention_factor": attention_factor,
            "mscale": mscale,
            "mscale_all_dim": mscale_all_dim,
            "truncate": truncate,
        },
        dim,
    )
    # As in Hugging Face, None (null in a config.json) means the default.
    beta_fast = 32.0 if beta_fast is None else beta_fast
    beta_slow = 1.0 if beta_slow is None else beta_slow
    truncate = True if truncate is None else truncate
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(
                factor, mscale_all_dim
            )
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations):
        # The pair index whose wavelength fits `rotations` times into the
        # trained length (eq. 17, solved for the index).
        return (
            dim
            * math.log(original_max_position_embeddings / (rotations * 2 * math.pi))
        ) / (2 * math.log(max_wavelength))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no empty ramp
    ramp = keras.ops.clip(
        (keras.ops.arange(dim // 2, dtype="float32") - low) / (high - low), 0.0, 1.0
    )  # (dim / 2,)
    wavelengths = keras.ops.power(
        keras.ops.cast(max_wavelength, "float32"), _exponents(dim)
    )  # (dim / 2,)
    extrapolated = 1.0 / wavelengths
    interpolated = 1.0 / (factor * wavelengths)
    kept = 1.0 - ramp
    frequencies = interpolated * (1.0 - kept) + extrapolated * kept
    return frequencies, float(attention_factor)


def llama3(
    dim,
    max_wavelength,
    factor,
    low_freq_factor,
    high_freq_factor,
    original_max_position_embeddings,
):
    """Llama 3.1's schedule: divide long wavelengths, keep short ones.

    Wavelengths longer than `original / low_freq_factor` are divided by
    `factor`, those shorter than `original / high_freq_factor` are kept, and
    those between are blended by where `original / wavelength` falls between
    `low_freq_factor` and `high_freq_factor`.

    Args:
        dim: int. The number of rotated features.
        max_wavelength: float. The base (500000 for Llama 3).
        factor: float. The divisor of the long wavelengths' frequencies.
        low_freq_factor: float. Sets the longest wavelength left partly alone.
        high_freq_factor: float. Sets the shortest wavelength touched.
        original_max_position_embeddings: int. The trained context length.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`.

    References:
        - [Llama Team, 2024](https://arxiv.org/abs/2407.21783)
    """
    _check_arguments(
        "llama3",
        {
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        },
        dim,
    )
    frequencies, attention_factor = default(dim, max_wavelength)
    original = float(original_max_position_embeddings)
    wavelengths = 2 * math.pi / frequencies  # (dim / 2,)
    long = wavelengths > original / low_freq_factor
    short = wavelengths < original / high_freq_factor
    divided = keras.ops.where(long, frequencies / factor, frequencies)
    smooth = (original / wavelengths - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    blended = (1 - smooth) * divided / factor + smooth * divided
    medium = keras.ops.logical_and(
        keras.ops.logical_not(long), keras.ops.logical_not(short)
    )
    return keras.ops.where(medium, blended, divided), attention_factor


@renamed_arguments({"sequence_length": "length"})
def longrope(
    dim,
    max_wavelength,
    short_factor,
    long_factor,
    original_max_position_embeddings,
    attention_factor=None,
    factor=None,
    length=None,
):
    """LongRoPE (Ding et al. 2024): a searched divisor per feature pair.

    Up to the trained length each frequency is divided by its entry of
    `short_factor`, past it by its entry of `long_factor`. The attention
    factor defaults to `sqrt(1 + ln(factor) / ln(original))`.

    Args:
        dim: int. The number of rotated features.
        max_wavelength: float. The base.
        short_factor: list of `dim / 2` floats. Divisors within the trained
            length.
        long_factor: list of `dim / 2` floats. Divisors past it.
        original_max_position_embeddings: int. The trained context length.
        attention_factor: optional float. Overrides the computed factor.
        factor: optional float. The context extension factor, for the default
            attention factor; `None` gives an attention factor of 1.
        length: optional int or scalar tensor. The current length, the
            largest position plus one. `None` means the trained length.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`.

    References:
        - [Ding et al., 2024](https://arxiv.org/abs/2402.13753)
    """
    ops.check_max_wavelength(max_wavelength)
    _check_arguments(
        "longrope",
        {
            "short_factor": short_factor,
            "long_factor": long_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
            "attention_factor": attention_factor,
            "factor": factor,
        },
        dim,
    )
    if attention_factor is None:
        if factor is None or factor <= 1:
            attention_factor = 1.0
        else:
            attention_factor = math.sqrt(
                1 + math.log(factor) / math.log(original_max_position_embeddings)
            )
    short = keras.ops.convert_to_tensor(short_factor, "float32")  # (dim / 2,)
    long = keras.ops.convert_to_tensor(long_factor, "float32")
    if length is None:
        divisors = short
    else:
        past_training = (
            keras.ops.cast(length, "float32")
            > original_max_position_embeddings
        )
        divisors = keras.ops.where(past_training, long, short)
    wavelengths = keras.ops.power(
        keras.ops.cast(max_wavelength, "float32"), _exponents(dim)
    )
    return 1.0 / (divisors * wavelengths), float(attention_factor)


def proportional(dim, max_wavelength, factor=1.0, partial_rotary_factor=1.0):
    """Proportional RoPE (Gemma 4): rotate a share of the pairs, spaced over all.

    The first `int(partial_rotary_factor * dim // 2)` feature pairs turn with
    the default frequencies `max_wavelength ** (-2i / dim)`, spaced over the
    whole width `dim` rather than over the rotated share; the remaining pairs
    get frequency 0, so they pass through unrotated. Every frequency is then
    divided by `factor`. This is Hugging Face's
    `_compute_proportional_rope_parameters`: unlike `rotary_dim` (partial
    rotary), the rotated features are not a leading block, since in the
    `"half"` pairing, pair `i` is features `i` and `i + dim / 2`.

    Args:
        dim: int. The number of features, the whole head width.
        max_wavelength: float. The base.
        factor: float. The divisor of every frequency. Defaults to `1.0`.
        partial_rotary_factor: float. The share of the pairs that rotate,
            in `(0, 1]`. Defaults to `1.0`, the default schedule.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`: a float32 tensor of
        shape `(dim / 2,)` and `1.0`.

    Example:

    >>> frequencies, attention_factor = proportional(
    ...     8, 10000.0, partial_rotary_factor=0.5
    ... )
    >>> keras.ops.convert_to_numpy(frequencies), attention_factor
    (array([1. , 0.1, 0. , 0. ], dtype=float32), 1.0)
    """
    ops.check_max_wavelength(max_wavelength)
    _check_arguments(
        "proportional",
        {"factor": factor, "partial_rotary_factor": partial_rotary_factor},
        dim,
    )
    # Written as Hugging Face writes it: (share * dim) // 2, then int.
    rotated_pairs = int(partial_rotary_factor * dim // 2)
    rotated = _base_frequencies(dim, max_wavelength)[:rotated_pairs]
    still = keras.ops.zeros((dim // 2 - rotated_pairs,), "float32")
    frequencies = keras.ops.concatenate([rotated, still], 0)  # (dim / 2,)
    return frequencies / keras.ops.cast(factor, "float32"), 1.0


_SCHEDULES = {
    "default": default,
    "linear": linear,
    "dynamic": dynamic,
    "yarn": yarn,
    "llama3": llama3,
    "longrope": longrope,
    "proportional": proportional,
}
_LENGTH_DEPENDENT = ("dynamic", "longrope")


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_key(name, value, label):
    """Raise a `ValueError` unless `value` suits the schedule argument `name`."""
    if name == "truncate":
        valid, expected = isinstance(value, bool), "a bool"
    elif name == "original_max_position_embeddings":
        valid = (
            isinstance(value, numbers.Integral)
            and not isinstance(value, bool)
            and value > 0
        )
        expected = "a positive integer"
    elif name in ("short_factor", "long_factor"):
        valid = (
            isinstance(value, (list, tuple))
            and len(value) > 0
            and all(_is_number(v) and v > 0 for v in value)
        )
        expected = "a non-empty list of positive numbers"
    elif name == "partial_rotary_factor":
        valid = _is_number(value) and 0 < value <= 1
        expected = "a number in (0, 1]"
    elif name in ("mscale", "mscale_all_dim"):
        # Hugging Face reads 0 as absent.
        valid, expected = _is_number(value) and value >= 0, "a number >= 0"
    else:
        valid, expected = _is_number(value) and value > 0, "a positive number"
    if not valid:
        raise ValueError(
            f"`{label}` must be {expected}. Received: {name}={value!r}"
        )


def _check_arguments(rope_type, arguments, dim=None, label="{}"):
    """Raise a `ValueError` unless `arguments` suit the schedule `rope_type`.

    Args:
        rope_type: str. One of `ROPE_TYPES`.
        arguments: dict. The schedule's arguments by name; `None` stands for
            an optional one left out.
        dim: optional int. The number of rotated features, when known.
        label: str. How a message names an argument, `{}` its name.
    """
    required, _ = _KEYS[rope_type]
    for name, value in arguments.items():
        if value is not None or name in required:
            _check_key(name, value, label.format(name))
    if rope_type == "llama3" and not (
        arguments["high_freq_factor"] > arguments["low_freq_factor"]
    ):
        raise ValueError(
            f"`{label.format('high_freq_factor')}` must be greater than "
            f"`{label.format('low_freq_factor')}`. Received: "
            f"high_freq_factor={arguments['high_freq_factor']!r}, "
            f"low_freq_factor={arguments['low_freq_factor']!r}"
        )
    if rope_type == "yarn":
        # As transformers' _validate_yarn_rope_parameters, which logs it.
        beta_fast, beta_slow = arguments.get("beta_fast"), arguments.get("beta_slow")
        if (beta_fast or 32.0) < (beta_slow or 1.0):
            warnings.warn(
                f"`{label.format('beta_fast')}` should be greater than "
                f"`{label.format('beta_slow')}` (the pairs turning more than "
                "beta_fast times keep their frequency, those turning fewer "
                "than beta_slow are interpolated): the ramp between them runs "
                f"backwards. Received: beta_fast={beta_fast!r} (32 if None), "
                f"beta_slow={beta_slow!r} (1 if None)",
                UserWarning,
                stacklevel=2,
            )
    if rope_type == "longrope":
        short, long = (
            len(arguments[name]) for name in ("short_factor", "long_factor")
        )
        pairs = "" if dim is None else f", {dim // 2} for dim={dim}"
        if short != long or (dim is not None and short != dim // 2):
            raise ValueError(
                f"`{label.format('short_factor')}` and "
                f"`{label.format('long_factor')}` must hold one divisor per "
                f"rotated feature pair{pairs}. Received lengths {short} and "
                f"{long}"
            )
    if rope_type == "dynamic" and dim is not None and dim < 4:
        raise ValueError(
            "Dynamic scaling needs at least 4 rotated features, since its base "
            f"grows with the power dim / (dim - 2). Received: dim={dim}"
        )


def check_scaling(scaling, dim=None):
    """Raise a `ValueError` unless `scaling` is None or a valid schedule dict.

    Args:
        scaling: None or a dict in Hugging Face's `rope_scaling` form, with a
            `"rope_type"` from `ROPE_TYPES` (or `"su"`, read as
            `"longrope"`) and the keys that schedule takes.
        dim: optional int. The number of rotated features, when known: then
            the schedule's needs of it are checked too.
    """
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ValueError(
            "`scaling` must be None or a dict in Hugging Face's rope_scaling "
            f"form. Received: scaling={scaling!r}"
        )
    rope_type = _rope_type(scaling)
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"`scaling['rope_type']` must be one of {ROPE_TYPES} (or an alias "
            f"in {_ALIASES}). Received: rope_type={scaling.get('rope_type')!r} "
            f"in scaling={scaling!r}"
        )
    required, optional = _KEYS[rope_type]
    for name in scaling:
        if name != "rope_type" and name not in required + optional:
            raise ValueError(
                f"`scaling` key {name!r} is not taken by rope_type="
                f"{rope_type!r}, which takes {required + optional}. "
                f"Received: scaling={scaling!r}"
            )
    for name in required:
        if name not in scaling:
            raise ValueError(
                f"`scaling` needs the key {name!r} for rope_type={rope_type!r}. "
                f"Received: scaling={scaling!r}"
            )
    arguments = {k: v for k, v in scaling.items() if k != "rope_type"}
    _check_arguments(rope_type, arguments, dim, label="scaling['{}']")


def read_legacy_type(scaling):
    """`scaling` with its older key `"type"` read as `"rope_type"`.

    Hugging Face's older configs name the schedule `"type"`; transformers
    reads `"rope_type"` first and falls back on it. This does the same,
    and warns that the key is deprecated.

    Args:
        scaling: None or a dict in Hugging Face's `rope_scaling` form.

    Returns:
        `scaling` itself unless it is a dict with a `"type"` key; else a
        copy with `"rope_type"` (kept if given) and without `"type"`.
    """
    if not isinstance(scaling, dict) or "type" not in scaling:
        return scaling
    warnings.warn(
        "`scaling['type']` is deprecated: use `scaling['rope_type']`, the "
        f"key of Hugging Face's current configs. Received: scaling={scaling!r}",
        DeprecationWarning,
        stacklevel=3,
    )
    scaling = dict(scaling)
    legacy_type = scaling.pop("type")
    scaling.setdefault("rope_type", legacy_type)
    return scaling


def _rope_type(scaling):
    """The schedule a dict names, its alias resolved: `"su"` is `"longrope"`."""
    rope_type = scaling.get("rope_type")
    if isinstance(rope_type, str):
        return _ALIASES.get(rope_type, rope_type)
    return rope_type


def depends_on_length(scaling):
    """Whether the schedule's frequencies change with the current length."""
    return scaling is not None and _rope_type(scaling) in _LENGTH_DEPENDENT


def current_length(scaling, *positions):
    """The length a schedule that depends on it reads, or None.

    The largest of `positions` plus one, float32, for a `"dynamic"` or
    `"longrope"` schedule; None for the others, which read none.

    Args:
        scaling: None or a schedule's dict, as `rope_parameters` takes it.
        *positions: tensors of positions, of any shapes.

    Returns:
        None, or a float32 scalar tensor.

    Example:

    >>> length = current_length({"rope_type": "dynamic", "factor": 2.0}, np.arange(5))
    >>> float(keras.ops.convert_to_numpy(length)), current_length(None, np.arange(5))
    (5.0, None)
    """
    if not depends_on_length(scaling):
        return None
    return (
        keras.ops.max(
            keras.ops.stack(
                [keras.ops.max(keras.ops.cast(p, "float32")) for p in positions]
            )
        )
        + 1.0
    )


@renamed_arguments({"sequence_length": "length"})
def rope_parameters(scaling, dim, max_wavelength, length=None):
    """The frequencies and attention factor of a Hugging Face style schedule.

    Args:
        scaling: None or a dict such as `{"rope_type": "linear", "factor": 4.0}`,
            in Hugging Face's `rope_scaling` form with a `"rope_type"` from
            `ROPE_TYPES`. `None` is the default schedule.
        dim: int. The number of rotated features.
        max_wavelength: float. The base, `rope_theta`.
        length: optional int or scalar tensor. The current length, for
            `"dynamic"` and `"longrope"`. `None` means the trained length.

    Returns:
        A tuple `(inverse_frequencies, attention_factor)`: a float32 tensor of
        shape `(dim / 2,)` and a Python float.

    Example:

    >>> scaling = {"rope_type": "linear", "factor": 2.0}
    >>> frequencies, attention_factor = rope_parameters(scaling, 4, 10000.0)
    >>> keras.ops.convert_to_numpy(frequencies), attention_factor
    (array([0.5  , 0.005], dtype=float32), 1.0)
    """
    check_scaling(scaling)
    if scaling is None:
        return default(dim, max_wavelength)
    # An optional key set to None (null in a config.json) takes its default.
    arguments = {
        k: v for k, v in scaling.items() if k != "rope_type" and v is not None
    }
    rope_type = _rope_type(scaling)
    if rope_type in _LENGTH_DEPENDENT:
        arguments["length"] = length
    return _SCHEDULES[rope_type](dim, max_wavelength, **arguments)
