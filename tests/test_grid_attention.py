"""Attention on grids: GridRelativePositionBias (Swin, BEiT) and grid positions.

The bias is checked against Swin's `relative_position_index` construction
and a clipping loop, both written in float64 NumPy in `tests/references.py`,
and its resize against a fixture timm wrote. `PositionalMultiHeadAttention`
with grid positions is checked against the float64 attention of
`tests/test_positional_multi_head_attention.py`, given the bias (or the grid
rotation) of the references.
"""

import json
import os
import re

import keras
import numpy as np
import pytest

from keras_posenc import AlibiBias
from keras_posenc import GridRelativePositionBias
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RelativePositionBias
from keras_posenc import RelativePositionEmbedding
from keras_posenc import RotaryEmbedding
from keras_posenc import ops
from keras_posenc.layers.attention_position import AttentionPosition
from tests import references
from tests.backend import XLA
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_case import TestCase
from tests.test_positional_multi_head_attention import assert_close
from tests.test_positional_multi_head_attention import randomize_weights
from tests.test_positional_multi_head_attention import reference_attention

HEADS = 2
KEY_DIM = 4
FEATURES = 6
BATCH = 2
FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "timm_rel_pos_resize.npz")


def random_table(layer, seed=0):
    """Fill the layer's table with random values, so that a wrong row shows."""
    layer.build()
    table = np.random.default_rng(seed).normal(size=layer.embeddings.shape)
    layer.embeddings.assign(table.astype("float32"))
    return np.asarray(numpy(layer.embeddings.value), "float64")


def grid(grid_shape, batch=None):
    """Row-major positions of `grid_shape`, `(cells, axes)` or per batch."""
    positions = np.stack(
        [axis.ravel() for axis in np.indices(grid_shape)], axis=-1
    )  # (cells, axes)
    if batch is None:
        return positions
    return np.broadcast_to(positions, (batch,) + positions.shape)


