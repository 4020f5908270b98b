"""The attention's key/value cache object against NumPy's slicing.

The attention's cached decoding, and the errors of a cache that does not
fit, are tested through the layer in `test_positional_multi_head_attention`;
here the object's own answers: the slots it writes, which slots hold a key,
and the new tokens' positions, with the index read at run time and the
number of new tokens unknown until then.
"""

import numpy as np
import pytest

import keras

from keras_posenc import AttentionContext
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc.layers._attention_cache import AttentionCache
from tests.backend import graph_function
from tests.backend import numpy

BATCH, SLOTS, HEADS, KEY_DIM, FEATURES = 2, 7, 2, 3, 6


def key_positions():
    """Positions of the slots on two axes, `(1, slots, 2)`: `(10 s, s)`."""
    slots = np.arange(SLOTS, dtype="int32")
    return np.stack([10 * slots, slots], axis=-1)[None]


def expected(cache, index, keys, values):
    """NumPy's answers: the cache written, the slots written, the new positions."""
    new = keys.shape[1]
    written = cache.copy()
    written[:, 0, index : index + new] = keys
    written[:, 1, index : index + new] = values
    return written, np.arange(SLOTS) < index + new, key_positions()[:, index : index + new]


@pytest.mark.parametrize("new", [1, 3])
@pytest.mark.parametrize("at_run_time", [False, True], ids=["int", "run-time"])
def test_the_update_and_the_written_slots_equal_numpys(new, at_run_time):
    attention = PositionalMultiHeadAttention(HEADS, KEY_DIM)
    rng = np.random.default_rng(new)
    cache = rng.normal(size=(BATCH, 2, SLOTS, HEADS, KEY_DIM)).astype("float32")
    keys, values = rng.normal(size=(2, BATCH, new, HEADS, KEY_DIM)).astype("float32")
    tokens = np.zeros((BATCH, new, FEATURES), "float32")
    index = SLOTS - new - 1

    def answers(cache, index, tokens, keys, values):
        checked, _ = AttentionCache.checked(
            attention, cache, index, tokens, tokens, False, "no `position`"
        )
        slots = keras.ops.arange(SLOTS, dtype="int32")
        return (
            checked.updated(keys, values).tensor,
            checked.written(),
            checked.written_at(slots),  # pointwise, as FlexAttention's mask reads it
            checked.new_positions(keras.ops.convert_to_tensor(key_positions())),
        )

    if at_run_time:
        # The index a tensor, the new tokens' number unknown in the graph.
        answers = graph_function(
            answers,
            [
                (cache.shape, "float32"),
                ((), "int32"),
                ((BATCH, None, FEATURES), "float32"),
                ((BATCH, None, HEADS, KEY_DIM), "float32"),
                ((BATCH, None, HEADS, KEY_DIM), "float32"),
            ],
        )
        index = keras.ops.convert_to_tensor(index, "int32")
    written, slots, slots_pointwise, positions = answers(
        cache, index, tokens, keys, values
    )
    wanted_cache, wanted_slots, wanted_positions = expected(
        cache, SLOTS - new - 1, keys, values
    )
    np.testing.assert_array_equal(numpy(written), wanted_cache)
    np.testing.assert_array_equal(numpy(slots), wanted_slots)
    np.testing.assert_array_equal(numpy(slots_pointwise), wanted_slots)
    np.testing.assert_array_equal(numpy(positions), wanted_positions)


def test_a_context_and_its_cache_agree_on_the_index():
    positions = keras.ops.arange(SLOTS, dtype="int32")[None]
    assert AttentionContext(positions, positions)._cache is None
    # Made by hand with an index alone: the slots up to the queries' last.
    by_hand = AttentionContext(
        query_positions=positions[:, 2:4], key_positions=positions, cache_update_index=2
    )
    np.testing.assert_array_equal(numpy(by_hand._cache.written()), np.arange(SLOTS) < 4)
    moved = by_hand.replace(cache_update_index=4)
    assert moved.cache_update_index == 4
    np.testing.assert_array_equal(numpy(moved._cache.written()), np.arange(SLOTS) < 6)
    # Made by the attention with its cache: the index is the cache's.
    tokens = np.zeros((BATCH, 1, FEATURES), "float32")
    cache, _ = AttentionCache.checked(
        PositionalMultiHeadAttention(HEADS, KEY_DIM),
        np.zeros((BATCH, 2, SLOTS, HEADS, KEY_DIM), "float32"),
        5,
        tokens,
        tokens,
        False,
        "no `position`",
    )
    context = AttentionContext(positions[:, 5:6], positions, _cache=cache)
    assert context.cache_update_index == 5
    assert context.replace(causal=True)._cache is cache
    np.testing.assert_array_equal(numpy(context._cache.written()), np.arange(SLOTS) < 6)
