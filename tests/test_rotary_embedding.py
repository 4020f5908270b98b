"""RotaryEmbedding against float64 references, keras-hub and HF configs."""

import copy
import math
import re

import keras
import keras_hub
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_posenc import RotaryEmbedding
from keras_posenc import ops
from tests import references
from tests.backend import XLA
from tests.backend import compiled
from tests.backend import numpy
from tests.backend import tensorflow_only
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


def pair_norms(inputs, pairing, rotated):
    """The norm of each rotated feature pair: `(..., rotated / 2)`."""
    if pairing == "half":
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
    pairing="half",
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
        inputs, positions, inverse_frequencies, attention_factor, pairing, rotary_dim
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
        * pair_norms(inputs, pairing, rotated)
        * (ANGLE_RTOL * angles + OUTPUT_RTOL)
    )  # (batch, seq, [heads,] r / 2)
    if pairing == "half":
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
            ({"pairing": "interleaved", "rotary_dim": 4}, (2, 4, 3, 8)),
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


@pytest.mark.parametrize("pairing", ops.PAIRINGS)
@pytest.mark.parametrize("shape", [(2, 9, 8), (2, 9, 3, 8)])
def test_rotates_each_pair_by_position_times_frequency(pairing, shape):
    inputs = random_inputs(shape)
    outputs = RotaryEmbedding(pairing=pairing)(inputs, start_index=1000)
    assert keras.backend.standardize_dtype(outputs.dtype) == "float32"
    inverse_frequencies, _ = references.rope_inverse_frequencies(8)
    assert_rotated(
        outputs, inputs, 1000 + np.arange(9), inverse_frequencies, pairing=pairing
    )


@pytest.mark.parametrize("pairing", ops.PAIRINGS)
@pytest.mark.parametrize("shape", [(2, 6, 10), (2, 6, 3, 10)])
def test_partial_rotary_spaces_frequencies_over_rotary_dim(pairing, shape):
    inputs = random_inputs(shape)
    outputs = RotaryEmbedding(pairing=pairing, rotary_dim=4)(inputs, start_index=30)
    # Frequencies of a 4-feature rotation, not of all 10 features.
    inverse_frequencies, _ = references.rope_inverse_frequencies(4)
    assert_rotated(
        outputs,
        inputs,
        30 + np.arange(6),
        inverse_frequencies,
        pairing=pairing,
        rotary_dim=4,
    )


@pytest.mark.parametrize("pairing", ops.PAIRINGS)
def test_other_base_and_float_positions(pairing):
    inputs = random_inputs((2, 5, 2, 12))
    positions = np.array([-3.5, 0.0, 0.25, 17.75, 1000.125], "float32")
    outputs = RotaryEmbedding(max_wavelength=500000.0, pairing=pairing)(
        inputs, positions=positions
    )
    inverse_frequencies, _ = references.rope_inverse_frequencies(12, 500000.0)
    assert_rotated(outputs, inputs, positions, inverse_frequencies, pairing=pairing)


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
    expected = numpy(RotaryEmbedding(pairing="interleaved")(inputs))
    heads_first = RotaryEmbedding(pairing="interleaved", sequence_axis=2)(
        inputs.transpose(0, 2, 1, 3)  # (batch, heads, seq, dim)
    )
    np.testing.assert_array_equal(
        numpy(heads_first), expected.transpose(0, 2, 1, 3)
    )
    features_first = RotaryEmbedding(
        pairing="interleaved", sequence_axis=-1, feature_axis=1
    )(inputs.transpose(0, 3, 2, 1))  # (batch, dim, heads, seq)
    np.testing.assert_array_equal(
        numpy(features_first), expected.transpose(0, 3, 2, 1)
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
@pytest.mark.parametrize("pairing", ops.PAIRINGS)
def test_scaling_schedules(case, pairing):
    scaling, positions, sequence_length = SCHEDULE_CASES[case]
    dim = 8 if scaling["rope_type"] == "longrope" else 16  # 4 longrope factors
    batch = positions.shape[0] if positions.ndim == 2 else 2
    inputs = random_inputs((batch, positions.shape[-1], 2, dim))
    layer = RotaryEmbedding(max_wavelength=500000.0, pairing=pairing, scaling=scaling)
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
        outputs, inputs, positions, inverse_frequencies, attention_factor, pairing
    )


