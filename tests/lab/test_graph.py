import contextlib
import csv
import io
import itertools

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc_lab import graph
from keras_posenc_lab import training
from keras_posenc_lab.cli import main
from keras_posenc_lab.config import GRAPH_ENCODINGS
from keras_posenc_lab.config import GRAPH_LABELS
from keras_posenc_lab.config import GRAPH_QUICK
from keras_posenc_lab.config import GraphConfig

MAX_HOPS = graph.MAX_HOPS
UNSCORED = graph.UNSCORED


def floyd_warshall(adjacency):
    """All-pairs hop distances of a 0/1 adjacency, in float64; inf if unreachable."""
    adjacency = np.asarray(adjacency, bool)
    count = len(adjacency)
    distances = np.where(adjacency, 1.0, np.inf)
    np.fill_diagonal(distances, 0.0)
    for middle in range(count):
        distances = np.minimum(
            distances, distances[:, middle : middle + 1] + distances[middle : middle + 1, :]
        )
    return distances


def is_connected(adjacency):
    """Every node reaches every other: `(I + A)^(n - 1)` has no zero entry."""
    count = len(adjacency)
    reach = np.eye(count, dtype=bool) | np.asarray(adjacency, bool)
    for _ in range(count):
        reach = (reach.astype(np.int64) @ reach.astype(np.int64)) > 0
    return bool(reach.all())


def adjacency_of(edges, count):
    adjacency = np.zeros((count, count), bool)
    for first, second in edges:
        adjacency[first, second] = adjacency[second, first] = True
    return adjacency


@pytest.mark.parametrize("count", [2, 3, 5, 9, 16, 40])
def test_random_tree_edges_make_a_tree(count):
    rng = np.random.default_rng(count)
    for _ in range(20):
        edges = graph.random_tree_edges(count, rng)
        assert edges.shape == (count - 1, 2)
        assert np.all(edges[:, 0] != edges[:, 1])
        assert len({frozenset(edge) for edge in edges.tolist()}) == count - 1
        # n - 1 distinct edges joining all n nodes: a tree.
        assert is_connected(adjacency_of(edges, count))


def test_random_trees_are_uniform_over_the_labelled_trees():
    # The labelled trees on 4 nodes, listed independently: the sets of 3 of
    # K4's 6 edges that join all 4 nodes. Cayley: 4^2 = 16 of them.
    pairs = list(itertools.combinations(range(4), 2))
    trees = {
        frozenset(edges)
        for edges in itertools.combinations(pairs, 3)
        if is_connected(adjacency_of(edges, 4))
    }
    assert len(trees) == 16
    rng = np.random.default_rng(0)
    draws = 4800
    counts = {tree: 0 for tree in trees}
    for _ in range(draws):
        edges = graph.random_tree_edges(4, rng)
        counts[frozenset(tuple(sorted(edge)) for edge in edges.tolist())] += 1
    # Each has probability 1/16: 300 expected, standard deviation 16.8.
    assert sum(counts.values()) == draws
    for tree, number in counts.items():
        assert 300 - 5 * 16.8 < number < 300 + 5 * 16.8, (sorted(tree), number)


@pytest.mark.parametrize("count", [2, 3, 7, 8, 16, 33, 64])
def test_random_graph_is_connected_and_undirected(count):
    rng = np.random.default_rng(count)
    for _ in range(10):
        adjacency = graph.random_graph(count, rng)
        assert adjacency.dtype == bool and adjacency.shape == (count, count)
        np.testing.assert_array_equal(adjacency, adjacency.T)
        assert not np.any(np.diag(adjacency))
        edges = count - 1 + count // graph.NODES_PER_EXTRA_EDGE
        assert np.sum(np.triu(adjacency)) == edges
        assert is_connected(adjacency)


