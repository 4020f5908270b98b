"""Graphs: adjacencies, Laplacians, random walks, hop counts."""

import math

import tensorflow as tf

from keras_posenc.ops._checks import (
    check_adjacency_shape,
    check_laplacian_normalization,
    check_positive_int,
)


def _first_bad_entry(adjacency, symmetric):
    """Why a NumPy adjacency is refused, or None: the first bad entry named."""
    import numpy as np

    for condition, what in (
        (~np.isfinite(adjacency), "finite"),
        (adjacency < 0, "non-negative"),
    ):
        if condition.any():
            index = tuple(int(i) for i in np.argwhere(condition)[0])
            return f"entries must be {what}; adjacency{list(index)}={adjacency[index]}"
    if symmetric:
        asymmetric = adjacency != np.swapaxes(adjacency, -1, -2)
        if asymmetric.any():
            b, i, j = (int(i) for i in np.argwhere(asymmetric)[0])
            return (
                "it must be symmetric (an undirected graph); "
                f"adjacency[{b}, {i}, {j}]={adjacency[b, i, j]} but "
                f"adjacency[{b}, {j}, {i}]={adjacency[b, j, i]}"
            )
    return None


def read_adjacency(adjacency, symmetric=True, num_nodes=None, node_mask=None):
    """`adjacency` as float32 `(batch, nodes, nodes)`, checked, padding removed.

    The shape is checked where it is known, when the graph is traced; the
    entries (finite, non-negative, and symmetric if `symmetric`) when they
    are known then (a constant: a `ValueError`), and otherwise when the
    graph runs (an `InvalidArgumentError`), except under XLA, which drops
    run-time assertions. Rows and columns of the nodes that `node_mask`
    marks as padding are set to zero: those nodes have no edges.

    Args:
        adjacency: float, integer or bool tensor of shape `(batch, nodes,
            nodes)`.
        symmetric: bool. Whether the graph must be undirected. Defaults to
            `True`.
        num_nodes: int or None. The number of nodes the inputs have, when
            known. Defaults to `None`.
        node_mask: bool tensor of shape `(batch, nodes)` or None: `True` at
            real nodes. Defaults to `None`, every node real.

    Returns:
        A float32 tensor of shape `(batch, nodes, nodes)`.
    """
    adjacency = tf.convert_to_tensor(adjacency)
    check_adjacency_shape(adjacency.shape, num_nodes)
    adjacency = tf.cast(adjacency, "float32")
    static = tf.get_static_value(adjacency)
    if static is not None:
        problem = _first_bad_entry(static, symmetric)
        if problem is not None:
            raise ValueError(f"`adjacency` is not a graph's: {problem}")
    else:
        # One assertion for all (XLA, which drops them, logs a line for
        # each), its message static (XLA has no strings at run time).
        square = tf.equal(tf.shape(adjacency)[1], tf.shape(adjacency)[2])
        problems = {
            "square": tf.logical_not(square),
            "finite": tf.logical_not(tf.reduce_all(tf.math.is_finite(adjacency))),
            "non-negative": tf.reduce_any(adjacency < 0),
        }
        requirements = "square, (batch, nodes, nodes), with finite, non-negative entries"
        if symmetric:
            problems["symmetric"] = tf.cond(
                square,
                lambda: tf.reduce_any(
                    adjacency != tf.linalg.matrix_transpose(adjacency)
                ),
                lambda: tf.constant(False),
            )
            requirements += ", and symmetric (an undirected graph)"
        failed = tf.stack(list(problems.values()))
        checks = [
            tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(failed)),
                [
                    f"`adjacency` must be {requirements}. Failed, of "
                    f"({', '.join(problems)}):",
                    failed,
                ],
                summarize=len(problems),
            )
        ]
        with tf.control_dependencies(checks):
            adjacency = tf.identity(adjacency)
    if node_mask is not None:
        node_mask = tf.cast(node_mask, "float32")  # (batch, nodes)
        adjacency = adjacency * node_mask[:, :, tf.newaxis] * node_mask[:, tf.newaxis]
    # An encoding of the graph, the model's input: nothing to differentiate.
    return tf.stop_gradient(adjacency)  # (batch, nodes, nodes)


