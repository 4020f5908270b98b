"""AttentionTemperature (Llama 4's NoPE layers) against transformers, and its contract.

The fixture `llama4_attention.npz` holds weights, inputs, logits, weights
and outputs of transformers' `Llama4TextAttention` on a tiny random config,
a layer with RoPE and one without (temperature on), in one causal pass and
in cached decoding (`fixtures/generate_llama4_attention.py`). The formula
itself is checked against float64 NumPy below.
"""

import json
import math
import pathlib

import keras
import numpy as np
import pytest

from keras_posenc import AttentionContext
from keras_posenc import hf_attention
from keras_posenc import AttentionTemperature
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RotaryEmbedding
from tests.backend import BACKEND
from tests.backend import compiled
from tests.backend import numpy

FIXTURE = np.load(pathlib.Path(__file__).parent / "fixtures" / "llama4_attention.npz")
CONFIG = json.loads(str(FIXTURE["config"]))
HEADS, HEAD_DIM, HIDDEN = (
    CONFIG["num_attention_heads"],
    CONFIG["head_dim"],
    CONFIG["hidden_size"],
)
PREFILL = 5


def reference_factors(positions, floor_scale, attn_scale):
    """Llama 4's temperature, float64: log1p(floor((p + 1) / floor_scale)) * a + 1."""
    positions = np.asarray(positions, np.float64)
    return np.log1p(np.floor((positions + 1.0) / floor_scale)) * attn_scale + 1.0


def torch_dense(weight):
    """A torch Linear's `(heads * dim, in)` weight as Keras' `(in, heads, dim)` kernel."""
    return weight.T.reshape(weight.shape[1], HEADS, -1)


def llama4_attention(layer):
    """The Keras attention of fixture layer `layer` (0: RoPE, 1: none), from the config."""
    position = hf_attention.positions_per_layer(CONFIG)[layer]
    attention = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=HEAD_DIM, use_bias=False, position=position
    )
    tokens = np.zeros((1, 3, HIDDEN), "float32")
    attention(tokens, tokens)
    name = ("rope", "nope")[layer]
    attention._query_dense.kernel.assign(torch_dense(FIXTURE[f"{name}/q_proj.weight"]))
    attention._key_dense.kernel.assign(torch_dense(FIXTURE[f"{name}/k_proj.weight"]))
    attention._value_dense.kernel.assign(torch_dense(FIXTURE[f"{name}/v_proj.weight"]))
    output = FIXTURE[f"{name}/o_proj.weight"]  # (hidden, heads * dim)
    attention._output_dense.kernel.assign(output.T.reshape(HEADS, HEAD_DIM, HIDDEN))
    return attention


def logits(attention, tokens, query_positions, key_positions):
    """`q . k / sqrt(d)` as the attention forms them: projections, then the scheme."""
    query = attention._query_dense(tokens[:, query_positions])
    key = attention._key_dense(tokens[:, key_positions])
    query, key = attention.position.transform_query_key(
        query,
        key,
        AttentionContext(
            query_positions=keras.ops.convert_to_tensor(query_positions[None], "int32"),
            key_positions=keras.ops.convert_to_tensor(key_positions[None], "int32"),
        ),
    )
    query = query * attention.position.logits_scale(HEAD_DIM)
    return numpy(keras.ops.einsum("bqhd,bkhd->bhqk", query, key))


def test_the_reader_gives_the_fixtures_layers():
    rope, nope = hf_attention.positions_per_layer(CONFIG)
    assert isinstance(rope, RotaryEmbedding)
    assert (rope.pairing, rope.max_wavelength, rope.scaling) == ("interleaved", 10000.0, None)
    assert isinstance(nope, AttentionTemperature)
    assert (nope.floor_scale, nope.attn_scale) == (4, 0.5)