def test_the_older_type_key_is_read_as_rope_type_with_a_warning():
    # Hugging Face's older configs name the schedule "type".
    legacy = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}
    received = dict(legacy)
    with pytest.warns(DeprecationWarning, match=r"use `scaling\['rope_type'\]`"):
        layer = RotaryEmbedding(scaling=legacy)
    assert legacy == received
    assert layer.scaling == SCHEDULE_CASES["yarn"][0]
    inputs = random_inputs((2, 10, 3, 16))
    positions = np.arange(10)
    inverse_frequencies, attention_factor = references.rope_inverse_frequencies(
        16, 10000.0, SCHEDULE_CASES["yarn"][0], None
    )
    assert_rotated(
        layer(inputs), inputs, positions, inverse_frequencies, attention_factor, "half"
    )


def test_dynamic_follows_start_index_in_cached_decoding():
    scaling = {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": 8,
    }
    inputs = random_inputs((2, 1, 8))
    outputs = RotaryEmbedding(scaling=scaling)(inputs, start_index=keras.ops.convert_to_tensor(20))
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
    short = numpy(layer(inputs, positions=[31]))
    long = numpy(layer(np.concatenate([inputs, inputs], 1), positions=[31, 32]))
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
    outputs = numpy(RotaryEmbedding(scaling=scaling)(inputs))
    # Peng et al. 2023, eq. 22: sqrt(1 / t) = 0.1 ln(s) + 1.
    np.testing.assert_allclose(
        pair_norms(outputs, "half", 16),
        (0.1 * math.log(8.0) + 1.0) * pair_norms(inputs, "half", 16),
        rtol=1e-6,
    )


def test_from_hf_config_llama_3_1_past_its_trained_length():
    layer = RotaryEmbedding.from_hf_config(LLAMA_3_1_CONFIG)
    assert layer.max_wavelength == 500000.0
    assert layer.pairing == "half"
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
        assert np.abs(numpy(outputs) - unscaled_expected).max() > 0.5


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
    assert (layer.pairing, layer.rotary_dim) == ("interleaved", 16)
    inputs = random_inputs((1, 4, 4, 64))
    inverse_frequencies, _ = references.rope_inverse_frequencies(16)
    assert_rotated(
        layer(inputs, start_index=300),
        inputs,
        300 + np.arange(4),
        inverse_frequencies,
        pairing="interleaved",
        rotary_dim=16,
    )


def test_from_hf_config_without_a_head_width_names_what_it_needs():
    with pytest.raises(ValueError, match=r"head_dim.*\['rope_theta'\]"):
        RotaryEmbedding.from_hf_config({"rope_theta": 10000.0})


def test_from_hf_config_head_dim_of_a_string_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"\['head_dim'\]` must be a positive integer.*'16'"):
        RotaryEmbedding.from_hf_config({"head_dim": "16", "partial_rotary_factor": 0.5})


@pytest.mark.parametrize("name", ["inputs", "positions"])
def test_strings_are_refused_naming_them_before_keras_converts_them(name):
    # JAX parses strings of digits as numbers; TensorFlow's cast refuses them.
    arguments = {"inputs": np.ones((1, 4, 2, 8), "float32"), "positions": None}
    arguments[name] = np.full((1, 4, 2, 8), "1") if name == "inputs" else np.array(["0"] * 4)
    with pytest.raises(ValueError, match=f"`{name}` must hold .*dtype <U1"):
        RotaryEmbedding()(arguments["inputs"], positions=arguments["positions"])


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


# Configs as the public models' config.json files give them (the long lists
# of a model's layers and factors written as the comprehensions they equal).

# lmsys/longchat-7b-16k, saved again by transformers 5: rope_parameters
# keeps the legacy "type" beside the "rope_type" it added.
LONGCHAT_RESAVED = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 2048,
    "rope_parameters": {
        "factor": 8.0,
        "rope_theta": 10000.0,
        "rope_type": "linear",
        "type": "linear",
    },
}

# deepseek-ai/DeepSeek-V3: YaRN with DeepSeek's mscale pair, the legacy
# "type" key, no rope_interleave (transformers' default, True).
DEEPSEEK_V3_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
}

# The same, saved again by transformers 5.
DEEPSEEK_V3_RESAVED = {
    **{
        key: value
        for key, value in DEEPSEEK_V3_CONFIG.items()
        if key not in ("rope_scaling", "rope_theta")
    },
    "rope_interleave": True,
    "rope_parameters": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 40.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_type": "yarn",
        "type": "yarn",
    },
}

# deepseek-ai/DeepSeek-V2-Lite: adjacent pairs as complex numbers.
DEEPSEEK_V2_LITE_CONFIG = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
}

