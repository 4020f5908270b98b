"""LaplacianPositionEncoding: PyG's eigenvectors, merged as the absolute layers.

The eigenvectors themselves are checked against PyTorch Geometric's
definition in tests/test_graph_ops.py; here the layer's encoding is the op's
at inference and its signs flip at random in training. That it merges,
masks, saves, exports and compiles like the other graph layer is checked,
with `CASE` below, in tests/test_graph_encoding_contract.py.
"""

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import LaplacianPositionEncoding
from keras_posenc import ops
from tests import references
from tests.backend import compiled
from tests.backend import numpy
from tests.graph_encoding_contract import FEATURES
from tests.graph_encoding_contract import GraphEncodingCase
from tests.graph_encoding_contract import padded_inputs
from tests.graph_encoding_contract import projection_weights
from tests.graph_encoding_contract import random_features
from tests.test_case import TestCase
from tests.test_graph_ops import assert_laplacian_eigenvectors
from tests.test_graph_ops import assert_largest_entry_positive
from tests.test_graph_ops import complete
from tests.test_graph_ops import cycle
from tests.test_graph_ops import determined_columns
from tests.test_graph_ops import disjoint
from tests.test_graph_ops import dtype_of
from tests.test_graph_ops import erdos_renyi
from tests.test_graph_ops import path
from tests.test_graph_ops import permute
from tests.test_graph_ops import star
from tests.test_graph_ops import weighted

# Graphs of 9, 6, 4 (a path of 3 and an isolated node) and 2 nodes, padded
# to 9: the last has fewer than k + 1 nodes for any k > 1.
GRAPHS = [
    erdos_renyi(9, 0.4, seed=1),
    cycle(6),
    disjoint(path(3), np.zeros((1, 1), "float32")),
    path(2),
]

# The k of the layer that the shared contract tests build.
CONTRACT_K = 3


def eigenvectors(adjacency, node_mask, k, normalization="sym"):
    """The op's eigenvectors `(batch, nodes, k)` of a padded batch, NumPy."""
    _, vectors = ops.laplacian_eigenvectors(
        adjacency, k, normalization=normalization, node_mask=node_mask
    )
    return numpy(vectors)


def contract_encoding(inputs, adjacency, node_mask):
    """The encoding the contract's layer merges: the op's eigenvectors."""
    return eigenvectors(adjacency, node_mask, CONTRACT_K)


def assert_eigenvectors_of_each_graph(encoding, graphs):
    """Each graph's columns span its eigenspaces; zero at padded nodes.

    Compared with the float64 reference, not the op: XLA's eigh is another
    algorithm.
    """
    encoding = numpy(encoding)
    for b, graph in enumerate(graphs):
        n = len(graph)
        assert_laplacian_eigenvectors(None, encoding[b, :n], graph, CONTRACT_K)
        np.testing.assert_array_equal(encoding[b, n:], 0.0)


CASE = GraphEncodingCase(
    name="laplacian",
    make=functools.partial(LaplacianPositionEncoding, k=CONTRACT_K, seed=1),
    width=CONTRACT_K,
    graphs=GRAPHS,
    non_default_kwargs={"k": 4, "normalization": None, "seed": 2},
    encoding=contract_encoding,
    assert_encoding=assert_eigenvectors_of_each_graph,
)


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


def test_inference_encoding_is_the_ops_eigenvectors():
    inputs, adjacency, node_mask = padded_inputs(GRAPHS)
    for normalization in ("sym", None):
        layer = LaplacianPositionEncoding(
            4, normalization=normalization, merge_mode=None
        )
        encoding = layer(inputs, adjacency, mask=node_mask)
        assert dtype_of(encoding) == "float32"
        values, vectors = ops.laplacian_eigenvectors(
            adjacency, 4, normalization=normalization, node_mask=node_mask
        )
        np.testing.assert_array_equal(numpy(encoding), numpy(vectors))
        for b, graph in enumerate(GRAPHS):
            n = len(graph)
            assert_laplacian_eigenvectors(
                numpy(values[b]), numpy(encoding[b, :n]), graph, 4, normalization
            )
            np.testing.assert_array_equal(numpy(encoding[b, n:]), 0.0)
        assert_largest_entry_positive(numpy(encoding[0]))
        # Deterministic: again, and with training=False, the same.
        np.testing.assert_array_equal(
            numpy(layer(inputs, adjacency, mask=node_mask, training=False)),
            numpy(encoding),
        )


def test_training_flips_the_sign_of_each_eigenvector_at_random():
    graphs = [erdos_renyi(n, 0.5, seed=n) for n in range(5, 13)] * 2 + [path(2)]
    inputs, adjacency, node_mask = padded_inputs(graphs)
    layer = LaplacianPositionEncoding(4, merge_mode=None, seed=3)
    inference = numpy(layer(inputs, adjacency, mask=node_mask))
    flipped = numpy(layer(inputs, adjacency, mask=node_mask, training=True))
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
    again = numpy(layer(inputs, adjacency, mask=node_mask, training=True))
    assert not np.array_equal(again, flipped)
    # The same seed gives the same flips; inference never flips.
    twin = LaplacianPositionEncoding(4, merge_mode=None, seed=3)
    np.testing.assert_array_equal(
        numpy(twin(inputs, adjacency, mask=node_mask, training=True)), flipped
    )
    np.testing.assert_array_equal(
        numpy(layer(inputs, adjacency, mask=node_mask)), inference
    )


