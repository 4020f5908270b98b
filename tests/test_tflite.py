"""TFLite: a small model of each encoding converts and predicts as in Keras.

Every model takes sequences of unknown length; the converter is limited to
TFLite's built-in ops, so a model that converts runs on the plain TFLite
runtime, without the Flex (TensorFlow ops) delegate. The interpreter is
resized to two lengths and a batch of two.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.lite.python.convert_phase import ConverterError

import keras_posenc
from tests.backend import tensorflow_only

# TensorFlow points to the separate `ai_edge_litert` package, which is not
# a dependency; `tf.lite.Interpreter` still runs the same flatbuffers.
pytestmark = [
    tensorflow_only,
    pytest.mark.filterwarnings(
        "ignore:.*tf.lite.Interpreter is deprecated:UserWarning"
    ),
]

FEATURES = 16
LENGTHS = (5, 11)


def absolute_model(layer):
    inputs = keras.Input(shape=(None, FEATURES))
    return keras.Model(inputs, layer(inputs))


def token_model(position):
    inputs = keras.Input(shape=(None,), dtype="int32")
    embedding = keras_posenc.TokenAndPositionEmbedding(
        vocabulary_size=100,
        embedding_dim=FEATURES,
        sequence_length=16,
        position_encoding=position,
    )
    return keras.Model(inputs, embedding(inputs))


def attention_model(position, use_causal_mask=True):
    inputs = keras.Input(shape=(None, FEATURES))
    attention = keras_posenc.PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=position
    )
    outputs = attention(inputs, inputs, use_causal_mask=use_causal_mask)
    return keras.Model(inputs, outputs)


def yarn():
    return {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 4,
    }


def dynamic():
    return {
        "rope_type": "dynamic",
        "factor": 4.0,
        "original_max_position_embeddings": 4,
    }


MODELS = {
    "sinusoidal": lambda: absolute_model(
        keras_posenc.SinusoidalPositionEncoding()
    ),
    "learned": lambda: absolute_model(keras_posenc.PositionEmbedding(16)),
    "token_sinusoidal": lambda: token_model("sinusoidal"),
    "token_learned": lambda: token_model("learned"),
    "rotary": lambda: absolute_model(keras_posenc.RotaryEmbedding()),
    "rotary_yarn": lambda: absolute_model(
        keras_posenc.RotaryEmbedding(scaling=yarn())
    ),
    "rotary_dynamic": lambda: absolute_model(
        keras_posenc.RotaryEmbedding(scaling=dynamic())
    ),
    "attention_none": lambda: attention_model(None),
    "attention_rotary": lambda: attention_model(keras_posenc.RotaryEmbedding()),
    "attention_alibi": lambda: attention_model(keras_posenc.AlibiBias(2)),
    "attention_shaw": lambda: attention_model(
        keras_posenc.RelativePositionEmbedding(max_relative_position=4)
    ),
    "attention_t5": lambda: attention_model(
        keras_posenc.RelativePositionBias(2, num_buckets=8, max_distance=16)
    ),
    # One axis: the default positions serve, with no input for them.
    "attention_grid_bias_one_axis": lambda: attention_model(
        keras_posenc.GridRelativePositionBias(2, (4,)), use_causal_mask=False
    ),
}


def sample_inputs(model, length):
    rng = np.random.default_rng(length)
    if model.inputs[0].dtype == "int32":
        return rng.integers(1, 100, size=(2, length)).astype("int32")
    return rng.normal(size=(2, length, FEATURES)).astype("float32")


def run_tflite(flatbuffer, inputs):
    interpreter = tf.lite.Interpreter(model_content=flatbuffer)
    (input_details,) = interpreter.get_input_details()
    (output_details,) = interpreter.get_output_details()
    interpreter.resize_tensor_input(input_details["index"], inputs.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(input_details["index"], inputs)
    interpreter.invoke()
    return interpreter.get_tensor(output_details["index"])


def builtins_converter(converter):
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    return converter


@pytest.mark.parametrize("name", list(MODELS))
def test_converts_with_builtin_ops_and_predicts_as_keras(name):
    model = MODELS[name]()
    converter = builtins_converter(tf.lite.TFLiteConverter.from_keras_model(model))
    flatbuffer = converter.convert()
    for length in LENGTHS:
        inputs = sample_inputs(model, length)
        np.testing.assert_allclose(
            run_tflite(flatbuffer, inputs),
            model(inputs).numpy(),
            atol=1e-5,
            rtol=1e-5,
        )


def test_converts_from_the_exported_saved_model(tmp_path):
    model = attention_model(keras_posenc.AlibiBias(2))
    model.export(str(tmp_path / "exported"), verbose=False)
    converter = builtins_converter(
        tf.lite.TFLiteConverter.from_saved_model(str(tmp_path / "exported"))
    )
    inputs = sample_inputs(model, 7)
    np.testing.assert_allclose(
        run_tflite(converter.convert(), inputs),
        model(inputs).numpy(),
        atol=1e-5,
        rtol=1e-5,
    )


# At the floor, Keras 3.8, MultiHeadAttention always builds the mask by
# comparing indices, which converts.
@pytest.mark.newest
def test_keras_causal_mask_on_unknown_length_needs_tensorflow_ops():
    # Keras' own MultiHeadAttention, with the causal mask its only mask,
    # hands it to the backend's causal kernel, which slices with a
    # TensorFlow op that TFLite lacks. This package's layer hands Keras the
    # causal mask as a mask without a position, and compares positions with
    # one (MODELS above).
    inputs = keras.Input(shape=(None, FEATURES))
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    with pytest.raises(ConverterError, match="StridedSlice"):
        builtins_converter(
            tf.lite.TFLiteConverter.from_keras_model(model)
        ).convert()
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [
        tf.lite.OpsSet.TFLITE_BUILTINS,
        tf.lite.OpsSet.SELECT_TF_OPS,
    ]
    flatbuffer = converter.convert()
    # It converts, but then runs only where the Flex delegate is linked in,
    # which `tf.lite.Interpreter` is not.
    with pytest.raises(RuntimeError, match="Flex delegate"):
        run_tflite(flatbuffer, sample_inputs(model, 7))
