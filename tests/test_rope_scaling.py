import math
import re

import numpy as np
import pytest
import keras
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import rope_scaling
from tests import references
from tests.backend import compiled
from tests.backend import numpy

# A float32 frequency is a handful of float32 roundings of exact inputs (the
# base, the exponent 2i / dim, which is exact for power-of-two dims, the power,
# one division or blend): each at most 2**-24 ~ 6e-8 relative, so a few times
# that. 1e-6 is ~8 ulp: tight enough that any wrong formula, index or factor
# fails by orders of magnitude, loose enough for TensorFlow's float32 `pow`.
FREQUENCY_RTOL = 1e-6


def frequency_rtol(dim, base):
    """FREQUENCY_RTOL, plus the float32 rounding of 2i / dim when it is inexact.

    An exponent off by 2**-24 relative moves base ** exponent by up to
    2**-24 * ln(base) relative (8.2e-7 at base 1e6).
    """
    if dim & (dim - 1) == 0:
        return FREQUENCY_RTOL
    return FREQUENCY_RTOL + 2.0**-24 * math.log(base)


# Half an ulp of 1 is 2**-24: four such roundings of a weight or a sum near 1.
FLOAT32_CANCELLATION = 2.0**-22


def reference_rtol(dim, base, scaling, length, expected):
    """The relative tolerance of each float32 frequency against the float64 one.

    frequency_rtol, plus what Hugging Face's own float32 evaluation of two
    formulas cancels away:
    - dynamic past the trained length: factor * L / orig - (factor - 1) is ~1
      for L just past orig, its error ~factor * 2**-24, and the exponent
      dim / (dim - 2) carries it into the base. At or below the trained length
      the schedule is the default one and gets no such allowance (HF computes
      those frequencies in Python floats).
    - yarn: the ramp weight, within 2**-22 of 1, multiplies
      extrapolation - interpolation = default * (1 - 1 / factor).
    """
    rtol = frequency_rtol(dim, base)
    rope_type = (scaling or {}).get("rope_type")
    original = (scaling or {}).get("original_max_position_embeddings")
    if rope_type == "dynamic" and length is not None:
        if length > original:
            factor = scaling["factor"]
            ratio = factor * length / original
            return rtol + FLOAT32_CANCELLATION * dim / (dim - 2) * (ratio + factor) / (
                ratio - (factor - 1)
            )
    if rope_type == "yarn":
        default = references.rope_inverse_frequencies(dim, base)[0]
        spread = np.abs(default - default / scaling["factor"])  # (dim / 2,)
        return rtol + FLOAT32_CANCELLATION * spread / expected
    return rtol


# The attention factor is a Python float computed from Python floats.
ATTENTION_RTOL = 1e-12

