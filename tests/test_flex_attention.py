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
    "swin-line": lambda: keras_posenc.GridRelativePositionBias(HEADS, (12,)),
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


@torch_only
@pytest.mark.parametrize("name", ["alibi", "t5", "fire"])
def test_flex_attention_cached_decoding(name, flex_on_the_cpu):
    import torch

    layer = built_scheme(name)
    inputs = tokens(length=140)
    slots = 144
    with torch.no_grad():
        expected = reference_output(layer, inputs, inputs, use_causal_mask=True)
        cache = keras.ops.zeros((BATCH, 2, slots, HEADS, KEY_DIM))
        # The prompt, then one token at a time into the cache's slots.
        prompt, cache = layer(
            inputs[:, :130], inputs[:, :130], cache=cache, cache_update_index=0,
            use_causal_mask=True,
        )
        outputs = [numpy(prompt)]
        for step in range(130, 140):
            token = inputs[:, step : step + 1]
            output, cache = layer(
                token, token, cache=cache, cache_update_index=step, use_causal_mask=True
            )
            outputs.append(numpy(output))
    assert len(flex_on_the_cpu) == 11 and all(o is not None for o in flex_on_the_cpu)
    np.testing.assert_allclose(
        np.concatenate(outputs, axis=1), expected, rtol=1e-4, atol=1e-4
    )


@torch_only
@pytest.mark.parametrize("name", ["alibi", "kerple"])
def test_flex_attention_grouped_heads(name, flex_on_the_cpu):
    import torch

    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, num_key_value_heads=2, position=SCHEMES[name]()
    )
    layer.build((1, 1, FEATURES), (1, 1, FEATURES))
    randomize_weights(layer, 3)
    inputs = tokens()
    with torch.no_grad():
        expected = reference_output(layer, inputs, inputs, use_causal_mask=True)
        actual = numpy(layer(inputs, inputs, use_causal_mask=True))
    assert flex_on_the_cpu and flex_on_the_cpu[0] is not None
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


@torch_only
def test_flex_attention_in_bfloat16_is_as_close_as_the_reference(flex_on_the_cpu):
    # Against the same weights in float32: FlexAttention's scores and bias
    # stay float32 inside, so its error is at most the reference path's,
    # whose logits are a product of bfloat16 heads.
    import torch

    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=SCHEMES["alibi"](), dtype="mixed_bfloat16"
    )
    exact = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=SCHEMES["alibi"]())
    for each in (layer, exact):
        each.build((1, 1, FEATURES), (1, 1, FEATURES))
    randomize_weights(layer, 3)
    exact.set_weights(layer.get_weights())
    inputs = tokens()
    with torch.no_grad():
        truth = numpy(exact(inputs, inputs, use_causal_mask=True))
        reference = reference_output(layer, inputs, inputs, use_causal_mask=True)
        actual = layer(inputs, inputs, use_causal_mask=True)
    assert flex_on_the_cpu[-1] is not None
    assert keras.backend.standardize_dtype(actual.dtype) == "bfloat16"
    flex_error = np.abs(numpy(actual).astype("float32") - truth).mean()
    reference_error = np.abs(reference.astype("float32") - truth).mean()
    assert flex_error <= 1.1 * reference_error, (flex_error, reference_error)
    # A few of bfloat16's steps (2 ** -8) of the outputs' size.
    assert flex_error < 2**-6 * np.abs(truth).mean()


@torch_only
def test_a_failing_flex_attention_falls_back_with_one_warning(
    flex_on_the_cpu, monkeypatch
):
    import torch
    from torch.nn.attention import flex_attention

    def fails(*args, **kwargs):
        raise RuntimeError("No valid triton configs. OutOfResources: out of resource")

    monkeypatch.setattr(flex_attention, "flex_attention", fails)
    monkeypatch.setattr(_backend, "_FLEX_FAILURES", set())
    layer = built_scheme("t5")
    inputs = tokens(length=40)
    with torch.no_grad():
        expected = reference_output(layer, inputs, inputs)
        with pytest.warns(
            RuntimeWarning, match="FlexAttention failed for RelativePositionBias"
        ) as caught:
            first = layer(inputs, inputs)
        first = numpy(first)
        assert len(caught) == 1 and "\n" not in str(caught[0].message)
        second = numpy(layer(inputs, inputs))  # no second try, no warning
    assert flex_on_the_cpu == [None, None]
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(second, expected, rtol=1e-5, atol=1e-5)


