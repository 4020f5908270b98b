"""The position contract: one idea of a position, 1-D and on grids.

`ops.grid_positions` against NumPy's own grid indices, `ops.read_positions`
(the one reader of positions every layer calls) on every accepted shape and
every refused one, the per-axis `ops.relative_position`, and a `.keras` file
of every 1-D layer written before grids existed, which must load with the
same numbers.
"""

import json
import os
import zipfile

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import ops
from tests import references
from tests.backend import XLA
from tests.backend import compiled
from tests.backend import graph_function
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_positional_multi_head_attention import reference_attention

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "one_axis_model.keras")


@pytest.mark.parametrize("grid_shape", [(1,), (5,), (2, 3), (3, 1, 4), (2, 2, 2, 3)])
def test_grid_positions_are_row_major_coordinates(grid_shape):
    # np.indices gives coordinate a of every cell; C order is row-major.
    expected = np.stack(
        [axis.ravel() for axis in np.indices(grid_shape)], axis=-1
    )  # (prod, num_axes)
    positions = ops.grid_positions(grid_shape)
    assert keras.backend.standardize_dtype(positions.dtype) == "int32"
    np.testing.assert_array_equal(numpy(positions), expected)


def test_grid_positions_take_sizes_known_only_when_the_graph_runs():
    def grid_of(images):
        shape = keras.ops.shape(images)  # scalar tensors where unknown
        return ops.grid_positions((shape[1], shape[2]))

    grid_of = graph_function(grid_of, [((None, None, None, 2), "float32")])
    positions = grid_of(keras.ops.zeros((1, 3, 4, 2)))
    np.testing.assert_array_equal(
        numpy(positions), [[r, c] for r in range(3) for c in range(4)]
    )


@pytest.mark.parametrize(
    "grid_shape", [(), [0, 3], (2, -1), (2.0, 3), "23", 4, (True, 2)]
)
def test_bad_grid_shape_raises_value_error_naming_it(grid_shape):
    with pytest.raises(ValueError, match="`grid_shape` must be") as error:
        ops.grid_positions(grid_shape)
    assert repr(grid_shape) in str(error.value)


@pytest.mark.parametrize(
    "shape, num_axes, expected",
    [
        ((5,), 1, (5,)),
        ((2, 5), 1, (2, 5)),
        ((2, 5, 1), 1, (2, 5)),  # a trailing axis of one coordinate
        ((5, 2), 2, (5, 2)),
        ((2, 5, 2), 2, (2, 5, 2)),
        ((1, 5, 3), 3, (1, 5, 3)),
    ],
)
def test_read_positions_takes_every_documented_shape(shape, num_axes, expected):
    positions = np.arange(np.prod(shape)).reshape(shape)
    read = ops.read_positions(
        positions, num_axes, length=5, batch_size=2
    )
    assert tuple(read.shape) == expected
    np.testing.assert_array_equal(
        numpy(read).ravel(), positions.ravel()
    )


@pytest.mark.parametrize(
    "shape, num_axes, kwargs, message",
    [
        ((5, 3), 2, {}, r"\(sequence, 2\) or \(batch, sequence, 2\) for num_axes=2"),
        ((5,), 2, {}, "for num_axes=2"),
        ((2, 5, 2, 1), 2, {}, "shape \\(2, 5, 2, 1\\)"),
        ((4,), 1, {"length": 5}, "sequence length 5"),
        ((3, 5), 1, {"batch_size": 2}, "batch size 2"),
        ((3, 5, 2), 2, {"batch_size": 2}, "batch size 2"),
        ((2, 5), 1, {"per_batch": False}, r"must have shape \(sequence,\)"),
    ],
)
def test_read_positions_refuses_other_shapes_naming_the_argument(
    shape, num_axes, kwargs, message
):
    positions = np.zeros(shape, "int32")
    with pytest.raises(ValueError, match=message) as error:
        ops.read_positions(positions, num_axes, name="query_positions", **kwargs)
    assert "`query_positions` must have shape" in str(error.value)


