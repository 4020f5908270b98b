"""FireBias against the paper's formula, in float64 NumPy.

`b(i, j) = f(psi(d) / (psi(max(i, L)) + eps))`, `psi(x) = log(|c x| + 1)`,
`L = |multiplier * init_threshold|`, `f` a 1 -> width -> heads ReLU MLP, as
the appendix code of Li et al. (2023) computes it; `d = max(i - j, 0)`
(causal) or `|i - j|` (bidirectional).
"""

import contextlib

import keras
import numpy as np
import pytest

from keras_posenc import AttentionContext
from keras_posenc import FireBias
from keras_posenc import PositionalMultiHeadAttention
from tests.backend import BACKEND
from tests.backend import compiled
from tests.backend import gradients
from tests.backend import numpy


def fire_reference(layer, query_positions, key_positions):
    """The bias in float64, `(heads, query, key)`, from the layer's weights."""
    w1, b1 = numpy(layer.hidden_kernel).astype("float64"), numpy(layer.hidden_bias)
    w2 = numpy(layer.output_kernel).astype("float64")
    c = float(numpy(layer.c))
    threshold = abs(float(numpy(layer.threshold_multiplier)) * layer.init_threshold)
    i = np.asarray(query_positions, "float64")[:, None]
    j = np.asarray(key_positions, "float64")[None, :]
    distance = np.abs(i - j) if layer.bidirectional else np.maximum(i - j, 0.0)
    psi = lambda x: np.log(np.abs(c * x) + 1.0)  # noqa: E731
    x = psi(distance) / (psi(np.maximum(i, threshold)) + layer.eps)
    hidden = np.maximum(x[..., None] * w1 + b1, 0.0)  # (query, key, width)
    return np.einsum("qkw,wh->hqk", hidden, w2)


def randomized(layer, seed=0, c=0.3, multiplier=0.02):
    layer.build()
    rng = np.random.default_rng(seed)
    for weight in (layer.hidden_kernel, layer.hidden_bias, layer.output_kernel):
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    layer.c.assign(c)
    layer.threshold_multiplier.assign(multiplier)
    return layer


@pytest.mark.parametrize("bidirectional", [False, True])
def test_any_positions_match_the_formula(bidirectional):
    # L = 0.02 * 512 = 10.24: queries on both sides of the threshold.
    layer = randomized(FireBias(3, mlp_width=8, bidirectional=bidirectional))
    query_positions = np.array([[3, 17, 40], [0, 5, 11]])
    key_positions = np.array([[0, 9, 17, 60], [2, 3, 4, 30]])
    bias = numpy(layer(query_positions, key_positions))
    assert bias.shape == (2, 3, 3, 4)
    for row in range(2):
        np.testing.assert_allclose(
            bias[row],
            fire_reference(layer, query_positions[row], key_positions[row]),
            rtol=1e-5,
            atol=1e-5,
        )


def without_gradient(off):
    """On PyTorch with `off`, no gradient recorded; elsewhere nothing."""
    if off and BACKEND == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


@pytest.mark.parametrize("no_gradient", [False, True])
@pytest.mark.parametrize("first", [0, 7, 30])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_block_of_consecutive_positions_matches_the_formula(
    bidirectional, first, no_gradient
):
    # A block of queries from `first` on against keys from 0, as the
    # attention's blocks hand it: the numerator read once per distance.
    # From 7 the rows before L = 10.24 and the rows after it are two parts,
    # on eager PyTorch without a gradient written into one tensor.
    layer = randomized(FireBias(3, mlp_width=8, bidirectional=bidirectional))
    query_positions = np.arange(first, first + 5, dtype="int32")[None]
    key_positions = np.arange(40, dtype="int32")[None]
    context = AttentionContext(
        query_positions=keras.ops.convert_to_tensor(query_positions),
        key_positions=keras.ops.convert_to_tensor(key_positions),
        consecutive=True,
    )
    with without_gradient(no_gradient):
        bias = numpy(layer.logits_bias(None, None, context))
    assert bias.shape == (1, 3, 5, 40)
    np.testing.assert_allclose(
        bias[0],
        fire_reference(layer, query_positions[0], key_positions[0]),
        rtol=1e-5,
        atol=1e-5,
    )