@torch_only
@pytest.mark.parametrize(
    "first, low, high", [(0, None, 0), (0, -99, 0), (5, -99, 99), (130, None, 0)]
)
def test_band_blocks_are_those_the_mask_empties_or_fills(first, low, high):
    # Each block of 128 queries and keys is empty, full or partial as the
    # mask over its entries says: the mask read entry by entry, in NumPy.
    import torch

    queries, keys = 300, 430
    block_mask = _backend._band_block_mask(
        None, queries, keys, torch.tensor(first), low, high, "cpu"
    )
    query = np.arange(queries)[:, None] + first
    key = np.arange(keys)[None, :]
    allowed = np.ones((queries, keys), bool)
    if low is not None:
        allowed &= key - query >= low
    if high is not None:
        allowed &= key - query <= high
    size = _backend.FLEX_BLOCK
    for row in range(-(-queries // size)):
        rows = allowed[row * size : (row + 1) * size]
        partial, full = set(), set()
        for column in range(-(-keys // size)):
            part = rows[:, column * size : (column + 1) * size]
            if part.all():
                full.add(column)
            elif part.any():
                partial.add(column)
        count = int(block_mask.kv_num_blocks[0, 0, row])
        full_count = int(block_mask.full_kv_num_blocks[0, 0, row])
        assert set(block_mask.kv_indices[0, 0, row, :count].tolist()) == partial
        assert set(block_mask.full_kv_indices[0, 0, row, :full_count].tolist()) == full


@torch_only
def test_paths_chosen_for_a_gpu():
    # The choice alone, from the capabilities of a GPU and of a CPU.
    attention = _attention_kernel.Attention(
        position=keras_posenc.AlibiBias(8),
        dropout=0.0,
        dropout_layer=None,
        flash_attention=False,
        sliding_window=None,
        scores_dtype="float32",
    )
    context = AttentionContext(
        query_positions=keras.ops.arange(4096, dtype="int32")[None],
        key_positions=keras.ops.arange(4096, dtype="int32")[None],
        consecutive=True,
    )
    gpu = _backend.Capabilities("torch", "gpu", fused=True, low_precision_fused=True)
    cpu = _backend.Capabilities("torch", "cpu", fused=True)
    flex = _backend.Capabilities(
        "torch", "gpu", fused=True, low_precision_fused=True, flex=True,
        flex_compiles=True, flex_trains=True,
    )

    def choose(dtype, capabilities):
        heads = keras.ops.zeros((4, 4096, 8, 64), dtype)
        return _attention_kernel.choose(
            attention, heads, heads, context, False, False, capabilities
        )

    assert choose("float32", flex) == ("flex", None)
    assert choose("bfloat16", flex) == ("flex", None)
    # Without FlexAttention, SDPA with blocks of 2 ** 25 bias entries on a
    # GPU, a few large launches; on the CPU blocks of 2 ** 22 entries.
    assert choose("float32", gpu) == ("fused_blocks", 2**25 // (8 * 4096))
    assert choose("float32", cpu) == ("fused_blocks", 2**22 // (8 * 4096))
    # bfloat16 heads go to SDPA on a GPU, to the float32 reference on a CPU.
    assert choose("bfloat16", gpu)[0] == "fused_blocks"
    assert choose("bfloat16", cpu)[0] == "reference_blocks"


@pytest.mark.parametrize("shifted", [False, True], ids=["grid", "shifted"])
def test_grid_score_bias_equals_logits_bias(shifted):
    # Swin's table read at each pair of cells of a 3 x 4 grid (keys shifted
    # off the window, past its clipping, where asked).
    position = keras_posenc.GridRelativePositionBias(HEADS, (3, 4))
    position.build_for_attention(HEADS, KEY_DIM, KEY_DIM)
    position.embeddings.assign(
        np.random.default_rng(0).normal(size=position.embeddings.shape)
    )
    cells = keras_posenc.ops.grid_positions((3, 4))  # (12, 2)
    context = AttentionContext(
        query_positions=keras.ops.cast(cells, "int32")[None],
        key_positions=keras.ops.cast(cells + (5 if shifted else 0), "int32")[None],
    )
    heads = keras.ops.zeros((1, 12, HEADS, KEY_DIM))
    expected = position.logits_bias(heads, heads, context)
    actual = whole(position.score_bias(heads, heads, context), 1, 12, 12)
    np.testing.assert_array_equal(numpy(actual), numpy(expected))



@torch_only
def test_flex_attention_on_a_grid(flex_on_the_cpu):
    import torch

    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=keras_posenc.GridRelativePositionBias(HEADS, (6, 8))
    )
    layer.build((1, 1, FEATURES), (1, 1, FEATURES))
    randomize_weights(layer, 3)
    inputs = tokens(length=48)
    with torch.no_grad():
        expected = reference_output(layer, inputs, inputs, grid_shape=(6, 8))
        actual = numpy(layer(inputs, inputs, grid_shape=(6, 8)))
    assert flex_on_the_cpu and flex_on_the_cpu[0] is not None
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
