"""Grouped-query attention: `num_key_value_heads` below `num_heads`.

Query head `n` reads key/value head `n // groups` (Ainslie et al. 2023, as
Keras' `GroupedQueryAttention` and Hugging Face's `repeat_kv` read them).
The float64 reference of `test_positional_multi_head_attention` indexes the
key and value heads so; the layer without a position is also compared with
Keras' own `GroupQueryAttention` given the same weights, and the schemes
tested elsewhere against their papers with the multi-head attention whose
key and value projections repeat each grouped head.
"""

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RotaryEmbedding
from keras_posenc_lab.bench import attention as bench_attention
from tests import references
from tests.backend import graph_function
from tests.backend import numpy
from tests.test_positional_multi_head_attention import BATCH
from tests.test_positional_multi_head_attention import FEATURES
from tests.test_positional_multi_head_attention import HEADS
from tests.test_positional_multi_head_attention import KEY_DIM
from tests.test_positional_multi_head_attention import LENGTH
from tests.test_positional_multi_head_attention import SCHEMES
from tests.test_positional_multi_head_attention import VALUE_DIM
from tests.test_positional_multi_head_attention import assert_close
from tests.test_positional_multi_head_attention import keras_mask
from tests.test_positional_multi_head_attention import per_batch
from tests.test_positional_multi_head_attention import project
from tests.test_positional_multi_head_attention import random_inputs
from tests.test_positional_multi_head_attention import randomize_weights
from tests.test_positional_multi_head_attention import reference_attention

SLOTS = 10
PREFILL = 4


