import keras
import keras_hub
import numpy as np
import pytest

from keras_posenc import SinusoidalPositionEncoding
from tests import references
from tests.backend import BACKEND
from tests.backend import graph_function
from tests.backend import numpy
from tests.test_case import TestCase

# TensorFlow's and PyTorch's int64; JAX has int32 only (x64 disabled).
WIDE_INT = "int32" if BACKEND == "jax" else "int64"


def dtype_of(tensor):
    """A tensor's dtype as Keras names it: "float32", "bfloat16"..."""
    return keras.backend.standardize_dtype(tensor.dtype)


def as_float64(tensor):
    """A float tensor's values in float64 (through float32, exactly)."""
    return numpy(keras.ops.cast(tensor, "float32")).astype("float64")


class SinusoidalPositionEncodingLayerTest(TestCase):
    def test_layer_behaviour(self):
        for init_kwargs, expected_output_shape in [
            ({}, (2, 5, 8)),
            ({"pairing": "half", "merge_mode": "concat", "output_dim": 4}, (2, 5, 12)),
            ({"merge_mode": None, "output_dim": 6}, (2, 5, 6)),
        ]:
            self.run_layer_test(
                SinusoidalPositionEncoding,
                init_kwargs=init_kwargs,
                input_shape=(2, 5, 8),
                expected_output_shape=expected_output_shape,
                expected_num_trainable_weights=0,
                expected_num_non_trainable_weights=0,
                supports_masking=True,
            )


