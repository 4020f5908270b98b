"""RelativePositionEmbedding against a float64 loop over Shaw et al.'s equations."""

import functools

import keras
import numpy as np
import pytest

from keras_posenc import RelativePositionEmbedding
from tests.backend import compiled
from tests.backend import gradient_function
from tests.backend import graph_function
from tests.backend import numpy
from keras_posenc import AttentionContext

NUM_HEADS = 3
KEY_DIM = 8
VALUE_DIM = 5
# Float32 dot products of KEY_DIM terms of size about 1, and sums of at most
# a dozen weights times table entries: a few ulps of float32.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}

# (query_positions, key_positions) as (batch or 1, length) or (length,).
POSITIONS = {
    # Self-attention over 0 .. 6 with k = 2: most pairs lie beyond k.
    "default": (np.arange(7), np.arange(7)),
    # Cached decoding: one query at position 10 against keys 0 .. 10.
    "cached_decoding": (np.array([10]), np.arange(11)),
    # Different positions per batch element: left padding, and two packed
    # sequences whose positions restart.
    "per_batch": (
        np.array([[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2]]),
        np.array([[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2]]),
    ),
    # Per-batch queries against shared keys, longer than the queries.
    "per_batch_queries": (
        np.array([[3, 4, 5], [20, 21, 22]]),
        np.arange(9),
    ),
    # Positions far apart, both ways beyond k, with a batch axis of 1.
    "beyond_k": (np.array([[-40, 0, 7]]), np.array([[-50, -41, -40, -38, 9, 100]])),
}


def random_array(shape, seed):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def built_layer(max_relative_position=2, seed=0):
    """A layer built for attention, its tables holding random values."""
    layer = RelativePositionEmbedding(max_relative_position)
    layer.build_for_attention(NUM_HEADS, KEY_DIM, VALUE_DIM)
    rows = 2 * max_relative_position + 1
    layer.set_weights(
        [
            random_array((rows, KEY_DIM), seed),
            random_array((rows, VALUE_DIM), seed + 1),
        ]
    )
    return layer


def paired_positions(query_positions, key_positions, batch_size):
    """Both positions as `(batch_size, length)` int64 arrays."""
    query_positions = np.atleast_2d(query_positions).astype("int64")
    key_positions = np.atleast_2d(key_positions).astype("int64")
    return (
        np.broadcast_to(query_positions, (batch_size, query_positions.shape[1])),
        np.broadcast_to(key_positions, (batch_size, key_positions.shape[1])),
    )


def table_row(query_position, key_position, max_relative_position):
    """Section 3.2: the row of `w_clip(j - i, k)`, rows indexed from -k."""
    return max(-max_relative_position, min(max_relative_position, key_position - query_position)) + (
        max_relative_position
    )


def reference_logits_term(query, key_table, query_positions, key_positions, k):
    """`q_i (a^K_ij)^T` of eq. 4, one logit at a time, in float64.

    `query` is `(batch, T, heads, key_dim)`, already divided by sqrt(d).
    """
    query = query.astype("float64")
    key_table = key_table.astype("float64")
    batch, queries, heads, _ = query.shape
    query_positions, key_positions = paired_positions(
        query_positions, key_positions, batch
    )
    logits = np.zeros((batch, heads, queries, key_positions.shape[1]))
    for b, h, i, j in np.ndindex(logits.shape):
        a_key = key_table[table_row(query_positions[b, i], key_positions[b, j], k)]
        logits[b, h, i, j] = np.dot(query[b, i, h], a_key)
    return logits



def shaw_logits_term(layer, query, query_positions, key_positions, consecutive=False):
    """The scheme's `logits_bias` at these positions."""
    return layer.logits_bias(
        query,
        None,
        AttentionContext(
            query_positions=query_positions,
            key_positions=key_positions,
            consecutive=consecutive,
        ),
    )


