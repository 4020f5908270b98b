"""Train on small graphs, test on larger ones: one small graph transformer per encoding.

A transformer over a graph's nodes sees a set: attention has no notion of
which nodes are joined, and the graph reaches the model only through its
position encoding. The task here cannot be solved without the graph. Each
example is a random connected graph (a uniform random labelled tree, from a
random Prüfer sequence, plus one random extra edge per `NODES_PER_EXTRA_EDGE`
nodes) with one node marked; the model reads the mark alone, the same
feature at every other node, and predicts every other node's hop distance
to the marked node: the number of edges on a shortest path, a class from 1
to `MAX_HOPS`, farther nodes in the last class ("`MAX_HOPS` or more"). The
labels are computed by breadth-first search in NumPy, outside the model.

The same small transformer (pre-norm blocks of
`PositionalMultiHeadAttention` over the nodes, padded nodes masked) is
trained with each encoding on graphs of `config.sizes[0]` nodes and tested
on held-out graphs of those sizes and of larger ones: `"none"` (no position
at all: it can only guess the most common distance), `"laplacian"` (the
Laplacian's eigenvectors added to the node features, Dwivedi et al.),
`"random_walk"` (random-walk return probabilities, RWSE, added likewise)
and `"shortest_path"` (Graphormer's learned bias per head per hop count,
inside every attention block).

Every trained model is saved to `.keras`, reloaded with `safe_mode=True` and
checked to predict bit-identically, on the training sizes and the largest,
before the reloaded model is evaluated.
"""

import collections
import os
import sys
import time

import keras
import numpy as np

import keras_posenc
from keras_posenc_lab import encodings
from keras_posenc_lab import training
from keras_posenc_lab.config import GRAPH_ENCODINGS
from keras_posenc_lab.config import GRAPH_LABELS
from keras_posenc_lab.config import GRAPH_DEFAULT

WIDTH = 64
NUM_HEADS = 4
FEED_FORWARD_DIM = 128
NUM_LAYERS = GRAPH_DEFAULT.num_layers
STEPS_PER_EXECUTION = 10
# Hop distances from this on share the last class, as they share the
# shortest-path bias's last entry.
MAX_HOPS = encodings.GRAPH["shortest_path"].arguments["max_hops"]
NUM_CLASSES = MAX_HOPS + 1
# One extra edge for this many nodes, on top of the tree: a few cycles.
NODES_PER_EXTRA_EDGE = 8
# Eigenvectors of the Laplacian and random-walk steps: each node's encoding
# has this many numbers.
LAPLACIAN_K = encodings.GRAPH["laplacian"].arguments["k"]
RANDOM_WALK_STEPS = encodings.GRAPH["random_walk"].arguments["steps"]
# The label of the nodes that are not scored: the marked node and padding.
UNSCORED = -1
# The held-out graphs are the same for every training seed: a seed changes
# the training graphs and the weights, not the test.
TEST_SEED = 0
# Graphs scored per batch of evaluation.
EVALUATION_BATCH = 256


def random_tree_edges(num_nodes, rng):
    """The edges of a uniform random labelled tree, from a random Prüfer sequence.

    Every labelled tree on `num_nodes` nodes is equally likely (Cayley's
    formula counts `n^(n-2)` of them, one per sequence).

    Args:
        num_nodes: int. Nodes, at least 2.
        rng: `numpy.random.Generator`.

    Returns:
        int array `(num_nodes - 1, 2)`: one edge per row.
    """
    sequence = rng.integers(0, num_nodes, size=num_nodes - 2)  # (n - 2,)
    degree = np.ones(num_nodes, np.int64)
    np.add.at(degree, sequence, 1)
    edges = []
    for node in sequence:
        leaf = int(np.flatnonzero(degree == 1)[0])  # the smallest leaf
        edges.append((leaf, int(node)))
        degree[leaf] -= 1  # 0: out of the tree
        degree[node] -= 1
    edges.append(tuple(int(node) for node in np.flatnonzero(degree == 1)))
    return np.array(edges, np.int64)


