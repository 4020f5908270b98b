"""PositionalMultiHeadAttention with every scheme, against float64 references.

Each scheme's outputs and attention weights are compared with a multi-head
attention written here in NumPy, one head, query and key at a time, from the
layer's own projection weights and the papers' formulas: RoPE rotates the
projected queries and keys (Su et al. 2021), ALiBi adds `-m (i - j)` or
`-m |i - j|` (Press et al. 2022), Shaw et al. (2018) add a^K to the keys and
a^V to the values, T5 adds a learned bias per bucket of `j - i` (Raffel et
al. 2020). Learned tables are filled with random values, so that a wrong
index shows.
"""

import functools
import json
import math
import re

import keras
import numpy as np
import pytest

from keras_posenc import AlibiBias
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RelativePositionBias
from keras_posenc import RelativePositionEmbedding
from keras_posenc import RotaryEmbedding
from keras_posenc_lab.bench import compiled as compiled_program
from keras_posenc.ops._backend import dot_product_attention_needs_equal_head_sizes
from tests import references
from tests.backend import BACKEND
from tests.backend import RUN_TIME_ERRORS
from tests.backend import compiled
from tests.backend import gradient_function
from tests.backend import gradients
from tests.backend import graph_function
from tests.backend import keras_mask as keras_mask_of
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.backend import XLA
from keras_posenc.layers.attention_position import AttentionContext

BATCH = 2
LENGTH = 7
# Not a power of two: ALiBi's slopes take the authors' interleaving rule.
HEADS = 3
KEY_DIM = 4
# Unlike KEY_DIM, so that Shaw's a^K and a^V cannot stand in for each other.
VALUE_DIM = 6
FEATURES = 5
VOCABULARY_SIZE = 10
# Shaw's clipping k: a sequence of 7 reaches past it.
SHAW_MAX_RELATIVE_POSITION = 2
# T5: distances of 0..6 fall in exact and logarithmic buckets. No integer
# distance sits on a bucket boundary, where float32 and float64 logs could
# disagree: below max_distance those are 4.47 (bidirectional) and 5.03,
# 6.32 and 7.95 (unidirectional); from 10 on all clip to the last bucket.
T5_BUCKETS = 8
T5_MAX_DISTANCE = 10
# Weights of this scale keep the logits of order 1: no softmax saturates.
WEIGHT_SCALE = 0.5

SCHEMES = {
    "none": lambda: None,
    "rotary": lambda: RotaryEmbedding(max_wavelength=100.0),
    "alibi": lambda: AlibiBias(HEADS),
    "alibi-bidirectional": lambda: AlibiBias(HEADS, bidirectional=True),
    "shaw": lambda: RelativePositionEmbedding(SHAW_MAX_RELATIVE_POSITION),
    "t5": lambda: RelativePositionBias(
        HEADS, num_buckets=T5_BUCKETS, max_distance=T5_MAX_DISTANCE
    ),
    "t5-unidirectional": lambda: RelativePositionBias(
        HEADS,
        num_buckets=T5_BUCKETS,
        max_distance=T5_MAX_DISTANCE,
        bidirectional=False,
    ),
}
POSITIONED = [scheme for scheme in SCHEMES if scheme != "none"]

# float32 projections, logits, softmax and sums of a few terms of order 1:
# a few ulps (6e-8) of values below 10 each.
FLOAT32_ATOL = 1e-5

# Per-batch positions, not contiguous, with distances from -70 to 70: past
# Shaw's clipping and into T5's logarithmic and last buckets.
QUERY_POSITIONS = np.array([[0, 3, 4, 9, 20], [40, 41, 47, 60, 61]])
KEY_POSITIONS = np.array([[0, 1, 2, 5, 9, 13, 31], [30, 38, 40, 41, 55, 61, 70]])
PERMUTATION = np.array([3, 0, 6, 1, 5, 2, 4])
# Keras' masked softmax gives a query with no key zero weights from 3.10 on,
# uniform weights before; this layer's own path gives zero weights.
KERAS_ZEROES_UNATTENDED = tuple(map(int, keras.version().split(".")[:2])) >= (3, 10)


def weight_named(layer, name):
    """The one weight of `layer` called `name`, as float64."""
    (weight,) = [weight for weight in layer.weights if weight.name == name]
    return np.asarray(numpy(weight.value), "float64")


def project(inputs, dense):
    """`inputs @ kernel + bias` of an EinsumDense projection, in float64."""
    kernel = np.asarray(numpy(dense.kernel.value), "float64")  # (features, heads, dim)
    bias = np.asarray(numpy(dense.bias.value), "float64")  # (heads, dim)
    return np.einsum("bsf,fnd->bsnd", inputs, kernel) + bias


def per_batch(positions, batch, length):
    """`positions` (default 0..length-1) broadcast to `(batch, length)`."""
    if positions is None:
        positions = np.arange(length)
    return np.broadcast_to(np.asarray(positions, "int64"), (batch, length))


