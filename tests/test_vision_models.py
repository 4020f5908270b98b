"""A ViT-style functional model with each grid scheme, end to end.

Patches from `keras.layers.Conv2D`, a class token, an encoder block of
`PositionalMultiHeadAttention`, and the position on the grid from one of:
the 2-D sinusoidal encoding, the learned table resized on the fly, axial
RoPE, M-RoPE sections, Swin's grid bias. With the resizable table and with
axial RoPE the model trains under XLA at two image sizes through `None`
dimensions, learns a task only positions can solve, saves to `.keras`, and
loads in a fresh process with identical outputs at both sizes. With every
scheme it exports a SavedModel that plain TensorFlow serves at a second
resolution, and converts to TFLite with built-in ops only.
"""

import os

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import ops
from tests.backend import numpy
from tests.backend import tensorflow_only
from tests.test_models import SERVE_CHILD
from tests.test_models import run_fresh_python
from tests.test_tflite import run_tflite

PATCH = 4
TRAIN_SIZE = 16  # a 4 x 4 grid of patches
SECOND_SIZE = 24  # 6 x 6, as a model trained at 224 px runs at 336 px
WIDTH = 16
HEADS = 2
CLASSES = 4
STEPS = 80

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*tf.lite.Interpreter is deprecated:UserWarning"
)


@keras.saving.register_keras_serializable(package="tests")
class PatchTokens(keras.layers.Layer):
    """Patches `(batch, h, w, features)` to tokens, a class token first.

    Returns the tokens `(batch, 1 + h * w, features)` and the patches' grid
    positions `(h * w, 2)`, which the attention reads; the class token has
    none.
    """

    def build(self, input_shape):
        self.class_token = self.add_weight(
            name="class_token", shape=(1, 1, input_shape[-1]), initializer="zeros"
        )

    def call(self, patches):
        shape = keras.ops.shape(patches)
        tokens = keras.ops.reshape(
            patches, (shape[0], shape[1] * shape[2], patches.shape[-1])
        )  # (batch, h * w, features)
        class_tokens = keras.ops.tile(
            keras.ops.cast(self.class_token, tokens.dtype), (shape[0], 1, 1)
        )  # (batch, 1, features)
        positions = ops.grid_positions((shape[1], shape[2]))  # (h * w, 2)
        return keras.ops.concatenate([class_tokens, tokens], axis=1), positions

    def compute_output_shape(self, input_shape):
        batch, height, width, features = input_shape
        tokens = None if None in (height, width) else 1 + height * width
        patches = None if tokens is None else tokens - 1
        return (batch, tokens, features), (patches, 2)

    def compute_output_spec(self, patches):
        tokens_shape, positions_shape = self.compute_output_shape(patches.shape)
        return (
            keras.KerasTensor(tokens_shape, dtype=patches.dtype),
            keras.KerasTensor(positions_shape, dtype="int32"),
        )


def absolute(scheme):
    """The absolute encoding of the patch grid, or None."""
    if scheme == "sinusoidal_2d":
        return keras_posenc.SinusoidalPositionEncoding(num_axes=2)
    if scheme == "learned_resized":
        grid = TRAIN_SIZE // PATCH
        # Started from the 2-D sinusoidal table, as MAE fixes its table.
        return keras_posenc.PositionEmbedding(
            grid_shape=(grid, grid), embeddings_initializer="sinusoidal"
        )
    return None


def relative(scheme):
    """The attention's position scheme, or None."""
    grid = TRAIN_SIZE // PATCH
    if scheme == "axial_rope":
        return keras_posenc.RotaryEmbedding(num_axes=2, num_prefix_tokens=1)
    if scheme == "mrope_sections":
        return keras_posenc.RotaryEmbedding(
            num_axes=2,
            axis_layout="sections",
            axis_sections=[2, 2],
            num_prefix_tokens=1,
        )
    if scheme == "grid_bias":
        return keras_posenc.GridRelativePositionBias(
            HEADS, (grid, grid), num_prefix_tokens=1
        )
    return None


SCHEMES = (
    "sinusoidal_2d",
    "learned_resized",
    "axial_rope",
    "mrope_sections",
    "grid_bias",
)


def vit(scheme):
    """Images of any size -> patches -> [encoding] -> a block -> class logits."""
    images = keras.Input(shape=(None, None, 1))
    patches = keras.layers.Conv2D(WIDTH, PATCH, strides=PATCH)(images)
    encoding = absolute(scheme)
    if encoding is not None:
        patches = encoding(patches)  # positions from the grid axes
    tokens, positions = PatchTokens()(patches)
    normed = keras.layers.LayerNormalization()(tokens)
    attention = keras_posenc.PositionalMultiHeadAttention(
        HEADS, WIDTH // HEADS, position=relative(scheme)
    )
    if attention.position is None:
        attended = attention(normed, normed)
    else:
        attended = attention(
            normed, normed, query_positions=positions, key_positions=positions
        )
    tokens = keras.layers.Add()([tokens, attended])
    hidden = keras.layers.Dense(2 * WIDTH, activation="gelu")(
        keras.layers.LayerNormalization()(tokens)
    )
    tokens = keras.layers.Add()([tokens, keras.layers.Dense(WIDTH)(hidden)])
    class_token = tokens[:, 0]  # (batch, features)
    return keras.Model(images, keras.layers.Dense(CLASSES)(class_token))


