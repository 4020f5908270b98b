"""The absolute encodings on grids: N-D sinusoidal, a resizable learned table.

`SinusoidalPositionEncoding(num_axes=n)` against MAE's 2-D table and the N-D
blocks written in float64 (tests/references.py); `PositionEmbedding(
grid_shape=...)` resized through the layer against tables PyTorch resized
itself (tests/fixtures/torch_resize.npz); grid inputs equal to the token
form with `ops.grid_positions`, prefix tokens, `None` dims under XLA,
bfloat16, `.keras` round trips and every bad argument.
"""

import json
import os

import keras
import numpy as np
import pytest

from keras_posenc import PositionEmbedding
from keras_posenc import SinusoidalPositionEncoding
from keras_posenc import ops
from tests import references
from tests.backend import graph_function
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_case import TestCase

RESIZE_FIXTURE = np.load(
    os.path.join(os.path.dirname(__file__), "fixtures", "torch_resize.npz")
)


def fixture_case(name):
    meta = json.loads(str(RESIZE_FIXTURE[f"{name}/meta"]))
    return (
        meta,
        RESIZE_FIXTURE[f"{name}/input"],
        RESIZE_FIXTURE[f"{name}/output"],
    )


def as_float64(tensor):
    """A float tensor's values in float64 (through float32, exactly)."""
    return numpy(keras.ops.cast(tensor, "float32")).astype("float64")


def table_of(layer):
    """A PositionEmbedding's table, as NumPy."""
    return numpy(layer.embeddings.value)


def grid_positions(grid_shape):
    """`ops.grid_positions(grid_shape)` as NumPy."""
    return numpy(ops.grid_positions(grid_shape))