def test_read_positions_refuses_floats_where_integers_are_needed():
    with pytest.raises(ValueError, match="`key_positions` must be integers"):
        ops.read_positions(
            np.zeros((3, 2), "float32"), 2, name="key_positions", integer=True
        )


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_read_positions_refuses_positions_that_are_not_finite(value):
    positions = np.array([[0.0, 1.5], [2.0, value]], "float32")
    with pytest.raises(
        ValueError, match=rf"`positions` must be finite\. Received: positions\[1, 1\]={value}"
    ):
        ops.read_positions(positions)


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize(
    "make, call",
    [
        (
            lambda: keras_posenc.SinusoidalPositionEncoding(merge_mode=None),
            lambda layer, p: layer(np.zeros((1, 4, 6), "float32"), positions=p),
        ),
        (
            lambda: keras_posenc.RotaryEmbedding(),
            lambda layer, p: layer(np.ones((1, 4, 2, 6), "float32"), positions=p),
        ),
        (
            lambda: keras_posenc.SinusoidalPositionEncoding(num_axes=2, merge_mode=None),
            lambda layer, p: layer(
                np.zeros((1, 4, 6), "float32"),
                positions=keras.ops.stack([p, p], axis=-1),
            ),
        ),
    ],
    ids=["sinusoidal", "rotary", "sinusoidal-grid"],
)
def test_positions_that_are_not_finite_raise_or_show_compiled(make, call, value):
    positions = np.array([0.0, 1.5, value, 3.0], "float32")
    layer = make()
    with pytest.raises(ValueError, match=r"`positions` must be finite"):
        call(layer, positions)
    if not XLA:
        return  # PyTorch runs `compiled` eagerly
    # Compiled code cannot raise: the position's row is NaN, the others not.
    outputs = numpy(compiled(lambda p: call(layer, p))(positions))
    assert np.isnan(outputs[0, 2]).all()
    assert np.isfinite(np.delete(outputs[0], 2, axis=0)).all()


INT32_MESSAGE = r"must fit in int32, from -2147483648 to 2147483647"


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**40])
def test_read_positions_refuses_integers_past_int32(value):
    # The layers compute positions in int32: wrapped, 2**32 + 5 would read
    # as 5.
    positions = np.array([[0, 1], [2, value]], "int64")
    with pytest.raises(
        ValueError,
        match=rf"`key_positions` {INT32_MESSAGE}.*Received: "
        rf"key_positions\[1, 1\]={value} \(dtype int64\)",
    ):
        ops.read_positions(positions, name="key_positions", integer=True)
    edges = np.array([-(2**31), 0, 2**31 - 1], "int64")
    np.testing.assert_array_equal(numpy(ops.read_positions(edges)), edges)


@tensorflow_only
def test_integers_past_int32_fail_when_a_tensorflow_graph_runs():
    import tensorflow as tf

    read = graph_function(
        lambda p: ops.read_positions(p, integer=True),
        input_signature=[((None,), "int64")],
        jit_compile=False,
    )
    np.testing.assert_array_equal(numpy(read(np.arange(3))), [0, 1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=INT32_MESSAGE):
        read(np.array([0, 2**31], "int64"))


def _attention(position):
    return lambda: keras_posenc.PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=position()
    )