# Graphs whose distances are checked by hand: (edges, nodes, source,
# distances from the source).
HAND_CHECKED = {
    "path": ([(0, 1), (1, 2), (2, 3), (3, 4)], 5, 0, [0, 1, 2, 3, 4]),
    "path from the middle": ([(0, 1), (1, 2), (2, 3), (3, 4)], 5, 2, [2, 1, 0, 1, 2]),
    "cycle": ([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)], 6, 0, [0, 1, 2, 3, 2, 1]),
    "star": ([(0, 1), (0, 2), (0, 3), (0, 4)], 5, 3, [1, 2, 2, 0, 2]),
    # A square 0-1-2-3 with a roof 2-4-3 and a tail 4-5: a shortcut from
    # 0 to 3 skips the long way round.
    "house": ([(0, 1), (1, 2), (2, 3), (3, 0), (2, 4), (3, 4), (4, 5)], 6, 0, [0, 1, 2, 1, 2, 3]),
    "two components": ([(0, 1), (2, 3)], 4, 1, [1, 0, -1, -1]),
    "lone node": ([], 1, 0, [0]),
}


@pytest.mark.parametrize("name", list(HAND_CHECKED))
def test_hop_distances_on_hand_checked_graphs(name):
    edges, count, source, expected = HAND_CHECKED[name]
    distances = graph.hop_distances(adjacency_of(edges, count), source)
    assert distances.tolist() == expected


def test_hop_distances_match_floyd_warshall():
    rng = np.random.default_rng(3)
    for count in (2, 5, 12, 30):
        for density in (0.05, 0.15, 0.5):
            upper = np.triu(rng.random((count, count)) < density, k=1)
            adjacency = upper | upper.T  # connected or not
            reference = floyd_warshall(adjacency)  # (n, n)
            for source in range(count):
                expected = np.where(np.isinf(reference[source]), -1, reference[source])
                np.testing.assert_array_equal(
                    graph.hop_distances(adjacency, source), expected
                )


@pytest.fixture(scope="module")
def graphs():
    return graph.make_graphs(200, (8, 16), np.random.default_rng(7))


def test_make_graphs_pads_marks_and_labels(graphs):
    inputs, labels = graphs
    assert sorted(inputs) == ["adjacency", "marked", "node_mask"]
    assert inputs["marked"].shape == (200, 16) and inputs["marked"].dtype == np.int32
    assert inputs["adjacency"].shape == (200, 16, 16)
    assert inputs["adjacency"].dtype == np.float32
    assert inputs["node_mask"].shape == (200, 16) and inputs["node_mask"].dtype == bool
    assert labels.shape == (200, 16) and labels.dtype == np.int32
    counts = inputs["node_mask"].sum(axis=1)
    # Every size from 8 to 16 nodes comes up, each about as often.
    assert set(counts.tolist()) == set(range(8, 17))
    for index, count in enumerate(counts):
        mask = inputs["node_mask"][index]
        assert mask[:count].all() and not mask[count:].any()  # real nodes first
        adjacency = inputs["adjacency"][index]
        assert not adjacency[count:].any() and not adjacency[:, count:].any()
        graph = adjacency[:count, :count]
        assert set(np.unique(graph).tolist()) == {0.0, 1.0}
        np.testing.assert_array_equal(graph, graph.T)
        assert not np.diag(graph).any()
        assert is_connected(graph)
        (source,) = np.flatnonzero(inputs["marked"][index])
        assert source < count
        expected = np.minimum(floyd_warshall(graph)[source], MAX_HOPS).astype(int)
        expected[source] = UNSCORED
        np.testing.assert_array_equal(labels[index, :count], expected)
        assert np.all(labels[index, count:] == UNSCORED)


def test_make_graphs_clips_far_nodes_into_the_last_class():
    _, labels = graph.make_graphs(100, (48, 64), np.random.default_rng(1))
    scored = labels[labels != UNSCORED]
    assert scored.min() == 1 and scored.max() == MAX_HOPS
    # Large trees have many nodes past MAX_HOPS hops.
    assert np.mean(scored == MAX_HOPS) > 0.2


def test_make_graphs_is_seeded(graphs):
    inputs, labels = graphs
    again_inputs, again_labels = graph.make_graphs(
        200, (8, 16), np.random.default_rng(7)
    )
    np.testing.assert_array_equal(labels, again_labels)
    for name in inputs:
        np.testing.assert_array_equal(inputs[name], again_inputs[name])
    other_inputs, _ = graph.make_graphs(200, (8, 16), np.random.default_rng(8))
    assert not np.array_equal(other_inputs["adjacency"], inputs["adjacency"])