GEMMA_3_LAYER_TYPES = [
    "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)
]
# google/gemma-3-4b-it's text_config as transformers 5 writes it.
GEMMA_3_4B_TEXT = {
    "model_type": "gemma3_text",
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "sliding_window": 1024,
    "layer_types": GEMMA_3_LAYER_TYPES,
    "rope_parameters": {
        "full_attention": {
            "rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
}
# ... and as transformers 4.50 wrote it.
GEMMA_3_4B_TEXT_LEGACY = {
    "model_type": "gemma3_text",
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
}
GEMMA_3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 256,
    "text_config": GEMMA_3_4B_TEXT_LEGACY,
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
}

# A Gemma 4 text_config: proportional RoPE on the 512 wide heads of full
# attention, a quarter of the pairs turning.
GEMMA_4_TEXT = {
    "model_type": "gemma4_text",
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "global_head_dim": 512,
    "max_position_embeddings": 131072,
    "sliding_window": 512,
    "layer_types": [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
        for i in range(42)
    ],
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
}

# internlm/internlm2-chat-7b's dynamic NTK, with a trained length also
# stated as original_max_position_embeddings, as Phi-3 style configs do.
DYNAMIC_CONFIG = {
    "architectures": ["InternLM2ForCausalLM"],
    "model_type": "internlm2",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "original_max_position_embeddings": 4096,
    "rope_theta": 1000000,
    "rope_scaling": {"type": "dynamic", "factor": 2.0},
}

# microsoft/Phi-3-vision-128k-instruct: LongRoPE under its older name "su",
# 48 factors for heads of 3072 / 32 = 96 features.
PHI_3_VISION_CONFIG = {
    "architectures": ["Phi3VForCausalLM"],
    "model_type": "phi3_v",
    "hidden_size": 3072,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "long_factor": np.geomspace(1.0, 60.0, 48).round(4).tolist(),
        "short_factor": np.linspace(1.0, 1.3, 48).round(4).tolist(),
        "type": "su",
    },
}


def rope_slice_logits_tolerance(query_rope, key_rope, positions, frequencies,
                                attention_factor):
    """How far float32 rotation may move each logit, `(batch, heads, q, k)`.

    As in test_scores_depend_on_relative_position_only: pair i of a logit
    moves by at most |q_i| |k_i| (ANGLE_RTOL * (|m w_i| + |n w_i|) +
    4 * OUTPUT_RTOL), times the attention factor twice. The pairs are
    (2i, 2i + 1) of the inputs.
    """
    query_norms = pair_norms(query_rope.astype("float64"), "interleaved", 64)
    key_norms = pair_norms(key_rope.astype("float64"), "interleaved", 64)[:, :, 0]
    errors = ANGLE_RTOL * np.abs(np.outer(positions, frequencies))  # (seq, 32)
    return attention_factor**2 * (
        np.einsum("bqhi,bki,qi->bhqk", query_norms, key_norms, errors)
        + np.einsum("bqhi,bki,ki->bhqk", query_norms, key_norms, errors)
        + np.einsum("bqhi,bki->bhqk", query_norms, key_norms) * 4 * OUTPUT_RTOL
    )  # (batch, heads, q, k)


def multi_head_latent_logits(query, key_nope, key_rope):
    """Query-key logits of multi-head latent attention: `(batch, heads, q, k)`.

    Queries are `(batch, q, heads, nope + rope)`; keys have a nope part per
    head, `(batch, k, heads, nope)`, and a rope part that all heads share,
    `(batch, k, 1, rope)`.
    """
    heads = query.shape[2]
    key = np.concatenate(
        [key_nope, np.repeat(key_rope, heads, axis=2)], -1
    ).astype("float64")
    return np.einsum("bqhd,bkhd->bhqk", query.astype("float64"), key)


