"""ShortestPathBias: Graphormer's spatial encoding, alone and in attention.

The bias is the table's row for each pair's hop count, which a breadth-first
search in tests/references.py counts; in `PositionalMultiHeadAttention` it
is added to the logits, checked against the float64 attention of
tests/test_positional_multi_head_attention.py. Tables hold random values, so
that a wrong row shows.
"""

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import AlibiBias
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import ShortestPathBias
from tests import references
from tests.backend import RUN_TIME_ERRORS
from tests.backend import XLA
from tests.backend import compiled
from tests.backend import gradients
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_case import TestCase
from tests.test_graph_ops import complete
from tests.test_graph_ops import cycle
from tests.test_graph_ops import disjoint
from tests.test_graph_ops import dtype_of
from tests.test_graph_ops import erdos_renyi
from tests.test_graph_ops import pad_batch
from tests.test_graph_ops import path
from tests.test_graph_ops import permute
from tests.test_graph_ops import serve_with_tensorflow_alone
from tests.test_graph_ops import star
from tests.test_graph_ops import weighted
from tests.test_positional_multi_head_attention import randomize_weights
from tests.test_positional_multi_head_attention import reference_attention

HEADS = 3
KEY_DIM = 4
FEATURES = 5
MAX_HOPS = 3

# 10 nodes (hop counts past 3), 7 (two components, an isolated node),
# 5 weighted, and 1, padded to 10.
GRAPHS = [
    erdos_renyi(10, 0.25, seed=1),
    disjoint(cycle(4), path(2), np.zeros((1, 1), "float32")),
    weighted(star(5), seed=2),
    complete(1),
]


def embeddings_of(layer):
    """The layer's one weight, named "embeddings"."""
    (weight,) = layer.weights
    assert weight.name == "embeddings"
    return weight


def layer_with_table(num_heads=HEADS, max_hops=MAX_HOPS, seed=0):
    """A built layer whose table holds random values."""
    layer = ShortestPathBias(num_heads, max_hops)
    layer.build()
    table = np.random.default_rng(seed).normal(size=(max_hops + 2, num_heads))
    embeddings_of(layer).assign(table.astype("float32"))
    return layer


def reference_bias(layer, adjacency):
    """`embeddings[hops[b, i, j], h]`, with breadth-first hop counts."""
    table = numpy(embeddings_of(layer).value)  # (max_hops + 2, heads)
    bias = np.zeros((len(adjacency), layer.num_heads) + adjacency.shape[1:], "float32")
    for b, graph in enumerate(adjacency):
        hops = references.hop_counts(graph, layer.max_hops)  # (n, n)
        bias[b] = table[hops].transpose(2, 0, 1)
    return bias


def assert_bias(bias, expected):
    assert dtype_of(bias) == "float32"
    assert tuple(bias.shape) == expected.shape
    np.testing.assert_array_equal(numpy(bias), expected)


class ShortestPathBiasLayerTest(TestCase):
    def test_layer_behaviour(self):
        adjacency, _ = pad_batch([cycle(5), path(5)])
        for init_kwargs in (
            {"num_heads": 2, "max_hops": 3},
            {"num_heads": 1, "max_hops": 1, "embeddings_initializer": "zeros"},
        ):
            self.run_layer_test(
                ShortestPathBias,
                init_kwargs=init_kwargs,
                input_data=adjacency,
                expected_output_shape=(2, init_kwargs["num_heads"], 5, 5),
                expected_output_dtype="float32",
                expected_num_trainable_weights=1,
                expected_num_non_trainable_weights=0,
            )

    def test_config_and_serialization_round_trip(self):
        for kwargs in (
            {"num_heads": 8, "max_hops": 5},
            {
                "num_heads": 2,
                "max_hops": 1,
                "embeddings_initializer": keras.initializers.RandomNormal(stddev=0.3),
            },
        ):
            layer = ShortestPathBias(**kwargs, name="spatial")
            revived = self.run_class_serialization_test(layer)
            self.assertEqual(revived.get_config(), layer.get_config())
            config = layer.get_config()
            self.assertEqual(config["num_heads"], kwargs["num_heads"])
            self.assertEqual(config["max_hops"], kwargs["max_hops"])
            initializer = kwargs.get("embeddings_initializer", "uniform")
            self.assertEqual(
                config["embeddings_initializer"],
                keras.initializers.serialize(keras.initializers.get(initializer)),
            )