def test_accuracy_scores_the_labelled_nodes_only():
    labels = np.array([[UNSCORED, 1, 2, UNSCORED], [3, UNSCORED, 1, 1]])
    predicted = np.array([[0, 1, 0, 5], [3, 2, 1, 6]])
    # Scored: 1, 2 | 3, 1, 1; right: 1 | 3, 1: 3 of 5.
    assert graph.accuracy(predicted, labels) == pytest.approx(3 / 5)
    assert graph.most_common_class(labels) == 1


def small_batch(graphs, count=4, indices=None):
    inputs, labels = graphs
    indices = np.arange(count) if indices is None else np.asarray(indices)
    return {name: value[indices] for name, value in inputs.items()}, labels[indices]


def laplacian_is_determined(adjacency, k):
    """Whether a graph's first `k` non-trivial Laplacian eigenvectors are unique.

    In float64 NumPy: each of the first `k + 2` eigenvalues of `I - D^-1/2 A
    D^-1/2` apart from the others, and each eigenvector's largest entry
    larger in magnitude than any other, so that its sign rule picks one
    entry. Otherwise eigenvectors (a repeated eigenvalue's, as trees with two
    leaves on one node have at 1) or their signs are the solver's choice.
    """
    scale = 1.0 / np.sqrt(adjacency.sum(axis=1))  # (n,)
    laplacian = np.eye(len(adjacency)) - scale[:, None] * adjacency * scale[None]
    values, vectors = np.linalg.eigh(laplacian)
    if np.min(np.diff(values[: k + 2])) < 1e-3:
        return False
    for column in range(1, min(k + 1, len(adjacency))):
        magnitudes = np.sort(np.abs(vectors[:, column]))[::-1]
        if magnitudes[0] - magnitudes[1] < 1e-3:
            return False
    return True


EXPECTED_POSITION = {
    "none": None,
    "laplacian": (
        keras_posenc.LaplacianPositionEncoding,
        {"k": graph.LAPLACIAN_K, "merge_mode": "add"},
    ),
    "random_walk": (
        keras_posenc.RandomWalkPositionEncoding,
        {"steps": graph.RANDOM_WALK_STEPS, "merge_mode": "add"},
    ),
    "shortest_path": (
        keras_posenc.ShortestPathBias,
        {"num_heads": graph.NUM_HEADS, "max_hops": MAX_HOPS},
    ),
}
POSITION_CLASSES = tuple(value[0] for value in EXPECTED_POSITION.values() if value)


def test_every_graph_encoding_has_an_expectation_and_a_label():
    assert sorted(EXPECTED_POSITION) == sorted(GRAPH_ENCODINGS)
    assert sorted(GRAPH_LABELS) == sorted(GRAPH_ENCODINGS)


@pytest.mark.parametrize("encoding", GRAPH_ENCODINGS)
def test_graph_transformer_uses_its_encoding_and_ignores_padding(encoding, graphs):
    keras.utils.set_random_seed(0)
    model = graph.build_model(encoding, seed=0)
    attention = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
    ]
    assert len(attention) == graph.NUM_LAYERS
    found = [
        layer
        for layer in list(model.layers) + [block.position for block in attention]
        if isinstance(layer, POSITION_CLASSES)
    ]
    if EXPECTED_POSITION[encoding] is None:
        assert found == []
    else:
        cls, attributes = EXPECTED_POSITION[encoding]
        assert {type(layer) for layer in found} == {cls}
        if encoding == "shortest_path":
            # A table of its own in each attention block.
            assert [block.position for block in attention] == found
            assert len({id(layer) for layer in found}) == graph.NUM_LAYERS
        else:
            assert all(block.position is None for block in attention)
            assert len(found) == 1
        for layer in found:
            for name, value in attributes.items():
                assert getattr(layer, name) == value, (name, getattr(layer, name))
    indices = None
    if encoding == "laplacian":
        # Graphs whose eigenvectors are unique: the others' may come out
        # otherwise with other padding, as with any other solver.
        adjacency, mask = graphs[0]["adjacency"], graphs[0]["node_mask"]
        indices = [
            index
            for index in range(len(mask))
            if laplacian_is_determined(
                adjacency[index][mask[index]][:, mask[index]].astype("float64"),
                graph.LAPLACIAN_K,
            )
        ][:4]
        assert len(indices) == 4
    inputs, _ = small_batch(graphs, indices=indices)
    logits = keras.ops.convert_to_numpy(model(inputs, training=False))
    assert logits.shape == (4, 16, graph.NUM_CLASSES)
    assert np.all(np.isfinite(logits))
    # The same graphs padded to 24 nodes: the real nodes' logits are the same.
    padded = {
        "marked": np.pad(inputs["marked"], ((0, 0), (0, 8))),
        "adjacency": np.pad(inputs["adjacency"], ((0, 0), (0, 8), (0, 8))),
        "node_mask": np.pad(inputs["node_mask"], ((0, 0), (0, 8))),
    }
    padded_logits = keras.ops.convert_to_numpy(model(padded, training=False))
    mask = inputs["node_mask"]
    np.testing.assert_allclose(padded_logits[:, :16][mask], logits[mask], atol=1e-4)


