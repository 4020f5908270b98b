"""RandomWalkPositionEncoding: PyG's return probabilities, merged as the others.

`ops.random_walk_probabilities` is checked against PyTorch Geometric's
`AddRandomWalkPE` in tests/test_graph_ops.py; here the layer's encoding is
checked against `D^-1 A` in NumPy (PyG's on a 0/1 adjacency, the package's
definition on a weighted one), and the layer merges, masks, saves,
exports and compiles like the other layers, with `symmetric=False` for
directed graphs.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import RandomWalkPositionEncoding
from tests import references
from tests.test_case import TestCase
from tests.test_graph_ops import RANDOM_WALK_ATOL
from tests.test_graph_ops import RANDOM_WALK_RTOL
from tests.test_graph_ops import complete
from tests.test_graph_ops import cycle
from tests.test_graph_ops import disjoint
from tests.test_graph_ops import erdos_renyi
from tests.test_graph_ops import pad_batch
from tests.test_graph_ops import path
from tests.test_graph_ops import permute
from tests.test_graph_ops import serve_with_tensorflow_alone
from tests.test_graph_ops import star
from tests.test_graph_ops import weighted

FEATURES = 5
STEPS = 6

# 10, 7 (disconnected, an isolated node), 4 and 1 nodes, padded to 10.
GRAPHS = [
    erdos_renyi(10, 0.35, seed=2),
    disjoint(cycle(4), path(2), np.zeros((1, 1), "float32")),
    star(4),
    complete(1),
]


def random_features(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def padded_inputs(graphs=GRAPHS, features=FEATURES, seed=0):
    """Node features, zero at padded nodes, the adjacency and the node mask."""
    adjacency, node_mask = pad_batch(graphs)
    inputs = random_features(node_mask.shape + (features,), seed) * node_mask[..., None]
    return inputs, adjacency, node_mask


def reference_encoding(adjacency, node_mask, steps=STEPS):
    """Each graph's `D^-1 A` return probabilities on its real nodes, else 0."""
    encoding = np.zeros(node_mask.shape + (steps,), "float64")
    for b in range(len(adjacency)):
        n = int(node_mask[b].sum())
        encoding[b, :n] = references.random_walk_pe(adjacency[b, :n, :n], steps)
    return encoding


def projection_weights(layer):
    """The kernel and bias of the layer's Dense sublayer "projection", float64."""
    (kernel,) = [w for w in layer.weights if w.path.endswith("projection/kernel")]
    (bias,) = [w for w in layer.weights if w.path.endswith("projection/bias")]
    return np.asarray(kernel.numpy(), "float64"), np.asarray(bias.numpy(), "float64")


def assert_close_to_reference(encoding, expected):
    assert encoding.dtype == tf.float32
    np.testing.assert_allclose(
        encoding.numpy(), expected, rtol=RANDOM_WALK_RTOL, atol=RANDOM_WALK_ATOL
    )


class RandomWalkPositionEncodingLayerTest(TestCase):
    # As for the Laplacian layer, run_layer_test cannot call a layer of node
    # features and an adjacency; its checks are written out below.

    def test_config_and_serialization_round_trip(self):
        for kwargs in (
            {"steps": 8},
            {"steps": 3, "symmetric": False, "merge_mode": "concat"},
            {"steps": 4, "merge_mode": "concat", "output_dim": 6},
            {"steps": 1, "merge_mode": None, "output_dim": 2},
            {"steps": 16, "merge_mode": None},
        ):
            layer = RandomWalkPositionEncoding(**kwargs, name="random_walk")
            revived = self.run_class_serialization_test(layer)
            self.assertEqual(revived.get_config(), layer.get_config())
            config = layer.get_config()
            defaults = {"symmetric": True, "merge_mode": "add", "output_dim": None}
            for name, value in {**defaults, **kwargs}.items():
                self.assertEqual(config[name], value)


MERGES = {
    "add": ({"merge_mode": "add"}, FEATURES),
    "concat": ({"merge_mode": "concat"}, FEATURES + STEPS),
    "concat-projected": ({"merge_mode": "concat", "output_dim": 4}, FEATURES + 4),
    "alone": ({"merge_mode": None}, STEPS),
    "alone-projected": ({"merge_mode": None, "output_dim": 2}, 2),
}