def laplacian(adjacency, normalization="sym"):
    """The graph Laplacian of each graph, self loops ignored.

    `"sym"` gives `I - D^-1/2 A D^-1/2` and `None` gives `D - A`, with `D`
    the diagonal of row sums of `A`, the adjacency without its diagonal, as
    PyTorch Geometric's `get_laplacian` builds them: a node without edges
    has `D^-1/2 = 0`, so its row of the normalized Laplacian is that of the
    identity.

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`, symmetric.
        normalization: `"sym"` or None. Defaults to `"sym"`.

    Returns:
        A float32 tensor of shape `(batch, nodes, nodes)`.

    Example:

    >>> path = [[[0, 1, 0], [1, 0, 1], [0, 1, 0]]]  # 0 - 1 - 2
    >>> laplacian(path, normalization=None).numpy()[0]
    array([[ 1., -1.,  0.],
           [-1.,  2., -1.],
           [ 0., -1.,  1.]], dtype=float32)
    """
    check_laplacian_normalization(normalization)
    adjacency = tf.linalg.set_diag(
        tf.cast(adjacency, "float32"),
        tf.zeros(tf.shape(adjacency)[:-1], "float32"),
    )  # (batch, nodes, nodes), no self loops
    degree = tf.reduce_sum(adjacency, axis=-1)  # (batch, nodes)
    if normalization is None:
        return tf.linalg.diag(degree) - adjacency
    scale = tf.math.divide_no_nan(1.0, tf.sqrt(degree))  # (batch, nodes)
    normalized = adjacency * scale[:, :, tf.newaxis] * scale[:, tf.newaxis]
    return tf.eye(tf.shape(adjacency)[-1], dtype="float32") - normalized


def laplacian_eigenvectors(adjacency, k, normalization="sym", node_mask=None):
    """The eigenvectors of the `k` smallest non-trivial Laplacian eigenvalues.

    As PyTorch Geometric's `AddLaplacianEigenvectorPE` (Dwivedi et al.):
    the eigenvectors sorted by eigenvalue, the first (the constant one, on
    a connected graph) left out, the next `k` kept. A graph of `n` nodes has
    `n - 1` of them: the columns from `n - 1` on are zero, as are padded
    nodes' rows. Computed by `tf.linalg.eigh` in float32, on every device.
    An eigenvector's sign is arbitrary; here its entry of largest magnitude
    is made positive (the first of equal ones), so that a graph gets one
    encoding.

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`, symmetric,
            non-negative.
        k: int. How many eigenvectors.
        normalization: `"sym"` or None, as `laplacian` takes it. Defaults to
            `"sym"`.
        node_mask: bool tensor of shape `(batch, nodes)` or None: `True` at
            real nodes. Defaults to `None`, every node real.

    Returns:
        A tuple `(eigenvalues, eigenvectors)` of float32 tensors of shapes
        `(batch, k)` and `(batch, nodes, k)`.

    Example:

    >>> path = [[[0, 1, 0], [1, 0, 1], [0, 1, 0]]]  # 0 - 1 - 2
    >>> values, vectors = laplacian_eigenvectors(path, k=3)
    >>> np.round(values.numpy(), 4).tolist()  # the third column: no such
    [[1.0, 2.0, 0.0]]
    >>> (np.round(vectors.numpy()[0, :, 0] ** 2, 4) + 0.0).tolist()  # squares
    [0.5, 0.0, 0.5]
    >>> bool(vectors[0, 0, 0] > 0)  # the sign: the largest entry positive
    True
    """
    check_positive_int("k", k)
    adjacency = tf.cast(adjacency, "float32")
    nodes = tf.shape(adjacency)[-1]
    if node_mask is None:
        node_mask = tf.ones(tf.shape(adjacency)[:-1], "bool")
    node_mask = tf.cast(node_mask, "bool")  # (batch, nodes)
    real = tf.cast(node_mask, "float32")
    adjacency = adjacency * real[:, :, tf.newaxis] * real[:, tf.newaxis]
    matrix = laplacian(adjacency, normalization)  # (batch, nodes, nodes)
    # Padded nodes, without edges, are moved past every real eigenvalue (at
    # most 2, or twice the largest degree for D - A): the real eigenvectors,
    # zero on padded nodes, then come first in their order.
    if normalization is None:
        bound = 2.0 * tf.reduce_max(
            tf.reduce_sum(adjacency, axis=-1), axis=-1, keepdims=True
        )  # (batch, 1)
    else:
        bound = tf.fill([tf.shape(adjacency)[0], 1], 2.0)
    matrix = tf.linalg.set_diag(
        matrix, tf.where(node_mask, tf.linalg.diag_part(matrix), bound + 1.0)
    )
    eigenvalues, eigenvectors = tf.linalg.eigh(matrix)  # ascending
    # Columns 1 .. k; a graph of fewer than k + 1 nodes has fewer.
    take = tf.clip_by_value(nodes - 1, 0, k)
    eigenvalues = eigenvalues[:, 1 : 1 + take]  # (batch, take)
    eigenvectors = eigenvectors[:, :, 1 : 1 + take] * real[
        :, :, tf.newaxis
    ]  # (batch, nodes, take)
    columns = tf.range(take)  # (take,)
    exists = columns[tf.newaxis] < tf.reduce_sum(
        tf.cast(node_mask, "int32"), axis=-1, keepdims=True
    ) - 1  # (batch, take)
    largest = tf.gather(
        eigenvectors,
        tf.argmax(tf.abs(eigenvectors), axis=1, output_type="int32"),
        axis=1,
        batch_dims=1,
    )  # (batch, take, take): entry [b, c, c] is column c's largest
    sign = tf.where(tf.linalg.diag_part(largest) < 0, -1.0, 1.0)  # (batch, take)
    sign = tf.where(exists, sign, 0.0)
    eigenvalues = tf.where(exists, eigenvalues, 0.0)
    eigenvectors = eigenvectors * sign[:, tf.newaxis]
    padding = [[0, 0], [0, k - take]]
    eigenvalues = tf.pad(eigenvalues, padding)  # (batch, k)
    eigenvectors = tf.pad(eigenvectors, [[0, 0]] + padding)  # (batch, nodes, k)
    eigenvalues.set_shape(adjacency.shape[:1] + [k])
    eigenvectors.set_shape(adjacency.shape[:2] + [k])
    return eigenvalues, eigenvectors


