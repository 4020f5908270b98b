"""Graphs: adjacencies, Laplacians, random walks, hop counts."""

import keras
import numpy as np

from keras_posenc.ops import _backend
from keras_posenc.ops._checks import (
    check_adjacency_shape,
    check_graph_dtype,
    check_laplacian_normalization,
    check_positive_int,
)
from keras_posenc.ops._renamed import renamed_arguments


def _first_bad_entry(adjacency, symmetric):
    """Why a NumPy adjacency is refused, or None: the first bad entry named."""
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
    are known then (eagerly, or a constant: a `ValueError`), and otherwise
    when a TensorFlow graph runs (an `InvalidArgumentError`). XLA drops
    run-time assertions, and a JAX or PyTorch trace cannot raise (see
    `_backend.checked`): there a graph that fails the check comes back NaN
    throughout, so that what is computed from it shows it (the layers make
    its outputs NaN with `nan_where_nan_graphs`). Rows and columns of the
    nodes that `node_mask` marks as padding are set to zero: those nodes
    have no edges.

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
    # The dtype as given: converting strings, JAX parses them as numbers
    # and PyTorch's Keras refuses them with a message of its own.
    given = getattr(adjacency, "dtype", None)
    if isinstance(given, np.dtype) and given.kind in "OSUV":
        dtype = str(given)
    else:
        adjacency = keras.ops.convert_to_tensor(adjacency)
        dtype = keras.backend.standardize_dtype(adjacency.dtype)
    check_graph_dtype("adjacency", dtype)
    check_adjacency_shape(adjacency.shape, num_nodes)
    adjacency = keras.ops.cast(adjacency, "float32")
    static = _backend.static_value(adjacency)
    if static is not None:
        problem = _first_bad_entry(static, symmetric)
        if problem is not None:
            raise ValueError(f"`adjacency` is not a graph's: {problem}")
    else:
        rows, columns = keras.ops.shape(adjacency)[1:]
        square = rows == columns  # a bool, or a bool tensor where unknown
        problems = {
            "square": keras.ops.broadcast_to(
                keras.ops.logical_not(square), keras.ops.shape(adjacency)[:1]
            ),
            "finite": keras.ops.logical_not(
                keras.ops.all(keras.ops.isfinite(adjacency), axis=(1, 2))
            ),
            "non-negative": keras.ops.any(adjacency < 0, axis=(1, 2)),
        }  # each (batch,)
        requirements = "square, (batch, nodes, nodes), with finite, non-negative entries"
        if symmetric:

            def asymmetric():
                return keras.ops.any(
                    adjacency != keras.ops.swapaxes(adjacency, -1, -2), axis=(1, 2)
                )

            if isinstance(square, bool):  # known, so square: the shape is checked
                problems["symmetric"] = asymmetric()
            else:  # not square: no transpose to compare with (the check fails)
                problems["symmetric"] = keras.ops.cond(
                    square,
                    asymmetric,
                    lambda: keras.ops.zeros(keras.ops.shape(adjacency)[:1], "bool"),
                )
            requirements += ", and symmetric (an undirected graph)"
        failed = keras.ops.stack(
            [keras.ops.convert_to_tensor(problem) for problem in problems.values()],
            axis=-1,
        )  # (batch, problems)
        # A bad graph is NaN throughout, where no check can raise (XLA drops
        # them, a JAX or PyTorch trace has none): what is computed from it
        # shows it (`nan_where_nan_graphs`).
        adjacency = keras.ops.where(
            keras.ops.any(failed, axis=-1)[:, None, None], float("nan"), adjacency
        )
        # One check for all (XLA, which drops them, logs a line for each),
        # its message static (XLA has no strings at run time).
        adjacency = _backend.checked(
            adjacency,
            keras.ops.logical_not(keras.ops.any(failed)),
            f"`adjacency` must be {requirements}. Failed, of "
            f"({', '.join(problems)}), per graph:",
            summary=(failed,),
            summarize=3 * len(problems),
        )
    if node_mask is not None:
        node_mask = keras.ops.cast(node_mask, "float32")  # (batch, nodes)
        adjacency = adjacency * node_mask[:, :, None] * node_mask[:, None]
    # An encoding of the graph, the model's input: nothing to differentiate.
    return keras.ops.stop_gradient(adjacency)  # (batch, nodes, nodes)


def nan_where_nan_graphs(values, adjacency):
    """`values`, NaN for each graph whose adjacency holds a NaN.

    `read_adjacency` returns a graph that fails its check NaN throughout
    where the check cannot raise (compiled code); a computation from it need
    not show that (an eigendecomposition, hop counts), so the layers pass
    their outputs through here. Where the adjacency is known (eager mode)
    `read_adjacency` has raised already, and `values` come back as they are.

    Args:
        values: float tensor of shape `(batch, ...)`.
        adjacency: float tensor of shape `(batch, nodes, nodes)`, as
            `read_adjacency` returns it.

    Returns:
        A tensor of the shape and dtype of `values`.
    """
    if _backend.static_value(adjacency) is not None:
        return values
    nan_graph = keras.ops.any(keras.ops.isnan(adjacency), axis=(1, 2))  # (batch,)
    nan_graph = keras.ops.reshape(
        nan_graph, (-1,) + (1,) * (len(values.shape) - 1)
    )  # (batch, 1, ...)
    return keras.ops.where(nan_graph, float("nan"), values)