def test_table_has_a_row_per_hop_count_and_one_for_unreachable():
    layer = ShortestPathBias(4, 6)
    adjacency, _ = pad_batch([path(3)])
    layer(adjacency)
    weight = embeddings_of(layer)
    assert tuple(weight.shape) == (8, 4)
    assert weight.trainable and weight.dtype == "float32"
    # Built already: another call adds no weight.
    layer(adjacency)
    assert layer.weights == [weight]


@pytest.mark.parametrize("max_hops", [1, 3, 12])
def test_bias_reads_the_row_of_each_hop_count(max_hops):
    layer = layer_with_table(max_hops=max_hops)
    adjacency, _ = pad_batch(GRAPHS)
    assert_bias(layer(adjacency), reference_bias(layer, adjacency))


def test_each_head_reads_its_own_column():
    layer = ShortestPathBias(2, 2)
    layer.build()
    # Rows: 0, 1, 2 (and farther) hops, unreachable.
    embeddings_of(layer).assign([[0.0, 10.0], [1.0, 11.0], [2.0, 12.0], [3.0, 13.0]])
    adjacency, _ = pad_batch([disjoint(path(4), complete(1))])
    bias = numpy(layer(adjacency))[0, :, 0]  # (heads, nodes): from node 0
    np.testing.assert_array_equal(
        bias, [[0.0, 1.0, 2.0, 2.0, 3.0], [10.0, 11.0, 12.0, 12.0, 13.0]]
    )


def test_padded_batch_equals_each_graph_alone():
    layer = layer_with_table()
    adjacency, _ = pad_batch(GRAPHS)
    bias = numpy(layer(adjacency))
    for b, graph in enumerate(GRAPHS):
        n = len(graph)
        np.testing.assert_array_equal(bias[b, :, :n, :n], numpy(layer(graph[None]))[0])


@settings(deadline=None, max_examples=25)
@given(st.integers(1, 10), st.floats(0.0, 1.0), st.integers(0, 2**16), st.randoms())
def test_permuting_nodes_permutes_the_bias_which_is_symmetric(n, p, seed, random):
    graph = erdos_renyi(n, p, seed)
    permutation = np.arange(n)
    random.shuffle(permutation)
    layer = layer_with_table(seed=seed)
    adjacency = np.stack([graph, permute(graph, permutation)])
    bias = numpy(layer(adjacency))
    assert_bias(keras.ops.convert_to_tensor(bias), reference_bias(layer, adjacency))
    np.testing.assert_array_equal(bias[1], bias[0][:, permutation][:, :, permutation])
    np.testing.assert_array_equal(bias[0], bias[0].transpose(0, 2, 1))


def test_gradient_sums_over_each_hop_count():
    layer = layer_with_table()
    adjacency, _ = pad_batch(GRAPHS[:2])
    weights = np.random.default_rng(1).normal(size=(2, HEADS, 10, 10)).astype("float32")

    def weighted_bias(table):
        bias, _ = layer.stateless_call([table], [], adjacency)
        return keras.ops.multiply(bias, weights)

    (gradient,) = gradients(weighted_bias, numpy(embeddings_of(layer).value))
    expected = np.zeros((MAX_HOPS + 2, HEADS), "float64")
    for b, graph in enumerate(adjacency):
        hops = references.hop_counts(graph, MAX_HOPS)
        for h, i, j in np.ndindex(HEADS, 10, 10):
            expected[hops[i, j], h] += weights[b, h, i, j]
    np.testing.assert_allclose(gradient, expected, rtol=1e-5, atol=1e-5)


