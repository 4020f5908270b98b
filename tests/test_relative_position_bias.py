"""RelativePositionBias: T5's bucketed table, read at the right positions."""

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import RelativePositionBias
from tests import references
from tests.backend import XLA
from tests.backend import gradients
from tests.backend import numpy
from tests.test_case import TestCase
from keras_posenc.layers.attention_position import AttentionContext


def random_table(num_buckets, num_heads, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(num_buckets, num_heads)).astype("float32")


def layer_with_table(num_heads=3, seed=0, **kwargs):
    """A built layer whose table holds random values (not bfloat16 ones)."""
    layer = RelativePositionBias(num_heads, **kwargs)
    layer.build()
    layer.embeddings.assign(random_table(layer.num_buckets, num_heads, seed))
    return layer


def reference_bias(layer, query_positions, key_positions):
    """table[bucket(j - i), h], one logit at a time: `(batch, heads, T, S)`."""
    table = numpy(layer.embeddings.value)
    query_positions = np.atleast_2d(query_positions)
    key_positions = np.atleast_2d(key_positions)
    batch = max(len(query_positions), len(key_positions))
    bias = np.zeros(
        (batch, layer.num_heads, query_positions.shape[1], key_positions.shape[1]),
        "float32",
    )
    for b, h, i, j in np.ndindex(bias.shape):
        relative_position = int(key_positions[b % len(key_positions), j]) - int(
            query_positions[b % len(query_positions), i]
        )
        bucket = references.t5_bucket(
            relative_position,
            layer.bidirectional,
            layer.num_buckets,
            layer.max_distance,
        )
        bias[b, h, i, j] = table[bucket, h]
    return bias


def assert_bias(bias, expected):
    assert keras.backend.standardize_dtype(bias.dtype) == "float32"
    assert tuple(bias.shape) == expected.shape
    np.testing.assert_array_equal(numpy(bias), expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"bidirectional": False},
        {"num_buckets": 8, "max_distance": 16},
        {"num_buckets": 64, "max_distance": 50, "bidirectional": False},
    ],
)
def test_bias_reads_the_table_at_each_bucket(kwargs):
    layer = layer_with_table(**kwargs)
    # Distances up to +-300 in steps of various sizes.
    query_positions = np.arange(0, 310, 31)[None]
    key_positions = np.arange(0, 300, 7)[None]
    bias = layer(query_positions, key_positions)
    assert_bias(bias, reference_bias(layer, query_positions, key_positions))
    # Every bucket of the small table is read but 4, which would hold keys
    # after the query at distance 0.
    if layer.num_buckets == 8:
        assert {float(v) for v in numpy(bias)[0, 0].ravel()} == set(
            np.delete(numpy(layer.embeddings.value)[:, 0], 4).tolist()
        )


def test_each_head_reads_its_own_column():
    layer = RelativePositionBias(2, num_buckets=4, max_distance=2)
    layer.build()
    layer.embeddings.assign([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0], [3.0, 13.0]])
    bias = numpy(layer(np.array([2]), np.arange(5)))[0, :, 0]  # (heads, keys)
    # Bidirectional with 4 buckets: 0 for j - i = 0, 1 for any key before, 3
    # for any key after (2 would be distance 0 after the query).
    np.testing.assert_array_equal(
        bias, [[1.0, 1.0, 0.0, 3.0, 3.0], [11.0, 11.0, 10.0, 13.0, 13.0]]
    )


@pytest.mark.parametrize("bidirectional", [True, False])
def test_cached_decoding_query_at_ten_against_keys_zero_to_ten(bidirectional):
    layer = layer_with_table(4, bidirectional=bidirectional)
    full = layer(np.arange(11)[None], np.arange(11)[None])
    step = layer(np.array([[10]]), np.arange(11)[None])
    assert tuple(step.shape) == (1, 4, 1, 11)
    np.testing.assert_array_equal(numpy(step)[:, :, 0], numpy(full)[:, :, 10])
    assert_bias(step, reference_bias(layer, [[10]], [np.arange(11)]))
    # Not the bias of a query at position 0, which a bias built from the
    # lengths of the query and key axes would give.
    assert not np.array_equal(numpy(step)[:, :, 0], numpy(full)[:, :, 0])