def random_inputs(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def dtype_of(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


# The bias.


@pytest.mark.parametrize("window", [(4,), (2, 3), (3, 3), (2, 2, 3)])
def test_bias_on_its_window_reads_swins_relative_position_index(window):
    layer = GridRelativePositionBias(HEADS, window)
    table = random_table(layer)
    assert table.shape == (np.prod([2 * size - 1 for size in window]), HEADS)
    positions = ops.grid_positions(window)
    if len(window) == 1:
        positions = positions[:, 0]  # one axis: (sequence,)
    bias = layer(positions, positions)
    index = references.swin_relative_position_index(window)  # (cells, cells)
    assert dtype_of(bias) == "float32"
    np.testing.assert_array_equal(
        numpy(bias)[0], table[index].transpose(2, 0, 1)
    )  # (heads, query, key)
    distance = ops.relative_position(positions, positions, len(window))
    if len(window) == 1:
        distance = distance[..., None]  # (1, query, key, 1)
    np.testing.assert_array_equal(
        numpy(ops.grid_relative_position_index(distance, window))[0], index
    )


def test_relative_position_index_is_timms():
    # timm 1.0.31's gen_relative_position_index, pasted: for (3, 4), the rows
    # of the queries at (0, 0) and (1, 2); for (2, 2) with a class token, all.
    index = references.swin_relative_position_index((3, 4))
    assert index[0].tolist() == [17, 16, 15, 14, 10, 9, 8, 7, 3, 2, 1, 0]
    assert index[6].tolist() == [26, 25, 24, 23, 19, 18, 17, 16, 12, 11, 10, 9]
    assert references.swin_relative_position_index((2, 2), True).tolist() == [
        [11, 9, 9, 9, 9],
        [10, 4, 3, 1, 0],
        [10, 5, 4, 2, 1],
        [10, 7, 6, 4, 3],
        [10, 8, 7, 5, 4],
    ]


@pytest.mark.parametrize(
    "window, grid_shape", [((2, 3), (4, 5)), ((3,), (7,)), ((2, 2, 2), (3, 2, 4))]
)
def test_larger_grids_clip_each_axis_to_the_window(window, grid_shape):
    layer = GridRelativePositionBias(HEADS, window)
    table = random_table(layer)
    rng = np.random.default_rng(3)
    # Per batch element: the grid, and a shuffled, shifted copy of it.
    query_positions = np.stack([grid(grid_shape), grid(grid_shape)[::-1] + 2])
    key_positions = np.stack(
        [grid(grid_shape), rng.permutation(grid(grid_shape)) - 1]
    )  # (batch, cells, axes); for one axis also (batch, cells, 1)
    bias = layer(query_positions, key_positions)
    expected = references.grid_relative_position_bias(
        table, window, query_positions, key_positions
    )
    np.testing.assert_array_equal(numpy(bias), expected)


@pytest.mark.parametrize("num_prefix_tokens", [1, 2])
def test_prefix_tokens_read_beits_three_rows(num_prefix_tokens):
    window = (2, 3)
    layer = GridRelativePositionBias(HEADS, window, num_prefix_tokens=num_prefix_tokens)
    table = random_table(layer)
    assert table.shape == (3 * 5 + 3, HEADS)
    positions = grid(window)
    bias = numpy(layer(positions, positions))[0]  # (heads, query, key)
    if num_prefix_tokens == 1:
        index = references.swin_relative_position_index(window, class_token=True)
        np.testing.assert_array_equal(bias, table[index].transpose(2, 0, 1))
    expected = references.grid_relative_position_bias(
        table, window, positions[None], positions[None], num_prefix_tokens
    )
    np.testing.assert_array_equal(bias, expected[0])


def test_one_axis_bias_takes_sequence_positions():
    layer = GridRelativePositionBias(HEADS, (3,), num_prefix_tokens=1)
    table = random_table(layer)
    positions = np.array([[0, 1, 5, 6]])
    expected = references.grid_relative_position_bias(
        table, (3,), positions[..., None], positions[..., None], 1
    )
    np.testing.assert_array_equal(numpy(layer(positions, positions)), expected)


def test_output_shape_counts_prefix_tokens_and_axes():
    layer = GridRelativePositionBias(HEADS, (2, 2), num_prefix_tokens=1)
    assert layer.compute_output_shape((None, 4, 2), (5, 2)) == (None, HEADS, 5, 6)
    query_positions = keras.Input((None, 2), dtype="int32")
    bias = layer(query_positions, keras.Input((4, 2), dtype="int32"))
    assert bias.shape == (None, HEADS, None, 5)
    assert bias.dtype == "float32"


@pytest.mark.parametrize("name", ["up", "up_class_token", "down"])
def test_resized_embeddings_equal_timm(name):
    with np.load(FIXTURE) as fixture:
        table = fixture[f"{name}/input"]
        expected = fixture[f"{name}/output"]
        meta = json.loads(str(fixture[f"{name}/meta"]))
    layer = GridRelativePositionBias(
        HEADS, meta["window"], num_prefix_tokens=1 if meta["extra"] else 0
    )
    layer.build()
    layer.embeddings.assign(table)
    resized = layer.resized_embeddings(meta["new_window"])
    assert dtype_of(resized) == "float32"
    np.testing.assert_allclose(numpy(resized), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("interpolation", ["bicubic", "linear"])
def test_resized_embeddings_resample_each_head_over_the_offsets(interpolation):
    # Three axes: each head's (3, 3, 5) offsets resampled as a grid by
    # ops.resize_grid, BEiT's rows kept; a layer at the new window takes it.
    layer = GridRelativePositionBias(HEADS, (2, 2, 3), num_prefix_tokens=1)
    table = random_table(layer)
    resized = numpy(layer.resized_embeddings((3, 2, 4), interpolation))
    expected = numpy(
        ops.resize_grid(table[:-3], (3, 3, 5), (5, 3, 7), interpolation)
    )
    np.testing.assert_allclose(resized[:-3], expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(resized[-3:], table[-3:])
    same = numpy(layer.resized_embeddings((2, 2, 3)))
    np.testing.assert_allclose(same, table, rtol=0, atol=1e-6)
    larger = GridRelativePositionBias(HEADS, (3, 2, 4), num_prefix_tokens=1)
    larger.build()
    larger.embeddings.assign(resized)


def test_table_is_float32_under_mixed_precision():
    layer = GridRelativePositionBias(HEADS, (2, 2), dtype="mixed_bfloat16")
    positions = grid((2, 2))
    bias = layer(positions, positions)
    assert layer.embeddings.dtype == "float32"
    assert dtype_of(bias) == "float32"


class GridRelativePositionBiasLayerTest(TestCase):
    def test_run_layer_test(self):
        for kwargs in (
            {"grid_shape": (2, 3)},
            {"grid_shape": (2, 2, 2), "num_prefix_tokens": 1},
        ):
            axes = len(kwargs["grid_shape"])
            self.run_layer_test(
                GridRelativePositionBias,
                init_kwargs={"num_heads": HEADS, **kwargs},
                input_shape={
                    "query_positions_shape": (2, 5, axes),
                    "key_positions_shape": (2, 6, axes),
                },
                input_dtype={
                    "query_positions_shape": "int32",
                    "key_positions_shape": "int32",
                },
                expected_output_shape=(
                    2,
                    HEADS,
                    5 + kwargs.get("num_prefix_tokens", 0),
                    6 + kwargs.get("num_prefix_tokens", 0),
                ),
                expected_output_dtype="float32",
                expected_num_trainable_weights=1,
                # The harness fits a model that passes the inputs' dict as
                # one argument; the layer takes two. Training is tested
                # below, inside attention.
                run_training_check=False,
            )


# The attention.


def grid_attention(position, seed=1, **kwargs):
    """A built attention with `position` whose weights, tables too, are random."""
    layer = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position, **kwargs)
    layer.build((None, None, FEATURES), (None, None, FEATURES))
    randomize_weights(layer, seed)
    return layer


def assert_grid_bias_attention(
    layer, tokens, window, positions, num_prefix_tokens, output, weights
):
    """Check `layer`'s output and weights against float64 with Swin's bias.

    Returns:
        The reference output.
    """
    table = np.asarray(numpy(layer.position.embeddings.value), "float64")
    expected_output, expected_weights = reference_attention(
        layer,
        tokens,
        tokens,
        logits_bias=references.grid_relative_position_bias(
            table, window, positions, positions, num_prefix_tokens
        ),
    )
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)
    return expected_output


@pytest.mark.parametrize("num_prefix_tokens", [0, 1])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "per-batch"])
def test_attention_with_grid_bias_equals_float64_reference(num_prefix_tokens, shared):
    window = (2, 3)
    layer = grid_attention(
        GridRelativePositionBias(HEADS, window, num_prefix_tokens=num_prefix_tokens)
    )
    # A grid larger than the window: clipped offsets.
    positions = grid((3, 3), BATCH).copy()
    if not shared:
        positions[1] = positions[1][::-1]
    tokens = random_inputs((BATCH, num_prefix_tokens + 9, FEATURES))
    output, weights = layer(
        tokens,
        tokens,
        query_positions=positions[0] if shared else positions,
        key_positions=positions[0] if shared else positions,
        return_attention_scores=True,
    )
    assert_grid_bias_attention(
        layer, tokens, window, positions, num_prefix_tokens, output, weights
    )


