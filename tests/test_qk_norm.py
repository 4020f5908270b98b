"""Query/key normalisation (`qk_norm`), against float64 references.

The references follow the models' own definitions: Qwen3 divides each
head's projected queries and keys by their root mean square over the head's
features and multiplies by a learned scale (`Qwen3RMSNorm`), before RoPE;
Llama 4 divides them the same way without a scale (`Llama4TextL2Norm`),
after RoPE; OLMo 2 divides the whole projection, all heads at once, with a
learned scale of each feature (`Olmo2RMSNorm`), before RoPE.
"""

import keras
import numpy as np
import pytest

from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RotaryEmbedding
from tests import references
from tests.backend import numpy
from tests.test_positional_multi_head_attention import BATCH
from tests.test_positional_multi_head_attention import FEATURES
from tests.test_positional_multi_head_attention import KEY_DIM
from tests.test_positional_multi_head_attention import LENGTH
from tests.test_positional_multi_head_attention import assert_close
from tests.test_positional_multi_head_attention import per_batch
from tests.test_positional_multi_head_attention import random_inputs
from tests.test_positional_multi_head_attention import randomize_weights
from tests.test_positional_multi_head_attention import reference_attention

HEADS = 4
KEY_VALUE_HEADS = 2
EPSILON = 1e-5
SLOTS = 9
PREFILL = 4
# Each model's normalisation: `qk_norm`, and whether after RoPE.
MODELS = {
    "qwen3": ("head", False),
    "llama4": ("head_unscaled", True),
    "olmo2": ("projection", False),
}


def normalised_attention(model, position=True, seed=1):
    qk_norm, after = MODELS[model]
    layer = PositionalMultiHeadAttention(
        HEADS,
        KEY_DIM,
        position=RotaryEmbedding(max_wavelength=100.0) if position else None,
        num_key_value_heads=KEY_VALUE_HEADS,
        qk_norm=qk_norm,
        qk_norm_after_position=after,
        qk_norm_epsilon=EPSILON,
    )
    tokens = np.zeros((1, 1, FEATURES), "float32")
    layer(tokens, tokens)
    randomize_weights(layer, seed)
    return layer


def float64_rms_norm(x, scale, axes):
    """`x / sqrt(mean(x ** 2) + eps) * scale` over `axes`, in float64."""
    normalised = x / np.sqrt(np.mean(x**2, axis=axes, keepdims=True) + EPSILON)
    return normalised if scale is None else normalised * scale


def transform(layer, model, position=True):
    """The reference's queries and keys: normalised and rotated in the model's order."""
    qk_norm, after = MODELS[model]
    axes = (-2, -1) if qk_norm == "projection" else (-1,)

    def scale(role):
        if qk_norm == "head_unscaled":
            return None
        return np.asarray(numpy(getattr(layer, f"{role}_norm_scale").value), "float64")

    def rotated(x, positions):
        if not position:
            return x
        inverse_frequencies, _ = references.rope_inverse_frequencies(KEY_DIM, 100.0)
        return references.rotary(x, positions, inverse_frequencies)

    def apply(queries, keys):
        query_positions = per_batch(None, queries.shape[0], queries.shape[1])
        key_positions = per_batch(None, keys.shape[0], keys.shape[1])
        if not after:
            queries = float64_rms_norm(queries, scale("query"), axes)
            keys = float64_rms_norm(keys, scale("key"), axes)
        queries, keys = rotated(queries, query_positions), rotated(keys, key_positions)
        if after:
            queries = float64_rms_norm(queries, scale("query"), axes)
            keys = float64_rms_norm(keys, scale("key"), axes)
        return queries, keys

    return apply


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("model", MODELS)
def test_normalised_queries_and_keys_equal_float64_reference(model, causal):
    layer = normalised_attention(model)
    if model == "olmo2":
        # One scale per feature of every head: OLMo 2's over the projection.
        assert tuple(layer.query_norm_scale.shape) == (HEADS, KEY_DIM)
        assert tuple(layer.key_norm_scale.shape) == (KEY_VALUE_HEADS, KEY_DIM)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    output, weights = layer(
        tokens, tokens, use_causal_mask=causal, return_attention_scores=True
    )
    expected_output, expected_weights = reference_attention(
        layer, tokens, tokens, causal=causal, transform_query_key=transform(layer, model)
    )
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


