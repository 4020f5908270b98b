"""The public scheme protocol: a scheme written outside the package.

`Probe` uses every hook: it scales the keys by their positions, reads the
keys in its bias (a content bias `u . k_j`, as Transformer-XL's), adds a
term to the values and divides the logits by more than `sqrt(key_dim)`.
Its attention is compared with float64 NumPy of the same formulas.
"""

import numpy as np
import pytest

import keras

import keras_posenc
from keras_posenc import AttentionContext
from keras_posenc import AttentionPosition
from keras_posenc import PositionalMultiHeadAttention
from tests.backend import numpy

HEADS, KEY_DIM, FEATURES = 2, 4, 6


@keras.saving.register_keras_serializable(package="test_protocol")
class Probe(AttentionPosition):
    """Every hook, each with a term a reference can compute."""

    def __init__(self, decay=0.25, **kwargs):
        super().__init__(**kwargs)
        self.decay = decay
        self.seen = []

    def build_for_attention(self, num_heads, key_dim, value_dim, features=None):
        self.sizes = (num_heads, key_dim, value_dim, features)
        self.content_bias = self.add_weight(
            name="content_bias", shape=(num_heads, key_dim), initializer="ones"
        )
        self.value_bias = self.add_weight(
            name="value_bias", shape=(num_heads, value_dim), initializer="ones"
        )
        self.built = True

    def logits_scale(self, key_dim):
        return 1.0 / np.sqrt(2 * key_dim)

    def transform_query_key(self, query, key, context):
        self.seen.append(context)
        factor = 1.0 + 0.1 * keras.ops.cast(context.key_positions, key.dtype)
        return query, key * factor[:, :, None, None]

    def logits_bias(self, query, key, context):
        self.seen.append(context)
        distance = keras.ops.cast(
            context.key_positions[:, None, :] - context.query_positions[:, :, None],
            "float32",
        )  # (batch or 1, query, key)
        content = keras.ops.einsum(
            "bknd,nd->bnk", keras.ops.cast(key, "float32"), self.content_bias
        )[:, :, None]  # (batch, heads, 1, key)
        return content - self.decay * keras.ops.abs(distance)[:, None]

    def value_term(self, attention_weights, context):
        # Linear in the weights: each query's weights times the bias.
        total = keras.ops.sum(attention_weights, axis=-1)  # (batch, heads, query)
        return keras.ops.transpose(total, (0, 2, 1))[..., None] * self.value_bias

    def get_config(self):
        return {**super().get_config(), "decay": self.decay}


def reference(attention, query_inputs, value_inputs, query_positions, key_positions, causal):
    """Float64 NumPy of `Probe`'s attention, from the layer's weights."""
    def read(weight):
        return numpy(weight).astype("float64")

    def dense(layer, x):
        return np.einsum("btf,fnd->btnd", x, read(layer.kernel)) + read(layer.bias)

    q = dense(attention._query_dense, query_inputs)
    k = dense(attention._key_dense, value_inputs)
    v = dense(attention._value_dense, value_inputs)
    k = k * (1.0 + 0.1 * key_positions)[None, :, None, None]
    q = q / np.sqrt(2 * KEY_DIM)
    logits = np.einsum("btnd,bsnd->bnts", q, k)
    logits += np.einsum("bsnd,nd->bns", k, read(attention.position.content_bias))[:, :, None]
    distance = key_positions[None, :] - query_positions[:, None]
    logits -= 0.25 * np.abs(distance)[None, None]
    if causal:
        logits = np.where(distance[None, None] <= 0, logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    probabilities = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    heads = np.einsum("bnts,bsnd->btnd", probabilities, v) + read(
        attention.position.value_bias
    )
    output = attention._output_dense
    return np.einsum("btnd,ndf->btf", heads, read(output.kernel)) + read(output.bias)


def make_attention():
    attention = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, position=Probe(name="probe")
    )
    rng = np.random.default_rng(0)
    tokens = rng.normal(size=(2, 5, FEATURES)).astype("float32")
    attention(tokens, tokens)
    for weight in attention.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.5)
    return attention, rng


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_every_hook_against_a_float64_reference(causal):
    attention, rng = make_attention()
    assert attention.position.sizes == (HEADS, KEY_DIM, KEY_DIM, FEATURES)
    queries = rng.normal(size=(2, 3, FEATURES)).astype("float32")
    values = rng.normal(size=(2, 5, FEATURES)).astype("float32")
    query_positions = np.array([2, 3, 4], "int32")
    output = attention(
        queries, values, use_causal_mask=causal, query_positions=query_positions
    )
    expected = reference(
        attention,
        queries.astype("float64"),
        values.astype("float64"),
        query_positions,
        np.arange(5),
        causal,
    )
    np.testing.assert_allclose(numpy(output), expected, rtol=1e-4, atol=1e-4)
    context = attention.position.seen[-1]
    assert isinstance(context, AttentionContext)
    assert context.causal is causal
    assert context.cache_update_index is None and context.adjacency is None
    assert not context.consecutive  # query positions were given
    np.testing.assert_array_equal(numpy(context.query_positions), [[2, 3, 4]])
    # The attention keeps nothing of the call on itself.
    assert not any("call" in name and "state" in name for name in vars(attention))