def test_mixed_bfloat16_keeps_the_bias_in_float32():
    adjacency, _ = pad_batch(GRAPHS)
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = layer_with_table()
    assert layer.compute_dtype == "bfloat16"
    assert_bias(layer(adjacency), reference_bias(layer, adjacency))


def test_xla_at_two_graph_sizes():
    layer = layer_with_table()
    compiled_layer = compiled(layer)
    for graphs in ([cycle(5), path(4)], [erdos_renyi(12, 0.2, seed=5), star(7)]):
        adjacency, _ = pad_batch(graphs)
        assert_bias(compiled_layer(adjacency), reference_bias(layer, adjacency))


# Inside PositionalMultiHeadAttention.


def graph_attention(seed=1):
    """A built attention with the bias, every weight random."""
    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=ShortestPathBias(HEADS, MAX_HOPS)
    )
    nodes = np.zeros((1, 2, FEATURES), "float32")
    layer(nodes, nodes, adjacency=np.zeros((1, 2, 2), "float32"))
    randomize_weights(layer, seed)
    return layer


def node_features(node_mask, seed=0):
    features = np.random.default_rng(seed).normal(size=node_mask.shape + (FEATURES,))
    return (features * node_mask[..., None]).astype("float32")


def test_attention_adds_the_bias_to_the_logits():
    layer = graph_attention()
    adjacency, node_mask = pad_batch(GRAPHS)
    nodes = node_features(node_mask)
    pair_mask = node_mask[:, :, None] & node_mask[:, None, :]  # (batch, n, n)
    output, weights = layer(
        nodes,
        nodes,
        adjacency=adjacency,
        attention_mask=pair_mask,
        return_attention_scores=True,
    )
    bias = reference_bias(layer.position, adjacency).astype("float64")
    expected_output, expected_weights = reference_attention(
        layer, nodes, nodes, mask=pair_mask, logits_bias=bias
    )
    np.testing.assert_allclose(numpy(weights), expected_weights, rtol=0, atol=1e-5)
    np.testing.assert_allclose(numpy(output), expected_output, rtol=0, atol=1e-5)
    # The bias moves the weights well past the tolerance.
    _, unbiased = reference_attention(layer, nodes, nodes, mask=pair_mask)
    assert np.abs(unbiased - expected_weights).max() > 0.05
    # Real nodes attend to real nodes only.
    np.testing.assert_array_equal(
        numpy(weights)[~np.broadcast_to(pair_mask[:, None], weights.shape)], 0.0
    )


def test_keras_masks_of_the_nodes_mask_the_padding():
    layer = graph_attention()
    adjacency, node_mask = pad_batch(GRAPHS)
    nodes = node_features(node_mask)
    pair_mask = node_mask[:, :, None] & node_mask[:, None, :]
    expected = layer(nodes, nodes, adjacency=adjacency, attention_mask=pair_mask)
    masked = keras.layers.Masking(0.0)(nodes)
    outputs = layer(masked, masked, adjacency=adjacency)
    np.testing.assert_allclose(
        numpy(outputs)[node_mask], numpy(expected)[node_mask], rtol=0, atol=1e-6
    )


def test_attention_permutes_with_the_nodes():
    layer = graph_attention()
    graph = erdos_renyi(8, 0.3, seed=7)
    permutation = np.array([3, 0, 6, 1, 5, 2, 7, 4])
    nodes = node_features(np.ones((1, 8), bool))
    outputs = numpy(
        layer(
            np.concatenate([nodes, nodes[:, permutation]]),
            np.concatenate([nodes, nodes[:, permutation]]),
            adjacency=np.stack([graph, permute(graph, permutation)]),
        )
    )
    np.testing.assert_allclose(outputs[1], outputs[0][permutation], rtol=0, atol=1e-6)


