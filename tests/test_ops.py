import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import ops
from tests import references

# A float32 angle p * w is off by up to half an ulp of p * w <= p, so the
# table's error grows with the position: this is the float32 floor.
FLOAT32_ANGLE_ERROR = 6e-8


def position_tolerance(positions):
    """Per-row absolute tolerance of a float32 table at `positions`."""
    return FLOAT32_ANGLE_ERROR * np.abs(positions)[..., None] + 2e-6


@pytest.mark.parametrize(
    "layout, dim",
    [("interleaved", 64), ("interleaved", 7), ("interleaved", 1), ("concat", 64)],
)
def test_sinusoidal_matches_paper_up_to_position_10000(layout, dim):
    positions = np.arange(10001)
    expected = references.sinusoidal(positions, dim, layout=layout)
    table = ops.sinusoidal(tf.constant(positions), dim, layout=layout)
    assert table.dtype == tf.float32
    assert table.shape == (10001, dim)
    error = np.abs(table.numpy() - expected)
    tolerance = position_tolerance(positions)
    assert np.all(error <= tolerance), np.max(error / tolerance)


@pytest.mark.parametrize("layout", ["interleaved", "concat"])
def test_sinusoidal_float_positions_and_other_wavelength(layout):
    positions = np.array([[-3.25, 0.0, 0.5, 17.75], [1e3 + 0.1, 2.0, 3.0, 4.0]])
    expected = references.sinusoidal(positions, 10, 500.0, layout)
    table = ops.sinusoidal(
        tf.constant(positions, "float32"), 10, max_wavelength=500.0, layout=layout
    )
    assert table.shape == (2, 4, 10)
    np.testing.assert_allclose(table.numpy(), expected, atol=1e-4)


def test_concat_layout_is_a_permutation_of_interleaved():
    positions = tf.range(50)
    interleaved = ops.sinusoidal(positions, 16).numpy()
    concat = ops.sinusoidal(positions, 16, layout="concat").numpy()
    np.testing.assert_array_equal(concat[:, :8], interleaved[:, 0::2])
    np.testing.assert_array_equal(concat[:, 8:], interleaved[:, 1::2])


def test_sinusoidal_under_xla_with_unknown_length():
    @tf.function(
        jit_compile=True, input_signature=[tf.TensorSpec([None], tf.int32)]
    )
    def encode(positions):
        return ops.sinusoidal(positions, 12)

    for length in (5, 9):
        np.testing.assert_allclose(
            encode(tf.range(length)).numpy(),
            references.sinusoidal(np.arange(length), 12),
            atol=1e-5,
        )


@settings(deadline=None, max_examples=40)
@given(
    half_dim=st.integers(1, 48),
    shift=st.one_of(
        st.integers(-600, 600), st.floats(-600, 600, allow_nan=False)
    ),
    max_wavelength=st.sampled_from([100.0, 10000.0, 500000.0]),
)
def test_translation_law(half_dim, shift, max_wavelength):
    dim = 2 * half_dim
    positions = tf.constant(np.linspace(-300.0, 700.0, 23), "float32")
    translated = ops.sinusoidal(positions, dim, max_wavelength) @ (
        ops.translation_matrix(shift, dim, max_wavelength)
    )
    expected = references.sinusoidal(
        positions.numpy().astype("float64") + shift, dim, max_wavelength
    )
    np.testing.assert_allclose(translated.numpy(), expected, atol=3e-4)


