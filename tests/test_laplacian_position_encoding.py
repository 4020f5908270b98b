"""LaplacianPositionEncoding: PyG's eigenvectors, merged as the absolute layers.

The eigenvectors themselves are checked against PyTorch Geometric's
definition in tests/test_graph_ops.py; here the layer's encoding is the op's
at inference, its signs flip at random in training, and it merges, masks,
saves, exports and compiles like the other layers.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import LaplacianPositionEncoding
from keras_posenc import ops
from tests.test_case import TestCase
from tests.test_graph_ops import assert_laplacian_eigenvectors
from tests.test_graph_ops import assert_largest_entry_positive
from tests.test_graph_ops import complete
from tests.test_graph_ops import cycle
from tests.test_graph_ops import determined_columns
from tests.test_graph_ops import disjoint
from tests.test_graph_ops import erdos_renyi
from tests.test_graph_ops import pad_batch
from tests.test_graph_ops import path
from tests.test_graph_ops import permute
from tests.test_graph_ops import serve_with_tensorflow_alone
from tests.test_graph_ops import star

FEATURES = 5

# Graphs of 9, 6, 4 (a path of 3 and an isolated node) and 2 nodes, padded
# to 9: the last has fewer than k + 1 nodes for any k > 1.
GRAPHS = [
    erdos_renyi(9, 0.4, seed=1),
    cycle(6),
    disjoint(path(3), np.zeros((1, 1), "float32")),
    path(2),
]


def random_features(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def padded_inputs(graphs=GRAPHS, features=FEATURES, seed=0):
    """Node features, zero at padded nodes, the adjacency and the node mask."""
    adjacency, node_mask = pad_batch(graphs)
    inputs = random_features(node_mask.shape + (features,), seed) * node_mask[..., None]
    return inputs, adjacency, node_mask


def projection_weights(layer):
    """The kernel and bias of the layer's Dense sublayer "projection", float64."""
    (kernel,) = [w for w in layer.weights if w.path.endswith("projection/kernel")]
    (bias,) = [w for w in layer.weights if w.path.endswith("projection/bias")]
    return np.asarray(kernel.numpy(), "float64"), np.asarray(bias.numpy(), "float64")


def eigenvectors(adjacency, node_mask, k, normalization="sym"):
    _, vectors = ops.laplacian_eigenvectors(
        adjacency, k, normalization=normalization, node_mask=node_mask
    )
    return vectors.numpy()


class LaplacianPositionEncodingLayerTest(TestCase):
    # run_layer_test calls a layer on one input (or keyword inputs named as
    # build's arguments) and fits it on one: not a layer of node features
    # and an adjacency. Its checks are written out below.

    def test_config_and_serialization_round_trip(self):
        for kwargs in (
            {"k": 4},
            {"k": 2, "normalization": None, "merge_mode": "concat", "seed": 7},
            {"k": 3, "merge_mode": "concat", "output_dim": 6},
            {"k": 1, "merge_mode": None, "output_dim": 2},
            {"k": 5, "merge_mode": None},
        ):
            layer = LaplacianPositionEncoding(**kwargs, name="laplacian")
            revived = self.run_class_serialization_test(layer)
            self.assertEqual(revived.get_config(), layer.get_config())
            config = layer.get_config()
            defaults = {
                "normalization": "sym",
                "merge_mode": "add",
                "output_dim": None,
                "seed": None,
            }
            for name, value in {**defaults, **kwargs}.items():
                self.assertEqual(config[name], value)


MERGES = {
    "add": ({"merge_mode": "add"}, FEATURES),
    "concat": ({"merge_mode": "concat"}, FEATURES + 3),
    "concat-projected": ({"merge_mode": "concat", "output_dim": 4}, FEATURES + 4),
    "alone": ({"merge_mode": None}, 3),
    "alone-projected": ({"merge_mode": None, "output_dim": 2}, 2),
}


@pytest.mark.parametrize("merge", MERGES)
def test_symbolic_call_build_and_one_fit_step(merge):
    kwargs, width = MERGES[merge]
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    layer = LaplacianPositionEncoding(3, seed=1, **kwargs)
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


