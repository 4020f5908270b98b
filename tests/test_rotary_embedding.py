"""RotaryEmbedding against float64 references, keras-hub and HF configs."""

import math

import keras
import keras_hub
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_posenc import RotaryEmbedding
from keras_posenc import ops
from tests import references
from tests.test_case import TestCase

# A float32 angle p * w is off from the exact one relative to itself by the
# float32 frequency w (a handful of roundings, at most 1e-6; see
# test_rope_scaling.FREQUENCY_RTOL), the rounding of the exponent 2i / dim
# when dim is not a power of two (2**-24 * ln(base) <= 8.2e-7 for bases up to
# 1e6) and half an ulp of the product (6e-8): under 2e-6 in all.
ANGLE_RTOL = 2e-6
# Then cos and sin, two products, a sum and the attention factor in float32:
# a few ulps (2**-24 each) of the pair's norm.
OUTPUT_RTOL = 2.0**-21

LLAMA_3_1_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LLAMA_3_1_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": LLAMA_3_1_SCALING,
}


def random_inputs(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def pair_norms(inputs, layout, rotated):
    """The norm of each rotated feature pair: `(..., rotated / 2)`."""
    if layout == "half":
        first = inputs[..., : rotated // 2]
        second = inputs[..., rotated // 2 : rotated]
    else:
        first, second = inputs[..., 0:rotated:2], inputs[..., 1:rotated:2]
    return np.hypot(first, second)


def assert_rotated(
    outputs,
    inputs,
    positions,
    inverse_frequencies,
    attention_factor=1.0,
    layout="half",
    rotary_dim=None,
):
    """`outputs` equal `references.rotary` up to float32 angle rounding.

    A pair of norm r turned by an angle off by e moves by at most r * e, so
    each rotated feature may be off by
    attention_factor * r * (ANGLE_RTOL * |angle| + OUTPUT_RTOL); the features
    past `rotary_dim` must come through bit for bit.
    """
    inputs = np.asarray(inputs, "float64")
    outputs = np.asarray(outputs, "float64")
    assert outputs.shape == inputs.shape
    rotated = inputs.shape[-1] if rotary_dim is None else rotary_dim
    expected = references.rotary(
        inputs, positions, inverse_frequencies, attention_factor, layout, rotary_dim
    )
    positions = np.asarray(positions, "float64")
    if positions.ndim == 1:
        positions = positions[None]  # (1, seq)
    angles = np.abs(positions[..., None] * inverse_frequencies)  # (b, seq, r / 2)
    angles = angles.reshape(
        angles.shape[:2] + (1,) * (inputs.ndim - 3) + angles.shape[-1:]
    )  # (b, seq, [1,] r / 2)
    pair_tolerance = (
        attention_factor
        * pair_norms(inputs, layout, rotated)
        * (ANGLE_RTOL * angles + OUTPUT_RTOL)
    )  # (batch, seq, [heads,] r / 2)
    if layout == "half":
        tolerance = np.concatenate([pair_tolerance, pair_tolerance], -1)
    else:
        tolerance = np.repeat(pair_tolerance, 2, -1)  # (batch, seq, [heads,] r)
    error = np.abs(outputs[..., :rotated] - expected[..., :rotated])
    assert np.all(error <= tolerance), np.max(error / tolerance)
    np.testing.assert_array_equal(outputs[..., rotated:], inputs[..., rotated:])


class RotaryEmbeddingLayerTest(TestCase):
    def test_layer_behaviour(self):
        for init_kwargs, input_shape in [
            ({}, (2, 4, 3, 8)),
            ({"layout": "interleaved", "rotary_dim": 4}, (2, 4, 3, 8)),
            (
                {
                    "scaling": {
                        "rope_type": "dynamic",
                        "factor": 2.0,
                        "original_max_position_embeddings": 2,
                    }
                },
                (2, 4, 3, 8),
            ),
            ({"max_wavelength": 500000.0}, (2, 5, 6)),
            ({"sequence_axis": 2}, (2, 3, 4, 8)),
        ]:
            self.run_layer_test(
                RotaryEmbedding,
                init_kwargs=init_kwargs,
                input_shape=input_shape,
                expected_output_shape=input_shape,
                expected_num_trainable_weights=0,
                expected_num_non_trainable_weights=0,
                supports_masking=True,
            )


@pytest.mark.parametrize("layout", ops.ROPE_LAYOUTS)
@pytest.mark.parametrize("shape", [(2, 9, 8), (2, 9, 3, 8)])
def test_rotates_each_pair_by_position_times_frequency(layout, shape):
    inputs = random_inputs(shape)
    outputs = RotaryEmbedding(layout=layout)(inputs, start_index=1000)
    assert outputs.dtype == tf.float32
    inverse_frequencies, _ = references.rope_inverse_frequencies(8)
    assert_rotated(
        outputs, inputs, 1000 + np.arange(9), inverse_frequencies, layout=layout
    )


@pytest.mark.parametrize("layout", ops.ROPE_LAYOUTS)
@pytest.mark.parametrize("shape", [(2, 6, 10), (2, 6, 3, 10)])
def test_partial_rotary_spaces_frequencies_over_rotary_dim(layout, shape):
    inputs = random_inputs(shape)
    outputs = RotaryEmbedding(layout=layout, rotary_dim=4)(inputs, start_index=30)
    # Frequencies of a 4-feature rotation, not of all 10 features.
    inverse_frequencies, _ = references.rope_inverse_frequencies(4)
    assert_rotated(
        outputs,
        inputs,
        30 + np.arange(6),
        inverse_frequencies,
        layout=layout,
        rotary_dim=4,
    )


@pytest.mark.parametrize("layout", ops.ROPE_LAYOUTS)
def test_other_base_and_float_positions(layout):
    inputs = random_inputs((2, 5, 2, 12))
    positions = np.array([-3.5, 0.0, 0.25, 17.75, 1000.125], "float32")
    outputs = RotaryEmbedding(max_wavelength=500000.0, layout=layout)(
        inputs, positions=positions
    )
    inverse_frequencies, _ = references.rope_inverse_frequencies(12, 500000.0)
    assert_rotated(outputs, inputs, positions, inverse_frequencies, layout=layout)


@pytest.mark.parametrize("shape", [(2, 5, 8), (2, 5, 3, 8)])
def test_positions_per_batch(shape):
    inputs = random_inputs(shape)
    # Left padding: each row counts from its own first real token.
    positions = np.array([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    outputs = RotaryEmbedding()(inputs, positions=positions)
    inverse_frequencies, _ = references.rope_inverse_frequencies(8)
    assert_rotated(outputs, inputs, positions, inverse_frequencies)
    # A pad step at position 0 is left alone.
    np.testing.assert_array_equal(outputs[0, :3], inputs[0, :3])


def test_sequence_and_feature_axes_anywhere():
    inputs = random_inputs((2, 7, 3, 8))  # (batch, seq, heads, dim)
    expected = RotaryEmbedding(layout="interleaved")(inputs).numpy()
    heads_first = RotaryEmbedding(layout="interleaved", sequence_axis=2)(
        inputs.transpose(0, 2, 1, 3)  # (batch, heads, seq, dim)
    )
    np.testing.assert_array_equal(
        heads_first.numpy(), expected.transpose(0, 2, 1, 3)
    )
    features_first = RotaryEmbedding(
        layout="interleaved", sequence_axis=-1, feature_axis=1
    )(inputs.transpose(0, 3, 2, 1))  # (batch, dim, heads, seq)
    np.testing.assert_array_equal(
        features_first.numpy(), expected.transpose(0, 3, 2, 1)
    )


def test_masks_pass_through():
    layer = RotaryEmbedding()
    mask = np.array([[True, True, False]])
    assert layer.compute_mask(np.zeros((1, 3, 2, 4), "float32"), mask) is mask
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(np.array([[3, 1, 0]]))
    rotated = layer(embedded)
    np.testing.assert_array_equal(rotated._keras_mask, mask)


SCHEDULE_CASES = {
    "linear": (
        {"rope_type": "linear", "factor": 4.0},
        np.arange(12),
        None,
    ),
    "dynamic-below-trained-length": (
        {
            "rope_type": "dynamic",
            "factor": 2.0,
            "original_max_position_embeddings": 64,
        },
        np.arange(12),
        12,
    ),
    "dynamic-past-trained-length": (
        {
            "rope_type": "dynamic",
            "factor": 2.0,
            "original_max_position_embeddings": 16,
        },
        np.arange(40),
        40,
    ),
    # The current length is the largest position plus one, not the count.
    "dynamic-explicit-positions": (
        {
            "rope_type": "dynamic",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        np.array([3, 70, 5]),
        71,
    ),
    # ...over the whole batch.
    "dynamic-per-batch-positions": (
        {
            "rope_type": "dynamic",
            "factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        np.array([[0, 1, 2], [50, 51, 52]]),
        53,
    ),
    "yarn": (
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 64,
        },
        np.arange(100, 110),
        None,
    ),
    "yarn-deepseek-mscale": (
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16.0,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
        np.arange(500, 505),
        None,
    ),
    "llama3": (LLAMA_3_1_SCALING, np.arange(20000, 20010), None),
    # Length 32 is the trained length: short factors...
    "longrope-short": (
        {
            "rope_type": "longrope",
            "short_factor": [1.0, 1.1, 1.5, 2.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0],
            "original_max_position_embeddings": 32,
            "factor": 4.0,
        },
        np.arange(32),
        32,
    ),
    # ...one more position and the long ones.
    "longrope-long": (
        {
            "rope_type": "longrope",
            "short_factor": [1.0, 1.1, 1.5, 2.0],
            "long_factor": [1.0, 2.0, 4.0, 8.0],
            "original_max_position_embeddings": 32,
            "factor": 4.0,
        },
        np.arange(33),
        33,
    ),
}


@pytest.mark.parametrize("case", SCHEDULE_CASES)
@pytest.mark.parametrize("layout", ops.ROPE_LAYOUTS)
def test_scaling_schedules(case, layout):
    scaling, positions, sequence_length = SCHEDULE_CASES[case]
    dim = 8 if scaling["rope_type"] == "longrope" else 16  # 4 longrope factors
    batch = positions.shape[0] if positions.ndim == 2 else 2
    inputs = random_inputs((batch, positions.shape[-1], 2, dim))
    layer = RotaryEmbedding(max_wavelength=500000.0, layout=layout, scaling=scaling)
    if positions.ndim == 1 and np.array_equal(
        positions, positions[0] + np.arange(len(positions))
    ):
        outputs = layer(inputs, start_index=int(positions[0]))
    else:
        outputs = layer(inputs, positions=positions)
    inverse_frequencies, attention_factor = references.rope_inverse_frequencies(
        dim, 500000.0, scaling, sequence_length
    )
    assert_rotated(
        outputs, inputs, positions, inverse_frequencies, attention_factor, layout
    )


def test_dynamic_follows_start_index_in_cached_decoding():
    scaling = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 8,
    }
    inputs = random_inputs((2, 1, 8))
    outputs = RotaryEmbedding(scaling=scaling)(inputs, start_index=tf.constant(20))
    # One new token at position 20: the length is 21, not 1.
    inverse_frequencies, _ = references.rope_inverse_frequencies(
        8, 10000.0, scaling, 21
    )
    assert_rotated(outputs, inputs, [20], inverse_frequencies)


def test_longrope_switches_factors_past_the_trained_length():
    scaling = SCHEDULE_CASES["longrope-long"][0]
    layer = RotaryEmbedding(scaling=scaling)
    inputs = random_inputs((1, 1, 8))
    # The same position, 31, in a call that ends at 31 and one that ends at 32.
    short = layer(inputs, positions=[31]).numpy()
    long = layer(np.concatenate([inputs, inputs], 1), positions=[31, 32]).numpy()
    assert np.abs(short[:, 0] - long[:, 0]).max() > 0.1
    attention_factor = math.sqrt(1 + math.log(4.0) / math.log(32))
    for outputs in (short[:, :1], long[:, :1]):
        np.testing.assert_allclose(
            pair_norms(outputs, "half", 8),
            attention_factor * pair_norms(inputs, "half", 8),
            rtol=1e-6,
        )


def test_yarn_attention_factor_scales_every_pair():
    scaling = SCHEDULE_CASES["yarn"][0]
    inputs = random_inputs((2, 10, 3, 16))
    outputs = RotaryEmbedding(scaling=scaling)(inputs).numpy()
    # Peng et al. 2023, eq. 22: sqrt(1 / t) = 0.1 ln(s) + 1.
    np.testing.assert_allclose(
        pair_norms(outputs, "half", 16),
        (0.1 * math.log(8.0) + 1.0) * pair_norms(inputs, "half", 16),
        rtol=1e-6,
    )


def test_from_hf_config_llama_3_1_past_its_trained_length():
    layer = RotaryEmbedding.from_hf_config(LLAMA_3_1_CONFIG)
    assert layer.max_wavelength == 500000.0
    assert layer.layout == "half"
    assert layer.rotary_dim is None
    assert layer.scaling == LLAMA_3_1_SCALING
    inputs = random_inputs((1, 11, 2, 128))  # head_dim = 4096 / 32
    inverse_frequencies, _ = references.rope_inverse_frequencies(
        128, 500000.0, LLAMA_3_1_SCALING
    )
    unscaled, _ = references.rope_inverse_frequencies(128, 500000.0)
    for start_index in (8190, 99995):
        positions = start_index + np.arange(11)
        outputs = layer(inputs, start_index=start_index)
        assert_rotated(outputs, inputs, positions, inverse_frequencies)
        # Without the schedule the slow pairs would be far off.
        unscaled_expected = references.rotary(inputs, positions, unscaled)
        assert np.abs(outputs.numpy() - unscaled_expected).max() > 0.5


@pytest.mark.parametrize(
    "config, head_dim, rotary_dim, base",
    [
        (  # Phi-2: rotary_dim = int(80 * 0.4)
            {
                "hidden_size": 2560,
                "num_attention_heads": 32,
                "partial_rotary_factor": 0.4,
                "rope_theta": 10000.0,
                "rope_scaling": None,
                "max_position_embeddings": 2048,
            },
            80,
            32,
            10000.0,
        ),
        (  # GPT-NeoX names the base rotary_emb_base, the fraction rotary_pct.
            {
                "hidden_size": 512,
                "num_attention_heads": 8,
                "rotary_pct": 0.25,
                "rotary_emb_base": 10000,
                "max_position_embeddings": 2048,
            },
            64,
            16,
            10000.0,
        ),
        (  # hidden_size / num_attention_heads would be 128; head_dim says 64.
            {
                "hidden_size": 2048,
                "num_attention_heads": 16,
                "head_dim": 64,
                "partial_rotary_factor": 0.5,
                "rope_theta": 1000000.0,
            },
            64,
            32,
            1000000.0,
        ),
    ],
    ids=["phi-2", "gpt-neox", "explicit-head-dim"],
)
def test_from_hf_config_partial_rotary(config, head_dim, rotary_dim, base):
    layer = RotaryEmbedding.from_hf_config(config)
    assert layer.rotary_dim == rotary_dim
    assert layer.max_wavelength == base
    assert layer.scaling is None
    inputs = random_inputs((1, 4, 2, head_dim))
    inverse_frequencies, _ = references.rope_inverse_frequencies(rotary_dim, base)
    assert_rotated(
        layer(inputs, start_index=2000),
        inputs,
        2000 + np.arange(4),
        inverse_frequencies,
        rotary_dim=rotary_dim,
    )


def test_from_hf_config_gpt_j_interleaved():
    gpt_j = {
        "model_type": "gptj",
        "n_embd": 256,
        "n_head": 4,
        "rotary_dim": 16,
        "n_positions": 2048,
    }
    layer = RotaryEmbedding.from_hf_config(gpt_j)
    assert (layer.layout, layer.rotary_dim) == ("interleaved", 16)
    inputs = random_inputs((1, 4, 4, 64))
    inverse_frequencies, _ = references.rope_inverse_frequencies(16)
    assert_rotated(
        layer(inputs, start_index=300),
        inputs,
        300 + np.arange(4),
        inverse_frequencies,
        layout="interleaved",
        rotary_dim=16,
    )


def test_from_hf_config_without_a_head_width_names_what_it_needs():
    with pytest.raises(ValueError, match=r"head_dim.*\['rope_theta'\]"):
        RotaryEmbedding.from_hf_config({"rope_theta": 10000.0})


def test_from_hf_config_legacy_type_key():
    config = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    layer = RotaryEmbedding.from_hf_config(config)
    assert layer.scaling == {"rope_type": "linear", "factor": 2.0}
    assert layer.max_wavelength == 10000.0
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}
    inputs = random_inputs((1, 5, 16))
    inverse_frequencies, _ = references.rope_inverse_frequencies(
        16, 10000.0, {"rope_type": "linear", "factor": 2.0}
    )
    assert_rotated(layer(inputs), inputs, np.arange(5), inverse_frequencies)


def test_from_hf_config_rope_parameters():
    # transformers 5 moves rope_theta and the schedule into one dict.
    config = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": {
            "rope_type": "dynamic",
            "factor": 2.0,
            "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.5,
        },
    }
    layer = RotaryEmbedding.from_hf_config(config)
    assert layer.max_wavelength == 1000000.0
    assert layer.rotary_dim == 8
    scaling = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 4096,
    }
    assert layer.scaling == scaling
    inputs = random_inputs((1, 3, 2, 16))
    inverse_frequencies, _ = references.rope_inverse_frequencies(
        8, 1000000.0, scaling, 10001
    )
    assert_rotated(
        layer(inputs, start_index=9998),
        inputs,
        9998 + np.arange(3),
        inverse_frequencies,
        rotary_dim=8,
    )


def test_from_hf_config_phi_3_longrope():
    # Phi-3 keeps the trained length at the top level and has no factor:
    # it is max_position_embeddings / original = 32.
    half = 8
    config = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "longrope",
            "short_factor": np.linspace(1.0, 1.2, half).tolist(),
            "long_factor": np.geomspace(1.0, 40.0, half).tolist(),
        },
    }
    layer = RotaryEmbedding.from_hf_config(config)
    scaling = {
        "rope_type": "longrope",
        "short_factor": config["rope_scaling"]["short_factor"],
        "long_factor": config["rope_scaling"]["long_factor"],
        "original_max_position_embeddings": 4096,
        "factor": 32.0,
    }
    assert layer.scaling == scaling
    inputs = random_inputs((1, 4, 2, 16))
    for start_index, sequence_length in ((0, 4), (5000, 5004)):
        inverse_frequencies, attention_factor = (
            references.rope_inverse_frequencies(
                16, 10000.0, scaling, sequence_length
            )
        )
        assert attention_factor == pytest.approx(
            math.sqrt(1 + math.log(32) / math.log(4096)), rel=1e-12
        )
        assert_rotated(
            layer(inputs, start_index=start_index),
            inputs,
            start_index + np.arange(4),
            inverse_frequencies,
            attention_factor,
        )


