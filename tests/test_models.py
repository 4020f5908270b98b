"""The absolute encodings inside whole models.

Saving to `.keras` and loading in a fresh process, SavedModel export served
by plain TensorFlow (absolute encodings, RoPE and attention with each
relative scheme), XLA training at two lengths, `MirroredStrategy`, masks,
a keras-nlp transformer, cached decoding with a tensor `start_index`, and the
errors a learned table raises past its end.
"""

import os
import subprocess
import sys
import textwrap

import keras
import keras_nlp
import numpy as np
import pytest
import keras_posenc
from tests.backend import BACKEND
from tests.backend import compiled
from tests.backend import numpy
from tests.backend import tensorflow_only

VOCABULARY_SIZE = 20
WIDTH = 8
MAX_LENGTH = 16
POSITIONS = ("sinusoidal", "learned")

# Loads every `<name>.keras` in the folder given as argv[1] with the package
# imported, calls it on `<name>.npy`, writes `<name>.pred.npy`.
LOAD_CHILD = """
import pathlib
import sys

import keras
import numpy as np

import keras_posenc  # noqa: F401  (registers the layers)

folder = pathlib.Path(sys.argv[1])
for path in sorted(folder.glob("*.keras")):
    model = keras.models.load_model(path, safe_mode=True)
    inputs = np.load(path.with_suffix(".npy"))
    np.save(path.with_suffix(".pred.npy"), keras.ops.convert_to_numpy(model(inputs)))
"""

# Serves every exported SavedModel folder `<name>` in argv[1] on `<name>.npy`
# and writes `<name>.pred.npy`, with TensorFlow alone: keras and keras_posenc
# are made unimportable first (TensorFlow imports Keras when it can), and the
# modules of theirs that got loaded anyway are printed at the end.
SERVE_CHILD = """
import sys

BLOCKED = ("keras", "keras_posenc")
sys.modules.update(dict.fromkeys(BLOCKED))

import pathlib

import numpy as np
import tensorflow as tf

folder = pathlib.Path(sys.argv[1])
for path in sorted(entry for entry in folder.iterdir() if entry.is_dir()):
    exported = tf.saved_model.load(str(path))
    served = exported.serve(tf.constant(np.load(path.with_suffix(".npy"))))
    np.save(path.with_suffix(".pred.npy"), served.numpy())
print(sorted(
    name for name, module in sys.modules.items()
    if module is not None and name.split(".")[0] in BLOCKED
))
"""


def run_fresh_python(code, *args):
    """Run `code` in a new interpreter on this suite's backend; its stdout."""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def token_ids(lengths, total_length, seed=0):
    """Right-padded ids in `1 .. VOCABULARY_SIZE - 1`, one row per length."""
    ids = np.random.default_rng(seed).integers(
        1, VOCABULARY_SIZE, (len(lengths), total_length)
    )
    ids[np.arange(total_length) >= np.array(lengths)[:, None]] = 0
    return ids.astype("int32")


def token_embedding(position, mask_zero=False):
    """A `TokenAndPositionEmbedding` of the test sizes."""
    return keras_posenc.TokenAndPositionEmbedding(
        VOCABULARY_SIZE,
        WIDTH,
        sequence_length=MAX_LENGTH,
        position_encoding=position,
        mask_zero=mask_zero,
    )


def encoding(kind):
    """An absolute encoding of embeddings: `kind` is sinusoidal or learned."""
    if kind == "sinusoidal":
        return keras_posenc.SinusoidalPositionEncoding()
    return keras_posenc.PositionEmbedding(MAX_LENGTH, embeddings_initializer="sinusoidal")


def token_model(position):
    """Functional: ids of any length -> embedding -> per-token logits."""
    ids = keras.Input(shape=(None,), dtype="int32")
    embedded = token_embedding(position)(ids)
    return keras.Model(ids, keras.layers.Dense(VOCABULARY_SIZE)(embedded))


