"""The contract every GraphEncoding keeps, checked on each graph layer.

`LaplacianPositionEncoding` and `RandomWalkPositionEncoding` share the call
`layer(inputs, adjacency, mask=None, training=None)`, the merge modes with
their learned projection, the node mask, saving, export, tracing and the
adjacency checks; what each computes is checked in its own test file.
"""

import keras
import ml_dtypes
import numpy as np
import pytest

from tests import test_laplacian_position_encoding
from tests import test_random_walk_position_encoding
from tests.graph_encoding_contract import COMPLAINTS
from tests.graph_encoding_contract import FEATURES
from keras_posenc import ops
from tests.backend import compiled
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.graph_encoding_contract import assert_adjacency_refused
from tests.graph_encoding_contract import assert_adjacency_refused_in_a_graph
from tests.graph_encoding_contract import bad_adjacencies
from tests.graph_encoding_contract import functional_model
from tests.graph_encoding_contract import padded_inputs
from tests.graph_encoding_contract import projection_weights
from tests.test_graph_ops import cycle
from tests.test_graph_ops import dtype_of
from tests.test_graph_ops import erdos_renyi
from tests.test_graph_ops import path
from tests.test_graph_ops import serve_with_tensorflow_alone
from tests.test_graph_ops import star

CASES = [test_laplacian_position_encoding.CASE, test_random_walk_position_encoding.CASE]

each_layer = pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])

# Merge modes by id: the layer's arguments and the output's width, given
# the encoding's width.
MERGES = {
    "add": ({"merge_mode": "add"}, lambda width: FEATURES),
    "concat": ({"merge_mode": "concat"}, lambda width: FEATURES + width),
    "concat-projected": (
        {"merge_mode": "concat", "output_dim": 4},
        lambda width: FEATURES + 4,
    ),
    "alone": ({"merge_mode": None}, lambda width: width),
    "alone-projected": ({"merge_mode": None, "output_dim": 2}, lambda width: 2),
}


@pytest.mark.parametrize("merge", MERGES)
@each_layer
def test_symbolic_call_build_and_one_fit_step(case, merge):
    kwargs, output_width = MERGES[merge]
    width = output_width(case.width)
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    layer = case.make(**kwargs)
    encoded = layer(features, adjacency_input)
    assert tuple(encoded.shape) == (None, None, width)
    assert encoded.dtype == "float32"
    assert layer.built
    assert layer.compute_output_shape((2, 9, FEATURES), (2, 9, 9)) == (2, 9, width)
    projected = kwargs.get("output_dim") is not None or kwargs["merge_mode"] == "add"
    assert len(layer.trainable_weights) == (2 if projected else 0)
    # A head on top, so that a layer without weights has a model to fit.
    model = keras.Model([features, adjacency_input], keras.layers.Dense(2)(encoded))
    inputs, adjacency, _ = padded_inputs(case.graphs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [numpy(weight.value).copy() for weight in model.trainable_weights]
    model.fit(
        [inputs, adjacency],
        np.ones(inputs.shape[:2] + (2,), "float32"),
        batch_size=4,
        epochs=1,
        verbose=0,
    )
    for weight, start in zip(model.trainable_weights, before):
        assert not np.array_equal(numpy(weight.value), start)


@each_layer
def test_merge_modes(case):
    inputs, adjacency, node_mask = padded_inputs(case.graphs)
    encoding = case.encoding(inputs, adjacency, node_mask)  # (batch, nodes, width)
    real = node_mask[..., None]

    added = case.make(merge_mode="add")
    outputs = numpy(added(inputs, adjacency, mask=node_mask))
    kernel, bias = projection_weights(added)
    assert kernel.shape == (case.width, FEATURES)
    expected = inputs + (encoding @ kernel + bias) * real
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-5)
    # Padded nodes: the projection's bias is not added either.
    np.testing.assert_array_equal(outputs[~node_mask], inputs[~node_mask])

    concatenated = numpy(
        case.make(merge_mode="concat")(inputs, adjacency, mask=node_mask)
    )
    np.testing.assert_array_equal(concatenated, np.concatenate([inputs, encoding], -1))

    projected = case.make(merge_mode="concat", output_dim=4)
    outputs = numpy(projected(inputs, adjacency, mask=node_mask))
    kernel, bias = projection_weights(projected)
    assert kernel.shape == (case.width, 4)
    np.testing.assert_array_equal(outputs[..., :FEATURES], inputs)
    np.testing.assert_allclose(
        outputs[..., FEATURES:], (encoding @ kernel + bias) * real, rtol=0, atol=1e-5
    )
    np.testing.assert_array_equal(outputs[~node_mask][:, FEATURES:], 0.0)

    alone = case.make(merge_mode=None, output_dim=2)
    outputs = numpy(alone(inputs, adjacency, mask=node_mask))
    kernel, bias = projection_weights(alone)
    np.testing.assert_allclose(
        outputs, (encoding @ kernel + bias) * real, rtol=0, atol=1e-5
    )