def test_positions_per_batch():
    layer = layer_with_table(3, num_buckets=16, max_distance=20)
    # Left padding in the first row, a packed second sequence in the second.
    query_positions = np.array([[0, 0, 0, 1, 2, 30], [0, 1, 2, 0, 1, 2]])
    key_positions = np.array([[0, 0, 0, 1, 2, 3, 4], [0, 1, 2, 0, 1, 2, 90]])
    bias = layer(query_positions, key_positions)
    assert_bias(bias, reference_bias(layer, query_positions, key_positions))
    shared = layer(np.arange(4), key_positions)
    assert tuple(shared.shape) == (2, 3, 4, 7)
    assert_bias(shared, reference_bias(layer, [np.arange(4)], key_positions))


@settings(deadline=None, max_examples=25)
@given(
    key_positions=st.lists(st.integers(0, 10**5), min_size=1, max_size=12),
    config=st.sampled_from(
        [(32, 128, True), (32, 128, False), (8, 16, True), (64, 50, False), (4, 3, True)]
    ),
)
def test_any_distance_reads_its_bucket(key_positions, config):
    # The layer looks up distances clipped to +-max_distance, past which
    # every distance shares the last bucket of its direction; the reference
    # buckets each distance whole.
    num_buckets, max_distance, bidirectional = config
    layer = layer_with_table(
        2,
        num_buckets=num_buckets,
        max_distance=max_distance,
        bidirectional=bidirectional,
    )
    query_positions = np.array([[0, 1, 49_999, 100_000]])
    key_positions = np.array([key_positions])
    assert_bias(
        layer(query_positions, key_positions),
        reference_bias(layer, query_positions, key_positions),
    )


@settings(deadline=None, max_examples=25)
@given(shift=st.integers(-(10**6), 10**6), bidirectional=st.booleans())
def test_shifting_all_positions_changes_nothing(shift, bidirectional):
    layer = layer_with_table(2, bidirectional=bidirectional)
    positions = np.array([[0, 3, 4, 9, 30, 200]])
    np.testing.assert_array_equal(
        numpy(layer(positions + shift, positions + shift)),
        numpy(layer(positions, positions)),
    )


def test_build_for_attention_makes_the_table_once():
    layer = RelativePositionBias(4, num_buckets=16, max_distance=32)
    layer.build_for_attention(4, 8, 8)
    assert layer.built
    (weight,) = layer.weights
    assert weight is layer.embeddings
    assert "embeddings" in weight.name
    assert tuple(weight.shape) == (16, 4)
    assert weight.trainable and weight.dtype == "float32"
    # Built already: neither a standalone call nor another build adds one.
    layer.build()
    layer.build_for_attention(4, 8, 8)
    layer(np.arange(3), np.arange(3))
    assert layer.weights == [weight]


def test_logits_bias_is_the_call_and_ignores_the_query():
    layer = RelativePositionBias(4)
    layer.build_for_attention(4, 16, 8)
    layer.embeddings.assign(random_table(32, 4))
    query_positions = keras.ops.convert_to_tensor([[7, 8, 9]])
    key_positions = keras.ops.arange(10)[None]
    query = keras.random.normal((1, 3, 4, 16))
    bias = layer.logits_bias(query, None, AttentionContext(query_positions=query_positions, key_positions=key_positions))
    assert keras.backend.standardize_dtype(bias.dtype) == "float32"
    np.testing.assert_array_equal(
        numpy(bias), numpy(layer(query_positions, key_positions))
    )
    assert layer.value_term(None, AttentionContext(query_positions=query_positions, key_positions=key_positions)) is None


def test_num_heads_must_equal_the_attentions():
    layer = RelativePositionBias(4)
    layer.check_attention(4, 16, 16)
    for call in (layer.check_attention, layer.build_for_attention):
        with pytest.raises(
            ValueError, match="num_heads=4 for attention with num_heads=8"
        ):
            call(8, 16, 16)
    assert not layer.built
    assert layer.weights == []


class MixedPrecisionHolder(keras.layers.Layer):
    """Reads the bias inside its own call, as the attention does."""

    def __init__(self, position, **kwargs):
        super().__init__(**kwargs)
        self.position = position

    def call(self, query_positions, key_positions):
        return self.position.logits_bias(None, None, AttentionContext(query_positions=query_positions, key_positions=key_positions))