def blob_images(size, count, seed):
    """One bright patch per image; the label is its row, in quarters.

    Every patch looks alike wherever it is, so only the position on the
    grid tells the rows apart.
    """
    rng = np.random.default_rng(seed)
    grid = size // PATCH
    images = rng.normal(scale=0.1, size=(count, size, size, 1)).astype("float32")
    rows = rng.integers(0, grid, size=count)
    columns = rng.integers(0, grid, size=count)
    for image, row, column in zip(images, rows, columns):
        image[row * PATCH : (row + 1) * PATCH, column * PATCH : (column + 1) * PATCH] += 1.0
    return images, (rows * CLASSES // grid).astype("int32")


# The schemes a model is trained with: one resizes its table to a new grid,
# the other reads the new grid's positions as they are.
TRAINED = ("learned_resized", "axial_rope")


@pytest.fixture(scope="module")
def trained():
    """A model per scheme of `TRAINED`, trained under XLA at both sizes."""
    models = {}
    for scheme in TRAINED:
        keras.utils.set_random_seed(0)
        model = vit(scheme)
        model.compile(
            optimizer=keras.optimizers.Adam(0.003),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=True,
        )
        for step in range(STEPS):
            size = SECOND_SIZE if step % 5 == 4 else TRAIN_SIZE
            model.train_on_batch(*blob_images(size, 32, seed=step))
        models[scheme] = model
    return models


@pytest.fixture(scope="module")
def untrained():
    """A model per scheme, built at the training size, random weights."""
    models = {}
    for scheme in SCHEMES:
        keras.utils.set_random_seed(1)
        model = vit(scheme)
        model(blob_images(TRAIN_SIZE, 1, seed=0)[0])
        models[scheme] = model
    return models


@pytest.mark.parametrize("scheme", TRAINED)
def test_trains_at_two_sizes_and_learns_where_the_patch_is(trained, scheme):
    model = trained[scheme]
    assert model.jit_compile
    images, labels = blob_images(TRAIN_SIZE, 256, seed=1000)
    # The model called as it is: `evaluate` and `predict` would each compile
    # it again under XLA, at each size.
    accuracy = np.mean(np.argmax(numpy(model(images)), axis=-1) == labels)
    # Chance is 1/4 (0.25 +- 0.03 on 256 images): without a position the
    # class token sees a set of patches, the same wherever the bright one is.
    assert accuracy > 0.4, accuracy
    logits = numpy(model(blob_images(SECOND_SIZE, 8, seed=1001)[0]))
    assert logits.shape == (8, CLASSES) and np.isfinite(logits).all()


# Loads every `<name>.keras` in argv[1] with `PatchTokens` registered (the
# repository root is argv[2]), calls it on `<name>.<size>.npy` for each
# size and writes `<name>.<size>.pred.npy`.
LOAD_CHILD = """
import pathlib
import sys

sys.path.insert(0, sys.argv[2])

import keras
import numpy as np

import keras_posenc  # noqa: F401  (registers the layers)
import tests.test_vision_models  # noqa: F401  (registers PatchTokens)

folder = pathlib.Path(sys.argv[1])
for path in sorted(folder.glob("*.keras")):
    model = keras.models.load_model(path, safe_mode=True)
    for images_path in sorted(folder.glob(path.stem + ".*[0-9].npy")):
        predictions = keras.ops.convert_to_numpy(model(np.load(images_path)))
        np.save(images_path.with_suffix(".pred.npy"), predictions)
"""


def test_keras_file_loads_in_a_fresh_process_with_identical_outputs_at_both_sizes(
    trained, tmp_path
):
    expected = {}
    for scheme, model in trained.items():
        model.save(tmp_path / f"{scheme}.keras")
        for size in (TRAIN_SIZE, SECOND_SIZE):
            images = blob_images(size, 4, seed=size)[0]
            np.save(tmp_path / f"{scheme}.{size}.npy", images)
            expected[scheme, size] = numpy(model(images))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run_fresh_python(LOAD_CHILD, tmp_path, root)
    for (scheme, size), predictions in expected.items():
        np.testing.assert_array_equal(
            np.load(tmp_path / f"{scheme}.{size}.pred.npy"),
            predictions,
            err_msg=f"{scheme} at {size} px",
        )


@tensorflow_only
def test_exports_serve_with_tensorflow_alone_at_a_second_size(untrained, tmp_path):
    expected = {}
    for scheme, model in untrained.items():
        images = blob_images(SECOND_SIZE, 4, seed=7)[0]
        np.save(tmp_path / f"{scheme}.npy", images)
        expected[scheme] = numpy(model(images))
        model.export(str(tmp_path / scheme), verbose=False)
    imported = run_fresh_python(SERVE_CHILD, tmp_path)
    assert imported.strip() == "[]"
    for scheme, predictions in expected.items():
        np.testing.assert_allclose(
            np.load(tmp_path / f"{scheme}.pred.npy"),
            predictions,
            rtol=1e-4,
            atol=1e-5,
            err_msg=scheme,
        )


@tensorflow_only
@pytest.mark.parametrize("scheme", SCHEMES)
def test_converts_to_tflite_with_builtin_ops_at_two_sizes(untrained, scheme):
    import tensorflow as tf

    model = untrained[scheme]
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    flatbuffer = converter.convert()
    for size in (TRAIN_SIZE, SECOND_SIZE):
        images = blob_images(size, 2, seed=size + 1)[0]
        np.testing.assert_allclose(
            run_tflite(flatbuffer, images),
            numpy(model(images)),
            atol=1e-4,
            rtol=1e-4,
            err_msg=f"{scheme} at {size} px",
        )