@pytest.mark.parametrize("merge", MERGES)
def test_symbolic_call_build_and_one_fit_step(merge):
    kwargs, width = MERGES[merge]
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    layer = RandomWalkPositionEncoding(STEPS, **kwargs)
    encoded = layer(features, adjacency_input)
    assert tuple(encoded.shape) == (None, None, width)
    assert encoded.dtype == "float32"
    assert layer.built
    assert layer.compute_output_shape((2, 9, FEATURES), (2, 9, 9)) == (2, 9, width)
    projected = kwargs.get("output_dim") is not None or kwargs["merge_mode"] == "add"
    assert len(layer.trainable_weights) == (2 if projected else 0)
    # A head on top, so that a layer without weights has a model to fit.
    model = keras.Model([features, adjacency_input], keras.layers.Dense(2)(encoded))
    inputs, adjacency, _ = padded_inputs()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [weight.numpy().copy() for weight in model.trainable_weights]
    model.fit(
        [inputs, adjacency],
        np.ones(inputs.shape[:2] + (2,), "float32"),
        batch_size=4,
        epochs=1,
        verbose=0,
    )
    for weight, start in zip(model.trainable_weights, before):
        assert not np.array_equal(weight.numpy(), start)


def test_encoding_is_pyg_add_random_walk_pe():
    inputs, adjacency, node_mask = padded_inputs()
    layer = RandomWalkPositionEncoding(STEPS, merge_mode=None)
    encoding = layer(inputs, adjacency, mask=node_mask)
    assert_close_to_reference(encoding, reference_encoding(adjacency, node_mask))
    np.testing.assert_array_equal(encoding.numpy()[~node_mask], 0.0)
    # Nothing random: training changes nothing.
    np.testing.assert_array_equal(
        layer(inputs, adjacency, mask=node_mask, training=True).numpy(),
        encoding.numpy(),
    )


def test_weighted_graphs_with_self_loops():
    graphs = [
        weighted(erdos_renyi(9, 0.5, seed=3), seed=3) + np.diag(np.arange(9) % 3),
        weighted(cycle(6), seed=4),
    ]
    inputs, adjacency, node_mask = padded_inputs(graphs)
    encoding = RandomWalkPositionEncoding(STEPS, merge_mode=None)(
        inputs, adjacency, mask=node_mask
    )
    assert_close_to_reference(encoding, reference_encoding(adjacency, node_mask))


def test_directed_graphs_need_symmetric_false():
    rng = np.random.default_rng(5)
    directed = ((rng.random((8, 8)) < 0.3) * rng.uniform(0.5, 2.0, (8, 8))).astype(
        "float32"
    )
    one_way_cycle = np.roll(np.eye(6, dtype="float32"), 1, axis=1)
    graphs = [directed, one_way_cycle]
    inputs, adjacency, node_mask = padded_inputs(graphs)
    encoding = RandomWalkPositionEncoding(STEPS, symmetric=False, merge_mode=None)(
        inputs, adjacency, mask=node_mask
    )
    assert_close_to_reference(encoding, reference_encoding(adjacency, node_mask))
    # Around a one-way cycle of 6, a walk is back after 6 steps, surely.
    np.testing.assert_allclose(
        encoding.numpy()[1, :6], [[0, 0, 0, 0, 0, 1]] * 6, atol=1e-7
    )
    with pytest.raises(
        (ValueError, tf.errors.InvalidArgumentError), match="`adjacency`.*symmetric"
    ):
        RandomWalkPositionEncoding(STEPS)(inputs, adjacency, mask=node_mask)