def random_embeddings(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


@pytest.mark.parametrize(
    "pairing, dim", [("interleaved", 8), ("interleaved", 9), ("half", 8)]
)
def test_adds_the_paper_encoding(pairing, dim):
    embeddings = random_embeddings((3, 40, dim))
    outputs = SinusoidalPositionEncoding(pairing=pairing, max_wavelength=1000.0)(
        embeddings
    )
    expected = embeddings + references.sinusoidal(
        np.arange(40), dim, 1000.0, pairing
    )
    np.testing.assert_allclose(numpy(outputs), expected, atol=1e-5)


@pytest.mark.parametrize("dim", [16, 17])
def test_equals_keras_hub_sine_position_encoding_plus_input(dim):
    embeddings = random_embeddings((2, 300, dim))
    outputs = SinusoidalPositionEncoding()(embeddings)
    expected = embeddings + numpy(keras_hub.layers.SinePositionEncoding()(embeddings))
    np.testing.assert_array_equal(numpy(outputs), expected)


def test_merge_modes():
    embeddings = random_embeddings((2, 7, 4))
    table = references.sinusoidal(np.arange(7), 6)  # (7, 6)
    concatenated = SinusoidalPositionEncoding(
        merge_mode="concat", output_dim=6
    )(embeddings)
    np.testing.assert_array_equal(numpy(concatenated)[..., :4], embeddings)
    np.testing.assert_allclose(
        numpy(concatenated)[..., 4:], np.broadcast_to(table, (2, 7, 6)), atol=1e-6
    )
    alone = SinusoidalPositionEncoding(merge_mode=None, output_dim=6)(embeddings)
    np.testing.assert_allclose(
        numpy(alone), np.broadcast_to(table, (2, 7, 6)), atol=1e-6
    )
    alone_input_width = SinusoidalPositionEncoding(merge_mode=None)(embeddings)
    assert tuple(alone_input_width.shape) == (2, 7, 4)


def test_start_index_equals_slicing_a_longer_call():
    layer = SinusoidalPositionEncoding(merge_mode=None)
    full = numpy(layer(np.zeros((2, 30, 10), "float32")))
    for start_index in (
        0,
        7,
        keras.ops.convert_to_tensor(12),
        keras.ops.convert_to_tensor(29, WIDE_INT),
    ):
        part = layer(np.zeros((2, 1, 10), "float32"), start_index=start_index)
        index = int(start_index)
        np.testing.assert_array_equal(numpy(part), full[:, index : index + 1])
    chunk = layer(np.zeros((2, 5, 10), "float32"), start_index=20)
    np.testing.assert_array_equal(numpy(chunk), full[:, 20:25])


def test_explicit_positions_per_sequence_and_per_batch():
    embeddings = random_embeddings((2, 4, 6))
    layer = SinusoidalPositionEncoding()
    shared = np.array([3, 1, 4, 1])
    np.testing.assert_allclose(
        numpy(layer(embeddings, positions=shared)),
        embeddings + references.sinusoidal(shared, 6),
        atol=1e-6,
    )
    # Left padding: each row counts from its own first real token.
    per_batch = np.array([[0, 0, 0, 1], [0, 1, 2, 3]])
    np.testing.assert_allclose(
        numpy(layer(embeddings, positions=per_batch)),
        embeddings + references.sinusoidal(per_batch, 6),
        atol=1e-6,
    )


def test_float_positions():
    timestamps = np.array([0.0, 0.25, 1.5, 1000.125], "float32")
    outputs = SinusoidalPositionEncoding(merge_mode=None)(
        np.zeros((1, 4, 8), "float32"), positions=timestamps
    )
    np.testing.assert_allclose(
        numpy(outputs[0]), references.sinusoidal(timestamps, 8), atol=1e-4
    )


def test_mixed_bfloat16_is_right_at_long_positions():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = SinusoidalPositionEncoding(merge_mode=None)
    outputs = layer(np.zeros((1, 4096, 64), "float32"))
    assert dtype_of(outputs) == "bfloat16"
    expected = references.sinusoidal(np.arange(4096), 64)
    error = np.abs(as_float64(outputs[0]) - expected)
    assert error.max() <= 8e-3, error.max()


def test_mixed_bfloat16_keeps_float_positions_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    # bfloat16 would round these to 1000, 3008 and 32768 on the way in.
    timestamps = np.array([1000.125, 3000.75, 32760.25], "float32")
    outputs = SinusoidalPositionEncoding(merge_mode=None)(
        np.zeros((1, 3, 8), "float32"), positions=timestamps
    )
    assert dtype_of(outputs) == "bfloat16"
    error = np.abs(as_float64(outputs[0]) - references.sinusoidal(timestamps, 8))
    assert error.max() <= 8e-3, error.max()


def test_float32_inputs_are_cast_under_mixed_precision():
    keras.config.set_dtype_policy("mixed_bfloat16")
    outputs = SinusoidalPositionEncoding()(np.ones((1, 3, 8), "float32"))
    assert dtype_of(outputs) == "bfloat16"


def test_positions_for_another_batch_size_are_refused():
    with pytest.raises(ValueError, match=r"batch size 2.*\(3, 4\)"):
        SinusoidalPositionEncoding()(
            np.zeros((2, 4, 8), "float32"), positions=np.zeros((3, 4), "int32")
        )


def test_unknown_length_and_xla():
    layer = SinusoidalPositionEncoding()

    def encode(embeddings):
        return layer(embeddings)

    encode = graph_function(encode, [((None, None, 8), "float32")])
    for length in (3, 11):
        embeddings = random_embeddings((2, length, 8))
        np.testing.assert_allclose(
            numpy(encode(embeddings)),
            embeddings + references.sinusoidal(np.arange(length), 8),
            atol=1e-5,
        )
    symbolic = layer(keras.Input((None, 8)))
    assert tuple(symbolic.shape) == (None, None, 8)


def test_config_round_trip():
    layer = SinusoidalPositionEncoding(
        max_wavelength=500.0, pairing="half", merge_mode="concat", output_dim=4
    )
    config = layer.get_config()
    assert {
        "max_wavelength": 500.0,
        "pairing": "half",
        "merge_mode": "concat",
        "output_dim": 4,
    }.items() <= config.items()
    assert SinusoidalPositionEncoding.from_config(config).get_config() == config
    numpy_scalar = SinusoidalPositionEncoding(max_wavelength=np.float32(500.0))
    assert type(numpy_scalar.get_config()["max_wavelength"]) is float


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_wavelength": 0}, "max_wavelength=0"),
        ({"max_wavelength": "long"}, "max_wavelength='long'"),
        ({"max_wavelength": np.float32(1.0)}, "max_wavelength="),
        ({"max_wavelength": np.inf}, "finite number greater than 1. Received: max_wavelength=inf"),
        ({"max_wavelength": float("nan")}, "max_wavelength=nan"),
        ({"pairing": "stacked"}, "pairing='stacked'"),
        ({"merge_mode": "multiply"}, "merge_mode='multiply'"),
        ({"merge_mode": "concat"}, "output_dim=None"),
        ({"merge_mode": "add", "output_dim": 4}, "output_dim=4"),
        ({"merge_mode": None, "output_dim": 0}, "output_dim=0"),
        ({"merge_mode": None, "output_dim": 2.5}, "output_dim=2.5"),
        (
            {"pairing": "half", "merge_mode": "concat", "output_dim": 5},
            "output_dim=5",
        ),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        SinusoidalPositionEncoding(**kwargs)


def test_bad_inputs_say_what_was_expected():
    layer = SinusoidalPositionEncoding()
    with pytest.raises(ValueError, match=r"\(batch, sequence, features\)"):
        layer(np.zeros((2, 8), "float32"))
    with pytest.raises(ValueError, match="even encoding width"):
        SinusoidalPositionEncoding(pairing="half")(np.zeros((1, 3, 5), "float32"))
    with pytest.raises(ValueError, match="positions"):
        layer(np.zeros((1, 3, 4), "float32"), positions=np.arange(5))
    with pytest.raises(ValueError, match="positions"):
        layer(np.zeros((1, 3, 4), "float32"), positions=np.zeros((1, 1, 3)))
    with pytest.raises(ValueError, match="start_index=0.5"):
        layer(np.zeros((1, 3, 4), "float32"), start_index=0.5)
