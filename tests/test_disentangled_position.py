"""DisentangledPosition against Hugging Face's DeBERTa-v2 attention and keras-hub's.

The fixture `fixtures/relative_attention.npz` holds the outputs of
transformers' own `DisentangledSelfAttention` in float64, with its weights
(made by `fixtures/generate_relative_attention.py`); the log buckets are
checked against a float64 loop over the formula.
"""

import json
import math
import os

import keras
import numpy as np
import pytest

from keras_posenc import DisentangledPosition
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import ops
from tests.backend import XLA
from tests.backend import compiled
from tests.backend import numpy

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "relative_attention.npz")
CASES = [
    "deberta_share_c2p_p2c",
    "deberta_noshare_c2p_p2c",
    "deberta_noshare_p2c",
    "deberta_nobuckets",
    "deberta_query_len",
]
# Float32 against float64: sums of 8 products of entries about 1, through a
# softmax and a weighted sum of values.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def fixture():
    with np.load(FIXTURE) as arrays:
        return {name: arrays[name] for name in arrays.files}


def read_case(arrays, case):
    """The case's arrays without its prefix, and its config."""
    prefix = f"{case}/"
    values = {
        name[len(prefix) :]: value
        for name, value in arrays.items()
        if name.startswith(prefix)
    }
    return values, json.loads(str(values["config"]))


def heads_kernel(weight, heads):
    """A torch Linear's `(out, in)` weight as an EinsumDense kernel `(in, heads, dim)`."""
    return weight.T.reshape(weight.shape[1], heads, -1).astype("float32")


def heads_bias(bias, heads):
    return bias.reshape(heads, -1).astype("float32")


def attention_like(values, config):
    """A `PositionalMultiHeadAttention` holding the case's weights.

    Its output projection is the identity: the reference's output is the
    context layer, before DeBERTa's `DebertaV2SelfOutput`.
    """
    heads, hidden = config["num_heads"], config["hidden_size"]
    position = DisentangledPosition(
        max_relative_positions=config["max_relative_positions"],
        position_buckets=config["position_buckets"],
        share_att_key=config["share_att_key"],
        pos_att_type=config["pos_att_type"],
        layer_norm="layer_norm" in config["norm_rel_ebd"],
    )
    attention = PositionalMultiHeadAttention(
        num_heads=heads, key_dim=config["head_dim"], position=position
    )
    query_length = config["query_len"]
    attention(
        np.zeros((1, query_length, hidden), "float32"),
        np.zeros((1, config["seq_len"], hidden), "float32"),
    )
    for dense, name in (
        (attention._query_dense, "query_proj"),
        (attention._key_dense, "key_proj"),
        (attention._value_dense, "value_proj"),
    ):
        dense.kernel.assign(heads_kernel(values[f"{name}.weight"], heads))
        dense.bias.assign(heads_bias(values[f"{name}.bias"], heads))
    attention._output_dense.kernel.assign(
        np.eye(hidden, dtype="float32").reshape(heads, -1, hidden)
    )
    attention._output_dense.bias.assign(np.zeros(hidden, "float32"))
    position.embeddings.assign(values["encoder.rel_embeddings.weight"].astype("float32"))
    if position.layer_norm:
        position.layer_norm_gamma.assign(values["encoder.LayerNorm.weight"].astype("float32"))
        position.layer_norm_beta.assign(values["encoder.LayerNorm.bias"].astype("float32"))
    for role, name in (("key", "pos_key_proj"), ("query", "pos_query_proj")):
        if hasattr(position, f"pos_{role}_kernel"):
            getattr(position, f"pos_{role}_kernel").assign(
                heads_kernel(values[f"{name}.weight"], heads)
            )
            getattr(position, f"pos_{role}_bias").assign(
                heads_bias(values[f"{name}.bias"], heads)
            )
    return attention


def inputs_of(values):
    """`(query, value)` inputs of the case, float32."""
    hidden = values["hidden_states"].astype("float32")
    query = values.get("query_states", values["hidden_states"]).astype("float32")
    return query, hidden


def attended_rows(allowed):
    """The queries that may attend to some key, `(batch, query)`."""
    return allowed.any(axis=-1)


@pytest.mark.parametrize("variant", ["nomask", "mask"])
@pytest.mark.parametrize("case", CASES)
def test_outputs_equal_hugging_face(fixture, case, variant):
    values, config = read_case(fixture, case)
    attention = attention_like(values, config)
    query, hidden = inputs_of(values)
    allowed = values[f"{variant}/allowed"]
    output = numpy(
        attention(
            query, hidden, attention_mask=None if variant == "nomask" else allowed
        )
    )
    expected = values[f"{variant}/output"]
    # Hugging Face gives a query with every key masked (a padded query of
    # the encoder's square mask) the same weight on every key; Keras gives
    # it none, as `keras.layers.MultiHeadAttention` does.
    rows = attended_rows(allowed)
    np.testing.assert_allclose(output[rows], expected[rows], **TOLERANCE)
    np.testing.assert_array_equal(output[~rows], 0.0)


