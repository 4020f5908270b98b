import keras
import numpy as np
import pytest

from keras_posenc import PositionEmbedding
from tests import references
from tests.backend import BACKEND
from tests.backend import compiled
from tests.backend import graph_function
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_case import TestCase


class PositionEmbeddingLayerTest(TestCase):
    def test_layer_behaviour(self):
        for init_kwargs, expected_output_shape in [
            ({"sequence_length": 5}, (2, 5, 8)),
            (
                {"sequence_length": 9, "merge_mode": "concat", "output_dim": 3},
                (2, 5, 11),
            ),
            (
                {"sequence_length": 5, "merge_mode": None, "embeddings_initializer": "sinusoidal"},
                (2, 5, 8),
            ),
        ]:
            self.run_layer_test(
                PositionEmbedding,
                init_kwargs=init_kwargs,
                input_shape=(2, 5, 8),
                expected_output_shape=expected_output_shape,
                expected_num_trainable_weights=1,
                expected_num_non_trainable_weights=0,
                supports_masking=True,
            )


def embedded(layer, embeddings, **call_kwargs):
    """The layer's output and its table, as NumPy."""
    outputs = layer(embeddings, **call_kwargs)
    return numpy(outputs), numpy(layer.embeddings.value)


def test_adds_the_row_of_each_position():
    embeddings = np.random.default_rng(0).normal(size=(3, 6, 4)).astype("float32")
    outputs, table = embedded(PositionEmbedding(10), embeddings)
    assert table.shape == (10, 4)
    np.testing.assert_array_equal(outputs, embeddings + table[:6])


def test_sinusoidal_initializer_starts_from_the_paper_table():
    layer = PositionEmbedding(200, embeddings_initializer="sinusoidal", merge_mode=None)
    outputs, table = embedded(layer, np.zeros((1, 200, 9), "float32"))
    np.testing.assert_allclose(
        table, references.sinusoidal(np.arange(200), 9), atol=2e-5
    )
    np.testing.assert_array_equal(outputs[0], table)
    assert layer.get_config()["embeddings_initializer"] == "sinusoidal"


def test_keras_initializers_are_serialized():
    layer = PositionEmbedding(4, embeddings_initializer=keras.initializers.Constant(0.5))
    config = layer.get_config()
    rebuilt = PositionEmbedding.from_config(config)
    assert rebuilt.get_config() == config
    _, table = embedded(rebuilt, np.zeros((1, 4, 2), "float32"))
    np.testing.assert_array_equal(table, np.full((4, 2), 0.5, "float32"))


def test_start_index_and_explicit_positions():
    layer = PositionEmbedding(12, merge_mode=None)
    full, table = embedded(layer, np.zeros((2, 12, 3), "float32"))
    chunk = layer(
        np.zeros((2, 4, 3), "float32"),
        start_index=keras.ops.convert_to_tensor(8),
    )
    np.testing.assert_array_equal(numpy(chunk), full[:, 8:12])
    per_batch = np.array([[0, 0, 1, 2], [5, 6, 7, 8]])
    outputs = layer(np.zeros((2, 4, 3), "float32"), positions=per_batch)
    np.testing.assert_array_equal(numpy(outputs), table[per_batch])
    shared = layer(np.zeros((2, 3, 3), "float32"), positions=[11, 0, 4])
    np.testing.assert_array_equal(numpy(shared)[1], table[[11, 0, 4]])


def test_mixed_bfloat16_output_with_float32_table():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = PositionEmbedding(6, embeddings_initializer="sinusoidal")
    outputs = layer(np.ones((1, 6, 4), "float32"))
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    assert layer.embeddings.dtype == "float32"
    expected = 1.0 + references.sinusoidal(np.arange(6), 4)
    np.testing.assert_allclose(
        numpy(keras.ops.cast(outputs[0], "float32")), expected, atol=1e-2
    )


def test_positions_past_the_table_name_sequence_length():
    layer = PositionEmbedding(8)
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(np.zeros((1, 9, 4), "float32"))
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(np.zeros((1, 4, 4), "float32"), start_index=5)
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(
            np.zeros((1, 4, 4), "float32"),
            start_index=keras.ops.convert_to_tensor(5),
        )
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(np.zeros((1, 2, 4), "float32"), positions=[3, 8])
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(np.zeros((1, 2, 4), "float32"), positions=[-1, 0])