def test_training_flips_before_the_projection():
    inputs, adjacency, node_mask = padded_inputs(GRAPHS)
    layer = LaplacianPositionEncoding(3, merge_mode=None, output_dim=2, seed=5)
    inference = numpy(layer(inputs, adjacency, mask=node_mask))
    kernel, bias = projection_weights(layer)
    vectors = eigenvectors(adjacency, node_mask, 3)
    outputs = numpy(layer(inputs, adjacency, mask=node_mask, training=True))
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
    encoding = numpy(
        LaplacianPositionEncoding(5, merge_mode=None)(inputs, adjacency, mask=node_mask)
    )
    for b, columns in enumerate([0, 1, 3, 5]):
        np.testing.assert_array_equal(encoding[b, :, columns:], 0.0)
        assert np.all(np.abs(encoding[b, :, :columns]).max(axis=0) > 0.1)
    assert np.all(np.isfinite(encoding))


def test_padded_batch_equals_each_graph_alone():
    inputs, adjacency, node_mask = padded_inputs(GRAPHS)
    layer = LaplacianPositionEncoding(4, merge_mode=None)
    encoding = numpy(layer(inputs, adjacency, mask=node_mask))
    for b, graph in enumerate(GRAPHS):
        n = len(graph)
        alone = numpy(layer(inputs[b : b + 1, :n], graph[None]))[0]
        values, _ = ops.laplacian_eigenvectors(graph[None], 4)
        # Both the same eigenspaces; and where an eigenvector is determined,
        # the same vector (eigh of another size rounds differently).
        assert_laplacian_eigenvectors(numpy(values[0]), encoding[b, :n], graph, 4)
        assert_laplacian_eigenvectors(numpy(values[0]), alone, graph, 4)
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
    outputs = numpy(layer(inputs, adjacency))
    np.testing.assert_allclose(outputs[1], outputs[0][permutation], rtol=0, atol=1e-4)


@pytest.mark.parametrize("normalization", ["sym", None])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_encoding_is_the_float64_reference_on_every_backend(normalization, compile):
    # A model saved under one backend predicts the same under another: each
    # backend's eigh (eager or XLA's) gives the eigenvectors of the float64
    # reference, numpy.linalg.eigh's, with the same signs. Where the sign is
    # determined (a simple eigenvalue, one largest entry), the very vector;
    # where the largest entries tie (a path's mirror image, the ring's
    # alternating vector) float32 rounding picks one, and degenerate
    # eigenvalues (the ring's pairs) have no unique basis: by projector.
    graphs = [path(7), cycle(8), weighted(erdos_renyi(8, 0.5, seed=4), seed=4)]
    k = 5
    inputs, adjacency, node_mask = padded_inputs(graphs)
    layer = LaplacianPositionEncoding(k, normalization=normalization, merge_mode=None)
    call = compiled(layer) if compile else layer
    encoding = numpy(call(inputs, adjacency, mask=node_mask))
    determined_counts = []
    for b, graph in enumerate(graphs):
        n = len(graph)
        assert_laplacian_eigenvectors(None, encoding[b, :n], graph, k, normalization)
        assert_largest_entry_positive(encoding[b])
        reference_values, _ = references.laplacian_spectrum(graph, normalization)
        determined = determined_columns(graph, k, normalization)
        for column, expected in determined.items():
            # Davis-Kahan, as assert_laplacian_eigenvectors: float32 rounding
            # over the eigenvalue's gap to the others.
            others = np.delete(reference_values, column + 1)
            gap = np.abs(others - reference_values[column + 1]).min()
            scale = max(1.0, np.abs(reference_values).max())
            np.testing.assert_allclose(
                encoding[b, :n, column],
                expected,
                rtol=0,
                atol=2e-5 + 1e-6 * n * scale / gap,
            )
        determined_counts.append(len(determined))
    # The path's two columns with a largest entry in the middle; none of the
    # ring's; every column of the weighted graph.
    assert determined_counts == [2, 0, k]


@settings(deadline=None, max_examples=15)
@given(st.integers(3, 9), st.floats(0.0, 1.0), st.integers(0, 2**16), st.randoms())
def test_permuting_nodes_permutes_the_eigenspaces(n, p, seed, random):
    graph = erdos_renyi(n, p, seed)
    permutation = np.arange(n)
    random.shuffle(permutation)
    layer = LaplacianPositionEncoding(3, merge_mode=None)
    adjacency = np.stack([graph, permute(graph, permutation)])
    encoding = numpy(layer(np.zeros((2, n, 1), "float32"), adjacency))
    values, _ = ops.laplacian_eigenvectors(adjacency, 3)
    for b, rows in ((0, np.arange(n)), (1, np.argsort(permutation))):
        assert_laplacian_eigenvectors(numpy(values[b]), encoding[b][rows], graph, 3)


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