def test_from_hf_config_yarn_without_factor():
    config = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "original_max_position_embeddings": 4096,
        },
    }
    layer = RotaryEmbedding.from_hf_config(config)
    scaling = {
        "rope_type": "yarn",
        "original_max_position_embeddings": 4096,
        "factor": 8.0,
    }
    assert layer.scaling == scaling
    inverse_frequencies, attention_factor = references.rope_inverse_frequencies(
        16, 1000000.0, scaling
    )
    assert attention_factor == pytest.approx(1 + 0.1 * math.log(8.0), rel=1e-12)
    inputs = random_inputs((1, 4, 2, 16))
    assert_rotated(
        layer(inputs, start_index=20000),
        inputs,
        20000 + np.arange(4),
        inverse_frequencies,
        attention_factor,
    )


@pytest.mark.parametrize(
    "hub_kwargs, scaling",
    [
        ({}, None),
        (
            {"scaling_factor": 4.0, "rope_type": "linear"},
            {"rope_type": "linear", "factor": 4.0},
        ),
    ],
)
@pytest.mark.parametrize("shape", [(2, 9, 16), (2, 9, 3, 16)])
def test_equals_keras_hub_rotary_embedding(hub_kwargs, scaling, shape):
    # Bit for bit: both compute max_wavelength ** (-2i / d) with one float32
    # pow, divide by the factor, multiply float32 positions by it and rotate
    # with the same element-wise x * cos + rotate(x) * sin in float32.
    inputs = random_inputs(shape)
    hub = keras_hub.layers.RotaryEmbedding(**hub_kwargs)
    ours = RotaryEmbedding(scaling=scaling)
    for call_kwargs in (
        {},
        {"start_index": 4093},
        {"positions": np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13], list(range(9))])},
    ):
        np.testing.assert_array_equal(
            ours(inputs, **call_kwargs).numpy(),
            hub(inputs, **call_kwargs).numpy(),
            err_msg=str(call_kwargs),
        )