LLAMA_3_1 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def longrope_scaling(dim, **keys):
    """A Phi-3 style longrope dict: gentle short factors, steep long ones."""
    return {
        "rope_type": "longrope",
        "short_factor": list(np.linspace(1.0, 1.25, dim // 2)),
        "long_factor": list(np.geomspace(1.0, 48.0, dim // 2)),
        "original_max_position_embeddings": 4096,
        **keys,
    }


def direct_call(scaling, dim, max_wavelength, length=None):
    """The schedule function named by `scaling`, called with its keys."""
    if scaling is None:
        return rope_scaling.default(dim, max_wavelength)
    keys = dict(scaling)
    schedule = getattr(rope_scaling, keys.pop("rope_type"))
    if length is not None:
        keys["length"] = length
    return schedule(dim, max_wavelength, **keys)


def assert_close(actual, expected, rtol):
    """|actual - expected| <= rtol * |expected|, with rtol per pair or one for all."""
    error = np.abs(np.asarray(actual, "float64") - expected)
    bound = rtol * np.abs(expected)
    assert np.all(error <= bound), (np.max(error / bound), actual, expected)


def assert_matches_reference(result, dim, base, scaling, length=None):
    inverse_frequencies, attention_factor = result
    expected, expected_attention = references.rope_inverse_frequencies(
        dim, base, scaling, length
    )
    assert keras.backend.standardize_dtype(inverse_frequencies.dtype) == "float32"
    assert inverse_frequencies.shape == (dim // 2,)
    rtol = reference_rtol(dim, base, scaling, length, expected)
    assert_close(numpy(inverse_frequencies), expected, rtol)
    assert isinstance(attention_factor, float)
    assert attention_factor == pytest.approx(expected_attention, rel=ATTENTION_RTOL)


def test_rope_types():
    assert rope_scaling.ROPE_TYPES == (
        "default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional"
    )


# The reference itself, against values worked out by hand.
def test_reference_against_hand_computed_values():
    frequencies, attention = references.rope_inverse_frequencies(8, 10000.0)
    np.testing.assert_allclose(frequencies, [1.0, 0.1, 0.01, 0.001], rtol=1e-15)
    assert attention == 1.0
    llama, _ = references.rope_inverse_frequencies(128, 500000.0, LLAMA_3_1)
    # Pair 30: wavelength 2 pi 500000^(30/64) ~ 2949, between 8192/4 and 8192,
    # smooth = (8192 / wavelength - 1) / 3.
    default_30 = 500000.0 ** (-30 / 64)
    smooth = (8192 * default_30 / (2 * math.pi) - 1.0) / 3.0
    assert llama[30] == pytest.approx(default_30 * ((1 - smooth) / 8 + smooth), 1e-14)
    assert llama[0] == 1.0  # wavelength 2 pi: untouched
    assert llama[63] == pytest.approx(500000.0 ** (-63 / 64) / 8, rel=1e-14)


@pytest.mark.parametrize(
    "pairing, second_feature", [("half", 3), ("interleaved", 1)]
)
def test_rotary_reference_by_hand(pairing, second_feature):
    # Width 8, rotary_dim 6: pair 0 is features (0, 3) in "half", (0, 1) in
    # "interleaved"; features 6 and 7 pass through.
    inputs = np.zeros((2, 3, 8))
    inputs[..., 0] = 1.0
    inputs[..., 6:] = 5.0
    positions = np.array([[0.0, 1.0, 2.5], [7.0, -1.0, 0.0]])
    rotated = references.rotary(
        inputs, positions, [1.0, 0.1, 0.01], attention_factor=2.0,
        pairing=pairing, rotary_dim=6,
    )
    np.testing.assert_allclose(rotated[..., 0], 2.0 * np.cos(positions), rtol=1e-15)
    np.testing.assert_allclose(
        rotated[..., second_feature], 2.0 * np.sin(positions), rtol=1e-15
    )
    untouched = [f for f in range(6) if f not in (0, second_feature)]
    assert np.all(rotated[..., untouched] == 0.0)
    assert np.all(rotated[..., 6:] == 5.0)
    # With heads: every head turns alike; (seq,) positions serve every batch.
    heads = np.random.default_rng(0).normal(size=(2, 3, 4, 6))
    with_heads = references.rotary(heads, positions[0], [1.0, 0.1, 0.01], pairing=pairing)
    for head in range(4):
        np.testing.assert_allclose(
            with_heads[:, :, head],
            references.rotary(heads[:, :, head], positions[0], [1.0, 0.1, 0.01],
                              pairing=pairing),
            rtol=1e-14,
        )
    np.testing.assert_allclose(
        np.linalg.norm(with_heads, axis=-1), np.linalg.norm(heads, axis=-1)
    )


@pytest.mark.parametrize("dim", [2, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0, 1e6])
def test_default(dim, base):
    assert_matches_reference(rope_scaling.default(dim, base), dim, base, None)


@pytest.mark.parametrize("dim, base", [(64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("factor", [0.5, 2.0, 8.0, 32.0])
def test_linear(dim, base, factor):
    scaling = {"rope_type": "linear", "factor": factor}
    assert_matches_reference(rope_scaling.linear(dim, base, factor), dim, base, scaling)


@pytest.mark.parametrize("dim, base", [(64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("factor", [2.0, 4.0])
@pytest.mark.parametrize("length", [None, 1, 4095, 4096, 4097, 12000, 65536])
def test_dynamic_below_and_past_the_trained_length(dim, base, factor, length):
    scaling = {
        "rope_type": "dynamic",
        "factor": factor,
        "original_max_position_embeddings": 4096,
    }
    result = rope_scaling.dynamic(
        dim, base, factor, 4096, length=length
    )
    assert_matches_reference(result, dim, base, scaling, length)


@pytest.mark.parametrize(
    "factor, original, length",
    [
        (40.1, 4096, 4097),
        (23.8387240757, 43, 1),
        (23.8387240757, 43, 43),
        (23.8387240757, 43, 44),
        (1.1, 3000, 3001),
    ],
)
def test_dynamic_with_factors_inexact_in_float32(factor, original, length):
    # factor * L / original - (factor - 1) cancels to ~1 near the trained
    # length, where a float32 evaluation loses ~factor * 2**-24 (see
    # reference_rtol); at or below it the frequencies must be the default ones.
    scaling = {
        "rope_type": "dynamic",
        "factor": factor,
        "original_max_position_embeddings": original,
    }
    for dim in (4, 64):
        result = rope_scaling.dynamic(
            dim, 100.0, factor, original, length=length
        )
        assert_matches_reference(result, dim, 100.0, scaling, length)


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
@pytest.mark.parametrize("length", [100, 4096, 12000])
def test_dynamic_scalar_tensor_length(dtype, length):
    scaling = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 4096,
    }
    result = rope_scaling.dynamic(
        64,
        10000.0,
        2.0,
        4096,
        # int64 is int32 on JAX without x64.
        length=keras.ops.convert_to_tensor(np.array(length, dtype)),
    )
    assert_matches_reference(result, 64, 10000.0, scaling, length)


def test_dynamic_and_longrope_follow_a_symbolic_length_under_xla():
    dynamic = {
        "rope_type": "dynamic",
        "factor": 4.0,
        "original_max_position_embeddings": 2048,
    }
    longrope = longrope_scaling(64)

    @compiled
    def frequencies(length):
        return (
            rope_scaling.rope_parameters(dynamic, 64, 10000.0, length)[0],
            rope_scaling.rope_parameters(longrope, 64, 10000.0, length)[0],
        )

    for length in (7, 2048, 4096, 4097, 30000):
        dynamic_frequencies, longrope_frequencies = frequencies(
            keras.ops.convert_to_tensor(length, "int32")
        )
        for scaling, result in [
            (dynamic, dynamic_frequencies),
            (longrope, longrope_frequencies),
        ]:
            expected, _ = references.rope_inverse_frequencies(
                64, 10000.0, scaling, length
            )
            rtol = reference_rtol(64, 10000.0, scaling, length, expected)
            assert_close(numpy(result), expected, rtol)


YARN_CASES = {
    "defaults": {"factor": 4.0, "original_max_position_embeddings": 4096},
    "no_truncate": {
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
    },
    "betas": {
        "factor": 16.0,
        "original_max_position_embeddings": 32768,
        "beta_fast": 16.0,
        "beta_slow": 2.0,
    },
    "explicit_attention_factor": {
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "attention_factor": 0.75,
    },
    # DeepSeek-V2 style: the ratio of two mscales.
    "mscale_all_dim": {
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.707,
    },
    # One mscale alone is not enough: back to 0.1 ln(factor) + 1.
    "mscale_alone": {
        "factor": 40.0,
        "original_max_position_embeddings": 4096,
        "mscale": 0.707,
    },
    "factor_below_one": {"factor": 0.5, "original_max_position_embeddings": 4096},
    # Both correction dims clip to 0: low == high, the ramp's +0.001 guard.
    "degenerate_ramp": {"factor": 4.0, "original_max_position_embeddings": 6},
}


@pytest.mark.parametrize("dim, base", [(64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("case", sorted(YARN_CASES))
def test_yarn(dim, base, case):
    scaling = {"rope_type": "yarn", **YARN_CASES[case]}
    assert_matches_reference(direct_call(scaling, dim, base), dim, base, scaling)


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"factor": 4.0}, 0.1 * math.log(4.0) + 1.0),
        ({"factor": 4.0, "attention_factor": 0.75}, 0.75),
        (
            {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707},
            (0.1 * math.log(40.0) + 1.0) / (0.0707 * math.log(40.0) + 1.0),
        ),
        ({"factor": 1.0}, 1.0),
    ],
)
def test_yarn_attention_factor_by_hand(keys, expected):
    _, attention_factor = rope_scaling.yarn(
        64, 10000.0, original_max_position_embeddings=4096, **keys
    )
    assert attention_factor == pytest.approx(expected, rel=1e-12)


def test_llama_3_1():
    frequencies, attention_factor = rope_scaling.llama3(
        128, 500000.0, 8.0, 1.0, 4.0, 8192
    )
    assert_matches_reference(
        (frequencies, attention_factor), 128, 500000.0, LLAMA_3_1
    )
    # Wavelength 2 pi 500000^(i/64) is below 8192/4 for i <= 28 and above 8192
    # for i >= 35: those pairs are kept and divided by 8, the six between blend.
    default = references.rope_inverse_frequencies(128, 500000.0)[0]
    frequencies = numpy(frequencies)
    np.testing.assert_allclose(frequencies[:29], default[:29], rtol=FREQUENCY_RTOL)
    np.testing.assert_allclose(
        frequencies[35:], default[35:] / 8.0, rtol=FREQUENCY_RTOL
    )
    assert np.all(frequencies[29:35] < default[29:35])
    assert np.all(frequencies[29:35] > default[29:35] / 8.0)


@pytest.mark.parametrize("dim, base", [(64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize(
    "keys",
    [
        {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192},
        {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 8192},
        {"factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 16.0,
         "original_max_position_embeddings": 2048},
    ],
)
def test_llama3(dim, base, keys):
    scaling = {"rope_type": "llama3", **keys}
    assert_matches_reference(direct_call(scaling, dim, base), dim, base, scaling)


@pytest.mark.parametrize("dim, base", [(64, 10000.0), (96, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("length", [None, 100, 4096, 4097, 100000])
@pytest.mark.parametrize(
    "keys",
    [{}, {"factor": 32.0}, {"factor": 0.5}, {"attention_factor": 1.5},
     {"factor": 32.0, "attention_factor": 1.5}],
)
def test_longrope(dim, base, length, keys):
    scaling = longrope_scaling(dim, **keys)
    result = direct_call(scaling, dim, base, length)
    assert_matches_reference(result, dim, base, scaling, length)


def test_longrope_switches_to_long_factors_past_the_trained_length():
    scaling = longrope_scaling(64, factor=32.0)
    short, short_attention = direct_call(scaling, 64, 10000.0, 4096)
    long, long_attention = direct_call(scaling, 64, 10000.0, 4097)
    default = references.rope_inverse_frequencies(64, 10000.0)[0]
    np.testing.assert_allclose(
        numpy(short), default / np.array(scaling["short_factor"]), rtol=FREQUENCY_RTOL
    )
    np.testing.assert_allclose(
        numpy(long), default / np.array(scaling["long_factor"]), rtol=FREQUENCY_RTOL
    )
    # The attention factor depends on `factor` alone, not on the length.
    expected_attention = math.sqrt(1.0 + math.log(32.0) / math.log(4096))
    assert short_attention == pytest.approx(expected_attention, rel=1e-12)
    assert long_attention == pytest.approx(expected_attention, rel=1e-12)


@pytest.mark.parametrize("length", [4096, 4097])
def test_longrope_scalar_tensor_sequence_length(length):
    scaling = longrope_scaling(64, factor=32.0)
    result = direct_call(
        scaling, 64, 10000.0, keras.ops.convert_to_tensor(length)
    )
    assert_matches_reference(result, 64, 10000.0, scaling, length)


# Proportional RoPE, transformers' _compute_proportional_rope_parameters:
# Gemma 4's full attention layers, 512 wide heads, a quarter of pairs turning.
PROPORTIONAL_CASES = [
    (512, 1e6, 0.25, 1.0),
    (256, 10000.0, 1.0, 1.0),
    (128, 500000.0, 0.5, 8.0),
    (80, 10000.0, 0.3, 1.0),
    (96, 1e6, 0.7, 2.5),
    (8, 10000.0, 0.125, 1.0),
]


@pytest.mark.parametrize(
    "dim, base, partial_rotary_factor, factor", PROPORTIONAL_CASES
)
def test_proportional(dim, base, partial_rotary_factor, factor):
    frequencies, attention_factor = rope_scaling.proportional(
        dim, base, factor=factor, partial_rotary_factor=partial_rotary_factor
    )
    expected = references.proportional_inverse_frequencies(
        dim, base, partial_rotary_factor, factor
    )
    assert keras.backend.standardize_dtype(frequencies.dtype) == "float32"
    assert frequencies.shape == (dim // 2,)
    rotated = expected > 0
    assert_close(
        numpy(frequencies)[rotated], expected[rotated], frequency_rtol(dim, base)
    )
    # Pairs past the share do not turn at all.
    assert np.all(numpy(frequencies)[~rotated] == 0.0)
    assert attention_factor == 1.0


def test_proportional_spaces_frequencies_over_the_whole_width():
    # Width 512, a quarter: pairs 0..63 turn at base^(-2i / 512), not at
    # base^(-2i / 128) as partial rotary of 128 features would.
    frequencies = numpy(
        rope_scaling.proportional(512, 1e6, partial_rotary_factor=0.25)[0]
    )
    assert np.count_nonzero(frequencies) == 64
    assert frequencies[63] == pytest.approx(1e6 ** (-126 / 512), rel=FREQUENCY_RTOL)
    assert frequencies[63] > 1e6 ** (-126 / 128) * 1000
    # The share rounds down as int(share * dim // 2): 0.3 * 80 // 2 = 12.
    assert np.count_nonzero(rope_scaling.proportional(80, 1e4, 1.0, 0.3)[0]) == 12
    # All of it is the default schedule, divided by factor.
    np.testing.assert_array_equal(
        numpy(rope_scaling.proportional(64, 1e4)[0]),
        numpy(rope_scaling.default(64, 1e4)[0]),
    )


@pytest.mark.parametrize("length", [None, 100, 4096, 4097, 100000])
def test_su_is_longrope(length):
    # Phi-3 vision configs name LongRoPE "su".
    longrope = longrope_scaling(96, factor=32.0)
    su = {**longrope, "rope_type": "su"}
    rope_scaling.check_scaling(su, 96)
    assert rope_scaling.depends_on_length(su)
    frequencies, attention_factor = rope_scaling.rope_parameters(
        su, 96, 10000.0, length
    )
    direct = direct_call(longrope, 96, 10000.0, length)
    np.testing.assert_array_equal(numpy(frequencies), numpy(direct[0]))
    assert attention_factor == direct[1]
    assert_matches_reference(
        (frequencies, attention_factor), 96, 10000.0, longrope, length
    )


@pytest.mark.parametrize(
    "scaling",
    [{"rope_type": "dynamic", "factor": 2.0}, longrope_scaling(96, factor=32.0)],
    ids=["dynamic", "longrope"],
)
def test_current_length_is_the_largest_position_plus_one(scaling):
    queries = np.array([[3, 9, 4]])
    keys = np.array([[-2, 0, 7], [11, 1, 5]])  # 11 the largest of all
    length = rope_scaling.current_length(scaling, queries, keys)
    assert keras.backend.standardize_dtype(length.dtype) == "float32"
    assert float(numpy(length)) == 12.0


@pytest.mark.parametrize(
    "scaling", [None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}]
)
def test_schedules_of_no_length_have_no_current_length(scaling):
    assert rope_scaling.current_length(scaling, np.arange(5)) is None


def test_proportional_through_rope_parameters():
    scaling = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    rope_scaling.check_scaling(scaling, 512)
    assert not rope_scaling.depends_on_length(scaling)
    frequencies, attention_factor = rope_scaling.rope_parameters(
        scaling, 512, 1e6, length=100000
    )
    np.testing.assert_array_equal(
        numpy(frequencies),
        numpy(rope_scaling.proportional(512, 1e6, partial_rotary_factor=0.25)[0]),
    )
    assert attention_factor == 1.0
    # A null share (null in a config.json) is the whole width.
    frequencies, _ = rope_scaling.rope_parameters(
        {"rope_type": "proportional", "partial_rotary_factor": None}, 64, 1e4
    )
    np.testing.assert_array_equal(
        numpy(frequencies), numpy(rope_scaling.default(64, 1e4)[0])
    )


ALL_SCALINGS = [
    None,
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", **YARN_CASES["mscale_all_dim"]},
    {"rope_type": "yarn", **YARN_CASES["no_truncate"]},
    LLAMA_3_1,
    longrope_scaling(64, factor=16.0),
]


@pytest.mark.parametrize("scaling", ALL_SCALINGS)
@pytest.mark.parametrize("length", [None, 100, 20000])
def test_rope_parameters_dispatches_to_the_schedule(scaling, length):
    dim = 64
    rope_scaling.check_scaling(scaling)
    inverse_frequencies, attention_factor = rope_scaling.rope_parameters(
        scaling, dim, 500000.0, length=length
    )
    rope_type = (scaling or {"rope_type": "default"})["rope_type"]
    if rope_type == "default":
        direct = rope_scaling.default(dim, 500000.0)
    elif rope_type in ("linear", "yarn", "llama3"):
        # Lengths only matter to dynamic and longrope.
        direct = direct_call(scaling, dim, 500000.0)
    else:
        direct = direct_call(scaling, dim, 500000.0, length)
    np.testing.assert_array_equal(numpy(inverse_frequencies), numpy(direct[0]))
    assert attention_factor == direct[1]
    assert_matches_reference(
        (inverse_frequencies, attention_factor), dim, 500000.0, scaling, length
    )


def test_rope_parameters_leaves_the_scaling_dict_alone():
    scaling = {"rope_type": "yarn", **YARN_CASES["betas"]}
    copy = dict(scaling)
    rope_scaling.check_scaling(scaling)
    rope_scaling.rope_parameters(scaling, 64, 10000.0)
    assert scaling == copy


def without(scaling, key):
    return {name: value for name, value in scaling.items() if name != key}


BAD_SCALINGS = [
    # (scaling, what the message must hold: a string, or a (key, value) pair
    # written as `key=value` or `'key': value`)
    ([("rope_type", "linear")], ["scaling", "rope_type"]),
    ("linear", ["scaling", "linear"]),
    ({"factor": 2.0}, ["rope_type"]),
    ({"rope_type": "ntk", "factor": 2.0}, ["rope_type", "ntk"]),
    ({"rope_type": "linear"}, ["factor"]),
    ({"rope_type": "dynamic", "original_max_position_embeddings": 4096}, ["factor"]),
    ({"rope_type": "yarn", "original_max_position_embeddings": 4096}, ["factor"]),
    (without(LLAMA_3_1, "factor"), ["factor"]),
    ({"rope_type": "linear", "factor": 0}, [("factor", 0)]),
    ({"rope_type": "linear", "factor": -1}, [("factor", -1)]),
    (
        {"rope_type": "dynamic", "factor": 0, "original_max_position_embeddings": 4096},
        [("factor", 0)],
    ),
    (
        {"rope_type": "yarn", "factor": -1, "original_max_position_embeddings": 4096},
        [("factor", -1)],
    ),
    ({**LLAMA_3_1, "factor": 0}, [("factor", 0)]),
    ({**LLAMA_3_1, "factor": -1.0}, [("factor", -1.0)]),
    (
        {"rope_type": "linear", "factor": 2.0, "beta_fast": 32.0},
        [("beta_fast", 32.0)],
    ),
    ({"rope_type": "default", "factor": 2.0}, [("factor", 2.0)]),
    (
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4096,
         "low_freq_factor": 1.0},
        [("low_freq_factor", 1.0)],
    ),
    ({**LLAMA_3_1, "mscale": 1.0}, [("mscale", 1.0)]),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
         "short_factor": [1.0]},
        ["short_factor"],
    ),
    ({**longrope_scaling(8), "truncate": False}, [("truncate", False)]),
    ({"rope_type": "dynamic", "factor": 2.0}, ["original_max_position_embeddings"]),
    ({"rope_type": "yarn", "factor": 2.0}, ["original_max_position_embeddings"]),
    (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0},
        ["original_max_position_embeddings"],
    ),
    (
        without(longrope_scaling(8), "original_max_position_embeddings"),
        ["original_max_position_embeddings"],
    ),
    (without(LLAMA_3_1, "high_freq_factor"), ["high_freq_factor"]),
    (without(longrope_scaling(8), "long_factor"), ["long_factor"]),
    (
        {"rope_type": "proportional", "partial_rotary_factor": 0},
        [("partial_rotary_factor", 0)],
    ),
    (
        {"rope_type": "proportional", "partial_rotary_factor": 1.5},
        [("partial_rotary_factor", 1.5)],
    ),
    (
        {"rope_type": "proportional", "partial_rotary_factor": "0.25"},
        [("partial_rotary_factor", "0.25")],
    ),
    ({"rope_type": "proportional", "factor": 0}, [("factor", 0)]),
    (
        {"rope_type": "proportional", "original_max_position_embeddings": 4096},
        [("original_max_position_embeddings", 4096)],
    ),
    ({"rope_type": "su", "factor": 2.0}, ["short_factor", "'su'"]),
]


@pytest.mark.parametrize("scaling, fragments", BAD_SCALINGS)
def test_bad_scaling_raises_value_error_naming_the_key_and_value(scaling, fragments):
    for call in (
        lambda: rope_scaling.check_scaling(scaling),
        lambda: rope_scaling.rope_parameters(scaling, 8, 10000.0),
    ):
        with pytest.raises(ValueError) as error:
            call()
        message = str(error.value)
        for fragment in fragments:
            if isinstance(fragment, str):
                assert fragment in message, (fragment, message)
            else:
                key, value = fragment
                pattern = rf"{key}'?(=|: ){re.escape(repr(value))}(?![\d.])"
                assert re.search(pattern, message), (pattern, message)


def test_check_scaling_accepts_every_good_dict():
    for scaling in ALL_SCALINGS + [
        {"rope_type": "yarn", **keys} for keys in YARN_CASES.values()
    ]:
        assert rope_scaling.check_scaling(scaling) is None


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: rope_scaling.linear(8, 10000.0, 0), r"`factor`.*factor=0"),
        (
            lambda: rope_scaling.dynamic(8, 10000.0, -1.0, 64),
            r"`factor`.*factor=-1\.0",
        ),
        (
            lambda: rope_scaling.yarn(8, 10000.0, 4.0, 0),
            r"`original_max_position_embeddings`.*=0",
        ),
        (
            lambda: rope_scaling.yarn(8, 10000.0, 4.0, 64, beta_fast=0),
            r"`beta_fast`.*beta_fast=0",
        ),
        (
            lambda: rope_scaling.llama3(8, 500000.0, 8.0, 4.0, 1.0, 8192),
            r"`high_freq_factor` must be greater",
        ),
        (
            lambda: rope_scaling.longrope(8, 10000.0, [1.0] * 3, [2.0] * 3, 64),
            r"4 for dim=8\. Received lengths 3 and 3",
        ),
        (
            lambda: rope_scaling.dynamic(2, 10000.0, 2.0, 64),
            r"at least 4 rotated features.*dim=2",
        ),
        (
            lambda: rope_scaling.proportional(8, 10000.0, partial_rotary_factor=2.0),
            r"`partial_rotary_factor`.*partial_rotary_factor=2\.0",
        ),
    ],
)
def test_schedules_called_directly_check_their_arguments(call, message):
    # Past rope_parameters too, a bad argument is a ValueError, not an
    # infinite or NaN frequency.
    with pytest.raises(ValueError, match=message):
        call()


def test_null_optional_keys_take_their_defaults():
    # A config.json may spell a left-out key as null; Hugging Face then uses
    # the default (beta_fast 32, beta_slow 1, truncation, the computed
    # attention factor), and reads an mscale of 0 as absent.
    spelled_out = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": None,
        "beta_slow": None,
        "attention_factor": None,
        "mscale": 0,
        "mscale_all_dim": 0,
        "truncate": None,
    }
    frequencies, attention_factor = rope_scaling.rope_parameters(
        spelled_out, 64, 10000.0
    )
    expected, expected_attention = references.rope_inverse_frequencies(
        64, 10000.0, {k: v for k, v in spelled_out.items() if v is not None}
    )
    np.testing.assert_allclose(numpy(frequencies), expected, rtol=1e-5)
    assert attention_factor == pytest.approx(0.1 * math.log(4.0) + 1.0)
    assert expected_attention == pytest.approx(attention_factor)


half_dims = st.integers(1, 96)
bases = st.sampled_from([100.0, 10000.0, 500000.0, 1e6])


@settings(deadline=None, max_examples=40)
@given(half_dim=half_dims, base=bases, factor=st.floats(0.25, 64.0))
def test_linear_is_default_over_factor(half_dim, base, factor):
    dim = 2 * half_dim
    default, _ = rope_scaling.default(dim, base)
    linear, attention_factor = rope_scaling.linear(dim, base, factor)
    # Two float32 roundings apart at most: the factor's and the quotient's.
    np.testing.assert_allclose(
        numpy(linear), numpy(default).astype("float64") / factor, rtol=3e-7
    )
    assert attention_factor == 1.0


@settings(deadline=None, max_examples=40)
@given(
    half_dim=st.integers(2, 96),
    base=bases,
    factor=st.floats(1.0, 64.0),
    original=st.integers(16, 131072),
    data=st.data(),
)
def test_dynamic_is_default_up_to_the_trained_length(
    half_dim, base, factor, original, data
):
    dim = 2 * half_dim
    length = data.draw(st.integers(1, original))
    at_trained_length, _ = rope_scaling.dynamic(dim, base, factor, original)
    below, attention_factor = rope_scaling.dynamic(
        dim, base, factor, original, length=length
    )
    np.testing.assert_array_equal(numpy(below), numpy(at_trained_length))
    np.testing.assert_allclose(
        numpy(below), numpy(rope_scaling.default(dim, base)[0]), rtol=FREQUENCY_RTOL
    )
    assert attention_factor == 1.0
    # Past it, the base grows with the length (factor * (L / orig - 1) + 1 > 1):
    # every frequency but the first (always 1) falls.
    longer, _ = rope_scaling.dynamic(
        dim, base, factor, original, length=original * 3 + 1
    )
    assert numpy(longer)[0] == 1.0
    assert np.all(numpy(longer)[1:] < numpy(below)[1:])


@settings(deadline=None, max_examples=40)
@given(
    half_dim=st.integers(4, 96),
    base=bases,
    factor=st.floats(1.5, 32.0),
    low_freq_factor=st.floats(0.5, 4.0),
    band=st.floats(0.5, 8.0),
    original=st.integers(256, 131072),
)
def test_llama3_keeps_high_and_divides_low_frequencies(
    half_dim, base, factor, low_freq_factor, band, original
):
    dim = 2 * half_dim
    high_freq_factor = low_freq_factor + band
    frequencies, attention_factor = rope_scaling.llama3(
        dim, base, factor, low_freq_factor, high_freq_factor, original
    )
    frequencies = numpy(frequencies)
    default = numpy(rope_scaling.default(dim, base)[0]).astype("float64")
    wavelength = 2 * math.pi / references.rope_inverse_frequencies(dim, base)[0]
    high = wavelength < original / high_freq_factor
    low = wavelength > original / low_freq_factor
    np.testing.assert_allclose(frequencies[high], default[high], rtol=FREQUENCY_RTOL)
    np.testing.assert_allclose(
        frequencies[low], default[low] / factor, rtol=FREQUENCY_RTOL
    )
    medium = ~high & ~low
    assert np.all(frequencies[medium] <= default[medium] * (1 + FREQUENCY_RTOL))
    assert np.all(
        frequencies[medium] >= default[medium] / factor * (1 - FREQUENCY_RTOL)
    )
    assert attention_factor == 1.0


@settings(deadline=None, max_examples=40)
@given(
    half_dim=st.integers(1, 64),
    base=bases,
    factor=st.floats(1.0, 64.0),
    original=st.integers(64, 131072),
    beta_fast=st.floats(8.0, 64.0),
    beta_slow=st.floats(0.5, 2.0),
    truncate=st.booleans(),
)
def test_yarn_matches_reference_and_blends_default_and_linear(
    half_dim, base, factor, original, beta_fast, beta_slow, truncate
):
    dim = 2 * half_dim
    keys = {
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "truncate": truncate,
    }
    frequencies, attention_factor = rope_scaling.yarn(dim, base, **keys)
    scaling = {"rope_type": "yarn", **keys}
    assert_matches_reference((frequencies, attention_factor), dim, base, scaling)
    frequencies = numpy(frequencies)
    assert attention_factor == pytest.approx(0.1 * math.log(factor) + 1.0, rel=1e-12)
    # Each pair lies between the extrapolated (default) and interpolated
    # (default / factor) frequency, moving towards the second as pairs slow.
    # Within reference_rtol, a frequency moves the blend by at most
    # 1.9e-6 / (1 - 1 / factor) + 2**-22 <= 2.2e-5 for factor >= 1.1.
    if factor >= 1.1:
        default = references.rope_inverse_frequencies(dim, base)[0]
        blend = (default - frequencies) / (default - default / factor)
        assert np.all(blend >= -1e-4) and np.all(blend <= 1 + 1e-4)
        assert np.all(np.diff(blend) >= -1e-4)


@settings(deadline=None, max_examples=30)
@given(
    half_dim=st.integers(1, 64),
    base=bases,
    data=st.data(),
    length=st.integers(1, 20000),
)
def test_longrope_divides_default_by_its_factors(half_dim, base, data, length):
    dim = 2 * half_dim
    factors = st.lists(st.floats(1.0, 64.0), min_size=half_dim, max_size=half_dim)
    short_factor, long_factor = data.draw(factors), data.draw(factors)
    frequencies, _ = rope_scaling.longrope(
        dim, base, short_factor, long_factor, 8192, length=length
    )
    rescale = long_factor if length > 8192 else short_factor
    np.testing.assert_allclose(
        numpy(frequencies) * np.array(rescale),
        references.rope_inverse_frequencies(dim, base)[0],
        rtol=frequency_rtol(dim, base),
    )


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
        {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
        LLAMA_3_1,
        longrope_scaling(8),
        {"rope_type": "proportional", "partial_rotary_factor": 0.5},
    ],
    ids=lambda scaling: "default" if scaling is None else scaling["rope_type"],
)
def test_every_schedule_refuses_an_infinite_base(scaling):
    with pytest.raises(ValueError, match=r"finite.*max_wavelength=inf"):
        rope_scaling.rope_parameters(scaling, 8, float("inf"))


@pytest.mark.parametrize(
    "keys, received",
    [
        ({"beta_fast": 1.0, "beta_slow": 32.0}, r"beta_fast=1\.0 \(32 if None\), beta_slow=32\.0"),
        ({"beta_fast": 0.5}, r"beta_fast=0\.5 \(32 if None\), beta_slow=None"),
        ({"beta_slow": 64.0}, r"beta_fast=None \(32 if None\), beta_slow=64\.0"),
    ],
)
def test_yarn_warns_of_a_ramp_that_runs_backwards(keys, received):
    # transformers' _validate_yarn_rope_parameters logs the same warning.
    with pytest.warns(UserWarning, match=r"`beta_fast` should be greater than `beta_slow`"):
        rope_scaling.yarn(8, 10000.0, 4.0, 64, **keys)
    with pytest.warns(UserWarning, match=r"`scaling\['beta_fast'\]` should be.*" + received):
        rope_scaling.check_scaling(
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, **keys}
        )