def random_embeddings(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def table_layer(table, **kwargs):
    """A PositionEmbedding built with `table` as its embeddings."""
    layer = PositionEmbedding(merge_mode=None, **kwargs)
    layer.build((None, table.shape[0], table.shape[1]))
    layer.embeddings.assign(table)
    return layer


class GridLayerTest(TestCase):
    def test_sinusoidal_layer_behaviour(self):
        for init_kwargs, input_shape, expected_output_shape in [
            ({"num_axes": 2, "pairing": "half"}, (2, 3, 4, 8), (2, 3, 4, 8)),
            ({"num_axes": 3}, (2, 2, 3, 2, 6), (2, 2, 3, 2, 6)),
            (
                {"num_axes": 2, "merge_mode": "concat", "output_dim": 4},
                (2, 3, 2, 5),
                (2, 3, 2, 9),
            ),
            ({"num_prefix_tokens": 1}, (2, 5, 8), (2, 5, 8)),
        ]:
            self.run_layer_test(
                SinusoidalPositionEncoding,
                init_kwargs=init_kwargs,
                input_shape=input_shape,
                expected_output_shape=expected_output_shape,
                expected_num_trainable_weights=0,
                expected_num_non_trainable_weights=0,
                supports_masking=True,
            )

    def test_sinusoidal_layer_behaviour_with_grid_shape(self):
        self.run_layer_test(
            SinusoidalPositionEncoding,
            init_kwargs={"num_axes": 2, "num_prefix_tokens": 1},
            input_shape=(2, 7, 8),
            call_kwargs={"grid_shape": (2, 3)},
            expected_output_shape=(2, 7, 8),
            expected_num_trainable_weights=0,
            expected_num_non_trainable_weights=0,
            supports_masking=True,
            # The harness's training step calls the layer without call_kwargs.
            run_training_check=False,
        )

    def test_position_embedding_layer_behaviour(self):
        for init_kwargs, input_shape, call_kwargs in [
            ({"grid_shape": (3, 4)}, (2, 3, 4, 8), None),
            ({"grid_shape": (2, 3), "num_prefix_tokens": 1}, (2, 7, 8), None),
            (
                {"grid_shape": (2, 2), "num_prefix_tokens": 2},
                (2, 11, 8),
                {"grid_shape": (3, 3)},
            ),
            ({"grid_shape": (2, 3, 2), "antialias": True}, (2, 4, 2, 3, 8), None),
            (
                {"sequence_length": 3, "interpolation": "linear"},
                (2, 5, 8),
                None,
            ),
        ]:
            self.run_layer_test(
                PositionEmbedding,
                init_kwargs=init_kwargs,
                input_shape=input_shape,
                call_kwargs=call_kwargs,
                expected_output_shape=input_shape,
                expected_num_trainable_weights=1,
                expected_num_non_trainable_weights=0,
                supports_masking=True,
                # The harness's training step calls it without call_kwargs.
                run_training_check=call_kwargs is None,
            )


# --- SinusoidalPositionEncoding(num_axes=n) ---


def test_equals_mae_2d_sincos_once_the_coordinates_are_swapped():
    # MAE's meshgrid(grid_w, grid_h) puts the column block first.
    layer = SinusoidalPositionEncoding(
        num_axes=2, pairing="half", merge_mode=None, num_prefix_tokens=1
    )
    positions = keras.ops.flip(ops.grid_positions((5, 5)), axis=-1)  # (column, row)
    outputs = layer(np.zeros((1, 26, 16), "float32"), positions=positions)
    expected = references.mae_2d_sincos_pos_embed(16, 5, cls_token=True)
    np.testing.assert_allclose(numpy(outputs)[0], expected, atol=1e-6)
    # In (row, column) order the two blocks trade places.
    grid = SinusoidalPositionEncoding(num_axes=2, pairing="half", merge_mode=None)
    outputs = numpy(grid(np.zeros((1, 5, 5, 16), "float32"))).reshape(25, 16)
    np.testing.assert_allclose(
        outputs, np.roll(expected[1:], 8, axis=1), atol=1e-6
    )


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_3d_blocks_equal_the_float64_reference(pairing):
    layer = SinusoidalPositionEncoding(
        num_axes=3, pairing=pairing, max_wavelength=100.0
    )
    video = random_embeddings((2, 2, 3, 4, 12))  # (batch, t, h, w, features)
    outputs = layer(video)
    expected = references.sinusoidal_on_axes(
        grid_positions((2, 3, 4)), 12, 100.0, pairing
    ).reshape(2, 3, 4, 12)
    np.testing.assert_allclose(numpy(outputs), video + expected, atol=1e-5)


@pytest.mark.parametrize(
    "layer, grid",
    [
        (lambda: SinusoidalPositionEncoding(num_axes=2), (3, 4)),
        (lambda: SinusoidalPositionEncoding(num_axes=3, pairing="half"), (2, 2, 3)),
        (lambda: PositionEmbedding(grid_shape=(3, 4)), (3, 4)),
        (lambda: PositionEmbedding(grid_shape=(2, 2, 3)), (2, 2, 3)),
    ],
)
def test_grid_inputs_equal_the_token_form(layer, grid):
    layer = layer()
    cells = int(np.prod(grid))
    images = random_embeddings((2,) + grid + (12,))
    tokens = images.reshape(2, cells, 12)
    outputs = layer(images)
    assert tuple(outputs.shape) == images.shape
    flat = numpy(outputs).reshape(2, cells, 12)
    by_positions = numpy(layer(tokens, positions=ops.grid_positions(grid)))
    by_grid_shape = numpy(layer(tokens, grid_shape=grid))
    np.testing.assert_array_equal(flat, by_positions)
    np.testing.assert_array_equal(flat, by_grid_shape)


def test_prefix_tokens_have_no_sinusoidal_encoding():
    grid = (2, 3)
    tokens = random_embeddings((2, 2 + 6, 8))
    added = numpy(
        SinusoidalPositionEncoding(num_axes=2, num_prefix_tokens=2)(
            tokens, grid_shape=grid
        )
    )
    np.testing.assert_array_equal(added[:, :2], tokens[:, :2])  # unchanged
    np.testing.assert_allclose(
        added[:, 2:],
        tokens[:, 2:]
        + references.sinusoidal_on_axes(
            grid_positions(grid), 8, pairing="interleaved"
        ),
        atol=1e-6,
    )
    concatenated = numpy(
        SinusoidalPositionEncoding(
            num_axes=2, num_prefix_tokens=2, merge_mode="concat", output_dim=4
        )(tokens, positions=ops.grid_positions(grid))
    )
    np.testing.assert_array_equal(concatenated[:, :, :8], tokens)
    np.testing.assert_array_equal(concatenated[:, :2, 8:], 0.0)  # zeros
    # Per-batch coordinates after the prefix (packed or jittered grids).
    per_batch = np.stack([grid_positions(grid), grid_positions(grid) + 1])
    learned = PositionEmbedding(grid_shape=(3, 4), num_prefix_tokens=2)
    outputs = numpy(learned(tokens, positions=per_batch))
    table = table_of(learned)
    rows = 2 + per_batch[..., 0] * 4 + per_batch[..., 1]  # (batch, 6)
    np.testing.assert_array_equal(outputs[:, :2], tokens[:, :2] + table[:2])
    np.testing.assert_array_equal(
        outputs[:, 2:], tokens[:, 2:] + table[rows]
    )
    # A prefix on a line: positions count from the first token after it.
    line = numpy(
        SinusoidalPositionEncoding(num_prefix_tokens=1, merge_mode=None)(
            np.zeros((1, 5, 6), "float32")
        )
    )
    np.testing.assert_allclose(
        line[0, 1:], references.sinusoidal(np.arange(4), 6), atol=1e-6
    )


def test_float_coordinates():
    coordinates = np.array(
        [[[0.0, 0.5], [0.25, 13.75], [-1.5, 2.125]]], "float32"
    )  # (1, 3, 2): normalised or jittered
    outputs = SinusoidalPositionEncoding(num_axes=2, merge_mode=None)(
        np.zeros((1, 3, 8), "float32"), positions=coordinates
    )
    np.testing.assert_allclose(
        numpy(outputs),
        references.sinusoidal_on_axes(coordinates, 8, pairing="interleaved"),
        atol=1e-5,
    )


def test_mixed_bfloat16_keeps_float32_angles_up_to_1024_per_axis():
    keras.config.set_dtype_policy("mixed_bfloat16")
    rng = np.random.default_rng(0)
    coordinates = np.concatenate(
        [[[1024, 1024], [1023, 0], [0, 1024]], rng.integers(0, 1025, (61, 2))]
    ).astype("int32")  # (64, 2)
    outputs = SinusoidalPositionEncoding(num_axes=2, merge_mode=None)(
        np.zeros((1, 64, 64), "float32"), positions=coordinates
    )
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    expected = references.sinusoidal_on_axes(coordinates, 64, pairing="interleaved")
    error = np.abs(as_float64(outputs[0]) - expected)
    assert error.max() <= 8e-3, error.max()
    # And from a grid input's own axes, at 1024 along one axis.
    image = np.zeros((1, 2, 1025, 8), "float32")
    outputs = SinusoidalPositionEncoding(num_axes=2, merge_mode=None)(image)
    expected = references.sinusoidal_on_axes(
        grid_positions((2, 1025)), 8, pairing="interleaved"
    ).reshape(1, 2, 1025, 8)
    error = np.abs(as_float64(outputs) - expected)
    assert error.max() <= 8e-3, error.max()


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda: SinusoidalPositionEncoding(num_axes=2, pairing="half"),
        lambda: PositionEmbedding(grid_shape=(3, 4), embeddings_initializer="sinusoidal"),
    ],
)
def test_none_grid_dims_under_xla_at_two_grid_sizes(make_layer):
    layer = make_layer()
    eager_results = {}
    for grid in ((3, 4), (5, 2)):
        eager_results[grid] = numpy(
            layer(random_embeddings((2,) + grid + (8,), seed=sum(grid)))
        )

    def encode(images):
        return layer(images)

    encode = graph_function(encode, [((None, None, None, 8), "float32")])
    for grid, expected in eager_results.items():
        images = random_embeddings((2,) + grid + (8,), seed=sum(grid))
        np.testing.assert_allclose(numpy(encode(images)), expected, atol=1e-5)
    symbolic = layer(keras.Input((None, None, 8)))
    assert tuple(symbolic.shape) == (None, None, None, 8)