def test_the_default_parametrization_is_the_appendix_codes():
    layer = FireBias(4)
    layer.build()
    assert tuple(layer.hidden_kernel.shape) == (32,)
    assert tuple(layer.output_kernel.shape) == (32, 4)
    assert float(numpy(layer.c)) == pytest.approx(0.1)
    assert float(numpy(layer.threshold_multiplier)) == 1.0
    # PyTorch's nn.Linear: uniform within 1 / sqrt(fan_in).
    assert np.abs(numpy(layer.hidden_kernel)).max() <= 1.0
    assert np.abs(numpy(layer.output_kernel)).max() <= 1 / np.sqrt(32)
    assert np.abs(numpy(layer.output_kernel)).max() > 0.5 / np.sqrt(32)
    # Below the threshold (512) every query divides by psi(512): a query's
    # bias depends on the distance alone.
    bias = numpy(layer(np.arange(6), np.arange(6)))[0]
    np.testing.assert_allclose(bias[:, 5, 2], bias[:, 3, 0], atol=1e-6)


def random_attention(bidirectional=False, seed=0):
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=FireBias(2, mlp_width=8, bidirectional=bidirectional)
    )
    tokens = np.zeros((1, 3, 16), "float32")
    attention(tokens, tokens)
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    randomized(attention.position, seed, c=0.3, multiplier=0.01)
    return attention


def attention_reference(attention, tokens, causal):
    key_dim = 8

    def dense(layer, x):
        return np.einsum("bsf,fnd->bsnd", x, numpy(layer.kernel)) + numpy(layer.bias)

    query = dense(attention._query_dense, tokens) / np.sqrt(key_dim)
    key = dense(attention._key_dense, tokens)
    value = dense(attention._value_dense, tokens)
    length = tokens.shape[1]
    bias = fire_reference(attention.position, np.arange(length), np.arange(length))
    logits = np.einsum("btnd,bsnd->bnts", query, key) + bias
    if causal:
        logits = np.where(np.tril(np.ones((length, length), bool)), logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    mixed = np.einsum("bnts,bsnd->btnd", weights, value)
    output = attention._output_dense
    return np.einsum("btnd,ndf->btf", mixed, numpy(output.kernel)) + numpy(output.bias)


@pytest.mark.parametrize("bidirectional, causal", [(False, True), (True, False)])
def test_inside_attention_matches_float64(bidirectional, causal):
    attention = random_attention(bidirectional)
    tokens = np.random.default_rng(1).normal(size=(2, 6, 16))
    output = numpy(
        attention(tokens.astype("float32"), tokens.astype("float32"), use_causal_mask=causal)
    )
    np.testing.assert_allclose(output, attention_reference(attention, tokens, causal), atol=2e-5)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_blocks_of_queries_equal_one_pass(bidirectional):
    # 512 queries: two blocks of `query_block`, against the bias added whole.
    attention = random_attention(bidirectional)
    tokens = np.random.default_rng(7).normal(size=(1, 512, 16)).astype("float32")
    by_blocks = numpy(attention(tokens, tokens, use_causal_mask=True))
    whole = numpy(
        attention(tokens, tokens, use_causal_mask=True, return_attention_scores=True)[0]
    )
    np.testing.assert_allclose(by_blocks, whole, atol=2e-5)


def test_cached_decoding_equals_one_causal_pass():
    attention = random_attention()
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
        num_heads=2, key_dim=8, position=FireBias(2, mlp_width=8, bidirectional=True)
    )
    model = keras.Model(inputs, attention(inputs, inputs))
    rng = np.random.default_rng(4)
    for weight in model.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    attention.position.threshold_multiplier.assign(0.01)
    tokens = rng.normal(size=(3, 12, 16)).astype("float32")
    eager = model.predict(tokens, verbose=0)
    np.testing.assert_allclose(numpy(compiled(model)(tokens)), eager, atol=2e-5)
    model.save(tmp_path / "fire.keras")
    restored = keras.saving.load_model(tmp_path / "fire.keras")
    np.testing.assert_array_equal(restored.predict(tokens, verbose=0), eager)
    position = restored.layers[1].position
    assert position.get_config() == attention.position.get_config()
    again = FireBias.from_config(position.get_config())
    assert (again.mlp_width, again.bidirectional, again.init_threshold) == (8, True, 512.0)