@settings(deadline=None, max_examples=40)
@given(
    data=st.data(),
    half_dim=st.integers(1, 16),
    positions=st.tuples(st.integers(0, 4000), st.integers(0, 4000)),
    shift=st.integers(0, 4000),
    layout=st.sampled_from(ops.ROPE_LAYOUTS),
)
def test_scores_depend_on_relative_position_only(
    data, half_dim, positions, shift, layout
):
    dim = 2 * half_dim
    vectors = hnp.arrays(
        "float32", dim, elements=st.floats(-4, 4, width=32, allow_subnormal=False)
    )
    query, key = data.draw(vectors), data.draw(vectors)
    m, n = positions
    rotated = RotaryEmbedding(layout=layout)(
        np.stack([query, key, query, key])[None],  # (1, 4, dim)
        positions=[m, n, m + shift, n + shift],
    ).numpy()[0].astype("float64")
    score, shifted_score = rotated[0] @ rotated[1], rotated[2] @ rotated[3]
    # Each rotated pair is off by its norm times (ANGLE_RTOL * angle +
    # OUTPUT_RTOL), so pair i of a score by |q_i| |k_i| times the sum of those
    # at both positions; the float64 dot products add nothing that matters.
    inverse_frequencies, _ = references.rope_inverse_frequencies(dim)
    tolerance = np.sum(
        pair_norms(query.astype("float64"), layout, dim)
        * pair_norms(key.astype("float64"), layout, dim)
        * (
            ANGLE_RTOL * inverse_frequencies * (2 * m + 2 * n + 2 * shift)
            + 4 * OUTPUT_RTOL
        )
    )
    assert abs(score - shifted_score) <= tolerance