@pytest.mark.parametrize(
    "config, reference_rotation",
    [
        (DEEPSEEK_V3_CONFIG, references.rotary_deinterleaved),
        (DEEPSEEK_V3_RESAVED, references.rotary_deinterleaved),
        (DEEPSEEK_V2_LITE_CONFIG, references.rotary_complex),
    ],
    ids=["deepseek-v3", "deepseek-v3-resaved", "deepseek-v2-lite"],
)
def test_from_hf_config_deepseek_rotates_the_rope_slice_interleaved(
    config, reference_rotation
):
    layer = RotaryEmbedding.from_hf_config(config)
    scaling = config.get("rope_scaling") or config["rope_parameters"]
    assert (layer.pairing, layer.rotary_dim) == ("interleaved", None)
    assert layer.max_wavelength == 10000.0
    assert layer.scaling == {
        "rope_type": "yarn",
        **{
            key: value
            for key, value in scaling.items()
            if key not in ("type", "rope_theta", "rope_type")
        },
    }
    # The YaRN frequencies spaced over qk_rope_head_dim = 64, and
    # transformers' attention factor mscale(40, mscale) / mscale(40,
    # mscale_all_dim) = 1, not 0.1 ln 40 + 1.
    rope_dim, nope_dim = config["qk_rope_head_dim"], config["qk_nope_head_dim"]
    yarn = {
        key: scaling[key]
        for key in (
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
        )
    }
    base = config.get("rope_theta") or scaling["rope_theta"]
    frequencies, attention_factor = references.rope_inverse_frequencies(
        rope_dim, base, {"rope_type": "yarn", **yarn}
    )
    log_factor = math.log(scaling["factor"])
    mscale = 0.1 * scaling["mscale"] * log_factor + 1.0
    mscale_all_dim = 0.1 * scaling["mscale_all_dim"] * log_factor + 1.0
    assert attention_factor == pytest.approx(mscale / mscale_all_dim, rel=1e-12)
    assert attention_factor == 1.0
    # Queries (batch, seq, heads, nope + rope); keys' nope part per head,
    # their rope part one for all heads. Positions past the trained 4096.
    positions = np.array([0, 1, 2, 4095, 4096, 6000])
    query = random_inputs((1, 6, 3, nope_dim + rope_dim), seed=1)
    key_nope = random_inputs((1, 6, 3, nope_dim), seed=2)
    key_rope = random_inputs((1, 6, 1, rope_dim), seed=3)
    query_rope = query[..., nope_dim:]
    def reference(x):
        return reference_rotation(x, positions, frequencies, attention_factor)

    expected = multi_head_latent_logits(
        np.concatenate([query[..., :nope_dim], reference(query_rope)], -1),
        key_nope,
        reference(key_rope),
    )
    rotated_query = np.concatenate(
        [query[..., :nope_dim], numpy(layer(query_rope, positions=positions))], -1
    )
    logits = multi_head_latent_logits(
        rotated_query, key_nope, numpy(layer(key_rope, positions=positions))
    )
    tolerance = rope_slice_logits_tolerance(
        query_rope, key_rope, positions, frequencies, attention_factor
    )
    assert np.all(np.abs(logits - expected) <= tolerance)
    # The interleaved output, pair by pair.
    assert_rotated(
        layer(query_rope, positions=positions),
        query_rope,
        positions,
        frequencies,
        attention_factor,
        pairing="interleaved",
    )
    # The half pairing over the same slice, as before, is off by order 1.
    half = RotaryEmbedding(max_wavelength=10000.0, scaling=layer.scaling)
    half_query = numpy(half(query_rope, positions=positions))
    half_logits = multi_head_latent_logits(
        np.concatenate([query[..., :nope_dim], half_query], -1),
        key_nope,
        numpy(half(key_rope, positions=positions)),
    )
    assert np.abs(half_logits - expected).max() > max(1.0, 100 * tolerance.max())


def test_from_hf_config_deepseek_v3_without_interleave_pairs_halves():
    config = {**DEEPSEEK_V3_CONFIG, "rope_interleave": False}
    layer = RotaryEmbedding.from_hf_config(config)
    assert (layer.pairing, layer.rotary_dim) == ("half", None)
    frequencies, attention_factor = references.rope_inverse_frequencies(
        64,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
    )
    key_rope = random_inputs((1, 4, 1, 64))
    assert_rotated(
        layer(key_rope, start_index=8000),
        key_rope,
        8000 + np.arange(4),
        frequencies,
        attention_factor,
    )


def test_from_hf_config_other_latent_attention_needs_a_known_model_type():
    config = {**DEEPSEEK_V3_CONFIG, "model_type": "kimi_k2"}
    with pytest.raises(ValueError, match=r"qk_rope_head_dim.*model_type='kimi_k2'"):
        RotaryEmbedding.from_hf_config(config)