# On JAX without 64-bit numbers, Keras' `Layer.__call__` converts NumPy
# arguments to int32 before a layer reads them; `ops.read_positions` itself
# refuses them there (above).
@tensorflow_only
@pytest.mark.parametrize(
    "make",
    [
        _attention(keras_posenc.TransformerXLPosition),
        _attention(keras_posenc.DisentangledPosition),
        _attention(lambda: keras_posenc.KerpleBias(num_heads=2)),
        _attention(lambda: keras_posenc.FireBias(num_heads=2)),
        _attention(lambda: keras_posenc.ContextualPosition(max_positions=16)),
        keras_posenc.XPosEmbedding,
    ],
    ids=["transformer-xl", "deberta", "kerple", "fire", "cope", "xpos"],
)
def test_every_scheme_refuses_positions_past_int32(make):
    # Not wrapped to the default positions 0..5, whose outputs they would give.
    positions = (2**32 + np.arange(6)).astype("int64")
    layer = make()
    if isinstance(layer, keras_posenc.XPosEmbedding):
        heads = np.ones((1, 6, 2, 8), "float32")
        call = lambda: layer(heads, heads, query_positions=positions, key_positions=positions)  # noqa: E731
    else:
        tokens = np.ones((1, 6, 16), "float32")
        call = lambda: layer(  # noqa: E731
            tokens,
            tokens,
            query_positions=positions,
            key_positions=positions,
            use_causal_mask=True,
        )
    with pytest.raises(ValueError, match=rf"positions` {INT32_MESSAGE}.*=4294967296"):
        call()


@pytest.mark.parametrize("num_axes", [0, -1, 1.5, True])
def test_bad_num_axes_raises_value_error_naming_it(num_axes):
    with pytest.raises(ValueError, match=f"num_axes={num_axes!r}"):
        ops.read_positions(np.zeros(3), num_axes)


@pytest.mark.parametrize("query_batch, key_batch", [(None, None), (2, None), (1, 2)])
def test_relative_position_on_a_grid_is_per_axis(query_batch, key_batch):
    rng = np.random.default_rng(0)

    def positions(batch, length):
        shape = (length, 3) if batch is None else (batch, length, 3)
        return rng.integers(-20, 20, size=shape)

    query, key = positions(query_batch, 4), positions(key_batch, 5)
    distance = numpy(ops.relative_position(query, key, num_axes=3))
    batch = max(query_batch or 1, key_batch or 1)
    assert distance.shape == (batch, 4, 5, 3)
    assert ops.relative_position_shape(query.shape, key.shape, 3) == (
        batch, 4, 5, 3,
    )
    query, key = (
        np.broadcast_to(p if p.ndim == 3 else p[None], (batch,) + p.shape[-2:])
        for p in (query, key)
    )
    for b, i, j, a in np.ndindex(distance.shape):
        assert distance[b, i, j, a] == key[b, j, a] - query[b, i, a]


def test_one_axis_model_saved_before_grids_loads_with_the_same_numbers():
    model = keras.models.load_model(FIXTURE, safe_mode=True)
    rng = np.random.default_rng(3)
    embeddings = rng.normal(size=(2, 6, 8)).astype("float32")
    tokens = rng.integers(0, 11, size=(2, 6)).astype("int32")
    outputs = model.predict([embeddings, tokens], verbose=0)
    sinusoidal, learned, rotated, *attended, token_and_position = outputs
    x = embeddings.astype("float64")
    np.testing.assert_allclose(
        sinusoidal, x + references.sinusoidal(np.arange(6), 8), atol=1e-5
    )
    table = numpy(model.get_layer("learned").embeddings.value)
    np.testing.assert_allclose(learned, x + table[:6], atol=1e-5)
    frequencies, _ = references.rope_inverse_frequencies(8, 100.0)
    np.testing.assert_allclose(
        rotated, references.rotary(x, np.arange(6), frequencies), atol=1e-5
    )
    for name, output in zip(("rotary", "alibi", "t5", "shaw"), attended):
        layer = model.get_layer(f"attention_{name}")
        expected, _ = reference_attention(layer, embeddings, embeddings)
        np.testing.assert_allclose(output, expected, atol=1e-4, err_msg=name)
    layer = model.get_layer("token_and_position")
    token_table = numpy(layer.token_embedding.embeddings.value)
    np.testing.assert_allclose(
        token_and_position,
        token_table[tokens] + references.sinusoidal(np.arange(6), 8),
        atol=1e-5,
    )


RESIZE_FIXTURE = np.load(
    os.path.join(os.path.dirname(__file__), "fixtures", "torch_resize.npz")
)
RESIZE_CASES = sorted({key.split("/")[0] for key in RESIZE_FIXTURE.files if "/" in key})


