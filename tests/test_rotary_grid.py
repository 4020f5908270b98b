"""RotaryEmbedding on grids: axial, Qwen2-VL, Qwen3-VL, Pixtral, RoPE-Mixed.

Against independent float64 references (tests/references.py, checked while
written against transformers' and rotary-embedding-torch's own code), the
relative property per axis, prefix tokens, XLA and `None` lengths, bfloat16
at grid coordinates up to 1024, serialization, Hugging Face configs and
Qwen2-VL's M-RoPE positions as transformers' `get_rope_index` gives them.
"""

import json
import os

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import RotaryEmbedding
from keras_posenc import ops
from tests import references
from tests.backend import compiled
from tests.backend import gradients
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_case import TestCase
from keras_posenc.layers.attention_position import AttentionContext

FIXTURE = os.path.join(
    os.path.dirname(__file__), "fixtures", "qwen2_vl_rope_index.npz"
)
BASE = 1000.0

# (layer arguments, float64 Theta for a head of 16 (24 for 3 blocks)).
LAYOUTS = {
    "axial 2-D, half (Qwen2-VL vision)": (
        {"num_axes": 2},
        references.axial_rope_frequencies(16, 2, BASE),
    ),
    "axial 2-D, interleaved (EVA-02)": (
        {"num_axes": 2, "pairing": "interleaved"},
        references.axial_rope_frequencies(16, 2, BASE),
    ),
    "axial 3-D": (
        {"num_axes": 3},
        references.axial_rope_frequencies(24, 3, BASE),
    ),
    "sections (Qwen2-VL M-RoPE)": (
        {"num_axes": 3, "axis_layout": "sections", "axis_sections": [2, 3, 3]},
        references.mrope_frequencies(16, [2, 3, 3], BASE),
    ),
    "cyclic (Qwen3-VL M-RoPE)": (
        {"num_axes": 3, "axis_layout": "cyclic", "axis_sections": [4, 2, 2]},
        references.interleaved_mrope_frequencies(16, [4, 2, 2], BASE),
    ),
    "alternating (Pixtral)": (
        {"num_axes": 2, "axis_layout": "alternating"},
        references.pixtral_frequencies(16, BASE),
    ),
}