def test_translation_matrix_is_a_rotation_group():
    dim = 16
    shifts = tf.constant([0.0, 3.0, -7.5, 40.0])
    matrices = ops.translation_matrix(shifts, dim).numpy().astype("float64")
    assert matrices.shape == (4, dim, dim)
    np.testing.assert_allclose(matrices[0], np.eye(dim), atol=1e-7)
    for matrix in matrices:
        np.testing.assert_allclose(matrix @ matrix.T, np.eye(dim), atol=1e-6)
    # T(a) T(b) = T(a + b)
    np.testing.assert_allclose(
        matrices[1] @ matrices[2],
        ops.translation_matrix(-4.5, dim).numpy(),
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
    table = ops.sinusoidal(tf.range(start, start + 64), dim).numpy()
    np.testing.assert_allclose(
        np.linalg.norm(table.astype("float64"), axis=-1),
        np.sqrt(dim / 2),
        rtol=1e-5,
    )


def test_dot_product_peaks_at_the_position_and_falls_off_with_distance():
    table = ops.sinusoidal(tf.range(256), 64).numpy().astype("float64")
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
    np.testing.assert_array_equal(ops.position_ids(4, 3).numpy(), [3, 4, 5, 6])
    np.testing.assert_array_equal(
        ops.position_ids(tf.constant(2), tf.constant(5, "int64")).numpy(), [5, 6]
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.sinusoidal(tf.range(3), 0), "dim=0"),
        (lambda: ops.sinusoidal(tf.range(3), 4.0), "dim=4.0"),
        (lambda: ops.sinusoidal(tf.range(3), 7, layout="concat"), "dim=7"),
        (lambda: ops.sinusoidal(tf.range(3), 8, layout="stacked"), "layout='stacked'"),
        (lambda: ops.sinusoidal(tf.range(3), 8, max_wavelength=1.0), "max_wavelength=1.0"),
        (lambda: ops.sinusoidal(tf.range(3), 8, max_wavelength=-5), "max_wavelength=-5"),
        (lambda: ops.translation_matrix(1.0, 7), "dim=7"),
        (lambda: ops.inverse_frequencies(-2), "dim=-2"),
        (lambda: ops.position_ids(3, 1.5), "start_index=1.5"),
        (lambda: ops.position_ids(3, True), "start_index=True"),
        (lambda: ops.position_ids(3, tf.constant(1.0)), "start_index="),
        (lambda: ops.position_ids(3, tf.constant([1, 2])), "start_index="),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        call()


@pytest.mark.parametrize("layout", ops.ROPE_LAYOUTS)
def test_rotate_turns_each_pair_by_its_angle(layout):
    rng = np.random.default_rng(0)
    inputs = rng.uniform(-1, 1, (2, 5, 3, 8)).astype("float32")  # heads = 3
    positions = np.array([[0, 1, 2, 3, 4], [7, 100, 1000, 3000, 4095]])
    # Frequencies of few significant bits, so that every angle
    # position * frequency is exact in float32 and the reference turns by
    # the very angles the function gets.
    inverse_frequencies = np.array([1.0, 0.3125, 0.0625, 0.01171875])
    phases = (positions[..., None] * inverse_frequencies).astype("float32")
    outputs = ops.rotate(
        tf.constant(inputs), phases[:, :, None], layout
    )  # (2, 5, 3, 8): the angles broadcast over the heads
    assert outputs.dtype == tf.float32
    expected = references.rotary(
        inputs, positions, inverse_frequencies, layout=layout
    )
    # float32 cos and sin within a few ulps, two products and a sum of terms
    # at most 1.
    np.testing.assert_allclose(outputs.numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ops.ROPE_LAYOUTS)
def test_rotate_in_float64_is_the_reference(layout):
    inputs = np.random.default_rng(1).normal(size=(3, 6, 10))
    positions = np.linspace(-50.0, 3000.0, 6)
    inverse_frequencies, _ = references.rope_inverse_frequencies(10, 500000.0)
    phases = positions[:, None] * inverse_frequencies  # (6, 5)
    outputs = ops.rotate(tf.constant(inputs), phases, layout)
    assert outputs.dtype == tf.float64
    np.testing.assert_allclose(
        outputs.numpy(),
        references.rotary(inputs, positions, inverse_frequencies, layout=layout),
        rtol=0,
        atol=1e-13,
    )


@settings(deadline=None, max_examples=30)
@given(
    half_dim=st.integers(1, 32),
    start=st.integers(0, 100000),
    layout=st.sampled_from(ops.ROPE_LAYOUTS),
)
def test_rotate_keeps_the_norm_of_each_pair(half_dim, start, layout):
    dim = 2 * half_dim
    inputs = np.random.default_rng(start).normal(size=(4, 7, dim)).astype("float32")
    inverse_frequencies, _ = references.rope_inverse_frequencies(dim)
    phases = ((start + np.arange(7))[:, None] * inverse_frequencies).astype(
        "float32"
    )  # (7, half_dim)
    outputs = ops.rotate(tf.constant(inputs), phases, layout).numpy()

    def pair_norms(values):
        values = values.astype("float64")
        if layout == "half":
            first, second = values[..., :half_dim], values[..., half_dim:]
        else:
            first, second = values[..., 0::2], values[..., 1::2]
        return np.hypot(first, second)  # (4, 7, half_dim)

    # cos^2 + sin^2 of float32 values is 1 to a few ulps.
    np.testing.assert_allclose(pair_norms(outputs), pair_norms(inputs), rtol=1e-6)


def test_rotate_refuses_an_unknown_layout():
    with pytest.raises(ValueError, match="layout='concat'"):
        ops.rotate(tf.ones((1, 4)), tf.zeros((1, 2)), "concat")