def test_loss_is_the_mean_cross_entropy_of_the_scored_nodes(graphs):
    keras.utils.set_random_seed(1)
    model = graph.build_model("shortest_path")
    inputs, labels = small_batch(graphs, 8)
    logits = keras.ops.convert_to_numpy(model(inputs, training=False)).astype("float64")
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    scored = labels != UNSCORED
    expected = -np.mean(
        np.take_along_axis(log_probabilities, np.maximum(labels, 0)[..., None], -1)[
            ..., 0
        ][scored]
    )
    loss = model.evaluate(inputs, labels, batch_size=8, verbose=0)
    assert loss == pytest.approx(expected, rel=1e-5)


def test_predict_classes_is_the_argmax_over_batches(graphs):
    keras.utils.set_random_seed(2)
    model = graph.build_model("random_walk")
    inputs, labels = graphs
    # More graphs than one evaluation batch, the last one partial.
    count = graph.EVALUATION_BATCH + 9
    many = {
        name: np.concatenate([value] * (-(-count // len(value))))[:count]
        for name, value in inputs.items()
    }
    predicted = graph.predict_classes(model, many)
    assert predicted.shape == (count, 16)
    expected = np.argmax(keras.ops.convert_to_numpy(model(many, training=False)), -1)
    np.testing.assert_array_equal(predicted, expected)


def test_findings_compare_with_none_and_say_which_holds():
    config = GRAPH_QUICK  # sizes 4-6, 8-10, 12-16
    small, middle, large = config.sizes
    means = {
        "none": {small: 0.3, middle: 0.2, large: 0.1},
        "laplacian": {small: 0.8, middle: 0.3, large: 0.1},
        "random_walk": {small: 0.25, middle: 0.2, large: 0.15},
        "shortest_path": {small: 1.0, middle: 0.99, large: 0.7},
    }
    guesses = {small: 0.3, middle: 0.2, large: 0.1}
    lines = graph.findings(means, config, guesses)
    assert (
        "shortest-path bias: 1.000 on 4–6 nodes, 0.700 on 12–16 nodes (-0.300)."
        in lines
    )
    assert (
        "Always the training graphs' most common distance: 0.300 on 4–6 nodes, "
        "0.100 on 12–16 nodes." in lines
    )
    assert (
        "On the training sizes every encoding beats none (0.300): no, not "
        "random-walk probabilities." in lines
    )
    assert lines[-1] == "Holds best on 12–16 nodes: shortest-path bias (0.700)."
    del means["random_walk"]
    assert (
        "On the training sizes every encoding beats none (0.300): yes."
        in graph.findings(means, config)
    )
    assert graph.findings({"laplacian": means["laplacian"]}, config) == [
        "Laplacian eigenvectors: 0.800 on 4–6 nodes, 0.100 on 12–16 nodes (-0.700)."
    ]


def test_config_refuses_other_tasks_encodings():
    with pytest.raises(ValueError, match=r"for the graph task. Received: encodings=\['rope'\]"):
        GraphConfig().replace(encodings=["rope"])
    assert GraphConfig().replace(encodings=["shortest_path", "none", "none"]).encodings == (
        "shortest_path",
        "none",
    )


def markdown_rows(markdown):
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| encoding |"):
            name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[name] = cells
    return rows


@pytest.fixture(scope="module")
def quick_graph_command(tmp_path_factory):
    """`demo --task graph --quick`: its status, output folder and what it printed."""
    out_dir = tmp_path_factory.mktemp("graph")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = main(["demo", "--task", "graph", "--quick", "--out", str(out_dir)])
    return status, out_dir, printed.getvalue()


def test_the_command_runs_the_tiny_graph_task(quick_graph_command):
    status, tmp_path, printed = quick_graph_command
    assert status == 0
    headers = ["4–6 nodes", "8–10 nodes", "12–16 nodes"]
    labels = [GRAPH_LABELS[encoding] for encoding in GRAPH_ENCODINGS]
    with open(tmp_path / "graph_accuracy.csv", newline="") as file:
        header, *rows = list(csv.reader(file))
    assert header == ["encoding"] + headers
    assert [row[0] for row in rows] == labels
    for name, *cells in rows:
        assert all(0.0 <= float(cell) <= 1.0 for cell in cells), name
    markdown = (tmp_path / "graph_accuracy.md").read_text()
    title = (
        "Accuracy of every node's hop distance to the marked node on held-out "
        "graphs, trained on 4–6 nodes"
    )
    assert markdown.startswith(f"{title}. One seed (0)")
    assert "| encoding | " + " | ".join(headers) + " |" in markdown
    table = markdown_rows(markdown)
    assert list(table) == labels
    accuracies = {name: [float(cell) for cell in cells] for name, *cells in rows}
    for name, cells in table.items():
        assert [float(cell) for cell in cells] == pytest.approx(accuracies[name], abs=5e-4)
    assert f"{title}:" in printed
    assert printed.count(f"Trained {GRAPH_QUICK.steps} steps in") == 4
    assert printed.count("predictions identical") == 4
    # Too short to compare the encodings: the table, and no verdict.
    assert training.QUICK_NOTE in printed
    for finding in ("beats none", "Holds best", "most common distance"):
        assert finding not in printed
    # Not a terminal: no progress bars; one task: no task headings.
    assert "\x1b" not in printed and "\r" not in printed
    assert "== The" not in printed
    assert sorted(path.name for path in tmp_path.glob("*.keras")) == sorted(
        f"graph_{encoding}.keras" for encoding in GRAPH_ENCODINGS
    )
    # A saved model loads with safe_mode and takes graphs of any size.
    model = keras.models.load_model(tmp_path / "graph_shortest_path.keras", safe_mode=True)
    inputs, _ = graph.make_graphs(3, (20, 24), np.random.default_rng(0))
    logits = model.predict(inputs, verbose=0)
    assert logits.shape == (3, 24, graph.NUM_CLASSES)
    assert np.all(np.isfinite(logits))


def test_a_judged_run_prints_its_findings_and_a_quick_one_a_note(
    quick_graph_command, tmp_path, capsys
):
    # The quick one: the command's run of `GRAPH_QUICK`.
    assert not GRAPH_QUICK.judged
    _, _, printed = quick_graph_command
    assert training.QUICK_NOTE in printed and "beats none" not in printed
    config = GRAPH_QUICK.replace(encodings=["none", "shortest_path"], steps=1)
    assert graph.run(config.replace(judged=True), tmp_path) == 0
    printed = capsys.readouterr().out
    assert training.QUICK_NOTE not in printed
    assert "On the training sizes every encoding beats none" in printed
    assert "Holds best on 12–16 nodes: " in printed


def test_run_fails_when_a_reloaded_model_differs(tmp_path, capsys, monkeypatch):
    load_model = keras.models.load_model

    def load_perturbed_model(*args, **kwargs):
        model = load_model(*args, **kwargs)
        kernel = model.layers[-1].kernel
        kernel.assign(kernel + 1e-3)
        return model

    monkeypatch.setattr(keras.models, "load_model", load_perturbed_model)
    config = GRAPH_QUICK.replace(encodings=["none"], steps=1)
    assert graph.run(config, tmp_path) == 1
    assert "predicts differently" in capsys.readouterr().err
    assert not (tmp_path / "graph_accuracy.csv").exists()
    assert (tmp_path / "graph_none.keras").exists()