def attention_model():
    nodes = keras.Input((None, FEATURES))
    adjacency = keras.Input((None, None))
    attention = PositionalMultiHeadAttention(
        HEADS,
        KEY_DIM,
        position=ShortestPathBias(
            HEADS,
            MAX_HOPS,
            embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
        ),
    )
    outputs = attention(nodes, nodes, adjacency=adjacency)
    return keras.Model([nodes, adjacency], outputs)


def test_keras_file_round_trip_is_bit_identical(tmp_path):
    keras.utils.set_random_seed(0)
    model = attention_model()
    adjacency, node_mask = pad_batch(GRAPHS)
    inputs = [node_features(node_mask), adjacency]
    # Both called as they are: `predict` would trace each model anew.
    expected = numpy(model(inputs))
    model.save(tmp_path / "graph_attention.keras")
    loaded = keras.models.load_model(tmp_path / "graph_attention.keras", safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(inputs)), expected)
    (attention,) = [
        layer
        for layer in loaded.layers
        if isinstance(layer, PositionalMultiHeadAttention)
    ]
    assert isinstance(attention.position, ShortestPathBias)
    assert attention.position.get_config()["max_hops"] == MAX_HOPS


@tensorflow_only
def test_export_serves_with_tensorflow_alone(tmp_path):
    keras.utils.set_random_seed(0)
    model = attention_model()
    adjacency, node_mask = pad_batch(GRAPHS)
    inputs = [node_features(node_mask), adjacency]
    served = serve_with_tensorflow_alone(model, inputs, tmp_path)
    np.testing.assert_allclose(
        served, model.predict(inputs, verbose=0), rtol=1e-5, atol=1e-6
    )


def test_xla_training_step_at_two_graph_sizes():
    keras.utils.set_random_seed(0)
    model = attention_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=XLA)
    (attention,) = [
        layer
        for layer in model.layers
        if isinstance(layer, PositionalMultiHeadAttention)
    ]
    table = embeddings_of(attention.position)
    before = numpy(table.value).copy()
    for graphs in ([cycle(5), path(5)], [erdos_renyi(9, 0.3, seed=8), star(9)]):
        adjacency, node_mask = pad_batch(graphs)
        inputs = [node_features(node_mask), adjacency]
        loss = model.train_on_batch(inputs, np.ones((2, len(adjacency[0]), FEATURES)))
        assert np.isfinite(loss)
        np.testing.assert_allclose(
            model.predict(inputs, verbose=0),
            numpy(model(inputs)),
            rtol=1e-5,
            atol=1e-5,
        )
    assert not np.array_equal(numpy(table.value), before)


def shared_bias_model():
    """Two attention layers reading one ShortestPathBias (one table)."""
    position = ShortestPathBias(
        HEADS,
        MAX_HOPS,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=1.0),
    )
    nodes = keras.Input((None, FEATURES))
    adjacency = keras.Input((None, None))
    first = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
    second = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
    hidden = first(nodes, nodes, adjacency=adjacency)
    return keras.Model([nodes, adjacency], second(hidden, hidden, adjacency=adjacency))


def attention_layers(model):
    return [
        layer
        for layer in model.layers
        if isinstance(layer, PositionalMultiHeadAttention)
    ]


def test_one_bias_serves_two_attention_layers():
    # As Graphormer shares its spatial encoding across layers.
    keras.utils.set_random_seed(0)
    model = shared_bias_model()
    first, second = attention_layers(model)
    assert first.position is second.position
    assert len([w for w in model.weights if w.name == "embeddings"]) == 1
    adjacency, node_mask = pad_batch(GRAPHS)
    nodes = node_features(node_mask)
    bias = reference_bias(first.position, adjacency).astype("float64")
    hidden = numpy(first(nodes, nodes, adjacency=adjacency))
    expected_hidden, _ = reference_attention(first, nodes, nodes, logits_bias=bias)
    np.testing.assert_allclose(hidden, expected_hidden, rtol=0, atol=1e-5)
    outputs = model.predict([nodes, adjacency], verbose=0)
    expected, _ = reference_attention(second, hidden, hidden, logits_bias=bias)
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-5)