def test_initializers_are_used_and_serialized():
    layer = FireBias(2, mlp_width=4, kernel_initializer="ones", bias_initializer="zeros")
    layer.build()
    assert numpy(layer.output_kernel).tolist() == [[1.0, 1.0]] * 4
    assert numpy(layer.hidden_bias).tolist() == [0.0] * 4
    again = FireBias.from_config(layer.get_config())
    again.build()
    assert numpy(again.hidden_kernel).tolist() == [1.0] * 4


def test_mixed_bfloat16_keeps_the_bias_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        attention = random_attention()
        tokens = np.random.default_rng(5).normal(size=(2, 10, 16)).astype("float32")
        output = attention(tokens, tokens, use_causal_mask=True)
        bias = attention.position(np.arange(10), np.arange(10))
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(bias.dtype) == "float32"
        for weight in attention.position.weights:
            assert keras.backend.standardize_dtype(weight.dtype) == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
    reference = random_attention()
    np.testing.assert_allclose(
        numpy(output).astype("float32"),
        numpy(reference(tokens, tokens, use_causal_mask=True)),
        atol=0.1,
    )


def test_training_moves_every_weight():
    inputs = keras.Input((16, 16))
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=FireBias(2, mlp_width=8)
    )
    model = keras.Model(
        inputs, keras.layers.Dense(1)(attention(inputs, inputs, use_causal_mask=True))
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    # A threshold below the positions, so that it moves the divisor.
    attention.position.threshold_multiplier.assign(0.01)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 16, 16)).astype("float32")
    before = [numpy(w).copy() for w in attention.position.weights]
    model.fit(x, np.cumsum(x[..., :1], 1), epochs=2, verbose=0)
    names = []
    for old, weight in zip(before, attention.position.weights):
        assert not np.allclose(old, numpy(weight)), weight.name
        names.append(weight.name)
    assert {"c", "threshold_multiplier"} <= set(names)


@pytest.mark.parametrize("consecutive", [False, True])
def test_gradients_reach_c_and_the_threshold(consecutive):
    # L = 5.12: at consecutive positions, eagerly, the rows before it are
    # read once per distance and the later ones entry by entry.
    layer = randomized(FireBias(2, mlp_width=4), multiplier=0.01)
    positions = keras.ops.arange(12, dtype="int32")[None]
    context = AttentionContext(
        query_positions=positions, key_positions=positions, consecutive=consecutive
    )

    def bias(c, multiplier):
        with keras.StatelessScope(
            state_mapping=[(layer.c, c), (layer.threshold_multiplier, multiplier)]
        ):
            return layer.logits_bias(None, None, context)

    for gradient in gradients(bias, 0.3, 0.01):
        assert np.isfinite(gradient) and gradient != 0.0


def mlp_reference(layer, x):
    """The MLP `f` of `x` in float64, `(heads,) + x.shape`, and its hidden sums."""
    w1, b1 = numpy(layer.hidden_kernel).astype("float64"), numpy(layer.hidden_bias)
    w2 = numpy(layer.output_kernel).astype("float64")
    before = np.asarray(x, "float64")[..., None] * w1 + b1  # (..., width)
    return np.moveaxis(np.maximum(before, 0.0) @ w2, -1, 0), before


def piecewise_layer(seed=0):
    """A layer with breakpoints in `(-2, 3)`, rising and falling units, tied
    breakpoints and flat units."""
    layer = randomized(FireBias(3, mlp_width=12), seed)
    rng = np.random.default_rng(seed)
    w1 = rng.uniform(0.5, 2.0, 12) * np.resize([1.0, -1.0], 12)
    b1 = -w1 * rng.uniform(-2.0, 3.0, 12)
    w1[1], b1[1] = 2.0 * w1[0], 2.0 * b1[0]  # unit 1's breakpoint is unit 0's
    w1[2], b1[2] = -w1[0], -b1[0]  # and unit 2's, falling where 0 rises
    w1[3], b1[3] = 0.0, 0.7  # constant relu(0.7)
    w1[4], b1[4] = 0.0, -0.4  # constant 0
    layer.hidden_kernel.assign(w1.astype("float32"))
    layer.hidden_bias.assign(b1.astype("float32"))
    return layer