def shaw_value_term(layer, weights, query_positions, key_positions, consecutive=False):
    """The scheme's `value_term` at these positions."""
    return layer.value_term(
        weights,
        AttentionContext(
            query_positions=query_positions,
            key_positions=key_positions,
            consecutive=consecutive,
        ),
    )

def reference_value_term(weights, value_table, query_positions, key_positions, k):
    """`sum_j alpha_ij a^V_ij` of eq. 3, one term at a time, in float64."""
    weights = weights.astype("float64")
    value_table = value_table.astype("float64")
    batch, heads, queries, keys = weights.shape
    query_positions, key_positions = paired_positions(
        query_positions, key_positions, batch
    )
    term = np.zeros((batch, queries, heads, value_table.shape[1]))
    for b, h, i in np.ndindex(batch, heads, queries):
        for j in range(keys):
            a_value = value_table[
                table_row(query_positions[b, i], key_positions[b, j], k)
            ]
            term[b, i, h] += weights[b, h, i, j] * a_value
    return term


def random_query(batch, queries, seed=2):
    # Scaled by 1 / sqrt(key_dim), as the attention hands it over.
    return random_array((batch, queries, NUM_HEADS, KEY_DIM), seed) / np.sqrt(
        KEY_DIM
    )


def random_weights(batch, queries, keys, seed=3):
    logits = random_array((batch, NUM_HEADS, queries, keys), seed)
    return numpy(keras.ops.softmax(logits))  # rows sum to 1, as after softmax


def tensor(value):
    return keras.ops.convert_to_tensor(value)


def dtype_of(value):
    return keras.backend.standardize_dtype(value.dtype)


def table(weight):
    return numpy(weight.value)


def with_tables(layer, function):
    """`function(query, weights)` as a function of the tables too.

    Its first two arguments replace the layer's key and value tables, so
    that gradients by them are gradients by arguments, on every backend.
    """

    def replaced(key_table, value_table, *arguments):
        with keras.StatelessScope(
            state_mapping=[
                (layer.key_embeddings, key_table),
                (layer.value_embeddings, value_table),
            ]
        ):
            return function(*arguments)

    return replaced


def batch_of(query_positions, key_positions):
    """The positions' batch size, at least 2 so that shared ones broadcast."""
    return max(
        len(np.atleast_2d(query_positions)), len(np.atleast_2d(key_positions)), 2
    )


@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_logits_term_is_the_query_times_the_clipped_key_row(case):
    query_positions, key_positions = POSITIONS[case]
    layer = built_layer()
    batch = batch_of(query_positions, key_positions)
    query = random_query(batch, np.atleast_2d(query_positions).shape[1])
    bias = shaw_logits_term(
        layer,
        tensor(query), tensor(query_positions), tensor(key_positions)
    )
    assert dtype_of(bias) == "float32"
    expected = reference_logits_term(
        query, table(layer.key_embeddings), query_positions, key_positions, 2
    )
    assert tuple(bias.shape) == expected.shape
    np.testing.assert_allclose(numpy(bias), expected, **TOLERANCE)


@pytest.mark.parametrize("case", sorted(POSITIONS))
def test_value_term_sums_the_weights_times_the_clipped_value_rows(case):
    query_positions, key_positions = POSITIONS[case]
    layer = built_layer()
    batch = batch_of(query_positions, key_positions)
    weights = random_weights(
        batch,
        np.atleast_2d(query_positions).shape[1],
        np.atleast_2d(key_positions).shape[1],
    )
    term = shaw_value_term(
        layer,
        tensor(weights), tensor(query_positions), tensor(key_positions)
    )
    assert dtype_of(term) == "float32"
    expected = reference_value_term(
        weights, table(layer.value_embeddings), query_positions, key_positions, 2
    )
    assert tuple(term.shape) == expected.shape
    np.testing.assert_allclose(numpy(term), expected, **TOLERANCE)