def test_a_shared_bias_round_trips_through_a_keras_file(tmp_path):
    keras.utils.set_random_seed(0)
    model = shared_bias_model()
    adjacency, node_mask = pad_batch(GRAPHS)
    inputs = [node_features(node_mask), adjacency]
    # Both called as they are: `predict` would trace each model anew.
    outputs = numpy(model(inputs))
    model.save(tmp_path / "shared.keras")
    loaded = keras.models.load_model(tmp_path / "shared.keras", safe_mode=True)
    np.testing.assert_array_equal(numpy(loaded(inputs)), outputs)
    first, second = attention_layers(loaded)
    assert first.position is second.position
    assert len([w for w in loaded.weights if w.name == "embeddings"]) == 1


def test_adjacency_is_required_by_the_bias_and_refused_by_others():
    layer = graph_attention()
    nodes = node_features(np.ones((1, 4), bool))
    adjacency, _ = pad_batch([cycle(4)])
    with pytest.raises(ValueError, match="adjacency"):
        layer(nodes, nodes)
    for position in (None, AlibiBias(HEADS)):
        other = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
        with pytest.raises(ValueError, match="adjacency"):
            other(nodes, nodes, adjacency=adjacency)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"query_positions": np.arange(4)},
        {"key_positions": np.arange(4)},
        {"use_causal_mask": True},
    ],
    ids=["query_positions", "key_positions", "use_causal_mask"],
)
def test_positions_and_causal_mask_are_refused_with_adjacency(kwargs):
    layer = graph_attention()
    nodes = node_features(np.ones((1, 4), bool))
    adjacency, _ = pad_batch([cycle(4)])
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        layer(nodes, nodes, adjacency=adjacency, **kwargs)


def test_a_cache_is_refused_with_adjacency():
    layer = graph_attention()
    nodes = node_features(np.ones((1, 4), bool))
    adjacency, _ = pad_batch([cycle(4)])
    cache = np.zeros((1, 2, 4, HEADS, KEY_DIM), "float32")
    with pytest.raises(ValueError, match="cache"):
        layer(nodes, nodes, adjacency=adjacency, cache=cache, cache_update_index=0)