@pytest.mark.parametrize(
    "config, layer_type, expected_scaling",
    [
        (LONGCHAT_RESAVED, None, {"rope_type": "linear", "factor": 8.0}),
        (
            # Qwen3's model card's yarn, saved again: both keys.
            {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "head_dim": 128,
                "max_position_embeddings": 131072,
                "layer_types": ["full_attention"] * 36,
                "rope_theta": 1000000,
                "rope_scaling": {
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                    "rope_type": "yarn",
                    "type": "yarn",
                },
            },
            "full_attention",
            {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        ),
        (
            # Where the two disagree, transformers goes by "rope_type".
            {
                **LONGCHAT_RESAVED,
                "rope_parameters": {
                    **LONGCHAT_RESAVED["rope_parameters"],
                    "type": "dynamic",
                },
            },
            None,
            {"rope_type": "linear", "factor": 8.0},
        ),
    ],
    ids=["longchat", "qwen3-yarn", "disagreeing"],
)
def test_from_hf_config_with_both_type_and_rope_type(
    config, layer_type, expected_scaling
):
    original = copy.deepcopy(config)
    layer = RotaryEmbedding.from_hf_config(config, layer_type=layer_type)
    assert layer.scaling == expected_scaling
    assert config == original
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // config["num_attention_heads"]
    )
    base = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
    assert layer.max_wavelength == base
    frequencies, attention_factor = references.rope_inverse_frequencies(
        head_dim, base, expected_scaling
    )
    inputs = random_inputs((1, 4, 2, head_dim))
    assert_rotated(
        layer(inputs, start_index=40000),
        inputs,
        40000 + np.arange(4),
        frequencies,
        attention_factor,
    )


@pytest.mark.parametrize(
    "config", [GEMMA_3_4B_TEXT, GEMMA_3_4B_TEXT_LEGACY], ids=["nested", "legacy"]
)
def test_from_hf_config_gemma_3_per_layer_type(config):
    full = RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
    assert full.max_wavelength == 1000000.0
    assert full.scaling == {"rope_type": "linear", "factor": 8.0}
    local = RotaryEmbedding.from_hf_config(config, layer_type="sliding_attention")
    assert local.max_wavelength == 10000.0
    assert local.scaling is None
    inputs = random_inputs((1, 4, 2, config["head_dim"]))
    for layer, frequencies in [
        (
            full,
            references.rope_inverse_frequencies(
                256, 1000000.0, {"rope_type": "linear", "factor": 8.0}
            )[0],
        ),
        (local, references.rope_inverse_frequencies(256, 10000.0)[0]),
    ]:
        assert_rotated(
            layer(inputs, start_index=30000),
            inputs,
            30000 + np.arange(4),
            frequencies,
        )


@pytest.mark.parametrize(
    "config, layer_type, message",
    [
        (
            GEMMA_3_4B_TEXT,
            None,
            r"`config\['rope_parameters'\]` holds one RoPE per layer type: "
            r"\['full_attention', 'sliding_attention'\]\. Pass `layer_type=`.*"
            r"Received: layer_type=None",
        ),
        (
            GEMMA_3_4B_TEXT,
            "chunked_attention",
            r"\['full_attention', 'sliding_attention'\].*"
            r"layer_type='chunked_attention'",
        ),
        (
            GEMMA_3_4B_TEXT_LEGACY,
            None,
            r"`rope_local_base_freq`.*\['full_attention', 'sliding_attention'\]"
            r".*layer_type=None",
        ),
        (
            GEMMA_4_TEXT,
            "sliding_window",
            r"\['full_attention', 'sliding_attention'\].*layer_type='sliding_window'",
        ),
        (
            LLAMA_3_1_CONFIG,
            "full_attention",
            r"one for all its layers, whose types are \[\]\. "
            r"Received: layer_type='full_attention'",
        ),
        (
            {**LLAMA_3_1_CONFIG, "layer_types": ["full_attention"] * 32},
            "sliding_attention",
            r"\['full_attention'\]\. Received: layer_type='sliding_attention'",
        ),
        (
            # A wrapper whose text_config lacks the head width fails on that,
            # not on its layer types.
            {**GEMMA_3_4B, "text_config": {"rope_theta": 1000000.0}},
            "full_attention",
            r"`config\['text_config'\]` must give `head_dim`",
        ),
    ],
    ids=[
        "nested-missing",
        "nested-absent",
        "legacy-missing",
        "gemma-4-absent",
        "flat",
        "flat-other-type",
        "multimodal",
    ],
)
def test_from_hf_config_layer_type_mistakes_name_the_layer_types(
    config, layer_type, message
):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding.from_hf_config(config, layer_type=layer_type)


