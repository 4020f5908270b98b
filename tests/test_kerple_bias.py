"""KerpleBias against the paper's formulas and the KERPLE repository's own code.

The formulas of Chi et al. (2022, section 4) are computed here in float64
NumPy; `fixtures/kerple.npz` holds the biases of the repository's
`ParallelKerpleLog` and `ParallelKerplePower`, run in float64
(`fixtures/generate_kerple.py`).
"""

import pathlib

import keras
import numpy as np
import pytest

from keras_posenc import KerpleBias
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import AttentionContext
from tests.backend import compiled
from tests.backend import gradients
from tests.backend import numpy

FIXTURE = np.load(pathlib.Path(__file__).parent / "fixtures" / "kerple.npz")


def kerple_reference(form, r1, r2, query_positions, key_positions, bidirectional):
    """The paper's bias in float64, `(heads, query, key)`, coefficients clamped."""
    r1 = np.maximum(np.asarray(r1, "float64"), 1e-2)[:, None, None]
    r2 = np.maximum(np.asarray(r2, "float64"), 1e-2)
    i = np.asarray(query_positions, "float64")[:, None]
    j = np.asarray(key_positions, "float64")[None, :]
    distance = np.abs(i - j) if bidirectional else np.maximum(i - j, 0.0)
    if form == "log":
        return -r1 * np.log(1.0 + r2[:, None, None] * distance)
    r2 = np.minimum(r2, 2.0)[:, None, None]
    return -r1 * distance**r2


def set_coefficients(layer, r1, r2):
    layer.r1.assign(np.asarray(r1, "float32"))
    layer.r2.assign(np.asarray(r2, "float32"))


def built(form="log", heads=4, **arguments):
    layer = KerpleBias(heads, form=form, **arguments)
    layer.build()
    return layer


