"""The graph ops against PyTorch Geometric's definitions, in float64 NumPy.

`ops.laplacian` is PyG's `get_laplacian`, `ops.laplacian_eigenvectors` its
`AddLaplacianEigenvectorPE` (without the random signs), and
`ops.random_walk_probabilities` its `AddRandomWalkPE` on 0/1 adjacencies
(`D^-1 A` on weighted ones, where PyG ignores the weights of the steps);
`ops.hop_counts` is a breadth-first search. The references are in
`tests/references.py`.

Eigenvectors are only defined up to sign, and within an eigenvalue of
multiplicity m up to a rotation of the m-dimensional eigenspace, so they
are compared by projector: the sum of `v v^T` over a group of eigenvalues
that are equal in float64 (closer than `DEGENERATE`). Where the cut splits a
group (the first eigenvalue dropped, or the k-th kept, inside it), the
returned vectors are checked to lie in that eigenspace instead.

The helpers that build graphs and compare eigenvectors are shared by the
three layers' test files.
"""

import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import ops
from tests import references
from tests.backend import numpy

# Eigenvalues closer than this in float64 are one eigenspace: float32
# eigenvectors of eigenvalues this close are mixed beyond any tolerance.
DEGENERATE = 1e-3
# float32 eigenvalues of a matrix of norm 1 (scaled by the norm otherwise).
EIGENVALUE_ATOL = 1e-5
# float32 products of a few probabilities.
RANDOM_WALK_RTOL = 1e-5
RANDOM_WALK_ATOL = 1e-7


def dtype_of(tensor):
    """A tensor's dtype by Keras' name for it ("float32"), on any backend."""
    return keras.backend.standardize_dtype(tensor.dtype)


# Graphs: float32 `(n, n)` adjacency matrices, 0/1 unless weighted.


def erdos_renyi(n, p, seed=0):
    """G(n, p): each of the n (n - 1) / 2 edges present with probability p."""
    upper = np.triu(np.random.default_rng(seed).random((n, n)) < p, 1)
    return (upper | upper.T).astype("float32")


def cycle(n):
    adjacency = np.zeros((n, n), "float32")
    for i in range(n):
        adjacency[i, (i + 1) % n] = adjacency[(i + 1) % n, i] = 1.0
    return adjacency


def path(n):
    adjacency = np.zeros((n, n), "float32")
    for i in range(n - 1):
        adjacency[i, i + 1] = adjacency[i + 1, i] = 1.0
    return adjacency


def star(n):
    """Node 0 joined to each of the n - 1 others."""
    adjacency = np.zeros((n, n), "float32")
    adjacency[0, 1:] = adjacency[1:, 0] = 1.0
    return adjacency


def complete(n):
    return (1.0 - np.eye(n)).astype("float32")


def disjoint(*graphs):
    """The disjoint union: the graphs' adjacencies on a block diagonal."""
    n = sum(len(graph) for graph in graphs)
    adjacency = np.zeros((n, n), "float32")
    start = 0
    for graph in graphs:
        adjacency[start : start + len(graph), start : start + len(graph)] = graph
        start += len(graph)
    return adjacency


def weighted(adjacency, seed=0):
    """The same edges with symmetric weights drawn from [0.25, 3]."""
    weights = np.random.default_rng(seed).uniform(0.25, 3.0, adjacency.shape)
    weights = np.triu(weights, 1)
    return (adjacency * (weights + weights.T)).astype("float32")


def permute(adjacency, permutation):
    """The graph with node i renamed: new node i is old node permutation[i]."""
    return adjacency[np.ix_(permutation, permutation)]


def pad_batch(graphs):
    """A batch of graphs padded with zero rows and columns to the largest.

    Returns the adjacency `(batch, nodes, nodes)` and the node mask
    `(batch, nodes)` (True: a real node).
    """
    nodes = max(len(graph) for graph in graphs)
    adjacency = np.zeros((len(graphs), nodes, nodes), "float32")
    node_mask = np.zeros((len(graphs), nodes), bool)
    for b, graph in enumerate(graphs):
        adjacency[b, : len(graph), : len(graph)] = graph
        node_mask[b, : len(graph)] = True
    return adjacency, node_mask


