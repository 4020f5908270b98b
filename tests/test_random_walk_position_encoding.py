"""RandomWalkPositionEncoding: PyG's return probabilities, merged as the others.

`ops.random_walk_probabilities` is checked against PyTorch Geometric's
`AddRandomWalkPE` in tests/test_graph_ops.py; here the layer's encoding is
checked against `D^-1 A` in NumPy (PyG's on a 0/1 adjacency, the package's
definition on a weighted one), with `symmetric=False` for directed graphs.
That it merges, masks, saves, exports and compiles like the other graph
layer is checked, with `CASE` below, in tests/test_graph_encoding_contract.py.
"""

import functools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import RandomWalkPositionEncoding
from tests import references
from tests.backend import RUN_TIME_ERRORS
from tests.backend import graph_function
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.graph_encoding_contract import COMPLAINTS
from tests.graph_encoding_contract import FEATURES
from tests.graph_encoding_contract import GraphEncodingCase
from tests.graph_encoding_contract import assert_adjacency_refused
from tests.graph_encoding_contract import assert_adjacency_refused_in_a_graph
from tests.graph_encoding_contract import bad_adjacencies
from tests.graph_encoding_contract import padded_inputs
from tests.graph_encoding_contract import random_features
from tests.test_case import TestCase
from tests.test_graph_ops import RANDOM_WALK_ATOL
from tests.test_graph_ops import RANDOM_WALK_RTOL
from tests.test_graph_ops import complete
from tests.test_graph_ops import cycle
from tests.test_graph_ops import disjoint
from tests.test_graph_ops import dtype_of
from tests.test_graph_ops import erdos_renyi
from tests.test_graph_ops import pad_batch
from tests.test_graph_ops import path
from tests.test_graph_ops import permute
from tests.test_graph_ops import star
from tests.test_graph_ops import weighted

STEPS = 6

# 10, 7 (disconnected, an isolated node), 4 and 1 nodes, padded to 10.
GRAPHS = [
    erdos_renyi(10, 0.35, seed=2),
    disjoint(cycle(4), path(2), np.zeros((1, 1), "float32")),
    star(4),
    complete(1),
]


def reference_encoding(adjacency, node_mask, steps=STEPS):
    """Each graph's `D^-1 A` return probabilities on its real nodes, else 0."""
    encoding = np.zeros(node_mask.shape + (steps,), "float64")
    for b in range(len(adjacency)):
        n = int(node_mask[b].sum())
        encoding[b, :n] = references.random_walk_pe(adjacency[b, :n, :n], steps)
    return encoding


def assert_close_to_reference(encoding, expected):
    """A float32 encoding tensor is the float64 `expected`, to the ops' tolerance."""
    assert dtype_of(encoding) == "float32"
    np.testing.assert_allclose(
        numpy(encoding), expected, rtol=RANDOM_WALK_RTOL, atol=RANDOM_WALK_ATOL
    )


def unprojected_encoding(inputs, adjacency, node_mask):
    """The encoding the contract's layer merges: the layer's, merge_mode=None."""
    layer = RandomWalkPositionEncoding(STEPS, merge_mode=None)
    return numpy(layer(inputs, adjacency, mask=node_mask))


def assert_reference_of_each_graph(encoding, graphs):
    """The encoding of the padded `graphs` is `reference_encoding`'s."""
    assert_close_to_reference(encoding, reference_encoding(*pad_batch(graphs)))


CASE = GraphEncodingCase(
    name="random_walk",
    make=functools.partial(RandomWalkPositionEncoding, steps=STEPS),
    width=STEPS,
    graphs=GRAPHS,
    non_default_kwargs={"symmetric": False},
    encoding=unprojected_encoding,
    assert_encoding=assert_reference_of_each_graph,
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


def test_encoding_is_pyg_add_random_walk_pe():
    inputs, adjacency, node_mask = padded_inputs(GRAPHS)
    layer = RandomWalkPositionEncoding(STEPS, merge_mode=None)
    encoding = layer(inputs, adjacency, mask=node_mask)
    assert_close_to_reference(encoding, reference_encoding(adjacency, node_mask))
    np.testing.assert_array_equal(numpy(encoding)[~node_mask], 0.0)
    # Nothing random: training changes nothing.
    np.testing.assert_array_equal(
        numpy(layer(inputs, adjacency, mask=node_mask, training=True)),
        numpy(encoding),
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
        numpy(encoding)[1, :6], [[0, 0, 0, 0, 0, 1]] * 6, atol=1e-7
    )
    with pytest.raises(RUN_TIME_ERRORS, match="`adjacency`.*symmetric"):
        RandomWalkPositionEncoding(STEPS)(inputs, adjacency, mask=node_mask)
    # symmetric=False takes one in a graph too (TensorFlow's, with its
    # run-time checks): around a one-way cycle of 4, back after 4 steps, not
    # 1 to 3.
    one_way_cycle = np.roll(np.eye(4, dtype="float32"), 1, axis=1)[None]
    directed = RandomWalkPositionEncoding(3, symmetric=False, merge_mode=None)
    traced = graph_function(directed, jit_compile=False)
    np.testing.assert_allclose(
        numpy(traced(np.zeros((1, 4, FEATURES), "float32"), one_way_cycle)),
        [[[0, 0, 0]] * 4],
        atol=1e-7,
    )


def test_padded_batch_equals_each_graph_alone():
    inputs, adjacency, node_mask = padded_inputs(GRAPHS)
    layer = RandomWalkPositionEncoding(STEPS, merge_mode="add")
    outputs = numpy(layer(inputs, adjacency, mask=node_mask))
    for b, graph in enumerate(GRAPHS):
        n = len(graph)
        alone = numpy(layer(inputs[b : b + 1, :n], graph[None]))[0]
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
    outputs = numpy(layer(inputs, np.stack([graph, permute(graph, permutation)])))
    # The same sums of products in another order: float32 rounding apart.
    np.testing.assert_allclose(
        outputs[1], outputs[0][permutation], rtol=1e-6, atol=1e-7
    )
    # Probabilities, to float32 rounding (a sum of products may pass 1 by
    # an ulp).
    probabilities = outputs[..., FEATURES:]
    assert np.all((probabilities >= -1e-6) & (probabilities <= 1 + 1e-6))


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


@pytest.mark.parametrize("kind", ["negative", "nan", "inf"])
def test_negative_or_not_finite_adjacency_is_refused_when_not_symmetric(kind):
    # symmetric=True is the contract's layer, in test_graph_encoding_contract.
    layer = RandomWalkPositionEncoding(3, symmetric=False)
    assert_adjacency_refused(layer, bad_adjacencies()[kind][None], COMPLAINTS[kind])


@tensorflow_only
@pytest.mark.parametrize("kind", ["negative", "nan", "inf"])
def test_negative_or_not_finite_adjacency_is_refused_in_a_graph_when_not_symmetric(
    kind,
):
    layer = RandomWalkPositionEncoding(3, symmetric=False)
    assert_adjacency_refused_in_a_graph(
        layer, bad_adjacencies()[kind][None], COMPLAINTS[kind]
    )