def test_from_hf_config_gemma_4_proportional():
    full = RotaryEmbedding.from_hf_config(GEMMA_4_TEXT, layer_type="full_attention")
    assert full.max_wavelength == 1000000.0
    assert (full.pairing, full.rotary_dim) == ("half", None)
    assert full.scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
    # Applied to the global_head_dim = 512 wide heads of full attention:
    # pairs (i, i + 256) for i < 64 turn at 1e6^(-2i / 512), the others not.
    inputs = random_inputs((1, 4, 2, GEMMA_4_TEXT["global_head_dim"]))
    frequencies = references.proportional_inverse_frequencies(512, 1000000.0, 0.25)
    outputs = full(inputs, start_index=100000)
    assert_rotated(outputs, inputs, 100000 + np.arange(4), frequencies)
    still = np.r_[64:256, 320:512]
    np.testing.assert_array_equal(numpy(outputs)[..., still], inputs[..., still])
    assert np.all(numpy(outputs)[..., :64] != inputs[..., :64])
    local = RotaryEmbedding.from_hf_config(GEMMA_4_TEXT, layer_type="sliding_attention")
    assert (local.max_wavelength, local.scaling) == (10000.0, None)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"type": "dynamic", "factor": 2.0},
        # transformers ignores this key of a dynamic schedule (with a warning).
        {"type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4096},
    ],
    ids=["top-level-original", "original-in-schedule"],
)
def test_from_hf_config_dynamic_trained_length_is_max_position_embeddings(
    rope_scaling,
):
    config = {**DYNAMIC_CONFIG, "rope_scaling": rope_scaling}
    layer = RotaryEmbedding.from_hf_config(config)
    trained = config["max_position_embeddings"]
    assert layer.scaling == {
        "rope_type": "dynamic",
        "factor": 2.0,
        "original_max_position_embeddings": trained,
    }
    inputs = random_inputs((1, 5, 2, 128))
    for start_index in (19995, 39995):
        # The current length is the largest position + 1.
        length = start_index + 5
        stretch = max(2.0 * length / trained - 1.0, 1.0)
        base = 1000000.0 * stretch ** (128 / 126)
        frequencies = np.array([base ** (-2.0 * i / 128) for i in range(64)])
        assert_rotated(
            layer(inputs, start_index=start_index),
            inputs,
            start_index + np.arange(5),
            frequencies,
        )
    # Below max_position_embeddings the frequencies are the default ones,
    # where a trained length of 4096 would have stretched them.
    default = references.rope_inverse_frequencies(128, 1000000.0)[0]
    assert_rotated(
        layer(inputs, start_index=19995), inputs, 19995 + np.arange(5), default
    )


def test_from_hf_config_dynamic_needs_max_position_embeddings():
    config = {k: v for k, v in DYNAMIC_CONFIG.items() if k != "max_position_embeddings"}
    with pytest.raises(ValueError, match=r"max_position_embeddings.*'dynamic'"):
        RotaryEmbedding.from_hf_config(config)


def test_from_hf_config_phi_3_vision_su_is_longrope():
    layer = RotaryEmbedding.from_hf_config(PHI_3_VISION_CONFIG)
    short = PHI_3_VISION_CONFIG["rope_scaling"]["short_factor"]
    long = PHI_3_VISION_CONFIG["rope_scaling"]["long_factor"]
    assert layer.scaling == {
        "rope_type": "longrope",
        "short_factor": short,
        "long_factor": long,
        "original_max_position_embeddings": 4096,
        "factor": 32.0,
    }
    # Default frequencies over 96 features, divided by the short factors up
    # to 4096 positions and by the long ones past them; the attention factor
    # sqrt(1 + ln(131072 / 4096) / ln 4096).
    attention_factor = math.sqrt(1.0 + math.log(32.0) / math.log(4096.0))
    inputs = random_inputs((1, 4, 2, 96))
    for start_index, factors in ((4092, short), (4093, long), (100000, long)):
        frequencies = np.array(
            [1.0 / (factors[i] * 10000.0 ** (2.0 * i / 96)) for i in range(48)]
        )
        assert_rotated(
            layer(inputs, start_index=start_index),
            inputs,
            start_index + np.arange(4),
            frequencies,
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
        {"positions": np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13], list(range(9))])},
    ):
        np.testing.assert_array_equal(
            numpy(ours(inputs, **call_kwargs)),
            numpy(hub(inputs, **call_kwargs)),
            err_msg=str(call_kwargs),
        )
    # From a start index, the table of 0, 1, ... turned by the start
    # (`ops.shifted_cos_sin`) rounds the angles s w and n w apart, where
    # keras-hub rounds (s + n) w: each is within float32 angle rounding of
    # the exact rotation, so the two are within twice that of each other.
    start_index = 4093
    largest_angle = start_index + shape[1]  # the highest frequency is <= 1
    largest_norm = math.sqrt(2.0) * np.max(np.abs(inputs))
    np.testing.assert_allclose(
        numpy(ours(inputs, start_index=start_index)),
        numpy(hub(inputs, start_index=start_index)),
        rtol=0,
        atol=2 * (ANGLE_RTOL * largest_angle + OUTPUT_RTOL) * largest_norm,
    )


