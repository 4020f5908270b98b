"""The public scheme protocol: a scheme written outside the package.

`Probe` uses every hook: it scales the keys by their positions, reads the
keys in its bias (a content bias `u . k_j`, as Transformer-XL's), adds a
term to the values and divides the logits by more than `sqrt(key_dim)`.
Its attention is compared with float64 NumPy of the same formulas. It
builds as schemes were written before the build path was one, overriding
`build_for_attention`; `Decay` builds the one way, by `build_weights`.
"""

import json
import os
import zipfile

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
        "score_bias",
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


class _ListBias(AttentionPosition):
    def logits_bias(self, query, key, context):
        return [[[[0.0] * 5] * 5] * 2]


class _NarrowValueTerm(AttentionPosition):
    def value_term(self, attention_weights, context):
        return keras.ops.zeros((2, 5, 2, 3))


class _StringScale(AttentionPosition):
    def logits_scale(self, key_dim):
        return "0.5"


@pytest.mark.parametrize(
    "scheme, message",
    [
        (_WrongQueries, r"_WrongQueries.transform_query_key must return the query in its shape, \(2, 5, 2, 4\)"),
        (_WrongBias, r"_WrongBias.logits_bias must return None or a float tensor broadcastable to \(batch, heads, query, key\), here \(2, 2, 5, 5\).*shape \(3, 3\)"),
        (_IntegerBias, r"_IntegerBias.logits_bias .*dtype int32"),
        (_ListBias, r"_ListBias.logits_bias must return None or a float tensor.*Received: list"),
        (_NarrowValueTerm, r"_NarrowValueTerm.value_term must return None or a tensor of shape \(batch, query, heads, value_dim\), here \(2, 5, 2, 4\). Received: \(2, 5, 2, 3\)"),
        (_StringScale, r"_StringScale.logits_scale must return a number.*Received: '0.5'"),
    ],
    ids=[
        "queries-of-another-shape",
        "bias-of-another-shape",
        "integer-bias",
        "bias-a-nested-list",
        "value-term-of-another-width",
        "scale-a-string",
    ],
)
def test_a_scheme_hook_of_the_wrong_shape_is_named(scheme, message):
    attention = keras_posenc.PositionalMultiHeadAttention(
        num_heads=2, key_dim=4, position=scheme()
    )
    tokens = np.ones((2, 5, 8), "float32")
    with pytest.raises(ValueError, match=message):
        attention(tokens, tokens)


@keras.saving.register_keras_serializable(package="test_protocol")
class Decay(AttentionPosition):
    """A bias `-rate_h |j - i|`, its rates made by `build_weights`."""

    weight_sizes = ("num_heads",)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.builds = []

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        self.builds.append((num_heads, key_dim, value_dim, features))
        self.rate = self.add_weight(name="rate", shape=(num_heads,), initializer="ones")

    def logits_bias(self, query, key, context):
        distance = keras.ops.abs(
            context.key_positions[:, None, :] - context.query_positions[:, :, None]
        )  # (batch or 1, query, key)
        return -self.rate[:, None, None] * keras.ops.cast(distance, "float32")[:, None]


def test_build_for_attention_checks_records_and_builds_once():
    decay = Decay()
    assert decay.attention_sizes is None and decay.get_build_config() is None
    tokens = np.ones((1, 3, FEATURES), "float32")
    first = PositionalMultiHeadAttention(num_heads=HEADS, key_dim=KEY_DIM, position=decay)
    first(tokens, tokens)
    sizes = {"num_heads": HEADS, "key_dim": KEY_DIM, "value_dim": KEY_DIM, "features": FEATURES}
    assert decay.attention_sizes == sizes
    assert decay.get_build_config() == sizes
    assert decay.builds == [(HEADS, KEY_DIM, KEY_DIM, FEATURES)]
    (rate,) = decay.weights
    # Shared by an attention of other head sizes: the rates do not read them.
    second = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=2 * KEY_DIM, value_dim=3, position=decay
    )
    second(tokens, tokens)
    assert decay.builds == [(HEADS, KEY_DIM, KEY_DIM, FEATURES)]
    assert decay.weights == [rate]
    assert decay.attention_sizes == sizes
    # The rates are one per head: another number of heads cannot share them.
    third = PositionalMultiHeadAttention(num_heads=HEADS + 1, key_dim=KEY_DIM, position=decay)
    with pytest.raises(
        ValueError,
        match=r"Decay was built for attention with \(num_heads\)=\(2,\).*Received: \(num_heads\)=\(3,\)",
    ):
        third(tokens, tokens)


@pytest.mark.parametrize(
    "sizes, name",
    [((0, 4, 4, 8), "num_heads"), ((2, 4.0, 4, 8), "key_dim"), ((2, 4, 4, 2.5), "features")],
)
def test_bad_sizes_build_nothing_and_are_named(sizes, name):
    decay = Decay()
    with pytest.raises(ValueError, match=f"`{name}` must be a positive integer.*{name}="):
        decay.build_for_attention(*sizes)
    assert not decay.built and decay.builds == [] and decay.attention_sizes is None