def random_walk_probabilities(adjacency, steps):
    """Each node's probability of standing on itself after 1 .. `steps` steps.

    The random-walk structural encoding (RWSE, Dwivedi et al. 2022), as
    PyTorch Geometric's `AddRandomWalkPE`: the diagonal of `P^s` for `s = 1
    .. steps`, with `P = D^-1 A` the random walk's transition matrix, `D`
    the row sums of `A` (self loops included). A node without edges has a
    zero row of `P`. On unweighted graphs this is PyTorch Geometric's
    value; on weighted ones PyTorch Geometric gives every edge `1 / degree`,
    whatever its weight, where here an edge's weight weighs its step.

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`,
            non-negative; `adjacency[b, i, j]` weighs the step from `i` to
            `j`.
        steps: int. The longest walk.

    Returns:
        A float32 tensor of shape `(batch, nodes, steps)`.

    Example:

    >>> triangle = [[[0, 1, 1], [1, 0, 1], [1, 1, 0]]]
    >>> random_walk_probabilities(triangle, steps=3).numpy()[0, 0].tolist()
    [0.0, 0.5, 0.25]
    """
    check_positive_int("steps", steps)
    adjacency = tf.cast(adjacency, "float32")
    transition = tf.math.divide_no_nan(
        adjacency, tf.reduce_sum(adjacency, axis=-1, keepdims=True)
    )  # (batch, nodes, nodes): P
    walks = transition  # P^s
    diagonals = [tf.linalg.diag_part(walks)]  # (batch, nodes) each
    for _ in range(steps - 1):
        walks = tf.matmul(walks, transition)
        diagonals.append(tf.linalg.diag_part(walks))
    return tf.stack(diagonals, axis=-1)  # (batch, nodes, steps)


def hop_counts(adjacency, max_distance):
    """Shortest-path hop counts between all nodes, clipped, with unreachable.

    The spatial positions of Graphormer (Ying et al. 2021): the number of
    edges on a shortest path from node `i` to node `j`, an edge where
    `adjacency[b, i, j]` is not zero, clipped to `max_distance`, and
    `max_distance + 1` where no path leads from `i` to `j`. Found by
    boolean matrix products: the nodes within `d` hops are those within `d
    - 1`, and their neighbours (`max_distance - 1` products), and the
    reachable ones by squaring the within-`d` relation until it stops
    growing (about `log2(nodes / max_distance)` more).

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`.
        max_distance: int. The largest hop count told apart.

    Returns:
        An int32 tensor of shape `(batch, nodes, nodes)`, entries in `[0,
        max_distance + 1]`.

    Example:

    >>> path = [[[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]]
    >>> hop_counts(path, max_distance=1).numpy()[0]  # 0 - 1 - 2, and 3
    array([[0, 1, 1, 2],
           [1, 0, 1, 2],
           [1, 1, 0, 2],
           [2, 2, 2, 0]], dtype=int32)
    """
    check_positive_int("max_distance", max_distance)
    adjacency = tf.cast(adjacency, "float32")
    identity = tf.eye(tf.shape(adjacency)[-1], dtype="float32")
    # One step, or staying: 0/1 entries, so products count paths exactly.
    step = tf.cast(tf.logical_or(adjacency != 0, identity > 0), "float32")
    within = tf.broadcast_to(identity, tf.shape(adjacency))  # within 0 hops
    # hops = the number of d in 0 .. max_distance - 1 with j not within d.
    hops = tf.zeros(tf.shape(adjacency), "int32")
    for _ in range(max_distance):
        hops += tf.cast(within == 0, "int32")
        within = tf.cast(tf.matmul(within, step) > 0, "float32")

    def growing(reachable, previous):
        return tf.reduce_any(reachable != previous)

    def square(reachable, previous):
        return tf.cast(tf.matmul(reachable, reachable) > 0, "float32"), reachable

    reachable, _ = tf.while_loop(
        growing, square, (tf.cast(tf.matmul(within, step) > 0, "float32"), within)
    )  # (batch, nodes, nodes): 1 where a path leads from i to j
    return tf.where(reachable > 0, hops, max_distance + 1)