@pytest.mark.parametrize("case", CASES)
def test_relative_positions_equal_hugging_face(fixture, case):
    values, config = read_case(fixture, case)
    positions = ops.build_relative_position(
        np.arange(config["query_len"]),
        np.arange(config["seq_len"]),
        config["position_buckets"],
        config["max_relative_positions"],
    )
    np.testing.assert_array_equal(numpy(positions), values["relative_pos"])


def test_outputs_equal_keras_hub(fixture):
    try:
        from keras_hub.src.models.deberta_v3.disentangled_self_attention import (
            DisentangledSelfAttention,
        )
    except ImportError as error:
        pytest.skip(f"keras_hub is not importable here: {error}")
    values, config = read_case(fixture, "deberta_share_c2p_p2c")
    heads, hidden = config["num_heads"], config["hidden_size"]
    # Seven tokens: relative positions up to 6. keras-hub computes its
    # buckets with a float32 log that, on TensorFlow, puts 7 (here
    # `max_relative_positions - 1`, the last distance of bucket 3 in Hugging
    # Face's code and in the fixture) in bucket 4.
    query = inputs_of(values)[0][:, :7]
    hub = DisentangledSelfAttention(
        num_heads=heads,
        hidden_dim=hidden,
        max_position_embeddings=config["max_relative_positions"],
        bucket_size=config["position_buckets"],
        dropout=0.0,
    )
    # After the LayerNorm, one per batch element as keras-hub's backbone
    # repeats it.
    table = np.repeat(values["rel_embeddings"].astype("float32")[None], len(query), 0)
    hub.build(query.shape)
    # keras-hub 0.32 passes the mask to its `Softmax` layer positionally,
    # which Keras 3.15's `Layer.__call__` refuses ("got multiple values for
    # argument 'mask'"); without a mask that softmax is the plain one.
    hub._masked_softmax = lambda scores, attention_mask=None: keras.ops.softmax(
        scores, axis=-1
    )
    for dense, name in (
        (hub._query_dense, "query_proj"),
        (hub._key_dense, "key_proj"),
        (hub._value_dense, "value_proj"),
    ):
        dense.kernel.assign(heads_kernel(values[f"{name}.weight"], heads))
        dense.bias.assign(heads_bias(values[f"{name}.bias"], heads))
    hub._output_dense.kernel.assign(np.eye(hidden, dtype="float32"))
    hub._output_dense.bias.assign(np.zeros(hidden, "float32"))
    expected = numpy(hub(query, rel_embeddings=table))
    attention = attention_like(values, config)
    np.testing.assert_allclose(numpy(attention(query, query)), expected, **TOLERANCE)


def reference_log_bucket(relative_position, bucket_size, max_position):
    """Hugging Face's `make_log_bucket_position`, in float64, one at a time."""
    mid = bucket_size // 2
    buckets = []
    for r in relative_position:
        if abs(r) <= mid:
            buckets.append(r)
            continue
        log_position = mid + math.ceil(
            math.log(abs(r) / mid) / math.log((max_position - 1) / mid) * (mid - 1)
        )
        buckets.append(int(math.copysign(log_position, r)))
    return np.array(buckets)


@pytest.mark.parametrize(
    "bucket_size, max_position",
    [(4, 8), (256, 512), (128, 512), (32, 64), (6, 20), (7, 40), (2, 9)],
)
def test_log_buckets_equal_float64_reference(bucket_size, max_position):
    distances = np.arange(-4 * max_position, 4 * max_position + 1)
    expected = reference_log_bucket(distances, bucket_size, max_position)
    buckets = ops.make_log_bucket_position(distances, bucket_size, max_position)
    assert keras.backend.standardize_dtype(buckets.dtype) == "int32"
    np.testing.assert_array_equal(numpy(buckets), expected)
    under_xla = compiled(
        lambda r: ops.make_log_bucket_position(r, bucket_size, max_position)
    )
    np.testing.assert_array_equal(numpy(under_xla(distances.astype("int32"))), expected)


def test_log_buckets_of_far_distances():
    # Past max_position the buckets go on growing, slowly, and stay odd.
    distances = np.array([511, 512, 1000, 10**5, 10**7, 2**31 - 1])
    expected = reference_log_bucket(distances, 256, 512)
    np.testing.assert_array_equal(
        numpy(ops.make_log_bucket_position(distances, 256, 512)), expected
    )
    np.testing.assert_array_equal(
        numpy(ops.make_log_bucket_position(-distances, 256, 512)), -expected
    )
    assert expected[0] == 255 and expected[1] == 256