def test_a_scheme_sized_by_the_attention_refuses_a_build_on_its_own():
    with pytest.raises(ValueError, match=r"Decay sizes its weights by the attention's num_heads.*build_for_attention.*\(None, 5\)"):
        Decay().build((None, 5))
    # Without `weight_sizes` a scheme builds on its own as any Keras layer.
    scheme = AttentionPosition()
    scheme.build((None, 5))
    assert scheme.built and scheme.attention_sizes is None


def test_a_scheme_keras_cannot_find_is_named_with_what_to_import():
    # Keras imports no package to find a class; a scheme's module that was
    # not imported before loading is named, with the way to register it.
    config = PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=KEY_DIM, position=Probe()
    ).get_config()
    config["position"] = dict(
        config["position"], class_name="Gone", registered_name="elsewhere>Gone"
    )
    with pytest.raises(TypeError) as raised:
        PositionalMultiHeadAttention.from_config(config)
    message = str(raised.value)
    assert message.startswith(
        "`position` of this attention is 'elsewhere>Gone', which Keras does "
        "not know: import the module that registers it"
    )
    assert "Could not locate class 'Gone'" in message


def test_a_scheme_built_for_an_attention_loads_its_sizes_back():
    decay = Decay(name="decay")
    decay.build_for_attention(HEADS, KEY_DIM, 3, FEATURES)
    config = keras.saving.serialize_keras_object(decay)
    assert config["build_config"] == {
        "num_heads": HEADS, "key_dim": KEY_DIM, "value_dim": 3, "features": FEATURES
    }
    restored = keras.saving.deserialize_keras_object(config)
    assert restored.attention_sizes == decay.attention_sizes
    assert restored.builds == [(HEADS, KEY_DIM, 3, FEATURES)]
    assert [tuple(weight.shape) for weight in restored.weights] == [(HEADS,)]


# Each public scheme's required arguments, at two heads where it has heads.
SCHEME_ARGUMENTS = {
    "RotaryEmbedding": {"learned_frequencies": True, "rotary_dim": 2},
    "XPosEmbedding": {},
    "AttentionTemperature": {},
    "AlibiBias": {"num_heads": 2},
    "RelativePositionBias": {"num_heads": 2, "num_buckets": 8, "max_distance": 16},
    "KerpleBias": {"num_heads": 2},
    "FireBias": {"num_heads": 2, "mlp_width": 4},
    "GridRelativePositionBias": {"num_heads": 2, "grid_shape": (2, 3), "num_prefix_tokens": 1},
    "ShortestPathBias": {"num_heads": 2, "max_hops": 3},
    "RelativePositionEmbedding": {"max_relative_position": 3},
    "TransformerXLPosition": {},
    "DisentangledPosition": {"max_relative_positions": 16, "position_buckets": 8, "share_att_key": False},
    "ContextualPosition": {"max_positions": 8},
}
PUBLIC_SCHEMES = sorted(
    name
    for name in keras_posenc.layers.__all__
    if isinstance(getattr(keras_posenc, name), type)
    and issubclass(getattr(keras_posenc, name), AttentionPosition)
    and getattr(keras_posenc, name) is not AttentionPosition
)


def test_every_public_scheme_is_listed_here():
    assert sorted(SCHEME_ARGUMENTS) == PUBLIC_SCHEMES


@pytest.mark.parametrize("name", PUBLIC_SCHEMES)
def test_every_scheme_builds_the_one_way(name):
    scheme_class = getattr(keras_posenc, name)
    for method in ("build_for_attention", "get_build_config"):
        assert getattr(scheme_class, method) is getattr(AttentionPosition, method)
    # RotaryEmbedding alone also reads its older files' build config.
    if name != "RotaryEmbedding":
        assert scheme_class.build_from_config is AttentionPosition.build_from_config


@pytest.mark.parametrize("name", PUBLIC_SCHEMES)
def test_every_scheme_is_built_again_from_its_build_config(name):
    scheme = getattr(keras_posenc, name)(**SCHEME_ARGUMENTS[name])
    scheme.build_for_attention(2, 4, 4, 8)
    config = keras.saving.serialize_keras_object(scheme)
    assert config["build_config"] == {"num_heads": 2, "key_dim": 4, "value_dim": 4, "features": 8}
    restored = keras.saving.deserialize_keras_object(config)
    assert restored.built and restored.attention_sizes == scheme.attention_sizes
    assert [(weight.name, tuple(weight.shape)) for weight in restored.weights] == [
        (weight.name, tuple(weight.shape)) for weight in scheme.weights
    ]


