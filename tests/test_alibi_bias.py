"""AlibiBias against float64 references, keras-hub and cached decoding."""

import keras
import keras_hub
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from keras_posenc import AlibiBias
from tests import references
from tests.backend import compiled
from tests.backend import numpy
from tests.test_case import TestCase
from keras_posenc.layers.attention_position import AttentionContext

# The float32 slope is 2 ** x rounded once, then multiplied by an exact
# integer distance and rounded again: two half ulps.
BIAS_RTOL = 2.0**-23


def reference_bias(query_positions, key_positions, slopes, bidirectional):
    """-m_h (i - j), or -m_h |i - j|, one logit at a time, in float64.

    Positions are `(batch or 1, seq)`; returns `(batch, heads, query, key)`.
    """
    query_positions = np.atleast_2d(query_positions)
    key_positions = np.atleast_2d(key_positions)
    batch = max(len(query_positions), len(key_positions))
    bias = np.zeros(
        (batch, len(slopes), query_positions.shape[1], key_positions.shape[1])
    )
    for b, h, i, j in np.ndindex(bias.shape):
        query = query_positions[b % len(query_positions), i]
        key = key_positions[b % len(key_positions), j]
        if bidirectional:
            bias[b, h, i, j] = -slopes[h] * abs(int(query) - int(key))
        else:
            bias[b, h, i, j] = -slopes[h] * (int(query) - int(key))
    return bias


