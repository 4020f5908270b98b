"""The shared skeleton of the encodings of a graph's nodes (private).

`LaplacianPositionEncoding` and `RandomWalkPositionEncoding` differ only in
what they compute from the adjacency; argument checks, the node mask, the
optional learned projection and the merge with the node features live here
once.
"""

import keras
import numpy as np

from keras_posenc import ops
from keras_posenc.ops import _checks
from keras_posenc.layers._absolute import check_merge
from keras_posenc.layers._absolute import legacy_merge_mode


class GraphEncoding(keras.layers.Layer):
    """Base of the layers that encode each node's place in its graph.

    Subclasses set `symmetric` (whether the adjacency must be undirected)
    and define `encoding_width` (the encoding's width before any projection)
    and `_encode(adjacency, node_mask, training)`, returning a float32
    `(batch, nodes, encoding_width)` tensor.
    """

    symmetric = True

    def __init__(self, merge_mode="add", output_dim=None, **kwargs):
        # A weighted adjacency is a call argument that Keras would otherwise
        # round to the compute dtype (bfloat16) before the encoding is found.
        super().__init__(autocast=False, **kwargs)
        check_merge(merge_mode, output_dim)
        if merge_mode == "add" and output_dim is not None:
            raise ValueError(
                "`output_dim` must be None when merge_mode='add' (the "
                "encoding is projected to the width of the inputs). "
                f"Received: output_dim={output_dim!r}"
            )
        self.merge_mode = merge_mode
        self.output_dim = output_dim
        self.supports_masking = True
        self.projection = None

    def _projected_width(self, inputs_shape):
        """The width the encoding is projected to, or None for none."""
        if self.merge_mode == "add":
            return inputs_shape[-1]
        return self.output_dim

    def _check_shapes(self, inputs_shape, adjacency_shape):
        inputs_shape = tuple(inputs_shape)
        if len(inputs_shape) != 3:
            raise ValueError(
                f"{type(self).__name__} takes node features of shape (batch, "
                f"nodes, features). Received: inputs of shape {inputs_shape}"
            )
        if self.merge_mode == "add" and inputs_shape[-1] is None:
            raise ValueError(
                f"{type(self).__name__} with merge_mode='add' needs the last "
                "(features) dimension of its inputs to be known. Received: "
                f"inputs of shape {inputs_shape}"
            )
        if adjacency_shape is not None:
            ops.check_adjacency_shape(adjacency_shape, num_nodes=inputs_shape[1])
            batch_sizes = {inputs_shape[0], tuple(adjacency_shape)[0]} - {None}
            if len(batch_sizes) > 1:
                raise ValueError(
                    f"{type(self).__name__} takes one adjacency per graph of "
                    "node features: their batch sizes must agree. Received: "
                    f"inputs of shape {inputs_shape} and adjacency of shape "
                    f"{tuple(adjacency_shape)}"
                )

    def _check_mask(self, mask, inputs_shape):
        """A `ValueError` naming `mask` unless it is `(batch, nodes)`, where known."""
        expected = tuple(inputs_shape[:2])
        _checks.check_mask_shape(
            "mask",
            mask.shape,
            expected,
            f"(batch, nodes), here {expected}, True for the nodes of each graph",
            subject=f"`mask` of {type(self).__name__}",
        )

    def build(self, inputs_shape, adjacency_shape=None):
        self._check_shapes(inputs_shape, adjacency_shape)
        width = self._projected_width(inputs_shape)
        if width is not None:
            # A learned map from the encoding to the width it joins.
            self.projection = keras.layers.Dense(
                width, name="projection", dtype=self.dtype_policy
            )
            self.projection.build((None, None, self.encoding_width))
        self.built = True

    def __call__(self, *args, **kwargs):
        # Strings are refused before Keras converts them: JAX would parse
        # them as numbers, PyTorch's Keras refuse them with its own message.
        for index, name in enumerate(("inputs", "adjacency")):
            given = args[index] if len(args) > index else kwargs.get(name)
            dtype = getattr(given, "dtype", None)
            if isinstance(dtype, np.dtype) and dtype.kind in "OSUV":
                ops.check_graph_dtype(name, str(dtype))
        return super().__call__(*args, **kwargs)

    def call(self, inputs, adjacency, mask=None, training=None, inputs_mask=None):
        ops.check_graph_dtype("inputs", keras.backend.standardize_dtype(inputs.dtype))
        self._check_shapes(inputs.shape, adjacency.shape)
        # A call of two tensors gets the mask Keras carries on `inputs` as
        # `inputs_mask` (as MultiHeadAttention's `query_mask`), on every
        # backend; a call with a NumPy adjacency, as `mask`.
        if mask is None:
            mask = inputs_mask
        if mask is not None:
            self._check_mask(mask, inputs.shape)
        adjacency = ops.read_adjacency(
            adjacency,
            symmetric=self.symmetric,
            num_nodes=inputs.shape[1],
            node_mask=mask,
        )  # (batch, nodes, nodes), padded nodes without edges
        encoding = self._encode(adjacency, mask, training)  # (batch, nodes, width)
        # Compiled code cannot raise on a bad adjacency: its graph shows it.
        encoding = ops.nan_where_nan_graphs(encoding, adjacency)
        encoding = keras.ops.cast(encoding, self.compute_dtype)
        if self.projection is not None:
            encoding = self.projection(encoding)  # (batch, nodes, projected)
        if mask is not None:
            # Padded nodes get no encoding, projected or not.
            encoding = encoding * keras.ops.cast(mask, encoding.dtype)[:, :, None]
        inputs = keras.ops.cast(inputs, self.compute_dtype)
        if self.merge_mode == "add":
            return inputs + encoding
        if self.merge_mode is None:
            return encoding
        return keras.ops.concatenate(
            [inputs, encoding], axis=-1
        )  # (batch, nodes, features + width)

    def compute_output_shape(self, inputs_shape, adjacency_shape=None):
        self._check_shapes(inputs_shape, adjacency_shape)
        inputs_shape = tuple(inputs_shape)
        if self.merge_mode == "add":
            return inputs_shape
        width = self.output_dim or self.encoding_width
        if self.merge_mode is None:
            return inputs_shape[:-1] + (width,)
        features = inputs_shape[-1]
        return inputs_shape[:-1] + (None if features is None else features + width,)

    def compute_output_spec(
        self, inputs, adjacency, mask=None, training=None, inputs_mask=None
    ):
        return keras.KerasTensor(
            self.compute_output_shape(inputs.shape, adjacency.shape),
            dtype=self.compute_dtype,
        )

    def get_config(self):
        config = super().get_config()
        config.update({"merge_mode": self.merge_mode, "output_dim": self.output_dim})
        return config

    @classmethod
    def from_config(cls, config):
        return super().from_config(legacy_merge_mode(config))