def random_graph(num_nodes, rng):
    """A random connected graph: a uniform random tree plus a few extra edges.

    Args:
        num_nodes: int. Nodes, at least 2.
        rng: `numpy.random.Generator`.

    Returns:
        bool array `(num_nodes, num_nodes)`: the symmetric adjacency, no
        self loops, with `num_nodes - 1 + num_nodes // NODES_PER_EXTRA_EDGE`
        edges.
    """
    adjacency = np.zeros((num_nodes, num_nodes), bool)
    tree = random_tree_edges(num_nodes, rng)  # (n - 1, 2)
    adjacency[tree[:, 0], tree[:, 1]] = True
    adjacency[tree[:, 1], tree[:, 0]] = True
    # Distinct pairs not joined yet, each as likely.
    rows, columns = np.nonzero(np.triu(~adjacency, k=1))
    chosen = rng.choice(len(rows), size=num_nodes // NODES_PER_EXTRA_EDGE, replace=False)
    adjacency[rows[chosen], columns[chosen]] = True
    adjacency[columns[chosen], rows[chosen]] = True
    return adjacency


def hop_distances(adjacency, source):
    """Hop distance from `source` to every node, by breadth-first search.

    Args:
        adjacency: bool array `(n, n)`, symmetric.
        source: int. The node the distances are from.

    Returns:
        int array `(n,)`: the number of edges on a shortest path from
        `source`, 0 at `source`, -1 where no path reaches.
    """
    distances = np.full(len(adjacency), -1, np.int64)
    distances[source] = 0
    queue = collections.deque([source])
    while queue:
        node = queue.popleft()
        for neighbour in np.flatnonzero(adjacency[node]):
            if distances[neighbour] < 0:
                distances[neighbour] = distances[node] + 1
                queue.append(neighbour)
    return distances


def make_graphs(count, sizes, rng):
    """Random graphs with a marked node, padded to one size, and their labels.

    Args:
        count: int. How many graphs.
        sizes: tuple `(smallest, largest)`. Each graph's number of nodes is
            drawn uniformly from `smallest .. largest`.
        rng: `numpy.random.Generator`.

    Returns:
        A tuple `(inputs, labels)`. `inputs` is a dict of the model's
        inputs: `"marked"`, int32 `(count, largest)`, 1 at the marked node
        and 0 elsewhere; `"adjacency"`, float32 `(count, largest, largest)`,
        zero rows and columns at padded nodes; `"node_mask"`, bool
        `(count, largest)`, True at real nodes. `labels` is int32 `(count,
        largest)`: each node's hop distance to the marked node, clipped to
        `MAX_HOPS`, and `UNSCORED` at the marked node and at padded nodes.
        The real nodes come first in each graph.
    """
    smallest, largest = sizes
    marked = np.zeros((count, largest), np.int32)
    adjacency = np.zeros((count, largest, largest), np.float32)
    node_mask = np.zeros((count, largest), bool)
    labels = np.full((count, largest), UNSCORED, np.int32)
    for index in range(count):
        num_nodes = int(rng.integers(smallest, largest + 1))
        graph = random_graph(num_nodes, rng)
        source = int(rng.integers(num_nodes))
        distances = hop_distances(graph, source)  # (num_nodes,)
        adjacency[index, :num_nodes, :num_nodes] = graph
        node_mask[index, :num_nodes] = True
        marked[index, source] = 1
        labels[index, :num_nodes] = np.minimum(distances, MAX_HOPS)
        labels[index, source] = UNSCORED
    inputs = {"marked": marked, "adjacency": adjacency, "node_mask": node_mask}
    return inputs, labels


def build_model(encoding, jit_compile=False, seed=None, num_layers=NUM_LAYERS):
    """The graph transformer with one encoding, for graphs of any size.

    Args:
        encoding: str. One of `GRAPH_ENCODINGS`: `"laplacian"` and
            `"random_walk"` add to the node features; `"shortest_path"`
            acts in every attention block; `"none"` adds nothing.
        jit_compile: bool. Whether `fit` runs under XLA on TensorFlow,
            with `STEPS_PER_EXECUTION` steps per call (on JAX it always
            does, on PyTorch never: `training.compiled`). Defaults to
            `False`.
        seed: int or None. Seed of the Laplacian's random sign flips.
            Defaults to `None`.
        num_layers: int. Transformer blocks. Defaults to `NUM_LAYERS`.

    Returns:
        A compiled functional `keras.Model` from the inputs of
        `make_graphs` (`marked` `(batch, nodes)`, `adjacency` `(batch,
        nodes, nodes)`, `node_mask` `(batch, nodes)`) to logits over the
        hop classes `(batch, nodes, NUM_CLASSES)`; its loss leaves out the
        nodes labelled `UNSCORED`.
    """
    marked = keras.Input(shape=(None,), dtype="int32", name="marked")
    adjacency = keras.Input(shape=(None, None), name="adjacency")
    node_mask = keras.Input(shape=(None,), dtype="bool", name="node_mask")
    # The mark is the only feature: every other node starts the same.
    nodes = keras.layers.Embedding(2, WIDTH)(marked)  # (b, nodes, width)
    node_encoding = encodings.build("graph", encoding, role="nodes", seed=seed)
    if node_encoding is not None:
        nodes = node_encoding(nodes, adjacency, mask=node_mask)
    for _ in range(num_layers):
        normed = keras.layers.LayerNormalization()(nodes)
        position = encodings.build(
            "graph", encoding, role="attention", num_heads=NUM_HEADS
        )
        attention = keras_posenc.PositionalMultiHeadAttention(
            NUM_HEADS, WIDTH // NUM_HEADS, position=position
        )
        # Padded nodes neither attend nor are attended to.
        masks = {"query_mask": node_mask, "value_mask": node_mask}
        if position is None:
            attended = attention(normed, normed, **masks)
        else:
            attended = attention(normed, normed, adjacency=adjacency, **masks)
        nodes = nodes + attended
        hidden = keras.layers.Dense(FEED_FORWARD_DIM, activation="gelu")(
            keras.layers.LayerNormalization()(nodes)
        )  # (b, nodes, feed_forward)
        nodes = nodes + keras.layers.Dense(WIDTH)(hidden)
    nodes = keras.layers.LayerNormalization()(nodes)
    logits = keras.layers.Dense(NUM_CLASSES)(nodes)  # (b, nodes, classes)
    model = keras.Model(
        {"marked": marked, "adjacency": adjacency, "node_mask": node_mask},
        logits,
        name=f"graph_{encoding}",
    )
    return training.compiled(
        model,
        jit_compile,
        STEPS_PER_EXECUTION,
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, ignore_class=UNSCORED
        ),
    )