def test_grid_model_round_trips_through_keras_file(tmp_path):
    images = keras.Input((None, None, 8))
    sinusoidal = SinusoidalPositionEncoding(num_axes=2, pairing="half")(images)
    learned = PositionEmbedding(grid_shape=(3, 4), antialias=True)(sinusoidal)
    tokens = keras.Input((None, 8))
    prefixed = PositionEmbedding(
        grid_shape=(2, 2), num_prefix_tokens=1, interpolation="bilinear"
    )(tokens)
    model = keras.Model([images, tokens], [learned, prefixed])
    path = str(tmp_path / "grid.keras")
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    inputs = [random_embeddings((2, 3, 4, 8)), random_embeddings((2, 5, 8))]
    outputs = model.predict(inputs, verbose=0)
    for got, expected in zip(loaded.predict(inputs, verbose=0), outputs):
        np.testing.assert_array_equal(got, expected)
    # At another resolution, through the resized tables.
    inputs = [random_embeddings((1, 5, 6, 8)), random_embeddings((1, 5, 8))]
    for got, expected in zip(loaded(inputs), model(inputs)):
        np.testing.assert_array_equal(numpy(got), numpy(expected))


def test_sinusoidal_config_round_trip_and_old_configs():
    layer = SinusoidalPositionEncoding(num_axes=3, num_prefix_tokens=2)
    config = layer.get_config()
    assert {"num_axes": 3, "num_prefix_tokens": 2}.items() <= config.items()
    assert SinusoidalPositionEncoding.from_config(config).get_config() == config
    old = {
        key: value
        for key, value in SinusoidalPositionEncoding().get_config().items()
        if key not in ("num_axes", "num_prefix_tokens")
    }
    rebuilt = SinusoidalPositionEncoding.from_config(old)
    assert (rebuilt.num_axes, rebuilt.num_prefix_tokens) == (1, 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_axes": 0}, "num_axes=0"),
        ({"num_axes": 2.0}, "num_axes=2.0"),
        ({"num_prefix_tokens": -1}, "num_prefix_tokens=-1"),
        ({"num_prefix_tokens": True}, "num_prefix_tokens=True"),
        ({"num_axes": 2, "merge_mode": None, "output_dim": 5}, "output_dim=5"),
        (
            {"num_axes": 2, "pairing": "half", "merge_mode": None, "output_dim": 6},
            "output_dim=6",
        ),
    ],
)
def test_sinusoidal_bad_arguments_name_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        SinusoidalPositionEncoding(**kwargs)