def reference_attention(
    layer,
    query,
    value,
    key=None,
    query_positions=None,
    key_positions=None,
    mask=None,
    causal=False,
    transform_query_key=None,
    logits_bias=None,
):
    """The layer's attention recomputed in float64, head by head.

    `mask` is a boolean `(batch, query, key)` or `(batch, heads or 1,
    query, key)` (True: may attend); `causal` lets each query attend to keys
    at its position or before. A query that
    may attend to no key gets zero weights, as with Keras' masked softmax.
    For schemes the 1-D positions above do not describe (grids), the caller
    gives its own reference's contributions: `transform_query_key(queries,
    keys)` of the projected `(batch, sequence, heads, key_dim)`, and
    `logits_bias`, float64 `(batch or 1, heads, query, key)`.

    Returns:
        The output `(batch, query, features)` and the attention weights
        `(batch, heads, query, key)`.
    """
    query = np.asarray(query, "float64")
    value = np.asarray(value, "float64")
    key = value if key is None else np.asarray(key, "float64")
    batch, query_length, key_length = query.shape[0], query.shape[1], key.shape[1]
    query_positions = per_batch(query_positions, batch, query_length)
    key_positions = per_batch(key_positions, batch, key_length)
    queries = project(query, layer.query_dense)  # (batch, query, heads, key_dim)
    keys = project(key, layer.key_dense)  # (batch, key, key/value heads, key_dim)
    values = project(value, layer.value_dense)  # (batch, key, key/value heads, value_dim)
    heads, key_dim = queries.shape[2], queries.shape[3]
    # Grouped-query attention: query head n reads key/value head n // groups.
    groups = heads // keys.shape[2]
    position = layer.position
    if transform_query_key is not None:
        queries, keys = transform_query_key(queries, keys)
    elif isinstance(position, RotaryEmbedding):
        inverse_frequencies, _ = references.rope_inverse_frequencies(
            key_dim, position.max_wavelength
        )
        queries = references.rotary(
            queries, query_positions, inverse_frequencies, pairing=position.pairing
        )
        keys = references.rotary(
            keys, key_positions, inverse_frequencies, pairing=position.pairing
        )
    if isinstance(position, RelativePositionEmbedding):
        key_table = weight_named(position, "key_embeddings")  # (2k + 1, key_dim)
        value_table = weight_named(position, "value_embeddings")  # (2k + 1, value_dim)
        clip = position.max_relative_position
    if isinstance(position, AlibiBias):
        slopes = references.alibi_slopes(heads)  # (heads,)
    if isinstance(position, RelativePositionBias):
        bias_table = weight_named(position, "embeddings")  # (buckets, heads)
    allowed = np.ones((batch, heads, query_length, key_length), bool)
    if mask is not None:
        allowed &= mask[:, None] if mask.ndim == 3 else mask
    if causal:
        allowed &= (key_positions[:, None, :] <= query_positions[:, :, None])[
            :, None
        ]

    weights = np.zeros((batch, heads, query_length, key_length))
    attended = np.zeros((batch, query_length, heads, values.shape[-1]))
    for b in range(batch):
        for n in range(heads):
            for i in range(query_length):
                logits = np.zeros(key_length)
                value_vectors = values[b, :, n // groups].copy()  # (key, value_dim)
                for j in range(key_length):
                    # Positions i and j of the papers: the tokens' own.
                    i_position, j_position = query_positions[b, i], key_positions[b, j]
                    distance = j_position - i_position
                    key_vector = keys[b, j, n // groups]
                    if isinstance(position, RelativePositionEmbedding):
                        index = min(max(distance, -clip), clip) + clip
                        # Shaw et al. eq. 4: e_ij = q_i (k_j + a^K_ij) / sqrt(d).
                        key_vector = key_vector + key_table[index]
                        # Eq. 3: z_i = sum_j alpha_ij (v_j + a^V_ij).
                        value_vectors[j] += value_table[index]
                    logits[j] = queries[b, i, n] @ key_vector / math.sqrt(key_dim)
                    if isinstance(position, AlibiBias):
                        if position.bidirectional:
                            logits[j] += -slopes[n] * abs(i_position - j_position)
                        else:
                            logits[j] += -slopes[n] * (i_position - j_position)
                    if isinstance(position, RelativePositionBias):
                        bucket = references.t5_bucket(
                            distance,
                            position.bidirectional,
                            position.num_buckets,
                            position.max_distance,
                        )
                        logits[j] += bias_table[bucket, n]
                    if logits_bias is not None:
                        logits[j] += logits_bias[min(b, len(logits_bias) - 1), n, i, j]
                row = allowed[b, n, i]
                if row.any():
                    exponentials = np.where(
                        row, np.exp(logits - logits[row].max()), 0.0
                    )
                    weights[b, n, i] = exponentials / exponentials.sum()
                attended[b, i, n] = weights[b, n, i] @ value_vectors
    output_kernel = np.asarray(numpy(layer.output_dense.kernel.value), "float64")
    output_bias = np.asarray(numpy(layer.output_dense.bias.value), "float64")
    output = np.einsum("btnv,nvf->btf", attended, output_kernel) + output_bias
    return output, weights


def weight_values(layer):
    """`layer.get_weights()`: NumPy copies of its weights, on any backend.

    (Keras' own reads each variable by `np.array`, which warns under NumPy 2
    on JAX and PyTorch.)
    """
    return [numpy(weight.value) for weight in layer.weights]


def random_inputs(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def randomize_weights(layer, seed=1):
    """Every weight of `layer` (a layer or a model) drawn afresh."""
    rng = np.random.default_rng(seed)
    for weight in layer.weights:
        weight.assign(
            rng.normal(scale=WEIGHT_SCALE, size=weight.shape).astype("float32")
        )


def make_attention(scheme, **kwargs):
    return PositionalMultiHeadAttention(
        HEADS, KEY_DIM, value_dim=VALUE_DIM, position=SCHEMES[scheme](), **kwargs
    )


def attention(scheme, seed=1, **kwargs):
    """A built attention of the test sizes whose weights, tables too, are random."""
    layer = make_attention(scheme, **kwargs)
    tokens = np.zeros((1, 1, FEATURES), "float32")
    layer(tokens, tokens)
    randomize_weights(layer, seed)
    return layer


def assert_close(actual, expected, atol=FLOAT32_ATOL, err_msg=""):
    np.testing.assert_allclose(
        np.asarray(numpy(actual), "float64"),
        expected,
        rtol=0,
        atol=atol,
        err_msg=err_msg,
    )


def dtype_of(tensor):
    return keras.backend.standardize_dtype(tensor.dtype)


def as_float64(tensor):
    """A float tensor of any precision, bfloat16 too, as float64 NumPy."""
    return numpy(keras.ops.cast(tensor, "float32")).astype("float64")


def padded_tokens(ids):
    """Embeddings of `ids` that carry the Keras mask `ids != 0`."""
    keras.utils.set_random_seed(6)
    return keras.layers.Embedding(VOCABULARY_SIZE, FEATURES, mask_zero=True)(ids)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_self_attention_equals_float64_reference(scheme):
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    output, weights = layer(tokens, tokens, return_attention_scores=True)
    expected_output, expected_weights = reference_attention(layer, tokens, tokens)
    assert dtype_of(output) == dtype_of(weights) == "float32"
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


# Every `attention_mask` shape Keras' layer takes, for 5 queries and LENGTH
# keys: per batch element, per head, one for all heads, one for the batch.
MASK_SHAPES = {
    "batch-query-key": (BATCH, 5, LENGTH),
    "batch-heads-query-key": (BATCH, HEADS, 5, LENGTH),
    "batch-1-query-key": (BATCH, 1, 5, LENGTH),
    "query-key": (5, LENGTH),
}


def keras_mask(shape, seed=7):
    """A random boolean mask of `shape` in which every query keeps key 0."""
    mask = np.random.default_rng(seed).random(shape) < 0.6
    mask[..., 0] = True
    return mask


def as_head_mask(mask):
    """`mask` as Keras reads it: a head axis added where there is none."""
    while mask.ndim < 4:
        mask = np.expand_dims(mask, -3)
    return np.broadcast_to(mask, (BATCH, HEADS) + mask.shape[-2:])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "mask_shape", [None, *MASK_SHAPES.values()], ids=["no-mask", *MASK_SHAPES]
)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_cross_attention_at_explicit_positions_equals_reference(
    scheme, mask_shape, causal
):
    layer = attention(scheme)
    query = random_inputs((BATCH, 5, FEATURES), seed=2)
    value = random_inputs((BATCH, LENGTH, FEATURES), seed=3)
    key = random_inputs((BATCH, LENGTH, FEATURES), seed=4)
    # Every `attention_mask` shape Keras takes, with the meaning it gives it.
    mask = None if mask_shape is None else keras_mask(mask_shape)
    output, weights = layer(
        query,
        value,
        key=key,
        attention_mask=mask,
        query_positions=QUERY_POSITIONS,
        key_positions=KEY_POSITIONS,
        use_causal_mask=causal,
        return_attention_scores=True,
    )
    expected_output, expected_weights = reference_attention(
        layer,
        query,
        value,
        key,
        QUERY_POSITIONS,
        KEY_POSITIONS,
        mask=None if mask is None else as_head_mask(mask),
        causal=causal,
    )
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


def copy_projections(source, target):
    """Give `target` the query, key, value and output weights of `source`."""
    for name in ("query_dense", "key_dense", "value_dense", "output_dense"):
        getattr(target, name).set_weights(weight_values(getattr(source, name)))


def test_reference_sees_each_scheme():
    # The reference's own check: each scheme's term moves the weights well
    # past the tolerance, so an attention that ignored it would fail above.
    query = random_inputs((BATCH, 5, FEATURES), seed=2)
    value = random_inputs((BATCH, LENGTH, FEATURES), seed=3)
    plain = attention("none")
    _, plain_weights = reference_attention(
        plain, query, value, None, QUERY_POSITIONS, KEY_POSITIONS
    )
    for scheme in POSITIONED:
        layer = attention(scheme)
        copy_projections(plain, layer)
        _, weights = reference_attention(
            layer, query, value, None, QUERY_POSITIONS, KEY_POSITIONS
        )
        assert np.abs(weights - plain_weights).max() > 0.05, scheme


def test_without_position_it_is_keras_multi_head_attention():
    built = []
    for cls in (keras.layers.MultiHeadAttention, PositionalMultiHeadAttention):
        keras.utils.set_random_seed(5)
        layer = cls(HEADS, KEY_DIM, value_dim=VALUE_DIM)
        zeros = np.zeros((1, 1, FEATURES), "float32")
        # Built, not called: Keras' fused path fails on JAX for a value_dim
        # other than key_dim.
        layer.build(zeros.shape, zeros.shape)
        built.append(layer)
    theirs, ours = built
    # The same weights, drawn alike from the same seed.
    assert [(weight.name, weight.shape) for weight in ours.weights] == [
        (weight.name, weight.shape) for weight in theirs.weights
    ]
    for mine, keras_weight in zip(weight_values(ours), weight_values(theirs)):
        np.testing.assert_array_equal(mine, keras_weight)
    config = ours.get_config()
    assert config.pop("position") is None
    assert config.pop("num_key_value_heads") == HEADS
    assert config.pop("qk_norm") is None
    assert config.pop("qk_norm_after_position") is False
    assert config.pop("qk_norm_epsilon") == 1e-6
    assert {k: v for k, v in config.items() if k != "name"} == {
        k: v for k, v in theirs.get_config().items() if k != "name"
    }

    randomize_weights(theirs)
    ours.set_weights(weight_values(theirs))
    ids = np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 0, 0, 0]])
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    other = random_inputs((BATCH, 4, FEATURES), seed=1)
    attention_mask = np.random.default_rng(2).random((BATCH, 4, LENGTH)) < 0.7
    attention_mask[:, :, 0] = True
    # Each call takes fresh inputs: Keras' layer strips the Keras masks off
    # the tensors it is given.
    cases = {
        "self": (lambda: (tokens, tokens), {}),
        "causal": (lambda: (tokens, tokens), {"use_causal_mask": True}),
        "cross": (lambda: (other, tokens), {"key": tokens[:, ::-1]}),
        "attention-mask": (
            lambda: (other, tokens),
            {"attention_mask": attention_mask},
        ),
        **{
            f"attention-mask-{name}": (
                lambda: (other, tokens),
                {"attention_mask": keras_mask(shape[:-2] + (4, LENGTH))},
            )
            for name, shape in MASK_SHAPES.items()
        },
        "padding": (lambda: (padded_tokens(ids),) * 2, {}),
        "padding-causal": (
            lambda: (padded_tokens(ids),) * 2,
            {"use_causal_mask": True},
        ),
    }
    for name, (inputs, kwargs) in cases.items():
        expected_output, expected_weights = theirs(
            *inputs(), return_attention_scores=True, **kwargs
        )
        output, weights = ours(*inputs(), return_attention_scores=True, **kwargs)
        np.testing.assert_array_equal(
            numpy(output), numpy(expected_output), err_msg=name
        )
        np.testing.assert_array_equal(
            numpy(weights), numpy(expected_weights), err_msg=name
        )
        # Keras' fused path (no scores) too; where that fails (on JAX, for
        # values of another head size than the keys'), the layer takes
        # Keras' path with the scores.
        if dot_product_attention_needs_equal_head_sizes():
            expected_fused, _ = theirs(
                *inputs(), return_attention_scores=True, **kwargs
            )
        else:
            expected_fused = theirs(*inputs(), **kwargs)
        np.testing.assert_array_equal(
            numpy(ours(*inputs(), **kwargs)), numpy(expected_fused), err_msg=name
        )
        # Positions shifted alike take the layer's own path: the same
        # attention, up to float32 rounding.
        query, value = inputs()
        output, weights = ours(
            query,
            value,
            return_attention_scores=True,
            query_positions=np.arange(query.shape[1]) + 100,
            key_positions=np.arange(value.shape[1]) + 100,
            **kwargs,
        )
        output, weights = numpy(output), numpy(weights)
        expected_output = numpy(expected_output)
        expected_weights = numpy(expected_weights)
        if not KERAS_ZEROES_UNATTENDED:
            attending = weights.sum(-1).max(1) > 0  # (batch, query)
            output, expected_output = output[attending], expected_output[attending]
            weights = weights.transpose(0, 2, 1, 3)[attending]
            expected_weights = expected_weights.transpose(0, 2, 1, 3)[attending]
        assert_close(weights, expected_weights, err_msg=name)
        assert_close(output, expected_output, err_msg=name)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_shifting_all_positions_changes_nothing(scheme):
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    shifts = {
        "shared": np.arange(LENGTH) + 100,
        "per-batch": np.arange(LENGTH) + np.array([[100], [3]]),
    }
    for causal in (False, True):
        expected = numpy(layer(tokens, tokens, use_causal_mask=causal))
        for name, positions in shifts.items():
            shifted = layer(
                tokens,
                tokens,
                query_positions=positions,
                key_positions=positions,
                use_causal_mask=causal,
            )
            assert_close(shifted, expected, err_msg=f"{name}, causal={causal}")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_permuting_tokens(scheme):
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    output = numpy(layer(tokens, tokens))
    permuted = numpy(layer(tokens[:, PERMUTATION], tokens[:, PERMUTATION]))
    if scheme == "none":
        # Without positions attention is permutation-equivariant.
        assert_close(permuted, output[:, PERMUTATION])
    else:
        assert np.abs(permuted - output[:, PERMUTATION]).max() > 0.05
    # Tokens that take their positions along: the output rows permute.
    carried = layer(
        tokens[:, PERMUTATION],
        tokens[:, PERMUTATION],
        query_positions=PERMUTATION,
        key_positions=PERMUTATION,
    )
    assert_close(carried, output[:, PERMUTATION])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cached_decoding_equals_a_causal_pass(scheme):
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    full = numpy(layer(tokens, tokens, use_causal_mask=True))

    def decode(new_tokens, cached_tokens, positions):
        # The causal mask compares positions: all cached keys are visible.
        return layer(
            new_tokens,
            cached_tokens,
            query_positions=positions,
            use_causal_mask=True,
        )

    # On TensorFlow one graph for every length (JAX traces each shape).
    decode = graph_function(
        decode,
        input_signature=[
            ((None, None, FEATURES), "float32"),
            ((None, None, FEATURES), "float32"),
            ((None,), "int32"),
        ],
        jit_compile=False,
    )
    for step in range(LENGTH):
        new_token, cached = tokens[:, step : step + 1], tokens[:, : step + 1]
        one_query = layer(new_token, cached, query_positions=[step])
        assert_close(one_query, full[:, step : step + 1], err_msg=f"step {step}")
        traced = decode(new_token, cached, np.array([step], "int32"))
        assert_close(traced, full[:, step : step + 1], err_msg=f"step {step}")
    # A chunk of queries at once (prefill of 3..6 after 0..2 were cached).
    chunk = decode(tokens[:, 3:], tokens, np.arange(3, LENGTH, dtype="int32"))
    assert_close(chunk, full[:, 3:])
    if BACKEND == "tensorflow":
        assert decode.experimental_get_tracing_count() == 1


