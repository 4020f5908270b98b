"""`keras_posenc.ops._backend`, the one module that asks the backend.

Each answer checked on whichever backend runs the suite (`make test`,
`make test-jax`, `make test-torch`), against NumPy where it computes.
"""

import warnings

import keras
import numpy as np
import pytest

from keras_posenc_lab.bench import compiled as compiled_program
from keras_posenc.ops import _backend
from tests.backend import BACKEND
from tests.backend import compiled
from tests.backend import numpy


def test_backend_is_keras_backend():
    assert _backend.backend() == BACKEND == keras.backend.backend()


@pytest.mark.parametrize(
    "dtype, integer", [("int32", True), ("uint8", True), ("float32", False), ("bool", False)]
)
def test_is_integer(dtype, integer):
    assert _backend.is_integer(keras.ops.zeros((2,), dtype)) is integer


def test_known_values_and_traced_ones():
    tensor = keras.ops.convert_to_tensor([1, 2, 3], "int32")
    assert not _backend.is_symbolic(tensor)
    np.testing.assert_array_equal(_backend.static_value(tensor), [1, 2, 3])
    np.testing.assert_array_equal(_backend.static_value([4, 5]), [4, 5])
    assert _backend.is_symbolic(keras.Input((3,)))
    assert _backend.static_value(keras.Input((3,))) is None
    assert _backend.executing_eagerly()

    seen = []

    def traced(x):
        seen.append(_backend.static_value(x))
        return x + 1

    np.testing.assert_array_equal(numpy(compiled(traced)(tensor)), [2, 3, 4])
    # Compiled by XLA (TensorFlow, JAX), the argument has no value as the
    # program is built; PyTorch runs the function eagerly.
    assert (seen[0] is None) == (BACKEND != "torch")


# JAX without 64-bit numbers has no int64 tensor.
@pytest.mark.parametrize(
    "dtype",
    ["int32", "float32", "bool", "bfloat16"] + (["int64"] if BACKEND != "jax" else []),
)
def test_a_known_value_is_read_without_a_warning(dtype):
    # Keras' conversion warns on PyTorch (its tensors' `__array__` lacks
    # NumPy 2's `copy` keyword), which a user's warnings-as-errors run
    # raises: setup.cfg's filters, which ignore Keras' own, are off here.
    tensor = keras.ops.convert_to_tensor([0, 1, 1], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = _backend.static_value(tensor)
    np.testing.assert_array_equal(value.astype("float32"), [0, 1, 1])


def test_checked_raises_at_once_where_the_condition_is_known():
    value = keras.ops.ones((2,))
    assert _backend.checked(value, keras.ops.ones((2,), "bool"), "never") is value
    with pytest.raises(ValueError, match="^`x` must be positive$"):
        _backend.checked(
            value, keras.ops.convert_to_tensor([True, False]), "`x` must be positive"
        )


def test_float32_matmuls_are_exact_on_the_cpu():
    # This suite runs on CPUs (CI has no accelerator).
    assert _backend.float32_matmul_is_exact()


def test_take_in_range_is_numpy_take():
    table = np.arange(12, dtype="float32").reshape(4, 3)
    indices = np.array([[3, 0], [1, 1]], "int32")
    np.testing.assert_array_equal(
        numpy(_backend.take_in_range(keras.ops.convert_to_tensor(table), indices)),
        table[indices],
    )


@pytest.mark.parametrize("queries, keys", [(3, 5), (0, 4), (2, 0)])
def test_take_rows_per_query_reads_each_querys_own_rows(queries, keys):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(2, queries, 7, 4)).astype("float32")
    rows = rng.integers(0, 7, size=(2, queries, keys)).astype("int32")
    expected = np.take_along_axis(values, rows[..., None], axis=2)  # (2, q, k, 4)
    found = _backend.take_rows_per_query(
        keras.ops.convert_to_tensor(values), keras.ops.convert_to_tensor(rows)
    )
    assert tuple(found.shape) == (2, queries, keys, 4)
    np.testing.assert_array_equal(numpy(found), expected)


@pytest.mark.parametrize("index_batch", [1, 2])
def test_take_along_last_axis_reads_broadcast_indices(index_batch):
    rng = np.random.default_rng(4)
    values = rng.normal(size=(2, 3, 5, 7)).astype("float32")
    indices = rng.integers(0, 7, size=(index_batch, 1, 5, 6)).astype("int32")
    expected = np.take_along_axis(
        values, np.broadcast_to(indices, (2, 3, 5, 6)), axis=-1
    )
    found = _backend.take_along_last_axis(
        keras.ops.convert_to_tensor(values), keras.ops.convert_to_tensor(indices)
    )
    assert tuple(found.shape) == (2, 3, 5, 6)
    np.testing.assert_array_equal(numpy(found), expected)