def random_inputs(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def assert_close_to_reference(outputs, expected, inputs, max_angle):
    """Within float32 rounding of the angles (2e-6 of them) and of the output."""
    scale = np.max(np.abs(inputs)) * 2.0
    tolerance = scale * (2e-6 * max_angle + 2.0**-20)
    np.testing.assert_allclose(
        numpy(outputs).astype("float64"), expected, rtol=0, atol=tolerance
    )


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts_rotate_as_their_references(name):
    kwargs, theta = LAYOUTS[name]
    num_axes = theta.shape[1]
    dim = 2 * theta.shape[0]
    inputs = random_inputs((2, 5, 2, dim))
    positions = np.random.default_rng(1).integers(0, 60, (2, 5, num_axes))
    layer = RotaryEmbedding(max_wavelength=BASE, **kwargs)
    outputs = layer(inputs, positions=positions)
    expected = references.grid_rotary(
        inputs, positions, theta, kwargs.get("pairing", "half")
    )
    assert_close_to_reference(outputs, expected, inputs, 60 * num_axes)


def test_shared_float_positions_and_features_without_heads():
    kwargs, theta = LAYOUTS["sections (Qwen2-VL M-RoPE)"]
    inputs = random_inputs((2, 4, 16))
    positions = np.array(
        [[0.5, 1.25, 3.0], [2.0, 0.0, 7.5], [1.0, 1.0, 1.0], [9.75, 4.5, 0.0]],
        "float32",
    )
    outputs = RotaryEmbedding(max_wavelength=BASE, **kwargs)(
        inputs, positions=positions
    )
    expected = references.grid_rotary(inputs, positions, theta)
    assert_close_to_reference(outputs, expected, inputs, 20.0)


@pytest.mark.parametrize("axis_layout", ops.AXIS_LAYOUTS)
def test_one_axis_is_todays_schedule_bit_for_bit(axis_layout):
    theta = ops.rope_frequency_matrix(12, 1, axis_layout, max_wavelength=BASE)
    np.testing.assert_array_equal(
        numpy(theta[:, 0]), numpy(ops.inverse_frequencies(12, BASE))
    )
    inputs = random_inputs((2, 5, 2, 12))
    np.testing.assert_array_equal(
        numpy(RotaryEmbedding(axis_layout=axis_layout)(inputs, start_index=3)),
        numpy(RotaryEmbedding()(inputs, start_index=3)),
    )


def test_qwen3_vl_and_pixtral_differ_by_a_permutation_of_pairs():
    # Both give rows w_0, w_2, ... and columns w_1, w_3, ...; cyclic puts
    # them in pairs 0, 2, ... and 1, 3, ..., alternating in the first and
    # second half of the pairs.
    cyclic = numpy(ops.rope_frequency_matrix(16, 2, "cyclic"))
    alternating = numpy(ops.rope_frequency_matrix(16, 2, "alternating"))
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    np.testing.assert_array_equal(alternating, cyclic[order])
    assert not np.array_equal(alternating, cyclic)
    query, key = random_inputs((1, 6, 1, 16)), random_inputs((1, 6, 1, 16), 1)
    positions = ops.grid_positions((2, 3))
    features = order + [pair + 8 for pair in order]  # the "half" pairing's pairs

    def scores(axis_layout, features):
        layer = RotaryEmbedding(num_axes=2, axis_layout=axis_layout)
        rotated_query = layer(query[..., features], positions=positions)
        rotated_key = layer(key[..., features], positions=positions)
        return np.einsum("bqhd,bkhd->bqk", rotated_query, rotated_key)

    np.testing.assert_allclose(
        scores("alternating", features), scores("cyclic", list(range(16))),
        rtol=1e-5, atol=1e-5,
    )


@settings(deadline=None, max_examples=25)
@given(
    case=st.sampled_from(list(LAYOUTS) + ["learned"]),
    data=st.data(),
)
def test_scores_depend_only_on_per_axis_differences(case, data):
    if case == "learned":
        kwargs = {"num_axes": 2, "learned_frequencies": True}
        num_axes, dim = 2, 16
    else:
        kwargs, theta = LAYOUTS[case]
        num_axes, dim = theta.shape[1], 2 * theta.shape[0]
    layer = RotaryEmbedding(max_wavelength=BASE, **kwargs)
    if case == "learned":
        layer.build((1, 1, 1, dim))
        # Learned frequencies mix the axes: the law must still hold.
        layer.frequencies.assign(random_inputs((1, dim // 2, num_axes)))
    coordinates = st.integers(-100, 100)
    query_position, key_position, shift = (
        np.array(data.draw(st.lists(coordinates, min_size=num_axes, max_size=num_axes)))
        for _ in range(3)
    )
    query, key = random_inputs((1, 1, 1, dim)), random_inputs((1, 1, 1, dim), 1)

    def score(query_position, key_position):
        rotated_query = layer(query, positions=query_position[np.newaxis])
        rotated_key = layer(key, positions=key_position[np.newaxis])
        return float(np.sum(numpy(rotated_query) * numpy(rotated_key)))

    np.testing.assert_allclose(
        score(query_position + shift, key_position + shift),
        score(query_position, key_position),
        rtol=1e-4,
        atol=1e-4,
    )


def test_prefix_tokens_are_left_unrotated():
    inputs = random_inputs((2, 2 + 6, 2, 16))
    positions = ops.grid_positions((2, 3))
    outputs = RotaryEmbedding(max_wavelength=BASE, num_axes=2, num_prefix_tokens=2)(
        inputs, positions=positions
    )
    np.testing.assert_array_equal(outputs[:, :2], inputs[:, :2])
    expected = references.grid_rotary(
        inputs, positions, references.axial_rope_frequencies(16, 2, BASE),
        num_prefix_tokens=2,
    )
    assert_close_to_reference(outputs, expected, inputs, 4.0)


@pytest.mark.parametrize("grid_shape", [(2, 3), (1, 2, 2)])
def test_grid_shape_is_the_grid_positions(grid_shape):
    num_axes = len(grid_shape)
    inputs = random_inputs((2, 1 + int(np.prod(grid_shape)), 12))
    layer = RotaryEmbedding(num_axes=num_axes, num_prefix_tokens=1)
    np.testing.assert_array_equal(
        numpy(layer(inputs, grid_shape=grid_shape)),
        numpy(layer(inputs, positions=ops.grid_positions(grid_shape))),
    )


def test_compiled_at_two_grid_sizes():
    layer = RotaryEmbedding(num_axes=2, num_prefix_tokens=1)
    for rows in (2, 4):
        inputs = random_inputs((2, 1 + rows * 3, 2, 8), rows)
        rotate_grid = compiled(lambda inputs: layer(inputs, grid_shape=(rows, 3)))
        np.testing.assert_allclose(
            numpy(rotate_grid(inputs)),
            numpy(layer(inputs, grid_shape=(rows, 3))),
            rtol=1e-6,
            atol=1e-6,
        )


@tensorflow_only  # one trace for every grid size: TensorFlow's dynamic shapes
def test_xla_with_unknown_lengths_at_two_grid_sizes():
    import tensorflow as tf

    layer = RotaryEmbedding(num_axes=2, num_prefix_tokens=1)

    @tf.function(
        input_signature=[tf.TensorSpec((None, None, 2, 8))], jit_compile=True
    )
    def rotate_grid(inputs):
        rows = (tf.shape(inputs)[1] - 1) // 3
        # All sizes tensors: Keras takes no mix of tensors and ints.
        return layer(inputs, grid_shape=(rows, tf.constant(3)))

    for rows in (2, 4):
        inputs = random_inputs((2, 1 + rows * 3, 2, 8), rows)
        np.testing.assert_allclose(
            numpy(rotate_grid(inputs)),
            numpy(layer(inputs, grid_shape=(rows, 3))),
            rtol=1e-6,
            atol=1e-6,
        )


def test_mixed_bfloat16_keeps_float32_angles_at_coordinates_up_to_1024():
    inputs = random_inputs((1, 6, 2, 16))
    positions = np.array(
        [[1024, 1023], [1021, 1024], [1000, 999], [1023, 1], [7, 1022], [1024, 1024]]
    )
    for kwargs in ({}, {"learned_frequencies": True}):
        layer = RotaryEmbedding(num_axes=2, dtype="mixed_bfloat16", **kwargs)
        outputs = layer(inputs, positions=positions)
        assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
        if layer.frequencies is not None:
            assert layer.frequencies.dtype == "float32"
        expected = references.grid_rotary(
            inputs, positions, references.axial_rope_frequencies(16, 2)
        )
        # A bfloat16 angle at 1024 would be off by up to 4 radians; the
        # float32 one leaves only the rounding of the output to bfloat16:
        # half an ulp, at most 2**-8 of it (7 bits of mantissa).
        error = np.abs(numpy(keras.ops.cast(outputs, "float32")) - expected)
        assert np.all(error <= 2.0**-8 * np.abs(expected) + 1e-5), error.max()


def test_learned_frequencies_start_axial_and_are_per_head():
    inputs = random_inputs((2, 6, 3, 16))
    positions = ops.grid_positions((2, 3))
    learned = RotaryEmbedding(max_wavelength=BASE, num_axes=2, learned_frequencies=True)
    fixed = RotaryEmbedding(max_wavelength=BASE, num_axes=2)
    np.testing.assert_array_equal(
        numpy(learned(inputs, positions=positions)),
        numpy(fixed(inputs, positions=positions)),
    )
    assert [weight.shape for weight in learned.trainable_weights] == [(3, 8, 2)]
    theta = random_inputs((3, 8, 2), 5)  # every pair reads both axes
    learned.frequencies.assign(theta)
    expected = references.grid_rotary(inputs, positions, theta)
    assert_close_to_reference(
        learned(inputs, positions=positions), expected, inputs, 40.0
    )


def test_transform_query_key_rotates_the_tokens_after_the_prefix():
    query, key = random_inputs((2, 1 + 4, 2, 8)), random_inputs((2, 1 + 6, 2, 8), 1)
    query_positions = np.array([[[0, 0], [0, 1], [1, 0], [1, 1]]], "int32")
    key_positions = np.tile(ops.grid_positions((2, 3))[np.newaxis], (2, 1, 1))
    for kwargs in ({}, {"learned_frequencies": True}):
        layer = RotaryEmbedding(max_wavelength=BASE, num_axes=2, num_prefix_tokens=1, **kwargs)
        layer.build_for_attention(num_heads=2, key_dim=8, value_dim=8)
        assert (layer.num_axes, layer.num_prefix_tokens) == (2, 1)
        rotated_query, rotated_key = layer.transform_query_key(query, key, AttentionContext(query_positions=query_positions, key_positions=key_positions))
        theta = references.axial_rope_frequencies(8, 2, BASE)
        for rotated, inputs, positions in (
            (rotated_query, query, np.tile(query_positions, (2, 1, 1))),
            (rotated_key, key, key_positions),
        ):
            expected = references.grid_rotary(
                inputs, positions, theta, num_prefix_tokens=1
            )
            assert_close_to_reference(rotated, expected, inputs, 4.0)


class RotaryGridLayerTest(TestCase):
    def test_layer_behaviour(self):
        for init_kwargs, input_shape, grid_shape, trainable in [
            # Keras' training step calls the layer without call arguments:
            # a grid layer's training is tested below.
            ({"learned_frequencies": True}, (2, 4, 2, 8), None, 1),
            ({"num_axes": 2}, (2, 6, 2, 8), (2, 3), 0),
            (
                {"num_axes": 3, "axis_layout": "sections", "axis_sections": [1, 1, 2]},
                (2, 4, 8),
                (1, 2, 2),
                0,
            ),
            ({"num_axes": 3, "axis_layout": "cyclic"}, (2, 4, 2, 12), (1, 2, 2), 0),
            ({"num_axes": 2, "axis_layout": "alternating"}, (2, 4, 2, 8), (2, 2), 0),
            (
                {"num_axes": 2, "learned_frequencies": True, "num_prefix_tokens": 1},
                (2, 5, 2, 8),
                (2, 2),
                1,
            ),
        ]:
            self.run_layer_test(
                RotaryEmbedding,
                init_kwargs=init_kwargs,
                input_shape=input_shape,
                call_kwargs={} if grid_shape is None else {"grid_shape": grid_shape},
                expected_output_shape=input_shape,
                expected_num_trainable_weights=trainable,
                expected_num_non_trainable_weights=0,
                supports_masking=True,
                run_training_check=grid_shape is None,
            )


def test_learned_frequencies_have_gradients_at_two_grid_sizes():
    layer = RotaryEmbedding(num_axes=2, learned_frequencies=True)
    layer.build((None, None, 2, 4))
    initial = numpy(layer.frequencies.value)
    for rows, columns in ((2, 3), (3, 4)):
        inputs = random_inputs((4, rows * columns, 2, 4), rows)
        positions = ops.grid_positions((rows, columns))

        def squared_error(frequencies):
            outputs, _ = layer.stateless_call(
                [frequencies], [], inputs, positions=positions
            )
            return keras.ops.square(keras.ops.subtract(outputs, inputs))

        (gradient,) = gradients(squared_error, initial)
        assert gradient.shape == initial.shape
        assert np.all(np.isfinite(gradient)) and np.any(gradient != 0)


@tensorflow_only  # one trace for every grid size: TensorFlow's dynamic shapes
def test_xla_training_of_learned_frequencies_at_two_grid_sizes():
    import tensorflow as tf

    layer = RotaryEmbedding(num_axes=2, learned_frequencies=True)
    layer.build((None, None, 2, 4))
    initial = numpy(layer.frequencies.value)

    # One compiled step for every grid size: unknown batch and length.
    @tf.function(
        input_signature=[
            tf.TensorSpec((None, None, 2, 4)),
            tf.TensorSpec((None, 2), "int32"),
        ],
        jit_compile=True,
    )
    def train_step(inputs, positions):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                tf.square(layer(inputs, positions=positions) - inputs)
            )
        (gradient,) = tape.gradient(loss, [layer.frequencies.value])
        layer.frequencies.assign_sub(0.01 * gradient)
        return loss

    for rows, columns in ((2, 3), (3, 4)):
        loss = train_step(
            random_inputs((4, rows * columns, 2, 4), rows),
            ops.grid_positions((rows, columns)),
        )
        assert np.isfinite(numpy(loss))
    assert train_step.experimental_get_tracing_count() == 1
    assert not np.array_equal(numpy(layer.frequencies.value), initial)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_axes": 2},
        {"num_axes": 3, "axis_layout": "sections", "axis_sections": [2, 3, 3]},
        {"num_axes": 3, "axis_layout": "cyclic", "axis_sections": (4, 2, 2)},
        {"num_axes": 2, "axis_layout": "alternating", "num_prefix_tokens": 4},
        {"num_axes": 2, "learned_frequencies": True},
    ],
)
def test_config_round_trip(kwargs):
    layer = RotaryEmbedding(**kwargs)
    config = layer.get_config()
    assert {key: config[key] for key in kwargs} == {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in kwargs.items()
    }
    assert RotaryEmbedding.from_config(config).get_config() == config


def test_one_axis_config_is_the_one_before_grids():
    config = RotaryEmbedding().get_config()
    grid_arguments = {
        "num_axes", "axis_layout", "axis_sections", "learned_frequencies",
        "num_prefix_tokens",
    }
    assert not grid_arguments & set(config)
    rebuilt = RotaryEmbedding.from_config(config)
    assert (rebuilt.num_axes, rebuilt.axis_layout, rebuilt.num_prefix_tokens) == (
        1, "blocks", 0,
    )


def test_keras_file_round_trip(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(1 + 6, 16))
    heads = keras.layers.Reshape((7, 2, 8))(keras.layers.Dense(16)(inputs))
    rotated = RotaryEmbedding(
        num_axes=2, learned_frequencies=True, num_prefix_tokens=1
    )(heads, grid_shape=(2, 3))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(rotated)))
    layer = model.layers[3]
    layer.frequencies.assign(random_inputs((2, 4, 2), 3))
    path = tmp_path / "grid.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert loaded.layers[3].get_config() == layer.get_config()
    data = random_inputs((3, 7, 16))
    np.testing.assert_array_equal(
        loaded.predict(data, verbose=0), model.predict(data, verbose=0)
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_axes": 0}, "num_axes=0"),
        ({"num_axes": "2"}, "num_axes='2'"),
        ({"num_axes": 2, "axis_layout": "diagonal"}, "axis_layout='diagonal'"),
        ({"num_axes": 2, "axis_sections": [4]}, r"list of 2 positive.*axis_sections=\[4\]"),
        ({"num_axes": 2, "axis_sections": [4, 0]}, r"axis_sections=\[4, 0\]"),
        ({"num_axes": 2, "axis_sections": "44"}, "axis_sections='44'"),
        (
            {"num_axes": 2, "axis_layout": "alternating", "axis_sections": [2, 2]},
            "alternating.*axis_sections=",
        ),
        (
            {"num_axes": 2, "axis_sections": [2, 3], "rotary_dim": 8},
            r"sum to.*4.*axis_sections=\[2, 3\]",
        ),
        ({"learned_frequencies": "yes"}, "learned_frequencies='yes'"),
        ({"num_prefix_tokens": -1}, "num_prefix_tokens=-1"),
        ({"num_prefix_tokens": 1.0}, "num_prefix_tokens=1.0"),
        (
            {"num_axes": 2, "scaling": {"rope_type": "linear", "factor": 2.0}},
            "scaling.*num_axes=2",
        ),
        (
            {"learned_frequencies": True, "scaling": {"rope_type": "linear", "factor": 2.0}},
            "scaling.*learned_frequencies=True",
        ),
        ({"learned_frequencies": True, "sequence_axis": 2}, "sequence_axis=2"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(**kwargs)


@pytest.mark.parametrize(
    "kwargs, shape, message",
    [
        ({"num_axes": 3, "axis_sections": [2, 3, 3]}, (1, 6, 32), r"sum to.*16"),
        ({"num_axes": 3}, (1, 6, 16), r"8 rotary pairs.*not divisible by 3"),
        (
            {"num_axes": 3, "axis_layout": "cyclic", "axis_sections": [2, 1, 5]},
            (1, 6, 16),
            "axis 2 5 pairs",
        ),
        ({"learned_frequencies": True}, (1, 6, None, 8), r"known number of heads"),
        ({"learned_frequencies": True}, (1, 6, 2, 2, 8), r"\(1, 6, 2, 2, 8\)"),
    ],
)
def test_bad_shapes_fail_at_build(kwargs, shape, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(**kwargs).build(shape)


@pytest.mark.parametrize(
    "kwargs, call_kwargs, message",
    [
        ({"num_axes": 2}, {}, r"grid_shape=.*positions=.*\(sequence, 2\)"),
        ({"num_axes": 2}, {"start_index": 3, "grid_shape": (2, 3)}, "start_index=3"),
        (
            {"num_axes": 2},
            {"grid_shape": (2, 3), "positions": np.zeros((6, 2), "int32")},
            "not both",
        ),
        ({"num_axes": 2}, {"grid_shape": (6,)}, r"grid_shape=\(6,\)"),
        ({"num_axes": 2}, {"grid_shape": (2, 2)}, "sequence length 6"),
        ({"num_axes": 2}, {"positions": np.zeros((6,), "int32")}, r"\(sequence, 2\)"),
        ({"num_axes": 2, "num_prefix_tokens": 7}, {"grid_shape": (2, 3)}, "at least the 7"),
    ],
)
def test_bad_calls_say_what_to_pass(kwargs, call_kwargs, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(**kwargs)(random_inputs((1, 6, 8)), **call_kwargs)


# Hugging Face configs, with the fields of transformers' config classes.
QWEN2_VL = {  # Qwen/Qwen2-VL-7B-Instruct config.json, flat as on the Hub
    "model_type": "qwen2_vl",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "embed_dim": 1280, "num_heads": 16, "spatial_merge_size": 2},
}
QWEN2_5_VL_TEXT = {  # its text_config as transformers 5 writes it
    "model_type": "qwen2_5_vl_text",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "max_position_embeddings": 128000,
    "rope_parameters": {
        "rope_type": "default",
        "mrope_section": [16, 24, 24],
        "rope_theta": 1000000.0,
    },
}
QWEN3_VL_TEXT = {  # Qwen/Qwen3-VL-8B-Instruct's text_config
    "model_type": "qwen3_vl_text",
    "head_dim": 128,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "max_position_embeddings": 262144,
    "rope_scaling": {
        "mrope_interleaved": True,
        "mrope_section": [24, 20, 20],
        "rope_type": "default",
    },
    "rope_theta": 5000000,
}
PIXTRAL_VISION = {  # mistral-community/pixtral-12b's vision_config
    "model_type": "pixtral",
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "head_dim": 64,
    "image_size": 1024,
    "patch_size": 16,
    "rope_theta": 10000.0,
}


@pytest.mark.parametrize(
    "config, expected, theta",
    [
        (
            QWEN2_VL,
            {"num_axes": 3, "axis_layout": "sections", "axis_sections": [16, 24, 24], "max_wavelength": 1e6},
            references.mrope_frequencies(128, [16, 24, 24], 1e6),
        ),
        (
            QWEN2_5_VL_TEXT,
            {"num_axes": 3, "axis_layout": "sections", "axis_sections": [16, 24, 24], "max_wavelength": 1e6},
            references.mrope_frequencies(128, [16, 24, 24], 1e6),
        ),
        (
            QWEN3_VL_TEXT,
            {"num_axes": 3, "axis_layout": "cyclic", "axis_sections": [24, 20, 20], "max_wavelength": 5e6},
            references.interleaved_mrope_frequencies(128, [24, 20, 20], 5e6),
        ),
        (
            PIXTRAL_VISION,
            {"num_axes": 2, "axis_layout": "alternating", "axis_sections": None, "max_wavelength": 1e4},
            references.pixtral_frequencies(64, 1e4),
        ),
    ],
)
def test_from_hf_config_reads_grid_models(config, expected, theta):
    layer = RotaryEmbedding.from_hf_config(config)
    assert {key: getattr(layer, key) for key in expected} == expected
    assert (layer.pairing, layer.scaling, layer.rotary_dim) == ("half", None, None)
    num_axes, dim = theta.shape[1], 2 * theta.shape[0]
    inputs = random_inputs((1, 3, 1, dim))
    positions = np.array([[5, 5, 5], [6, 6, 7], [6, 7, 6]])[:, :num_axes]
    expected_outputs = references.grid_rotary(inputs, positions, theta)
    assert_close_to_reference(layer(inputs, positions=positions), expected_outputs, inputs, 20.0)


def test_from_hf_config_refuses_a_stretched_schedule_on_a_grid():
    config = dict(
        QWEN2_VL,
        rope_scaling={
            "type": "yarn",
            "mrope_section": [16, 24, 24],
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    )
    with pytest.raises(ValueError, match="scaling.*num_axes=3"):
        RotaryEmbedding.from_hf_config(config)


def test_multimodal_positions_match_transformers_get_rope_index():
    fixture = np.load(FIXTURE)
    for name in ("mixed", "vision_first"):
        segments = json.loads(str(fixture[f"{name}_segments"]))
        positions = ops.multimodal_positions(segments, spatial_merge_size=2)
        assert keras.backend.standardize_dtype(positions.dtype) == "int32"
        np.testing.assert_array_equal(
            numpy(positions), fixture[f"{name}_positions"], err_msg=name
        )


def test_multimodal_positions_after_a_long_video_continue_past_its_frames():
    # Eight frames of a 2 x 2 grid: the text after it starts at 8, the
    # largest position (7) plus one.
    positions = numpy(ops.multimodal_positions([(8, 2, 2), 1]))
    assert positions[-1].tolist() == [8, 8, 8]


@pytest.mark.parametrize(
    "segments, spatial_merge_size, message",
    [
        ([], 1, r"segments=\[\]"),
        ([3, (1, 3, 4)], 2, r"multiples of spatial_merge_size=2.*\(1, 3, 4\)"),
        ([(1, 2)], 1, r"\(1, 2\)"),
        ([0], 1, "text length"),
        ([2], 0, "spatial_merge_size=0"),
    ],
)
def test_multimodal_positions_bad_segments(segments, spatial_merge_size, message):
    with pytest.raises(ValueError, match=message):
        ops.multimodal_positions(segments, spatial_merge_size)