@pytest.mark.parametrize("size", ["num_heads", "key_dim", "value_dim", "features"])
@pytest.mark.parametrize("name", PUBLIC_SCHEMES)
def test_a_shared_scheme_serves_the_sizes_its_weights_fit(name, size):
    # The reference: a scheme built afresh for the other sizes, whose
    # weights either have the shared scheme's shapes or not.
    sizes = {"num_heads": 2, "key_dim": 4, "value_dim": 4, "features": 8}
    other = {**sizes, size: 2 * sizes[size]}

    def built(sizes):
        scheme = getattr(keras_posenc, name)(**SCHEME_ARGUMENTS[name])
        scheme.build_for_attention(**sizes)
        return scheme

    def shapes(scheme):
        return [tuple(weight.shape) for weight in scheme.weights]

    shared = built(sizes)
    weights = list(shared.weights)
    try:
        fresh = built(other)
    except ValueError:
        fresh = None  # no such scheme serves those sizes at all
    if fresh is not None and shapes(fresh) == shapes(shared):
        shared.build_for_attention(**other)
        assert shared.weights == weights
    else:
        with pytest.raises(ValueError):
            shared.build_for_attention(**other)
    assert shared.attention_sizes == sizes


OLD_FILE = os.path.join(os.path.dirname(__file__), "fixtures", "before_one_build_path")
OLD_INPUTS = ("embeddings", "heads", "positions", "grid", "adjacency")


# The file was saved by Keras 3.15, whose MultiHeadAttention config holds
# keys (`use_gate`, `sliding_window`) that older Keras does not take.
@pytest.mark.newest
def test_files_saved_before_the_one_build_path_load():
    # `fixtures/generate_before_one_build_path.py` wrote them: each scheme
    # on its own and inside attention, in the build configs of then.
    with zipfile.ZipFile(f"{OLD_FILE}.keras") as archive:
        layers = json.loads(archive.read("config.json"))["config"]["layers"]
    build_configs = {
        layer["config"]["name"]: (
            layer["config"]["position"] if "position" in layer["config"] else layer
        ).get("build_config")
        for layer in layers
    }
    assert build_configs["rope_learned"] == {"frequencies_shape": [2, 2, 1]}
    assert build_configs["rope_learned_one_head"] == {"frequencies_shape": [1, 4, 1]}
    assert build_configs["shaw"] == {"num_heads": 2, "key_dim": 4, "value_dim": 4}
    assert build_configs["t5"] == {"input_shape": [None, 6]}
    assert build_configs["attention_cope"] == {"key_dim": 4}
    assert build_configs["attention_txl"] == {"num_heads": 2, "key_dim": 4, "features": 8}
    assert build_configs["attention_shared_first"] == {"shapes_dict": {}}
    with np.load(f"{OLD_FILE}.npz") as arrays:
        saved = {name: arrays[name] for name in arrays.files}
    model = keras.saving.load_model(f"{OLD_FILE}.keras", safe_mode=True)
    assert [weight.path for weight in model.weights] == list(saved["paths"])
    outputs = model.predict([saved[f"inputs/{name}"] for name in OLD_INPUTS], verbose=0)
    assert sorted(outputs) == sorted(name[len("outputs/"):] for name in saved if name.startswith("outputs/"))
    for name, output in outputs.items():
        np.testing.assert_allclose(output, saved[f"outputs/{name}"], rtol=1e-5, atol=1e-5, err_msg=name)
    assert model.get_layer("attention_shared_first").position is model.get_layer("attention_shared_second").position
    # A scheme of an attention, deserialized with its old build config,
    # has the weights that the attention built.
    for layer in layers:
        position = layer["config"].get("position")
        if position is None:
            continue
        rebuilt = keras.saving.deserialize_keras_object(position)
        assert rebuilt.built
        built = model.get_layer(layer["config"]["name"]).position
        assert [tuple(weight.shape) for weight in rebuilt.weights] == [
            tuple(weight.shape) for weight in built.weights
        ]


class _HalfBias(AttentionPosition):
    """A distance bias in the dtype given: bfloat16 as a user's mixed code makes it."""

    dtype_of_bias = "bfloat16"

    def logits_bias(self, query, key, context):
        distance = keras.ops.cast(
            context.key_positions[:, None, :] - context.query_positions[:, :, None],
            "float32",
        )  # (batch or 1, query, key)
        return keras.ops.cast(-0.25 * keras.ops.abs(distance)[:, None], self.dtype_of_bias)


class _FloatBias(_HalfBias):
    dtype_of_bias = "float32"


def test_a_bfloat16_bias_joins_the_float32_logits_as_its_float32_value():
    # Each value here (multiples of 0.25 up to 1) is exact in bfloat16, so
    # the float32 scheme is the reference.
    tokens = np.random.default_rng(3).normal(size=(2, 5, 8)).astype("float32")
    outputs = []
    for scheme in (_HalfBias(), _FloatBias()):
        keras.utils.set_random_seed(0)
        attention = keras_posenc.PositionalMultiHeadAttention(2, 4, position=scheme)
        outputs.append(numpy(attention(tokens, tokens)))
    np.testing.assert_array_equal(outputs[0], outputs[1])
