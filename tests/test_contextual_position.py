"""ContextualPosition (CoPE) against x-transformers' `CoPE` and a float64 formula.

The fixture `fixtures/cope.npz` holds x-transformers' own `CoPE` term and
its `Attend`'s output in float64 (made by `fixtures/generate_cope.py`);
the float64 NumPy reference below is the paper's formula (Golovneva et
al. 2024, eq. 3 to 5), written from it.
"""

import os

import keras
import numpy as np
import pytest

from keras_posenc import AttentionContext
from keras_posenc import ContextualPosition
from keras_posenc import PositionalMultiHeadAttention
from tests.backend import BACKEND
from tests.backend import XLA
from tests.backend import compiled
from tests.backend import numpy

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "cope.npz")
# Float32 against float64: sums of 8 products of entries about 1, a
# sigmoid, sums of up to 12 gates, a softmax and a weighted sum of values.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
HEADS, KEY_DIM, FEATURES = 2, 8, 16


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as arrays:
        return {name: arrays[name] for name in arrays.files}


def heads_last(x):
    """`(batch, heads, length, dim)` as `(batch, length, heads * dim)`, float32."""
    batch, heads, length, dim = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, length, heads * dim).astype("float32")


def identity_attention(max_positions, table):
    """Attention of 2 heads of 8 whose projections are the identity."""
    cope = ContextualPosition(max_positions)
    attention = PositionalMultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM, position=cope)
    tokens = np.zeros((1, 1, FEATURES), "float32")
    attention(tokens, tokens, use_causal_mask=True)
    eye = np.eye(FEATURES, dtype="float32")
    for dense in (attention._query_dense, attention._key_dense, attention._value_dense):
        dense.kernel.assign(eye.reshape(FEATURES, HEADS, KEY_DIM))
        dense.bias.assign(np.zeros((HEADS, KEY_DIM), "float32"))
    attention._output_dense.kernel.assign(eye.reshape(HEADS, KEY_DIM, FEATURES))
    attention._output_dense.bias.assign(np.zeros(FEATURES, "float32"))
    cope.embeddings.assign(table.astype("float32"))
    return attention


@pytest.mark.parametrize("case, first", [("full", 0), ("last", 8)])
def test_logits_term_equals_x_transformers(fixture, case, first):
    table = fixture["pos_emb"]
    cope = ContextualPosition(max_positions=table.shape[0])
    cope.build_for_attention(HEADS, KEY_DIM, KEY_DIM)
    cope.embeddings.assign(table.astype("float32"))
    query = fixture[f"{case}/q"].transpose(0, 2, 1, 3) / np.sqrt(KEY_DIM)
    key = fixture[f"{case}/k"].transpose(0, 2, 1, 3)
    context = AttentionContext(
        query_positions=np.arange(first, 12, dtype="int32")[None],
        key_positions=np.arange(12, dtype="int32")[None],
        causal=True,
    )
    bias = numpy(cope.logits_bias(query.astype("float32"), key.astype("float32"), context))
    # Every entry, the keys after the query too (gate 0: position 0, e[0]).
    np.testing.assert_allclose(bias, fixture[f"{case}/bias"], **TOLERANCE)


@pytest.mark.parametrize("case, first", [("full", 0), ("last", 8)])
def test_attention_equals_x_transformers(fixture, case, first):
    attention = identity_attention(6, fixture["pos_emb"])
    query, key, value = (heads_last(fixture[f"{case}/{name}"]) for name in "qkv")
    output = attention(
        query,
        value,
        key=key,
        use_causal_mask=True,
        query_positions=np.arange(first, 12),
    )
    np.testing.assert_allclose(
        numpy(output), heads_last(fixture[f"{case}/output"]), **TOLERANCE
    )


