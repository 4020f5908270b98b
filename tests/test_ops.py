import re

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import ops
from tests import references
from tests.backend import BACKEND
from tests.backend import graph_function
from tests.backend import numpy

# A float32 angle p * w is off by up to half an ulp of p * w <= p, so the
# table's error grows with the position: this is the float32 floor.
FLOAT32_ANGLE_ERROR = 6e-8


# TensorFlow's and PyTorch's int64; JAX computes in 32 bits unless told to
# use 64 (jax_enable_x64), and turns an int64 request into int32.
WIDE_INT = "int32" if BACKEND == "jax" else "int64"


def dtype_of(tensor):
    """A tensor's dtype as Keras names it: "float32", "int32"..."""
    return keras.backend.standardize_dtype(tensor.dtype)


def position_tolerance(positions):
    """Per-row absolute tolerance of a float32 table at `positions`."""
    return FLOAT32_ANGLE_ERROR * np.abs(positions)[..., None] + 2e-6


@pytest.mark.parametrize(
    "pairing, dim",
    [("interleaved", 64), ("interleaved", 7), ("interleaved", 1), ("half", 64)],
)
def test_sinusoidal_matches_paper_up_to_position_10000(pairing, dim):
    positions = np.arange(10001)
    expected = references.sinusoidal(positions, dim, pairing=pairing)
    table = ops.sinusoidal(
        keras.ops.convert_to_tensor(positions), dim, pairing=pairing
    )
    assert dtype_of(table) == "float32"
    assert tuple(table.shape) == (10001, dim)
    error = np.abs(numpy(table) - expected)
    tolerance = position_tolerance(positions)
    assert np.all(error <= tolerance), np.max(error / tolerance)


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_sinusoidal_float_positions_and_other_wavelength(pairing):
    positions = np.array([[-3.25, 0.0, 0.5, 17.75], [1e3 + 0.1, 2.0, 3.0, 4.0]])
    expected = references.sinusoidal(positions, 10, 500.0, pairing)
    table = ops.sinusoidal(
        keras.ops.convert_to_tensor(positions, "float32"),
        10,
        max_wavelength=500.0,
        pairing=pairing,
    )
    assert tuple(table.shape) == (2, 4, 10)
    np.testing.assert_allclose(numpy(table), expected, atol=1e-4)


def test_half_pairing_is_a_permutation_of_interleaved():
    positions = keras.ops.arange(50)
    interleaved = numpy(ops.sinusoidal(positions, 16))
    half = numpy(ops.sinusoidal(positions, 16, pairing="half"))
    np.testing.assert_array_equal(half[:, :8], interleaved[:, 0::2])
    np.testing.assert_array_equal(half[:, 8:], interleaved[:, 1::2])


def test_sinusoidal_under_xla_with_unknown_length():
    def encode(positions):
        return ops.sinusoidal(positions, 12)

    encode = graph_function(encode, [((None,), "int32")])
    for length in (5, 9):
        np.testing.assert_allclose(
            numpy(encode(keras.ops.arange(length, dtype="int32"))),
            references.sinusoidal(np.arange(length), 12),
            atol=1e-5,
        )


@settings(deadline=None, max_examples=20)
@given(
    half_dim=st.integers(1, 48),
    shift=st.one_of(
        st.integers(-600, 600), st.floats(-600, 600, allow_nan=False)
    ),
    max_wavelength=st.sampled_from([100.0, 10000.0, 500000.0]),
)
def test_translation_law(half_dim, shift, max_wavelength):
    dim = 2 * half_dim
    positions = keras.ops.convert_to_tensor(
        np.linspace(-300.0, 700.0, 23), "float32"
    )
    translated = keras.ops.matmul(
        ops.sinusoidal(positions, dim, max_wavelength),
        ops.translation_matrix(shift, dim, max_wavelength),
    )
    expected = references.sinusoidal(
        numpy(positions).astype("float64") + shift, dim, max_wavelength
    )
    np.testing.assert_allclose(numpy(translated), expected, atol=3e-4)