def test_mixed_bfloat16_reads_the_table_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = layer_with_table(3)
    assert layer.compute_dtype == "bfloat16"
    assert layer.embeddings.dtype == "float32"
    positions = np.arange(6)[None]
    expected = reference_bias(layer, positions, positions)
    assert_bias(layer(positions, positions), expected)
    # Inside a mixed precision layer's call, as inside the attention: no
    # rounding of the table to bfloat16.
    assert_bias(MixedPrecisionHolder(layer)(positions, positions), expected)
    symbolic = layer(
        keras.Input((None,), dtype="int32"), keras.Input((None,), dtype="int32")
    )
    assert symbolic.dtype == "float32"


def test_gradient_sums_over_each_bucket():
    layer = layer_with_table(2, num_buckets=8, max_distance=16)
    query_positions = np.array([[0, 5, 9, 40]])
    key_positions = np.arange(0, 50, 3)[None]
    weights = np.random.default_rng(1).normal(size=(1, 2, 4, 17)).astype("float32")

    def loss(table):
        bias, _ = layer.stateless_call([table], [], query_positions, key_positions)
        return bias * keras.ops.convert_to_tensor(weights)

    (gradient,) = gradients(loss, numpy(layer.embeddings.value))
    expected = np.zeros((8, 2), "float64")
    for _, h, i, j in np.ndindex(weights.shape):
        bucket = references.t5_bucket(
            int(key_positions[0, j] - query_positions[0, i]), True, 8, 16
        )
        expected[bucket, h] += weights[0, h, i, j]
    np.testing.assert_allclose(gradient, expected, rtol=1e-5, atol=1e-6)


def t5_model(**kwargs):
    query_positions = keras.Input((None,), dtype="int32")
    key_positions = keras.Input((None,), dtype="int32")
    bias = RelativePositionBias(**kwargs)(query_positions, key_positions)
    return keras.Model([query_positions, key_positions], bias)


def test_symbolic_shapes_in_a_functional_model():
    model = t5_model(num_heads=4)
    assert tuple(model.output.shape) == (None, 4, None, None)
    assert model.output.dtype == "float32"
    assert len(model.trainable_weights) == 1
    layer = RelativePositionBias(2)
    assert layer.compute_output_shape((3, 5), (1, 7)) == (3, 2, 5, 7)
    assert layer.compute_output_shape((5,), (7,)) == (1, 2, 5, 7)


def test_xla_training_step_moves_the_table():
    keras.utils.set_random_seed(0)
    model = t5_model(num_heads=2, num_buckets=8, max_distance=16)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=XLA)
    (layer,) = [
        layer for layer in model.layers if isinstance(layer, RelativePositionBias)
    ]
    before = numpy(layer.embeddings.value).copy()
    for length in (3, 11):
        positions = np.arange(length)[None].repeat(2, 0)
        loss = model.train_on_batch(
            [positions, positions], np.ones((2, 2, length, length), "float32")
        )
        assert np.isfinite(loss)
        np.testing.assert_array_equal(
            model.predict([positions, positions], verbose=0),
            numpy(model([positions, positions])),
        )
    # Bias towards 1 everywhere: every bucket read moved up.
    assert np.all(numpy(layer.embeddings.value)[:4] > before[:4])


def test_keras_file_round_trip_is_bit_identical(tmp_path):
    keras.utils.set_random_seed(0)
    model = t5_model(
        num_heads=3,
        num_buckets=16,
        max_distance=40,
        bidirectional=False,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
    )
    path = tmp_path / "t5.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    (layer,) = [
        layer for layer in loaded.layers if isinstance(layer, RelativePositionBias)
    ]
    (original,) = [
        layer for layer in model.layers if isinstance(layer, RelativePositionBias)
    ]
    assert layer.get_config() == original.get_config()
    np.testing.assert_array_equal(
        numpy(layer.embeddings.value), numpy(original.embeddings.value)
    )
    inputs = [
        np.array([[5, 6, 7], [0, 1, 2]]),
        np.arange(0, 60, 6)[None].repeat(2, 0),
    ]
    expected = model.predict(inputs, verbose=0)
    np.testing.assert_array_equal(loaded.predict(inputs, verbose=0), expected)
    np.testing.assert_array_equal(expected, reference_bias(original, *inputs))


def test_initializer_is_used_and_serialized():
    keras.utils.set_random_seed(0)
    layer = RelativePositionBias(
        8, num_buckets=64, embeddings_initializer=keras.initializers.Constant(0.25)
    )
    layer.build()
    np.testing.assert_array_equal(numpy(layer.embeddings.value), np.full((64, 8), 0.25))
    config = layer.get_config()["embeddings_initializer"]
    assert config["class_name"] == "Constant"
    assert config["config"]["value"] == 0.25
    default = RelativePositionBias(8)
    default.build()
    values = numpy(default.embeddings.value)
    # Keras' "uniform": U(-0.05, 0.05).
    assert np.all(np.abs(values) <= 0.05) and values.std() > 0.02