@pytest.mark.parametrize(
    "layer_kwargs, shape, call_kwargs, message",
    [
        ({"num_axes": 2}, (1, 6, 8), {}, "pass `grid_shape`"),
        ({"num_axes": 2}, (1, 6, 8), {"start_index": 2}, "start_index=2"),
        (
            {"num_axes": 2},
            (1, 6, 8),
            {"start_index": keras.ops.convert_to_tensor(0)},
            "one axis only",
        ),
        (
            {"num_axes": 2},
            (1, 6, 8),
            {"grid_shape": (2, 3), "positions": np.zeros((6, 2), "int32")},
            "not both",
        ),
        ({"num_axes": 2}, (1, 6, 8), {"grid_shape": (6,)}, r"grid_shape=\(6,\)"),
        ({"num_axes": 2}, (1, 6, 8), {"grid_shape": (2, 2)}, r"4 cells.*6 tokens"),
        (
            {"num_axes": 2},
            (1, 6, 8),
            {"positions": np.zeros((6, 3), "int32")},
            r"`positions` must have shape \(sequence, 2\)",
        ),
        (
            {"num_axes": 2},
            (1, 2, 3, 8),
            {"grid_shape": (2, 3)},
            "`grid_shape` is for token inputs",
        ),
        (
            {"num_axes": 2},
            (1, 2, 3, 8),
            {"positions": np.zeros((6, 2), "int32")},
            "`positions` is for token inputs",
        ),
        (
            {"num_axes": 2, "num_prefix_tokens": 1},
            (1, 2, 3, 8),
            {},
            "num_prefix_tokens=1",
        ),
        ({"num_axes": 2}, (1, 2, 3, 9), {}, r"multiple of 2.*\(1, 2, 3, 9\)"),
        ({"num_axes": 2}, (1, 2, 3, 4, 8), {}, r"\(batch, size, size, features\)"),
    ],
)
def test_sinusoidal_bad_inputs_say_what_was_expected(
    layer_kwargs, shape, call_kwargs, message
):
    layer = SinusoidalPositionEncoding(**layer_kwargs)
    with pytest.raises(ValueError, match=message):
        layer(np.zeros(shape, "float32"), **call_kwargs)