def assert_same_rotation(outputs, expected):
    """Equal up to an ulp of cos and sin times inputs of size below 5.

    TensorFlow's float32 cos and sin (Eigen's) take a vectorised path for
    whole packets and another for the rest, so one angle can round one ulp
    (6e-8 below 1) apart in tensors of different lengths.
    """
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-6)


def test_start_index_equals_slicing_a_longer_call():
    layer = RotaryEmbedding(layout="interleaved", rotary_dim=6)
    inputs = random_inputs((2, 30, 3, 8))
    full = layer(inputs).numpy()
    for start_index in (0, 7, tf.constant(12), tf.constant(29, "int64")):
        index = int(start_index)
        part = layer(inputs[:, index : index + 1], start_index=start_index)
        assert_same_rotation(part.numpy(), full[:, index : index + 1])
    chunk = layer(inputs[:, 20:25], start_index=20)
    assert_same_rotation(chunk.numpy(), full[:, 20:25])

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, None, None, 8), "float32"),
            tf.TensorSpec((), "int32"),
        ]
    )
    def decode_step(token, start_index):
        return layer(token, start_index=start_index)

    for index in (0, 13, 29):
        step = decode_step(inputs[:, index : index + 1], tf.constant(index))
        assert_same_rotation(step.numpy(), full[:, index : index + 1])
    assert decode_step.experimental_get_tracing_count() == 1