@each_layer
def test_keras_mask_of_the_features_is_the_node_mask(case):
    inputs, adjacency, node_mask = padded_inputs(case.graphs)
    for merge in ({"merge_mode": "add"}, {"merge_mode": "concat", "output_dim": 3}):
        features = keras.Input((None, FEATURES))
        adjacency_input = keras.Input((None, None))
        masked = keras.layers.Masking(0.0)(features)
        layer = case.make(**merge)
        model = keras.Model([features, adjacency_input], layer(masked, adjacency_input))
        np.testing.assert_array_equal(
            numpy(model([inputs, adjacency])),
            numpy(layer(inputs, adjacency, mask=node_mask)),
        )
        # The mask passes on, as through the absolute layers.
        assert layer.supports_masking


@each_layer
def test_keras_file_round_trip_is_bit_identical(case, tmp_path):
    keras.utils.set_random_seed(0)
    saved = case.make(merge_mode="add", **case.non_default_kwargs)
    model = functional_model(saved)
    inputs, adjacency, _ = padded_inputs(case.graphs)
    # Both called as they are: `predict` would trace each model anew.
    expected = numpy(model([inputs, adjacency]))
    model.save(tmp_path / f"{case.name}.keras")
    loaded = keras.models.load_model(tmp_path / f"{case.name}.keras", safe_mode=True)
    (layer,) = [layer for layer in loaded.layers if isinstance(layer, type(saved))]
    assert layer.get_config() == saved.get_config()
    np.testing.assert_array_equal(numpy(loaded([inputs, adjacency])), expected)


@tensorflow_only
@each_layer
def test_export_serves_with_tensorflow_alone(case, tmp_path):
    keras.utils.set_random_seed(0)
    features = keras.Input((None, FEATURES))
    adjacency_input = keras.Input((None, None))
    # One export, one interpreter: added, and concatenated and projected.
    added = case.make(merge_mode="add")(features, adjacency_input)
    projected = case.make(merge_mode="concat", output_dim=2)(features, adjacency_input)
    model = keras.Model(
        [features, adjacency_input], keras.layers.Concatenate()([added, projected])
    )
    inputs, adjacency, _ = padded_inputs(case.graphs)
    served = serve_with_tensorflow_alone(model, [inputs, adjacency], tmp_path)
    np.testing.assert_allclose(
        served, model.predict([inputs, adjacency], verbose=0), rtol=0, atol=1e-6
    )


@each_layer
def test_xla_at_several_graph_sizes(case):
    layer = case.make(merge_mode=None)
    compiled_layer = compiled(layer)
    for graphs in (
        [cycle(5), path(4)],
        [erdos_renyi(9, 0.5, seed=3), star(7)],
        [erdos_renyi(11, 0.4, seed=6), star(7)],
    ):
        inputs, adjacency, node_mask = padded_inputs(graphs)
        case.assert_encoding(compiled_layer(inputs, adjacency, mask=node_mask), graphs)


@each_layer
def test_mixed_bfloat16_computes_in_float32_and_casts(case):
    inputs, adjacency, node_mask = padded_inputs(case.graphs)
    in_float32 = case.make(merge_mode="concat")
    expected = numpy(in_float32(inputs, adjacency, mask=node_mask))
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = case.make(merge_mode="concat")
    outputs = layer(inputs, adjacency, mask=node_mask)
    assert dtype_of(outputs) == "bfloat16"
    np.testing.assert_array_equal(
        numpy(outputs).astype("float32"),
        expected.astype(ml_dtypes.bfloat16).astype("float32"),
    )


@pytest.mark.parametrize(
    "inputs_shape, adjacency_shape",
    [
        ((2, 5, FEATURES), (2, 5)),
        ((2, 5, FEATURES), (2, 5, 5, 1)),
        ((2, 5, FEATURES), (2, 5, 4)),
        ((2, 5, FEATURES), (2, 6, 6)),
    ],
    ids=["rank-2", "rank-4", "not-square", "other-node-count"],
)
@each_layer
def test_bad_adjacency_shapes_say_what_was_expected(
    case, inputs_shape, adjacency_shape
):
    for kwargs in ({}, case.non_default_kwargs):
        layer = case.make(**kwargs)
        with pytest.raises(ValueError, match="adjacency"):
            layer(
                np.zeros(inputs_shape, "float32"), np.zeros(adjacency_shape, "float32")
            )
        with pytest.raises(ValueError, match="adjacency"):
            case.make(**kwargs)(
                keras.Input(inputs_shape[1:]), keras.Input(adjacency_shape[1:])
            )