# (queries, keys, max_relative_position) for positions 0 .. queries - 1 and 0 ..
# keys - 1: keys in blocks of 8, 10 and 32, more queries than keys, a
# clipping distance past the keys, and lengths where the segment sum
# serves: few keys, and a prime number of them.
CONSECUTIVE = [
    (96, 96, 3),
    (80, 120, 5),
    (150, 64, 4),
    (3, 200, 2),
    (40, 1024, 2),
    (64, 64, 100),
    (7, 7, 2),
    (5, 1021, 2),
]


@pytest.mark.parametrize("jit_compile", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize("queries, keys, max_relative_position", CONSECUTIVE)
def test_value_term_of_consecutive_positions_equals_reference(
    queries, keys, max_relative_position, jit_compile
):
    layer = built_layer(max_relative_position)
    query_positions, key_positions = np.arange(queries), np.arange(keys)
    weights = random_weights(2, queries, keys)
    value_term = graph_function(
        functools.partial(shaw_value_term, layer, consecutive=True),
        jit_compile=jit_compile,
    )
    term = value_term(
        tensor(weights), tensor(query_positions), tensor(key_positions)
    )
    expected = reference_value_term(
        weights,
        table(layer.value_embeddings),
        query_positions,
        key_positions,
        max_relative_position,
    )
    np.testing.assert_allclose(numpy(term), expected, **TOLERANCE)


def test_both_terms_of_consecutive_positions_under_xla_gradients():
    # At consecutive positions each term's gradient with respect to its
    # input is the other term's map: the sums per distance and the read by
    # distance, each checked here against the float64 sums over pairs.
    layer = built_layer(max_relative_position=3)
    queries, keys = 40, 96
    query_positions, key_positions = np.arange(queries), np.arange(keys)
    query = random_query(2, queries)
    weights = random_weights(2, queries, keys)
    logits_cotangent = random_array((2, NUM_HEADS, queries, keys), 4)
    value_cotangent = random_array((2, queries, NUM_HEADS, VALUE_DIM), 5)
    cotangents = tensor(logits_cotangent), tensor(value_cotangent)

    def loss(query, weights):
        return keras.ops.sum(
            shaw_logits_term(layer, query, query_positions, key_positions, consecutive=True)
            * cotangents[0]
        ) + keras.ops.sum(
            shaw_value_term(layer, weights, query_positions, key_positions, consecutive=True)
            * cotangents[1]
        )

    gradients = compiled(gradient_function(with_tables(layer, loss)))
    key_table_gradient, value_table_gradient, query_gradient, weights_gradient = (
        numpy(gradient)
        for gradient in gradients(
            tensor(table(layer.key_embeddings)),
            tensor(table(layer.value_embeddings)),
            tensor(query),
            tensor(weights),
        )
    )
    key_table = table(layer.key_embeddings).astype("float64")
    value_table = table(layer.value_embeddings).astype("float64")
    expected_key_table = np.zeros((7, KEY_DIM))
    expected_value_table = np.zeros((7, VALUE_DIM))
    expected_query = np.zeros(query.shape)
    expected_weights = np.zeros(weights.shape)
    for b, h, i, j in np.ndindex(weights.shape):
        row = table_row(i, j, 3)
        expected_key_table[row] += logits_cotangent[b, h, i, j] * query[b, i, h]
        expected_query[b, i, h] += logits_cotangent[b, h, i, j] * key_table[row]
        expected_value_table[row] += weights[b, h, i, j] * value_cotangent[b, i, h]
        expected_weights[b, h, i, j] = value_table[row] @ value_cotangent[b, i, h]
    np.testing.assert_allclose(key_table_gradient, expected_key_table, **TOLERANCE)
    np.testing.assert_allclose(
        value_table_gradient, expected_value_table, **TOLERANCE
    )
    np.testing.assert_allclose(query_gradient, expected_query, **TOLERANCE)
    np.testing.assert_allclose(weights_gradient, expected_weights, **TOLERANCE)


def test_logits_term_of_consecutive_positions_equals_reference():
    layer = built_layer(max_relative_position=3)
    query_positions, key_positions = np.arange(40), np.arange(96)
    query = random_query(2, 40)
    bias = shaw_logits_term(
        layer,
        tensor(query), query_positions, key_positions, consecutive=True
    )
    expected = reference_logits_term(
        query, table(layer.key_embeddings), query_positions, key_positions, 3
    )
    np.testing.assert_allclose(numpy(bias), expected, **TOLERANCE)


def test_keys_beyond_max_relative_position_read_the_edge_rows():
    layer = built_layer(max_relative_position=2)
    query = random_query(1, 1)
    keys = np.arange(-6, 7)  # query at 0: distances -6 .. 6
    bias = numpy(
        shaw_logits_term(layer, tensor(query), tensor([0]), tensor(keys))
    )[0, :, 0]  # (heads, keys)
    key_table = table(layer.key_embeddings)
    for distance, column in zip(keys, bias.T):
        row = key_table[min(max(distance, -2), 2) + 2]
        np.testing.assert_allclose(column, query[0, 0] @ row, **TOLERANCE)
    # Every key at distance <= -2 shares a logit, as does every one >= 2.
    np.testing.assert_array_equal(bias[:, :5], np.repeat(bias[:, 4:5], 5, axis=1))
    np.testing.assert_array_equal(bias[:, 8:], np.repeat(bias[:, 8:9], 5, axis=1))


def test_shifting_all_positions_changes_nothing():
    layer = built_layer()
    query_positions, key_positions = POSITIONS["per_batch_queries"]
    query = tensor(random_query(2, 3))
    weights = tensor(random_weights(2, 3, 9))
    for shift in (7, -100):
        np.testing.assert_array_equal(
            numpy(
                shaw_logits_term(
                    layer,
                    query, query_positions + shift, key_positions + shift
                )
            ),
            numpy(shaw_logits_term(layer, query, query_positions, key_positions)),
        )
        np.testing.assert_array_equal(
            numpy(
                shaw_value_term(
                    layer,
                    weights, query_positions + shift, key_positions + shift
                )
            ),
            numpy(shaw_value_term(layer, weights, query_positions, key_positions)),
        )


def test_call_on_its_own_is_the_logits_term():
    layer = built_layer()
    query_positions, key_positions = POSITIONS["cached_decoding"]
    query = random_query(2, 1)
    np.testing.assert_array_equal(
        numpy(layer(query, query_positions, key_positions)),
        numpy(
            shaw_logits_term(
                layer,
                tensor(query), tensor(query_positions), tensor(key_positions)
            )
        ),
    )


def test_xla_with_unknown_lengths_gives_the_same_terms():
    layer = built_layer()
    positions_spec = ((None, None), "int32")
    logits_term = graph_function(
        functools.partial(shaw_logits_term, layer),
        input_signature=[
            ((None, None, NUM_HEADS, KEY_DIM), "float32"),
            positions_spec,
            positions_spec,
        ],
    )
    value_term = graph_function(
        functools.partial(shaw_value_term, layer),
        input_signature=[
            ((None, NUM_HEADS, None, None), "float32"),
            positions_spec,
            positions_spec,
        ],
    )
    for case in ("default", "cached_decoding", "per_batch", "per_batch_queries"):
        query_positions, key_positions = (
            np.atleast_2d(positions).astype("int32") for positions in POSITIONS[case]
        )
        batch = batch_of(query_positions, key_positions)
        queries, keys = query_positions.shape[1], key_positions.shape[1]
        query = random_query(batch, queries)
        weights = random_weights(batch, queries, keys)
        np.testing.assert_allclose(
            numpy(logits_term(query, query_positions, key_positions)),
            reference_logits_term(
                query, table(layer.key_embeddings), query_positions, key_positions, 2
            ),
            **TOLERANCE,
        )
        np.testing.assert_allclose(
            numpy(value_term(weights, query_positions, key_positions)),
            reference_value_term(
                weights,
                table(layer.value_embeddings),
                query_positions,
                key_positions,
                2,
            ),
            **TOLERANCE,
        )


def test_xla_gradients_sum_into_each_table_row():
    layer = built_layer()
    query_positions, key_positions = (
        np.atleast_2d(positions) for positions in POSITIONS["per_batch_queries"]
    )
    query = random_query(2, 3)
    weights = random_weights(2, 3, 9)
    logits_cotangent = random_array((2, NUM_HEADS, 3, 9), 4)
    value_cotangent = random_array((2, 3, NUM_HEADS, VALUE_DIM), 5)
    cotangents = tensor(logits_cotangent), tensor(value_cotangent)

    def loss(query, weights):
        return keras.ops.sum(
            shaw_logits_term(layer, query, query_positions, key_positions)
            * cotangents[0]
        ) + keras.ops.sum(
            shaw_value_term(layer, weights, query_positions, key_positions)
            * cotangents[1]
        )

    gradients = compiled(gradient_function(with_tables(layer, loss)))
    key_gradient, value_gradient = (
        numpy(gradient)
        for gradient in gradients(
            tensor(table(layer.key_embeddings)),
            tensor(table(layer.value_embeddings)),
            tensor(query),
            tensor(weights),
        )[:2]
    )
    # The gradient of row r sums over the pairs (i, j) that read it.
    expected_key = np.zeros((5, KEY_DIM))
    expected_value = np.zeros((5, VALUE_DIM))
    for b, h, i, j in np.ndindex(2, NUM_HEADS, 3, 9):
        row = table_row(query_positions[b, i], key_positions[0, j], 2)
        expected_key[row] += logits_cotangent[b, h, i, j] * query[b, i, h]
        expected_value[row] += weights[b, h, i, j] * value_cotangent[b, i, h]
    np.testing.assert_allclose(key_gradient, expected_key, **TOLERANCE)
    np.testing.assert_allclose(value_gradient, expected_value, **TOLERANCE)


def test_tables_are_named_and_sized_by_the_attention():
    layer = RelativePositionEmbedding(max_relative_position=4)
    assert not layer.built
    layer.build_for_attention(num_heads=2, key_dim=6, value_dim=10)
    assert layer.built
    key_table, value_table = layer.weights
    assert "key" in key_table.name and "value" not in key_table.name
    assert "value" in value_table.name and "key" not in value_table.name
    assert tuple(key_table.shape) == (9, 6)
    assert tuple(value_table.shape) == (9, 10)
    assert all(weight.trainable for weight in layer.weights)


def test_building_again_for_the_same_sizes_keeps_the_tables():
    layer = built_layer()
    before = [table(weight) for weight in layer.weights]
    layer.build_for_attention(NUM_HEADS, KEY_DIM, VALUE_DIM)
    assert len(layer.weights) == 2
    for weight, values in zip(layer.weights, before):
        np.testing.assert_array_equal(table(weight), values)
    with pytest.raises(ValueError, match="key_dim, value_dim"):
        layer.build_for_attention(NUM_HEADS, KEY_DIM + 1, VALUE_DIM)


def test_mixed_bfloat16_keeps_tables_and_terms_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = built_layer()
    assert layer.compute_dtype == "bfloat16"
    assert {weight.dtype for weight in layer.weights} == {"float32"}
    query_positions, key_positions = POSITIONS["default"]
    query = keras.ops.cast(random_query(2, 7), "bfloat16")
    weights = random_weights(2, 7, 7)
    bias = layer(query, query_positions, key_positions)
    term = shaw_value_term(layer, weights, query_positions, key_positions)
    assert dtype_of(bias) == "float32" and dtype_of(term) == "float32"
    # Exact up to float32 rounding from the bfloat16 queries on.
    np.testing.assert_allclose(
        numpy(bias),
        reference_logits_term(
            numpy(keras.ops.cast(query, "float32")),
            table(layer.key_embeddings),
            query_positions,
            key_positions,
            2,
        ),
        **TOLERANCE,
    )
    np.testing.assert_allclose(
        numpy(term),
        reference_value_term(
            weights, table(layer.value_embeddings), query_positions, key_positions, 2
        ),
        **TOLERANCE,
    )


def test_config_round_trip():
    initializer = keras.initializers.RandomNormal(stddev=0.02, seed=1)
    layer = RelativePositionEmbedding(
        max_relative_position=16, embeddings_initializer=initializer, name="shaw"
    )
    config = layer.get_config()
    assert config["max_relative_position"] == 16
    assert config["embeddings_initializer"] == keras.initializers.serialize(
        initializer
    )
    rebuilt = RelativePositionEmbedding.from_config(config)
    assert rebuilt.get_config() == config
    assert isinstance(rebuilt.embeddings_initializer, keras.initializers.RandomNormal)


def test_serialization_rebuilds_the_tables_at_the_attention_sizes():
    layer = built_layer()
    serialized = keras.saving.serialize_keras_object(layer)
    assert serialized["registered_name"] == "keras_posenc>RelativePositionEmbedding"
    rebuilt = keras.saving.deserialize_keras_object(serialized)
    assert rebuilt.built
    assert [tuple(weight.shape) for weight in rebuilt.weights] == [
        (5, KEY_DIM),
        (5, VALUE_DIM),
    ]


def test_keras_file_round_trip_of_a_model_calling_it_on_its_own(tmp_path):
    layer = built_layer()
    query = keras.Input((4, NUM_HEADS, KEY_DIM))
    query_positions = keras.Input((4,), dtype="int32")
    key_positions = keras.Input((6,), dtype="int32")
    bias = layer(query, query_positions, key_positions)
    assert tuple(bias.shape) == (None, NUM_HEADS, 4, 6)
    assert bias.dtype == "float32"
    model = keras.Model([query, query_positions, key_positions], bias)
    inputs = [
        random_query(2, 4),
        np.array([[3, 4, 5, 6], [0, 1, 2, 3]], "int32"),
        np.array([[0, 1, 2, 3, 4, 5], [0, 0, 1, 2, 3, 9]], "int32"),
    ]
    path = tmp_path / "shaw.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(inputs)), numpy(model(inputs)))


def test_call_before_build_for_attention_says_what_to_do():
    layer = RelativePositionEmbedding(max_relative_position=2)
    with pytest.raises(ValueError, match="build_for_attention"):
        layer(random_query(1, 3), np.arange(3), np.arange(3))


def test_call_with_queries_of_another_size_says_what_was_expected():
    layer = built_layer()
    with pytest.raises(ValueError, match=f"key_dim={KEY_DIM}"):
        layer(
            np.ones((1, 3, NUM_HEADS, KEY_DIM + 2), "float32"),
            np.arange(3),
            np.arange(3),
        )


@pytest.mark.parametrize("max_relative_position", [0, -1, 1.5, True, "16", None])
def test_bad_max_relative_position_raises_value_error_naming_it(max_relative_position):
    with pytest.raises(ValueError, match="max_relative_position"):
        RelativePositionEmbedding(max_relative_position)


def test_bad_initializer_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="embeddings_initializer"):
        RelativePositionEmbedding(2, embeddings_initializer="no_such_initializer")


@pytest.mark.parametrize(
    "sizes, name",
    [((0, 8, 8), "num_heads"), ((2, -8, 8), "key_dim"), ((2, 8, 2.0), "value_dim")],
)
def test_bad_attention_sizes_raise_value_error_naming_them(sizes, name):
    layer = RelativePositionEmbedding(2)
    with pytest.raises(ValueError, match=name):
        layer.build_for_attention(*sizes)
    assert not layer.built