def predict_classes(model, inputs):
    """The most likely hop class of every node, `(graphs, nodes)` int."""
    count = len(inputs["marked"])
    classes = []
    for start in range(0, count, EVALUATION_BATCH):
        batch = {name: value[start : start + EVALUATION_BATCH] for name, value in inputs.items()}
        logits = training.predict(model, batch)  # (batch, nodes, classes)
        classes.append(np.argmax(logits, axis=-1))
    return np.concatenate(classes)


def accuracy(predicted, labels):
    """The fraction of scored nodes (label not `UNSCORED`) predicted right."""
    scored = labels != UNSCORED
    return float(np.mean(predicted[scored] == labels[scored]))


def size_header(sizes):
    """A column's header: `"8–16 nodes"`."""
    smallest, largest = sizes
    return f"{smallest}–{largest} nodes"


def _train(encoding, config, train_data, test_sets, out_dir, label, seed):
    """Train, save, reload and check one model; return the reloaded one."""
    inputs, labels = train_data
    keras.utils.set_random_seed(seed)
    model = build_model(
        encoding, jit_compile=config.jit_compile, seed=seed, num_layers=config.num_layers
    )
    training.fit(
        model,
        inputs,
        labels,
        config.batch_size,
        f"{label} Training with {GRAPH_LABELS[encoding]}",
    )
    suffix = f"_seed{seed}" if config.num_seeds > 1 else ""
    path = os.path.join(out_dir, f"graph_{encoding}{suffix}.keras")
    probes = [
        {name: value[: config.batch_size] for name, value in test_sets[sizes][0].items()}
        for sizes in dict.fromkeys((config.sizes[0], config.sizes[-1]))
    ]  # the training sizes and the largest
    return training.save_and_reload(model, path, probes)


def most_common_class(labels):
    """The hop class most frequent among the scored nodes of `labels`."""
    scored = labels[labels != UNSCORED]
    return int(np.argmax(np.bincount(scored, minlength=NUM_CLASSES)))


def findings(means, config, guess_scores=None):
    """Lines that say what the table shows.

    Args:
        means: dict from encoding (`GRAPH_ENCODINGS`) to `{sizes: accuracy}`,
            the mean over seeds.
        config: `GraphConfig`.
        guess_scores: dict or None. `{sizes: accuracy}` of always predicting
            the training graphs' most common class. Defaults to `None`.

    Returns:
        A list of str.
    """
    small, large = config.sizes[0], config.sizes[-1]
    lines = []
    for key, scores in means.items():
        lines.append(
            f"{GRAPH_LABELS[key]}: {scores[small]:.3f} on {size_header(small)}, "
            f"{scores[large]:.3f} on {size_header(large)} "
            f"({scores[large] - scores[small]:+.3f})."
        )
    if guess_scores is not None:
        lines.append(
            "Always the training graphs' most common distance: "
            f"{guess_scores[small]:.3f} on {size_header(small)}, "
            f"{guess_scores[large]:.3f} on {size_header(large)}."
        )
    if "none" in means and len(means) > 1:
        beaten = [
            GRAPH_LABELS[key]
            for key, scores in means.items()
            if key != "none" and scores[small] <= means["none"][small]
        ]
        lines.append(
            f"On the training sizes every encoding beats none "
            f"({means['none'][small]:.3f}): "
            + ("yes." if not beaten else f"no, not {'; '.join(beaten)}.")
        )
    if len(means) > 1:
        best = max(means, key=lambda key: means[key][large])
        lines.append(
            f"Holds best on {size_header(large)}: {GRAPH_LABELS[best]} "
            f"({means[best][large]:.3f})."
        )
    return lines