@pytest.mark.parametrize("kind", ["negative", "nan", "inf"])
@each_layer
def test_negative_or_not_finite_adjacency_is_refused(case, kind):
    assert_adjacency_refused(
        case.make(), bad_adjacencies()[kind][None], COMPLAINTS[kind]
    )


@tensorflow_only
@pytest.mark.parametrize("kind", ["negative", "nan", "inf"])
@each_layer
def test_negative_or_not_finite_adjacency_is_refused_in_a_graph(case, kind):
    assert_adjacency_refused_in_a_graph(
        case.make(), bad_adjacencies()[kind][None], COMPLAINTS[kind]
    )


@pytest.mark.parametrize("kind", ["directed", "negative", "nan", "inf"])
@each_layer
def test_compiled_code_makes_a_bad_graph_nan(case, kind):
    # XLA drops the check, a JAX trace cannot raise: the bad graph's rows
    # are NaN, the good graph's as eager mode gives them.
    layer = case.make(merge_mode=None)
    # A path's eigenvalues are distinct: one set of eigenvectors up to
    # sign (its end entries tie for the largest), eager or not.
    inputs, adjacency, node_mask = padded_inputs([path(4), cycle(4)])
    expected = numpy(layer(inputs, adjacency, mask=node_mask))
    adjacency[1] = bad_adjacencies()[kind]
    if keras.backend.backend() == "torch":  # `compiled` runs it eagerly
        with pytest.raises(ValueError, match="`adjacency`"):
            compiled(layer)(inputs, adjacency, mask=node_mask)
        return
    outputs = numpy(compiled(layer)(inputs, adjacency, mask=node_mask))
    assert np.isnan(outputs[1]).all()
    np.testing.assert_allclose(
        np.abs(outputs[0]), np.abs(expected[0]), rtol=0, atol=1e-6
    )


@each_layer
def test_adjacency_of_another_batch_is_refused_naming_both_shapes(case):
    inputs = np.zeros((1, 4, FEATURES), "float32")
    adjacency = np.stack([cycle(4)] * 2)
    message = (
        rf"batch sizes must agree\. Received: inputs of shape \(1, 4, {FEATURES}\) "
        r"and adjacency of shape \(2, 4, 4\)"
    )
    with pytest.raises(ValueError, match=message):
        case.make()(inputs, adjacency)
    with pytest.raises(ValueError, match="batch sizes must agree"):
        case.make()(keras.Input((4, FEATURES), batch_size=1), keras.Input((4, 4), batch_size=2))


@each_layer
def test_strings_are_refused_naming_the_argument(case):
    inputs = np.zeros((1, 4, FEATURES), "float32")
    adjacency = cycle(4)[None]
    with pytest.raises(ValueError, match=r"`adjacency` must be edge weights.*dtype <U1"):
        case.make()(inputs, np.full((1, 4, 4), "1"))
    with pytest.raises(ValueError, match=r"`inputs` must be the nodes' features.*dtype <U1"):
        case.make()(np.full((1, 4, FEATURES), "a"), adjacency)
    with pytest.raises(ValueError, match=r"`adjacency` must be edge weights.*dtype <U1"):
        ops.read_adjacency(np.full((1, 4, 4), "1"))


@each_layer
def test_graphs_of_no_nodes_give_empty_outputs(case):
    layer = case.make(merge_mode=None)
    outputs = layer(np.zeros((2, 0, FEATURES), "float32"), np.zeros((2, 0, 0), "float32"))
    assert tuple(outputs.shape) == (2, 0, layer.encoding_width)


def directed_adjacencies():
    one_way_cycle = np.roll(np.eye(4, dtype="float32"), 1, axis=1)
    return (bad_adjacencies()["directed"], one_way_cycle)


@each_layer
def test_directed_adjacency_is_refused(case):
    for directed in directed_adjacencies():
        assert_adjacency_refused(case.make(), directed[None], COMPLAINTS["directed"])


@tensorflow_only
@each_layer
def test_directed_adjacency_is_refused_in_a_graph(case):
    for directed in directed_adjacencies():
        assert_adjacency_refused_in_a_graph(
            case.make(), directed[None], COMPLAINTS["directed"]
        )


@pytest.mark.parametrize(
    "shape", [(1, 3), (4,), (1, 4, 4), (2, 4)], ids=["other-nodes", "rank-1", "rank-3", "other-batch"]
)
@each_layer
def test_a_node_mask_of_the_wrong_shape_is_refused_naming_it(case, shape):
    layer = case.make(merge_mode=None)
    nodes = np.zeros((1, 4, FEATURES), "float32")
    with pytest.raises(ValueError, match=rf"`mask` of {type(layer).__name__} must have shape \(batch, nodes\), here \(1, 4\)"):
        layer(nodes, cycle(4)[None].astype("float32"), mask=np.ones(shape, bool))
