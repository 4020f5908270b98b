"""The schemes' bias entry by entry (`score_bias`), and FlexAttention with it.

A scheme's `score_bias` is what PyTorch's FlexAttention adds to each logit
inside its kernel. On every backend it is evaluated here on whole grids of
indices and compared with the scheme's `logits_bias`, with its gradients;
on PyTorch, FlexAttention runs eagerly on the CPU (its compiled kernels
are for GPUs) without a gradient, where it has no backward pass, and its
output is compared with the reference path's, under every mask.
"""

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc.layers import _attention_kernel
from keras_posenc.layers.attention_position import AttentionContext
from keras_posenc.ops import _backend
from tests.backend import BACKEND
from tests.backend import gradient_function
from tests.backend import numpy
from tests.test_positional_multi_head_attention import randomize_weights

HEADS = 4
KEY_DIM = 8
FEATURES = 16
BATCH = 2
# Past FlexAttention's blocks of 128: three blocks of queries, the last partial.
LENGTH = 300

SCHEMES = {
    "alibi": lambda: keras_posenc.AlibiBias(HEADS),
    "alibi-bidirectional": lambda: keras_posenc.AlibiBias(HEADS, bidirectional=True),
    "t5": lambda: keras_posenc.RelativePositionBias(HEADS, num_buckets=8, max_distance=20),
    "t5-unidirectional": lambda: keras_posenc.RelativePositionBias(
        HEADS, num_buckets=8, max_distance=20, bidirectional=False
    ),
    "kerple": lambda: keras_posenc.KerpleBias(HEADS),
    "kerple-power": lambda: keras_posenc.KerpleBias(HEADS, form="power"),
    "fire": lambda: keras_posenc.FireBias(HEADS, init_threshold=40.0),
    "fire-bidirectional": lambda: keras_posenc.FireBias(
        HEADS, init_threshold=40.0, bidirectional=True
    ),
}

# Per-batch positions, not consecutive, past T5's clipping and FIRE's threshold.
QUERY_POSITIONS = np.array([[0, 3, 4, 9, 20, 77], [40, 41, 47, 60, 61, 150]])
KEY_POSITIONS = np.array([[0, 1, 2, 5, 9, 13, 31], [30, 38, 40, 41, 55, 61, 70]])


def built_scheme(name, seed=3):
    layer = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=SCHEMES[name]())
    layer.build((1, 1, FEATURES), (1, 1, FEATURES))
    randomize_weights(layer, seed)
    return layer


def whole(function, batch, queries, keys):
    """`function` of pointwise indices on the whole grid, `(batch, heads, query, key)`."""

    def axis(size, place):
        shape = [1, 1, 1, 1]
        shape[place] = size
        return keras.ops.reshape(keras.ops.arange(size, dtype="int32"), shape)

    return keras.ops.broadcast_to(
        function(axis(batch, 0), axis(HEADS, 1), axis(queries, 2), axis(keys, 3)),
        (batch, HEADS, queries, keys),
    )


def contexts():
    consecutive = AttentionContext(
        query_positions=keras.ops.arange(9, dtype="int32")[None],
        key_positions=keras.ops.arange(9, dtype="int32")[None],
        consecutive=True,
    )
    decoding = AttentionContext(
        query_positions=keras.ops.arange(60, 63, dtype="int32")[None],
        key_positions=keras.ops.arange(64, dtype="int32")[None],
        consecutive=True,
        causal=True,
    )
    scattered = AttentionContext(
        query_positions=keras.ops.convert_to_tensor(QUERY_POSITIONS, "int32"),
        key_positions=keras.ops.convert_to_tensor(KEY_POSITIONS, "int32"),
    )
    return {"consecutive": consecutive, "decoding": decoding, "scattered": scattered}