def grouped(scheme, num_heads=HEADS, num_key_value_heads=1, seed=1, **kwargs):
    """A built grouped attention of the test sizes, every weight random."""
    layer = PositionalMultiHeadAttention(
        num_heads,
        KEY_DIM,
        position=SCHEMES[scheme](),
        num_key_value_heads=num_key_value_heads,
        **kwargs,
    )
    tokens = np.zeros((1, 1, FEATURES), "float32")
    layer(tokens, tokens)
    randomize_weights(layer, seed)
    return layer


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_one_key_value_head_equals_float64_reference(scheme, causal):
    # HEADS = 3: one key/value head serves every query head (multi-query).
    layer = grouped(scheme, value_dim=VALUE_DIM)
    assert tuple(layer.key_dense.kernel.shape) == (FEATURES, 1, KEY_DIM)
    assert tuple(layer.value_dense.kernel.shape) == (FEATURES, 1, VALUE_DIM)
    query = random_inputs((BATCH, 5, FEATURES), seed=2)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    mask = keras_mask((BATCH, 5, LENGTH))
    output, weights = layer(
        query,
        tokens,
        attention_mask=mask,
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    expected_output, expected_weights = reference_attention(
        layer, query, tokens, mask=mask, causal=causal
    )
    assert tuple(weights.shape) == (BATCH, HEADS, 5, LENGTH)
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


@pytest.mark.parametrize("scheme", ["none", "rotary"])
def test_two_groups_of_two_heads_equal_float64_reference(scheme):
    layer = grouped(scheme, num_heads=4, num_key_value_heads=2)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    output, weights = layer(tokens, tokens, return_attention_scores=True)
    expected_output, expected_weights = reference_attention(layer, tokens, tokens)
    # Heads 0 and 1 read key head 0, heads 2 and 3 key head 1: a reference
    # that paired them otherwise would give other weights.
    assert not np.allclose(expected_weights[:, 1], expected_weights[:, 2], atol=1e-3)
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


def test_without_position_it_is_keras_grouped_query_attention():
    layer = grouped("none", num_heads=4, num_key_value_heads=2, value_dim=VALUE_DIM)
    keras_layer = keras.layers.GroupQueryAttention(
        head_dim=KEY_DIM, num_query_heads=4, num_key_value_heads=2
    )
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    # Keras' layer has one head size: the values take the keys' here.
    same = grouped("none", num_heads=4, num_key_value_heads=2)
    keras_layer(tokens, tokens)
    for source, target in (
        (same.query_dense, keras_layer._query_dense),
        (same.key_dense, keras_layer._key_dense),
        (same.value_dense, keras_layer._value_dense),
        (same.output_dense, keras_layer._output_dense),
    ):
        for weight, keras_weight in zip(source.weights, target.weights):
            assert tuple(weight.shape) == tuple(keras_weight.shape)
            keras_weight.assign(weight.value)
    mask = keras_mask((BATCH, LENGTH, LENGTH))
    for causal in (False, True):
        expected = keras_layer(tokens, tokens, attention_mask=mask, use_causal_mask=causal)
        actual = same(tokens, tokens, attention_mask=mask, use_causal_mask=causal)
        assert_close(actual, numpy(expected).astype("float64"), atol=2e-6)
    # The weights in Keras' order: query, key, value, output.
    assert [w.path.split("/")[-2] for w in layer.weights] == [
        "query", "query", "key", "key", "value", "value",
        "attention_output", "attention_output",
    ]


# The schemes tested against their papers in their own files: grouped, each
# equals the multi-head attention whose key and value projections repeat
# each key/value head over its group. Each with the call it takes.
GRID = (2, 3)
OTHER_SCHEMES = {
    **{
        name: (lambda heads, name=name: bench_attention.position_layer(name, heads), {})
        for name in ("transformer_xl", "deberta", "kerple", "fire", "xpos", "cope")
    },
    "temperature": (
        lambda heads: keras_posenc.AttentionTemperature(floor_scale=2, attn_scale=0.5),
        {"use_causal_mask": True},
    ),
    "swin": (
        lambda heads: keras_posenc.GridRelativePositionBias(num_heads=heads, grid_shape=GRID),
        {"grid_shape": GRID},
    ),
    "graphormer": (
        lambda heads: keras_posenc.ShortestPathBias(num_heads=heads, max_hops=3),
        {"adjacency": "adjacency"},
    ),
}


def adjacency(size, seed=4):
    """Random undirected graphs of `size` nodes, a path through them all."""
    rng = np.random.default_rng(seed)
    edges = np.triu(rng.random((BATCH, size, size)) < 0.4, 1)
    edges |= np.eye(size, k=1, dtype=bool)[None]
    return (edges | np.transpose(edges, (0, 2, 1))).astype("float32")


@pytest.mark.parametrize("scheme", OTHER_SCHEMES)
def test_grouped_equals_multi_head_with_repeated_key_value_heads(scheme):
    heads, key_value_heads = 4, 2
    make_position, call_kwargs = OTHER_SCHEMES[scheme]
    tokens = random_inputs((BATCH, GRID[0] * GRID[1] if scheme in ("swin", "graphormer") else LENGTH, 8))
    call_kwargs = dict(call_kwargs)
    if scheme in bench_attention.CAUSAL_SCHEMES:
        call_kwargs["use_causal_mask"] = True
    if "adjacency" in call_kwargs:
        call_kwargs["adjacency"] = adjacency(tokens.shape[1])

    def built(num_key_value_heads):
        layer = PositionalMultiHeadAttention(
            heads,
            KEY_DIM,
            position=make_position(heads),
            num_key_value_heads=num_key_value_heads,
        )
        layer(tokens, tokens, **call_kwargs)
        return layer

    grouped_layer, multi_head = built(key_value_heads), built(None)
    randomize_weights(grouped_layer, seed=3)
    groups = heads // key_value_heads
    for source, target in zip(grouped_layer.weights, multi_head.weights):
        value = numpy(source.value)
        if tuple(source.shape) != tuple(target.shape):
            # A key or value kernel (features, kv, dim) or bias (kv, dim).
            axis = 1 if len(source.shape) == 3 else 0
            value = np.repeat(value, groups, axis=axis)
        target.assign(value)
    expected = numpy(multi_head(tokens, tokens, **call_kwargs))
    actual = grouped_layer(tokens, tokens, **call_kwargs)
    assert_close(actual, expected.astype("float64"), atol=2e-6)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cache_holds_the_key_value_heads_and_decodes_as_a_causal_pass(scheme):
    layer = grouped(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    expected, _ = reference_attention(layer, tokens, tokens, causal=True)
    cache = keras.ops.zeros((BATCH, 2, SLOTS, 1, KEY_DIM))
    output, cache = layer(
        tokens[:, :PREFILL],
        tokens[:, :PREFILL],
        cache=cache,
        cache_update_index=0,
        use_causal_mask=True,
    )
    assert_close(output, expected[:, :PREFILL])
    decode = graph_function(
        lambda token, cache, index: layer(
            token, token, cache=cache, cache_update_index=index, use_causal_mask=True
        ),
        input_signature=[
            ((None, 1, FEATURES), "float32"),
            ((None, 2, SLOTS, 1, KEY_DIM), "float32"),
            ((), "int32"),
        ],
        jit_compile=False,
    )
    for step in range(PREFILL, LENGTH):
        output, cache = decode(
            tokens[:, step : step + 1],
            cache,
            keras.ops.convert_to_tensor(step, "int32"),
        )
        assert_close(output, expected[:, step : step + 1], err_msg=f"step {step}")
    # One key/value head cached: the keys as the logits read them.
    keys = project(tokens, layer.key_dense)  # (batch, length, 1, key_dim)
    if scheme == "rotary":
        inverse_frequencies, _ = references.rope_inverse_frequencies(
            KEY_DIM, layer.position.max_wavelength
        )
        keys = references.rotary(
            keys, per_batch(None, BATCH, LENGTH), inverse_frequencies
        )
    assert_close(cache[:, 0, :LENGTH], keys)
    assert_close(cache[:, 1, :LENGTH], project(tokens, layer.value_dense))


def test_cache_of_query_heads_raises_value_error_naming_num_key_value_heads():
    layer = grouped("rotary")
    tokens = random_inputs((BATCH, 1, FEATURES))
    with pytest.raises(ValueError, match=r"num_key_value_heads.*\(batch, 2, slots, 1, 4\)"):
        layer(
            tokens,
            tokens,
            cache=np.zeros((BATCH, 2, SLOTS, HEADS, KEY_DIM), "float32"),
            cache_update_index=0,
        )


@pytest.mark.parametrize("value", [0, -1, 2, 1.0, True, "1"])
def test_bad_num_key_value_heads_raises_value_error_naming_it(value):
    with pytest.raises(ValueError, match=f"num_key_value_heads={value!r}"):
        PositionalMultiHeadAttention(HEADS, KEY_DIM, num_key_value_heads=value)


def test_grouped_heads_need_sequences_of_features():
    layer = PositionalMultiHeadAttention(4, KEY_DIM, num_key_value_heads=2)
    tokens = np.zeros((1, 2, 3, FEATURES), "float32")
    with pytest.raises(ValueError, match=r"query_shape=\(1, 2, 3, 5\)"):
        layer(tokens, tokens)
    with pytest.raises(ValueError, match=r"attention_axes=\(2,\)"):
        PositionalMultiHeadAttention(4, KEY_DIM, num_key_value_heads=2, attention_axes=(2,))


def test_config_and_keras_file_keep_the_groups(tmp_path):
    inputs = keras.Input((None, FEATURES))
    attention = PositionalMultiHeadAttention(
        4, KEY_DIM, position=RotaryEmbedding(), num_key_value_heads=2
    )
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    randomize_weights(model)
    assert attention.get_config()["num_key_value_heads"] == 2
    copy = PositionalMultiHeadAttention.from_config(attention.get_config())
    assert copy.num_key_value_heads == 2
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    path = tmp_path / "grouped.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    (loaded_attention,) = [
        layer for layer in loaded.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
    ]
    assert tuple(loaded_attention.key_dense.kernel.shape) == (FEATURES, 2, KEY_DIM)
    np.testing.assert_array_equal(numpy(loaded(tokens)), numpy(model(tokens)))


@pytest.mark.parametrize("scheme", ["none", "rotary", "alibi"])
def test_the_fused_kernel_reads_the_groups_where_nothing_else_reads_the_keys(
    scheme, monkeypatch
):
    # The backend's fused attention (PyTorch's SDPA, JAX's kernel) takes
    # the key/value heads as they are for a scheme that changes the queries
    # and keys only; a bias's scheme gets each head repeated over its group.
    from keras_posenc.ops import _backend

    seen = []
    fused = _backend.fused_attention

    def spy(query, key, value, **kwargs):
        seen.append((query.shape[2], key.shape[2], value.shape[2]))
        return fused(query, key, value, **kwargs)

    layer = grouped(scheme)
    monkeypatch.setattr(_backend, "fused_attention", spy)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    output = layer(tokens, tokens, use_causal_mask=True)
    expected, _ = reference_attention(layer, tokens, tokens, causal=True)
    assert_close(output, expected)
    if not _backend.has_fused_attention():
        assert seen == []
    elif scheme == "alibi":
        assert seen == [(HEADS, HEADS, HEADS)]
    else:
        assert seen == [(HEADS, 1, 1)]
