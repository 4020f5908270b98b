"""Every public layer, in a model, on whichever backend runs the suite.

The per-layer files check values against float64 references; this one is
the short list that `make test-torch` runs as well: a forward pass, a
training step (the gradients reach every weight), the same step compiled,
and a `.keras` round trip with identical outputs.
"""

import keras
import numpy as np
import pytest

from tests.test_cross_backend import MODELS
from tests.test_cross_backend import _as_float32

# PyTorch's compiler is not XLA: there `jit_compile=True` is TensorFlow's
# and JAX's alone.
COMPILERS = [False, True] if keras.backend.backend() != "torch" else [False]


def model_and_inputs(name):
    keras.utils.set_random_seed(0)
    build, make_inputs = MODELS[name]
    return build(), _as_float32(make_inputs(np.random.default_rng(1)))


@pytest.mark.parametrize("name", MODELS)
def test_forward_pass_is_finite(name):
    model, inputs = model_and_inputs(name)
    outputs = keras.ops.convert_to_numpy(model(inputs))
    assert outputs.shape[0] == 2
    assert np.isfinite(outputs).all()


@pytest.mark.parametrize("jit_compile", COMPILERS)
@pytest.mark.parametrize("name", MODELS)
def test_a_training_step_moves_every_weight(name, jit_compile):
    model, inputs = model_and_inputs(name)
    shape = keras.ops.convert_to_numpy(model(inputs)).shape
    targets = np.random.default_rng(2).normal(size=shape).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=jit_compile)
    before = [keras.ops.convert_to_numpy(weight) for weight in model.trainable_weights]
    loss = model.train_on_batch(inputs, targets)
    assert np.isfinite(loss)
    for weight, old in zip(model.trainable_weights, before):
        assert not np.array_equal(keras.ops.convert_to_numpy(weight), old), weight.path


@pytest.mark.parametrize("name", MODELS)
def test_keras_file_round_trip_gives_identical_outputs(name, tmp_path):
    model, inputs = model_and_inputs(name)
    # Both called as they are: `predict` would trace each model anew.
    expected = keras.ops.convert_to_numpy(model(inputs))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(inputs)), expected)