# Keras' `sliding_window` argument is new in Keras 3.15.
@pytest.mark.newest
@pytest.mark.parametrize("scheme", SCHEMES)
def test_sliding_window_compares_positions(scheme):
    window = 3
    layer = attention(scheme, sliding_window=window)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    full, weights = layer(
        tokens, tokens, use_causal_mask=True, return_attention_scores=True
    )
    positions = np.arange(LENGTH)
    expected_output, expected_weights = reference_attention(
        layer,
        tokens,
        tokens,
        mask=np.abs(positions[:, None] - positions[None, :])[None] < window,
        causal=True,
    )
    assert_close(weights, expected_weights)
    assert_close(full, expected_output)
    # One query at its position against the keys so far: the window counts
    # back from the query's position, not from its index 0.
    for step in range(LENGTH):
        one_query = layer(
            tokens[:, step : step + 1],
            tokens[:, : step + 1],
            query_positions=[step],
            use_causal_mask=True,
        )
        assert_close(one_query, expected_output[:, step : step + 1], err_msg=f"step {step}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_padding_masks_combine_with_every_scheme(scheme, causal):
    layer = attention(scheme)
    ids = np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 0, 0, 0]])
    padding = ids != 0  # (batch, seq)
    tokens = padded_tokens(ids)
    features = numpy(tokens)
    output, weights = layer(
        tokens, tokens, use_causal_mask=causal, return_attention_scores=True
    )
    # The output carries the query mask, as Keras' layer does.
    np.testing.assert_array_equal(keras_mask_of(output), padding)
    output, weights = numpy(output), numpy(weights)
    # Real queries give padded keys no weight...
    assert np.all(weights[1, :, :4, 4:] == 0)
    # ...and attend as if the padding were not there.
    alone = layer(features[1:2, :4], features[1:2, :4], use_causal_mask=causal)
    assert_close(output[1, :4], numpy(alone)[0])
    expected_output, expected_weights = reference_attention(
        layer,
        features,
        features,
        mask=padding[:, :, None] & padding[:, None, :],
        causal=causal,
    )
    assert_close(weights[:, :, :4], expected_weights[:, :, :4])
    assert_close(output[padding], expected_output[padding])

    # The same key mask given as value_mask or attention_mask to tensors
    # without a Keras mask: the real queries attend alike.
    key_mask = np.broadcast_to(padding[:, None, :], (BATCH, LENGTH, LENGTH))
    for kwargs in ({"value_mask": padding}, {"attention_mask": key_mask}):
        masked_output, masked_weights = layer(
            features,
            features,
            use_causal_mask=causal,
            return_attention_scores=True,
            **kwargs,
        )
        assert np.all(numpy(masked_weights)[1, :, :, 4:] == 0), kwargs
        assert_close(
            numpy(masked_output)[padding],
            expected_output[padding],
            err_msg=str(kwargs),
        )

    # Padded queries, whose every key is masked, get no weights at all, as
    # with Keras' masked softmax: no query gives a padded key weight. Without
    # a scheme this is Keras' own layer, which zeroes them from 3.10 on.
    if scheme != "none" or KERAS_ZEROES_UNATTENDED:
        assert np.all(weights[1, :, :, 4:] == 0)
        assert_close(weights, expected_weights)
        assert_close(output, expected_output)


ZERO_LENGTHS = {"no-queries-no-keys": (0, 0), "no-queries": (0, 5), "no-keys": (5, 0)}


@pytest.mark.parametrize("lengths", ZERO_LENGTHS.values(), ids=ZERO_LENGTHS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_zero_length_queries_and_keys(scheme, lengths):
    query_length, key_length = lengths
    layer = attention(scheme)
    query = random_inputs((BATCH, query_length, FEATURES), seed=2)
    value = random_inputs((BATCH, key_length, FEATURES), seed=3)

    def attend_causally(query, value):
        return layer(query, value, use_causal_mask=True)

    # On TensorFlow, under XLA, with lengths unknown when traced.
    attend_causally = graph_function(
        attend_causally, input_signature=[((None, None, FEATURES), "float32")] * 2
    )

    for causal in (False, True):
        output, weights = layer(
            query, value, use_causal_mask=causal, return_attention_scores=True
        )
        assert output.shape == (BATCH, query_length, FEATURES)
        assert weights.shape == (BATCH, HEADS, query_length, key_length)
        expected_output, expected_weights = reference_attention(
            layer, query, value, causal=causal
        )
        # With no keys, each query's output is the output projection's bias.
        assert_close(weights, expected_weights)
        assert_close(output, expected_output)
    assert_close(attend_causally(query, value), expected_output)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_left_padding_with_per_batch_positions(scheme):
    layer = attention(scheme)
    ids = np.array([[3, 1, 4, 1, 5, 9, 2], [0, 0, 0, 6, 5, 3, 5]])
    # Each row counts positions from its first real token.
    positions = np.maximum(np.cumsum(ids != 0, axis=1) - 1, 0)
    for causal in (False, True):
        tokens = padded_tokens(ids)
        output = numpy(
            layer(
                tokens,
                tokens,
                query_positions=positions,
                key_positions=positions,
                use_causal_mask=causal,
            )
        )
        for row, start in ((0, 0), (1, 3)):
            real = tokens[row : row + 1, start:]
            alone = numpy(layer(real, real, use_causal_mask=causal))
            assert_close(output[row, start:], alone[0], err_msg=f"causal={causal}")


def test_position_weights_are_sized_for_the_attention():
    expected = {
        "none": {},
        "rotary": {},
        "alibi": {},
        "alibi-bidirectional": {},
        # Shared across heads, as in Shaw et al.
        "shaw": {
            "key_embeddings": (2 * SHAW_MAX_RELATIVE_POSITION + 1, KEY_DIM),
            "value_embeddings": (2 * SHAW_MAX_RELATIVE_POSITION + 1, VALUE_DIM),
        },
        "t5": {"embeddings": (T5_BUCKETS, HEADS)},
        "t5-unidirectional": {"embeddings": (T5_BUCKETS, HEADS)},
    }
    for scheme, tables in expected.items():
        layer = attention(scheme)
        if layer.position is not None:
            assert {
                weight.name: tuple(weight.shape) for weight in layer.position.weights
            } == tables, scheme
        # Keras' eight projection weights and the position's, all trainable.
        assert len(layer.trainable_weights) == 8 + len(tables), scheme
        assert not layer.non_trainable_weights


@tensorflow_only  # reads the shapes of a TensorFlow graph's tensors
def test_shaw_forms_no_query_key_feature_tensor():
    import tensorflow as tf

    # Shaw et al. write a^K_ij and a^V_ij per query and key; the layer must
    # work with the 2k + 1 distances instead, never holding (query, key, d).
    layer = attention("shaw")
    query_length, key_length = 11, 13
    feature_sizes = {KEY_DIM, VALUE_DIM, 2 * SHAW_MAX_RELATIVE_POSITION + 1}
    assert not feature_sizes & {BATCH, HEADS, query_length, key_length}

    @tf.function
    def attend(query, value):
        return layer(query, value, use_causal_mask=True, return_attention_scores=True)

    graph = attend.get_concrete_function(
        tf.TensorSpec((BATCH, query_length, FEATURES), "float32"),
        tf.TensorSpec((BATCH, key_length, FEATURES), "float32"),
    ).graph
    shapes = [
        tuple(tensor.shape.as_list())
        for operation in graph.get_operations()
        for tensor in operation.outputs
        if tensor.shape.rank is not None
    ]
    query_key = [
        shape for shape in shapes if query_length in shape and key_length in shape
    ]
    # The logits and weights are there to be seen...
    assert (BATCH, HEADS, query_length, key_length) in query_key
    # ...but nothing of a query, a key and a feature or distance axis.
    assert [shape for shape in query_key if feature_sizes & set(shape)] == []
    # And no shape that the graph leaves unknown could hide one.
    assert all(None not in shape for shape in shapes if len(shape) >= 3)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", [(96, 96), (40, 130)], ids=["self", "cross"])
def test_shaw_at_default_positions_equals_the_same_positions_given(lengths, causal):
    # At its default positions the layer lets Shaw's value term read a band of
    # weights and sums of blocks of keys; at positions given, the same ones,
    # it sums the weights per distance. Both are checked against float64 on
    # their own; here, that the attention takes each where it should.
    layer = attention("shaw")
    query_length, key_length = lengths
    query = random_inputs((BATCH, query_length, FEATURES), seed=2)
    value = random_inputs((BATCH, key_length, FEATURES), seed=3)
    call = compiled(functools.partial(layer, use_causal_mask=causal))
    default = call(query, value)
    given = call(
        query,
        value,
        query_positions=np.arange(query_length),
        key_positions=np.arange(key_length),
    )
    assert_close(default, numpy(given).astype("float64"))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_config_round_trip(scheme):
    layer = attention(scheme)
    # Through JSON, as in a .keras file: tuples come back as lists.
    config = json.loads(json.dumps(layer.get_config()))
    rebuilt = PositionalMultiHeadAttention.from_config(config)
    if scheme == "none":
        assert config["position"] is None
        assert rebuilt.position is None
    else:
        assert config["position"]["class_name"] == type(layer.position).__name__
        assert type(rebuilt.position) is type(layer.position)
        assert rebuilt.position is not layer.position
        assert rebuilt.position.get_config() == layer.position.get_config()
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    rebuilt(tokens, tokens)
    assert json.loads(json.dumps(rebuilt.get_config())) == config
    rebuilt.set_weights(weight_values(layer))
    np.testing.assert_array_equal(
        numpy(rebuilt(tokens, tokens, use_causal_mask=True)),
        numpy(layer(tokens, tokens, use_causal_mask=True)),
    )


def attention_layer(model):
    """The one PositionalMultiHeadAttention among a model's layers."""
    (layer,) = [
        layer
        for layer in model.layers
        if isinstance(layer, PositionalMultiHeadAttention)
    ]
    return layer


def decoder_model(scheme, with_positions=False):
    """Functional: embeddings of any length -> causal attention -> Dense."""
    tokens = keras.Input(shape=(None, FEATURES))
    inputs = [tokens]
    kwargs = {}
    if with_positions:
        positions = keras.Input(shape=(None,), dtype="int32")
        inputs.append(positions)
        kwargs = {"query_positions": positions, "key_positions": positions}
    attended = make_attention(scheme)(tokens, tokens, use_causal_mask=True, **kwargs)
    # One input is passed as a tensor, not a list of one, as it is called.
    return keras.Model(
        inputs if with_positions else tokens, keras.layers.Dense(2)(attended)
    )


@pytest.mark.parametrize(
    "make_position",
    [
        lambda: RelativePositionBias(HEADS, num_buckets=8, max_distance=16),
        lambda: RelativePositionEmbedding(max_relative_position=3),
    ],
    ids=["t5", "shaw"],
)
def test_a_position_shared_by_two_attention_layers_loads_as_one(
    make_position, tmp_path
):
    keras.utils.set_random_seed(0)
    position = make_position()
    tokens = keras.Input(shape=(None, FEATURES))
    first = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
    second = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
    hidden = first(tokens, tokens)
    model = keras.Model(tokens, second(hidden, hidden))
    randomize_weights(model)
    model.save(tmp_path / "shared.keras")
    loaded = keras.models.load_model(tmp_path / "shared.keras", safe_mode=True)
    first, second = (
        layer
        for layer in loaded.layers
        if isinstance(layer, PositionalMultiHeadAttention)
    )
    assert first.position is second.position
    assert len(loaded.weights) == len(model.weights)
    inputs = random_inputs((BATCH, LENGTH, FEATURES))
    # Both called as they are: `predict` would trace each model anew.
    np.testing.assert_array_equal(numpy(loaded(inputs)), numpy(model(inputs)))


def test_the_config_serializes_its_position_once_and_marks_it_only_when_saving(
    monkeypatch, tmp_path
):
    position = RelativePositionBias(HEADS, num_buckets=8, max_distance=16)
    layer = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
    calls = []
    get_config = type(position).get_config

    def counted(self):
        calls.append(self)
        return get_config(self)

    monkeypatch.setattr(type(position), "get_config", counted)
    config = layer.get_config()
    assert calls == [position]
    # Outside saving, a config has nothing of the object it came from:
    # two alike layers' configs are equal.
    assert "shared_object_id" not in config["position"]
    twin = PositionalMultiHeadAttention(
        HEADS,
        KEY_DIM,
        position=RelativePositionBias(HEADS, num_buckets=8, max_distance=16),
        name=layer.name,
    )
    twin.position.name = position.name
    assert twin.get_config() == config
    # While saving, the position is serialized once per attention.
    tokens = keras.Input(shape=(None, FEATURES))
    model = keras.Model(tokens, layer(tokens, tokens))
    calls.clear()
    model.save(tmp_path / "one.keras")
    assert calls == [position]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_keras_file_round_trip_is_bit_identical(scheme, tmp_path):
    keras.utils.set_random_seed(0)
    model = decoder_model(scheme, with_positions=True)
    # Off their initial values, so that a load that re-initialises shows.
    randomize_weights(model)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    assert attention_layer(loaded).get_config() == attention_layer(model).get_config()
    # The position's tables load under the attention, where they were made.
    assert [weight.path for weight in loaded.weights] == [
        weight.path for weight in model.weights
    ]
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    positions = np.maximum(np.arange(LENGTH) - np.array([[0], [2]]), 0)
    # Both called as they are: `predict` would trace each model anew.
    expected = numpy(model([tokens, positions]))
    np.testing.assert_array_equal(numpy(loaded([tokens, positions])), expected)
    # The positions reached the attention: the model is the layers called
    # with them, and differs from the same model at the default positions.
    eager = attention_layer(model)(
        tokens,
        tokens,
        query_positions=positions,
        key_positions=positions,
        use_causal_mask=True,
    )
    assert_close(model.layers[-1](eager), expected)
    default_positions = np.tile(np.arange(LENGTH), (BATCH, 1))
    default = numpy(model([tokens, default_positions]))
    assert np.abs(default - expected).max() > 0.05


@pytest.mark.parametrize("scheme", SCHEMES)
def test_xla_training_step(scheme):
    keras.utils.set_random_seed(0)
    model = decoder_model(scheme)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", jit_compile=XLA)
    assert model.jit_compile == XLA
    before = {weight.path: numpy(weight.value) for weight in model.trainable_weights}
    tokens = random_inputs((4, LENGTH, FEATURES))
    targets = random_inputs((4, LENGTH, 2), seed=1)
    history = model.fit(
        tokens, targets, batch_size=4, epochs=1, shuffle=False, verbose=0
    )
    assert np.isfinite(history.history["loss"]).all()
    # Every weight moved, the position's tables among them.
    position = attention_layer(model).position
    table_paths = {weight.path for weight in getattr(position, "weights", [])}
    assert table_paths <= set(before)
    for weight in model.trainable_weights:
        assert not np.array_equal(numpy(weight.value), before[weight.path]), weight.path


@pytest.mark.parametrize("scheme", SCHEMES)
def test_mixed_bfloat16(scheme):
    float32_layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    expected_output, expected_weights = float32_layer(
        tokens, tokens, use_causal_mask=True, return_attention_scores=True
    )
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = make_attention(scheme)
    layer(tokens, tokens)
    layer.set_weights(weight_values(float32_layer))
    output, weights = layer(
        tokens, tokens, use_causal_mask=True, return_attention_scores=True
    )
    assert dtype_of(output) == dtype_of(weights) == "bfloat16"
    if scheme == "none":
        # Keras' layer, bfloat16 softmax and all.
        keras_layer = keras.layers.MultiHeadAttention(
            HEADS, KEY_DIM, value_dim=VALUE_DIM
        )
        keras_layer.build(tokens.shape, tokens.shape)
        keras_layer.set_weights(weight_values(float32_layer))
        keras_output, keras_weights = keras_layer(
            tokens, tokens, use_causal_mask=True, return_attention_scores=True
        )
        np.testing.assert_array_equal(as_float64(output), as_float64(keras_output))
        np.testing.assert_array_equal(as_float64(weights), as_float64(keras_weights))
    weights = as_float64(weights)
    if scheme != "none":
        # A float32 softmax: each weight w then rounds to bfloat16 (8
        # significant bits) by at most w * 2**-8, so the rows sum to 1
        # within 2**-8. (Keras' bfloat16 softmax misses that here.)
        assert np.abs(weights.sum(-1) - 1).max() <= 2**-8 + 1e-6
    future = np.triu(np.ones((LENGTH, LENGTH), bool), 1)  # (query, key)
    assert np.all(weights[:, :, future] == 0)
    # Inputs, projections and logits rounded to bfloat16 (2**-8 relative
    # each, several times over) move weights by a few hundredths and
    # outputs by a few percent of their largest.
    assert_close(weights, numpy(expected_weights), atol=2**-5)
    expected_output = numpy(expected_output)
    assert_close(
        as_float64(output),
        expected_output,
        atol=2**-5 * np.abs(expected_output).max(),
    )


def test_mixed_bfloat16_adds_bias_and_normalizes_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = make_attention("t5")
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    layer(tokens, tokens)
    randomize_weights(layer)
    # No content logits (zero queries): the T5 bias alone sets the weights.
    layer.query_dense.kernel.assign(np.zeros(layer.query_dense.kernel.shape))
    layer.query_dense.bias.assign(np.zeros(layer.query_dense.bias.shape))
    # Biases near 200, where bfloat16 steps by 1: rounded there, they would
    # move by up to 0.5 and the weights by up to 65%; Keras' bfloat16
    # softmax would round its exponentials and their sum too.
    (table,) = layer.position.weights
    table.assign(
        200.0 + np.random.default_rng(0).uniform(-2, 2, table.shape).astype("float32")
    )
    _, weights = layer(tokens, tokens, return_attention_scores=True)
    _, expected = reference_attention(layer, tokens, tokens)
    error = np.abs(as_float64(weights) - expected)
    # The bfloat16 rounding of the weights themselves (and float32 ulps of
    # the softmax), no more.
    assert np.all(error <= (2**-8 + 1e-6) * expected), (error / expected).max()


def test_mixed_bfloat16_adds_alibi_bias_inside_the_float32_softmax():
    # At the default positions, without a mask, ALiBi's bias goes inside
    # the exponentials (blocks of 48 keys at 96): float32 there too.
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = PositionalMultiHeadAttention(
        1, KEY_DIM, value_dim=VALUE_DIM, position=AlibiBias(1, slopes=[0.5], bidirectional=True)
    )
    tokens = random_inputs((BATCH, 96, FEATURES))
    layer(tokens, tokens)
    randomize_weights(layer)
    # No content logits (zero queries): the bias alone sets the weights.
    layer.query_dense.kernel.assign(np.zeros(layer.query_dense.kernel.shape))
    layer.query_dense.bias.assign(np.zeros(layer.query_dense.bias.shape))
    # Biases down to -47.5, where bfloat16 steps by 0.25: rounded there,
    # they would move the weights by up to 13%.
    _, weights = layer(tokens, tokens, return_attention_scores=True)
    distance = np.abs(np.arange(96)[None, :] - np.arange(96)[:, None])
    expected = np.exp(-0.5 * distance)
    expected /= expected.sum(-1, keepdims=True)
    error = np.abs(as_float64(weights) - expected)
    assert np.all(error <= (2**-8 + 1e-6) * expected), (error / expected).max()


def test_heads_mismatch_raises_value_error_naming_num_heads():
    tokens = np.zeros((1, 2, FEATURES), "float32")
    for position in (AlibiBias(5), RelativePositionBias(5)):
        with pytest.raises(ValueError, match="num_heads") as error:
            layer = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=position)
            layer(tokens, tokens)
        assert re.search(r"\b5\b", str(error.value)), error.value
        assert re.search(r"\b3\b", str(error.value)), error.value