def test_mixed_bfloat16_is_right_near_position_32768():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = RotaryEmbedding(rotary_dim=48)
    # Inputs bfloat16 holds exactly, so that only the rotation is judged.
    inputs = np.random.default_rng(0).uniform(-1, 1, (2, 16, 2, 64))
    inputs = tf.cast(tf.cast(inputs, "bfloat16"), "float32").numpy()
    outputs = layer(inputs, start_index=32760)
    assert outputs.dtype == tf.bfloat16
    outputs = tf.cast(outputs, "float64").numpy()
    inverse_frequencies, _ = references.rope_inverse_frequencies(48)
    expected = references.rotary(
        inputs, 32760 + np.arange(16), inverse_frequencies, rotary_dim=48
    )
    # bfloat16 rounds outputs below 2 by up to 2**-8 (4e-3); float32 angles
    # near 32768 are off by up to 2**-9 radians (2e-3), times pair norms
    # below 1.5. bfloat16 angles would be off by up to 128 radians.
    assert np.abs(outputs - expected).max() <= 2e-2
    np.testing.assert_array_equal(outputs[..., 48:], inputs[..., 48:])


def test_mixed_bfloat16_keeps_float_positions_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    inputs = np.ones((1, 4, 8), "float32")
    # bfloat16 would round these to 1000, 1000, 3008 and 32768.
    positions = np.array([1000.125, 1001.5, 3000.75, 32760.25], "float32")
    outputs = RotaryEmbedding()(inputs, positions=positions)
    assert outputs.dtype == tf.bfloat16
    inverse_frequencies, _ = references.rope_inverse_frequencies(8)
    expected = references.rotary(inputs, positions, inverse_frequencies)
    # As above: bfloat16 outputs, float32 angles up to 32768.
    error = np.abs(tf.cast(outputs, "float64").numpy() - expected)
    assert error.max() <= 2e-2, error.max()