@pytest.mark.parametrize(
    "grid_shape, positions, outside",
    [
        (None, [0, 50, 3, -1], [False, True, False, True]),
        ((2, 3), [[0, 0], [2, 0], [1, 2], [0, -1]], [False, True, False, True]),
    ],
    ids=["line", "grid"],
)
def test_positions_outside_the_table_read_nan_rows_under_compiled_code(
    grid_shape, positions, outside
):
    # XLA drops the check and a JAX trace cannot raise: the rows show it.
    layer = PositionEmbedding(
        sequence_length=None if grid_shape else 8, grid_shape=grid_shape,
        merge_mode=None,
    )
    inputs = np.zeros((2, 4, 5), "float32")
    layer.build(inputs.shape)
    call = compiled(lambda x, p: layer(x, positions=p))
    if BACKEND == "torch":  # `compiled` runs it eagerly: an error
        with pytest.raises(ValueError, match="PositionEmbedding holds"):
            call(inputs, np.int32(positions))
        return
    outputs = numpy(call(inputs, np.int32(positions)))  # (batch, seq, dim)
    np.testing.assert_array_equal(np.isnan(outputs).all(-1), [outside] * 2)
    assert np.isfinite(outputs[:, ~np.array(outside)]).all()
    inside = np.int32(positions)[~np.array(outside)]
    expected = numpy(layer(inputs[:, :2], positions=inside))
    np.testing.assert_array_equal(outputs[:, ~np.array(outside)], expected)


@pytest.mark.parametrize("start", [6, -1, 9])
def test_start_index_past_the_table_reads_nan_rows_under_compiled_code(start):
    layer = PositionEmbedding(8, merge_mode=None)
    inputs = np.zeros((2, 4, 5), "float32")
    layer.build(inputs.shape)
    call = compiled(lambda x, s: layer(x, start_index=s))
    if BACKEND == "torch":
        with pytest.raises(ValueError, match="sequence_length=8"):
            call(inputs, np.int32(start))
        return
    # The slice cannot start there: every row is NaN, none another's.
    assert np.isnan(numpy(call(inputs, np.int32(start)))).all()
    np.testing.assert_array_equal(
        numpy(call(inputs, np.int32(3))), numpy(layer(inputs, start_index=3))
    )


def test_float_positions_are_refused():
    with pytest.raises(ValueError, match="integer `positions`"):
        PositionEmbedding(8)(np.zeros((1, 2, 4), "float32"), positions=[0.5, 1.5])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sequence_length": 0}, "sequence_length=0"),
        ({"sequence_length": None}, "sequence_length=None"),
        ({"sequence_length": 8.0}, "sequence_length=8.0"),
        ({"sequence_length": 8, "embeddings_initializer": "sine"}, "embeddings_initializer='sine'"),
        ({"sequence_length": 8, "merge_mode": "sum"}, "merge_mode='sum'"),
        ({"sequence_length": 8, "merge_mode": "concat"}, "output_dim=None"),
        ({"sequence_length": 8, "output_dim": 3}, "output_dim=3"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        PositionEmbedding(**kwargs)


def test_bad_input_rank_says_what_was_expected():
    with pytest.raises(ValueError, match=r"\(batch, sequence, features\)"):
        PositionEmbedding(8)(np.zeros((2, 8), "float32"))
    with pytest.raises(ValueError, match="features"):
        PositionEmbedding(8).build((2, 8, None))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_start_index_tensor_in_a_graph_with_unknown_length(jit_compile):
    layer = PositionEmbedding(12, merge_mode=None)
    full, _ = embedded(layer, np.zeros((2, 12, 3), "float32"))
    call = graph_function(
        lambda x, start: layer(x, start_index=start),
        [((None, None, 3), "float32"), ((), "int32")],
        jit_compile=jit_compile,
    )
    chunk = call(keras.ops.zeros((2, 5, 3)), keras.ops.convert_to_tensor(7, "int32"))
    np.testing.assert_array_equal(numpy(chunk), full[:, 7:12])


@tensorflow_only
def test_start_index_past_the_table_fails_in_a_graph():
    import tensorflow as tf

    layer = PositionEmbedding(8)
    call = tf.function(lambda x, start: layer(x, start_index=start))
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="sequence_length=8"
    ):
        call(tf.zeros((1, 4, 4)), tf.constant(5))


@tensorflow_only
def test_consecutive_positions_slice_the_table_under_xla():
    import tensorflow as tf

    # A gather of consecutive rows costs XLA a copy of them before the add.
    layer = PositionEmbedding(16)
    start = tf.Variable(2)  # read when the call runs
    for call, inputs in (
        (lambda x: layer(x), tf.zeros((2, 16, 4))),
        (lambda x: layer(x, start_index=start), tf.zeros((2, 8, 4))),
    ):
        hlo = tf.function(call, jit_compile=True).experimental_get_compiler_ir(
            inputs
        )(stage="optimized_hlo")
        assert " gather(" not in hlo