# --- PositionEmbedding(grid_shape=...) ---


def test_grid_table_has_prefix_rows_then_the_grid_rows():
    layer = PositionEmbedding(grid_shape=(3, 4), num_prefix_tokens=2, merge_mode=None)
    outputs = numpy(layer(np.zeros((2, 14, 5), "float32")))
    table = table_of(layer)
    assert table.shape == (2 + 12, 5)
    np.testing.assert_array_equal(outputs[0], table)
    coordinates = np.array([[2, 3], [0, 1], [1, 0]])
    explicit = numpy(layer(np.zeros((1, 5, 5), "float32"), positions=coordinates))
    np.testing.assert_array_equal(explicit[0, :2], table[:2])
    np.testing.assert_array_equal(
        explicit[0, 2:], table[2 + coordinates[:, 0] * 4 + coordinates[:, 1]]
    )


def test_sinusoidal_initializer_on_a_grid():
    layer = PositionEmbedding(
        grid_shape=(2, 3), num_prefix_tokens=1, embeddings_initializer="sinusoidal"
    )
    layer.build((None, 7, 8))
    table = table_of(layer)
    np.testing.assert_array_equal(table[0], 0.0)
    np.testing.assert_allclose(
        table[1:],
        references.sinusoidal_on_axes(
            grid_positions((2, 3)), 8, pairing="interleaved"
        ),
        atol=1e-6,
    )


def test_same_grid_reads_the_table_without_a_resize():
    layer = PositionEmbedding(grid_shape=(3, 4), merge_mode=None)
    images = np.zeros((1, 3, 4, 6), "float32")
    outputs = numpy(layer(images))
    np.testing.assert_array_equal(outputs[0].reshape(12, 6), table_of(layer))


@tensorflow_only
def test_same_grid_builds_no_matmul_in_a_tensorflow_graph():
    import tensorflow as tf

    layer = PositionEmbedding(grid_shape=(3, 4), merge_mode=None)
    images = tf.zeros((1, 3, 4, 6))
    graph = tf.function(layer).get_concrete_function(images).graph
    kinds = {op.type for op in graph.get_operations()}
    assert not kinds & {"MatMul", "BatchMatMulV2", "Tensordot"}, kinds


@pytest.mark.parametrize(
    "name",
    [
        "bicubic_up",
        "bicubic_down",
        "bicubic_mixed",
        "bicubic_up_antialias",
        "bicubic_down_antialias",
        "bilinear_up",
        "bilinear_down_antialias",
    ],
)
def test_resized_grid_equals_torch_interpolate_prefix_untouched(name):
    meta, grid_rows, expected = fixture_case(name)
    prefix = random_embeddings((2, 3), seed=5)
    layer = table_layer(
        np.concatenate([prefix, grid_rows]),
        grid_shape=tuple(meta["size"]),
        num_prefix_tokens=2,
        interpolation=meta["mode"],
        antialias=meta["antialias"],
    )
    new_grid = tuple(meta["new_size"])
    tokens = np.zeros((1, 2 + int(np.prod(new_grid)), 3), "float32")
    outputs = numpy(layer(tokens, grid_shape=new_grid))[0]
    np.testing.assert_array_equal(outputs[:2], prefix)
    np.testing.assert_allclose(outputs[2:], expected, rtol=0, atol=1e-5)
    resized = numpy(layer.resized_embeddings(new_grid))
    np.testing.assert_array_equal(resized, outputs)


