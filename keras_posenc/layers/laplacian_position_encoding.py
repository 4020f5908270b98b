import keras

from keras_posenc import ops
from keras_posenc.layers._graph_encoding import GraphEncoding


@keras.saving.register_keras_serializable(package="keras_posenc")
class LaplacianPositionEncoding(GraphEncoding):
    """Laplacian eigenvector positions of a graph's nodes (LapPE).

    A graph has no order to count, but its Laplacian has the graph's
    "frequencies": the eigenvectors of its smallest eigenvalues vary slowly
    over the graph, as the low sines of the sinusoidal encoding vary slowly
    along a line (on a cycle they are those sines). Dwivedi et al. (2020,
    2022) give each node its entries in the eigenvectors of the `k` smallest
    non-trivial eigenvalues of `L = I - D^-1/2 A D^-1/2`, as PyTorch
    Geometric's `AddLaplacianEigenvectorPE` does: the eigenvectors sorted by
    eigenvalue, the first (constant on a connected graph) left out, the
    next `k` kept (see `keras_posenc.ops.laplacian_eigenvectors`). Self
    loops are ignored. A graph of `n` nodes has `n - 1` of them: the columns
    from `n - 1` on are zero.

    An eigenvector's sign is arbitrary, so a model must not learn one: with
    `training=True` each graph's each eigenvector is flipped at random (the
    standard augmentation); at inference the sign is fixed, the entry of
    largest magnitude positive. Within an eigenvalue shared by several
    eigenvectors (a cycle's, a disconnected graph's 0) any rotation of them
    is as right; `keras.ops.eigh` picks one.

    The eigenvectors are computed by `keras.ops.eigh` in float32 on every
    device (TPUs have no float64): they are exact to about `1e-7 / gap`,
    `gap` the distance to the nearest other eigenvalue. They are data, not
    weights: no gradient flows to the adjacency.

    With `merge_mode="add"` a learned projection (a `Dense` sublayer named
    `projection`) maps the `k` columns to the width of the node features and
    adds them; `"concat"` appends the `k` columns (projected to `output_dim`
    if given), and `None` returns them alone. Padded nodes (`mask` False)
    get no encoding, and are no part of the graph.

    Args:
        k: int. How many eigenvectors (PyTorch Geometric's `k`).
        normalization: str or None. `"sym"` for `I - D^-1/2 A D^-1/2` (the
            papers', PyTorch Geometric's), `None` for `D - A`. Defaults to
            `"sym"`.
        merge_mode: str or None. `"add"`, `"concat"` or `None`, as above.
            Defaults to `"add"`.
        output_dim: int or None. With `"concat"` or `None`, the width of a
            learned projection of the `k` columns; `None` for none. Must be
            `None` with `"add"`. Defaults to `None`.
        seed: int or None. Seed of the random sign flips. Defaults to
            `None`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor of shape `(batch, nodes, features)`: the nodes'
            features.
        adjacency: tensor of shape `(batch, nodes, nodes)`: the weight of
            the edge between nodes `i` and `j` at `[b, i, j]`, 0 for none;
            symmetric, non-negative.
        mask: optional bool tensor of shape `(batch, nodes)`, `True` at real
            nodes, for a batch of graphs padded to one size.
        training: bool. Whether to flip signs at random.
        inputs_mask: the mask Keras carries on `inputs` (an `Embedding`'s
            with `mask_zero=True`, say), which Keras passes here; used when
            `mask` is not given.

    Returns:
        The node features with the encoding merged: `(batch, nodes,
        features)` for `"add"`, `(batch, nodes, features + width)` for
        `"concat"`, `(batch, nodes, width)` for `None`, `width` being
        `output_dim` or `k`.

    Example:

    >>> cycle = np.roll(np.eye(6), 1, axis=1)
    >>> cycle = (cycle + cycle.T)[np.newaxis]  # 6 nodes in a ring
    >>> nodes = np.zeros((1, 6, 4), "float32")
    >>> lappe = LaplacianPositionEncoding(k=2, merge_mode=None)
    >>> encoding = lappe(nodes, cycle)
    >>> tuple(encoding.shape)
    (1, 6, 2)
    >>> # The ring's first frequency: cos and sin of 2 pi i / 6, rotated.
    >>> encoding = keras.ops.convert_to_numpy(encoding)
    >>> radius = np.sqrt((encoding[0] ** 2).sum(axis=-1))
    >>> bool(np.allclose(radius, np.sqrt(2 / 6), atol=1e-6))
    True
    >>> tuple(LaplacianPositionEncoding(k=2)(nodes, cycle).shape)  # projected
    (1, 6, 4)

    References:
        - [Dwivedi et al., 2020](https://arxiv.org/abs/2003.00982)
        - [Dwivedi et al., 2022](https://arxiv.org/abs/2110.07875)
    """

    def __init__(
        self,
        k,
        normalization="sym",
        merge_mode="add",
        output_dim=None,
        seed=None,
        **kwargs,
    ):
        super().__init__(merge_mode=merge_mode, output_dim=output_dim, **kwargs)
        ops.check_positive_int("k", k)
        ops.check_laplacian_normalization(normalization)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(
                f"`seed` must be None or an integer. Received: seed={seed!r}"
            )
        self.k = k
        self.normalization = normalization
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    @property
    def encoding_width(self):
        return self.k

    def _encode(self, adjacency, node_mask, training):
        _, eigenvectors = ops.laplacian_eigenvectors(
            adjacency, self.k, self.normalization, node_mask
        )  # (batch, nodes, k)
        if not training:
            return eigenvectors
        flips = keras.random.randint(
            (keras.ops.shape(eigenvectors)[0], 1, self.k),
            0,
            2,
            seed=self.seed_generator,
        )  # (batch, 1, k): 0 or 1
        return eigenvectors * keras.ops.cast(1 - 2 * flips, "float32")

    def get_config(self):
        config = super().get_config()
        config.update(
            {"k": self.k, "normalization": self.normalization, "seed": self.seed}
        )
        return config