class RelativePositionBiasSerializationTest(TestCase):
    def test_config_and_serialization_round_trip(self):
        for kwargs in (
            {"num_heads": 8},
            {"num_heads": 3, "num_buckets": 6, "max_distance": 5},
            {
                "num_heads": 2,
                "num_buckets": 64,
                "max_distance": 256,
                "bidirectional": False,
                "embeddings_initializer": "zeros",
            },
        ):
            layer = RelativePositionBias(**kwargs, name="t5")
            revived = self.run_class_serialization_test(layer)
            self.assertEqual(revived.get_config(), layer.get_config())
            config = layer.get_config()
            for name, value in kwargs.items():
                if name != "embeddings_initializer":
                    self.assertEqual(config[name], value)
            initializer = kwargs.get("embeddings_initializer", "uniform")
            self.assertEqual(
                config["embeddings_initializer"],
                keras.initializers.serialize(keras.initializers.get(initializer)),
            )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 0}, "num_heads=0"),
        ({"num_heads": 2.0}, "num_heads=2.0"),
        ({"num_heads": True}, "num_heads=True"),
        ({"num_heads": 2, "num_buckets": 2}, "num_buckets=2"),
        ({"num_heads": 2, "num_buckets": 31}, "num_buckets=31"),
        ({"num_heads": 2, "num_buckets": 0}, "num_buckets=0"),
        ({"num_heads": 2, "num_buckets": 32.0}, "num_buckets=32.0"),
        (
            {"num_heads": 2, "num_buckets": 1, "bidirectional": False},
            "num_buckets=1",
        ),
        ({"num_heads": 2, "max_distance": 8}, "greater than 8.*max_distance=8"),
        (
            {"num_heads": 2, "max_distance": 16, "bidirectional": False},
            "greater than 16.*max_distance=16",
        ),
        ({"num_heads": 2, "max_distance": -1}, "max_distance=-1"),
        ({"num_heads": 2, "max_distance": 128.0}, "max_distance=128.0"),
        ({"num_heads": 2, "bidirectional": 1}, "bidirectional=1"),
        ({"num_heads": 2, "bidirectional": "no"}, "bidirectional='no'"),
        (
            {"num_heads": 2, "embeddings_initializer": "sinusoidal"},
            "embeddings_initializer='sinusoidal'",
        ),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RelativePositionBias(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_buckets": 4, "max_distance": 2},
        {"num_buckets": 2, "max_distance": 2, "bidirectional": False},
    ],
)
def test_the_smallest_bucketings_work(kwargs):
    layer = layer_with_table(1, **kwargs)
    positions = np.arange(-5, 6)[None]
    assert_bias(
        layer(np.array([[0]]), positions),
        reference_bias(layer, [[0]], positions),
    )


def test_bad_positions_say_what_was_expected():
    layer = RelativePositionBias(2)
    with pytest.raises(ValueError, match="query_positions of dtype float32"):
        layer(np.zeros((1, 3), "float32"), np.zeros((1, 3), "int32"))
    with pytest.raises(ValueError, match="same batch size"):
        layer(np.zeros((2, 3), "int32"), np.zeros((3, 3), "int32"))


def test_the_kernels_fused_hint_shares_the_bias_over_the_batch():
    # Outside a fused attention, one row of indices per batch entry (the
    # bias of the logits' shape); inside it, one for the batch. The same
    # values either way.
    layer = layer_with_table(3, num_buckets=16, max_distance=20)
    positions = np.arange(5)
    query = keras.random.normal((2, 5, 3, 4))
    expected = reference_bias(layer, [positions], [positions])
    for fused, batch in ((False, 2), (True, 1)):
        context = AttentionContext(
            query_positions=keras.ops.arange(5, dtype="int32")[None],
            key_positions=keras.ops.arange(5, dtype="int32")[None],
            fused=fused,
        )
        bias = layer.logits_bias(query, None, context)
        assert tuple(bias.shape) == (batch, 3, 5, 5)
        assert_bias(bias, np.broadcast_to(expected, (batch, 3, 5, 5)))