def test_inference_encoding_is_the_ops_eigenvectors():
    inputs, adjacency, node_mask = padded_inputs()
    for normalization in ("sym", None):
        layer = LaplacianPositionEncoding(
            4, normalization=normalization, merge_mode=None
        )
        encoding = layer(inputs, adjacency, mask=node_mask)
        assert encoding.dtype == tf.float32
        values, vectors = ops.laplacian_eigenvectors(
            adjacency, 4, normalization=normalization, node_mask=node_mask
        )
        np.testing.assert_array_equal(encoding.numpy(), vectors.numpy())
        for b, graph in enumerate(GRAPHS):
            n = len(graph)
            assert_laplacian_eigenvectors(
                values[b].numpy(), encoding[b, :n].numpy(), graph, 4, normalization
            )
            np.testing.assert_array_equal(encoding[b, n:].numpy(), 0.0)
        assert_largest_entry_positive(encoding[0].numpy())
        # Deterministic: again, and with training=False, the same.
        np.testing.assert_array_equal(
            layer(inputs, adjacency, mask=node_mask, training=False).numpy(),
            encoding.numpy(),
        )


def test_merge_modes():
    inputs, adjacency, node_mask = padded_inputs()
    vectors = eigenvectors(adjacency, node_mask, 3)  # (batch, nodes, 3)
    real = node_mask[..., None]

    added = LaplacianPositionEncoding(3, merge_mode="add")
    outputs = added(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(added)
    assert kernel.shape == (3, FEATURES)
    expected = inputs + (vectors @ kernel + bias) * real
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-5)
    # Padded nodes: the projection's bias is not added either.
    np.testing.assert_array_equal(outputs[~node_mask], inputs[~node_mask])

    concatenated = LaplacianPositionEncoding(3, merge_mode="concat")(
        inputs, adjacency, mask=node_mask
    ).numpy()
    np.testing.assert_array_equal(concatenated, np.concatenate([inputs, vectors], -1))

    projected = LaplacianPositionEncoding(3, merge_mode="concat", output_dim=4)
    outputs = projected(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(projected)
    assert kernel.shape == (3, 4)
    np.testing.assert_array_equal(outputs[..., :FEATURES], inputs)
    np.testing.assert_allclose(
        outputs[..., FEATURES:], (vectors @ kernel + bias) * real, rtol=0, atol=1e-5
    )
    np.testing.assert_array_equal(outputs[~node_mask][:, FEATURES:], 0.0)

    alone = LaplacianPositionEncoding(3, merge_mode=None, output_dim=2)
    outputs = alone(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(alone)
    np.testing.assert_allclose(
        outputs, (vectors @ kernel + bias) * real, rtol=0, atol=1e-5
    )


def test_training_flips_the_sign_of_each_eigenvector_at_random():
    graphs = [erdos_renyi(n, 0.5, seed=n) for n in range(5, 13)] * 2 + [path(2)]
    inputs, adjacency, node_mask = padded_inputs(graphs)
    layer = LaplacianPositionEncoding(4, merge_mode=None, seed=3)
    inference = layer(inputs, adjacency, mask=node_mask).numpy()
    flipped = layer(inputs, adjacency, mask=node_mask, training=True).numpy()
    signs = []
    for b in range(len(graphs)):
        for column in range(4):
            vector, candidate = inference[b, :, column], flipped[b, :, column]
            if not vector.any():
                np.testing.assert_array_equal(candidate, 0.0)
                continue
            sign = 1.0 if np.array_equal(candidate, vector) else -1.0
            np.testing.assert_array_equal(candidate, sign * vector)
            signs.append(sign)
    assert 0.2 < np.mean(np.array(signs) > 0) < 0.8
    # The generator moves on: the next training call flips others.
    again = layer(inputs, adjacency, mask=node_mask, training=True).numpy()
    assert not np.array_equal(again, flipped)
    # The same seed gives the same flips; inference never flips.
    twin = LaplacianPositionEncoding(4, merge_mode=None, seed=3)
    np.testing.assert_array_equal(
        twin(inputs, adjacency, mask=node_mask, training=True).numpy(), flipped
    )
    np.testing.assert_array_equal(
        layer(inputs, adjacency, mask=node_mask).numpy(), inference
    )


def test_training_flips_before_the_projection():
    inputs, adjacency, node_mask = padded_inputs()
    layer = LaplacianPositionEncoding(3, merge_mode=None, output_dim=2, seed=5)
    inference = layer(inputs, adjacency, mask=node_mask).numpy()
    kernel, bias = projection_weights(layer)
    vectors = eigenvectors(adjacency, node_mask, 3)
    outputs = layer(inputs, adjacency, mask=node_mask, training=True).numpy()
    # Some signs of each graph's columns reproduce the training output.
    for b in range(len(GRAPHS)):
        matches = [
            np.allclose(
                outputs[b],
                ((vectors[b] * signs) @ kernel + bias) * node_mask[b, :, None],
                atol=1e-5,
            )
            for signs in np.array(np.meshgrid(*[[1, -1]] * 3)).reshape(3, -1).T
        ]
        assert any(matches)
    assert not np.array_equal(inference, outputs)


def test_fewer_nodes_than_k_plus_one_gives_zero_columns():
    inputs, adjacency, node_mask = padded_inputs(
        [complete(1), path(2), star(4), cycle(8)]
    )
    encoding = LaplacianPositionEncoding(5, merge_mode=None)(
        inputs, adjacency, mask=node_mask
    ).numpy()
    for b, columns in enumerate([0, 1, 3, 5]):
        np.testing.assert_array_equal(encoding[b, :, columns:], 0.0)
        assert np.all(np.abs(encoding[b, :, :columns]).max(axis=0) > 0.1)
    assert np.all(np.isfinite(encoding))


def test_keras_mask_of_the_features_is_the_node_mask():
    inputs, adjacency, node_mask = padded_inputs()
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    masked = keras.layers.Masking(0.0)(features)
    layer = LaplacianPositionEncoding(3, merge_mode="add")
    model = keras.Model([features, adjacency_input], layer(masked, adjacency_input))
    np.testing.assert_array_equal(
        model([inputs, adjacency]).numpy(),
        layer(inputs, adjacency, mask=node_mask).numpy(),
    )
    # The mask passes on, as through the absolute layers.
    assert layer.supports_masking


def test_padded_batch_equals_each_graph_alone():
    inputs, adjacency, node_mask = padded_inputs()
    layer = LaplacianPositionEncoding(4, merge_mode=None)
    encoding = layer(inputs, adjacency, mask=node_mask).numpy()
    for b, graph in enumerate(GRAPHS):
        n = len(graph)
        alone = layer(inputs[b : b + 1, :n], graph[None]).numpy()[0]
        values, _ = ops.laplacian_eigenvectors(graph[None], 4)
        # Both the same eigenspaces; and where an eigenvector is determined,
        # the same vector (eigh of another size rounds differently).
        assert_laplacian_eigenvectors(values[0].numpy(), encoding[b, :n], graph, 4)
        assert_laplacian_eigenvectors(values[0].numpy(), alone, graph, 4)
        for column in determined_columns(graph, 4):
            np.testing.assert_allclose(
                encoding[b, :n, column], alone[:, column], rtol=0, atol=1e-4
            )
        np.testing.assert_array_equal(encoding[b, n:], 0.0)


def test_permuting_nodes_permutes_the_outputs():
    # Every eigenvector of this graph is determined (simple eigenvalue, one
    # largest entry), so the outputs permute with the nodes, projected too.
    graph = erdos_renyi(8, 0.5, seed=4)
    assert len(determined_columns(graph, 7)) == 7
    permutation = np.array([3, 0, 6, 1, 5, 2, 7, 4])
    adjacency = np.stack([graph, permute(graph, permutation)])
    inputs = random_features((1, 8, FEATURES))
    inputs = np.concatenate([inputs, inputs[:, permutation]])
    layer = LaplacianPositionEncoding(7, merge_mode="add")
    outputs = layer(inputs, adjacency).numpy()
    np.testing.assert_allclose(outputs[1], outputs[0][permutation], rtol=0, atol=1e-4)


@settings(deadline=None, max_examples=15)
@given(st.integers(3, 9), st.floats(0.0, 1.0), st.integers(0, 2**16), st.randoms())
def test_permuting_nodes_permutes_the_eigenspaces(n, p, seed, random):
    graph = erdos_renyi(n, p, seed)
    permutation = np.arange(n)
    random.shuffle(permutation)
    layer = LaplacianPositionEncoding(3, merge_mode=None)
    adjacency = np.stack([graph, permute(graph, permutation)])
    encoding = layer(np.zeros((2, n, 1), "float32"), adjacency).numpy()
    values, _ = ops.laplacian_eigenvectors(adjacency, 3)
    for b, rows in ((0, np.arange(n)), (1, np.argsort(permutation))):
        assert_laplacian_eigenvectors(values[b].numpy(), encoding[b][rows], graph, 3)


def functional_model(layer):
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    return keras.Model([features, adjacency_input], layer(features, adjacency_input))


def test_keras_file_round_trip_is_bit_identical(tmp_path):
    keras.utils.set_random_seed(0)
    model = functional_model(
        LaplacianPositionEncoding(4, normalization=None, merge_mode="add", seed=2)
    )
    inputs, adjacency, _ = padded_inputs()
    expected = model.predict([inputs, adjacency], verbose=0)
    model.save(tmp_path / "laplacian.keras")
    loaded = keras.models.load_model(tmp_path / "laplacian.keras", safe_mode=True)
    (layer,) = [
        layer for layer in loaded.layers if isinstance(layer, LaplacianPositionEncoding)
    ]
    assert layer.get_config() == model.layers[-1].get_config()
    np.testing.assert_array_equal(
        loaded.predict([inputs, adjacency], verbose=0), expected
    )


def test_export_serves_with_tensorflow_alone(tmp_path):
    keras.utils.set_random_seed(0)
    model = functional_model(
        LaplacianPositionEncoding(3, merge_mode="concat", output_dim=2)
    )
    inputs, adjacency, _ = padded_inputs()
    served = serve_with_tensorflow_alone(model, [inputs, adjacency], tmp_path)
    np.testing.assert_allclose(
        served, model.predict([inputs, adjacency], verbose=0), rtol=0, atol=1e-6
    )


def test_xla_at_two_graph_sizes():
    layer = LaplacianPositionEncoding(3, merge_mode=None)
    compiled = tf.function(layer, jit_compile=True)
    for graphs in ([cycle(5), path(4)], [erdos_renyi(9, 0.5, seed=3), star(7)]):
        inputs, adjacency, node_mask = padded_inputs(graphs)
        encoding = compiled(inputs, adjacency, mask=node_mask).numpy()
        # XLA's eigh is another algorithm: compare with the reference.
        for b, graph in enumerate(graphs):
            assert_laplacian_eigenvectors(None, encoding[b, : len(graph)], graph, 3)
            np.testing.assert_array_equal(encoding[b, len(graph) :], 0.0)


def test_mixed_bfloat16_computes_in_float32_and_casts():
    inputs, adjacency, node_mask = padded_inputs()
    expected = LaplacianPositionEncoding(3, merge_mode="concat")(
        inputs, adjacency, mask=node_mask
    ).numpy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = LaplacianPositionEncoding(3, merge_mode="concat")
    outputs = layer(inputs, adjacency, mask=node_mask)
    assert outputs.dtype == tf.bfloat16
    np.testing.assert_array_equal(
        outputs.numpy().astype("float32"),
        expected.astype(tf.bfloat16.as_numpy_dtype).astype("float32"),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, "k=0"),
        ({"k": -2}, "k=-2"),
        ({"k": 2.0}, "k=2.0"),
        ({"k": True}, "k=True"),
        ({"k": 2, "normalization": "rw"}, "normalization='rw'"),
        ({"k": 2, "normalization": "none"}, "normalization='none'"),
        ({"k": 2, "merge_mode": "x"}, "merge_mode='x'"),
        ({"k": 2, "merge_mode": "add", "output_dim": 4}, "output_dim=4"),
        ({"k": 2, "merge_mode": "concat", "output_dim": 0}, "output_dim=0"),
        ({"k": 2, "merge_mode": None, "output_dim": -1}, "output_dim=-1"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LaplacianPositionEncoding(**kwargs)


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
    layer = LaplacianPositionEncoding(2)
    with pytest.raises(ValueError, match="adjacency"):
        layer(np.zeros(inputs_shape, "float32"), np.zeros(adjacency_shape, "float32"))
    with pytest.raises(ValueError, match="adjacency"):
        LaplacianPositionEncoding(2)(
            keras.Input(inputs_shape[1:]), keras.Input(adjacency_shape[1:])
        )


def bad_adjacencies():
    directed = cycle(4)
    directed[0, 1] = 0.0
    negative = cycle(4)
    negative[0, 1] = negative[1, 0] = -1.0
    not_finite = cycle(4)
    not_finite[0, 2] = not_finite[2, 0] = np.nan
    infinite = cycle(4)
    infinite[1, 3] = infinite[3, 1] = np.inf
    return {
        "directed": directed,
        "negative": negative,
        "nan": not_finite,
        "inf": infinite,
    }


# What the message says is wrong, after naming `adjacency`.
COMPLAINTS = {
    "directed": "symmetric",
    "negative": "non-negative",
    "nan": "finite",
    "inf": "finite",
}


@pytest.mark.parametrize("kind", COMPLAINTS)
def test_bad_adjacency_values_are_refused(kind):
    adjacency = bad_adjacencies()[kind][None]
    inputs = np.zeros((1, 4, FEATURES), "float32")
    message = f"`adjacency`.*{COMPLAINTS[kind]}"
    layer = LaplacianPositionEncoding(2)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match=message):
        layer(inputs, adjacency)
    # In a graph, at run time.
    traced = tf.function(
        layer,
        input_signature=[
            tf.TensorSpec((None, None, FEATURES)),
            tf.TensorSpec((None, None, None)),
        ],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        traced(inputs, adjacency)

    # A constant adjacency: at trace time.
    @tf.function
    def with_constant_adjacency(inputs):
        return layer(inputs, tf.constant(adjacency))

    with pytest.raises(ValueError, match=message):
        with_constant_adjacency(inputs)