@pytest.mark.parametrize("where", ["consecutive", "decoding", "scattered"])
@pytest.mark.parametrize("name", SCHEMES)
def test_score_bias_equals_logits_bias(name, where):
    position = built_scheme(name).position
    context = contexts()[where]
    queries = context.query_positions.shape[1]
    keys = context.key_positions.shape[1]
    heads = keras.ops.zeros((BATCH, queries, HEADS, KEY_DIM))
    key_heads = keras.ops.zeros((BATCH, keys, HEADS, KEY_DIM))
    expected = keras.ops.broadcast_to(
        position.logits_bias(heads, key_heads, context), (BATCH, HEADS, queries, keys)
    )
    actual = whole(position.score_bias(heads, key_heads, context), BATCH, queries, keys)
    assert keras.backend.standardize_dtype(actual.dtype) == "float32"
    np.testing.assert_allclose(numpy(actual), numpy(expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["t5", "kerple", "kerple-power", "fire"])
def test_score_bias_gradients_equal_logits_bias_gradients(name):
    # The weights' gradients through the bias entry by entry equal those
    # through the whole bias: what FlexAttention's backward pass takes.
    position = built_scheme(name).position
    context = contexts()["scattered"]
    queries = context.query_positions.shape[1]
    keys = context.key_positions.shape[1]
    heads = keras.ops.zeros((BATCH, queries, HEADS, KEY_DIM))
    key_heads = keras.ops.zeros((BATCH, keys, HEADS, KEY_DIM))
    weights = list(position.trainable_variables)
    values = [keras.ops.convert_to_tensor(numpy(weight)) for weight in weights]
    cotangent = keras.ops.convert_to_tensor(
        np.random.default_rng(0).normal(size=(BATCH, HEADS, queries, keys)), "float32"
    )

    def loss_of(bias_of):
        def loss(*values):
            with keras.StatelessScope(state_mapping=list(zip(weights, values))):
                return keras.ops.sum(bias_of() * cotangent)

        return loss

    expected = gradient_function(
        loss_of(lambda: position.logits_bias(heads, key_heads, context))
    )(*values)
    actual = gradient_function(
        loss_of(
            lambda: whole(
                position.score_bias(heads, key_heads, context), BATCH, queries, keys
            )
        )
    )(*values)
    assert len(actual) == len(expected) == len(weights) > 0
    for got, want, weight in zip(actual, expected, weights):
        np.testing.assert_allclose(
            numpy(got), numpy(want), rtol=1e-4, atol=1e-5, err_msg=weight.name
        )


torch_only = pytest.mark.torch_only


@pytest.fixture
def flex_on_the_cpu(monkeypatch):
    """FlexAttention taken where it fits, eagerly, as on a GPU it is compiled.

    Returns the list of what each FlexAttention call returned, None where
    it declined.
    """
    capabilities = _backend.capabilities()
    monkeypatch.setattr(
        _backend,
        "capabilities",
        lambda: _backend.Capabilities(
            backend=capabilities.backend,
            device=capabilities.device,
            fused=capabilities.fused,
            flex=True,
        ),
    )
    calls = []
    run = _backend.flex_attention

    def spy(*args, **kwargs):
        calls.append(run(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(_backend, "flex_attention", spy)
    return calls


def reference_output(layer, *args, **kwargs):
    """The layer's output on the reference path, its bias whole."""
    choose = _attention_kernel.choose
    _attention_kernel.choose = lambda *a, **k: ("reference", None)
    try:
        return numpy(layer(*args, **kwargs))
    finally:
        _attention_kernel.choose = choose


def tokens(length=LENGTH, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(BATCH, length, FEATURES)).astype("float32")


MASKS = ["none", "causal", "padding", "window"]


@torch_only
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("name", SCHEMES)
def test_flex_attention_equals_the_reference(name, masks, flex_on_the_cpu):
    import torch

    arguments = {}
    if masks == "causal":
        arguments["use_causal_mask"] = True
    if masks == "padding":
        # Key padding per batch entry, and one query that sees no key.
        padding = np.ones((BATCH, LENGTH, LENGTH), bool)
        padding[0, :, 250:] = False
        padding[1, 7] = False
        arguments["attention_mask"] = padding
    layer_arguments = {}
    if masks == "window":
        # Keras' `sliding_window` (3.15 on): PyTorch's tests run the newest.
        layer_arguments["sliding_window"] = 100
        arguments["use_causal_mask"] = True
    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=SCHEMES[name](), **layer_arguments
    )
    layer.build((1, 1, FEATURES), (1, 1, FEATURES))
    randomize_weights(layer, 3)
    inputs = tokens()
    with torch.no_grad():
        expected = reference_output(layer, inputs, inputs, **arguments)
        actual = numpy(layer(inputs, inputs, **arguments))
    assert len(flex_on_the_cpu) == 1 and flex_on_the_cpu[0] is not None
    # float32 sums over 300 keys, in another order than the reference.
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