def test_line_table_stretches_only_when_asked():
    meta, rows, expected = fixture_case("linear_up")  # 5 rows to 9
    layer = table_layer(rows, sequence_length=5, interpolation="linear")
    stretched = numpy(layer(np.zeros((1, 9, 3), "float32")))[0]
    np.testing.assert_allclose(stretched, expected, rtol=0, atol=1e-5)
    shorter = numpy(layer(np.zeros((1, 4, 3), "float32")))[0]
    np.testing.assert_array_equal(shorter, rows[:4])  # rows, as always
    _, rows, expected = fixture_case("linear_down")  # 9 rows to 4
    layer = table_layer(rows, sequence_length=9, interpolation="linear")
    shrunk = numpy(layer(np.zeros((1, 4, 3), "float32"), grid_shape=(4,)))[0]
    np.testing.assert_allclose(shrunk, expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        numpy(layer.resized_embeddings((4,))), expected, rtol=0, atol=1e-5
    )
    # The default on a line: past the table is the error it always was.
    default = PositionEmbedding(5)
    assert default.interpolation is None
    with pytest.raises(ValueError, match="sequence_length=5"):
        default(np.zeros((1, 9, 3), "float32"))


def test_line_table_stretches_under_xla_with_unknown_length():
    _, rows, expected = fixture_case("linear_up")
    layer = table_layer(rows, sequence_length=5, interpolation="linear")
    encode = graph_function(layer, [((None, None, 3), "float32")])
    np.testing.assert_allclose(
        numpy(encode(keras.ops.zeros((1, 9, 3))))[0], expected, atol=1e-5
    )
    np.testing.assert_array_equal(
        numpy(encode(keras.ops.zeros((1, 3, 3))))[0], rows[:3]
    )


def test_interpolation_none_refuses_another_grid_naming_both():
    layer = PositionEmbedding(grid_shape=(3, 4), interpolation=None)
    with pytest.raises(
        ValueError, match=r"grid_shape=\(3, 4\).*grid_shape=\(5, 6\).*interpolation="
    ):
        layer(np.zeros((1, 5, 6, 8), "float32"))
    with pytest.raises(ValueError, match=r"grid_shape=\(5, 6\)"):
        layer.resized_embeddings((5, 6))