def test_cross_attention_between_two_grids():
    window = (2, 2)
    layer = grid_attention(GridRelativePositionBias(HEADS, window))
    table = np.asarray(numpy(layer.position.embeddings.value), "float64")
    query = random_inputs((BATCH, 4, FEATURES), seed=2)
    value = random_inputs((BATCH, 6, FEATURES), seed=3)
    query_positions, key_positions = grid((2, 2), BATCH), grid((2, 3), BATCH)
    output = layer(
        query, value, query_positions=grid((2, 2)), key_positions=grid((2, 3))
    )
    expected, _ = reference_attention(
        layer,
        query,
        value,
        logits_bias=references.grid_relative_position_bias(
            table, window, query_positions, key_positions
        ),
    )
    assert_close(output, expected)


def test_attention_with_grid_rotary_equals_float64_reference():
    position = RotaryEmbedding(max_wavelength=100.0, num_axes=2, num_prefix_tokens=1)
    layer = grid_attention(position)
    positions = grid((2, 3), BATCH)
    tokens = random_inputs((BATCH, 7, FEATURES))
    output, weights = layer(
        tokens,
        tokens,
        query_positions=grid((2, 3)),
        key_positions=grid((2, 3)),
        return_attention_scores=True,
    )
    theta = references.axial_rope_frequencies(KEY_DIM, 2, base=100.0)

    def rotate(queries, keys):
        return tuple(
            references.grid_rotary(x, positions, theta, num_prefix_tokens=1)
            for x in (queries, keys)
        )

    expected_output, expected_weights = reference_attention(
        layer, tokens, tokens, transform_query_key=rotate
    )
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


class GridStub(AttentionPosition):
    """Two axes, a prefix token: records the positions it is given."""

    num_axes = 2
    num_prefix_tokens = 1

    def transform_query_key(self, query, key, context):
        self.seen = (
            tuple(query.shape),
            tuple(context.query_positions.shape),
            keras.backend.standardize_dtype(context.query_positions.dtype),
        )
        return query, key