def reference_term(query, key, table, query_positions, key_positions):
    """The paper's CoPE term in float64, one query at a time.

    Args:
        query, key: `(length, key_dim)` of one head, unscaled.
        table: `(max_positions, key_dim)`, `e`.
        query_positions, key_positions: the tokens' positions.

    Returns:
        `(query, key)`: `q_i . e[p_ij]`, `p_ij = sum_{t = j}^{i} g_it` over
        the keys from `j` on that the query sees, interpolated.
    """
    last = len(table) - 1
    term = np.zeros((len(query), len(key)))
    for i, q in enumerate(query):
        seen = key_positions <= query_positions[i]
        gates = np.where(seen, 1 / (1 + np.exp(-(key @ q) / np.sqrt(len(q)))), 0.0)
        for j in range(len(key)):
            position = min(gates[j:].sum(), last)
            low, high = int(np.floor(position)), int(np.ceil(position))
            weight = position - low
            term[i, j] = (1 - weight) * (q @ table[low]) + weight * (q @ table[high])
    return term


def reference_attention(attention, tokens, query_positions=None):
    """The causal attention with the CoPE term, float64, from its weights."""
    weights = {w.path.split("/")[-2] + "/" + w.path.split("/")[-1]: numpy(w) for w in attention.weights}
    table = numpy(attention.position.embeddings).astype("float64")
    length = tokens.shape[1]
    query_positions = np.arange(length) if query_positions is None else query_positions
    key_positions = query_positions

    def project(name):
        kernel, bias = weights[f"{name}/kernel"], weights[f"{name}/bias"]
        return np.einsum("bsf,fnd->bsnd", tokens.astype("float64"), kernel) + bias

    query, key, value = project("query"), project("key"), project("value")
    outputs = np.zeros(query.shape)
    for b in range(len(tokens)):
        for n in range(query.shape[2]):
            q, k = query[b, :, n], key[b, :, n]
            logits = q @ k.T / np.sqrt(q.shape[-1]) + reference_term(
                q, k, table, query_positions, key_positions
            )
            allowed = key_positions[None] <= query_positions[:, None]
            logits = np.where(allowed, logits, -np.inf)
            probabilities = np.exp(logits - logits.max(-1, keepdims=True))
            probabilities /= probabilities.sum(-1, keepdims=True)
            outputs[b, :, n] = probabilities @ value[b, :, n]
    return (
        np.einsum("btnd,ndf->btf", outputs, weights["attention_output/kernel"])
        + weights["attention_output/bias"]
    )


def random_attention(max_positions=6, seed=0):
    """Attention of 2 heads of 8 over 16 features, random weights, a random table."""
    attention = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, position=ContextualPosition(max_positions)
    )
    tokens = np.zeros((1, 1, FEATURES), "float32")
    attention(tokens, tokens, use_causal_mask=True)
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    return attention