def test_the_piecewise_linear_evaluation_is_the_mlp():
    layer = piecewise_layer()
    w1, b1 = numpy(layer.hidden_kernel), numpy(layer.hidden_bias)
    sloped = w1 != 0
    # The breakpoints as float32 computes them, and float32 steps beside.
    breakpoints = (-b1[sloped] / w1[sloped]).astype("float32")
    at = np.concatenate(
        [
            breakpoints,
            np.nextafter(breakpoints, np.float32(np.inf)),
            np.nextafter(breakpoints, np.float32(-np.inf)),
            breakpoints + np.float32(1e-3),
            breakpoints - np.float32(1e-3),
        ]
    )
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [at, rng.uniform(-4.0, 4.0, 200).astype("float32"), np.float32([0.0, 1.0])]
    )
    x = x[: (x.size // 4) * 4].reshape(1, 4, -1)  # (1, query, key)
    values = numpy(layer._evaluate(keras.ops.convert_to_tensor(x)))
    assert values.shape == (1, 3) + x.shape[1:]
    expected, _ = mlp_reference(layer, x[0])
    np.testing.assert_allclose(values[0], expected, rtol=1e-5, atol=1e-5)


def test_gradients_are_the_mlps():
    layer = piecewise_layer(seed=1)
    weights = [layer.hidden_kernel, layer.hidden_bias, layer.output_kernel]
    rng = np.random.default_rng(4)
    x = rng.uniform(-3.0, 3.0, (1, 6, 40))
    # Away from the breakpoints, where the MLP is differentiable.
    w1, b1 = numpy(layer.hidden_kernel), numpy(layer.hidden_bias)
    sloped = w1 != 0
    breakpoints = -b1[sloped] / w1[sloped]
    near = np.abs(x[..., None] - breakpoints).min(-1) < 1e-2
    x = np.where(near, x + 0.05, x)
    assert np.abs(x[..., None] - breakpoints).min() > 1e-3
    upstream = rng.normal(size=(1, 3) + x.shape[1:])

    def loss(x_value, *values):
        with keras.StatelessScope(state_mapping=list(zip(weights, values))):
            return layer._evaluate(x_value) * keras.ops.convert_to_tensor(
                upstream, "float32"
            )

    got = gradients(loss, x, *[numpy(w) for w in weights])
    # The MLP's gradients in float64.
    w2 = numpy(layer.output_kernel).astype("float64")
    _, before = mlp_reference(layer, x[0])  # (query, key, width)
    g = np.moveaxis(upstream[0], 0, -1)  # (query, key, heads)
    on = (before > 0).astype("float64")
    through = (g @ w2.T) * on  # (query, key, width): dL / d(w1 x + b1)
    expected = [
        (through @ w1.astype("float64"))[None],
        np.einsum("qkw,qk->w", through, x[0]),
        through.sum((0, 1)),
        np.einsum("qkw,qkh->wh", np.maximum(before, 0.0), g),
    ]
    for name, mine, theirs in zip(["x", "w1", "b1", "w2"], got, expected):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"num_heads": 0}, "num_heads"),
        ({"mlp_width": 0}, "mlp_width"),
        ({"init_c": 0.0}, "init_c"),
        ({"init_threshold": -1.0}, "init_threshold"),
        ({"eps": float("nan")}, "eps"),
        ({"bidirectional": "yes"}, "bidirectional"),
        ({"kernel_initializer": "nope"}, "kernel_initializer"),
        ({"bias_initializer": 3}, "bias_initializer"),
    ],
)
def test_bad_arguments_are_refused(arguments, match):
    arguments = {"num_heads": 2, **arguments}
    with pytest.raises(ValueError, match=match):
        FireBias(**arguments)


def test_num_heads_must_equal_the_attentions():
    with pytest.raises(ValueError, match="num_heads"):
        PositionalMultiHeadAttention(num_heads=4, key_dim=8, position=FireBias(2))
