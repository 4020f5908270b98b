import keras
import numpy as np
import pytest

from keras_posenc import TokenAndPositionEmbedding
from tests import references
from tests.backend import RUN_TIME_ERRORS
from tests.backend import XLA
from tests.backend import compiled
from tests.backend import keras_mask
from tests.backend import numpy
from tests.test_case import TestCase


def dtype_of(tensor):
    """A tensor's dtype as Keras names it: "float32", "bfloat16"..."""
    return keras.backend.standardize_dtype(tensor.dtype)


class TokenAndPositionEmbeddingLayerTest(TestCase):
    def test_layer_behaviour(self):
        for init_kwargs, expected_num_trainable_weights in [
            ({"vocabulary_size": 20, "embedding_dim": 6}, 1),
            (
                {
                    "vocabulary_size": 20,
                    "embedding_dim": 6,
                    "sequence_length": 5,
                    "position_encoding": "learned",
                },
                2,
            ),
        ]:
            self.run_layer_test(
                TokenAndPositionEmbedding,
                init_kwargs=init_kwargs,
                # int32: JAX 0.12 warns of an int64 input that it truncates.
                input_data=np.random.default_rng(0).integers(1, 20, (2, 5), dtype="int32"),
                expected_output_shape=(2, 5, 6),
                expected_num_trainable_weights=expected_num_trainable_weights,
                expected_num_non_trainable_weights=0,
            )


TOKENS = np.array([[3, 7, 7, 1, 0, 0], [5, 2, 9, 9, 4, 8]])


def test_sinusoidal_adds_the_paper_encoding_to_the_token_vectors():
    layer = TokenAndPositionEmbedding(10, 8)
    outputs = numpy(layer(TOKENS))
    vocabulary = numpy(layer.token_embedding.embeddings.value)  # (10, 8)
    expected = vocabulary[TOKENS] + references.sinusoidal(np.arange(6), 8)
    np.testing.assert_allclose(outputs, expected, atol=1e-6)


def test_learned_adds_the_position_rows_and_honours_start_index():
    layer = TokenAndPositionEmbedding(
        10, 4, sequence_length=8, position_encoding="learned"
    )
    outputs = numpy(layer(TOKENS, start_index=keras.ops.convert_to_tensor(2)))
    vocabulary = numpy(layer.token_embedding.embeddings.value)
    table = numpy(layer.position_embedding.embeddings.value)  # (8, 4)
    np.testing.assert_array_equal(outputs, vocabulary[TOKENS] + table[2:8])
    with pytest.raises(ValueError, match="sequence_length=8"):
        layer(TOKENS, start_index=3)


def test_mask_zero_masks_padding_only():
    layer = TokenAndPositionEmbedding(10, 4, mask_zero=True)
    outputs = layer(TOKENS)
    np.testing.assert_array_equal(keras_mask(outputs), TOKENS != 0)
    np.testing.assert_array_equal(numpy(layer.compute_mask(TOKENS)), TOKENS != 0)
    assert TokenAndPositionEmbedding(10, 4).compute_mask(TOKENS) is None


def test_sublayers_follow_the_dtype_policy():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = TokenAndPositionEmbedding(10, 4, sequence_length=6, position_encoding="learned")
    outputs = layer(TOKENS)
    assert dtype_of(outputs) == "bfloat16"
    assert layer.token_embedding.dtype_policy.name == "mixed_bfloat16"
    assert layer.position_embedding.dtype_policy.name == "mixed_bfloat16"


def test_mixed_bfloat16_keeps_float_positions_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    layer = TokenAndPositionEmbedding(10, 8)
    # bfloat16 would round these to 1000, 3008 and 32768 on the way in.
    timestamps = np.array([1000.125, 3000.75, 32760.25], "float32")
    tokens = TOKENS[:1, :3]
    outputs = layer(tokens, positions=timestamps)
    vocabulary = numpy(
        keras.ops.cast(
            keras.ops.cast(layer.token_embedding.embeddings.value, "bfloat16"),
            "float32",
        )
    ).astype("float64")
    expected = vocabulary[tokens] + references.sinusoidal(timestamps, 8)
    # Two bfloat16 roundings of values below 3: 2 * 2**-8 * 3 at most, and
    # float32 angles near 32768 off by 2**-9 radians.
    error = np.abs(
        numpy(keras.ops.cast(outputs, "float32")).astype("float64") - expected
    )
    assert error.max() <= 3e-2, error.max()


def test_config_round_trip():
    layer = TokenAndPositionEmbedding(
        30, 8, sequence_length=16, position_encoding="learned", mask_zero=True
    )
    config = layer.get_config()
    assert {
        "vocabulary_size": 30,
        "embedding_dim": 8,
        "sequence_length": 16,
        "position_encoding": "learned",
        "mask_zero": True,
    }.items() <= config.items()
    assert TokenAndPositionEmbedding.from_config(config).get_config() == config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vocabulary_size": 0, "embedding_dim": 4}, "vocabulary_size=0"),
        ({"vocabulary_size": 10, "embedding_dim": -4}, "embedding_dim=-4"),
        (
            {"vocabulary_size": 10, "embedding_dim": 4, "sequence_length": 0},
            "sequence_length=0",
        ),
        (
            {"vocabulary_size": 10, "embedding_dim": 4, "position_encoding": "rotary"},
            "position_encoding='rotary'",
        ),
        (
            {"vocabulary_size": 10, "embedding_dim": 4, "position_encoding": "learned"},
            "sequence_length=None",
        ),
        (
            {"vocabulary_size": 10, "embedding_dim": 4, "mask_zero": "yes"},
            "mask_zero='yes'",
        ),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenAndPositionEmbedding(**kwargs)


def test_bad_input_rank_says_what_was_expected():
    with pytest.raises(ValueError, match=r"\(batch, sequence\)"):
        TokenAndPositionEmbedding(10, 4)(np.zeros((2, 3, 4), "int32"))



@pytest.mark.parametrize("token_id", [10, -1])
def test_token_ids_past_the_table_are_refused_naming_them(token_id):
    # Eagerly on every backend, and in a TensorFlow graph, where the
    # lookup's own error names no argument.
    layer = TokenAndPositionEmbedding(10, 8, 8)
    with pytest.raises(RUN_TIME_ERRORS, match=rf"`inputs` must be token ids from 0 to 9.*inputs\[0, 2\]={token_id}"):
        layer(np.int32([[1, 2, token_id, 4]]))


def test_compiled_code_makes_the_rows_of_token_ids_past_the_table_nan():
    layer = TokenAndPositionEmbedding(10, 8, 8)
    ids = keras.ops.convert_to_tensor(np.int32([[1, 2, 12, 4]]))
    layer(np.int32([[1, 2, 3, 4]]))
    if not XLA:
        # PyTorch runs `compiled` eagerly, where the ids are known.
        with pytest.raises(ValueError, match="`inputs` must be token ids"):
            compiled(layer)(ids)
        return
    output = numpy(compiled(layer)(ids))
    assert np.isnan(output[0, 2]).all()
    assert np.isfinite(output[0, [0, 1, 3]]).all()


def test_string_token_ids_are_refused_naming_them():
    with pytest.raises(ValueError, match="`inputs` must hold integer token ids.*dtype <U1"):
        TokenAndPositionEmbedding(10, 8, 8)(np.array([["1", "2", "3", "4"]]))