def random_tokens(shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def test_outputs_equal_float64_reference():
    attention = random_attention()
    tokens = random_tokens((2, 12, FEATURES))
    np.testing.assert_allclose(
        numpy(attention(tokens, tokens, use_causal_mask=True)),
        reference_attention(attention, tokens),
        **TOLERANCE,
    )


def test_blocks_of_queries_equal_float64_reference():
    # 512 queries: two blocks of `query_block`; eight rows, so that most
    # keys reach the clamp.
    attention = random_attention(max_positions=8)
    tokens = random_tokens((1, 512, FEATURES), seed=3)
    np.testing.assert_allclose(
        numpy(attention(tokens, tokens, use_causal_mask=True)),
        reference_attention(attention, tokens),
        # CoPE's positions are float32 sums of up to 512 gates (an ulp of
        # 3e-5 there), which XLA may add in another order (jaxlib 0.12).
        rtol=1e-4,
        atol=1e-4,
    )


def test_positions_given_equal_the_reference():
    # Packed sequences' positions restart: a key counts for a query where
    # its position is not after the query's, in the order of the keys.
    attention = random_attention()
    tokens = random_tokens((1, 10, FEATURES), seed=4)
    positions = np.array([0, 1, 2, 3, 0, 1, 2, 3, 4, 5])
    output = attention(
        tokens,
        tokens,
        use_causal_mask=True,
        query_positions=positions,
        key_positions=positions,
    )
    np.testing.assert_allclose(
        numpy(output), reference_attention(attention, tokens, positions), **TOLERANCE
    )


def test_left_padding_changes_nothing_for_the_real_tokens():
    # The pads come before every real key: they count for no real key.
    attention = random_attention()
    tokens = random_tokens((1, 8, FEATURES), seed=5)
    expected = numpy(attention(tokens, tokens, use_causal_mask=True))
    padded = np.concatenate([random_tokens((1, 3, FEATURES), seed=6), tokens], axis=1)
    positions = np.concatenate([np.zeros(3, "int64"), np.arange(8)])
    real = np.arange(11) >= 3
    output = attention(
        padded,
        padded,
        use_causal_mask=True,
        query_positions=positions,
        key_positions=positions,
        attention_mask=np.broadcast_to(real[None, None], (1, 11, 11)),
    )
    np.testing.assert_allclose(numpy(output)[:, 3:], expected, **TOLERANCE)


def attention_model(attention, length=12):
    tokens = keras.Input((length, FEATURES))
    return keras.Model(tokens, attention(tokens, tokens, use_causal_mask=True))


def test_xla_equals_eager():
    model = attention_model(random_attention())
    tokens = random_tokens((2, 12, FEATURES))
    eager = numpy(model(tokens))
    model.compile(jit_compile=XLA)
    # XLA sums the gates' counts in another order: a few float32 ulps.
    np.testing.assert_allclose(model.predict(tokens, verbose=0), eager, rtol=1e-5, atol=1e-5)


def test_mixed_bfloat16_is_close_to_float32():
    tokens = random_tokens((2, 12, FEATURES))
    expected = numpy(random_attention()(tokens, tokens, use_causal_mask=True))
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        attention = random_attention()
        assert {weight.dtype for weight in attention.position.weights} == {"float32"}
        query = keras.ops.cast(random_tokens((2, 12, HEADS, KEY_DIM)), "bfloat16")
        context = AttentionContext(
            query_positions=np.arange(12, dtype="int32")[None],
            key_positions=np.arange(12, dtype="int32")[None],
            causal=True,
        )
        bias = attention.position.logits_bias(query, query, context)
        assert keras.backend.standardize_dtype(bias.dtype) == "float32"
        output = attention(tokens, tokens, use_causal_mask=True)
    finally:
        keras.config.set_dtype_policy("float32")
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    # bfloat16 keeps 8 bits: outputs about 1 within a few of its ulps.
    np.testing.assert_allclose(
        numpy(keras.ops.cast(output, "float32")), expected, rtol=0.05, atol=0.05
    )


def test_keras_file_round_trip(tmp_path):
    model = attention_model(random_attention())
    tokens = random_tokens((2, 12, FEATURES))
    path = tmp_path / "cope.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(tokens)), numpy(model(tokens)))


def test_config_round_trip():
    initializer = keras.initializers.RandomNormal(stddev=0.02, seed=1)
    layer = ContextualPosition(
        max_positions=16, embeddings_initializer=initializer, name="cope"
    )
    config = layer.get_config()
    assert config["max_positions"] == 16
    rebuilt = ContextualPosition.from_config(config)
    assert rebuilt.get_config() == config
    assert isinstance(rebuilt.embeddings_initializer, keras.initializers.RandomNormal)


def test_cached_decoding_equals_one_causal_pass():
    attention = random_attention()
    tokens = random_tokens((2, 10, FEATURES))
    expected = numpy(attention(tokens, tokens, use_causal_mask=True))
    # Slots not yet written hold noise: they must count nothing.
    cache = random_tokens((2, 2, 13, HEADS, KEY_DIM), seed=9) * 10
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
    np.testing.assert_allclose(np.concatenate(outputs, axis=1), expected, **TOLERANCE)


def test_unwritten_slots_count_nothing_at_any_positions():
    # Slots given positions before the query's but not yet written: gate 0.
    cope = ContextualPosition(max_positions=6)
    cope.build_for_attention(HEADS, KEY_DIM, KEY_DIM)
    cope.embeddings.assign(random_tokens((6, KEY_DIM), seed=2))
    query = random_tokens((1, 1, HEADS, KEY_DIM), seed=3)
    key = random_tokens((1, 5, HEADS, KEY_DIM), seed=4)
    noisy = np.concatenate([key, 100 * random_tokens((1, 3, HEADS, KEY_DIM))], axis=1)

    def term(keys, index):
        context = AttentionContext(
            query_positions=np.array([[20]], "int32"),
            key_positions=np.arange(keys.shape[1], dtype="int32")[None],
            causal=True,
            cache_update_index=index,
        )
        return numpy(cope.logits_bias(query, keys, context))

    np.testing.assert_allclose(term(noisy, 4)[..., :5], term(key, 4), **TOLERANCE)


def test_a_call_without_the_causal_mask_is_refused():
    attention = random_attention()
    tokens = random_tokens((1, 4, FEATURES))
    with pytest.raises(ValueError, match="use_causal_mask=True"):
        attention(tokens, tokens)


@pytest.mark.parametrize("queries, keys", [(0, 5), (5, 0), (0, 0)])
def test_no_queries_or_no_keys_add_nothing(queries, keys):
    attention = random_attention()
    plain = PositionalMultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM)
    query = random_tokens((2, queries, FEATURES))
    value = random_tokens((2, keys, FEATURES), seed=2)
    plain(query, value)
    projections = [w for w in attention.weights if w.path.split("/")[-1] != "embeddings"]
    for mine, theirs in zip(plain.weights, projections, strict=True):
        mine.assign(theirs)
    output = numpy(attention(query, value, use_causal_mask=True))
    assert output.shape == (2, queries, FEATURES)
    np.testing.assert_allclose(output, numpy(plain(query, value, use_causal_mask=True)))