# The graphs most tests run on: random ones of several sizes and densities,
# the regular families (whose spectra are highly degenerate), disconnected
# ones and ones with isolated nodes.
FAMILIES = {
    "erdos-renyi-sparse": [erdos_renyi(n, 0.2, seed=n) for n in (6, 11, 17)],
    "erdos-renyi-dense": [erdos_renyi(n, 0.6, seed=n) for n in (5, 9, 16)],
    "cycles": [cycle(n) for n in (3, 6, 9)],
    "paths": [path(n) for n in (2, 5, 10)],
    "stars": [star(n) for n in (3, 6, 8)],
    "complete": [complete(n) for n in (2, 4, 7)],
    "disconnected": [
        disjoint(cycle(4), path(3)),
        disjoint(complete(3), complete(3), star(4)),
        disjoint(erdos_renyi(7, 0.5, seed=2), path(2)),
    ],
    "isolated-nodes": [
        disjoint(cycle(5), np.zeros((1, 1), "float32")),
        disjoint(np.zeros((2, 2), "float32"), path(4), np.zeros((1, 1), "float32")),
        np.zeros((3, 3), "float32"),
    ],
}


def family_batch(family):
    return pad_batch(FAMILIES[family])


# Eigenvectors against the reference.


def eigenspace_groups(eigenvalues):
    """Indices of ascending `eigenvalues`, in runs closer than DEGENERATE."""
    groups = [[0]]
    for index in range(1, len(eigenvalues)):
        if eigenvalues[index] - eigenvalues[index - 1] < DEGENERATE:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def assert_laplacian_eigenvectors(values, vectors, adjacency, k, normalization="sym"):
    """One graph's `values (k,)` and `vectors (n, k)` against PyG's, float64.

    Eigenvalues to EIGENVALUE_ATOL (unless `values` is None); the vectors
    orthonormal, zero past the `n - 1` that exist, and equal to the
    reference's by projector per eigenspace, or inside the eigenspace where
    the cut splits it.
    """
    reference_values, reference_vectors = references.laplacian_spectrum(
        adjacency, normalization
    )
    expected_values, expected_vectors = references.laplacian_eigenvector_pe(
        adjacency, k, normalization
    )
    n = len(reference_values)
    taken = min(k, n - 1)
    vectors = np.asarray(vectors, "float64")
    assert vectors.shape == expected_vectors.shape == (n, k)
    scale = max(1.0, np.abs(reference_values).max())
    if values is not None:
        values = np.asarray(values, "float64")
        np.testing.assert_allclose(
            values, expected_values, rtol=0, atol=EIGENVALUE_ATOL * scale
        )
        np.testing.assert_array_equal(values[taken:], 0.0)
    np.testing.assert_array_equal(vectors[:, taken:], 0.0)
    returned = vectors[:, :taken]  # (n, taken)
    np.testing.assert_allclose(returned.T @ returned, np.eye(taken), atol=1e-5)
    for group in eigenspace_groups(reference_values):
        columns = [index - 1 for index in group if 1 <= index <= taken]
        if not columns:
            continue
        basis = reference_vectors[:, group]  # (n, multiplicity)
        projector = basis @ basis.T  # (n, n)
        outside = np.delete(reference_values, group)
        gap = (
            np.abs(outside[:, None] - reference_values[group][None]).min()
            if len(outside)
            else math.inf
        )
        # Davis-Kahan: float32 rounding of the matrix (about n ulps of its
        # norm) turns an eigenspace by at most that over the gap to the rest.
        tolerance = 2e-5 + 1e-6 * n * scale / gap
        chosen = returned[:, columns]  # (n, columns)
        if len(columns) == len(group):
            np.testing.assert_allclose(chosen @ chosen.T, projector, atol=tolerance)
        else:
            np.testing.assert_allclose(projector @ chosen, chosen, atol=tolerance)