def run(config, out_dir):
    """Train every encoding on small graphs, test it on larger ones, write the results.

    Args:
        config: `GraphConfig`. What to train and evaluate.
        out_dir: str or path-like. Where the models (`graph_*.keras`) and
            the table (`graph_accuracy.md`, `graph_accuracy.csv`) go;
            created if needed.

    Returns:
        The exit status: `0`, or `1` if a reloaded model predicts
        differently from the trained one.
    """
    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    test_sets = {
        sizes: make_graphs(
            config.test_graphs, sizes, np.random.default_rng([TEST_SEED, 1, *sizes])
        )
        for sizes in config.sizes
    }
    print(
        f"Data: random connected graphs (a uniform random tree plus one extra "
        f"edge per {NODES_PER_EXTRA_EDGE} nodes), one node marked; the task is "
        f"every other node's hop distance to it, 1 to {MAX_HOPS} or more "
        f"({NUM_CLASSES - 1} classes). Held out: {config.test_graphs} graphs of "
        + ", ".join(size_header(sizes) for sizes in config.sizes)
        + "."
    )
    print(
        f"Model: {config.num_layers} pre-norm transformer "
        f"block{'s' if config.num_layers > 1 else ''} over the nodes, width "
        f"{WIDTH}, {NUM_HEADS} heads, feed-forward {FEED_FORWARD_DIM}; the mark "
        f"is the only node feature. Training: {config.steps} steps of "
        f"{config.batch_size} graphs of {size_header(config.sizes[0])}. "
        + training.seeds_line(config)
    )
    runs, guesses = [], []
    total = len(config.encodings) * config.num_seeds
    number = 0
    for seed in training.seeds(config):
        train_data = make_graphs(
            config.steps * config.batch_size,
            config.sizes[0],
            np.random.default_rng([seed, 0]),
        )  # the same graphs for every encoding of a seed
        guess = most_common_class(train_data[1])
        guesses.append(
            {
                sizes: accuracy(np.full_like(labels, guess), labels)
                for sizes, (_, labels) in test_sets.items()
            }
        )
        scores = {}
        for encoding in config.encodings:
            number += 1
            seed_text = f", seed {seed}" if config.num_seeds > 1 else ""
            try:
                model = _train(
                    encoding,
                    config,
                    train_data,
                    test_sets,
                    out_dir,
                    f"[graph {number}/{total}{seed_text}]",
                    seed,
                )
            except RuntimeError as error:
                print(f"Error: {error}", file=sys.stderr)
                return 1
            scores[encoding] = {}
            for sizes, (inputs, labels) in test_sets.items():
                scores[encoding][sizes] = accuracy(predict_classes(model, inputs), labels)
                print(
                    f"Accuracy on {size_header(sizes)}: {scores[encoding][sizes]:.3f}"
                )
        runs.append(scores)
    results = training.combine(runs)
    labelled = {GRAPH_LABELS[key]: scores for key, scores in results.items()}
    headers = [size_header(sizes) for sizes in config.sizes]
    title = (
        "Accuracy of every node's hop distance to the marked node on held-out "
        f"graphs, trained on {size_header(config.sizes[0])}"
    )
    table = training.format_markdown(labelled, config.sizes, headers)
    markdown_path = os.path.join(out_dir, "graph_accuracy.md")
    with open(markdown_path, "w") as file:
        file.write(f"{title}. {training.seeds_line(config)}\n\n{table}\n")
    csv_path = os.path.join(out_dir, "graph_accuracy.csv")
    training.write_csv(csv_path, labelled, config.sizes, headers)
    means = {
        key: {sizes: training.mean(values) for sizes, values in scores.items()}
        for key, scores in results.items()
    }
    guess_means = {
        sizes: training.mean([guess[sizes] for guess in guesses]) for sizes in config.sizes
    }
    print(f"\n{title}:\n\n{table}\n")
    if config.judged:
        print("\n".join(findings(means, config, guess_means)))
    else:
        print(training.QUICK_NOTE)
    print(
        f"\nWrote {markdown_path} and {csv_path} in "
        f"{time.perf_counter() - started:.0f} s."
    )
    return 0