@pytest.mark.parametrize("name", RESIZE_CASES)
def test_resize_grid_equals_torch_interpolate(name):
    # Written by PyTorch's own F.interpolate(..., align_corners=False): see
    # tests/fixtures/make_torch_resize.py.
    meta = json.loads(str(RESIZE_FIXTURE[f"{name}/meta"]))
    resized = ops.resize_grid(
        RESIZE_FIXTURE[f"{name}/input"],
        meta["size"],
        meta["new_size"],
        meta["mode"],
        meta["antialias"],
    )
    np.testing.assert_allclose(
        numpy(resized), RESIZE_FIXTURE[f"{name}/output"], rtol=0, atol=1e-5
    )


# A size known only when the program runs: TensorFlow's dynamic shapes (JAX
# compiles one program per size, known when it traces).
@tensorflow_only
def test_resize_grid_runs_under_xla_to_a_size_known_only_then():
    table = np.random.default_rng(0).normal(size=(12, 2)).astype("float32")

    def resized(height, width):
        return ops.resize_grid(table, (3, 4), (height, width))

    resized = graph_function(resized, [((), "int32"), ((), "int32")])
    eager = ops.resize_grid(table, (3, 4), (5, 7))
    np.testing.assert_allclose(
        numpy(
            resized(
                keras.ops.convert_to_tensor(5, "int32"),
                keras.ops.convert_to_tensor(7, "int32"),
            )
        ),
        numpy(eager),
        atol=1e-6,
    )


def test_resize_to_the_same_grid_is_the_identity():
    table = np.random.default_rng(1).normal(size=(6, 3)).astype("float32")
    for interpolation in ("bilinear", "bicubic"):
        np.testing.assert_allclose(
            numpy(ops.resize_grid(table, (2, 3), (2, 3), interpolation)),
            table,
            atol=1e-6,
        )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.resize_matrix(3, 4, "nearest"), "interpolation='nearest'"),
        (lambda: ops.resize_matrix(0, 4), "input_size=0"),
        (
            lambda: ops.resize_grid(np.zeros((6, 1)), (2, 3), (4,)),
            r"`new_grid_shape` must be a list or tuple of 2 positive",
        ),
    ],
)
def test_bad_resize_arguments_raise_value_error_naming_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# The arguments renamed since, by layer: old name -> new name.
RENAMED = {
    "sinusoidal": {"layout": "pairing"},
    "learned": {"initializer": "embeddings_initializer"},
    "token_and_position": {"position": "position_encoding"},
    "rotary": {"layout": "pairing"},
    "attention_rotary/position": {"layout": "pairing"},
    "attention_alibi/position": {"symmetric": "bidirectional"},
    "attention_shaw/position": {"max_distance": "max_relative_position"},
}


def test_one_axis_configs_are_the_ones_saved_before_grids():
    # The configs of the package's layers as the code before grids wrote
    # them: the same keys and values, under the names they have now. Keras
    # objects inside them (dtype policies, initializers) are compared by
    # class: newer Keras versions write more of their own arguments.
    with zipfile.ZipFile(FIXTURE) as archive:
        saved = json.loads(archive.read("config.json"))

    def ours(config):
        return {
            key: value["class_name"] if isinstance(value, dict) else value
            for key, value in config.items()
        }

    def package_configs(model_config):
        configs = {}
        for layer in model_config["config"]["layers"]:
            config = layer["config"]
            if isinstance(config.get("position"), dict):
                configs[f"{config['name']}/position"] = ours(
                    config["position"]["config"]
                )
            elif (layer.get("registered_name") or "").startswith("keras_posenc>"):
                configs[config["name"]] = ours(config)
        return configs

    model = keras.models.load_model(FIXTURE, safe_mode=True)
    before = {
        name: {RENAMED.get(name, {}).get(key, key): value for key, value in config.items()}
        for name, config in package_configs(saved).items()
    }
    now = package_configs(keras.saving.serialize_keras_object(model))
    assert len(before) == 8 and before.keys() == now.keys()
    for name in before:
        assert now[name] == before[name], name