def _nodes(adjacency):
    """The number of nodes: an int where known, else a scalar tensor."""
    nodes = adjacency.shape[-1]
    return keras.ops.shape(adjacency)[-1] if nodes is None else nodes


def _diagonal_mask(adjacency):
    """A bool `(nodes, nodes)` tensor, True on the diagonal."""
    return keras.ops.cast(keras.ops.eye(_nodes(adjacency), dtype="int32"), "bool")


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
    >>> keras.ops.convert_to_numpy(laplacian(path, normalization=None))[0]
    array([[ 1., -1.,  0.],
           [-1.,  2., -1.],
           [ 0., -1.,  1.]], dtype=float32)
    """
    check_laplacian_normalization(normalization)
    adjacency = keras.ops.cast(adjacency, "float32")
    diagonal = _diagonal_mask(adjacency)  # (nodes, nodes)
    adjacency = keras.ops.where(diagonal, 0.0, adjacency)  # no self loops
    degree = keras.ops.sum(adjacency, axis=-1)  # (batch, nodes)
    if normalization is None:
        return keras.ops.where(diagonal, degree[:, :, None], 0.0) - adjacency
    scale = keras.ops.divide_no_nan(1.0, keras.ops.sqrt(degree))  # (batch, nodes)
    normalized = adjacency * scale[:, :, None] * scale[:, None]
    return keras.ops.eye(_nodes(adjacency), dtype="float32") - normalized


def laplacian_eigenvectors(adjacency, k, normalization="sym", node_mask=None):
    """The eigenvectors of the `k` smallest non-trivial Laplacian eigenvalues.

    As PyTorch Geometric's `AddLaplacianEigenvectorPE` (Dwivedi et al.):
    the eigenvectors sorted by eigenvalue, the first (the constant one, on
    a connected graph) left out, the next `k` kept. A graph of `n` nodes has
    `n - 1` of them: the columns from `n - 1` on are zero, as are padded
    nodes' rows. Computed by `keras.ops.eigh` in float32, on every device.
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
    >>> values = keras.ops.convert_to_numpy(values)
    >>> vectors = keras.ops.convert_to_numpy(vectors)
    >>> np.round(values, 4).tolist()  # the third column: no such
    [[1.0, 2.0, 0.0]]
    >>> (np.round(vectors[0, :, 0] ** 2, 4) + 0.0).tolist()  # squares
    [0.5, 0.0, 0.5]
    >>> bool(vectors[0, 0, 0] > 0)  # the sign: the largest entry positive
    True
    """
    check_positive_int("k", k)
    adjacency = keras.ops.cast(adjacency, "float32")
    if node_mask is None:
        node_mask = keras.ops.ones(keras.ops.shape(adjacency)[:-1], "bool")
    node_mask = keras.ops.cast(node_mask, "bool")  # (batch, nodes)
    real = keras.ops.cast(node_mask, "float32")
    adjacency = adjacency * real[:, :, None] * real[:, None]
    matrix = laplacian(adjacency, normalization)  # (batch, nodes, nodes)
    # Padded nodes, without edges, are moved past every real eigenvalue (at
    # most 2, or twice the largest degree for D - A): the real eigenvectors,
    # zero on padded nodes, then come first in their order.
    if normalization is None:
        bound = 2.0 * keras.ops.max(
            keras.ops.sum(adjacency, axis=-1), axis=-1, keepdims=True
        )  # (batch, 1)
    else:
        bound = 2.0
    diagonal = _diagonal_mask(matrix)  # (nodes, nodes)
    padded_diagonal = keras.ops.where(
        node_mask, keras.ops.diagonal(matrix, axis1=-2, axis2=-1), bound + 1.0
    )  # (batch, nodes)
    matrix = keras.ops.where(diagonal, padded_diagonal[:, :, None], matrix)
    eigenvalues, eigenvectors = keras.ops.eigh(matrix)  # ascending
    # Columns 1 .. k; a graph of fewer than k + 1 nodes has fewer: k + 1
    # zero columns are appended first, so that the k taken exist at any
    # size, none included.
    eigenvalues = keras.ops.pad(eigenvalues, [[0, 0], [0, k + 1]])[:, 1 : 1 + k]
    eigenvectors = keras.ops.pad(eigenvectors, [[0, 0], [0, 0], [0, k + 1]])[
        :, :, 1 : 1 + k
    ] * real[:, :, None]  # (batch, nodes, k)
    exists = keras.ops.arange(k)[None] < keras.ops.sum(
        keras.ops.cast(node_mask, "int32"), axis=-1, keepdims=True
    ) - 1  # (batch, k)
    # A zero row appended: a graph of no nodes has a largest entry too (0),
    # and elsewhere the first largest is where it was.
    padded = keras.ops.pad(eigenvectors, [[0, 0], [0, 1], [0, 0]])
    largest = keras.ops.take_along_axis(
        padded,
        keras.ops.argmax(keras.ops.abs(padded), axis=1)[:, None],
        axis=1,
    )[:, 0]  # (batch, k): each column's entry of largest magnitude
    sign = keras.ops.where(largest < 0, -1.0, 1.0)  # (batch, k)
    sign = keras.ops.where(exists, sign, 0.0)
    eigenvalues = keras.ops.where(exists, eigenvalues, 0.0)  # (batch, k)
    eigenvectors = eigenvectors * sign[:, None]  # (batch, nodes, k)
    if eigenvectors.shape[-1] is None:
        # A TensorFlow graph of unknown size: the slices' width is k.
        batch, nodes = keras.ops.shape(eigenvectors)[:2]
        eigenvalues = keras.ops.reshape(eigenvalues, (batch, k))
        eigenvectors = keras.ops.reshape(eigenvectors, (batch, nodes, k))
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
    >>> walks = random_walk_probabilities(triangle, steps=3)
    >>> keras.ops.convert_to_numpy(walks)[0, 0].tolist()
    [0.0, 0.5, 0.25]
    """
    check_positive_int("steps", steps)
    adjacency = keras.ops.cast(adjacency, "float32")
    transition = keras.ops.divide_no_nan(
        adjacency, keras.ops.sum(adjacency, axis=-1, keepdims=True)
    )  # (batch, nodes, nodes): P
    walks = transition  # P^s
    diagonals = [keras.ops.diagonal(walks, axis1=-2, axis2=-1)]  # (batch, nodes) each
    for _ in range(steps - 1):
        walks = keras.ops.matmul(walks, transition)
        diagonals.append(keras.ops.diagonal(walks, axis1=-2, axis2=-1))
    return keras.ops.stack(diagonals, axis=-1)  # (batch, nodes, steps)


