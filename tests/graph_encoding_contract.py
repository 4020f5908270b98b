"""What the tests of every `GraphEncoding` share: inputs, weights, cases.

`LaplacianPositionEncoding` and `RandomWalkPositionEncoding` keep one
contract (the call, the merge modes, masking, saving, export, tracing and the
adjacency checks of `keras_posenc/layers/_graph_encoding.py`); each layer's
test file describes its layer as a `GraphEncodingCase`, and
tests/test_graph_encoding_contract.py checks the contract on each.
"""

import dataclasses
from typing import Callable

import keras
import numpy as np
import pytest

from tests.backend import RUN_TIME_ERRORS
from tests.backend import numpy
from tests.test_graph_ops import cycle
from tests.test_graph_ops import pad_batch

FEATURES = 5


@dataclasses.dataclass(frozen=True)
class GraphEncodingCase:
    """One `GraphEncoding` subclass, as the shared contract tests see it.

    Attributes:
        name: str. The test id, and the name of the saved `.keras` file.
        make: callable. Builds the layer from `merge_mode`, `output_dim`
            and any argument of its own, which override its fixed ones.
        width: int. The width of the encoding before any projection.
        graphs: list. The layer's batch of graphs of several sizes, as
            `(n, n)` adjacency matrices, for `padded_inputs`.
        non_default_kwargs: dict. The layer's own arguments, each away from
            its default.
        encoding: callable. `(inputs, adjacency, node_mask)` to the
            unprojected encoding, `(batch, nodes, width)` NumPy, that the
            merge modes are checked against.
        assert_encoding: callable. `(encoding, graphs)`: asserts that an
            unprojected encoding tensor of the padded `graphs` is the
            layer's reference, and zero at padded nodes.
    """

    name: str
    make: Callable
    width: int
    graphs: list
    non_default_kwargs: dict
    encoding: Callable
    assert_encoding: Callable


def random_features(shape, seed=0):
    """Standard normal float32 features of `shape`."""
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def padded_inputs(graphs, features=FEATURES, seed=0):
    """Node features, zero at padded nodes, the adjacency and the node mask."""
    adjacency, node_mask = pad_batch(graphs)
    inputs = random_features(node_mask.shape + (features,), seed) * node_mask[..., None]
    return inputs, adjacency, node_mask


def projection_weights(layer):
    """The kernel and bias of the layer's Dense sublayer "projection", float64."""
    (kernel,) = [w for w in layer.weights if w.path.endswith("projection/kernel")]
    (bias,) = [w for w in layer.weights if w.path.endswith("projection/bias")]
    # A variable's `.value`: NumPy warns at JAX's and PyTorch's variables.
    return (
        np.asarray(numpy(kernel.value), "float64"),
        np.asarray(numpy(bias.value), "float64"),
    )


def functional_model(layer):
    """A functional model of node features and an adjacency through `layer`."""
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    return keras.Model([features, adjacency_input], layer(features, adjacency_input))


def bad_adjacencies():
    """Cycles of 4 nodes, each with one kind of entry that is refused."""
    directed = cycle(4)
    directed[0, 1] = 0.0
    negative = cycle(4)
    negative[0, 1] = negative[1, 0] = -1.0
    not_finite = cycle(4)
    not_finite[0, 2] = not_finite[2, 0] = np.nan
    infinite = cycle(4)
    infinite[1, 3] = infinite[3, 1] = np.inf
    return {
        "directed": directed,
        "negative": negative,
        "nan": not_finite,
        "inf": infinite,
    }


# What the message says is wrong, after naming `adjacency`.
COMPLAINTS = {
    "directed": "symmetric",
    "negative": "non-negative",
    "nan": "finite",
    "inf": "finite",
}


def assert_adjacency_refused(layer, adjacency, complaint):
    """`layer` refuses `adjacency (1, nodes, nodes)` eagerly, on any backend.

    The message names `adjacency`, then `complaint`.
    """
    inputs = np.zeros(adjacency.shape[:2] + (FEATURES,), "float32")
    message = f"`adjacency`.*{complaint}"
    with pytest.raises(RUN_TIME_ERRORS, match=message):
        layer(inputs, adjacency)


def assert_adjacency_refused_in_a_graph(layer, adjacency, complaint):
    """`layer` refuses `adjacency (1, nodes, nodes)` in TensorFlow graphs.

    In a graph, at run time; and as a constant, at trace time. The message
    names `adjacency`, then `complaint`. (A JAX or PyTorch trace cannot
    raise, nor tell a constant.)
    """
    import tensorflow as tf

    inputs = np.zeros(adjacency.shape[:2] + (FEATURES,), "float32")
    message = f"`adjacency`.*{complaint}"
    traced = tf.function(
        layer,
        input_signature=[
            tf.TensorSpec((None, None, FEATURES)),
            tf.TensorSpec((None, None, None)),
        ],
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        traced(inputs, adjacency)

    @tf.function
    def with_constant_adjacency(inputs):
        return layer(inputs, tf.constant(adjacency))

    with pytest.raises(ValueError, match=message):
        with_constant_adjacency(inputs)