def test_positions_reach_the_scheme_as_int32_batch_sequence_axes():
    layer = grid_attention(GridStub())
    tokens = random_inputs((BATCH, 7, FEATURES))
    layer(tokens, tokens, query_positions=grid((2, 3)), key_positions=grid((2, 3)))
    assert layer.position.seen == ((BATCH, 7, HEADS, KEY_DIM), (1, 6, 2), "int32")
    layer(
        tokens,
        tokens,
        query_positions=grid((2, 3), BATCH).astype("int64"),
        key_positions=grid((2, 3), BATCH),
    )
    assert layer.position.seen[1:] == ((BATCH, 6, 2), "int32")


@tensorflow_only  # one trace for two sizes: TensorFlow's unknown shapes
def test_grid_attention_traces_once_for_two_grid_sizes_under_xla():
    import tensorflow as tf

    layer = grid_attention(GridRelativePositionBias(HEADS, (2, 2), num_prefix_tokens=1))

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, None, FEATURES)),
            tf.TensorSpec((None, 2), tf.int32),
        ],
        jit_compile=True,
    )
    def attend(tokens, positions):
        return layer(tokens, tokens, query_positions=positions, key_positions=positions)

    for grid_shape in [(2, 2), (3, 4)]:
        cells = int(np.prod(grid_shape))
        tokens = random_inputs((BATCH, 1 + cells, FEATURES))
        positions = grid(grid_shape).astype("int32")
        expected = layer(
            tokens, tokens, query_positions=positions, key_positions=positions
        )
        assert_close(attend(tokens, positions), numpy(expected).astype("float64"))
    assert attend.experimental_get_tracing_count() == 1


def grid_model(position):
    """Attention on `(batch, tokens, features)` with grid positions, then a Dense."""
    tokens = keras.Input((None, FEATURES))
    positions = keras.Input((None, 2), dtype="int32")
    attended = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)(
        tokens, tokens, query_positions=positions, key_positions=positions
    )
    return keras.Model([tokens, positions], keras.layers.Dense(2)(attended))


def test_model_trains_under_xla_at_two_grid_sizes_and_round_trips(tmp_path):
    keras.utils.set_random_seed(0)
    model = grid_model(GridRelativePositionBias(HEADS, (2, 2), num_prefix_tokens=1))
    model.compile("adam", "mse", jit_compile=XLA)
    table = model.layers[-2].position.embeddings
    before = numpy(table.value).copy()
    for grid_shape in [(2, 2), (3, 3)]:
        cells = int(np.prod(grid_shape))
        tokens = random_inputs((4, 1 + cells, FEATURES))
        positions = np.broadcast_to(grid(grid_shape), (4, cells, 2)).astype("int32")
        model.fit(
            [tokens, positions], np.ones((4, 1 + cells, 2)), batch_size=2, verbose=0
        )
    assert not np.array_equal(numpy(table.value), before)
    path = tmp_path / "grid.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.layers[-2].position.get_config() == (
        model.layers[-2].position.get_config()
    )
    inputs = [tokens, positions]
    np.testing.assert_array_equal(
        loaded.predict(inputs, verbose=0), model.predict(inputs, verbose=0)
    )


def test_mixed_bfloat16_attention_is_close_to_float64():
    window = (2, 2)
    layer = grid_attention(
        GridRelativePositionBias(HEADS, window, dtype="mixed_bfloat16"),
        dtype="mixed_bfloat16",
    )
    table = np.asarray(numpy(layer.position.embeddings.value), "float64")
    tokens = random_inputs((BATCH, 4, FEATURES))
    _, weights = layer(
        tokens,
        tokens,
        query_positions=grid(window),
        key_positions=grid(window),
        return_attention_scores=True,
    )
    _, expected = reference_attention(
        layer,
        tokens,
        tokens,
        logits_bias=references.grid_relative_position_bias(
            table, window, grid(window, BATCH), grid(window, BATCH)
        ),
    )
    assert dtype_of(weights) == "bfloat16"
    # bfloat16 projections and weights: a few bfloat16 ulps.
    assert_close(weights, expected, atol=0.03)


# Errors.