def test_count_below_counts_the_thresholds_below_each_entry():
    rng = np.random.default_rng(1)
    thresholds = rng.normal(size=(9,)).astype("float32")
    x = np.concatenate([rng.normal(size=(2, 3, 4)), np.full((2, 3, 1), thresholds[0])], -1)
    x = x.astype("float32")
    found = _backend.count_below(keras.ops.convert_to_tensor(thresholds), keras.ops.convert_to_tensor(x))
    expected = (thresholds < x[..., None]).sum(-1)  # a tie is not below
    np.testing.assert_array_equal(numpy(found), expected)


@pytest.mark.parametrize("batch", [1, 2])
def test_piecewise_linear_reads_each_heads_line_at_each_entry(batch):
    rng = np.random.default_rng(2)
    slopes, intercepts = rng.normal(size=(2, 3, 6)).astype("float32")  # (heads, intervals)
    interval = rng.integers(0, 6, size=(batch, 4, 5)).astype("int32")
    x = rng.normal(size=(batch, 4, 5)).astype("float32")
    found = _backend.piecewise_linear(*map(keras.ops.convert_to_tensor, (slopes, intercepts, interval, x)))
    heads = np.arange(3)[None, :, None, None]
    expected = (
        slopes.astype("float64")[heads, interval[:, None]] * x[:, None]
        + intercepts[heads, interval[:, None]]
    )  # (batch, heads, query, key)
    assert tuple(found.shape) == (batch, 3, 4, 5)
    np.testing.assert_allclose(numpy(found), expected, rtol=0, atol=1e-6)


def test_piecewise_linear_of_one_batch_entry_serves_the_logits_batch():
    # Lines read for a batch of 3 from one entry's intervals: each batch
    # entry's the same (on TensorFlow read once per entry, else broadcast).
    rng = np.random.default_rng(3)
    slopes, intercepts = rng.normal(size=(2, 3, 6)).astype("float32")  # (heads, intervals)
    interval = rng.integers(0, 6, size=(1, 4, 5)).astype("int32")
    x = rng.normal(size=(1, 4, 5)).astype("float32")
    found = _backend.piecewise_linear(
        *map(keras.ops.convert_to_tensor, (slopes, intercepts, interval, x)),
        batch_size=3,
    )
    heads = np.arange(3)[None, :, None, None]
    expected = (
        slopes.astype("float64")[heads, interval[:, None]] * x[:, None]
        + intercepts[heads, interval[:, None]]
    )  # (1, heads, query, key)
    assert found.shape[0] in (1, 3) and tuple(found.shape[1:]) == (3, 4, 5)
    np.testing.assert_allclose(
        np.broadcast_to(numpy(found), (3, 3, 4, 5)),
        np.broadcast_to(expected, (3, 3, 4, 5)),
        rtol=0,
        atol=1e-6,
    )


def test_dot_product_attention_needs_equal_head_sizes_on_jax_alone():
    assert _backend.dot_product_attention_needs_equal_head_sizes() == (BACKEND == "jax")


def test_fuses_attention_where_keras_attention_writes_no_logits():
    if BACKEND != "jax":
        assert not _backend.fuses_attention()
        return
    # The claim checked on this JAX: XLA compiles Keras' einsum path (the
    # scores asked for, then dropped) without a logits-sized result, at a
    # size it fuses (jaxlib 0.10.2 does not at 128 keys of 16 features).
    batch, length, heads, key_dim = 2, 256, 8, 64
    plain = keras.layers.MultiHeadAttention(heads, key_dim)
    hlo = compiled_program.optimized_hlo(
        lambda x: plain(x, x, return_attention_scores=True)[0],
        keras.random.normal((batch, length, heads * key_dim), seed=0),
    )
    writes = compiled_program.results_of_size(hlo, batch * heads * length * length)
    assert _backend.fuses_attention() == (writes == 0)


@pytest.mark.parametrize("shape", [(7,), (1, 33, 1, 32), (2, 0, 4)])
def test_computed_apart_is_the_same_bits(shape):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30, shape)).astype(
        "float32"
    )
    x.flat[:3] = [1.0, -1.0, 0.0][: x.size]
    found = numpy(compiled(_backend.computed_apart)(keras.ops.convert_to_tensor(x)))
    np.testing.assert_array_equal(found, x)