def rotary_functional_model():
    """Functional: (batch, seq, 8) of any length -> 2 heads -> RoPE -> Dense."""
    inputs = keras.Input(shape=(None, 8))
    heads = keras.layers.Reshape((-1, 2, 4))(keras.layers.Dense(8)(inputs))
    rotated = RotaryEmbedding(
        layout="interleaved",
        rotary_dim=2,
        max_wavelength=500.0,
        scaling={
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    )(heads)  # (batch, seq, 2, 4)
    outputs = keras.layers.Dense(3)(keras.layers.Reshape((-1, 8))(rotated))
    return keras.Model(inputs, outputs)


def rotary_layer(model):
    """The one RotaryEmbedding among a model's layers."""
    (layer,) = [
        layer for layer in model.layers if isinstance(layer, RotaryEmbedding)
    ]
    return layer


def test_keras_file_round_trip_is_bit_identical(tmp_path):
    keras.utils.set_random_seed(0)
    models = {
        "functional": rotary_functional_model(),
        "sequential": keras.Sequential(
            [
                keras.Input(shape=(None, 2, 16)),
                keras.layers.Dense(16),
                RotaryEmbedding.from_hf_config(
                    dict(LLAMA_3_1_CONFIG, hidden_size=32, num_attention_heads=2)
                ),
                keras.layers.Dense(2),
            ]
        ),
    }
    inputs = {
        "functional": random_inputs((3, 9, 8)),
        # Past Llama 3.1's trained length, where its schedule matters.
        "sequential": random_inputs((3, 9, 2, 16)),
    }
    for name, model in models.items():
        path = tmp_path / f"{name}.keras"
        model.save(path)
        loaded = keras.models.load_model(path, safe_mode=True)
        assert rotary_layer(loaded).get_config() == rotary_layer(model).get_config()
        np.testing.assert_array_equal(
            loaded.predict(inputs[name], verbose=0),
            model.predict(inputs[name], verbose=0),
            err_msg=name,
        )


def test_xla_training_and_predict_at_two_lengths():
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(None, 8))
    heads = keras.layers.Reshape((-1, 2, 4))(keras.layers.Dense(8)(inputs))
    # Dynamic: the trained length of 4 is passed at the second length, so
    # its length-dependent base is computed inside the compiled function.
    rotated = RotaryEmbedding(
        scaling={
            "rope_type": "dynamic",
            "factor": 2.0,
            "original_max_position_embeddings": 4,
        }
    )(heads)
    outputs = keras.layers.Dense(1)(keras.layers.Reshape((-1, 8))(rotated))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=True
    )
    assert model.jit_compile
    before = [weight.numpy() for weight in model.trainable_weights]
    for length in (3, 11):
        features = random_inputs((4, length, 8), seed=length)
        loss = model.train_on_batch(features, np.ones((4, length, 1), "float32"))
        assert np.isfinite(loss)
        # XLA's cos and sin may differ from TensorFlow's kernels by an ulp.
        np.testing.assert_allclose(
            model.predict(features, verbose=0), model(features).numpy(), atol=1e-5
        )
    for weight, old in zip(model.trainable_weights, before):
        assert not np.array_equal(weight.numpy(), old)