def determined_columns(adjacency, k, normalization="sym"):
    """The columns that the sign convention fixes, with their vectors.

    A column is determined where its eigenvalue is simple and the
    eigenvector's largest entry in magnitude stands clear of the next
    (a tie is broken by float32 rounding). Returns `{column: vector}`, each
    float64 vector signed so that its largest entry is positive.
    """
    reference_values, reference_vectors = references.laplacian_spectrum(
        adjacency, normalization
    )
    simple = [
        group[0] for group in eigenspace_groups(reference_values) if len(group) == 1
    ]
    determined = {}
    for index in simple:
        if not 1 <= index <= k:
            continue
        vector = reference_vectors[:, index]
        magnitudes = np.sort(np.abs(vector))
        if magnitudes[-1] - magnitudes[-2] > 1e-3:
            determined[index - 1] = vector * np.sign(vector[np.argmax(np.abs(vector))])
    return determined


def assert_largest_entry_positive(vectors):
    """Each nonzero column's entry of largest magnitude is positive."""
    for column in np.asarray(vectors).T:
        if column.any():
            assert column.max() >= np.abs(column).max() - 1e-6


def assert_batch_eigenvectors(adjacency, node_mask, k, normalization="sym"):
    """`ops.laplacian_eigenvectors` of a padded batch, graph by graph."""
    values, vectors = ops.laplacian_eigenvectors(
        adjacency, k, normalization=normalization, node_mask=node_mask
    )
    assert dtype_of(values) == dtype_of(vectors) == "float32"
    assert tuple(values.shape) == (len(adjacency), k)
    assert tuple(vectors.shape) == adjacency.shape[:2] + (k,)
    for b in range(len(adjacency)):
        n = int(node_mask[b].sum())
        assert_laplacian_eigenvectors(
            numpy(values[b]),
            numpy(vectors[b, :n]),
            adjacency[b, :n, :n],
            k,
            normalization,
        )
        np.testing.assert_array_equal(numpy(vectors[b, n:]), 0.0)
        assert_largest_entry_positive(numpy(vectors[b]))
    return numpy(values), numpy(vectors)


# ops.laplacian