def test_merge_modes():
    inputs, adjacency, node_mask = padded_inputs()
    encoding = RandomWalkPositionEncoding(STEPS, merge_mode=None)(
        inputs, adjacency, mask=node_mask
    ).numpy()
    real = node_mask[..., None]

    added = RandomWalkPositionEncoding(STEPS)
    outputs = added(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(added)
    assert kernel.shape == (STEPS, FEATURES)
    np.testing.assert_allclose(
        outputs, inputs + (encoding @ kernel + bias) * real, rtol=0, atol=1e-5
    )
    np.testing.assert_array_equal(outputs[~node_mask], inputs[~node_mask])

    concatenated = RandomWalkPositionEncoding(STEPS, merge_mode="concat")(
        inputs, adjacency, mask=node_mask
    ).numpy()
    np.testing.assert_array_equal(concatenated, np.concatenate([inputs, encoding], -1))

    projected = RandomWalkPositionEncoding(STEPS, merge_mode="concat", output_dim=3)
    outputs = projected(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(projected)
    np.testing.assert_array_equal(outputs[..., :FEATURES], inputs)
    np.testing.assert_allclose(
        outputs[..., FEATURES:], (encoding @ kernel + bias) * real, rtol=0, atol=1e-5
    )

    alone = RandomWalkPositionEncoding(STEPS, merge_mode=None, output_dim=2)
    outputs = alone(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(alone)
    np.testing.assert_allclose(
        outputs, (encoding @ kernel + bias) * real, rtol=0, atol=1e-5
    )


def test_keras_mask_of_the_features_is_the_node_mask():
    inputs, adjacency, node_mask = padded_inputs()
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    masked = keras.layers.Masking(0.0)(features)
    layer = RandomWalkPositionEncoding(STEPS, merge_mode="concat", output_dim=3)
    model = keras.Model([features, adjacency_input], layer(masked, adjacency_input))
    np.testing.assert_array_equal(
        model([inputs, adjacency]).numpy(),
        layer(inputs, adjacency, mask=node_mask).numpy(),
    )
    assert layer.supports_masking


def test_padded_batch_equals_each_graph_alone():
    inputs, adjacency, node_mask = padded_inputs()
    layer = RandomWalkPositionEncoding(STEPS, merge_mode="add")
    outputs = layer(inputs, adjacency, mask=node_mask).numpy()
    for b, graph in enumerate(GRAPHS):
        n = len(graph)
        alone = layer(inputs[b : b + 1, :n], graph[None]).numpy()[0]
        np.testing.assert_allclose(outputs[b, :n], alone, rtol=1e-6, atol=1e-6)


@settings(deadline=None, max_examples=20)
@given(st.integers(2, 9), st.floats(0.0, 1.0), st.integers(0, 2**16), st.randoms())
def test_permuting_nodes_permutes_the_outputs(n, p, seed, random):
    graph = weighted(erdos_renyi(n, p, seed), seed)
    permutation = np.arange(n)
    random.shuffle(permutation)
    inputs = random_features((1, n, FEATURES), seed)
    inputs = np.concatenate([inputs, inputs[:, permutation]])
    layer = RandomWalkPositionEncoding(4, merge_mode="concat")
    outputs = layer(inputs, np.stack([graph, permute(graph, permutation)])).numpy()
    # The same sums of products in another order: float32 rounding apart.
    np.testing.assert_allclose(
        outputs[1], outputs[0][permutation], rtol=1e-6, atol=1e-7
    )
    assert np.all((outputs[..., FEATURES:] >= 0) & (outputs[..., FEATURES:] <= 1))


def functional_model(layer):
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    return keras.Model([features, adjacency_input], layer(features, adjacency_input))


def test_keras_file_round_trip_is_bit_identical(tmp_path):
    keras.utils.set_random_seed(0)
    model = functional_model(RandomWalkPositionEncoding(STEPS, symmetric=False))
    inputs, adjacency, _ = padded_inputs()
    expected = model.predict([inputs, adjacency], verbose=0)
    model.save(tmp_path / "random_walk.keras")
    loaded = keras.models.load_model(tmp_path / "random_walk.keras", safe_mode=True)
    (layer,) = [
        layer
        for layer in loaded.layers
        if isinstance(layer, RandomWalkPositionEncoding)
    ]
    assert layer.get_config() == model.layers[-1].get_config()
    np.testing.assert_array_equal(
        loaded.predict([inputs, adjacency], verbose=0), expected
    )


def test_export_serves_with_tensorflow_alone(tmp_path):
    keras.utils.set_random_seed(0)
    model = functional_model(RandomWalkPositionEncoding(STEPS, merge_mode="add"))
    inputs, adjacency, _ = padded_inputs()
    served = serve_with_tensorflow_alone(model, [inputs, adjacency], tmp_path)
    np.testing.assert_allclose(
        served, model.predict([inputs, adjacency], verbose=0), rtol=0, atol=1e-6
    )


def test_xla_at_two_graph_sizes():
    layer = RandomWalkPositionEncoding(STEPS, merge_mode=None)
    compiled = tf.function(layer, jit_compile=True)
    for graphs in ([cycle(5), path(4)], [erdos_renyi(11, 0.4, seed=6), star(7)]):
        inputs, adjacency, node_mask = padded_inputs(graphs)
        assert_close_to_reference(
            compiled(inputs, adjacency, mask=node_mask),
            reference_encoding(adjacency, node_mask),
        )


def test_mixed_bfloat16_computes_in_float32_and_casts():
    inputs, adjacency, node_mask = padded_inputs()
    expected = RandomWalkPositionEncoding(STEPS, merge_mode="concat")(
        inputs, adjacency, mask=node_mask
    ).numpy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = RandomWalkPositionEncoding(STEPS, merge_mode="concat")
    outputs = layer(inputs, adjacency, mask=node_mask)
    assert outputs.dtype == tf.bfloat16
    np.testing.assert_array_equal(
        outputs.numpy().astype("float32"),
        expected.astype(tf.bfloat16.as_numpy_dtype).astype("float32"),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"steps": 0}, "steps=0"),
        ({"steps": -1}, "steps=-1"),
        ({"steps": 3.0}, "steps=3.0"),
        ({"steps": True}, "steps=True"),
        ({"steps": 3, "symmetric": "no"}, "symmetric='no'"),
        ({"steps": 3, "merge_mode": "x"}, "merge_mode='x'"),
        ({"steps": 3, "merge_mode": "add", "output_dim": 4}, "output_dim=4"),
        ({"steps": 3, "merge_mode": "concat", "output_dim": 0}, "output_dim=0"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RandomWalkPositionEncoding(**kwargs)


@pytest.mark.parametrize(
    "inputs_shape, adjacency_shape",
    [
        ((2, 5, FEATURES), (2, 5)),
        ((2, 5, FEATURES), (2, 5, 5, 1)),
        ((2, 5, FEATURES), (2, 5, 4)),
        ((2, 5, FEATURES), (2, 6, 6)),
    ],
    ids=["rank-2", "rank-4", "not-square", "other-node-count"],
)
def test_bad_adjacency_shapes_say_what_was_expected(inputs_shape, adjacency_shape):
    layer = RandomWalkPositionEncoding(2, symmetric=False)
    with pytest.raises(ValueError, match="adjacency"):
        layer(np.zeros(inputs_shape, "float32"), np.zeros(adjacency_shape, "float32"))
    with pytest.raises(ValueError, match="adjacency"):
        RandomWalkPositionEncoding(2)(
            keras.Input(inputs_shape[1:]), keras.Input(adjacency_shape[1:])
        )


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(
    "value, complaint",
    [(-1.0, "non-negative"), (np.nan, "finite"), (np.inf, "finite")],
    ids=["negative", "nan", "inf"],
)
def test_negative_or_not_finite_adjacency_is_refused(value, complaint, symmetric):
    adjacency = cycle(4)[None]
    adjacency[0, 0, 2] = adjacency[0, 2, 0] = value
    inputs = np.zeros((1, 4, FEATURES), "float32")
    message = f"`adjacency`.*{complaint}"
    layer = RandomWalkPositionEncoding(3, symmetric=symmetric)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=message):
        layer(inputs, adjacency)
    traced = tf.function(
        layer,
        input_signature=[
            tf.TensorSpec((None, None, FEATURES)),
            tf.TensorSpec((None, None, None)),
        ],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        traced(inputs, adjacency)


def test_directed_adjacency_is_refused_at_run_time_and_trace_time():
    adjacency = np.roll(np.eye(4, dtype="float32"), 1, axis=1)[None]
    inputs = np.zeros((1, 4, FEATURES), "float32")
    message = "`adjacency`.*symmetric"
    layer = RandomWalkPositionEncoding(3)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=message):
        layer(inputs, adjacency)
    traced = tf.function(
        layer,
        input_signature=[
            tf.TensorSpec((None, None, FEATURES)),
            tf.TensorSpec((None, None, None)),
        ],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        traced(inputs, adjacency)

    @tf.function
    def with_constant_adjacency(inputs):
        return layer(inputs, tf.constant(adjacency))

    with pytest.raises(ValueError, match=message):
        with_constant_adjacency(inputs)
    # symmetric=False takes it, in a graph too: back after 4 steps, not 1 to 3.
    directed = RandomWalkPositionEncoding(3, symmetric=False, merge_mode=None)
    np.testing.assert_allclose(
        tf.function(directed)(inputs, adjacency).numpy(),
        [[[0, 0, 0]] * 4],
        atol=1e-7,
    )