def test_training_moves_every_weight():
    inputs = keras.Input((8, FEATURES))
    attention = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, position=ContextualPosition(4)
    )
    model = keras.Model(
        inputs, keras.layers.Dense(1)(attention(inputs, inputs, use_causal_mask=True))
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 8, FEATURES)).astype("float32")
    # The table starts at zero, as the paper's.
    np.testing.assert_array_equal(numpy(attention.position.embeddings), 0.0)
    model.fit(x, np.cumsum(x[..., :1], 1), epochs=2, verbose=0)
    assert not np.allclose(numpy(attention.position.embeddings), 0.0)


def test_weights_are_named_and_sized_by_the_attention():
    cope = random_attention(max_positions=5).position
    assert [weight.path.split("/")[-1] for weight in cope.weights] == ["embeddings"]
    assert tuple(cope.embeddings.shape) == (5, KEY_DIM)
    cope.build_for_attention(4, KEY_DIM, 3)  # another attention, same key_dim
    with pytest.raises(ValueError, match="key_dim"):
        cope.build_for_attention(HEADS, 4, 4)


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"max_positions": 0}, "max_positions"),
        ({"max_positions": 2.5}, "max_positions"),
        ({"max_positions": True}, "max_positions"),
        ({"max_positions": 4, "embeddings_initializer": "no_such"}, "embeddings_initializer"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        ContextualPosition(**arguments)


def test_a_nan_query_token_gives_nan_where_it_attends():
    # Every backend, eager and compiled: NaN shows, rather than an index
    # error of the table's read (TensorFlow's eager gather).
    attention = PositionalMultiHeadAttention(2, 4, position=ContextualPosition(4))
    tokens = np.random.default_rng(0).normal(size=(1, 4, 8)).astype("float32")
    attention(tokens, tokens, use_causal_mask=True)
    tokens[0, 1, 0] = np.nan
    def call(x):
        return attention(x, x, use_causal_mask=True)

    for run in (call, compiled(call)) if BACKEND != "torch" else (call,):
        output = numpy(run(tokens))
        # Every later query counts the NaN key 1 (query 0's zero weight on
        # its NaN value is NaN too, as in Keras' own attention).
        assert np.isnan(output[0, 1:]).all()