def assert_bias(bias, expected):
    assert keras.backend.standardize_dtype(bias.dtype) == "float32"
    assert tuple(bias.shape) == expected.shape
    np.testing.assert_allclose(numpy(bias), expected, rtol=BIAS_RTOL, atol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("num_heads", [1, 3, 8, 12])
def test_bias_is_slope_times_distance(num_heads, bidirectional):
    positions = np.arange(9)[None]
    bias = AlibiBias(num_heads, bidirectional=bidirectional)(positions, positions)
    assert_bias(
        bias,
        reference_bias(
            positions, positions, references.alibi_slopes(num_heads), bidirectional
        ),
    )


def test_causal_and_symmetric_agree_on_earlier_keys_only():
    positions = np.arange(6)
    causal = numpy(AlibiBias(4)(positions, positions))[0]  # (heads, T, S)
    bidirectional = numpy(AlibiBias(4, bidirectional=True)(positions, positions))[0]
    earlier = np.tril(np.ones((6, 6), bool))
    np.testing.assert_array_equal(causal[:, earlier], bidirectional[:, earlier])
    # Later keys: a growing reward in the causal form, a penalty otherwise.
    assert np.all(causal[:, ~earlier] > 0)
    np.testing.assert_array_equal(bidirectional, bidirectional.transpose(0, 2, 1))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_cached_decoding_query_at_ten_against_keys_zero_to_ten(bidirectional):
    layer = AlibiBias(8, bidirectional=bidirectional)
    full = layer(np.arange(11)[None], np.arange(11)[None])
    step = layer(np.array([[10]]), np.arange(11)[None])
    assert tuple(step.shape) == (1, 8, 1, 11)
    step, full = numpy(step), numpy(full)
    np.testing.assert_array_equal(step[:, :, 0], full[:, :, 10])
    slopes = references.alibi_slopes(8)
    assert_bias(step, reference_bias([[10]], [np.arange(11)], slopes, bidirectional))
    # Not the bias of a query at position 0.
    assert not np.allclose(step[:, :, 0], full[:, :, 0])


@pytest.mark.parametrize("bidirectional", [False, True])
def test_positions_per_batch(bidirectional):
    # Left padding in the first row, a packed second sequence in the second.
    query_positions = np.array([[0, 0, 0, 1, 2], [0, 1, 2, 0, 1]])
    key_positions = np.array([[0, 0, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2]])
    slopes = [0.5, 0.125, 3.0]
    bias = AlibiBias(3, bidirectional=bidirectional, slopes=slopes)(
        query_positions, key_positions
    )
    assert_bias(
        bias, reference_bias(query_positions, key_positions, slopes, bidirectional)
    )


def test_shared_positions_broadcast_against_per_batch_ones():
    key_positions = np.array([[0, 1, 2, 3], [5, 6, 7, 8], [0, 2, 4, 6]])
    layer = AlibiBias(2, bidirectional=True)
    bias = layer(np.array([3, 4]), key_positions)
    assert tuple(bias.shape) == (3, 2, 2, 4)
    assert_bias(
        bias,
        reference_bias([[3, 4]], key_positions, references.alibi_slopes(2), True),
    )


@settings(deadline=None, max_examples=25)
@given(
    shift=st.integers(-(10**6), 10**6),
    bidirectional=st.booleans(),
    num_heads=st.integers(1, 16),
)
def test_shifting_all_positions_changes_nothing(shift, bidirectional, num_heads):
    layer = AlibiBias(num_heads, bidirectional=bidirectional)
    positions = np.array([[0, 3, 4, 9, 30]])
    np.testing.assert_array_equal(
        numpy(layer(positions + shift, positions + shift)),
        numpy(layer(positions, positions)),
    )


def test_logits_bias_is_the_call_and_ignores_the_query():
    layer = AlibiBias(4)
    layer.build_for_attention(4, 16, 8)
    assert layer.built
    query_positions = keras.ops.convert_to_tensor(np.array([[7, 8, 9]], "int32"))
    key_positions = keras.ops.arange(10, dtype="int32")[None]
    query = keras.random.normal((1, 3, 4, 16))
    bias = layer.logits_bias(query, None, AttentionContext(query_positions=query_positions, key_positions=key_positions))
    np.testing.assert_array_equal(
        numpy(bias), numpy(layer(query_positions, key_positions))
    )
    assert layer.transform_query_key(query, query, AttentionContext(query_positions=None, key_positions=None)) == (query, query)
    assert layer.value_term(None, AttentionContext(query_positions=query_positions, key_positions=key_positions)) is None


def test_num_heads_must_equal_the_attentions():
    layer = AlibiBias(4)
    layer.check_attention(4, 16, 16)
    for call in (layer.check_attention, layer.build_for_attention):
        with pytest.raises(
            ValueError, match="num_heads=4 for attention with num_heads=8"
        ):
            call(8, 16, 16)
    assert not layer.built


def test_keras_hub_is_the_causal_form_and_no_encoder_bias():
    # keras-hub adds m (j - (S - 1)): off from m (j - i) by a constant per
    # query, which the softmax ignores, masked or not.
    num_heads, length = 6, 7
    scores = np.random.default_rng(0).normal(size=(2, num_heads, length, length))
    positions = np.arange(length)
    hub = numpy(
        keras.ops.softmax(keras_hub.layers.AlibiBias()(scores.astype("float32")))
    )
    causal = numpy(AlibiBias(num_heads)(positions, positions))
    np.testing.assert_allclose(
        numpy(keras.ops.softmax(scores + causal)), hub, rtol=1e-5, atol=1e-7
    )
    # Unmasked, it favours the last keys where the encoder form favours the
    # near ones.
    bidirectional = numpy(AlibiBias(num_heads, bidirectional=True)(positions, positions))
    assert not np.allclose(
        numpy(keras.ops.softmax(scores + bidirectional)), hub, atol=1e-3
    )


def test_mixed_bfloat16_keeps_the_bias_in_float32():
    positions = np.arange(4000, 4010)[None]
    expected = AlibiBias(5, bidirectional=True)(positions, np.arange(10)[None])
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = AlibiBias(5, bidirectional=True)
    assert layer.compute_dtype == "bfloat16"
    bias = layer(positions, np.arange(10)[None])
    assert keras.backend.standardize_dtype(bias.dtype) == "float32"
    np.testing.assert_array_equal(numpy(bias), numpy(expected))
    symbolic = layer(
        keras.Input((None,), dtype="int32"), keras.Input((None,), dtype="int32")
    )
    assert symbolic.dtype == "float32"


def test_xla_at_two_lengths():
    layer = AlibiBias(3, bidirectional=True)
    call = compiled(layer)
    for length in (3, 11):
        positions = keras.ops.arange(length, dtype="int32")[None] + 100
        np.testing.assert_array_equal(
            numpy(call(positions, positions)),
            numpy(layer(positions, positions)),
        )


def alibi_model(**kwargs):
    query_positions = keras.Input((None,), dtype="int32")
    key_positions = keras.Input((None,), dtype="int32")
    bias = AlibiBias(**kwargs)(query_positions, key_positions)
    return keras.Model([query_positions, key_positions], bias)


def test_symbolic_shapes_in_a_functional_model():
    model = alibi_model(num_heads=4)
    assert tuple(model.output.shape) == (None, 4, None, None)
    assert model.output.dtype == "float32"
    layer = AlibiBias(2)
    assert layer.compute_output_shape((3, 5), (1, 7)) == (3, 2, 5, 7)
    assert layer.compute_output_shape((5,), (7,)) == (1, 2, 5, 7)


def test_keras_file_round_trip_is_bit_identical(tmp_path):
    model = alibi_model(num_heads=3, bidirectional=True, slopes=[0.3, 0.2, 0.1])
    path = tmp_path / "alibi.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    (layer,) = [layer for layer in loaded.layers if isinstance(layer, AlibiBias)]
    assert layer.get_config()["slopes"] == [0.3, 0.2, 0.1]
    inputs = [np.array([[5, 6, 7], [0, 1, 2]]), np.arange(8)[None].repeat(2, 0)]
    expected = model.predict(inputs, verbose=0)
    np.testing.assert_array_equal(loaded.predict(inputs, verbose=0), expected)
    np.testing.assert_allclose(
        expected,
        reference_bias(inputs[0], inputs[1], [0.3, 0.2, 0.1], True),
        rtol=BIAS_RTOL,
    )


class AlibiBiasSerializationTest(TestCase):
    def test_config_and_serialization_round_trip(self):
        for kwargs in (
            {"num_heads": 8},
            {"num_heads": 3, "bidirectional": True},
            {"num_heads": 2, "slopes": (0.5, 1)},
        ):
            layer = AlibiBias(**kwargs, name="alibi")
            revived = self.run_class_serialization_test(layer)
            self.assertEqual(revived.get_config(), layer.get_config())
            positions = np.arange(5)
            np.testing.assert_array_equal(
                numpy(revived(positions, positions)),
                numpy(layer(positions, positions)),
            )

    def test_get_config_holds_every_argument(self):
        config = AlibiBias(2, bidirectional=True, slopes=(0.5, 1)).get_config()
        self.assertEqual(config["num_heads"], 2)
        self.assertEqual(config["bidirectional"], True)
        self.assertEqual(config["slopes"], [0.5, 1.0])
        self.assertIsNone(AlibiBias(2).get_config()["slopes"])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 0}, "num_heads=0"),
        ({"num_heads": -2}, "num_heads=-2"),
        ({"num_heads": 2.0}, "num_heads=2.0"),
        ({"num_heads": True}, "num_heads=True"),
        ({"num_heads": None}, "num_heads=None"),
        ({"num_heads": 2, "bidirectional": 1}, "bidirectional=1"),
        ({"num_heads": 2, "bidirectional": "yes"}, "bidirectional='yes'"),
        ({"num_heads": 2, "slopes": [0.5]}, r"slopes=\[0\.5\]"),
        ({"num_heads": 2, "slopes": [0.5, 0.0]}, r"slopes=\[0\.5, 0\.0\]"),
        ({"num_heads": 2, "slopes": [0.5, -1]}, r"slopes=\[0\.5, -1\]"),
        ({"num_heads": 2, "slopes": [0.5, float("nan")]}, "slopes=.*nan"),
        ({"num_heads": 2, "slopes": [0.5, float("inf")]}, "slopes=.*inf"),
        ({"num_heads": 2, "slopes": [0.5, True]}, "slopes=.*True"),
        ({"num_heads": 2, "slopes": [0.5, "1"]}, "slopes=.*'1'"),
        ({"num_heads": 2, "slopes": 0.5}, "slopes=0.5"),
        ({"num_heads": 2, "slopes": np.ones(2)}, "slopes=array"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AlibiBias(**kwargs)


@pytest.mark.parametrize(
    "query_positions, key_positions, message",
    [
        (np.zeros((1, 3)), np.zeros((1, 3), "int32"), "query_positions of dtype"),
        (
            np.zeros((1, 3), "int32"),
            np.zeros((1, 1, 3), "int32"),
            r"key_positions .* shape \(1, 1, 3\)",
        ),
        (
            np.zeros((2, 3), "int32"),
            np.zeros((3, 3), "int32"),
            "same batch size",
        ),
    ],
)
def test_bad_positions_say_what_was_expected(query_positions, key_positions, message):
    with pytest.raises(ValueError, match=message):
        AlibiBias(2)(query_positions, key_positions)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_bias_inside_attention_is_exact_far_from_zero(bidirectional):
    # Inside attention (a query given) the bias may be computed as a float32
    # difference of the positions (`_backend.fuses_attention`); counted from
    # the first query, it stays exact where float32 positions would not be
    # (multiples of 64 from 2 ** 30).
    layer = AlibiBias(3, bidirectional=bidirectional)
    layer.build_for_attention(3, 4, 4)
    start = 2**30 + 5
    query_positions = np.array([[start + 7, start + 9], [start, start + 1]], "int32")
    key_positions = np.array([[start + k for k in range(10)]] * 2, "int32")
    query = keras.ops.zeros((2, 2, 3, 4))
    bias = layer.logits_bias(query, None, AttentionContext(query_positions=keras.ops.convert_to_tensor(query_positions), key_positions=keras.ops.convert_to_tensor(key_positions)))
    assert_bias(
        bias,
        reference_bias(query_positions, key_positions, references.alibi_slopes(3), bidirectional),
    )


def test_bias_inside_attention_without_queries_or_keys_is_empty():
    layer = AlibiBias(2)
    layer.build_for_attention(2, 4, 4)
    none = keras.ops.zeros((1, 0), "int32")
    some = keras.ops.arange(3, dtype="int32")[None]
    assert tuple(layer.logits_bias(keras.ops.zeros((1, 0, 2, 4)), None, AttentionContext(query_positions=none, key_positions=some)).shape) == (1, 2, 0, 3)
    assert tuple(layer.logits_bias(keras.ops.zeros((1, 3, 2, 4)), None, AttentionContext(query_positions=some, key_positions=none)).shape) == (1, 2, 3, 0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_kernels_fused_hint_changes_no_value(bidirectional):
    # Where the kernel says XLA fuses the attention whole, the distances
    # come from the positions' vectors in float32; exact all the same, far
    # from position 0.
    layer = AlibiBias(4, bidirectional=bidirectional)
    layer.build_for_attention(4, 16, 8)
    query_positions = np.array([[70000, 70001, 90000]], "int32")
    key_positions = np.array([[0, 69999, 70001, 100000, 2**24 - 1]], "int32")
    query = keras.random.normal((1, 3, 4, 16))
    expected = reference_bias(
        query_positions, key_positions, references.alibi_slopes(4), bidirectional
    )
    for fused in (False, True):
        context = AttentionContext(
            query_positions=keras.ops.convert_to_tensor(query_positions),
            key_positions=keras.ops.convert_to_tensor(key_positions),
            fused=fused,
        )
        assert_bias(layer.logits_bias(query, None, context), expected)