def random_attention(seed=0, **arguments):
    """Attention of 2 heads of 8 over 16 features, with random weights."""
    position = DisentangledPosition(
        **{"max_relative_positions": 16, "position_buckets": 8, **arguments}
    )
    attention = PositionalMultiHeadAttention(num_heads=2, key_dim=8, position=position)
    attention(np.zeros((1, 1, 16), "float32"), np.zeros((1, 1, 16), "float32"))
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    return attention


def random_tokens(shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def attention_model(attention, length=12):
    tokens = keras.Input((length, 16))
    return keras.Model(tokens, attention(tokens, tokens))


@pytest.mark.parametrize("share_att_key", [True, False])
def test_xla_equals_eager(share_att_key):
    attention = random_attention(share_att_key=share_att_key)
    model = attention_model(attention)
    tokens = random_tokens((2, 12, 16))
    eager = numpy(model(tokens))
    model.compile(jit_compile=XLA)
    np.testing.assert_allclose(
        model.predict(tokens, verbose=0), eager, rtol=1e-6, atol=1e-6
    )


def test_mixed_bfloat16_is_close_to_float32():
    tokens = random_tokens((2, 12, 16))
    expected = numpy(random_attention()(tokens, tokens))
    keras.config.set_dtype_policy("mixed_bfloat16")
    attention = random_attention()
    position = attention.position
    assert {weight.dtype for weight in position.weights} == {"float32"}
    output = attention(tokens, tokens)
    assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
    output = numpy(keras.ops.cast(output, "float32"))
    # bfloat16 keeps 8 bits: outputs about 1 within a few of its ulps.
    np.testing.assert_allclose(output, expected, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("share_att_key", [True, False])
def test_keras_file_round_trip(tmp_path, share_att_key):
    attention = random_attention(share_att_key=share_att_key, pos_att_type="p2c|c2p")
    model = attention_model(attention)
    tokens = random_tokens((2, 12, 16))
    path = tmp_path / "deberta.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(tokens)), numpy(model(tokens)))


def test_config_round_trip():
    initializer = keras.initializers.RandomNormal(stddev=0.02, seed=1)
    layer = DisentangledPosition(
        max_relative_positions=128,
        position_buckets=-1,
        share_att_key=False,
        pos_att_type="c2p",
        layer_norm=False,
        layer_norm_epsilon=1e-5,
        embeddings_initializer=initializer,
        kernel_initializer="he_normal",
        bias_initializer="ones",
        name="deberta",
    )
    config = layer.get_config()
    assert config["pos_att_type"] == ["c2p"]
    assert config["position_buckets"] == -1
    rebuilt = DisentangledPosition.from_config(config)
    assert rebuilt.get_config() == config
    assert rebuilt.span == 128
    assert isinstance(rebuilt.embeddings_initializer, keras.initializers.RandomNormal)


@pytest.mark.parametrize(
    "arguments",
    [{}, {"share_att_key": False}, {"pos_att_type": ["p2c"]}, {"position_buckets": 0}],
    ids=["shared", "own", "p2c", "no_buckets"],
)
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
    np.testing.assert_allclose(
        np.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5
    )


def test_shifted_explicit_positions_equal_the_defaults():
    attention = random_attention()
    query, value = random_tokens((2, 4, 16)), random_tokens((2, 9, 16), seed=2)
    expected = numpy(attention(query, value))
    for shift in (5, -300):
        shifted = attention(
            query,
            value,
            query_positions=np.arange(4) + shift,
            key_positions=np.arange(9) + shift,
        )
        np.testing.assert_allclose(numpy(shifted), expected, rtol=1e-6, atol=1e-6)


def test_keys_far_away_share_the_edge_rows():
    # Beyond max_relative_positions every key reads the table's first or
    # last row: moving it further changes nothing.
    attention = random_attention()
    query, value = random_tokens((1, 1, 16)), random_tokens((1, 3, 16), seed=2)
    outputs = [
        numpy(
            attention(
                query,
                value,
                query_positions=[50],
                key_positions=[0, 50 - far, 50 + far],
            )
        )
        for far in (20, 200)
    ]
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)


def test_weights_are_named_and_sized_by_the_attention():
    shared = random_attention().position
    assert [weight.path.split("/")[-1] for weight in shared.weights] == [
        "embeddings",
        "layer_norm_gamma",
        "layer_norm_beta",
    ]
    assert tuple(shared.embeddings.shape) == (16, 16)
    own = random_attention(share_att_key=False, layer_norm=False).position
    assert [tuple(weight.shape) for weight in own.weights] == [
        (16, 16),
        (16, 2, 8),
        (2, 8),
        (16, 2, 8),
        (2, 8),
    ]
    no_buckets = random_attention(position_buckets=-1).position
    assert tuple(no_buckets.embeddings.shape) == (32, 16)


def test_logits_scale_counts_the_terms():
    assert DisentangledPosition(pos_att_type=["c2p"]).logits_scale(8) == 1 / 4
    assert DisentangledPosition().logits_scale(8) == pytest.approx(1 / math.sqrt(24))


def test_building_for_other_sizes_raises():
    layer = DisentangledPosition(max_relative_positions=16, position_buckets=8)
    layer.build_for_attention(2, 8, 8, features=16)
    layer.build_for_attention(2, 8, 8, features=16)
    with pytest.raises(ValueError, match="features"):
        layer.build_for_attention(2, 8, 8, features=32)
    with pytest.raises(ValueError, match="features"):
        DisentangledPosition().build_for_attention(2, 8, 8)


def test_shared_projections_with_keys_of_another_width_raise_naming_the_argument():
    # The table has the queries' width; the key projection takes the keys'.
    attention = PositionalMultiHeadAttention(
        2, 8, position=DisentangledPosition(max_relative_positions=16, position_buckets=8)
    )
    query = np.zeros((1, 5, 16), "float32")
    value = np.zeros((1, 5, 12), "float32")
    with pytest.raises(ValueError, match="share_att_key.*width 12"):
        attention(query, value)
    own = PositionalMultiHeadAttention(
        2,
        8,
        position=DisentangledPosition(
            max_relative_positions=16, position_buckets=8, share_att_key=False
        ),
    )
    assert tuple(own(query, value).shape) == (1, 5, 16)


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"max_relative_positions": 0}, "max_relative_positions"),
        ({"max_relative_positions": 2.5}, "max_relative_positions"),
        ({"max_relative_positions": 5, "position_buckets": 8}, "max_relative_positions"),
        ({"position_buckets": 1}, "position_buckets"),
        ({"position_buckets": 4.0}, "position_buckets"),
        ({"position_buckets": True}, "position_buckets"),
        ({"share_att_key": 1}, "share_att_key"),
        ({"pos_att_type": "p2p"}, "pos_att_type"),
        ({"pos_att_type": []}, "pos_att_type"),
        ({"pos_att_type": ["c2p", "c2p"]}, "pos_att_type"),
        ({"pos_att_type": None}, "pos_att_type"),
        ({"layer_norm": "layer_norm"}, "layer_norm"),
        ({"layer_norm_epsilon": 0.0}, "layer_norm_epsilon"),
        ({"layer_norm_epsilon": "1e-7"}, "layer_norm_epsilon"),
        ({"embeddings_initializer": "no_such"}, "embeddings_initializer"),
        ({"kernel_initializer": "no_such"}, "kernel_initializer"),
        ({"bias_initializer": "no_such"}, "bias_initializer"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        DisentangledPosition(**arguments)


@pytest.mark.parametrize(
    "arguments, name",
    [
        ({"bucket_size": 1, "max_position": 8}, "bucket_size"),
        ({"bucket_size": 8, "max_position": 5}, "max_position"),
        ({"bucket_size": 8, "max_position": 0}, "max_position"),
    ],
)
def test_bad_log_bucket_arguments_raise_value_error_naming_them(arguments, name):
    with pytest.raises(ValueError, match=name):
        ops.make_log_bucket_position(np.arange(3), **arguments)


def test_float_relative_positions_are_refused():
    with pytest.raises(ValueError, match="integer"):
        ops.make_log_bucket_position(np.arange(3.0), 4, 8)


@pytest.mark.parametrize("queries, keys", [(1, 5), (3, 7), (7, 3), (0, 5), (5, 0), (0, 0)])
def test_any_lengths_read_the_same_rows_by_either_path(queries, keys):
    # The window of the default positions against the rows of positions
    # given; no queries or no keys add nothing, as without a scheme.
    attention = PositionalMultiHeadAttention(
        num_heads=2,
        key_dim=8,
        position=DisentangledPosition(max_relative_positions=8, position_buckets=4),
    )
    attention(np.ones((1, 3, 16), "float32"), np.ones((1, 3, 16), "float32"))
    rng = np.random.default_rng(8)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    query = rng.normal(size=(2, queries, 16)).astype("float32")
    value = rng.normal(size=(2, keys, 16)).astype("float32")
    default = keras.ops.convert_to_numpy(attention(query, value))
    assert default.shape == (2, queries, 16)
    given = attention(
        query, value, query_positions=np.arange(queries), key_positions=np.arange(keys)
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(given), default, atol=2e-5)