def test_num_heads_must_equal_the_attentions():
    with pytest.raises(ValueError, match="num_heads"):
        PositionalMultiHeadAttention(8, KEY_DIM, position=ShortestPathBias(4, 3))(
            np.zeros((1, 3, FEATURES), "float32"),
            np.zeros((1, 3, FEATURES), "float32"),
            adjacency=np.zeros((1, 3, 3), "float32"),
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 0, "max_hops": 3}, "num_heads=0"),
        ({"num_heads": 2.0, "max_hops": 3}, "num_heads=2.0"),
        ({"num_heads": True, "max_hops": 3}, "num_heads=True"),
        ({"num_heads": 2, "max_hops": 0}, "max_hops=0"),
        ({"num_heads": 2, "max_hops": -1}, "max_hops=-1"),
        ({"num_heads": 2, "max_hops": 3.0}, "max_hops=3.0"),
        ({"num_heads": 2, "max_hops": None}, "max_hops=None"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ShortestPathBias(**kwargs)


@pytest.mark.parametrize(
    "shape", [(5, 5), (2, 5, 5, 1), (2, 5, 4)], ids=["rank-2", "rank-4", "not-square"]
)
def test_bad_adjacency_shapes_say_what_was_expected(shape):
    with pytest.raises(ValueError, match="adjacency"):
        ShortestPathBias(2, 3)(np.zeros(shape, "float32"))


def test_adjacency_of_another_node_count_than_the_attention_is_refused():
    layer = graph_attention()
    nodes = node_features(np.ones((1, 4), bool))
    adjacency, _ = pad_batch([cycle(5)])
    with pytest.raises(ValueError, match="adjacency"):
        layer(nodes, nodes, adjacency=adjacency)


def test_adjacency_of_another_batch_than_the_queries_is_refused():
    layer = graph_attention()
    nodes = node_features(np.ones((1, 5), bool))
    adjacency, _ = pad_batch([cycle(5), cycle(5)])
    with pytest.raises(ValueError, match=r"`adjacency` must hold one graph per sequence.*\(2, 5, 5\)"):
        layer(nodes, nodes, adjacency=adjacency)


BAD_VALUES = pytest.mark.parametrize(
    "kind, complaint",
    [("directed", "symmetric"), ("negative", "non-negative"), ("nan", "finite")],
)


def bad_adjacency(kind):
    adjacency = cycle(4)[None]
    if kind == "directed":
        adjacency[0, 0, 1] = 0.0
    else:
        adjacency[0, 0, 2] = adjacency[0, 2, 0] = -1.0 if kind == "negative" else np.nan
    return adjacency


@BAD_VALUES
def test_bad_adjacency_values_are_refused(kind, complaint):
    adjacency = bad_adjacency(kind)
    message = f"`adjacency`.*{complaint}"
    layer = ShortestPathBias(2, 3)
    with pytest.raises(RUN_TIME_ERRORS, match=message):
        layer(adjacency)
    # In the attention.
    attention = graph_attention()
    nodes = node_features(np.ones((1, 4), bool))
    with pytest.raises(RUN_TIME_ERRORS, match=message):
        attention(nodes, nodes, adjacency=adjacency)


@tensorflow_only
@BAD_VALUES
def test_bad_adjacency_values_are_refused_in_a_graph(kind, complaint):
    import tensorflow as tf

    adjacency = bad_adjacency(kind)
    message = f"`adjacency`.*{complaint}"
    layer = ShortestPathBias(2, 3)
    traced = tf.function(layer, input_signature=[tf.TensorSpec((None, None, None))])
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        traced(adjacency)

    @tf.function
    def with_constant_adjacency():
        return layer(tf.constant(adjacency))

    with pytest.raises(ValueError, match=message):
        with_constant_adjacency()
    # In the attention, in a graph.
    attention = graph_attention()
    nodes = node_features(np.ones((1, 4), bool))

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, None, FEATURES)),
            tf.TensorSpec((None, None, None)),
        ]
    )
    def attend(nodes, adjacency):
        return attention(nodes, nodes, adjacency=adjacency)

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        attend(nodes, adjacency)


@BAD_VALUES
def test_compiled_code_makes_a_bad_graphs_bias_nan(kind, complaint):
    # XLA drops the check, a JAX trace cannot raise: the bias shows it.
    layer = ShortestPathBias(2, 3)
    adjacency = np.concatenate([cycle(4)[None], bad_adjacency(kind)])
    expected = numpy(layer(adjacency[:1]))[0]  # built eagerly
    if not XLA:  # PyTorch runs `compiled` eagerly: it refuses instead
        with pytest.raises(ValueError, match=complaint):
            compiled(layer)(adjacency)
        return
    bias = numpy(compiled(layer)(adjacency))  # (batch, heads, nodes, nodes)
    assert np.isnan(bias[1]).all()
    np.testing.assert_array_equal(bias[0], expected)
    attention = graph_attention()
    nodes = node_features(np.ones((2, 4), bool))
    outputs = numpy(
        compiled(lambda n, a: attention(n, n, adjacency=a))(nodes, adjacency)
    )
    assert np.isnan(outputs[1]).all() and np.isfinite(outputs[0]).all()