def test_causal_mask_needs_one_axis():
    layer = grid_attention(GridRelativePositionBias(HEADS, (2, 2)))
    tokens = random_inputs((1, 4, FEATURES))
    positions = grid((2, 2))
    with pytest.raises(ValueError, match="causal mask.*one axis") as error:
        layer(
            tokens,
            tokens,
            query_positions=positions,
            key_positions=positions,
            use_causal_mask=True,
        )
    assert "use_causal_mask=True" in str(error.value)
    assert "num_axes=2" in str(error.value)
    # Symbolic calls too, before any data.
    inputs = keras.Input((4, FEATURES))
    with pytest.raises(ValueError, match="causal mask.*one axis"):
        layer(inputs, inputs, query_positions=positions, use_causal_mask=True)


@pytest.mark.newest
def test_sliding_window_needs_one_axis():
    with pytest.raises(ValueError, match="sliding window.*one axis") as error:
        PositionalMultiHeadAttention(
            HEADS,
            KEY_DIM,
            position=GridRelativePositionBias(HEADS, (2, 2)),
            sliding_window=2,
        )
    assert "sliding_window=2" in str(error.value)


def test_grid_positions_have_no_default():
    layer = grid_attention(GridRelativePositionBias(HEADS, (2, 2)))
    tokens = random_inputs((1, 4, FEATURES))
    with pytest.raises(ValueError, match=re.escape("grid_positions((h, w))")) as error:
        layer(tokens, tokens, query_positions=grid((2, 2)))
    assert "`key_positions` has no default" in str(error.value)


@pytest.mark.parametrize(
    "position",
    [
        lambda: GridRelativePositionBias(HEADS, (2, 3), num_prefix_tokens=1),
        lambda: RotaryEmbedding(num_axes=2, num_prefix_tokens=1),
    ],
    ids=["swin", "rope"],
)
def test_grid_shape_gives_queries_and_keys_the_grid_positions(position):
    layer = grid_attention(position())
    tokens = random_inputs((BATCH, 7, FEATURES))
    positions = ops.grid_positions((2, 3))
    expected = layer(tokens, tokens, query_positions=positions, key_positions=positions)
    assert_close(layer(tokens, tokens, grid_shape=(2, 3)), numpy(expected), atol=1e-6)


@pytest.mark.parametrize(
    "window, grid_shape, num_prefix_tokens",
    [((2, 3), (3, 4), 0), ((3,), (5,), 0), ((2, 2, 2), (3, 2, 4), 1), ((3, 3), (2, 3), 1)],
)
def test_grid_shape_reads_the_clipped_rows_of_its_cells(
    window, grid_shape, num_prefix_tokens
):
    # With `grid_shape` the rows come from the grid's axes, not from
    # position tensors: each axis clipped to the window, as Swin reads them.
    layer = grid_attention(
        GridRelativePositionBias(HEADS, window, num_prefix_tokens=num_prefix_tokens)
    )
    cells = int(np.prod(grid_shape))
    tokens = random_inputs((BATCH, num_prefix_tokens + cells, FEATURES))
    positions = grid(grid_shape, BATCH)  # (batch, cells, axes)
    output, weights = layer(
        tokens, tokens, grid_shape=grid_shape, return_attention_scores=True
    )
    expected_output = assert_grid_bias_attention(
        layer, tokens, window, positions, num_prefix_tokens, output, weights
    )
    # The same without the scores, on the kernel's own path.
    assert_close(layer(tokens, tokens, grid_shape=grid_shape), expected_output)


def test_grid_shape_in_a_functional_model_round_trips(tmp_path):
    tokens = keras.Input(shape=(1 + 6, FEATURES))
    attention = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=RotaryEmbedding(num_axes=2, num_prefix_tokens=1)
    )
    model = keras.Model(tokens, attention(tokens, tokens, grid_shape=(2, 3)))
    path = str(tmp_path / "grid.keras")
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    inputs = random_inputs((BATCH, 7, FEATURES))
    np.testing.assert_array_equal(numpy(restored(inputs)), numpy(model(inputs)))


def test_grid_shape_on_one_axis_is_the_default_positions():
    layer = grid_attention(AlibiBias(HEADS))
    tokens = random_inputs((BATCH, 5, FEATURES))
    assert_close(layer(tokens, tokens, grid_shape=(5,)), numpy(layer(tokens, tokens)))