def encoding_model(kind):
    """Sequential: embeddings of any length -> encoding -> Dense."""
    return keras.Sequential(
        [
            keras.Input(shape=(None, WIDTH)),
            encoding(kind),
            keras.layers.Dense(4),
        ]
    )


def rotary_model(**rotary_arguments):
    """Sequential: embeddings of any length -> heads -> RoPE -> Dense."""
    return keras.Sequential(
        [
            keras.Input(shape=(None, WIDTH)),
            keras.layers.Dense(WIDTH),
            keras.layers.Reshape((-1, 2, WIDTH // 2)),  # (batch, seq, heads, 4)
            keras_posenc.RotaryEmbedding(**rotary_arguments),
            keras.layers.Reshape((-1, WIDTH)),
            keras.layers.Dense(4),
        ]
    )


def attention_model(position):
    """Functional: embeddings of any length -> causal attention -> Dense."""
    embeddings = keras.Input(shape=(None, WIDTH))
    attended = keras_posenc.PositionalMultiHeadAttention(
        num_heads=2, key_dim=4, position=position
    )(embeddings, embeddings, use_causal_mask=True)
    return keras.Model(embeddings, keras.layers.Dense(4)(attended))


def masked_pooling_model(kind):
    """Sequential: ids with 0 as padding -> encoded embeddings -> mean."""
    if kind.startswith("token-"):
        embedders = [token_embedding(kind.removeprefix("token-"), True)]
    else:
        embedders = [
            keras.layers.Embedding(VOCABULARY_SIZE, WIDTH, mask_zero=True),
            encoding(kind),
        ]
    return keras.Sequential(
        [keras.Input(shape=(None,), dtype="int32")]
        + embedders
        + [keras.layers.GlobalAveragePooling1D()]
    )


@pytest.fixture(scope="module")
def models():
    """The models saved and exported, by name, with inputs to predict on.

    Their weights are moved off their initial values (a sinusoidal table, a
    zero bias), so that a load which re-initialises instead of restoring
    gives other outputs.
    """
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    ids = token_ids([7, 7, 7], 7)
    embeddings = rng.normal(size=(3, 7, WIDTH)).astype("float32")
    models = {
        **{f"token-{kind}": (token_model(kind), ids) for kind in POSITIONS},
        **{
            f"encoding-{kind}": (encoding_model(kind), embeddings)
            for kind in POSITIONS
        },
        # Past the trained length of 4, so that the length-dependent base
        # is part of the saved graph.
        "rotary-dynamic": (
            rotary_model(
                scaling={
                    "rope_type": "dynamic",
                    "factor": 2.0,
                    "original_max_position_embeddings": 4,
                }
            ),
            embeddings,
        ),
        "rotary-interleaved-partial": (
            rotary_model(pairing="interleaved", rotary_dim=2),
            embeddings,
        ),
        "attention-rope": (
            attention_model(keras_posenc.RotaryEmbedding()),
            embeddings,
        ),
        "attention-alibi": (
            attention_model(keras_posenc.AlibiBias(num_heads=2)),
            embeddings,
        ),
        "attention-shaw": (
            attention_model(keras_posenc.RelativePositionEmbedding(max_relative_position=3)),
            embeddings,
        ),
        "attention-t5": (
            attention_model(keras_posenc.RelativePositionBias(num_heads=2)),
            embeddings,
        ),
    }
    for model, _ in models.values():
        model.set_weights(
            [
                weight + rng.normal(size=weight.shape).astype(weight.dtype)
                for weight in model.get_weights()
            ]
        )
    return models


def save_inputs_and_predict(models, folder):
    """Write each model's inputs to `folder/<name>.npy`; its outputs.

    The models are called as they are, here and in the child that loads
    them: `predict` would trace each model anew.
    """
    predictions = {}
    for name, (model, inputs) in models.items():
        np.save(folder / f"{name}.npy", inputs)
        predictions[name] = numpy(model(inputs))
    return predictions


def test_keras_file_loads_in_fresh_process_with_identical_outputs(
    models, tmp_path
):
    expected = save_inputs_and_predict(models, tmp_path)
    for name, (model, _) in models.items():
        model.save(tmp_path / f"{name}.keras")
    run_fresh_python(LOAD_CHILD, tmp_path)
    for name, predictions in expected.items():
        np.testing.assert_array_equal(
            np.load(tmp_path / f"{name}.pred.npy"), predictions, err_msg=name
        )


@tensorflow_only
def test_export_serves_with_tensorflow_alone(models, tmp_path):
    expected = save_inputs_and_predict(models, tmp_path)
    for name, (model, _) in models.items():
        model.export(str(tmp_path / name), verbose=False)
    imported = run_fresh_python(SERVE_CHILD, tmp_path)
    assert imported.strip() == "[]"
    for name, predictions in expected.items():
        # The served graph runs the same float32 ops in another order. The
        # perturbed weights give attention logits in the hundreds, whose sharp
        # softmax turns ulps into relative differences near 2e-5.
        np.testing.assert_allclose(
            np.load(tmp_path / f"{name}.pred.npy"),
            predictions,
            rtol=1e-4,
            atol=1e-6,
            err_msg=name,
        )


@pytest.mark.parametrize("position", POSITIONS)
def test_xla_training_step_at_two_lengths(position):
    keras.utils.set_random_seed(0)
    model = token_model(position)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    assert model.jit_compile
    before = {weight.path: numpy(weight) for weight in model.trainable_weights}
    lengths = (5, 11)
    for length in lengths:
        ids = token_ids([length] * 4, length, seed=length)
        loss = model.train_on_batch(ids, np.roll(ids, 1, axis=1))
        assert np.isfinite(loss)
    for weight in model.trainable_weights:
        assert not np.array_equal(numpy(weight), before[weight.path])
    if position == "learned":
        # Rows past the longest sequence got no gradient, so Adam left them.
        # (`layers[0]` is the Input.)
        table = model.layers[1].position_embedding.embeddings
        old, new = before[table.path], numpy(table)  # (MAX_LENGTH, WIDTH)
        longest = max(lengths)
        np.testing.assert_array_equal(new[longest:], old[longest:])
        assert (new[:longest] != old[:longest]).any(axis=1).all()


@tensorflow_only
@pytest.mark.parametrize("position", POSITIONS)
def test_fit_under_mirrored_strategy_on_two_cpus(position):
    import tensorflow as tf

    devices = [device.name for device in tf.config.list_logical_devices("CPU")]
    # Collective ops (the default across CPUs) number their instances afresh
    # in each strategy while the process remembers earlier ones, so a second
    # strategy in one process aborts (tensorflow/tensorflow#62790).
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        model = token_model(position)
        model.compile(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    assert all(
        isinstance(weight.value, tf.distribute.DistributedValues)
        for weight in model.weights
    )
    ids = token_ids([9] * 16, 9)
    dataset = tf.data.Dataset.from_tensor_slices((ids, np.roll(ids, 1, 1)))
    history = model.fit(dataset.batch(8), epochs=1, shuffle=False, verbose=0)
    assert np.isfinite(history.history["loss"]).all()


MASK_KINDS = ("token-sinusoidal", "token-learned", "sinusoidal", "learned")


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_padding_is_masked_out_of_pooling(kind):
    keras.utils.set_random_seed(0)
    model = masked_pooling_model(kind)
    lengths = [5, 2, 8]
    padded = token_ids(lengths, 8)
    pooled = model.predict(padded, verbose=0)
    for row, length in enumerate(lengths):
        unpadded = model.predict(padded[row : row + 1, :length], verbose=0)
        np.testing.assert_allclose(pooled[row], unpadded[0], atol=1e-6)

    # Eagerly, layer by layer: each layer's `compute_mask` and the mask its
    # output carries mark the padding; without it the mean would change.
    features, mask = padded, None
    for layer in model.layers[:-1]:
        mask = layer.compute_mask(features, mask)
        features = layer(features)
        np.testing.assert_array_equal(mask, padded != 0, err_msg=layer.name)
        np.testing.assert_array_equal(
            features._keras_mask, padded != 0, err_msg=layer.name
        )
    unmasked_mean = numpy(features).mean(axis=1)
    assert not np.allclose(unmasked_mean, pooled, atol=1e-3)


@pytest.mark.parametrize("position", POSITIONS)
def test_feeds_keras_nlp_transformer_encoder(position, tmp_path):
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(None,), dtype="int32")
    embedded = token_embedding(position, mask_zero=True)(ids)
    encoded = keras_nlp.layers.TransformerEncoder(
        intermediate_dim=16, num_heads=2
    )(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(encoded)
    model = keras.Model(ids, keras.layers.Dense(2)(pooled))
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    batch = token_ids([6, 3, 8, 1], 8)
    labels = np.array([0, 1, 1, 0])
    losses = [model.train_on_batch(batch, labels) for _ in range(3)]
    assert np.isfinite(losses).all()
    assert losses[-1] < losses[0]

    path = tmp_path / "encoder.keras"
    model.save(path)
    loaded = keras.models.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(
        loaded.predict(batch, verbose=0), model.predict(batch, verbose=0)
    )


@pytest.mark.parametrize("jit_compile", (False, True))
@pytest.mark.parametrize("position", POSITIONS)
def test_tensor_start_index_matches_full_call(position, jit_compile):
    layer = token_embedding(position)
    ids = token_ids([10, 10], 10)
    full = numpy(layer(ids))  # (batch, seq, WIDTH)

    def decode_step(token, start_index):
        return layer(token, start_index=start_index)  # (batch, 1, WIDTH)

    step_function = compiled(decode_step) if jit_compile else decode_step
    for index in range(ids.shape[1]):
        step = step_function(
            ids[:, index : index + 1], keras.ops.convert_to_tensor(index, "int32")
        )
        np.testing.assert_allclose(
            numpy(step)[:, 0], full[:, index], rtol=0, atol=1e-6
        )


@tensorflow_only
@pytest.mark.parametrize("jit_compile", (False, True))
@pytest.mark.parametrize("position", POSITIONS)
def test_tensor_start_index_traces_once_in_a_tensorflow_graph(position, jit_compile):
    import tensorflow as tf

    layer = token_embedding(position)
    ids = token_ids([10, 10], 10)
    full = numpy(layer(ids))  # (batch, seq, WIDTH)

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, 1), "int32"),
            tf.TensorSpec((), "int32"),
        ],
        jit_compile=jit_compile,
    )
    def decode_step(token, start_index):
        return layer(token, start_index=start_index)  # (batch, 1, WIDTH)

    for index in range(ids.shape[1]):
        step = decode_step(ids[:, index : index + 1], tf.constant(index))
        np.testing.assert_allclose(
            step.numpy()[:, 0], full[:, index], rtol=0, atol=1e-6
        )
    assert decode_step.experimental_get_tracing_count() == 1


@tensorflow_only
def test_position_embedding_past_its_table_fails_naming_sequence_length():
    import tensorflow as tf

    layer = keras_posenc.PositionEmbedding(sequence_length=8)
    layer(np.zeros((1, 8, WIDTH), "float32"))
    too_long = tf.zeros((2, 12, WIDTH))

    unknown_length = tf.function(
        layer, input_signature=[tf.TensorSpec((None, None, WIDTH), "float32")]
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="sequence_length"):
        unknown_length(too_long)

    with pytest.raises(ValueError, match="sequence_length"):
        tf.function(layer)(too_long)