@pytest.mark.parametrize("start_index", [0, 7, 4093, 100000])
def test_shifted_cos_sin_is_the_table_of_the_shifted_positions(start_index):
    frequencies = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)  # float64
    cos, sin = ops.shifted_cos_sin(
        12, keras.ops.convert_to_tensor(start_index), frequencies
    )
    assert cos.shape == sin.shape == (12, 32)
    assert keras.backend.standardize_dtype(cos.dtype) == "float32"
    assert keras.backend.standardize_dtype(sin.dtype) == "float32"
    angles = (start_index + np.arange(12))[:, None] * frequencies  # float64
    # The float32 angles s w and n w, each off by ANGLE_RTOL of itself.
    tolerance = ANGLE_RTOL * (start_index + 12) + OUTPUT_RTOL
    np.testing.assert_allclose(numpy(cos), np.cos(angles), rtol=0, atol=tolerance)
    np.testing.assert_allclose(numpy(sin), np.sin(angles), rtol=0, atol=tolerance)


@tensorflow_only  # reads XLA's optimized HLO through TensorFlow
def test_a_start_index_read_at_run_time_computes_the_sines_once():
    # Under XLA, cos((s + n) w) with s read at run time is fused into the
    # rotation and computed for every batch row and head; the layer turns
    # the fixed table by s instead, so the only sines left in the compiled
    # program are those of s w, one per frequency.
    layer = RotaryEmbedding()
    import tensorflow as tf

    start_index = tf.Variable(1000)
    call = tf.function(
        lambda inputs: layer(inputs, start_index=start_index), jit_compile=True
    )
    inputs = random_inputs((2, 16, 3, 64))
    hlo = call.experimental_get_compiler_ir(inputs)(stage="optimized_hlo")
    shapes = re.findall(r"= (f32\[[\d,]*\])\S* (?:sine|cosine)\(", hlo)
    # XLA may compute them in more than one small fusion.
    assert shapes and set(shapes) == {"f32[32]"}
    frequencies = 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64)
    assert_rotated(call(inputs), inputs, 1000 + np.arange(16), frequencies)


