import keras

from keras_posenc import ops
from keras_posenc.layers._graph_encoding import GraphEncoding


@keras.saving.register_keras_serializable(package="keras_posenc")
class RandomWalkPositionEncoding(GraphEncoding):
    """Random-walk structural encoding of a graph's nodes (RWSE).

    Dwivedi et al. (2022) give each node the probabilities that a random
    walk started there stands on it again after `1, 2, ..., steps` steps:
    the diagonal of `(D^-1 A)^s`, as PyTorch Geometric's `AddRandomWalkPE`
    computes it (see `keras_posenc.ops.random_walk_probabilities`). Unlike
    Laplacian eigenvectors they have no sign or basis to choose, so
    permuting the nodes permutes them exactly; they tell nodes apart by the
    cycles and the degrees around them (a node on a triangle returns in 3
    steps, one on a path or a tree only in an even number).

    Self loops count as edges, as in PyTorch Geometric, and a node with no
    edge returns with probability 0. Weighted edges weigh the steps. The
    walk follows `adjacency[b, i, j]` from `i` to `j`: with `symmetric=False`
    a directed graph is taken.

    With `merge_mode="add"` a learned projection (a `Dense` sublayer named
    `projection`) maps the `steps` columns to the width of the node features
    and adds them; `"concat"` appends the `steps` columns (projected to
    `output_dim` if given), and `None` returns them alone. Padded nodes
    (`mask` False) get no encoding, and are no part of the graph.

    Args:
        steps: int. The longest walk: the encoding's width (PyTorch
            Geometric's `walk_length`).
        symmetric: bool. Whether the adjacency must be symmetric, an
            undirected graph. Defaults to `True`.
        merge_mode: str or None. `"add"`, `"concat"` or `None`, as above.
            Defaults to `"add"`.
        output_dim: int or None. With `"concat"` or `None`, the width of a
            learned projection of the `steps` columns; `None` for none. Must
            be `None` with `"add"`. Defaults to `None`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor of shape `(batch, nodes, features)`: the nodes'
            features.
        adjacency: tensor of shape `(batch, nodes, nodes)`: the weight of
            the edge from node `i` to node `j` at `[b, i, j]`, 0 for none;
            non-negative.
        mask: optional bool tensor of shape `(batch, nodes)`, `True` at real
            nodes, for a batch of graphs padded to one size.
        training: unused; taken as every layer's.
        inputs_mask: the mask Keras carries on `inputs` (an `Embedding`'s
            with `mask_zero=True`, say), which Keras passes here; used when
            `mask` is not given.

    Returns:
        The node features with the encoding merged: `(batch, nodes,
        features)` for `"add"`, `(batch, nodes, features + width)` for
        `"concat"`, `(batch, nodes, width)` for `None`, `width` being
        `output_dim` or `steps`.

    Example:

    >>> triangle = np.ones((1, 3, 3)) - np.eye(3)
    >>> nodes = np.zeros((1, 3, 4), "float32")
    >>> rwse = RandomWalkPositionEncoding(steps=3, merge_mode=None)
    >>> encoding = keras.ops.convert_to_numpy(rwse(nodes, triangle))
    >>> encoding[0, 0].tolist()  # back in 2 or 3 steps
    [0.0, 0.5, 0.25]
    >>> tuple(RandomWalkPositionEncoding(steps=3)(nodes, triangle).shape)
    (1, 3, 4)

    References:
        - [Dwivedi et al., 2022](https://arxiv.org/abs/2110.07875)
    """

    def __init__(
        self, steps, symmetric=True, merge_mode="add", output_dim=None, **kwargs
    ):
        super().__init__(merge_mode=merge_mode, output_dim=output_dim, **kwargs)
        ops.check_positive_int("steps", steps)
        ops.check_bool("symmetric", symmetric)
        self.steps = steps
        self.symmetric = symmetric

    @property
    def encoding_width(self):
        return self.steps

    def _encode(self, adjacency, node_mask, training):
        return ops.random_walk_probabilities(adjacency, self.steps)

    def get_config(self):
        config = super().get_config()
        config.update({"steps": self.steps, "symmetric": self.symmetric})
        return config