def test_the_context_gives_the_attentions_own_projections():
    attention, rng = make_attention()
    tokens = rng.normal(size=(1, 5, FEATURES)).astype("float32")
    attention(tokens, tokens)
    context = attention.position.seen[-1]
    table = rng.normal(size=(1, 3, FEATURES)).astype("float32")
    np.testing.assert_allclose(
        numpy(context.project_key(table)),
        numpy(attention._key_dense(table)),
    )
    assert tuple(context.project_query(table).shape) == (1, 3, HEADS, KEY_DIM)
    assert context.consecutive


def test_cached_decoding_equals_one_causal_pass():
    attention, rng = make_attention()
    tokens = rng.normal(size=(2, 5, FEATURES)).astype("float32")
    full = numpy(attention(tokens, tokens, use_causal_mask=True))
    cache = np.zeros((2, 2, 5, HEADS, KEY_DIM), "float32")
    outputs = []
    for index in range(5):
        step, cache = attention(
            tokens[:, index : index + 1],
            tokens[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
        )
        outputs.append(numpy(step))
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)
    context = attention.position.seen[-1]
    assert context.cache_update_index == 4


def test_a_scheme_from_outside_trains_saves_and_loads(tmp_path):
    inputs = keras.Input((8, FEATURES))
    attention = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, position=Probe(decay=0.5)
    )
    outputs = keras.layers.Dense(1)(attention(inputs, inputs, use_causal_mask=True))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(32, 8, FEATURES)).astype("float32")
    y = np.cumsum(x[..., :1], axis=1)
    before = numpy(attention.position.content_bias).copy()
    history = model.fit(x, y, epochs=3, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert not np.allclose(numpy(attention.position.content_bias), before)
    model.save(tmp_path / "probe.keras")
    restored = keras.saving.load_model(tmp_path / "probe.keras")
    assert isinstance(restored.layers[1].position, Probe)
    assert restored.layers[1].position.decay == 0.5
    np.testing.assert_array_equal(
        restored.predict(x, verbose=0), model.predict(x, verbose=0)
    )


def test_a_position_that_is_no_scheme_is_refused_without_a_list_of_names():
    with pytest.raises(ValueError, match="subclassing keras_posenc.AttentionPosition"):
        PositionalMultiHeadAttention(
            num_heads=2, key_dim=4, position=keras.layers.Dense(3)
        )


def test_the_protocol_is_public():
    assert keras_posenc.AttentionPosition is AttentionPosition
    scheme = AttentionPosition()
    context = AttentionContext()
    assert scheme.logits_bias(None, None, context) is None
    assert scheme.value_term(None, context) is None
    assert scheme.transform_query_key(1, 2, context) == (1, 2)
    assert scheme.logits_scale(16) == 0.25
    # The optional speed parts are documented and contribute nothing.
    assert scheme.logits_factors(context) is None
    assert scheme.logits_bias_maxima(context) is None
    assert scheme.query_block is None
    assert not hasattr(scheme, "fused_query_block")


class _Queries(AttentionPosition):
    def transform_query_key(self, query, key, context):
        return query * 2.0, key


class _Bias(_Queries):
    def logits_bias(self, query, key, context):
        return None


def test_contributions_are_the_hooks_a_scheme_overrides():
    assert AttentionPosition().contributions == frozenset()
    assert _Queries().contributions == {"transform_query_key"}
    # Inherited overrides count: a subclass contributes what its base does.
    assert _Bias().contributions == {"transform_query_key", "logits_bias"}
    assert keras_posenc.RotaryEmbedding().contributions == {"transform_query_key"}
    assert keras_posenc.AlibiBias(num_heads=2).contributions == {
        "logits_bias",
        "relative_bias",
    }
    assert keras_posenc.RelativePositionEmbedding(4).contributions == {
        "logits_bias",
        "value_term",
    }


class _WrongQueries(AttentionPosition):
    def transform_query_key(self, query, key, context):
        return query[:, :, :, :2], key


class _WrongBias(AttentionPosition):
    def logits_bias(self, query, key, context):
        return keras.ops.zeros((3, 3))


class _IntegerBias(AttentionPosition):
    def logits_bias(self, query, key, context):
        return keras.ops.zeros((1, 1, 5, 5), dtype="int32")


@pytest.mark.parametrize(
    "scheme, message",
    [
        (_WrongQueries, r"_WrongQueries.transform_query_key must return the query in its shape, \(2, 5, 2, 4\)"),
        (_WrongBias, r"_WrongBias.logits_bias must return None or a float tensor broadcastable to \(batch, heads, query, key\), here \(2, 2, 5, 5\).*shape \(3, 3\)"),
        (_IntegerBias, r"_IntegerBias.logits_bias .*dtype int32"),
    ],
    ids=["queries-of-another-shape", "bias-of-another-shape", "integer-bias"],
)
def test_a_scheme_hook_of_the_wrong_shape_is_named(scheme, message):
    attention = keras_posenc.PositionalMultiHeadAttention(
        num_heads=2, key_dim=4, position=scheme()
    )
    tokens = np.ones((2, 5, 8), "float32")
    with pytest.raises(ValueError, match=message):
        attention(tokens, tokens)