@pytest.mark.parametrize("normalization", ["sym", None])
@pytest.mark.parametrize("family", FAMILIES)
def test_laplacian_is_pyg_get_laplacian(family, normalization):
    adjacency, _ = family_batch(family)
    laplacian = ops.laplacian(adjacency, normalization=normalization)
    assert dtype_of(laplacian) == "float32"
    expected = np.stack(
        [references.laplacian(graph, normalization) for graph in adjacency]
    )
    np.testing.assert_allclose(numpy(laplacian), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("normalization", ["sym", None])
def test_laplacian_of_weighted_graphs_with_self_loops(normalization):
    graphs = [
        weighted(erdos_renyi(8, 0.5, seed=3), seed=1),
        weighted(disjoint(cycle(5), np.zeros((3, 3), "float32")), seed=2),
    ]
    adjacency = np.stack(graphs)
    # Self loops, which get_laplacian removes.
    looped = adjacency + np.stack([np.diag(np.arange(8) % 3), 2.5 * np.eye(8)])
    laplacian = ops.laplacian(looped.astype("float32"), normalization=normalization)
    expected = np.stack(
        [references.laplacian(graph, normalization) for graph in looped]
    )
    np.testing.assert_allclose(numpy(laplacian), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        numpy(ops.laplacian(adjacency, normalization=normalization)),
        numpy(laplacian),
        rtol=1e-6,
        atol=1e-6,
    )
    if normalization == "sym":
        # The isolated nodes of the second graph: a 1 on the diagonal, as PyG.
        np.testing.assert_array_equal(np.diag(numpy(laplacian[1]))[5:], 1.0)


# ops.laplacian_eigenvectors


@pytest.mark.parametrize("normalization", ["sym", None])
@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("family", FAMILIES)
def test_eigenvectors_are_pyg_laplacian_eigenvector_pe(family, k, normalization):
    adjacency, node_mask = family_batch(family)
    assert_batch_eigenvectors(adjacency, node_mask, k, normalization)


@pytest.mark.parametrize("normalization", ["sym", None])
def test_eigenvectors_of_weighted_graphs(normalization):
    adjacency, node_mask = pad_batch(
        [
            weighted(erdos_renyi(12, 0.4, seed=5), seed=5),
            weighted(cycle(7), seed=6),
            weighted(disjoint(complete(4), path(3)), seed=7),
        ]
    )
    assert_batch_eigenvectors(adjacency, node_mask, 4, normalization)


def test_fewer_nodes_than_k_plus_one_pads_with_zero_columns():
    # 1, 2, 3 and 6 nodes for k = 5: 0, 1, 2 and 5 eigenvectors.
    adjacency, node_mask = pad_batch([complete(1), path(2), cycle(3), star(6)])
    values, vectors = assert_batch_eigenvectors(adjacency, node_mask, 5)
    for b, columns in enumerate([0, 1, 2, 5]):
        assert np.all(np.abs(vectors[b, :, :columns]).max(axis=0) > 0.1)
        np.testing.assert_array_equal(vectors[b, :, columns:], 0.0)
        np.testing.assert_array_equal(values[b, columns:], 0.0)
    # A path of two: eigenvalue 2, (1, -1) / sqrt(2); a triangle: 3/2 twice.
    np.testing.assert_allclose(values[1, 0], 2.0, atol=EIGENVALUE_ATOL)
    np.testing.assert_allclose(
        np.abs(vectors[1, :2, 0]), [math.sqrt(0.5)] * 2, atol=1e-6
    )
    np.testing.assert_allclose(values[2, :2], [1.5, 1.5], atol=EIGENVALUE_ATOL)


def test_disconnected_graph_drops_exactly_one_eigenvector():
    # Three components: 0 three times; one is dropped, two kept, and they
    # span the rest of the indicator vectors' space.
    graph = disjoint(cycle(4), path(3), complete(2))
    adjacency, node_mask = pad_batch([graph])
    for normalization in ("sym", None):
        values, vectors = assert_batch_eigenvectors(
            adjacency, node_mask, 3, normalization
        )
        np.testing.assert_allclose(values[0, :2], 0.0, atol=EIGENVALUE_ATOL)
        assert values[0, 2] > 0.1
        for component in (range(0, 4), range(4, 7), range(7, 9)):
            # Constant on each component (D^1/2-weighted for "sym").
            block = vectors[0, list(component), :2]
            if normalization is None:
                np.testing.assert_allclose(
                    block, block[:1].repeat(len(block), 0), atol=1e-5
                )


def test_isolated_nodes_have_eigenvalue_one_under_sym():
    # PyG's 1 on the diagonal of an isolated node: eigenvalue 1, vector e_i.
    graph = disjoint(path(3), np.zeros((1, 1), "float32"))
    adjacency, node_mask = pad_batch([graph])
    values, vectors = assert_batch_eigenvectors(adjacency, node_mask, 3)
    # Path of 3 under "sym": 0, 1, 2; with the isolated node 0, 1, 1, 2.
    np.testing.assert_allclose(values[0], [1.0, 1.0, 2.0], atol=EIGENVALUE_ATOL)
    np.testing.assert_allclose(np.abs(vectors[0, 3, 2]), 0.0, atol=1e-6)
    # Combinatorial: the isolated node's row is zero, eigenvalue 0 twice.
    values, _ = assert_batch_eigenvectors(adjacency, node_mask, 3, None)
    np.testing.assert_allclose(values[0], [0.0, 1.0, 3.0], atol=EIGENVALUE_ATOL)


def test_padded_batch_equals_each_graph_alone():
    graphs = [
        erdos_renyi(9, 0.4, seed=11),
        cycle(5),
        disjoint(path(3), np.zeros((1, 1), "float32")),
        complete(1),
    ]
    adjacency, node_mask = pad_batch(graphs)
    for normalization in ("sym", None):
        values, vectors = ops.laplacian_eigenvectors(
            adjacency, 4, normalization=normalization, node_mask=node_mask
        )
        for b, graph in enumerate(graphs):
            n = len(graph)
            alone_values, alone_vectors = ops.laplacian_eigenvectors(
                graph[None], 4, normalization=normalization
            )
            np.testing.assert_allclose(
                numpy(values[b]), numpy(alone_values[0]), atol=EIGENVALUE_ATOL
            )
            # Both against the reference: padding changes no eigenspace.
            assert_laplacian_eigenvectors(
                numpy(values[b]), numpy(vectors[b, :n]), graph, 4, normalization
            )
            assert_laplacian_eigenvectors(
                numpy(alone_values[0]),
                numpy(alone_vectors[0]),
                graph,
                4,
                normalization,
            )
            np.testing.assert_array_equal(numpy(vectors[b, n:]), 0.0)


def test_edges_of_padded_nodes_are_ignored():
    # Padded nodes are absent whatever their rows and columns hold.
    graphs = [erdos_renyi(6, 0.5, seed=15), cycle(4)]
    adjacency, node_mask = pad_batch(graphs)
    noisy = adjacency.copy()
    noisy[1, 4:, :] = noisy[1, :, 4:] = 1.0
    for normalization in ("sym", None):
        clean_values, clean_vectors = ops.laplacian_eigenvectors(
            adjacency, 3, normalization=normalization, node_mask=node_mask
        )
        values, vectors = ops.laplacian_eigenvectors(
            noisy, 3, normalization=normalization, node_mask=node_mask
        )
        np.testing.assert_array_equal(numpy(values), numpy(clean_values))
        np.testing.assert_array_equal(numpy(vectors), numpy(clean_vectors))


def test_graph_with_no_real_node_is_all_zeros():
    adjacency, node_mask = pad_batch([cycle(4), np.zeros((4, 4), "float32")])
    node_mask[1] = False
    values, vectors = ops.laplacian_eigenvectors(adjacency, 2, node_mask=node_mask)
    np.testing.assert_array_equal(numpy(values[1]), 0.0)
    np.testing.assert_array_equal(numpy(vectors[1]), 0.0)
    assert np.all(np.isfinite(numpy(vectors)))


def test_sign_is_fixed_by_the_largest_entry():
    # Where an eigenvalue is simple and its vector has one largest entry, the
    # vector is the reference's with that entry positive.
    # (A path's or a cycle's own symmetry ties its entries: weights break it.)
    graphs = [
        erdos_renyi(10, 0.5, seed=4),
        weighted(cycle(7), seed=3),
        weighted(path(6), seed=8),
    ]
    for normalization in ("sym", None):
        adjacency, node_mask = pad_batch(graphs)
        _, vectors = ops.laplacian_eigenvectors(
            adjacency, 6, normalization=normalization, node_mask=node_mask
        )
        for b, graph in enumerate(graphs):
            determined = determined_columns(graph, 6, normalization)
            assert len(determined) >= 2
            for column, expected in determined.items():
                np.testing.assert_allclose(
                    numpy(vectors[b, : len(graph), column]), expected, atol=1e-4
                )


def test_adjacency_of_any_dtype_reads_as_float():
    graph = erdos_renyi(7, 0.5, seed=8)
    expected_values, expected_vectors = ops.laplacian_eigenvectors(graph[None], 3)
    for dtype in ("bool", "int32", "float64"):
        adjacency = graph[None].astype(dtype)
        values, vectors = ops.laplacian_eigenvectors(adjacency, 3)
        np.testing.assert_array_equal(numpy(values), numpy(expected_values))
        np.testing.assert_array_equal(numpy(vectors), numpy(expected_vectors))
        np.testing.assert_array_equal(
            numpy(ops.random_walk_probabilities(adjacency, 3)),
            numpy(ops.random_walk_probabilities(graph[None], 3)),
        )
        np.testing.assert_array_equal(
            numpy(ops.hop_counts(adjacency, 4)), numpy(ops.hop_counts(graph[None], 4))
        )
        np.testing.assert_array_equal(
            numpy(ops.laplacian(adjacency)), numpy(ops.laplacian(graph[None]))
        )


def graphs(min_nodes=2, max_nodes=9):
    """Erdos-Renyi graphs of hypothesis' sizes, densities and seeds."""
    return st.builds(
        erdos_renyi,
        st.integers(min_nodes, max_nodes),
        st.floats(0.0, 1.0),
        st.integers(0, 2**16),
    )


def graph_and_permutation():
    return graphs().flatmap(
        lambda graph: st.tuples(st.just(graph), st.permutations(range(len(graph))))
    )


@settings(deadline=None, max_examples=25)
@given(graph_and_permutation(), st.sampled_from(["sym", None]))
def test_permuting_nodes_permutes_the_eigenvectors(graph_and_order, normalization):
    graph, permutation = graph_and_order
    permutation = np.asarray(permutation)
    permuted = permute(graph, permutation)
    k = 4
    values, vectors = ops.laplacian_eigenvectors(
        np.stack([graph, permuted]), k, normalization=normalization
    )
    np.testing.assert_allclose(
        numpy(values[1]), numpy(values[0]), atol=EIGENVALUE_ATOL * len(graph)
    )
    # The permuted graph's eigenvectors are the permuted rows of the
    # original's eigenspaces: check against the reference of the original,
    # its rows permuted.
    assert_laplacian_eigenvectors(
        numpy(values[1]),
        numpy(vectors[1])[np.argsort(permutation)],
        graph,
        k,
        normalization,
    )
    assert_largest_entry_positive(numpy(vectors[1]))


# ops.random_walk_probabilities


def assert_random_walk(adjacency, steps, reference=references.random_walk_pe):
    """`ops.random_walk_probabilities` of a batch against `reference`, per graph.

    `reference` is `references.random_walk_pe` (`D^-1 A`, the package's
    definition) or `references.pyg_random_walk_pe` (PyG's, the same on a
    0/1 adjacency).
    """
    probabilities = ops.random_walk_probabilities(adjacency, steps)
    assert dtype_of(probabilities) == "float32"
    assert tuple(probabilities.shape) == adjacency.shape[:2] + (steps,)
    expected = np.stack([reference(graph, steps) for graph in adjacency])
    np.testing.assert_allclose(
        numpy(probabilities), expected, rtol=RANDOM_WALK_RTOL, atol=RANDOM_WALK_ATOL
    )
    return numpy(probabilities)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_walk_is_pyg_add_random_walk_pe(family):
    adjacency, _ = family_batch(family)
    assert_random_walk(adjacency, 8, references.pyg_random_walk_pe)
    assert_random_walk(adjacency, 8, references.random_walk_pe)


def test_random_walk_with_self_loops_is_pyg_add_random_walk_pe():
    # Self loops are kept: they are walks of one step that stay.
    graphs = [
        erdos_renyi(10, 0.3, seed=10) + np.diag(np.arange(10) % 2),
        complete(10) + np.eye(10),
        np.eye(10, dtype="float32"),
    ]
    probabilities = assert_random_walk(
        np.stack(graphs).astype("float32"), 6, references.pyg_random_walk_pe
    )
    np.testing.assert_allclose(probabilities[1], 0.1, rtol=1e-6)
    np.testing.assert_array_equal(probabilities[2], 1.0)


def test_weighted_steps_follow_the_weights_unlike_pyg():
    # The package walks by D^-1 A; PyG's transform gives every edge of a node
    # the same value 1 / max(weighted degree, 1). A path of 3 with weights 1
    # and 3: from the middle, a step goes to node 0 with 1/4 and to node 2
    # with 3/4; PyG gives both 1/4, and half of its walk vanishes.
    graph = np.array([[0, 1, 0], [1, 0, 3], [0, 3, 0]], "float32")
    probabilities = assert_random_walk(graph[None], 2)
    np.testing.assert_allclose(probabilities[0, :, 1], [0.25, 1.0, 0.75], rtol=1e-6)
    assert not np.allclose(
        references.pyg_random_walk_pe(graph, 2), references.random_walk_pe(graph, 2)
    )


def test_random_walk_of_weighted_directed_graphs_with_self_loops():
    rng = np.random.default_rng(9)
    directed = (rng.random((10, 10)) < 0.3) * rng.uniform(0.1, 2.0, (10, 10))
    graphs = [
        weighted(erdos_renyi(10, 0.4, seed=9), seed=9),
        weighted(erdos_renyi(10, 0.3, seed=10), seed=10) + np.diag(np.arange(10) % 3),
        directed,
        # Node 9's only edge comes in from node 0: a zero row, so zeros.
        np.pad(path(9), [(0, 1), (0, 1)]) + np.eye(10, k=9),
    ]
    probabilities = assert_random_walk(np.stack(graphs).astype("float32"), 6)
    np.testing.assert_array_equal(probabilities[3, 9], 0.0)


def test_random_walk_small_cases_by_hand():
    # A path of two returns at even steps only; a triangle's return
    # probabilities are 0, 1/2, 1/4, 3/8; an isolated node gets zeros.
    adjacency, _ = pad_batch([path(2), complete(3), np.zeros((1, 1), "float32")])
    probabilities = numpy(ops.random_walk_probabilities(adjacency, 4))
    np.testing.assert_allclose(probabilities[0, :2], [[0, 1, 0, 1]] * 2, atol=1e-7)
    np.testing.assert_allclose(
        probabilities[1], [[0, 0.5, 0.25, 0.375]] * 3, rtol=1e-6, atol=1e-7
    )
    np.testing.assert_array_equal(probabilities[2], 0.0)


def test_random_walk_padded_batch_equals_each_graph_alone():
    graphs = [erdos_renyi(8, 0.4, seed=12), cycle(5), star(3)]
    adjacency, _ = pad_batch(graphs)
    probabilities = numpy(ops.random_walk_probabilities(adjacency, 5))
    for b, graph in enumerate(graphs):
        alone = numpy(ops.random_walk_probabilities(graph[None], 5))[0]
        np.testing.assert_allclose(
            probabilities[b, : len(graph)], alone, rtol=1e-6, atol=1e-7
        )
        np.testing.assert_array_equal(probabilities[b, len(graph) :], 0.0)


@settings(deadline=None, max_examples=25)
@given(graph_and_permutation(), st.integers(1, 6))
def test_random_walk_permutes_with_the_nodes(graph_and_order, steps):
    graph, permutation = graph_and_order
    probabilities = numpy(
        ops.random_walk_probabilities(
            np.stack([graph, permute(graph, np.asarray(permutation))]), steps
        )
    )
    np.testing.assert_allclose(
        probabilities[1], probabilities[0][list(permutation)], rtol=1e-6, atol=1e-7
    )


@settings(deadline=None, max_examples=25)
@given(
    st.integers(1, 8).flatmap(
        lambda n: st.lists(
            st.lists(
                st.one_of(st.just(0.0), st.floats(2.0**-20, 5.0, width=32)),
                min_size=n,
                max_size=n,
            ),
            min_size=n,
            max_size=n,
        )
    ),
    st.integers(1, 5),
)
def test_random_walk_values_are_probabilities(adjacency, steps):
    # Any nonnegative weights, directed and with self loops. (Not subnormal
    # ones: TensorFlow's CPU kernels flush them to zero, no edge.)
    adjacency = np.asarray(adjacency, "float32")[None]
    probabilities = assert_random_walk(adjacency, steps)
    assert np.all(probabilities >= 0.0)
    assert np.all(probabilities <= 1.0 + 1e-6)


# ops.hop_counts


def assert_hop_counts(adjacency, max_hops):
    hops = ops.hop_counts(adjacency, max_hops)
    assert dtype_of(hops) == "int32"
    assert tuple(hops.shape) == adjacency.shape
    expected = np.stack(
        [references.hop_counts(graph, max_hops) for graph in adjacency]
    )
    np.testing.assert_array_equal(numpy(hops), expected)
    return numpy(hops)


@pytest.mark.parametrize("max_hops", [1, 3, 20])
@pytest.mark.parametrize("family", FAMILIES)
def test_hop_counts_are_breadth_first_search(family, max_hops):
    adjacency, _ = family_batch(family)
    assert_hop_counts(adjacency, max_hops)


def test_hop_counts_of_directed_weighted_graphs():
    rng = np.random.default_rng(13)
    directed = (rng.random((12, 12)) < 0.15) * rng.uniform(0.1, 2.0, (12, 12))
    one_way_path = np.eye(12, k=1)
    graphs = np.stack([directed, one_way_path, weighted(cycle(12)) + np.eye(12)])
    hops = assert_hop_counts(graphs.astype("float32"), 6)
    # Along the one-way path: forwards up to 6, unreachable backwards.
    np.testing.assert_array_equal(hops[1, 0, :8], [0, 1, 2, 3, 4, 5, 6, 6])
    np.testing.assert_array_equal(hops[1, 5, :5], 7)


def test_hop_counts_clip_and_mark_the_unreachable():
    hops = numpy(ops.hop_counts(disjoint(path(6), path(2))[None], 3))[0]
    np.testing.assert_array_equal(hops[0], [0, 1, 2, 3, 3, 3, 4, 4])
    np.testing.assert_array_equal(hops[7], [4, 4, 4, 4, 4, 4, 1, 0])


def test_hop_counts_padded_batch_equals_each_graph_alone():
    graphs = [erdos_renyi(9, 0.3, seed=14), path(4), complete(1)]
    adjacency, _ = pad_batch(graphs)
    hops = numpy(ops.hop_counts(adjacency, 5))
    for b, graph in enumerate(graphs):
        n = len(graph)
        np.testing.assert_array_equal(
            hops[b, :n, :n], numpy(ops.hop_counts(graph[None], 5))[0]
        )


@settings(deadline=None, max_examples=25)
@given(graph_and_permutation(), st.integers(1, 6))
def test_hop_counts_permute_with_the_nodes_and_are_symmetric(
    graph_and_order, max_hops
):
    graph, permutation = graph_and_order
    hops = assert_hop_counts(
        np.stack([graph, permute(graph, np.asarray(permutation))]), max_hops
    )
    np.testing.assert_array_equal(hops[1], permute(hops[0], np.asarray(permutation)))
    np.testing.assert_array_equal(hops[0], hops[0].T)
    np.testing.assert_array_equal(np.diag(hops[0]), 0)


@settings(deadline=None, max_examples=25)
@given(
    st.integers(2, 9).flatmap(
        lambda n: st.lists(
            st.lists(st.booleans(), min_size=n, max_size=n), min_size=n, max_size=n
        )
    ),
    st.integers(1, 9),
)
def test_hop_counts_of_any_directed_graph(adjacency, max_hops):
    adjacency = np.asarray(adjacency)[None]
    hops = assert_hop_counts(adjacency.astype("float32"), max_hops)
    # Each edge is one hop.
    off_diagonal = adjacency[0] & ~np.eye(len(adjacency[0]), dtype=bool)
    np.testing.assert_array_equal(hops[0][off_diagonal], 1)


# Export: the layers' test files serve their SavedModels with TensorFlow alone.

# Serves the SavedModel folder argv[1] on the arrays of the .npz argv[2]
# (arr_0, arr_1, ...: the model's inputs in order) and saves the output to
# argv[3], with keras and keras_posenc made unimportable first; prints the
# modules of theirs that got loaded anyway.
SERVE_CHILD = """
import sys

BLOCKED = ("keras", "keras_posenc")
sys.modules.update(dict.fromkeys(BLOCKED))

import numpy as np
import tensorflow as tf

exported = tf.saved_model.load(sys.argv[1])
arrays = np.load(sys.argv[2])
inputs = [tf.constant(arrays[f"arr_{i}"]) for i in range(len(arrays.files))]
np.save(sys.argv[3], exported.serve(inputs).numpy())
print(sorted(
    name for name, module in sys.modules.items()
    if module is not None and name.split(".")[0] in BLOCKED
))
"""


def serve_with_tensorflow_alone(model, inputs, tmp_path):
    """`model` exported, then served on `inputs` in a fresh interpreter."""
    model.export(str(tmp_path / "exported"), verbose=False)
    np.savez(tmp_path / "inputs.npz", *inputs)
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            SERVE_CHILD,
            str(tmp_path / "exported"),
            str(tmp_path / "inputs.npz"),
            str(tmp_path / "served.npy"),
        ],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    return np.load(tmp_path / "served.npy")