def test_translation_matrix_is_a_rotation_group():
    dim = 16
    shifts = keras.ops.convert_to_tensor([0.0, 3.0, -7.5, 40.0])
    matrices = numpy(ops.translation_matrix(shifts, dim)).astype("float64")
    assert matrices.shape == (4, dim, dim)
    np.testing.assert_allclose(matrices[0], np.eye(dim), atol=1e-7)
    for matrix in matrices:
        np.testing.assert_allclose(matrix @ matrix.T, np.eye(dim), atol=1e-6)
    # T(a) T(b) = T(a + b)
    np.testing.assert_allclose(
        matrices[1] @ matrices[2],
        numpy(ops.translation_matrix(-4.5, dim)),
        atol=1e-6,
    )
    # Block diagonal: nothing couples two different frequency pairs.
    pair_of = np.arange(dim) // 2
    off_block = pair_of[:, None] != pair_of[None, :]
    assert np.all(matrices[:, off_block] == 0.0)


@settings(deadline=None, max_examples=25)
@given(half_dim=st.integers(1, 64), start=st.integers(0, 100000))
def test_every_row_has_norm_sqrt_half_dim(half_dim, start):
    dim = 2 * half_dim
    table = numpy(ops.sinusoidal(keras.ops.arange(start, start + 64), dim))
    np.testing.assert_allclose(
        np.linalg.norm(table.astype("float64"), axis=-1),
        np.sqrt(dim / 2),
        rtol=1e-5,
    )


def test_dot_product_peaks_at_the_position_and_falls_off_with_distance():
    table = numpy(ops.sinusoidal(keras.ops.arange(256), 64)).astype("float64")
    similarity = table @ table[128]  # (256,)
    assert np.argmax(similarity) == 128
    assert similarity[128] == pytest.approx(32.0, rel=1e-5)
    # Strictly falling over the first few steps on both sides...
    assert np.all(np.diff(similarity[124:129]) > 0)
    assert np.all(np.diff(similarity[128:133]) < 0)
    # ...symmetric, since it depends on the distance alone...
    np.testing.assert_allclose(
        similarity[28:128], similarity[129:229][::-1], atol=1e-4
    )
    # ...and falling with distance on average, band after band.
    distance = np.abs(np.arange(256) - 128)
    band_means = [
        similarity[(distance >= low) & (distance < high)].mean()
        for low, high in [(0, 1), (1, 4), (4, 16), (16, 64), (64, 129)]
    ]
    assert np.all(np.diff(band_means) < 0), band_means


def test_position_ids():
    np.testing.assert_array_equal(numpy(ops.position_ids(4, 3)), [3, 4, 5, 6])
    np.testing.assert_array_equal(
        numpy(
            ops.position_ids(
                keras.ops.convert_to_tensor(2),
                keras.ops.convert_to_tensor(5, WIDE_INT),
            )
        ),
        [5, 6],
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.sinusoidal(keras.ops.arange(3), 0), "dim=0"),
        (lambda: ops.sinusoidal(keras.ops.arange(3), 4.0), "dim=4.0"),
        (lambda: ops.sinusoidal(keras.ops.arange(3), 7, pairing="half"), "dim=7"),
        (
            lambda: ops.sinusoidal(keras.ops.arange(3), 8, pairing="stacked"),
            "pairing='stacked'",
        ),
        (
            lambda: ops.sinusoidal(keras.ops.arange(3), 8, max_wavelength=1.0),
            "max_wavelength=1.0",
        ),
        (
            lambda: ops.sinusoidal(keras.ops.arange(3), 8, max_wavelength=-5),
            "max_wavelength=-5",
        ),
        (lambda: ops.translation_matrix(1.0, 7), "dim=7"),
        (lambda: ops.inverse_frequencies(-2), "dim=-2"),
        (lambda: ops.position_ids(3, 1.5), "start_index=1.5"),
        (lambda: ops.position_ids(3, True), "start_index=True"),
        (
            lambda: ops.position_ids(3, keras.ops.convert_to_tensor(1.0)),
            "start_index=",
        ),
        (
            lambda: ops.position_ids(3, keras.ops.convert_to_tensor([1, 2])),
            "start_index=",
        ),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        call()