def test_unknown_length_in_a_functional_model():
    inputs = keras.Input(shape=(None, 3, 8))
    outputs = RotaryEmbedding(layout="interleaved")(inputs)
    assert tuple(outputs.shape) == (None, None, 3, 8)
    model = keras.Model(inputs, outputs)
    inverse_frequencies, _ = references.rope_inverse_frequencies(8)
    for length in (4, 9):
        features = random_inputs((2, length, 3, 8), seed=length)
        assert_rotated(
            model.predict(features, verbose=0),
            features,
            np.arange(length),
            inverse_frequencies,
            layout="interleaved",
        )


def test_config_round_trip():
    scaling = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "beta_fast": 16.0,
    }
    layer = RotaryEmbedding(
        max_wavelength=500000.0,
        layout="interleaved",
        rotary_dim=6,
        scaling=scaling,
        sequence_axis=2,
        feature_axis=-1,
    )
    config = layer.get_config()
    assert {
        "max_wavelength": 500000.0,
        "layout": "interleaved",
        "rotary_dim": 6,
        "scaling": scaling,
        "sequence_axis": 2,
        "feature_axis": -1,
    }.items() <= config.items()
    rebuilt = RotaryEmbedding.from_config(config)
    assert rebuilt.get_config() == config
    inputs = random_inputs((2, 3, 5, 8))
    np.testing.assert_array_equal(rebuilt(inputs).numpy(), layer(inputs).numpy())
    # The layer keeps its own copy of the dict.
    scaling["factor"] = 2.0
    assert layer.get_config()["scaling"]["factor"] == 4.0
    numpy_scalar = RotaryEmbedding(max_wavelength=np.float32(500.0))
    assert type(numpy_scalar.get_config()["max_wavelength"]) is float


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_wavelength": 0}, "max_wavelength=0"),
        ({"max_wavelength": -1}, "max_wavelength=-1"),
        ({"max_wavelength": 1}, "max_wavelength=1"),
        ({"max_wavelength": "long"}, "max_wavelength='long'"),
        ({"layout": "concat"}, "layout='concat'"),
        ({"rotary_dim": 3}, "rotary_dim=3"),
        ({"rotary_dim": 0}, "rotary_dim=0"),
        ({"rotary_dim": -2}, "rotary_dim=-2"),
        ({"rotary_dim": 4.0}, r"rotary_dim=4\.0"),
        ({"scaling": "linear"}, "scaling='linear'"),
        (
            {"scaling": {"rope_type": "ntk", "factor": 2.0}},
            "rope_type='ntk'.*scaling=",
        ),
        ({"scaling": {"factor": 2.0}}, "rope_type=None.*scaling="),
        ({"scaling": {"rope_type": "linear"}}, "scaling.*'factor'"),
        ({"scaling": {"rope_type": "linear", "factor": 0}}, "scaling.*factor=0"),
        (
            {"scaling": {"rope_type": "linear", "factor": -2.0}},
            r"scaling.*factor=-2\.0",
        ),
        (
            {
                "scaling": {
                    "rope_type": "yarn",
                    "original_max_position_embeddings": 64,
                }
            },
            "scaling.*'factor'",
        ),
        (
            {"scaling": {"rope_type": "linear", "factor": 2.0, "beta_fast": 32.0}},
            "scaling.*'beta_fast'",
        ),
        (
            {
                "rotary_dim": 8,
                "scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0, 1.0],
                    "long_factor": [2.0, 2.0],
                    "original_max_position_embeddings": 64,
                },
            },
            "short_factor",
        ),
        ({"sequence_axis": -1}, "sequence_axis=-1"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(**kwargs)


@pytest.mark.parametrize(
    "kwargs, shape, call_kwargs, message",
    [
        ({}, (1, 3, 7), {}, r"even.*\(1, 3, 7\)"),
        ({}, (1, 3, 2, 7), {}, r"even.*\(1, 3, 2, 7\)"),
        ({"rotary_dim": 16}, (1, 3, 8), {}, r"rotary_dim=16.*\(1, 3, 8\)"),
        ({}, (1, 3, 8), {"positions": np.arange(5)}, r"positions of shape \(5,\)"),
        (
            {},
            (2, 3, 8),
            {"positions": np.zeros((2, 4), "int32")},
            r"positions of shape \(2, 4\)",
        ),
        ({}, (1, 3, 8), {"positions": np.zeros((1, 1, 3))}, "positions"),
        (
            {},
            (2, 3, 8),
            {"positions": np.zeros((3, 3), "int32")},
            r"batch size 2.*positions of shape \(3, 3\)",
        ),
        (
            {"sequence_axis": 0, "feature_axis": 1},
            (3, 8),
            {"positions": np.zeros((1, 3), "int32")},
            r"shape \(sequence,\) for.*\(1, 3\)",
        ),
        ({}, (1, 3, 8), {"start_index": 0.5}, r"start_index=0\.5"),
        ({"sequence_axis": 3}, (1, 3, 8), {}, "sequence_axis=3"),
        # -2 of a rank-3 input is axis 1.
        ({"feature_axis": -2}, (1, 3, 8), {}, "sequence_axis=1, feature_axis=-2"),
        (
            {
                "scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0, 1.0],
                    "long_factor": [2.0, 2.0],
                    "original_max_position_embeddings": 64,
                }
            },
            (1, 3, 8),
            {},
            "short_factor",
        ),
    ],
)
def test_bad_inputs_say_what_was_expected(kwargs, shape, call_kwargs, message):
    layer = RotaryEmbedding(**kwargs)
    with pytest.raises(ValueError, match=message):
        layer(np.zeros(shape, "float32"), **call_kwargs)


def test_unknown_feature_dimension_fails_at_build():
    with pytest.raises(ValueError, match=r"feature dimension.*\(2, 8, None\)"):
        RotaryEmbedding().build((2, 8, None))