@pytest.mark.parametrize(
    "position, kwargs, message",
    [
        (lambda: "alibi", {}, "position='alibi'"),
        (lambda: keras.layers.Dense(3), {}, "position=<Dense"),
        (RotaryEmbedding, {"key_dim": 5}, "even"),
        (lambda: RotaryEmbedding(sequence_axis=2), {}, "sequence_axis=2"),
        (lambda: RotaryEmbedding(rotary_dim=8), {}, "rotary_dim=8"),
    ],
    ids=["string", "other-layer", "rope-odd-key-dim", "rope-axes", "rope-too-wide"],
)
def test_bad_position_raises_value_error_naming_it(position, kwargs, message):
    tokens = np.zeros((1, 2, FEATURES), "float32")
    with pytest.raises(ValueError, match=message):
        layer = PositionalMultiHeadAttention(
            HEADS, **{"key_dim": KEY_DIM, **kwargs}, position=position()
        )
        layer(tokens, tokens)


@pytest.mark.parametrize(
    "call_kwargs, message",
    [
        ({"query_positions": np.arange(LENGTH + 1)}, r"query_positions.*\(8,\)"),
        (
            {"key_positions": np.zeros((BATCH, LENGTH - 1), "int32")},
            r"key_positions.*\(2, 6\)",
        ),
        (
            {"query_positions": np.zeros((3, LENGTH), "int32")},
            r"query_positions.*\(3, 7\)",
        ),
        (
            {"query_positions": np.zeros((1, 1, LENGTH), "int32")},
            r"query_positions.*\(1, 1, 7\)",
        ),
        ({"key_positions": np.arange(LENGTH) + 0.5}, "key_positions.*float"),
    ],
    ids=["too-long", "too-short", "other-batch", "rank-3", "float"],
)
@pytest.mark.parametrize("scheme", ["none", "rotary", "shaw"])
def test_bad_positions_raise_value_error_naming_them(scheme, call_kwargs, message):
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    with pytest.raises(ValueError, match=message):
        layer(tokens, tokens, **call_kwargs)


def test_position_needs_sequences_of_features():
    layer = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=AlibiBias(HEADS))
    images = np.zeros((1, 3, 4, FEATURES), "float32")
    with pytest.raises(ValueError, match=r"\(batch, sequence, features\)"):
        layer(images, images)


# A key/value cache, in keras-hub's layout: (batch, 2, slots, heads, key_dim),
# which holds keys and values alike, so its attention has value_dim = key_dim.
CACHE_SLOTS = 10
PREFILL = 4


def cached_attention(scheme, seed=1):
    """A built attention of the test sizes with value_dim = key_dim, random weights."""
    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=SCHEMES[scheme]()
    )
    tokens = np.zeros((1, 1, FEATURES), "float32")
    layer(tokens, tokens)
    randomize_weights(layer, seed)
    return layer