@tensorflow_only
def test_interpolation_none_refuses_another_grid_in_a_graph():
    import tensorflow as tf

    layer = PositionEmbedding(grid_shape=(3, 4), interpolation=None)
    encode = tf.function(
        layer, input_signature=[tf.TensorSpec((None, None, None, 8), "float32")]
    )
    encode(tf.zeros((1, 3, 4, 8)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="interpolation=None"):
        encode(tf.zeros((1, 5, 6, 8)))


def test_resized_embeddings_make_a_layer_for_the_new_grid():
    layer = PositionEmbedding(grid_shape=(4, 4), num_prefix_tokens=1)
    tokens = random_embeddings((2, 1 + 36, 8))
    on_the_fly = numpy(layer(tokens, grid_shape=(6, 6)))
    table = layer.resized_embeddings((6, 6))
    finer = PositionEmbedding(grid_shape=(6, 6), num_prefix_tokens=1)
    finer.build((None, 37, 8))
    finer.embeddings.assign(table)
    np.testing.assert_array_equal(numpy(finer(tokens)), on_the_fly)


def test_position_embedding_config_round_trip_and_old_configs():
    layer = PositionEmbedding(
        grid_shape=(3, 4), num_prefix_tokens=1, interpolation="bilinear", antialias=True
    )
    config = layer.get_config()
    assert {
        "grid_shape": [3, 4],
        "sequence_length": None,
        "num_prefix_tokens": 1,
        "interpolation": "bilinear",
        "antialias": True,
    }.items() <= config.items()
    assert PositionEmbedding.from_config(config).get_config() == config
    grid_default = PositionEmbedding(grid_shape=(3, 4)).get_config()
    assert grid_default["interpolation"] == "bicubic"
    # A line's config is the one it had before grids: no grid arguments.
    line = PositionEmbedding(8).get_config()
    assert not {
        "grid_shape", "num_prefix_tokens", "interpolation", "antialias"
    } & set(line)
    assert PositionEmbedding.from_config(line).get_config() == line
    stretched = PositionEmbedding(8, interpolation="linear").get_config()
    assert stretched["interpolation"] == "linear"
    assert PositionEmbedding.from_config(stretched).interpolation == "linear"
    refusing = PositionEmbedding(grid_shape=(3, 4), interpolation=None).get_config()
    assert PositionEmbedding.from_config(refusing).interpolation is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "sequence_length=None, grid_shape=None"),
        ({"sequence_length": 4, "grid_shape": (2, 2)}, r"grid_shape=\(2, 2\)"),
        ({"grid_shape": (4,)}, r"grid_shape=\(4,\)"),
        ({"grid_shape": (4, 0)}, r"grid_shape=\(4, 0\)"),
        ({"grid_shape": "4x4"}, "grid_shape='4x4'"),
        ({"grid_shape": (2, keras.ops.convert_to_tensor(2))}, "grid_shape="),
        ({"grid_shape": (2, 2), "interpolation": "linear"}, "interpolation='linear'"),
        ({"sequence_length": 4, "interpolation": "bicubic"}, "interpolation='bicubic'"),
        ({"grid_shape": (2, 2), "interpolation": "nearest"}, "interpolation='nearest'"),
        ({"grid_shape": (2, 2), "antialias": "yes"}, "antialias='yes'"),
        ({"grid_shape": (2, 2), "num_prefix_tokens": -1}, "num_prefix_tokens=-1"),
        ({"grid_shape": (2, 2), "num_prefix_tokens": 1.0}, r"num_prefix_tokens=1\.0"),
    ],
)
def test_position_embedding_bad_arguments_name_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PositionEmbedding(**kwargs)


def test_position_embedding_bad_grid_inputs_say_what_was_expected():
    layer = PositionEmbedding(grid_shape=(2, 3), num_prefix_tokens=1)
    with pytest.raises(ValueError, match=r"6 cells.*8 tokens"):
        layer(np.zeros((1, 9, 4), "float32"))
    with pytest.raises(ValueError, match="num_prefix_tokens=1"):
        layer(np.zeros((1, 2, 3, 4), "float32"))
    with pytest.raises(ValueError, match=r"grid_shape=\(2, 3\).*\[1, 3\]"):
        layer(np.zeros((1, 3, 4), "float32"), positions=[[0, 0], [1, 3]])
    with pytest.raises(ValueError, match="integer `positions`"):
        layer(np.zeros((1, 3, 4), "float32"), positions=[[0.0, 0.5], [1.0, 1.0]])
    with pytest.raises(ValueError, match="start_index=1"):
        layer(np.zeros((1, 7, 4), "float32"), start_index=1)
    with pytest.raises(ValueError, match=r"\(batch, sequence, features\)"):
        PositionEmbedding(grid_shape=(2, 3))(np.zeros((1, 2, 3, 4, 4), "float32"))


@pytest.mark.parametrize(
    "layer",
    [
        lambda: PositionEmbedding(8, num_prefix_tokens=6),
        lambda: PositionEmbedding(grid_shape=(2, 2), num_prefix_tokens=6),
        lambda: SinusoidalPositionEncoding(num_prefix_tokens=6),
        lambda: SinusoidalPositionEncoding(num_axes=2, num_prefix_tokens=6),
    ],
    ids=["learned", "learned-grid", "sinusoidal", "sinusoidal-grid"],
)
def test_fewer_tokens_than_the_prefix_are_refused_naming_it(layer):
    with pytest.raises(
        ValueError,
        match=r"at least the 6 prefix tokens \(num_prefix_tokens=6\)\. "
        r"Received inputs of shape \(1, 4, 8\)",
    ):
        layer()(np.zeros((1, 4, 8), "float32"), positions=None)