@pytest.mark.parametrize("layer", [0, 1], ids=["rope", "nope-temperature"])
def test_logits_equal_transformers(layer):
    # transformers' RoPE is float32 (`apply_rotary_emb` calls `.float()`),
    # so is the temperature's factor; ours are float32 throughout.
    name = ("rope", "nope")[layer]
    attention = llama4_attention(layer)
    tokens = FIXTURE["hidden_states"].astype("float32")
    every = np.arange(tokens.shape[1])
    full = logits(attention, tokens, every, every)
    np.testing.assert_allclose(full, FIXTURE[f"{name}/full/logits"], rtol=1e-5, atol=1e-5)
    # The queries after the cache, against all keys.
    decode = logits(attention, tokens, every[PREFILL:], every)
    np.testing.assert_allclose(decode, FIXTURE[f"{name}/decode/logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer", [0, 1], ids=["rope", "nope-temperature"])
def test_weights_and_outputs_equal_transformers_in_cached_decoding(layer):
    name = ("rope", "nope")[layer]
    attention = llama4_attention(layer)
    tokens = FIXTURE["hidden_states"].astype("float32")
    output, weights = attention(tokens, tokens, use_causal_mask=True, return_attention_scores=True)
    np.testing.assert_allclose(numpy(weights), FIXTURE[f"{name}/full/weights"], atol=1e-5)
    np.testing.assert_allclose(numpy(output), FIXTURE[f"{name}/full/output"], atol=1e-5)
    cache = np.zeros((2, 2, tokens.shape[1], HEADS, HEAD_DIM), "float32")
    _, cache = attention(
        tokens[:, :PREFILL], tokens[:, :PREFILL], use_causal_mask=True,
        cache=cache, cache_update_index=0,
    )
    output, weights, _ = attention(
        tokens[:, PREFILL:], tokens[:, PREFILL:], use_causal_mask=True,
        cache=cache, cache_update_index=PREFILL, return_attention_scores=True,
    )
    np.testing.assert_allclose(numpy(weights), FIXTURE[f"{name}/decode/weights"], atol=1e-5)
    np.testing.assert_allclose(numpy(output), FIXTURE[f"{name}/decode/output"], atol=1e-5)


def test_the_temperature_changes_the_fixtures_attention():
    # Without it, the layer without RoPE would not match: the fixture tests it.
    attention = llama4_attention(1)
    tokens = FIXTURE["hidden_states"].astype("float32")
    plain = numpy(attention(tokens, tokens, use_causal_mask=True))
    attention.position.attn_scale = 0.0
    assert not np.allclose(
        numpy(attention(tokens, tokens, use_causal_mask=True)), plain, atol=1e-3
    )


@pytest.mark.parametrize(
    "floor_scale, attn_scale", [(8192, 0.1), (4, 0.5), (3.5, 2.0), (1, 0.0)]
)
def test_factors_equal_float64_reference(floor_scale, attn_scale):
    positions = np.array([0, 1, 2, 3, 6, 7, 100, 8190, 8191, 8192, 65535, 1_000_000])
    factors = AttentionTemperature(floor_scale, attn_scale)(positions.astype("int32"))
    assert keras.backend.standardize_dtype(factors.dtype) == "float32"
    np.testing.assert_allclose(
        numpy(factors), reference_factors(positions, floor_scale, attn_scale), rtol=1e-6
    )


@pytest.mark.parametrize("position", [-2, -9000])
def test_positions_below_minus_one_fail_or_are_nan(position):
    # log1p(floor((p + 1) / floor_scale)) is -inf at the first step below
    # -1 and NaN past it: an error where known, NaN where compiled.
    layer = AttentionTemperature(floor_scale=8192, attn_scale=0.1)
    positions = np.array([0, -1, position, 5], "int32")
    with pytest.raises(
        ValueError,
        match=rf"`positions` of AttentionTemperature must be at least -1.*"
        rf"Received: positions\[2\]={position}",
    ):
        layer(positions)
    if BACKEND == "torch":
        return  # `compiled` runs eagerly there: the error above is its answer
    factors = numpy(compiled(layer)(positions))
    np.testing.assert_array_equal(np.isnan(factors), [False, False, True, False])
    np.testing.assert_allclose(factors[[0, 1, 3]], 1.0)


def test_queries_scaled_by_their_positions_only():
    rng = np.random.default_rng(0)
    query = rng.normal(size=(2, 6, 3, 4)).astype("float32")
    key = rng.normal(size=(2, 8, 3, 4)).astype("float32")
    positions = np.array([[3, 4, 5, 6, 7, 8], [0, 0, 1, 2, 3, 9]])
    scaled, same = AttentionTemperature(floor_scale=4, attn_scale=0.5).transform_query_key(
        query, key, AttentionContext(query_positions=positions, key_positions=np.arange(8)[None])
    )
    expected = query * reference_factors(positions, 4, 0.5)[:, :, None, None]
    np.testing.assert_allclose(numpy(scaled), expected, rtol=1e-6)
    np.testing.assert_array_equal(numpy(same), key)


def random_attention(seed=0, **temperature):
    attention = PositionalMultiHeadAttention(
        num_heads=2,
        key_dim=8,
        position=AttentionTemperature(**{"floor_scale": 3, "attn_scale": 0.5, **temperature}),
    )
    tokens = np.zeros((1, 3, 16), "float32")
    attention(tokens, tokens)
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    return attention


def test_cached_decoding_equals_one_causal_pass():
    attention = random_attention()
    tokens = np.random.default_rng(2).normal(size=(2, 11, 16)).astype("float32")
    full = numpy(attention(tokens, tokens, use_causal_mask=True))
    cache = np.zeros((2, 2, 11, 2, 8), "float32")
    prompt, cache = attention(
        tokens[:, :4], tokens[:, :4], use_causal_mask=True, cache=cache, cache_update_index=0
    )
    steps = [numpy(prompt)]
    for index in range(4, 11):
        step, cache = attention(
            tokens[:, index : index + 1],
            tokens[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
        )
        steps.append(numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)


def test_explicit_positions_shift_the_temperature():
    # The tail of a sequence at its own positions is the tail of the whole.
    attention = random_attention()
    tokens = np.random.default_rng(3).normal(size=(1, 9, 16)).astype("float32")
    whole = numpy(attention(tokens, tokens, use_causal_mask=True))
    tail = numpy(
        attention(tokens[:, 4:], tokens, query_positions=np.arange(4, 9), use_causal_mask=True)
    )
    np.testing.assert_allclose(tail, whole[:, 4:], atol=2e-5)
    unshifted = numpy(attention(tokens[:, 4:], tokens, query_positions=np.arange(5)))
    assert not np.allclose(unshifted, tail, atol=1e-3)


def test_compiled_and_saved(tmp_path):
    inputs = keras.Input((12, 16))
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=AttentionTemperature(floor_scale=5, attn_scale=0.3)
    )
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    rng = np.random.default_rng(4)
    for weight in model.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    tokens = rng.normal(size=(3, 12, 16)).astype("float32")
    eager = model.predict(tokens, verbose=0)
    np.testing.assert_allclose(numpy(compiled(model)(tokens)), eager, atol=2e-5)
    model.save(tmp_path / "temperature.keras")
    restored = keras.saving.load_model(tmp_path / "temperature.keras")
    np.testing.assert_array_equal(restored.predict(tokens, verbose=0), eager)
    position = restored.layers[1].position
    assert isinstance(position, AttentionTemperature)
    assert position.get_config() == attention.position.get_config()


def test_config_round_trip():
    layer = AttentionTemperature(floor_scale=16, attn_scale=0.25, name="temperature")
    again = AttentionTemperature.from_config(layer.get_config())
    assert (again.floor_scale, again.attn_scale, again.name) == (16, 0.25, "temperature")


def test_mixed_bfloat16_scales_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        attention = random_attention()
        tokens = np.random.default_rng(5).normal(size=(2, 10, 16)).astype("float32")
        output = attention(tokens, tokens, use_causal_mask=True)
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        factors = attention.position(np.arange(10, dtype="int32"))
        assert keras.backend.standardize_dtype(factors.dtype) == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
    reference = random_attention()
    np.testing.assert_allclose(
        numpy(output).astype("float32"),
        numpy(reference(tokens, tokens, use_causal_mask=True)),
        atol=0.1,
    )


def test_training_moves_every_weight_through_the_scaled_queries():
    inputs = keras.Input((8, 16))
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=AttentionTemperature(floor_scale=2, attn_scale=1.0)
    )
    model = keras.Model(inputs, keras.layers.Dense(1)(attention(inputs, inputs, use_causal_mask=True)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    assert attention.position.weights == []
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 8, 16)).astype("float32")
    before = [numpy(w).copy() for w in attention.weights]
    model.fit(x, np.cumsum(x[..., :1], 1), epochs=2, verbose=0)
    for old, weight in zip(before, attention.weights):
        assert not np.allclose(old, numpy(weight)), weight.name


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"floor_scale": 0}, "floor_scale"),
        ({"floor_scale": -8}, "floor_scale"),
        ({"floor_scale": math.inf}, "floor_scale"),
        ({"floor_scale": True}, "floor_scale"),
        ({"floor_scale": "8192"}, "floor_scale"),
        ({"attn_scale": -0.1}, "attn_scale"),
        ({"attn_scale": math.nan}, "attn_scale"),
        ({"attn_scale": None}, "attn_scale"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(arguments, name):
    with pytest.raises(ValueError, match=rf"`{name}` must be .*Received: {name}="):
        AttentionTemperature(**arguments)


def test_from_hf_config_reads_llama_4():
    scout = {
        "model_type": "llama4",
        "text_config": {"attn_temperature_tuning": True, "floor_scale": 8192, "attn_scale": 0.1},
        "vision_config": {"hidden_size": 1408},
    }
    layer = AttentionTemperature.from_hf_config(scout, name="t")
    assert (layer.floor_scale, layer.attn_scale, layer.name) == (8192, 0.1, "t")
    # transformers' defaults, for a Llama 4 config that gives none.
    default = AttentionTemperature.from_hf_config({"model_type": "llama4_text"})
    assert (default.floor_scale, default.attn_scale) == (8192, 0.1)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama4_text", "attn_temperature_tuning": False},
        {"model_type": "smollm3", "num_hidden_layers": 4},
        {"model_type": "llama"},
    ],
    ids=["tuning-off", "smollm3", "llama"],
)
def test_from_hf_config_refuses_configs_without_temperature(config):
    with pytest.raises(ValueError, match="has no attention temperature.*attn_temperature_tuning="):
        AttentionTemperature.from_hf_config(config)


def test_string_positions_are_refused_naming_them():
    # JAX would parse the strings as numbers, TensorFlow's cast refuse them.
    with pytest.raises(ValueError, match="`positions` must hold integers or floats.*dtype <U1"):
        AttentionTemperature(floor_scale=4)(np.array(["0", "1", "2"]))