def empty_cache(batch=BATCH, slots=CACHE_SLOTS, dtype="float32"):
    return keras.ops.zeros((batch, 2, slots, HEADS, KEY_DIM), dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cache_prefill_then_decode_equals_float64_reference(scheme):
    layer = cached_attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    expected, _ = reference_attention(layer, tokens, tokens, causal=True)

    def decode(token, cache, index):
        return layer(
            token, token, cache=cache, cache_update_index=index, use_causal_mask=True
        )

    # On TensorFlow one graph for every step, the index read at run time.
    decode = graph_function(
        decode,
        input_signature=[
            ((None, 1, FEATURES), "float32"),
            ((None, 2, CACHE_SLOTS, HEADS, KEY_DIM), "float32"),
            ((), "int32"),
        ],
        jit_compile=False,
    )

    # The prompt in one call, then one token per call at a run-time index.
    output, cache = layer(
        tokens[:, :PREFILL],
        tokens[:, :PREFILL],
        cache=empty_cache(),
        cache_update_index=0,
        use_causal_mask=True,
    )
    assert_close(output, expected[:, :PREFILL])
    for step in range(PREFILL, LENGTH):
        output, cache = decode(
            tokens[:, step : step + 1],
            cache,
            keras.ops.convert_to_tensor(step, "int32"),
        )
        assert_close(output, expected[:, step : step + 1], err_msg=f"step {step}")
    if BACKEND == "tensorflow":
        assert decode.experimental_get_tracing_count() == 1

    # The cache holds the projected values, and the keys as the logits read
    # them (rotated, for RoPE); the slots after them are untouched.
    keys = project(tokens, layer.key_dense)  # (batch, length, heads, key_dim)
    if scheme == "rotary":
        inverse_frequencies, _ = references.rope_inverse_frequencies(
            KEY_DIM, layer.position.max_wavelength
        )
        keys = references.rotary(
            keys, per_batch(None, BATCH, LENGTH), inverse_frequencies
        )
    assert_close(cache[:, 0, :LENGTH], keys)
    assert_close(cache[:, 1, :LENGTH], project(tokens, layer.value_dense))
    assert np.all(numpy(cache)[:, :, LENGTH:] == 0)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_cache_slots_not_yet_written_get_no_weight(scheme):
    # No causal mask: the prompt's tokens attend to one another, and not to
    # the cache's empty slots.
    layer = cached_attention(scheme)
    tokens = random_inputs((BATCH, PREFILL, FEATURES))
    output, weights, cache = layer(
        tokens,
        tokens,
        cache=empty_cache(),
        cache_update_index=0,
        return_attention_scores=True,
    )
    expected_output, expected_weights = reference_attention(layer, tokens, tokens)
    assert weights.shape == (BATCH, HEADS, PREFILL, CACHE_SLOTS)
    assert cache.shape == empty_cache().shape
    assert_close(output, expected_output)
    assert_close(weights[..., :PREFILL], expected_weights)
    assert np.all(numpy(weights)[..., PREFILL:] == 0)


@pytest.mark.parametrize("scheme", ["rotary", "alibi", "t5"])
def test_cache_with_left_padding_and_per_batch_positions(scheme):
    # Row 1 is padded on the left by 2: its tokens sit at positions 0, 1, ...
    # from slot 2 on, and its padded slots are masked.
    layer = cached_attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    padding = np.array([0, 2])
    positions = np.maximum(np.arange(CACHE_SLOTS) - padding[:, None], 0)
    real = np.arange(CACHE_SLOTS) >= padding[:, None]  # (batch, slots)
    cache = empty_cache()
    outputs = []
    for start, stop in ((0, PREFILL), (PREFILL, PREFILL + 1), (PREFILL + 1, LENGTH)):
        output, cache = layer(
            tokens[:, start:stop],
            tokens[:, start:stop],
            cache=cache,
            cache_update_index=start,
            query_positions=positions[:, start:stop],
            key_positions=positions,
            attention_mask=np.broadcast_to(
                real[:, None], (BATCH, stop - start, CACHE_SLOTS)
            ),
            use_causal_mask=True,
        )
        outputs.append(output)
    output = np.concatenate([numpy(output) for output in outputs], axis=1)
    for row in range(BATCH):
        start = padding[row]
        expected, _ = reference_attention(
            layer, tokens[row : row + 1, start:], tokens[row : row + 1, start:],
            causal=True,
        )
        assert_close(output[row : row + 1, start:], expected, err_msg=f"row {row}")


def test_cache_decoding_under_xla_in_a_loop():
    layer = cached_attention("rotary")
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    expected, _ = reference_attention(layer, tokens, tokens, causal=True)

    @compiled
    def generate(tokens):
        _, cache = layer(
            tokens[:, :PREFILL],
            tokens[:, :PREFILL],
            cache=empty_cache(),
            cache_update_index=0,
            use_causal_mask=True,
        )
        outputs = keras.ops.zeros((BATCH, LENGTH - PREFILL, FEATURES))

        def step(index, state):
            cache, outputs = state
            token = keras.ops.take(
                tokens, keras.ops.reshape(index, (1,)), axis=1
            )  # (batch, 1, features)
            output, cache = layer(
                token, token, cache=cache, cache_update_index=index,
                use_causal_mask=True,
            )
            return cache, keras.ops.slice_update(
                outputs, (0, index - PREFILL, 0), output
            )

        _, outputs = keras.ops.fori_loop(PREFILL, LENGTH, step, (cache, outputs))
        return outputs  # (batch, new, features)

    assert_close(generate(tokens), expected[:, PREFILL:])


def test_cache_matches_keras_hub_cached_multi_head_attention():
    from keras_hub.layers import CachedMultiHeadAttention

    layer = cached_attention("none")
    hub = CachedMultiHeadAttention(HEADS, KEY_DIM)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    hub(tokens, tokens)
    hub.set_weights(weight_values(layer))
    causal = np.tril(np.ones((CACHE_SLOTS, CACHE_SLOTS), bool))  # (query, key)
    cache = hub_cache = empty_cache()
    for start, stop in ((0, PREFILL), (PREFILL, PREFILL + 1), (PREFILL + 1, LENGTH)):
        step = tokens[:, start:stop]
        output, cache = layer(
            step, step, cache=cache, cache_update_index=start, use_causal_mask=True
        )
        hub_output, hub_cache = hub(
            step,
            step,
            cache=hub_cache,
            cache_update_index=start,
            attention_mask=np.broadcast_to(
                causal[start:stop], (BATCH, stop - start, CACHE_SLOTS)
            ),
        )
        assert_close(output, numpy(hub_output), err_msg=f"tokens {start}..{stop}")
        np.testing.assert_array_equal(numpy(cache), numpy(hub_cache))


def test_cache_under_mixed_bfloat16_keeps_its_dtype():
    float32_layer = cached_attention("alibi")
    tokens = random_inputs((BATCH, PREFILL, FEATURES))
    expected, _ = float32_layer(
        tokens, tokens, cache=empty_cache(), cache_update_index=0,
        use_causal_mask=True,
    )
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = PositionalMultiHeadAttention(HEADS, KEY_DIM, position=AlibiBias(HEADS))
    layer(tokens, tokens)
    layer.set_weights(weight_values(float32_layer))
    output, cache = layer(
        tokens, tokens, cache=empty_cache(dtype="bfloat16"), cache_update_index=0,
        use_causal_mask=True,
    )
    assert dtype_of(output) == dtype_of(cache) == "bfloat16"
    expected = numpy(expected)
    assert_close(
        as_float64(output), expected, atol=2**-5 * np.abs(expected).max()
    )


def test_cache_output_spec():
    layer = cached_attention("t5")
    token = keras.KerasTensor((BATCH, 1, FEATURES))
    cache = keras.KerasTensor((BATCH, 2, CACHE_SLOTS, HEADS, KEY_DIM))
    output, weights, new_cache = layer.compute_output_spec(
        token, token, cache=cache, cache_update_index=3,
        return_attention_scores=True,
    )
    assert output.shape == (BATCH, 1, FEATURES)
    assert weights.shape == (BATCH, HEADS, 1, CACHE_SLOTS)
    assert new_cache.shape == cache.shape and new_cache.dtype == "float32"


def test_output_spec_takes_calls_arguments_by_position_or_name():
    # `call`'s order: query, value, key, query_mask, value_mask, key_mask,
    # attention_mask, return_attention_scores.
    layer = cached_attention("t5")
    query = keras.KerasTensor((BATCH, 3, FEATURES))
    value = keras.KerasTensor((BATCH, 5, FEATURES))
    by_position = layer.compute_output_spec(
        query, value, value, None, None, None, None, True
    )
    by_name = layer.compute_output_spec(
        query=query, value=value, return_attention_scores=True
    )
    for output, weights in (by_position, by_name):
        assert output.shape == (BATCH, 3, FEATURES)
        assert weights.shape == (BATCH, HEADS, 3, 5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'cahce'"):
        layer.compute_output_spec(query, value, cahce=None)


@pytest.mark.parametrize(
    "make_layer, call_kwargs, message",
    [
        (
            lambda: cached_attention("alibi"),
            {"cache_update_index": 0},
            r"needs one\. Received: cache=None with cache_update_index=0",
        ),
        (
            lambda: cached_attention("alibi"),
            {"cache": empty_cache()},
            r"Received: cache_update_index=None",
        ),
        (
            lambda: cached_attention("alibi"),
            {"cache": empty_cache(), "cache_update_index": 1.5},
            r"integer .*Received: cache_update_index=1\.5",
        ),
        (
            lambda: cached_attention("alibi"),
            {"cache": empty_cache(), "cache_update_index": CACHE_SLOTS - 1},
            r"fit the cache's 10 slots\. Received: cache_update_index=9 with 2 new",
        ),
        (
            lambda: cached_attention("alibi"),
            {"cache": np.zeros((BATCH, 2, CACHE_SLOTS, HEADS, KEY_DIM + 1), "float32"),
             "cache_update_index": 0},
            r"\(batch, 2, slots, 3, 4\).*Received: cache of shape \(2, 2, 10, 3, 5\)",
        ),
        (
            lambda: attention("alibi"),
            {"cache": empty_cache(), "cache_update_index": 0},
            r"value_dim equal to key_dim\. Received: key_dim=4, value_dim=6",
        ),
        (
            lambda: PositionalMultiHeadAttention(
                HEADS, KEY_DIM, position=RotaryEmbedding(num_prefix_tokens=1)
            ),
            {"cache": empty_cache(), "cache_update_index": 0},
            r"without prefix tokens\. Received: RotaryEmbedding\(num_axes=1, "
            r"num_prefix_tokens=1\)",
        ),
    ],
    ids=[
        "index-without-cache",
        "cache-without-index",
        "float-index",
        "index-past-the-slots",
        "cache-shape",
        "value-dim",
        "prefix-tokens",
    ],
)
def test_bad_cache_raises_value_error_naming_it(make_layer, call_kwargs, message):
    layer = make_layer()
    tokens = random_inputs((BATCH, 2, FEATURES))
    with pytest.raises(ValueError, match=message):
        layer(tokens, tokens, **call_kwargs)


def test_cache_index_read_at_run_time_is_checked():
    layer = cached_attention("alibi")
    tokens = random_inputs((BATCH, 2, FEATURES))

    def attend(index):
        return layer(tokens, tokens, cache=empty_cache(), cache_update_index=index)

    # Eager, and in a TensorFlow graph (InvalidArgumentError there).
    for call in (attend, graph_function(attend, jit_compile=False)):
        with pytest.raises(RUN_TIME_ERRORS, match="cache_update_index"):
            call(keras.ops.convert_to_tensor(CACHE_SLOTS - 1, "int32"))


@pytest.mark.parametrize("index", [CACHE_SLOTS - 1, CACHE_SLOTS + 5, -1])
@pytest.mark.parametrize("scheme", ["alibi", "rotary"])
def test_cache_index_past_the_slots_gives_nan_under_compiled_code(scheme, index):
    # XLA drops the check and a JAX trace cannot raise: the outputs show it.
    layer = cached_attention(scheme)
    tokens = random_inputs((BATCH, 2, FEATURES))
    layer(tokens, tokens, cache=empty_cache(), cache_update_index=0)  # built

    @compiled
    def attend(index):
        return layer(tokens, tokens, cache=empty_cache(), cache_update_index=index)

    index = keras.ops.convert_to_tensor(index, "int32")
    if BACKEND == "torch":  # `compiled` runs it eagerly
        with pytest.raises(ValueError, match="cache_update_index"):
            attend(index)
        return
    outputs, cache = attend(index)
    assert np.isnan(numpy(outputs)).all()
    assert np.isnan(numpy(cache)).any()
    in_range = attend(keras.ops.convert_to_tensor(3, "int32"))
    expected = layer(tokens, tokens, cache=empty_cache(), cache_update_index=3)
    for actual, wanted in zip(in_range, expected):
        np.testing.assert_allclose(numpy(actual), numpy(wanted), rtol=0, atol=1e-6)


def test_cache_refuses_masks_of_the_new_tokens_and_other_lengths():
    layer = cached_attention("alibi")
    ids = np.array([[1, 2, 0], [3, 0, 0]])
    tokens = padded_tokens(ids)
    with pytest.raises(ValueError, match=r"attention_mask.*\(batch, query, slots\)"):
        layer(tokens, tokens, cache=empty_cache(), cache_update_index=0)
    with pytest.raises(ValueError, match=r"same length.*\(2, 1, 5\).*\(2, 3, 5\)"):
        layer(
            random_inputs((BATCH, 1, FEATURES)), random_inputs((BATCH, 3, FEATURES)),
            cache=empty_cache(), cache_update_index=0,
        )


# ALiBi's causal bias, with slopes that are powers of two (the default ones
# of 4 heads, 1/4 to 1/256, and of 3: 1/16, 1/256, 1/4), joins the product
# of queries and keys as two columns, `[m, -m i]` and `[j, 1]`. The default
# slopes of 12 heads (2**-1 to 2**-8, then 2**-0.5, 2**-1.5, ...) are not all
# powers of two: their bias is added to the logits.
ALIBI_PRODUCT_HEADS = 4
ALIBI_ADDED_HEADS = 12


def int32_tensor(values):
    return keras.ops.convert_to_tensor(np.asarray(values, "int32"))


def alibi_attention(heads, seed=1):
    layer = PositionalMultiHeadAttention(
        heads, KEY_DIM, value_dim=VALUE_DIM, position=AlibiBias(heads)
    )
    tokens = np.zeros((1, 1, FEATURES), "float32")
    layer(tokens, tokens)
    randomize_weights(layer, seed)
    return layer


def test_alibi_with_slopes_of_powers_of_two_joins_the_product():
    two_heads = AlibiBias(2).logits_factors(AttentionContext(query_positions=int32_tensor([[3]]), key_positions=int32_tensor([[0, 1, 2, 3]])))
    query_factors, key_factors = (numpy(factor) for factor in two_heads)
    # Head 0, slope 1/16: [m, -m i] . [j, 1] = m (j - i), exactly.
    np.testing.assert_array_equal(query_factors[0, 0, 0], [1 / 16, -3 / 16])
    np.testing.assert_array_equal(key_factors[0, :, 0], [[0, 1], [1, 1], [2, 1], [3, 1]])
    # Other slopes, and the bidirectional form (not of rank two), add the bias.
    zero = int32_tensor([[0]])
    assert AlibiBias(3).logits_factors(AttentionContext(query_positions=zero, key_positions=zero))
    assert AlibiBias(ALIBI_ADDED_HEADS).logits_factors(AttentionContext(query_positions=zero, key_positions=zero)) is None
    assert AlibiBias(2, slopes=[0.3, 0.5]).logits_factors(AttentionContext(query_positions=zero, key_positions=zero)) is None
    assert AlibiBias(2, bidirectional=True).logits_factors(AttentionContext(query_positions=zero, key_positions=zero)) is None


@pytest.mark.parametrize("under_xla", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize(
    "heads", [ALIBI_PRODUCT_HEADS, ALIBI_ADDED_HEADS], ids=["product", "added"]
)
def test_alibi_causal_bias_equals_float64_reference(heads, under_xla):
    layer = alibi_attention(heads)
    queries = random_inputs((BATCH, QUERY_POSITIONS.shape[1], FEATURES))
    values = random_inputs((BATCH, KEY_POSITIONS.shape[1], FEATURES), seed=1)
    mask = keras_mask((BATCH, KEY_POSITIONS.shape[1]))[:, None, :] & np.ones(
        (1, QUERY_POSITIONS.shape[1], 1), bool
    )  # (batch, query, key)

    def attend(query, value, mask):
        return layer(
            query,
            value,
            attention_mask=mask,
            query_positions=QUERY_POSITIONS,
            key_positions=KEY_POSITIONS,
            use_causal_mask=True,
            return_attention_scores=True,
        )

    if under_xla:
        attend = compiled(attend)
    output, weights = attend(queries, values, mask)
    expected_output, expected_weights = reference_attention(
        layer,
        queries,
        values,
        query_positions=QUERY_POSITIONS,
        key_positions=KEY_POSITIONS,
        mask=mask,
        causal=True,
    )
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


def test_alibi_in_the_product_with_a_cache_equals_float64_reference():
    layer = PositionalMultiHeadAttention(
        ALIBI_PRODUCT_HEADS, KEY_DIM, position=AlibiBias(ALIBI_PRODUCT_HEADS)
    )
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    layer(tokens, tokens)
    randomize_weights(layer)
    expected, _ = reference_attention(layer, tokens, tokens, causal=True)
    cache = keras.ops.zeros((BATCH, 2, CACHE_SLOTS, ALIBI_PRODUCT_HEADS, KEY_DIM))
    outputs = []
    for step in (tokens[:, :PREFILL], *np.split(tokens[:, PREFILL:], LENGTH - PREFILL, 1)):
        index = sum(output.shape[1] for output in outputs)
        output, cache = layer(
            step, step, cache=cache, cache_update_index=index, use_causal_mask=True
        )
        outputs.append(output)
    outputs = [numpy(output) for output in outputs]
    assert_close(np.concatenate(outputs, axis=1), expected)


@pytest.mark.parametrize("under_xla", [False, True], ids=["eager", "xla"])
def test_alibi_in_the_product_is_exact_at_long_positions(under_xla):
    # Queries at 8128 .. 8191 against keys 0 .. 8191: the columns hold m j
    # and m i of up to 2048, but their difference comes out exact, so the
    # weights are as close to float64 as with the bias added: a few float32
    # ulps. (Were m j rounded with the products' sum, that is 2048 * 2**-24
    # = 1.2e-4 per logit.)
    layer = PositionalMultiHeadAttention(
        ALIBI_PRODUCT_HEADS, KEY_DIM, position=AlibiBias(ALIBI_PRODUCT_HEADS)
    )
    length, queries = 8192, 64
    tokens = random_inputs((1, length, FEATURES))
    layer(tokens[:, :1], tokens[:, :1])
    randomize_weights(layer)

    def attend(query, value):
        return layer(
            query,
            value,
            query_positions=np.arange(length - queries, length),
            use_causal_mask=True,
            return_attention_scores=True,
        )

    if under_xla:
        attend = compiled(attend)
    output, weights = attend(tokens[:, -queries:], tokens)

    tokens = tokens.astype("float64")
    query = project(tokens[:, -queries:], layer.query_dense)  # (1, query, heads, dim)
    key = project(tokens, layer.key_dense)  # (1, key, heads, dim)
    value = project(tokens, layer.value_dense)  # (1, key, heads, dim)
    slopes = references.alibi_slopes(ALIBI_PRODUCT_HEADS)  # (heads,)
    query_positions = np.arange(length - queries, length)
    distance = np.arange(length)[None, :] - query_positions[:, None]  # (query, key)
    logits = np.einsum("bthd,bshd->bhts", query, key) / math.sqrt(KEY_DIM) + (
        slopes[:, None, None] * distance
    )  # (1, heads, query, key)
    logits = np.where(distance <= 0, logits, -np.inf)
    expected_weights = np.exp(logits - logits.max(-1, keepdims=True))
    expected_weights /= expected_weights.sum(-1, keepdims=True)
    attended = np.einsum("bhts,bshd->bthd", expected_weights, value)
    kernel = np.asarray(numpy(layer.output_dense.kernel.value), "float64")
    bias = np.asarray(numpy(layer.output_dense.bias.value), "float64")
    expected_output = np.einsum("bthd,hdf->btf", attended, kernel) + bias
    assert_close(weights, expected_weights, atol=2e-6)
    assert_close(output, expected_output, atol=1e-5)


# At the attention's default positions and without a mask, ALiBi gives the
# softmax the largest value of its bias over each block of 32 to 64 keys
# (`AttentionPosition.logits_bias_maxima`): the softmax subtracts the
# largest sum of a block's largest unbiased logit and that value, and adds
# the bias inside the exponentials.


def alibi_reference(layer, query, key, slopes, bidirectional):
    """Output and weights of `layer` at the default positions, in float64."""
    query = np.asarray(query, "float64")
    key = np.asarray(key, "float64")
    queries = project(query, layer.query_dense)  # (batch, query, heads, dim)
    keys = project(key, layer.key_dense)
    values = project(key, layer.value_dense)
    distance = (
        np.arange(key.shape[1])[None, :] - np.arange(query.shape[1])[:, None]
    )  # (query, key): j - i
    if bidirectional:
        distance = -np.abs(distance)
    logits = np.einsum(
        "bthd,bshd->bhts", queries, keys
    ) / math.sqrt(queries.shape[-1]) + np.asarray(slopes, "float64")[
        :, None, None
    ] * distance  # (batch, heads, query, key)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attended = np.einsum("bhts,bshd->bthd", weights, values)
    kernel = np.asarray(numpy(layer.output_dense.kernel.value), "float64")
    bias = np.asarray(numpy(layer.output_dense.bias.value), "float64")
    return np.einsum("bthd,hdf->btf", attended, kernel) + bias, weights


def alibi_at_default_positions(heads, bidirectional, queries, keys):
    """An ALiBi attention of random weights, and its query and value inputs."""
    layer = PositionalMultiHeadAttention(
        heads, KEY_DIM, value_dim=VALUE_DIM, position=AlibiBias(heads, bidirectional=bidirectional)
    )
    query = random_inputs((BATCH, queries, FEATURES))
    value = random_inputs((BATCH, keys, FEATURES), seed=1)
    layer(query, value)
    randomize_weights(layer)
    return layer, query, value


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal-form", "bidirectional"])
@pytest.mark.parametrize("heads", [1, 8, ALIBI_ADDED_HEADS])
@pytest.mark.parametrize("keys", [32, 96, 120, 128, 4096])
def test_alibi_bias_maxima_bound_the_bias_of_each_block(keys, heads, bidirectional):
    alibi = AlibiBias(heads, bidirectional=bidirectional)
    queries = 40
    block, maxima = alibi.logits_bias_maxima(AttentionContext(query_positions=int32_tensor(np.arange(queries)[None]), key_positions=int32_tensor(np.arange(keys)[None])))
    slopes = references.alibi_slopes(heads)
    # The largest divisor of the keys from 32 to 64 over which the steepest
    # slope moves the bias by at most 32: 1/256 (1 head), 1/2 (8 heads),
    # 2 ** -0.5 (12 heads, whose 46 keys move it by 31.8).
    largest = {1: 64, 8: 64, ALIBI_ADDED_HEADS: 46}[heads]
    assert (largest - 1) * slopes.max() <= 32
    assert largest == 64 or largest * slopes.max() > 32
    assert block == max(
        size for size in range(32, largest + 1) if keys % size == 0
    )
    distance = np.arange(keys)[None, :] - np.arange(queries)[:, None]
    if bidirectional:
        distance = -np.abs(distance)
    bias = (slopes[:, None, None] * distance).reshape(
        heads, queries, keys // block, block
    )
    maxima = numpy(maxima)[0].astype("float64")  # (heads, query, key / block)
    assert maxima.shape == (heads, queries, keys // block)
    # At least the bias's largest value in the block, at most 32 above its
    # smallest, but for float32's rounding of the slopes and the sums.
    rounding = 1e-6 * (1 + np.abs(bias).max(-1))
    assert np.all(maxima >= bias.max(-1) - rounding)
    assert np.all(maxima - bias.min(-1) <= 32 + rounding)
    if not bidirectional:  # the bias at the block's last key
        np.testing.assert_allclose(maxima, bias[..., -1], rtol=1e-6, atol=1e-6)


def test_alibi_bias_maxima_need_blocks_the_bias_varies_little_over():
    positions = int32_tensor(np.arange(128)[None])
    # 32 keys at the least; a length unknown when traced (below), without a
    # divisor from 32 to 64 (a prime), or slopes so steep that 32 keys move
    # the bias by more than 32: the bias is added to the logits, or joins
    # the product.
    assert AlibiBias(8).logits_bias_maxima(AttentionContext(query_positions=positions[:, :31], key_positions=positions[:, :31])) is None
    assert AlibiBias(8).logits_bias_maxima(AttentionContext(query_positions=positions, key_positions=positions[:, :127])) is None
    assert AlibiBias(2, slopes=[1.0, 2.0]).logits_bias_maxima(AttentionContext(query_positions=positions, key_positions=positions)) is None
    assert AlibiBias(2, slopes=[1.0, 0.5]).logits_bias_maxima(AttentionContext(query_positions=positions, key_positions=positions))[0] == 32


@tensorflow_only  # only a TensorFlow graph leaves a length unknown when traced
def test_alibi_bias_maxima_need_a_length_known_when_traced():
    positions = int32_tensor(np.arange(128)[None])

    def unknown_length(key_positions):
        assert AlibiBias(8).logits_bias_maxima(AttentionContext(query_positions=positions, key_positions=key_positions)) is None
        return key_positions

    graph_function(
        unknown_length, input_signature=[((1, None), "int32")], jit_compile=False
    )(positions)


@pytest.mark.parametrize("under_xla", [False, True], ids=["eager", "xla"])
@pytest.mark.parametrize(
    "heads, bidirectional",
    [(ALIBI_PRODUCT_HEADS, False), (ALIBI_PRODUCT_HEADS, True), (ALIBI_ADDED_HEADS, False)],
    ids=["causal-form", "bidirectional", "added"],
)
@pytest.mark.parametrize("queries, keys", [(96, 96), (40, 128)])
def test_alibi_at_default_positions_equals_float64_reference(
    queries, keys, heads, bidirectional, under_xla
):
    layer, query, value = alibi_at_default_positions(heads, bidirectional, queries, keys)
    attend = functools.partial(layer, return_attention_scores=True)
    if under_xla:
        attend = compiled(attend)
    output, weights = attend(query, value)
    expected_output, expected_weights = alibi_reference(
        layer, query, value, references.alibi_slopes(heads), bidirectional
    )
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


@pytest.mark.parametrize("under_xla", [False, True], ids=["eager", "xla"])
def test_alibi_softmax_keeps_a_far_large_logit_from_underflowing(under_xla):
    # One head of slope 1/2 over 256 keys, key 0 with a logit of 100 for
    # every query, the others 0. Query 0's largest biased logit is 127.5,
    # at key 255, while the largest logit plus the largest bias is 227.5:
    # subtracting that, every exponential of the row would underflow
    # (exp(-100) is below float32's smallest normal number). The blocks'
    # maxima give at most 31.5 more than the true maximum.
    length = 256
    layer = PositionalMultiHeadAttention(
        1, KEY_DIM, value_dim=VALUE_DIM, position=AlibiBias(1, slopes=[0.5])
    )
    tokens = np.zeros((1, length, FEATURES), "float32")
    tokens[0, 0, 0] = 1.0  # key 0
    tokens[0, :, 1] = 1.0  # every query
    tokens[0, :, 2] = random_inputs((length,), seed=3)  # the values
    layer(tokens, tokens)
    for dense in (layer.query_dense, layer.key_dense, layer.value_dense):
        dense.kernel.assign(np.zeros(dense.kernel.shape))
        dense.bias.assign(np.zeros(dense.bias.shape))
    query_kernel = np.zeros(layer.query_dense.kernel.shape, "float32")
    query_kernel[1, 0, 0] = math.sqrt(KEY_DIM)  # q = [sqrt(d), 0, ...]
    key_kernel = np.zeros(layer.key_dense.kernel.shape, "float32")
    key_kernel[0, 0, 0] = 100.0  # k_0 = [100, 0, ...], k_j = 0
    value_kernel = np.zeros(layer.value_dense.kernel.shape, "float32")
    value_kernel[2, 0] = 1.0
    layer.query_dense.kernel.assign(query_kernel)
    layer.key_dense.kernel.assign(key_kernel)
    layer.value_dense.kernel.assign(value_kernel)
    attend = functools.partial(layer, return_attention_scores=True)
    if under_xla:
        attend = compiled(attend)
    output, weights = attend(tokens, tokens)
    expected_output, expected_weights = alibi_reference(
        layer, tokens, tokens, [0.5], bidirectional=False
    )
    assert expected_weights[0, 0, 0, 0] == pytest.approx(math.exp(-127.5 + 100 - 0))
    assert_close(weights, expected_weights)
    assert_close(output, expected_output)


# Gradients sum over a batch, queries and keys: a few float32 ulps of each,
# and of the largest gradient (TensorFlow 2.18's XLA sums the key kernel's,
# of up to 10.7, 1.01e-5 off float64).
GRADIENT_ATOL = 1e-5
GRADIENT_RTOL = 1e-6


def float64_attention_gradients(query, value, kernels, slopes, distance, cotangent):
    """The gradients of `sum(attention(query, value) * cotangent)`, in float64.

    The attention from its formula, with the bias `slopes * distance`, and
    its gradients by `query`, `value` and each of `kernels` (the query, key,
    value and output projections' kernels and biases), by the chain rule
    through each product and the softmax (`w * (g - sum(w g))`).
    """
    (query_kernel, query_bias, key_kernel, key_bias, value_kernel,
     value_bias, output_kernel, output_bias) = kernels  # fmt: skip
    scale = 1 / math.sqrt(query_kernel.shape[-1])
    queries = np.einsum("btf,fnd->btnd", query, query_kernel) + query_bias
    keys = np.einsum("bsf,fnd->bsnd", value, key_kernel) + key_bias
    values = np.einsum("bsf,fnd->bsnd", value, value_kernel) + value_bias
    logits = np.einsum("btnd,bsnd->bnts", queries, keys) * scale + (
        slopes[:, None, None] * distance
    )  # (batch, heads, query, key)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    attended = np.einsum("bnts,bsnd->btnd", weights, values)
    # Back from the output, `attended @ output_kernel + output_bias`.
    d_attended = np.einsum("btf,ndf->btnd", cotangent, output_kernel)
    d_weights = np.einsum("btnd,bsnd->bnts", d_attended, values)
    d_values = np.einsum("bnts,btnd->bsnd", weights, d_attended)
    d_logits = weights * (d_weights - (d_weights * weights).sum(-1, keepdims=True))
    d_queries = np.einsum("bnts,bsnd->btnd", d_logits, keys) * scale
    d_keys = np.einsum("bnts,btnd->bsnd", d_logits, queries) * scale
    d_query = np.einsum("btnd,fnd->btf", d_queries, query_kernel)
    d_value = np.einsum("bsnd,fnd->bsf", d_keys, key_kernel) + np.einsum(
        "bsnd,fnd->bsf", d_values, value_kernel
    )
    return [
        d_query,
        d_value,
        np.einsum("btf,btnd->fnd", query, d_queries),
        d_queries.sum((0, 1)),
        np.einsum("bsf,bsnd->fnd", value, d_keys),
        d_keys.sum((0, 1)),
        np.einsum("bsf,bsnd->fnd", value, d_values),
        d_values.sum((0, 1)),
        np.einsum("btnd,btf->ndf", attended, cotangent),
        cotangent.sum((0, 1)),
    ]


def test_alibi_at_default_positions_under_xla_gradients_equal_float64():
    heads, queries, keys = ALIBI_PRODUCT_HEADS, 40, 96
    layer, query, value = alibi_at_default_positions(heads, True, queries, keys)
    cotangent = random_inputs((BATCH, queries, FEATURES), seed=2)
    slopes = references.alibi_slopes(heads)
    distance = -np.abs(np.arange(keys)[None, :] - np.arange(queries)[:, None])
    denses = (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
    variables = [weight for dense in denses for weight in (dense.kernel, dense.bias)]

    def weighted_output(query, value, *weights):
        # The layer as a function of its weights, given in the order above.
        given = dict(zip(map(id, variables), weights))
        trainable = [given[id(variable)] for variable in layer.trainable_variables]
        output, _ = layer.stateless_call(trainable, [], query, value)
        return keras.ops.multiply(output, cotangent)

    actual = gradients(
        compiled(weighted_output), query, value, *(numpy(v.value) for v in variables)
    )
    expected = float64_attention_gradients(
        query.astype("float64"),
        value.astype("float64"),
        [numpy(variable.value).astype("float64") for variable in variables],
        slopes,
        distance,
        cotangent.astype("float64"),
    )
    names = ["query", "value"] + [variable.path for variable in variables]
    for gradient, expected_gradient, name in zip(actual, expected, names):
        atol = GRADIENT_ATOL + GRADIENT_RTOL * np.abs(expected_gradient).max()
        assert_close(gradient, expected_gradient, atol=atol, err_msg=name)


@pytest.mark.jax_only
@pytest.mark.parametrize("scheme", ["rope", "alibi", "t5"])
def test_on_jax_attention_writes_no_more_logits_than_keras(scheme):
    # Where XLA fuses Keras' attention whole (jaxlib 0.10.2 on the CPU),
    # the attention keeps Keras' order and writes no logits either, a bias
    # of the logits' size or shared by the batch included; elsewhere it
    # writes them no more often than Keras (`_backend.fuses_attention`).
    batch, length, heads, key_dim = 2, 256, 8, 64
    inputs = keras.random.normal((batch, length, heads * key_dim), seed=0)
    plain = keras.layers.MultiHeadAttention(heads, key_dim)
    position = {
        "rope": RotaryEmbedding(),
        "alibi": AlibiBias(heads),
        "t5": RelativePositionBias(heads),
    }[scheme]
    layer = PositionalMultiHeadAttention(heads, key_dim, position=position)
    size = batch * heads * length * length
    found = compiled_program.results_of_size(
        compiled_program.optimized_hlo(lambda x: layer(x, x), inputs), size
    )
    # Asking for the scores takes Keras' einsum path; they are dropped.
    keras_writes = compiled_program.results_of_size(
        compiled_program.optimized_hlo(
            lambda x: plain(x, x, return_attention_scores=True)[0], inputs
        ),
        size,
    )
    assert found <= keras_writes


def optimized_hlo_of(program, *arguments):
    """The optimized HLO of a `compiled_program.jit` program, from its trace.

    `compiled_program.optimized_hlo` traces its function anew; this reads
    the program already traced for `arguments`, as it ran.
    """
    if BACKEND == "tensorflow":
        return program.experimental_get_compiler_ir(*arguments)(stage="optimized_hlo")
    return program.lowered(*arguments).as_text()


@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scheme", ["shaw", "t5"])
def test_attention_over_blocks_of_queries_equals_float64_reference(
    scheme, causal, masked, monkeypatch
):
    # The kernel attends to a few queries at a time where the logits are
    # large (`_attention_kernel`): here 3 blocks of 4, under XLA, masks and
    # the causal mask sliced per block.
    from keras_posenc.layers import _attention_kernel

    for name in (
        "QUERY_BLOCK",
        "FUSED_XLA_QUERY_BLOCK",
        "FUSED_XLA_VALUE_TERM_QUERY_BLOCK",
        "SMALLEST_QUERY_BLOCK",
    ):
        monkeypatch.setattr(_attention_kernel, name, 4)
    for name in ("LOGITS_ELEMENTS", "BLOCK_ELEMENTS"):
        monkeypatch.setattr(_attention_kernel, name, 1)
    length = 12
    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=SCHEMES[scheme]()
    )
    layer(np.zeros((1, 1, FEATURES), "float32"), np.zeros((1, 1, FEATURES), "float32"))
    randomize_weights(layer)
    tokens = random_inputs((BATCH, length, FEATURES))
    mask = keras_mask((BATCH, length, length)) if masked else None

    def call(tokens):
        return layer(tokens, tokens, attention_mask=mask, use_causal_mask=causal)

    expected, _ = reference_attention(layer, tokens, tokens, mask=mask, causal=causal)
    # One program, traced once: its outputs are checked and its HLO read.
    program = compiled_program.jit(call)
    assert_close(program(tokens), expected)
    if BACKEND in ("tensorflow", "jax"):
        # No tensor of all the logits' size: a block's are a third of it.
        hlo = optimized_hlo_of(program, tokens)
        assert compiled_program.results_of_size(hlo, BATCH * HEADS * length**2) == 0
    # The gradients are those of the whole attention at once. JAX takes
    # them compiled: differentiating its loop over the blocks eagerly takes
    # several times as long as compiling it.
    def input_gradients():
        if BACKEND != "jax":
            return gradients(call, tokens)[0]
        function = compiled(gradient_function(call))
        return numpy(function(keras.ops.convert_to_tensor(tokens))[0])

    blocked = input_gradients()
    monkeypatch.setattr(_attention_kernel, "choose", lambda *a, **k: ("reference", None))
    assert_close(input_gradients(), blocked.astype("float64"))


@pytest.mark.parametrize("scheme", ["none", "rotary", "alibi"])
def test_query_mask_masks_the_queries(scheme):
    # Keras' own `call` reads the queries' mask from their tensor and drops
    # the argument; here it masks as that tensor's mask would.
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    query_mask = np.arange(LENGTH)[None] < np.array([[4], [LENGTH]])  # (batch, query)
    rows = np.broadcast_to(query_mask[:, :, None], (BATCH, LENGTH, LENGTH))
    positions = {"query_positions": np.arange(LENGTH)} if scheme == "none" else {}
    masked = layer(tokens, tokens, query_mask=query_mask, **positions)
    expected, _ = reference_attention(layer, tokens, tokens, mask=rows)
    assert_close(masked, expected)
    # With an attention mask too, both hold.
    mask = keras_mask((BATCH, LENGTH, LENGTH))
    both = layer(tokens, tokens, query_mask=query_mask, attention_mask=mask, **positions)
    expected, _ = reference_attention(layer, tokens, tokens, mask=rows & mask)
    assert_close(both, expected)


@pytest.mark.parametrize(
    "call_kwargs, message",
    [
        ({"attention_mask": np.ones((BATCH, LENGTH), bool)}, "`attention_mask` must have shape"),
        ({"attention_mask": np.ones((BATCH, LENGTH, 3), bool)}, "`attention_mask` must have shape"),
        ({"query_mask": np.ones((BATCH, LENGTH, 1), bool)}, "`query_mask` must have shape"),
        (
            {"attention_mask": np.ones((BATCH + 1, LENGTH, LENGTH), bool)},
            rf"`attention_mask` must have shape .*batch={BATCH}.*\({BATCH + 1}, {LENGTH}, {LENGTH}\)",
        ),
        (
            {"query_mask": np.ones((BATCH, LENGTH - 2), bool)},
            rf"`query_mask` must have shape \(batch, query\), here \({BATCH}, {LENGTH}\).*\({BATCH}, {LENGTH - 2}\)",
        ),
        (
            {"value_mask": np.ones((BATCH, LENGTH - 2), bool)},
            rf"`value_mask` must have shape \(batch, key\), here \({BATCH}, {LENGTH}\).*\({BATCH}, {LENGTH - 2}\)",
        ),
        (
            {"key_mask": np.ones((BATCH + 1, LENGTH), bool)},
            rf"`key_mask` must have shape \(batch, key\).*\({BATCH + 1}, {LENGTH}\)",
        ),
        (
            {"attention_mask": np.full((BATCH, LENGTH, LENGTH), "1")},
            "`attention_mask` must hold bools .*dtype <U1",
        ),
        ({"query_mask": np.full((BATCH, LENGTH), "1")}, "`query_mask` must hold bools"),
    ],
    ids=[
        "attention-mask-of-the-keys",
        "attention-mask-of-other-keys",
        "query-mask-of-rank-3",
        "attention-mask-of-another-batch",
        "query-mask-of-other-queries",
        "value-mask-of-other-keys",
        "key-mask-of-another-batch",
        "attention-mask-of-strings",
        "query-mask-of-strings",
    ],
)
@pytest.mark.parametrize("scheme", ["rotary", "none"])
def test_masks_of_the_wrong_shape_or_dtype_raise_value_error_naming_them(
    scheme, call_kwargs, message
):
    # Before any backend op: Keras' own attention (no scheme) as well.
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    with pytest.raises(ValueError, match=message):
        layer(tokens, tokens, **call_kwargs)


@pytest.mark.parametrize("name", ["query", "value", "key"])
def test_inputs_of_other_features_than_built_on_raise_value_error_naming_them(name):
    layer = attention("rotary")
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    layer(tokens, tokens, key=tokens)
    inputs = {"query": tokens, "value": tokens, "key": tokens}
    inputs[name] = random_inputs((BATCH, LENGTH, FEATURES + 3))
    with pytest.raises(
        ValueError, match=rf"`{name}` must have {FEATURES} features.*{FEATURES + 3}\)"
    ):
        layer(**inputs)


@pytest.mark.parametrize("scheme", ["rotary", "alibi", "none"])
def test_int64_positions_past_int32_raise_value_error_naming_them(scheme):
    # Keras converts NumPy arguments before `call`, wrapping int64 on JAX.
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    positions = np.arange(LENGTH, dtype="int64") + 2**31 - 3
    with pytest.raises(ValueError, match=r"`key_positions` must fit in int32.*key_positions\[3\]=2147483648"):
        layer(tokens, tokens, query_positions=np.arange(LENGTH), key_positions=positions)


# int64 tensors reach compiled code on TensorFlow alone: `jax.jit` converts
# them to int32 (without 64-bit numbers) before any layer sees them, and
# PyTorch runs eagerly, where the positions raise (the test above).
@tensorflow_only
@pytest.mark.parametrize("scheme", ["rotary", "alibi", "none"])
def test_int64_positions_past_int32_in_compiled_code_give_nan(scheme):
    # XLA cannot raise: the output is NaN, not the attention at the
    # positions' int32 wrap.
    import tensorflow as tf

    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    call = tf.function(
        lambda x, query, key: layer(
            x, x, use_causal_mask=True, query_positions=query, key_positions=key
        ),
        jit_compile=True,
    )
    inside = tf.constant(np.arange(LENGTH) + 2**31 - 1 - LENGTH, tf.int64)
    past = inside + LENGTH  # the last LENGTH - 1 past int32
    assert np.isfinite(numpy(call(tokens, inside, inside))).all()
    assert np.isnan(numpy(call(tokens, past, inside))).all()
    assert np.isnan(numpy(call(tokens, inside, past))).all()


@pytest.mark.parametrize("scheme", ["rotary", "alibi", "none"])
def test_inputs_of_other_batch_sizes_raise_value_error_naming_them(scheme):
    # Each sequence of queries attends to its own sequence of keys: a
    # batch of 1 is not broadcast against one of 2.
    layer = attention(scheme)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    message = r"same batch size.*query of shape \(2, 7, 5\), value of shape \(1, 7, 5\)"
    with pytest.raises(ValueError, match=message):
        layer(tokens, tokens[:1])
    with pytest.raises(ValueError, match=r"key of shape \(1, 7, 5\)"):
        layer(tokens, tokens, key=tokens[:1])


@pytest.mark.parametrize("scheme", ["rotary", "alibi", "shaw"])
def test_input_masks_combine_with_a_mask_per_head(scheme):
    # The padding the tokens carry, (batch, query, 1) and (batch, 1, key),
    # with an attention mask of rank 4: each head its own mask.
    layer = attention(scheme)
    ids = np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 0, 0, 0]])
    padding = ids != 0  # (batch, seq)
    tokens = padded_tokens(ids)
    per_head = keras_mask((BATCH, HEADS, LENGTH, LENGTH))
    output = layer(tokens, tokens, attention_mask=per_head)
    mask = per_head & padding[:, None, :, None] & padding[:, None, None, :]
    expected, _ = reference_attention(layer, numpy(tokens), numpy(tokens), mask=mask)
    assert_close(numpy(output)[padding], expected[padding])
    np.testing.assert_array_equal(keras_mask_of(output), padding)


def test_masked_inputs_raise_no_warning_of_a_lost_mask(recwarn):
    # Keras' order: the masks come off the inputs before the projections,
    # which would warn that they destroy them.
    layer = attention("rotary")
    tokens = padded_tokens(np.array([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 0, 0, 0]]))
    layer(tokens, tokens)
    assert not [w for w in recwarn if "destroy the mask" in str(w.message)]


# Keras' gate on the output, from Keras 3.15 on.
@pytest.mark.newest
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_gate_equals_keras_with_a_rotation_by_zero(causal):
    # At position 0 for every query and key RoPE turns nothing: the layer's
    # own call must then equal Keras' own gated attention, same weights.
    keras.utils.set_random_seed(3)
    ours = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=RotaryEmbedding(), use_gate=True
    )
    theirs = keras.layers.MultiHeadAttention(HEADS, KEY_DIM, use_gate=True)
    tokens = random_inputs((BATCH, LENGTH, FEATURES))
    zeros = np.zeros((LENGTH,), "int32")
    ours(tokens, tokens, query_positions=zeros, key_positions=zeros)
    theirs(tokens, tokens)
    randomize_weights(ours)
    theirs.set_weights(ours.get_weights())
    mask = np.tril(np.ones((LENGTH, LENGTH), bool)) if causal else None
    assert_close(
        ours(tokens, tokens, query_positions=zeros, key_positions=zeros, attention_mask=mask),
        numpy(theirs(tokens, tokens, use_causal_mask=causal)).astype("float64"),
    )