@settings(deadline=None, max_examples=40)
@given(
    data=st.data(),
    half_dim=st.integers(1, 16),
    positions=st.tuples(st.integers(0, 4000), st.integers(0, 4000)),
    shift=st.integers(0, 4000),
    pairing=st.sampled_from(ops.PAIRINGS),
)
def test_scores_depend_on_relative_position_only(
    data, half_dim, positions, shift, pairing
):
    dim = 2 * half_dim
    vectors = hnp.arrays(
        "float32", dim, elements=st.floats(-4, 4, width=32, allow_subnormal=False)
    )
    query, key = data.draw(vectors), data.draw(vectors)
    m, n = positions
    rotated = numpy(
        RotaryEmbedding(pairing=pairing)(
            np.stack([query, key, query, key])[None],  # (1, 4, dim)
            positions=[m, n, m + shift, n + shift],
        )
    )[0].astype("float64")
    score, shifted_score = rotated[0] @ rotated[1], rotated[2] @ rotated[3]
    # Each rotated pair is off by its norm times (ANGLE_RTOL * angle +
    # OUTPUT_RTOL), so pair i of a score by |q_i| |k_i| times the sum of those
    # at both positions; the float64 dot products add nothing that matters.
    inverse_frequencies, _ = references.rope_inverse_frequencies(dim)
    tolerance = np.sum(
        pair_norms(query.astype("float64"), pairing, dim)
        * pair_norms(key.astype("float64"), pairing, dim)
        * (
            ANGLE_RTOL * inverse_frequencies * (2 * m + 2 * n + 2 * shift)
            + 4 * OUTPUT_RTOL
        )
    )
    # A rotated entry below float32's smallest normal number may be flushed
    # to zero (XLA on the CPU): off by that much, times the other vector's
    # entries, in each of the four rotated vectors.
    tolerance += (
        4
        * np.finfo("float32").tiny
        * (np.abs(query.astype("float64")).sum() + np.abs(key.astype("float64")).sum())
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
    layer = RotaryEmbedding(pairing="interleaved", rotary_dim=6)
    inputs = random_inputs((2, 30, 3, 8))
    full = numpy(layer(inputs))
    for start_index in (
        0,
        7,
        keras.ops.convert_to_tensor(12),
        keras.ops.convert_to_tensor(np.int64(29)),  # int32 on JAX without x64
    ):
        index = int(start_index)
        part = layer(inputs[:, index : index + 1], start_index=start_index)
        assert_same_rotation(numpy(part), full[:, index : index + 1])
    chunk = layer(inputs[:, 20:25], start_index=20)
    assert_same_rotation(numpy(chunk), full[:, 20:25])
    decode_step = compiled(
        lambda token, start_index: layer(token, start_index=start_index)
    )
    for index in (0, 13, 29):
        step = decode_step(
            inputs[:, index : index + 1], keras.ops.convert_to_tensor(index)
        )
        assert_same_rotation(numpy(step), full[:, index : index + 1])


@tensorflow_only  # one trace for every length: TensorFlow's dynamic shapes
def test_start_index_in_a_graph_of_unknown_lengths_equals_slicing():
    import tensorflow as tf

    layer = RotaryEmbedding(pairing="interleaved", rotary_dim=6)
    inputs = random_inputs((2, 30, 3, 8))
    full = numpy(layer(inputs))

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
        assert_same_rotation(numpy(step), full[:, index : index + 1])
    assert decode_step.experimental_get_tracing_count() == 1


def test_mixed_bfloat16_is_right_near_position_32768():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = RotaryEmbedding(rotary_dim=48)
    # Inputs bfloat16 holds exactly, so that only the rotation is judged.
    inputs = np.random.default_rng(0).uniform(-1, 1, (2, 16, 2, 64))
    inputs = numpy(keras.ops.cast(keras.ops.cast(inputs, "bfloat16"), "float32"))
    outputs = layer(inputs, start_index=32760)
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    outputs = numpy(keras.ops.cast(outputs, "float32")).astype("float64")
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
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    inverse_frequencies, _ = references.rope_inverse_frequencies(8)
    expected = references.rotary(inputs, positions, inverse_frequencies)
    # As above: bfloat16 outputs, float32 angles up to 32768.
    error = np.abs(
        numpy(keras.ops.cast(outputs, "float32")).astype("float64") - expected
    )
    assert error.max() <= 2e-2, error.max()


def rotary_functional_model():
    """Functional: (batch, seq, 8) of any length -> 2 heads -> RoPE -> Dense."""
    inputs = keras.Input(shape=(None, 8))
    heads = keras.layers.Reshape((-1, 2, 4))(keras.layers.Dense(8)(inputs))
    rotated = RotaryEmbedding(
        pairing="interleaved",
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
        optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=XLA
    )
    assert model.jit_compile == XLA
    before = [numpy(weight.value) for weight in model.trainable_weights]
    for length in (3, 11):
        features = random_inputs((4, length, 8), seed=length)
        loss = model.train_on_batch(features, np.ones((4, length, 1), "float32"))
        assert np.isfinite(loss)
        # XLA's cos and sin may differ from TensorFlow's kernels by an ulp.
        np.testing.assert_allclose(
            model.predict(features, verbose=0), numpy(model(features)), atol=1e-5
        )
    for weight, old in zip(model.trainable_weights, before):
        assert not np.array_equal(numpy(weight.value), old)


def test_unknown_length_in_a_functional_model():
    inputs = keras.Input(shape=(None, 3, 8))
    outputs = RotaryEmbedding(pairing="interleaved")(inputs)
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
            pairing="interleaved",
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
        pairing="interleaved",
        rotary_dim=6,
        scaling=scaling,
        sequence_axis=2,
        feature_axis=-1,
    )
    config = layer.get_config()
    assert {
        "max_wavelength": 500000.0,
        "pairing": "interleaved",
        "rotary_dim": 6,
        "scaling": scaling,
        "sequence_axis": 2,
        "feature_axis": -1,
    }.items() <= config.items()
    rebuilt = RotaryEmbedding.from_config(config)
    assert rebuilt.get_config() == config
    inputs = random_inputs((2, 3, 5, 8))
    np.testing.assert_array_equal(numpy(rebuilt(inputs)), numpy(layer(inputs)))
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
        ({"pairing": "concat"}, "pairing='concat'"),
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
        # All but the first pair would turn at frequency 0: unrotated.
        ({"max_wavelength": float("inf")}, r"finite.*max_wavelength=inf"),
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
        ({}, (1, 3, 8), {"positions": np.arange(5)}, r"positions of .*shape \(5,\)"),
        (
            {},
            (2, 3, 8),
            {"positions": np.zeros((2, 4), "int32")},
            r"positions of .*shape \(2, 4\)",
        ),
        ({}, (1, 3, 8), {"positions": np.zeros((1, 1, 3))}, "positions"),
        (
            {},
            (2, 3, 8),
            {"positions": np.zeros((3, 3), "int32")},
            r"batch size 2.*positions of .*shape \(3, 3\)",
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