@pytest.mark.parametrize(
    "position, call_kwargs, message",
    [
        (
            lambda: AlibiBias(HEADS),
            {"grid_shape": (2, 3)},
            r"one size per axis that AlibiBias.*RotaryEmbedding\(num_axes=2\)",
        ),
        (
            lambda: GridRelativePositionBias(HEADS, (2, 3)),
            {"grid_shape": (2, 3), "query_positions": grid((2, 3))},
            "pass `grid_shape` or `query_positions`, not both",
        ),
        (
            lambda: GridRelativePositionBias(HEADS, (2, 3)),
            {"grid_shape": (2, 0)},
            r"grid_shape=\(2, 0\)",
        ),
    ],
    ids=["one-axis-scheme", "with-positions", "empty-axis"],
)
def test_bad_grid_shape_raises_value_error_naming_it(position, call_kwargs, message):
    layer = grid_attention(position())
    tokens = random_inputs((BATCH, 6, FEATURES))
    with pytest.raises(ValueError, match=message):
        layer(tokens, tokens, **call_kwargs)


@pytest.mark.parametrize(
    "position",
    [
        lambda: AlibiBias(HEADS),
        lambda: RelativePositionBias(HEADS, num_buckets=8, max_distance=16),
        lambda: RelativePositionEmbedding(2),
        lambda: None,
    ],
    ids=["alibi", "t5", "shaw", "none"],
)
@pytest.mark.parametrize("batched", [False, True])
def test_one_axis_schemes_refuse_grid_positions_naming_themselves(position, batched):
    position = position()
    layer = grid_attention(position)
    tokens = random_inputs((BATCH, 6, FEATURES))
    positions = grid((2, 3), BATCH if batched else None)
    with pytest.raises(ValueError, match="takes positions of one axis") as error:
        layer(tokens, tokens, query_positions=positions, key_positions=positions)
    name = "without a `position`" if position is None else type(position).__name__
    assert name in str(error.value)
    assert "query_positions" in str(error.value)


@pytest.mark.parametrize(
    "call_kwargs, message",
    [
        ({"query_positions": grid((2, 3, 1))}, r"query_positions.*\(6, 3\)"),
        ({"key_positions": grid((2, 2))}, r"key_positions.*\(4, 2\)"),
        ({"query_positions": grid((2, 3)) + 0.5}, "query_positions.*float"),
    ],
    ids=["three-axes", "too-short", "float"],
)
def test_bad_grid_positions_raise_value_error_naming_them(call_kwargs, message):
    layer = grid_attention(GridRelativePositionBias(HEADS, (2, 2), num_prefix_tokens=1))
    tokens = random_inputs((BATCH, 7, FEATURES))
    kwargs = {"query_positions": grid((2, 3)), "key_positions": grid((2, 3))}
    with pytest.raises(ValueError, match=message):
        layer(tokens, tokens, **{**kwargs, **call_kwargs})


def test_inputs_shorter_than_the_prefix_raise_value_error():
    layer = grid_attention(GridRelativePositionBias(HEADS, (1,), num_prefix_tokens=3))
    tokens = random_inputs((1, 2, FEATURES))
    with pytest.raises(ValueError, match="at least the 3 prefix tokens"):
        layer(tokens, tokens)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 0}, "num_heads=0"),
        ({"grid_shape": (2, 0)}, r"grid_shape=\(2, 0\)"),
        ({"grid_shape": 4}, "grid_shape=4"),
        ({"grid_shape": (keras.ops.convert_to_tensor(2), 2)}, "grid_shape="),
        ({"num_prefix_tokens": -1}, "num_prefix_tokens=-1"),
        ({"num_prefix_tokens": True}, "num_prefix_tokens=True"),
        ({"embeddings_initializer": "spline"}, "embeddings_initializer='spline'"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    arguments = {"num_heads": HEADS, "grid_shape": (2, 2), **kwargs}
    with pytest.raises(ValueError, match=message):
        GridRelativePositionBias(**arguments)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"grid_shape": (3,)}, r"grid_shape=\(3,\)"),
        ({"grid_shape": (3, 0)}, r"grid_shape=\(3, 0\)"),
        ({"interpolation": "nearest"}, "interpolation='nearest'"),
        ({"antialias": 1}, "antialias=1"),
    ],
)
def test_bad_resize_arguments_raise_value_error_naming_them(kwargs, message):
    layer = GridRelativePositionBias(HEADS, (2, 2))
    layer.build()
    with pytest.raises(ValueError, match=message):
        layer.resized_embeddings(**{"grid_shape": (3, 3), **kwargs})


def test_resize_before_build_raises_value_error():
    with pytest.raises(ValueError, match="build"):
        GridRelativePositionBias(HEADS, (2, 2)).resized_embeddings((3, 3))


def test_heads_must_match_the_attention():
    with pytest.raises(ValueError, match="num_heads=3"):
        grid_attention(GridRelativePositionBias(3, (2, 2)))