@pytest.mark.parametrize("model", MODELS)
def test_the_order_of_normalising_and_rotating_shows(model):
    # Normalised in the other order, the reference differs: the test above
    # tells the orders apart (RoPE keeps a head's norm, not OLMo 2's
    # per-feature scale's effect, nor a projection's mean over heads).
    layer = normalised_attention(model)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    qk_norm, after = MODELS[model]
    MODELS["swapped"] = (qk_norm, not after)
    try:
        swapped, _ = reference_attention(
            layer, tokens, tokens, transform_query_key=transform(layer, "swapped")
        )
    finally:
        del MODELS["swapped"]
    output = layer(tokens, tokens)
    if qk_norm == "head_unscaled":
        # An unscaled norm over a head commutes with its rotation.
        assert_close(output, swapped)
    else:
        assert not np.allclose(numpy(output), swapped, atol=1e-3)


@pytest.mark.parametrize("model", MODELS)
def test_without_position_the_queries_and_keys_are_normalised(model):
    layer = normalised_attention(model, position=False)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    expected, _ = reference_attention(
        layer, tokens, tokens, transform_query_key=transform(layer, model, position=False)
    )
    assert_close(layer(tokens, tokens), expected)


@pytest.mark.parametrize("model", MODELS)
def test_cache_holds_normalised_keys_and_decodes_as_a_causal_pass(model):
    layer = normalised_attention(model)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    expected, _ = reference_attention(
        layer, tokens, tokens, causal=True, transform_query_key=transform(layer, model)
    )
    cache = keras.ops.zeros((BATCH, 2, SLOTS, KEY_VALUE_HEADS, KEY_DIM))
    output, cache = layer(
        tokens[:, :PREFILL], tokens[:, :PREFILL],
        cache=cache, cache_update_index=0, use_causal_mask=True,
    )
    assert_close(output, expected[:, :PREFILL])
    for step in range(PREFILL, LENGTH):
        token = tokens[:, step : step + 1]
        output, cache = layer(
            token, token, cache=cache, cache_update_index=step, use_causal_mask=True
        )
        assert_close(output, expected[:, step : step + 1], err_msg=f"step {step}")


def test_normalisation_is_in_float32_under_mixed_precision():
    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=RotaryEmbedding(), qk_norm="head",
        dtype="mixed_bfloat16",
    )
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    output = layer(tokens, tokens)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(layer.query_norm_scale.dtype) == "float32"


def test_config_and_keras_file_keep_the_normalisation(tmp_path):
    inputs = keras.Input((None, FEATURES))
    attention = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=RotaryEmbedding(), num_key_value_heads=2,
        qk_norm="projection", qk_norm_epsilon=EPSILON,
    )
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    randomize_weights(model)
    config = attention.get_config()
    assert (config["qk_norm"], config["qk_norm_after_position"], config["qk_norm_epsilon"]) == (
        "projection", False, EPSILON
    )
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    path = tmp_path / "normalised.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(numpy(loaded(tokens)), numpy(model(tokens)))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"qk_norm": "rms"}, "qk_norm='rms'"),
        ({"qk_norm": True}, "qk_norm=True"),
        ({"qk_norm": "head", "qk_norm_after_position": 1}, "qk_norm_after_position=1"),
        ({"qk_norm": "head", "qk_norm_epsilon": 0.0}, "qk_norm_epsilon=0.0"),
        ({"qk_norm": "head", "qk_norm_epsilon": "1e-6"}, "qk_norm_epsilon='1e-6'"),
    ],
)
def test_bad_normalisation_raises_value_error_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        PositionalMultiHeadAttention(HEADS, KEY_DIM, **kwargs)
