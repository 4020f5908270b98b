"""XPosEmbedding against rotary-embedding-torch's xPos and a float64 formula.

The fixture `fixtures/xpos.npz` holds logits `q . k` per head made by
rotary-embedding-torch's own `rotate_queries_and_keys` (`use_xpos=True`) in
float64, one case with the queries at an offset after their keys
(`fixtures/generate_xpos.py`). The library centres its scales elsewhere;
the logits do not depend on the centre, so they are what is compared.
"""

import json
import math
import os

import keras
import numpy as np
import pytest

from keras_posenc import AttentionContext
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RotaryEmbedding
from keras_posenc import XPosEmbedding
from tests.backend import XLA
from tests.backend import numpy

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "xpos.npz")


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as arrays:
        return {name: arrays[name] for name in arrays.files}


def read_case(arrays, case):
    prefix = f"{case}/"
    values = {
        name[len(prefix) :]: value
        for name, value in arrays.items()
        if name.startswith(prefix)
    }
    return values, json.loads(str(values["config"]))


def head_logits(query, key):
    return np.einsum("bqhd,bkhd->bhqk", np.asarray(query, "float64"), np.asarray(key, "float64"))


def xpos_reference(query, key, query_positions, key_positions, scale_base, max_wavelength, pairing, rotary_dim=None):
    """Logits `q . k` per head of xPos, float64, from the paper's formula."""
    query, key = (np.asarray(x, "float64") for x in (query, key))
    d = query.shape[-1] if rotary_dim is None else rotary_dim
    i = np.arange(d // 2)
    frequencies = max_wavelength ** (-2.0 * i / d)
    zeta = (2.0 * i / d + 0.4) / 1.4

    def pairs(x):  # (..., d / 2, 2)
        x = x[..., :d]
        if pairing == "interleaved":
            return x.reshape(*x.shape[:-1], d // 2, 2)
        return np.stack([x[..., : d // 2], x[..., d // 2 :]], -1)

    def turned(x, positions, sign):
        p = np.asarray(positions, "float64")[None, :, None, None]  # (1, seq, 1, 1)
        angle = p * frequencies
        scale = zeta ** (sign * p / scale_base)  # centre 0; it cancels
        a, b = pairs(x)[..., 0], pairs(x)[..., 1]
        return scale * (a * np.cos(angle) - b * np.sin(angle)), scale * (
            b * np.cos(angle) + a * np.sin(angle)
        )

    qa, qb = turned(query, query_positions, 1.0)
    ka, kb = turned(key, key_positions, -1.0)
    rest = head_logits(query[..., d:], key[..., d:])
    return head_logits(qa, ka) + head_logits(qb, kb) + rest


@pytest.mark.parametrize("case", ["full", "partial", "offset"])
@pytest.mark.parametrize("scale_center", [0, 7, -40])
def test_logits_equal_rotary_embedding_torch(fixture, case, scale_center):
    values, config = read_case(fixture, case)
    layer = XPosEmbedding(
        scale_base=config["scale_base"],
        scale_center=scale_center,
        max_wavelength=config["max_wavelength"],
        pairing=config["pairing"],
        rotary_dim=config["rotary_dim"],
    )
    query, key = values["query"].astype("float32"), values["key"].astype("float32")
    # Called on its own, the queries take the keys' last positions.
    turned = layer(query, key)
    expected = values["logits"]
    np.testing.assert_allclose(
        head_logits(*map(numpy, turned)), expected, rtol=1e-5, atol=1e-5
    )
    # As the attention calls it: with the positions in its context.
    offset = config.get("query_offset", 0)
    context = AttentionContext(
        query_positions=(np.arange(query.shape[1]) + offset)[None].astype("int32"),
        key_positions=np.arange(key.shape[1])[None].astype("int32"),
        causal=True,
    )
    turned = layer.transform_query_key(query, key, context)
    np.testing.assert_allclose(
        head_logits(*map(numpy, turned)), expected, rtol=1e-5, atol=1e-5
    )


def test_library_cached_path_is_not_the_reference(fixture):
    # rotary-embedding-torch's `rotate_queries_with_cached_keys` centres the
    # queries and the keys apart (see the generator): its logits differ.
    values, _ = read_case(fixture, "offset")
    assert np.abs(values["library_cached_logits"] - values["logits"]).max() > 0.1


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [None, 6])
def test_logits_equal_float64_formula(pairing, rotary_dim):
    rng = np.random.default_rng(3)
    query = rng.normal(size=(2, 5, 3, 10)).astype("float32")
    key = rng.normal(size=(2, 9, 3, 10)).astype("float32")
    query_positions, key_positions = np.arange(30, 35), np.arange(-2, 25, 3)
    layer = XPosEmbedding(
        scale_base=6.0, scale_center=11, max_wavelength=50.0, pairing=pairing, rotary_dim=rotary_dim
    )
    turned = layer(query, key, query_positions=query_positions, key_positions=key_positions)
    expected = xpos_reference(
        query, key, query_positions, key_positions, 6.0, 50.0, pairing, rotary_dim
    )
    np.testing.assert_allclose(head_logits(*map(numpy, turned)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 2.0},
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4},
    ],
    ids=["default", "linear", "dynamic", "yarn"],
)
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_without_its_decay_the_rotation_is_ropes(scaling, pairing):
    # A scale base so long that every scale is 1: xPos is then the rotation
    # of RotaryEmbedding, whose ops it composes, with the same frequencies.
    arguments = {"max_wavelength": 100.0, "pairing": pairing, "rotary_dim": 6, "scaling": scaling}
    xpos = XPosEmbedding(scale_base=1e30, **arguments)
    rope = RotaryEmbedding(**arguments)
    query, key = random_tokens((2, 5, 3, 8)), random_tokens((2, 5, 3, 8), seed=2)
    positions = np.arange(3, 8)  # past the dynamic schedule's trained 4
    turned_query, turned_key = xpos(query, key, query_positions=positions, key_positions=positions)
    for turned, inputs in ((turned_query, query), (turned_key, key)):
        np.testing.assert_allclose(
            numpy(turned), numpy(rope(inputs, positions=positions)), rtol=1e-6, atol=1e-6
        )


def test_xpos_is_composed_over_the_rotation_not_a_rotary_embedding():
    xpos = XPosEmbedding()
    assert not isinstance(xpos, RotaryEmbedding)
    assert xpos.contributions == {"transform_query_key"}
    assert (xpos.num_axes, xpos.num_prefix_tokens) == (1, 0)


def test_inside_attention_the_heads_must_be_the_sequence_and_feature_axes():
    xpos = XPosEmbedding(sequence_axis=2)
    with pytest.raises(ValueError, match="XPosEmbedding rotates projected heads.*sequence_axis=2, feature_axis=-1"):
        PositionalMultiHeadAttention(num_heads=2, key_dim=8, position=xpos)


def test_logits_decay_with_distance_by_zeta():
    # A query and key of ones in one pair: the logit is cos times the decay.
    query = np.zeros((1, 1, 1, 4), "float32")
    query[..., 0] = 1.0
    layer = XPosEmbedding(scale_base=2.0, pairing="interleaved", max_wavelength=1e12)
    for distance in (0, 1, 4, 9):
        turned = layer(query, query, query_positions=[distance], key_positions=[0])
        logit = head_logits(*map(numpy, turned))[0, 0, 0, 0]
        # Pair 0: zeta = 0.4 / 1.4, and its frequency 1: cos(distance).
        expected = (2 / 7) ** (distance / 2.0) * math.cos(distance)
        np.testing.assert_allclose(logit, expected, rtol=1e-5, atol=1e-7)


def random_attention(seed=0, **arguments):
    """Attention of 2 heads of 8 over 16 features, with random weights."""
    position = XPosEmbedding(**{"scale_base": 8.0, **arguments})
    attention = PositionalMultiHeadAttention(num_heads=2, key_dim=8, position=position)
    tokens = np.zeros((1, 1, 16), "float32")
    attention(tokens, tokens, use_causal_mask=True)
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    return attention


def random_tokens(shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def attention_reference(attention, tokens, positions, scale_base, max_wavelength):
    """The causal attention's output in float64, its logits from the formula."""
    tokens = tokens.astype("float64")

    def project(dense):
        kernel, bias = (numpy(w).astype("float64") for w in dense.weights)
        return np.einsum("bsf,fhd->bshd", tokens, kernel) + bias

    query, key, value = (
        project(d) for d in (attention._query_dense, attention._key_dense, attention._value_dense)
    )
    logits = xpos_reference(query, key, positions, positions, scale_base, max_wavelength, "half")
    logits = logits / math.sqrt(query.shape[-1])
    allowed = positions[None, :] <= positions[:, None]  # (query, key)
    logits = np.where(allowed, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    heads = np.einsum("bhqk,bkhd->bqhd", weights, value)
    kernel, bias = (numpy(w).astype("float64") for w in attention._output_dense.weights)
    return np.einsum("bqhd,hdf->bqf", heads, kernel) + bias


@pytest.mark.parametrize("shift", [0, 1000])
def test_attention_equals_float64_reference(shift):
    attention = random_attention(scale_center=500)
    tokens = random_tokens((2, 12, 16))
    positions = np.arange(12) + shift
    output = attention(tokens, tokens, use_causal_mask=True, query_positions=positions, key_positions=positions)
    expected = attention_reference(attention, tokens, positions, 8.0, 10000.0)
    np.testing.assert_allclose(numpy(output), expected, rtol=1e-4, atol=1e-4)


def test_positions_at_the_edge_of_the_range_hold():
    # 64 scale bases from the centre: the largest scale, 3.5 ** 64.
    attention = random_attention(scale_center=0)
    tokens = random_tokens((1, 6, 16))
    for positions in (np.arange(6) + 512 - 5, np.arange(6) - 512):
        output = attention(tokens, tokens, use_causal_mask=True, query_positions=positions, key_positions=positions)
        expected = attention_reference(attention, tokens, positions, 8.0, 10000.0)
        np.testing.assert_allclose(numpy(output), expected, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("positions", [np.arange(6) + 513 - 5, np.arange(6) - 513])
def test_positions_beyond_the_range_give_nan(positions):
    attention = random_attention(scale_center=0)
    tokens = random_tokens((1, 6, 16))
    output = numpy(
        attention(tokens, tokens, use_causal_mask=True, query_positions=positions, key_positions=positions)
    )
    # The query whose position is out, and every query reading such a key.
    out = np.abs(positions) > 512
    reads_out = np.cumsum(out) > 0
    assert np.isnan(output[0][reads_out]).all()
    assert np.isfinite(output[0][~reads_out]).all()


def test_compiled_beyond_the_range_gives_nan():
    attention = random_attention(scale_center=1000)
    inputs = keras.Input((6, 16))
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    model.compile(jit_compile=XLA)
    # Default positions 0 .. 5, 1000 from the centre: more than 64 * 8.
    assert np.isnan(model.predict(random_tokens((1, 6, 16)), verbose=0)).all()


def test_attention_without_causal_mask_raises():
    attention = random_attention()
    tokens = random_tokens((1, 4, 16))
    with pytest.raises(ValueError, match="use_causal_mask=True"):
        attention(tokens, tokens)


def test_queries_alone_are_refused():
    with pytest.raises(TypeError, match="key"):
        XPosEmbedding()(random_tokens((1, 4, 2, 8)))


def test_more_queries_than_keys_need_positions():
    with pytest.raises(ValueError, match="query_positions"):
        XPosEmbedding()(random_tokens((1, 5, 2, 8)), random_tokens((1, 4, 2, 8)))


def test_other_axes_equal_the_default_layout():
    query, key = random_tokens((2, 5, 3, 8)), random_tokens((2, 5, 3, 8), seed=2)
    expected = XPosEmbedding(scale_base=4.0)(query, key)
    moved = XPosEmbedding(scale_base=4.0, sequence_axis=2, feature_axis=1)(
        np.transpose(query, (0, 3, 1, 2)), np.transpose(key, (0, 3, 1, 2))
    )
    for got, want in zip(moved, expected):
        np.testing.assert_allclose(
            np.transpose(numpy(got), (0, 2, 3, 1)), numpy(want), rtol=1e-6, atol=1e-6
        )


def test_symbolic_call_gives_both_shapes():
    query, key = keras.Input((5, 2, 8)), keras.Input((7, 2, 8))
    turned = XPosEmbedding()(query, key)
    assert [tuple(x.shape) for x in turned] == [(None, 5, 2, 8), (None, 7, 2, 8)]


def attention_model(attention, length=12):
    tokens = keras.Input((length, 16))
    return keras.Model(tokens, attention(tokens, tokens, use_causal_mask=True))


def test_xla_equals_eager():
    attention = random_attention()
    model = attention_model(attention)
    tokens = random_tokens((2, 12, 16))
    eager = numpy(model(tokens))
    model.compile(jit_compile=XLA)
    np.testing.assert_allclose(model.predict(tokens, verbose=0), eager, rtol=1e-6, atol=1e-6)


def test_mixed_bfloat16_is_close_to_float32():
    tokens = random_tokens((2, 12, 16))
    expected = numpy(random_attention()(tokens, tokens, use_causal_mask=True))
    keras.config.set_dtype_policy("mixed_bfloat16")
    attention = random_attention()
    output = attention(tokens, tokens, use_causal_mask=True)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    output = numpy(keras.ops.cast(output, "float32"))
    np.testing.assert_allclose(output, expected, rtol=0.05, atol=0.05)


def test_keras_file_round_trip(tmp_path):
    attention = random_attention(scale_center=3, pairing="interleaved", rotary_dim=4)
    model = attention_model(attention)
    tokens = random_tokens((2, 12, 16))
    path = tmp_path / "xpos.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert isinstance(loaded.layers[1].position, XPosEmbedding)
    np.testing.assert_array_equal(numpy(loaded(tokens)), numpy(model(tokens)))


def test_config_round_trip():
    layer = XPosEmbedding(
        scale_base=256,
        scale_center=-100,
        max_wavelength=500000.0,
        pairing="interleaved",
        rotary_dim=32,
        scaling={"rope_type": "linear", "factor": 2.0},
        name="xpos",
    )
    config = layer.get_config()
    assert config["scale_base"] == 256.0 and config["scale_center"] == -100
    assert "num_axes" not in config
    rebuilt = XPosEmbedding.from_config(config)
    assert rebuilt.get_config() == config


@pytest.mark.parametrize("arguments", [{}, {"rotary_dim": 4}, {"scale_center": 9}])
def test_cached_decoding_equals_one_causal_pass(arguments):
    attention = random_attention(**arguments)
    tokens = random_tokens((2, 10, 16))
    expected = numpy(attention(tokens, tokens, use_causal_mask=True))
    cache = keras.ops.zeros((2, 2, 12, 2, 8))
    prompt, cache = attention(
        tokens[:, :6], tokens[:, :6], use_causal_mask=True, cache=cache, cache_update_index=0
    )
    outputs = [numpy(prompt)]
    for index in range(6, 10):
        token = tokens[:, index : index + 1]
        output, cache = attention(
            token, token, use_causal_mask=True, cache=cache, cache_update_index=index
        )
        outputs.append(numpy(output))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5)


def test_training_moves_every_weight():
    inputs = keras.Input((8, 16))
    attention = PositionalMultiHeadAttention(num_heads=2, key_dim=8, position=XPosEmbedding(scale_base=4.0))
    outputs = attention(inputs, inputs, use_causal_mask=True)
    model = keras.Model(inputs, keras.layers.Dense(1)(outputs))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 8, 16)).astype("float32")
    assert attention.position.weights == []
    before = [numpy(w).copy() for w in attention.weights]
    model.fit(x, np.cumsum(x[..., :1], 1), epochs=2, verbose=0)
    for old, weight in zip(before, attention.weights):
        assert not np.allclose(old, numpy(weight)), weight.name


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"scale_base": 0}, "scale_base"),
        ({"scale_base": -1.0}, "scale_base"),
        ({"scale_base": float("inf")}, "scale_base"),
        ({"scale_base": True}, "scale_base"),
        ({"scale_base": "512"}, "scale_base"),
        ({"scale_center": 1.5}, "scale_center"),
        ({"scale_center": False}, "scale_center"),
        ({"max_wavelength": 1.0}, "max_wavelength"),
        ({"pairing": "concat"}, "pairing"),
        ({"rotary_dim": 5}, "rotary_dim"),
        ({"num_axes": 2}, "num_axes"),
        ({"num_prefix_tokens": 1}, "num_prefix_tokens"),
        ({"learned_frequencies": True}, "learned_frequencies"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        XPosEmbedding(**arguments)


@pytest.mark.parametrize("name", ["query_positions", "key_positions"])
def test_int64_positions_past_int32_are_refused_before_keras_converts_them(name):
    # JAX without 64-bit numbers would wrap them as Keras converts them.
    heads = np.ones((1, 4, 2, 8), "float32")
    positions = {"query_positions": np.arange(4), "key_positions": np.arange(4)}
    positions[name] = np.arange(4, dtype="int64") + 2**31
    with pytest.raises(ValueError, match=rf"`{name}` must fit in int32.*{name}\[0\]=2147483648"):
        XPosEmbedding()(heads, heads, **positions)