@pytest.mark.parametrize(
    "shape, sequence_axis, feature_axis, rotary_dim, expected",
    [
        ((2, 5, 4, 16), 1, -1, None, (1, 3, 16)),
        ((2, 5, 4, 16), -3, 3, 8, (1, 3, 8)),
        ((2, 16, 5), 2, 1, 16, (2, 1, 16)),
    ],
)
def test_rotary_axes_are_non_negative_with_the_rotated_features(
    shape, sequence_axis, feature_axis, rotary_dim, expected
):
    assert ops.rotary_axes(shape, sequence_axis, feature_axis, rotary_dim) == expected


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.rotary_axes((2, 5, 8), 3, -1), "`sequence_axis` is out of range for inputs of rank 3. Received: sequence_axis=3"),
        (lambda: ops.rotary_axes((2, 5, 8), 1, -4), "`feature_axis` is out of range for inputs of rank 3. Received: feature_axis=-4"),
        (lambda: ops.rotary_axes((2, 5, 8), 2, -1), "name the same axis of inputs of shape (2, 5, 8). Received: sequence_axis=2, feature_axis=-1"),
        (lambda: ops.rotary_axes((2, 5, None), 1, -1), "feature dimension of its inputs to be known. Received inputs of shape (2, 5, None)"),
        (lambda: ops.rotary_axes((2, 5, 7), 1, -1), "in pairs, so the feature dimension must be even (or set an even `rotary_dim`). Received inputs of shape (2, 5, 7)"),
        (lambda: ops.rotary_axes((2, 5, 8), 1, -1, 10), "`rotary_dim` must not exceed the feature dimension of the inputs. Received: rotary_dim=10"),
        (lambda: ops.check_rotary_dim(5), "`rotary_dim` must be even: features are rotated in pairs. Received: rotary_dim=5"),
        (lambda: ops.check_rotary_dim(0), "`rotary_dim` must be a positive integer or None. Received: rotary_dim=0"),
        (lambda: ops.check_sequence_and_feature_axes(1.0, -1), "`sequence_axis` must be an integer. Received: sequence_axis=1.0"),
        (lambda: ops.check_sequence_and_feature_axes(1, True), "`feature_axis` must be an integer. Received: feature_axis=True"),
        (lambda: ops.check_sequence_and_feature_axes(2, 2), "must differ. Received: sequence_axis=2, feature_axis=2"),
    ],
)
def test_bad_rotation_arguments_raise_value_error_naming_them(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


@pytest.mark.parametrize("pairing", ops.PAIRINGS)
def test_rotate_turns_each_pair_by_its_angle(pairing):
    rng = np.random.default_rng(0)
    inputs = rng.uniform(-1, 1, (2, 5, 3, 8)).astype("float32")  # heads = 3
    positions = np.array([[0, 1, 2, 3, 4], [7, 100, 1000, 3000, 4095]])
    # Frequencies of few significant bits, so that every angle
    # position * frequency is exact in float32 and the reference turns by
    # the very angles the function gets.
    inverse_frequencies = np.array([1.0, 0.3125, 0.0625, 0.01171875])
    angles = (positions[..., None] * inverse_frequencies).astype("float32")
    outputs = ops.rotate(
        keras.ops.convert_to_tensor(inputs), angles[:, :, None], pairing
    )  # (2, 5, 3, 8): the angles broadcast over the heads
    assert dtype_of(outputs) == "float32"
    expected = references.rotary(
        inputs, positions, inverse_frequencies, pairing=pairing
    )
    # float32 cos and sin within a few ulps, two products and a sum of terms
    # at most 1.
    np.testing.assert_allclose(numpy(outputs), expected, rtol=0, atol=1e-6)


# Keras on JAX computes in 32 bits (jax_enable_x64 is off by default, and
# Keras' JAX ops cast float64 to float32 even where it is on).
@pytest.mark.float64
@pytest.mark.parametrize("pairing", ops.PAIRINGS)
def test_rotate_in_float64_is_the_reference(pairing):
    inputs = np.random.default_rng(1).normal(size=(3, 6, 10))
    positions = np.linspace(-50.0, 3000.0, 6)
    inverse_frequencies, _ = references.rope_inverse_frequencies(10, 500000.0)
    angles = positions[:, None] * inverse_frequencies  # (6, 5)
    outputs = ops.rotate(keras.ops.convert_to_tensor(inputs), angles, pairing)
    assert dtype_of(outputs) == "float64"
    np.testing.assert_allclose(
        numpy(outputs),
        references.rotary(inputs, positions, inverse_frequencies, pairing=pairing),
        rtol=0,
        atol=1e-13,
    )


@settings(deadline=None, max_examples=30)
@given(
    half_dim=st.integers(1, 32),
    start=st.integers(0, 100000),
    pairing=st.sampled_from(ops.PAIRINGS),
)
def test_rotate_keeps_the_norm_of_each_pair(half_dim, start, pairing):
    dim = 2 * half_dim
    inputs = np.random.default_rng(start).normal(size=(4, 7, dim)).astype("float32")
    inverse_frequencies, _ = references.rope_inverse_frequencies(dim)
    angles = ((start + np.arange(7))[:, None] * inverse_frequencies).astype(
        "float32"
    )  # (7, half_dim)
    outputs = numpy(ops.rotate(keras.ops.convert_to_tensor(inputs), angles, pairing))

    def pair_norms(values):
        values = values.astype("float64")
        if pairing == "half":
            first, second = values[..., :half_dim], values[..., half_dim:]
        else:
            first, second = values[..., 0::2], values[..., 1::2]
        return np.hypot(first, second)  # (4, 7, half_dim)

    # cos^2 + sin^2 of float32 values is 1 to a few ulps.
    np.testing.assert_allclose(pair_norms(outputs), pair_norms(inputs), rtol=1e-6)


def test_rotate_refuses_an_unknown_layout():
    with pytest.raises(ValueError, match="pairing='concat'"):
        ops.rotate(keras.ops.ones((1, 4)), keras.ops.zeros((1, 2)), "concat")


# ALiBi slopes, relative distances and T5 buckets.


@pytest.mark.parametrize("num_heads", list(range(1, 17)) + [24, 32])
def test_alibi_slopes_match_the_authors_code(num_heads):
    slopes = ops.alibi_slopes(num_heads)
    assert dtype_of(slopes) == "float32"
    assert tuple(slopes.shape) == (num_heads,)
    # Each slope is 2 ** x rounded once to float32: half an ulp.
    np.testing.assert_allclose(
        numpy(slopes), references.alibi_slopes(num_heads), rtol=2.0**-24, atol=0
    )


def test_alibi_slopes_known_values():
    # Press et al. 2022, section 3: 1/2, 1/4, ..., 1/256 for 8 heads, and
    # for 16 heads 1/sqrt(2), 1/2, ..., 1/256.
    np.testing.assert_array_equal(
        numpy(ops.alibi_slopes(8)), [2.0**-h for h in range(1, 9)]
    )
    np.testing.assert_allclose(
        numpy(ops.alibi_slopes(16)),
        [2.0 ** (-h / 2) for h in range(1, 17)],
        rtol=2.0**-24,
    )
    # Not a power of two: 4 heads' slopes, then 8 heads' first and third.
    np.testing.assert_array_equal(
        numpy(ops.alibi_slopes(6)), [2.0**-e for e in (2, 4, 6, 8, 1, 3)]
    )


@pytest.mark.parametrize(
    "query_shape, key_shape, expected",
    [
        ((1, 5), (1, 7), (1, 5, 7)),
        ((3, 5), (1, 7), (3, 5, 7)),
        ((1, 5), (3, 7), (3, 5, 7)),
        ((3, 5), (3, 7), (3, 5, 7)),
        ((5,), (7,), (1, 5, 7)),
        ((5,), (2, 7), (2, 5, 7)),
    ],
)
def test_relative_position_is_key_minus_query(query_shape, key_shape, expected):
    rng = np.random.default_rng(0)
    query_positions = rng.integers(-50, 5000, query_shape)
    key_positions = rng.integers(-50, 5000, key_shape)
    distance = ops.relative_position(query_positions, key_positions)
    assert dtype_of(distance) == "int32"
    assert tuple(distance.shape) == expected
    distance = numpy(distance)
    assert ops.relative_position_shape(query_shape, key_shape) == expected
    query = query_positions.reshape((-1,) + query_shape[-1:])
    key = key_positions.reshape((-1,) + key_shape[-1:])
    for b, i, j in np.ndindex(expected):
        assert distance[b, i, j] == key[b % len(key), j] - query[b % len(query), i]


@pytest.mark.parametrize(
    "query_shape, key_shape, expected",
    [
        ((None, 5), (1, 7), (None, 5, 7)),
        ((None, 5), (3, 7), (3, 5, 7)),
        ((1, None), (None, None), (None, None, None)),
        ((None,), (None,), (1, None, None)),
    ],
)
def test_relative_position_shape_with_unknown_sizes(query_shape, key_shape, expected):
    assert ops.relative_position_shape(query_shape, key_shape) == expected


def test_relative_position_with_unknown_shapes_in_a_graph():
    def distance(query_positions, key_positions):
        return ops.relative_position(query_positions, key_positions)

    distance = graph_function(
        distance, [((None, None), "int32"), ((None, None), WIDE_INT)]
    )
    np.testing.assert_array_equal(
        numpy(
            distance(
                keras.ops.convert_to_tensor([[10]], "int32"),
                keras.ops.convert_to_tensor([[0, 4, 10, 12]], WIDE_INT),
            )
        ),
        [[[-10, -6, 0, 2]]],
    )


# T5's encoder and decoder, a boundary that a float32 log misplaces under
# XLA (distance 40 of 128 buckets, max_distance 50), and the smallest ones.
BUCKET_CONFIGS = [
    (True, 32, 128),
    (False, 32, 128),
    (True, 64, 256),
    (True, 128, 50),
    (False, 64, 50),
    (True, 6, 100),
    (False, 20, 12),
    (True, 4, 2),
    (False, 2, 2),
]


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", BUCKET_CONFIGS)
@pytest.mark.parametrize("jit_compile", [False, True])
def test_relative_position_bucket_matches_mesh_tensorflow(
    bidirectional, num_buckets, max_distance, jit_compile
):
    relative_positions = np.arange(-300, 301)
    bucket = graph_function(
        lambda relative_position: ops.relative_position_bucket(
            relative_position, bidirectional, num_buckets, max_distance
        ),
        jit_compile=jit_compile,
    )
    buckets = bucket(keras.ops.convert_to_tensor(relative_positions, "int32"))
    assert dtype_of(buckets) == "int32"
    expected = [
        references.t5_bucket(int(p), bidirectional, num_buckets, max_distance)
        for p in relative_positions
    ]
    np.testing.assert_array_equal(numpy(buckets), expected)


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", BUCKET_CONFIGS)
def test_relative_position_bucket_far_away(bidirectional, num_buckets, max_distance):
    rng = np.random.default_rng(num_buckets)
    relative_positions = np.concatenate(
        [rng.integers(-(10**9), 10**9, 2000), [2**31 - 1, -(2**31 - 1)]]
    )
    buckets = ops.relative_position_bucket(
        keras.ops.convert_to_tensor(relative_positions, WIDE_INT),
        bidirectional,
        num_buckets,
        max_distance,
    )
    expected = [
        references.t5_bucket(int(p), bidirectional, num_buckets, max_distance)
        for p in relative_positions
    ]
    np.testing.assert_array_equal(numpy(buckets), expected)


def test_relative_position_bucket_known_t5_values():
    # Worked by hand from Raffel et al.'s code: 16 buckets a direction, 8
    # exact, then 8 + int(2 log2(n / 8)) up to 128.
    relative_positions = [0, -1, -7, -8, -15, -16, -31, -32, -127, -128, -1000]
    expected = [0, 1, 7, 8, 9, 10, 11, 12, 15, 15, 15]
    # Keys after the query: the upper 16 buckets, from 17 (bucket 16 would
    # be distance 0, which counts as before).
    relative_positions += [1, 7, 8, 16, 32, 64, 128, 1000]
    expected += [17, 23, 24, 26, 28, 30, 31, 31]
    np.testing.assert_array_equal(
        numpy(
            ops.relative_position_bucket(
                keras.ops.convert_to_tensor(relative_positions)
            )
        ),
        expected,
    )
    # Decoder: every key after the query in bucket 0; 16 exact, then
    # 16 + int(16 log(n / 16) / log(8)).
    np.testing.assert_array_equal(
        numpy(
            ops.relative_position_bucket(
                keras.ops.convert_to_tensor([5, 1, 0, -1, -15, -16, -32]),
                bidirectional=False,
            )
        ),
        [0, 0, 0, 1, 15, 16, 21],
    )


INT_POSITIONS = np.zeros((1, 3), "int32")


def buckets_with(**kwargs):
    return ops.relative_position_bucket(keras.ops.arange(3), **kwargs)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.alibi_slopes(0), "num_heads=0"),
        (lambda: ops.alibi_slopes(4.0), "num_heads=4.0"),
        (lambda: ops.alibi_slopes(True), "num_heads=True"),
        (
            lambda: ops.relative_position(np.zeros((1, 3)), INT_POSITIONS),
            "query_positions of dtype float64",
        ),
        (
            lambda: ops.relative_position(INT_POSITIONS, INT_POSITIONS[None]),
            r"key_positions of dtype int32 and shape \(1, 1, 3\)",
        ),
        (
            lambda: ops.relative_position(
                np.zeros((2, 3), "int32"), np.zeros((3, 4), "int32")
            ),
            r"query_positions of shape \(2, 3\), key_positions of shape \(3, 4\)",
        ),
        (
            lambda: ops.relative_position_bucket(
                keras.ops.convert_to_tensor([1.0])
            ),
            "relative_position of dtype float32",
        ),
        (lambda: buckets_with(num_buckets=2), "num_buckets=2"),
        (lambda: buckets_with(num_buckets=30.0), "num_buckets=30.0"),
        (lambda: buckets_with(num_buckets=7), "num_buckets=7"),
        (lambda: buckets_with(bidirectional=False, num_buckets=1), "num_buckets=1"),
        (lambda: buckets_with(max_distance=8), "greater than 8.*max_distance=8"),
        (
            lambda: buckets_with(bidirectional=False, max_distance=16),
            "greater than 16.*max_distance=16",
        ),
        (lambda: buckets_with(max_distance=0), "max_distance=0"),
        (lambda: buckets_with(max_distance=128.0), "max_distance=128.0"),
        (lambda: buckets_with(bidirectional=1), "bidirectional=1"),
    ],
)
def test_alibi_and_t5_bad_arguments_raise_value_error_naming_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()