@renamed_arguments({"max_distance": "max_hops"})
def hop_counts(adjacency, max_hops):
    """Shortest-path hop counts between all nodes, clipped, with unreachable.

    The spatial positions of Graphormer (Ying et al. 2021): the number of
    edges on a shortest path from node `i` to node `j`, an edge where
    `adjacency[b, i, j]` is not zero, clipped to `max_hops`, and
    `max_hops + 1` where no path leads from `i` to `j`. Found by
    boolean matrix products: the nodes within `d` hops are those within `d
    - 1`, and their neighbours (`max_hops - 1` products), and the
    reachable ones by squaring the within-`d` relation until it stops
    growing (about `log2(nodes / max_hops)` more).

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`.
        max_hops: int. The largest hop count told apart.

    Returns:
        An int32 tensor of shape `(batch, nodes, nodes)`, entries in `[0,
        max_hops + 1]`.

    Example:

    >>> path = [[[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]]
    >>> keras.ops.convert_to_numpy(hop_counts(path, max_hops=1))[0]  # 0-1-2, 3
    array([[0, 1, 1, 2],
           [1, 0, 1, 2],
           [1, 1, 0, 2],
           [2, 2, 2, 0]], dtype=int32)
    """
    check_positive_int("max_hops", max_hops)
    adjacency = keras.ops.cast(adjacency, "float32")
    identity = keras.ops.eye(_nodes(adjacency), dtype="float32")
    # One step, or staying: 0/1 entries, so products count paths exactly.
    step = keras.ops.cast(
        keras.ops.logical_or(adjacency != 0, identity > 0), "float32"
    )  # (batch, nodes, nodes)
    within = keras.ops.broadcast_to(
        identity, keras.ops.shape(adjacency)
    )  # within 0 hops
    # hops = the number of d in 0 .. max_hops - 1 with j not within d.
    hops = keras.ops.zeros(keras.ops.shape(adjacency), "int32")
    for _ in range(max_hops):
        hops += keras.ops.cast(within == 0, "int32")
        within = keras.ops.cast(keras.ops.matmul(within, step) > 0, "float32")

    def growing(reachable, previous):
        return keras.ops.any(reachable != previous)

    def square(reachable, previous):
        return (
            keras.ops.cast(keras.ops.matmul(reachable, reachable) > 0, "float32"),
            reachable,
        )

    reachable, _ = keras.ops.while_loop(
        growing,
        square,
        (keras.ops.cast(keras.ops.matmul(within, step) > 0, "float32"), within),
    )  # (batch, nodes, nodes): 1 where a path leads from i to j
    return keras.ops.where(reachable > 0, hops, max_hops + 1)