@pytest.mark.parametrize("form", ["log", "power"])
def test_the_repositorys_own_bias(form):
    bias_p, bias_a = FIXTURE[f"{form}/bias_p"], FIXTURE[f"{form}/bias_a"]
    r1, r2 = (bias_p, bias_a) if form == "log" else (bias_a, bias_p)
    layer = built(form)
    set_coefficients(layer, r1, r2)
    bias = numpy(layer(np.arange(9), np.arange(9)))[0]
    np.testing.assert_allclose(bias, FIXTURE[f"{form}/bias"], rtol=1e-6, atol=1e-6)
    # The repository's cached decoding: the last query against all keys.
    last = numpy(layer(np.array([8]), np.arange(9)))[0]
    np.testing.assert_allclose(last, FIXTURE[f"{form}/last_row"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("form", ["log", "power"])
def test_the_fixture_agrees_with_the_formula(form):
    # The reference of the other tests, checked against the repository's.
    bias_p, bias_a = FIXTURE[f"{form}/bias_p"], FIXTURE[f"{form}/bias_a"]
    r1, r2 = (bias_p, bias_a) if form == "log" else (bias_a, bias_p)
    reference = kerple_reference(form, r1, r2, np.arange(9), np.arange(9), False)
    np.testing.assert_allclose(reference, FIXTURE[f"{form}/bias"], atol=1e-12)
    clamped = FIXTURE[f"{form}/bias_p_clamped"]
    assert clamped.min() == pytest.approx(1e-2)
    assert (form == "power") == (clamped.max() == 2.0)


@pytest.mark.parametrize("form", ["log", "power"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_any_positions_match_the_formula(form, bidirectional):
    rng = np.random.default_rng(0)
    r1, r2 = rng.uniform(0.0, 2.0, 3), rng.uniform(0.0, 2.5, 3)
    layer = built(form, heads=3, bidirectional=bidirectional)
    set_coefficients(layer, r1, r2)
    query_positions = np.array([[3, 17, 40], [0, 5, 6]])
    key_positions = np.array([[0, 9, 17, 60], [2, 3, 4, 30]])
    bias = numpy(layer(query_positions, key_positions))
    for row in range(2):
        reference = kerple_reference(
            form, r1, r2, query_positions[row], key_positions[row], bidirectional
        )
        np.testing.assert_allclose(bias[row], reference, rtol=2e-6, atol=1e-6)


def test_repository_initialization_and_clamps():
    log, power = built("log", heads=64), built("power", heads=64)
    for layer, (r1_top, r2_top) in ((log, (2.0, 1.0)), (power, (1.0, 2.0))):
        r1, r2 = numpy(layer.r1), numpy(layer.r2)
        assert 0.0 <= r1.min() and r1.max() < r1_top and r1.max() > 0.6 * r1_top
        assert 0.0 <= r2.min() and r2.max() < r2_top and r2.max() > 0.6 * r2_top
        assert layer.r1.dtype == "float32" and layer.r2.dtype == "float32"
    np.testing.assert_allclose(
        numpy(power.r2.constraint(np.array([-1.0, 0.5, 3.0], "float32"))), [0.01, 0.5, 2.0]
    )
    np.testing.assert_allclose(
        numpy(log.r2.constraint(np.array([-1.0, 3.0], "float32"))), [0.01, 3.0]
    )


def random_attention(form="log", bidirectional=False, seed=0):
    attention = PositionalMultiHeadAttention(
        num_heads=2,
        key_dim=8,
        position=KerpleBias(2, form=form, bidirectional=bidirectional),
    )
    tokens = np.zeros((1, 3, 16), "float32")
    attention(tokens, tokens)
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    set_coefficients(attention.position, [0.7, 1.3], [0.4, 1.6])
    return attention


def attention_reference(attention, tokens, causal):
    """The attention in float64 NumPy, the bias from the formula."""
    heads, key_dim = 2, 8

    def dense(layer, x):
        return np.einsum("bsf,fnd->bsnd", x, numpy(layer.kernel)) + numpy(layer.bias)

    query = dense(attention._query_dense, tokens) / np.sqrt(key_dim)
    key = dense(attention._key_dense, tokens)
    value = dense(attention._value_dense, tokens)
    position = attention.position
    length = tokens.shape[1]
    bias = kerple_reference(
        position.form,
        numpy(position.r1),
        numpy(position.r2),
        np.arange(length),
        np.arange(length),
        position.bidirectional,
    )
    logits = np.einsum("btnd,bsnd->bnts", query, key) + bias
    if causal:
        logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mixed = np.einsum("bnts,bsnd->btnd", weights, value)
    output = attention._output_dense
    return np.einsum("btnd,ndf->btf", mixed, numpy(output.kernel)) + numpy(output.bias)


@pytest.mark.parametrize(
    "form, bidirectional, causal",
    [("log", False, True), ("power", False, True), ("log", True, False), ("power", True, False)],
)
def test_inside_attention_matches_float64(form, bidirectional, causal):
    attention = random_attention(form, bidirectional)
    tokens = np.random.default_rng(1).normal(size=(2, 6, 16))
    output = numpy(attention(tokens.astype("float32"), tokens.astype("float32"), use_causal_mask=causal))
    np.testing.assert_allclose(
        output, attention_reference(attention, tokens, causal), atol=2e-5
    )


@pytest.mark.parametrize("form", ["log", "power"])
def test_cached_decoding_equals_one_causal_pass(form):
    attention = random_attention(form)
    tokens = np.random.default_rng(2).normal(size=(2, 7, 16)).astype("float32")
    full = numpy(attention(tokens, tokens, use_causal_mask=True))
    cache = np.zeros((2, 2, 7, 2, 8), "float32")
    prompt, cache = attention(
        tokens[:, :4], tokens[:, :4], use_causal_mask=True, cache=cache, cache_update_index=0
    )
    steps = [numpy(prompt)]
    for index in range(4, 7):
        step, cache = attention(
            tokens[:, index : index + 1],
            tokens[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
        )
        steps.append(numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)


def test_compiled_and_saved(tmp_path):
    inputs = keras.Input((12, 16))
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=KerpleBias(2, form="power", bidirectional=True)
    )
    model = keras.Model(inputs, attention(inputs, inputs))
    rng = np.random.default_rng(4)
    for weight in model.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    set_coefficients(attention.position, [0.5, 0.05], [1.5, 0.7])
    tokens = rng.normal(size=(3, 12, 16)).astype("float32")
    eager = model.predict(tokens, verbose=0)
    np.testing.assert_allclose(numpy(compiled(model)(tokens)), eager, atol=2e-5)
    model.save(tmp_path / "kerple.keras")
    restored = keras.saving.load_model(tmp_path / "kerple.keras")
    np.testing.assert_array_equal(restored.predict(tokens, verbose=0), eager)
    position = restored.layers[1].position
    assert position.get_config() == attention.position.get_config()
    again = KerpleBias.from_config(position.get_config())
    assert (again.form, again.bidirectional, again.num_heads) == ("power", True, 2)


def test_initializers_are_used_and_serialized():
    layer = KerpleBias(2, r1_initializer="ones", r2_initializer=keras.initializers.Constant(0.5))
    layer.build()
    assert numpy(layer.r1).tolist() == [1.0, 1.0]
    assert numpy(layer.r2).tolist() == [0.5, 0.5]
    again = KerpleBias.from_config(layer.get_config())
    again.build()
    assert numpy(again.r2).tolist() == [0.5, 0.5]


def test_mixed_bfloat16_keeps_the_bias_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        attention = random_attention()
        tokens = np.random.default_rng(5).normal(size=(2, 10, 16)).astype("float32")
        output = attention(tokens, tokens, use_causal_mask=True)
        bias = attention.position(np.arange(10), np.arange(10))
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(bias.dtype) == "float32"
        assert keras.backend.standardize_dtype(attention.position.r1.dtype) == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
    reference = random_attention()
    np.testing.assert_allclose(
        numpy(output).astype("float32"),
        numpy(reference(tokens, tokens, use_causal_mask=True)),
        atol=0.1,
    )


@pytest.mark.parametrize("form", ["log", "power"])
def test_training_moves_every_weight_and_keeps_the_clamps(form):
    inputs = keras.Input((8, 16))
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=KerpleBias(2, form=form)
    )
    model = keras.Model(inputs, keras.layers.Dense(1)(attention(inputs, inputs, use_causal_mask=True)))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    set_coefficients(attention.position, [0.5, 0.02], [1.9, 0.02])
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 8, 16)).astype("float32")
    before = [numpy(w).copy() for w in attention.position.weights]
    model.fit(x, np.cumsum(x[..., :1], 1), epochs=3, verbose=0)
    for old, weight in zip(before, attention.position.weights):
        assert not np.allclose(old, numpy(weight)), weight.name
    assert numpy(attention.position.r1).min() >= 1e-2
    assert numpy(attention.position.r2).min() >= 1e-2
    if form == "power":
        assert numpy(attention.position.r2).max() <= 2.0


def test_the_power_forms_gradient_is_finite_at_distance_zero():
    # d ** r2 at d = 0 has the gradient 0 * log 0 by r2; the layer's is 0.
    layer = built("power", heads=2)
    positions = keras.ops.arange(5, dtype="int32")[None]
    context = AttentionContext(query_positions=positions, key_positions=positions)

    def bias(r1, r2):
        with keras.StatelessScope(state_mapping=[(layer.r1, r1), (layer.r2, r2)]):
            return layer.logits_bias(None, None, context)

    for gradient in gradients(bias, [1.0, 0.5], [0.5, 1.5]):
        assert np.all(np.isfinite(gradient)) and np.all(gradient != 0.0)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"form": "exp"}, "form"),
        ({"bidirectional": 1}, "bidirectional"),
        ({"r1_initializer": "nope"}, "r1_initializer"),
        ({"r2_initializer": 3}, "r2_initializer"),
    ],
)
def test_bad_arguments_are_refused(arguments, match):
    arguments = {"num_heads": 2, **arguments}
    with pytest.raises(ValueError, match=match):
        KerpleBias(**arguments)


def test_num_heads_must_equal_the_attentions():
    with pytest.raises(ValueError, match="num_heads"):
        PositionalMultiHeadAttention(num_heads=4, key_dim=8, position=KerpleBias(2))
