import math

import keras
import numpy as np
import pytest
from sklearn import datasets

import keras_posenc
from keras_posenc_lab import vision
from keras_posenc_lab.config import VISION_ENCODINGS
from keras_posenc_lab.config import VISION_EVALUATIONS
from keras_posenc_lab.config import VISION_LABELS
from keras_posenc_lab.config import VISION_QUICK
from tests import references
from keras_posenc.layers.attention_position import AttentionContext

PATCH = vision.PATCH_SIZE


def bilinear(images, size):
    """Half-pixel-centre bilinear upsampling of `(n, h, w)` images, in float64.

    Output pixel `d` reads the input at `(d + 0.5) * in / out - 0.5`,
    clamped to the image, between its two nearest pixels.
    """
    images = np.asarray(images, "float64")
    count, height, width = images.shape
    resized = np.zeros((count, size, size))
    for row in range(size):
        y = min(max((row + 0.5) * height / size - 0.5, 0.0), height - 1.0)
        top = math.floor(y)
        bottom = min(top + 1, height - 1)
        row_weight = y - top
        for column in range(size):
            x = min(max((column + 0.5) * width / size - 0.5, 0.0), width - 1.0)
            left = math.floor(x)
            right = min(left + 1, width - 1)
            column_weight = x - left
            resized[:, row, column] = (
                (1 - row_weight) * (1 - column_weight) * images[:, top, left]
                + (1 - row_weight) * column_weight * images[:, top, right]
                + row_weight * (1 - column_weight) * images[:, bottom, left]
                + row_weight * column_weight * images[:, bottom, right]
            )
    return resized


@pytest.mark.parametrize("grid", [2, 3, 4, 5])
def test_render_is_bilinear_with_half_pixel_centres(grid):
    images = np.random.default_rng(grid).random((5, 8, 8)).astype("float32")
    rendered = vision.render(images, grid)
    size = grid * PATCH
    assert rendered.shape == (5, size, size, 1)
    assert rendered.dtype == np.float32
    np.testing.assert_allclose(rendered[..., 0], bilinear(images, size), atol=1e-5)
    if size == 8:
        np.testing.assert_array_equal(rendered[..., 0], images)


@pytest.fixture(scope="module")
def digits():
    return vision.load_digits((2, 3))


def test_load_digits_splits_every_digit_once_stratified(digits):
    train_images, train_labels, test_images, test_labels = digits
    assert sorted(test_images) == [2, 3]
    assert train_images.shape == (len(train_labels), 8, 8, 1)
    assert test_images[2].shape == (len(test_labels), 8, 8, 1)
    assert test_images[3].shape == (len(test_labels), 12, 12, 1)
    assert train_labels.dtype == test_labels.dtype == np.int32
    reference = datasets.load_digits()
    assert len(train_labels) + len(test_labels) == len(reference.target) == 1797
    # At 2 x 2 patches of 4 px an image keeps its 8 x 8 pixels: the two
    # splits together are every digit once, with its label.
    pixels = np.concatenate([train_images, test_images[2]])[..., 0] * 16.0
    labels = np.concatenate([train_labels, test_labels])
    split = sorted(
        (tuple(np.rint(image).astype(int).ravel()), int(label))
        for image, label in zip(pixels, labels)
    )
    expected = sorted(
        (tuple(image.astype(int).ravel()), int(label))
        for image, label in zip(reference.images, reference.target)
    )
    assert split == expected
    np.testing.assert_allclose(pixels, np.rint(pixels), atol=1e-5)
    for digit in range(10):
        share = np.sum(test_labels == digit) / np.sum(reference.target == digit)
        assert share == pytest.approx(0.25, abs=0.01)
    # The larger rendering is of the same held-out digits.
    np.testing.assert_allclose(
        test_images[3][..., 0], bilinear(test_images[2][..., 0], 12), atol=1e-5
    )
    assert 0.0 <= train_images.min() and train_images.max() <= 1.0


def test_load_digits_is_the_same_split_every_time(digits):
    again = vision.load_digits((2, 3))
    for first, second in zip(digits[:2] + digits[3:], again[:2] + again[3:]):
        np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(digits[2][3], again[2][3])


def grid_cells(height, width):
    return np.array([[row, column] for row in range(height) for column in range(width)])


@pytest.mark.parametrize("num_axes", [2, 3])
def test_patch_tokens_flatten_row_major_after_a_class_token(num_axes):
    layer = vision.PatchTokens(num_axes)
    patches = np.random.default_rng(0).normal(size=(2, 3, 4, 5)).astype("float32")
    tokens, positions = layer(patches)
    class_token = keras.ops.convert_to_numpy(layer.class_token)  # (1, 1, 5)
    assert tokens.shape == (2, 13, 5)
    np.testing.assert_array_equal(tokens[:, 0], np.broadcast_to(class_token[0], (2, 5)))
    np.testing.assert_array_equal(tokens[:, 1:], patches.reshape(2, 12, 5))
    expected = grid_cells(3, 4)  # (12, 2): (row, column)
    if num_axes == 3:
        expected = np.concatenate([np.zeros((12, 1), int), expected], axis=1)
    np.testing.assert_array_equal(positions, expected)
    assert layer.compute_output_shape((2, 3, 4, 5)) == ((2, 13, 5), (12, num_axes))
    assert layer.compute_output_shape((None, None, 4, 5)) == (
        (None, None, 5),
        (None, num_axes),
    )


@pytest.mark.parametrize("num_axes", [2, 3])
def test_patch_tokens_scale_the_positions_in_float32(num_axes):
    layer = vision.PatchTokens(num_axes, position_scale=2 / 3)
    patches = np.ones((2, 3, 4, 5), "float32")
    tokens, positions = layer(patches)
    assert tokens.shape == (2, 13, 5)
    positions = keras.ops.convert_to_numpy(positions)
    assert positions.dtype == np.float32
    expected = grid_cells(3, 4) * 2.0 / 3.0  # (12, 2), in float64
    if num_axes == 3:
        expected = np.concatenate([np.zeros((12, 1)), expected], axis=1)
    np.testing.assert_allclose(positions, expected, rtol=1e-6)
    spec = layer.compute_output_spec(keras.KerasTensor((None, None, None, 5)))
    assert spec[1].dtype == "float32"


def test_patch_tokens_config_and_bad_arguments():
    layer = vision.PatchTokens(num_axes=3, position_scale=0.5, name="patch_tokens")
    copy = vision.PatchTokens.from_config(layer.get_config())
    assert copy.num_axes == 3 and copy.name == "patch_tokens"
    assert copy.position_scale == 0.5
    assert vision.PatchTokens().num_axes == 2
    assert vision.PatchTokens().position_scale is None
    for bad in (1, 4):
        with pytest.raises(ValueError, match=rf"`num_axes`.*num_axes={bad}"):
            vision.PatchTokens(num_axes=bad)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(
            ValueError, match=rf"`position_scale`.*position_scale={bad!r}"
        ):
            vision.PatchTokens(position_scale=bad)


POSITION_CLASSES = (
    keras_posenc.PositionEmbedding,
    keras_posenc.SinusoidalPositionEncoding,
    keras_posenc.RotaryEmbedding,
    keras_posenc.GridRelativePositionBias,
)
EXPECTED_POSITION = {
    "none": None,
    "learned": (keras_posenc.PositionEmbedding, {"grid_shape": (2, 2)}),
    "sinusoidal_raster": (
        keras_posenc.SinusoidalPositionEncoding,
        {"num_axes": 1, "num_prefix_tokens": 1},
    ),
    "sinusoidal_2d": (
        keras_posenc.SinusoidalPositionEncoding,
        {"num_axes": 2, "num_prefix_tokens": 1},
    ),
    "axial_rope": (
        keras_posenc.RotaryEmbedding,
        {"num_axes": 2, "num_prefix_tokens": 1},
    ),
    "mrope": (
        keras_posenc.RotaryEmbedding,
        {"num_axes": 3, "axis_layout": "sections", "num_prefix_tokens": 1},
    ),
    "swin_bias": (
        keras_posenc.GridRelativePositionBias,
        {"grid_shape": (2, 2), "num_prefix_tokens": 1},
    ),
}
IN_ATTENTION = ("axial_rope", "mrope", "swin_bias")


def test_every_vision_encoding_has_an_expectation():
    assert sorted(EXPECTED_POSITION) == sorted(VISION_ENCODINGS)


@pytest.mark.parametrize("encoding", VISION_ENCODINGS)
def test_vit_uses_its_encoding_at_any_size(encoding):
    keras.utils.set_random_seed(0)
    model = vision.build_model(encoding, 2)
    attention = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
    ]
    assert len(attention) == vision.NUM_LAYERS
    found = [
        layer
        for layer in list(model.layers) + [block.position for block in attention]
        if isinstance(layer, POSITION_CLASSES)
    ]
    if EXPECTED_POSITION[encoding] is None:
        assert found == []
    else:
        cls, attributes = EXPECTED_POSITION[encoding]
        assert {type(layer) for layer in found} == {cls}
        if encoding in IN_ATTENTION:
            # A layer of its own in each attention block.
            assert [block.position for block in attention] == found
            assert len({id(layer) for layer in found}) == vision.NUM_LAYERS
        else:
            assert all(block.position is None for block in attention)
            assert len(found) == 1
        for layer in found:
            for name, value in attributes.items():
                assert getattr(layer, name) == value, (name, getattr(layer, name))
    rng = np.random.default_rng(0)
    for grid in (2, 4):
        images = rng.random((3, grid * PATCH, grid * PATCH, 1)).astype("float32")
        logits = model.predict(images, verbose=0)
        assert logits.shape == (3, vision.NUM_CLASSES)
        assert np.all(np.isfinite(logits))


def position_table(model):
    (table,) = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_posenc.PositionEmbedding)
    ]
    return table


def test_unresized_copy_pads_the_table_with_zeros():
    keras.utils.set_random_seed(1)
    model = vision.build_model("learned", 2)
    # Every weight away from its initial value, the table included.
    rng = np.random.default_rng(1)
    model.set_weights(
        [
            rng.normal(size=weight.shape).astype("float32")
            for weight in model.get_weights()
        ]
    )
    copy = vision.unresized_copy(model, 4, 2)
    table, copied_table = position_table(model), position_table(copy)
    assert copied_table.grid_shape == (4, 4)
    assert copied_table.interpolation is None
    assert len(model.layers) == len(copy.layers)
    for trained, copied in zip(model.layers, copy.layers):
        if trained is table:
            continue
        assert type(trained) is type(copied)
        assert len(trained.weights) == len(copied.weights)
        for weight, copied_weight in zip(trained.weights, copied.weights):
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(weight),
                keras.ops.convert_to_numpy(copied_weight),
            )
    trained_rows = keras.ops.convert_to_numpy(table.embeddings)  # (4, width)
    copied_rows = keras.ops.convert_to_numpy(copied_table.embeddings)  # (16, width)
    assert copied_rows.shape == (16, vision.WIDTH)
    for row in range(4):
        for column in range(4):
            copied_row = copied_rows[row * 4 + column]
            if row < 2 and column < 2:
                np.testing.assert_array_equal(
                    copied_row, trained_rows[row * 2 + column]
                )
            else:
                np.testing.assert_array_equal(copied_row, 0.0)
    images = rng.random((2, 16, 16, 1)).astype("float32")
    assert copy.predict(images, verbose=0).shape == (2, vision.NUM_CLASSES)


def trained_like(encoding, seed, train_grid=2):
    """A model of `encoding` whose every weight is away from its initial value."""
    keras.utils.set_random_seed(seed)
    model = vision.build_model(encoding, train_grid)
    rng = np.random.default_rng(seed)
    model.set_weights(
        [
            0.5 * rng.normal(size=weight.shape).astype("float32")
            for weight in model.get_weights()
        ]
    )
    return model


def scaled_grid_positions(grid, train_grid):
    """`(row, column) * train_grid / grid` of every patch, row-major, in float64."""
    return grid_cells(grid, grid) * train_grid / grid


def rotary_frequencies(copy):
    """The ids of the rotary frequencies of a scaled copy's attention blocks."""
    return {
        id(layer.position.frequencies)
        for layer in copy.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
        and getattr(layer.position, "frequencies", None) is not None
    }


@pytest.mark.parametrize("encoding", vision.SCALED_POSITIONS)
def test_scaled_copy_keeps_every_trained_weight(encoding):
    model = trained_like(encoding, 3)
    copy = vision.scaled_copy(model, encoding, 4, 2)
    frequencies = rotary_frequencies(copy)
    assert len(frequencies) == (vision.NUM_LAYERS if encoding == "axial_rope" else 0)
    copied = [weight for weight in copy.weights if id(weight) not in frequencies]
    assert len(copied) == len(model.weights)
    for trained, weight in zip(model.weights, copied):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(trained), keras.ops.convert_to_numpy(weight)
        )
    (tokens,) = [layer for layer in copy.layers if isinstance(layer, vision.PatchTokens)]
    assert tokens.position_scale == (0.5 if encoding == "sinusoidal_2d" else None)
    # At the trained grid the scale is 1: the copy is the trained model.
    images = np.random.default_rng(3).random((3, 8, 8, 1)).astype("float32")
    np.testing.assert_allclose(
        vision.scaled_copy(model, encoding, 2, 2)(images), model(images), atol=1e-6
    )
    images = np.random.default_rng(3).random((3, 16, 16, 1)).astype("float32")
    assert not np.allclose(copy(images), model(images), atol=1e-3)


def test_scaled_sinusoidal_copy_encodes_the_scaled_positions():
    model = trained_like("sinusoidal_2d", 4)
    copy = vision.scaled_copy(model, "sinusoidal_2d", 4, 2)
    (tokens_layer,) = [
        layer for layer in copy.layers if isinstance(layer, vision.PatchTokens)
    ]
    (table,) = [
        layer
        for layer in copy.layers
        if isinstance(layer, keras_posenc.SinusoidalPositionEncoding)
    ]
    probe = keras.Model(copy.input, [tokens_layer.output[0], table.output])
    images = np.random.default_rng(4).random((2, 16, 16, 1)).astype("float32")
    tokens, encoded = (keras.ops.convert_to_numpy(x) for x in probe(images))
    positions = scaled_grid_positions(4, 2)  # (16, 2), in [0, 1.5]
    half = vision.WIDTH // 2
    # Rows in the first half of the features, columns in the second; the
    # class token gets nothing.
    encoding = np.concatenate(
        [
            np.zeros((1, vision.WIDTH)),
            np.concatenate(
                [
                    references.sinusoidal(positions[:, 0], half),
                    references.sinusoidal(positions[:, 1], half),
                ],
                axis=-1,
            ),
        ]
    )  # (17, width)
    np.testing.assert_allclose(encoded, tokens + encoding, atol=1e-5)


def axial_rope(heads, positions, max_wavelength=10000.0):
    """Axial RoPE of `(batch, 1 + n, heads, dim)` after a class token, in float64.

    Pair `i` of a head's `dim / 2` (features `i` and `i + dim / 2`) reads
    rows in the first half of the pairs and columns in the second, each half
    with the schedule `max_wavelength ** (-2 j / (dim / 2))`, `j` the pair's
    place in its half, at the float positions `(n, 2)`.
    """
    heads = np.asarray(heads, "float64")
    dim = heads.shape[-1]
    pairs = dim // 2
    rotated = heads.copy()
    for pair in range(pairs):
        axis, place = divmod(pair, pairs // 2)
        angle = positions[:, axis] * max_wavelength ** (-2 * place / pairs)  # (n,)
        cos, sin = np.cos(angle)[None, :, None], np.sin(angle)[None, :, None]
        first, second = heads[:, 1:, :, pair], heads[:, 1:, :, pair + pairs]
        rotated[:, 1:, :, pair] = first * cos - second * sin
        rotated[:, 1:, :, pair + pairs] = second * cos + first * sin
    return rotated


def test_scaled_rope_copy_turns_by_the_scaled_positions():
    model = trained_like("axial_rope", 5)
    copy = vision.scaled_copy(model, "axial_rope", 4, 2)
    heads = np.random.default_rng(5).normal(
        size=(2, 1 + 16, vision.NUM_HEADS, vision.WIDTH // vision.NUM_HEADS)
    ).astype("float32")
    # The attention hands the rotary the patches' integer positions.
    integer = grid_cells(4, 4).astype("int32")[None]  # (1, 16, 2)
    for trained, scaled in zip(
        *(
            [
                layer.position
                for layer in m.layers
                if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
            ]
            for m in (model, copy)
        )
    ):
        query, key = scaled.transform_query_key(heads, heads, AttentionContext(query_positions=integer, key_positions=integer))
        expected = axial_rope(heads, scaled_grid_positions(4, 2))
        np.testing.assert_allclose(query, expected, atol=1e-5)
        np.testing.assert_allclose(key, expected, atol=1e-5)
        query, _ = trained.transform_query_key(heads, heads, AttentionContext(query_positions=integer, key_positions=integer))
        np.testing.assert_allclose(
            query, axial_rope(heads, grid_cells(4, 4)), atol=1e-5
        )


def test_position_scale_is_for_the_scaled_encodings_only():
    assert vision.SCALED_POSITIONS == ("sinusoidal_2d", "axial_rope")
    for encoding in ("learned", "mrope", "swin_bias"):
        with pytest.raises(ValueError, match=rf"position_scale=0.5 for encoding='{encoding}'"):
            vision.build_model(encoding, 2, position_scale=0.5)


@pytest.mark.parametrize("encoding", ["learned", "sinusoidal_2d", "axial_rope"])
def test_evaluate_scores_the_evaluated_copy_beside_the_model(encoding):
    config = VISION_QUICK.replace(grids=(2, 3))
    model = trained_like(encoding, 6)
    rng = np.random.default_rng(6)
    images = {
        grid: rng.random((40, grid * PATCH, grid * PATCH, 1)).astype("float32")
        for grid in config.grids
    }
    labels = rng.integers(0, 10, 40).astype("int32")
    rows = vision._evaluate(model, encoding, config, images, labels)
    key = VISION_EVALUATIONS[encoding][0]
    if encoding == "learned":  # the model as trained is the resized row
        copy, trained, evaluated = vision.unresized_copy(model, 3, 2), key, encoding
    else:
        copy = vision.scaled_copy(model, encoding, 3, 2)
        trained, evaluated = encoding, key
    assert list(rows) == [encoding, key]
    assert rows[trained] == {
        grid: vision.accuracy(model, images[grid], labels) for grid in config.grids
    }
    assert rows[evaluated] == {
        2: rows[trained][2],
        3: vision.accuracy(copy, images[3], labels),
    }


def test_evaluate_gives_one_row_to_the_other_encodings():
    config = VISION_QUICK.replace(grids=(2, 3))
    model = trained_like("mrope", 7)
    rng = np.random.default_rng(7)
    images = {
        grid: rng.random((8, grid * PATCH, grid * PATCH, 1)).astype("float32")
        for grid in config.grids
    }
    labels = rng.integers(0, 10, 8).astype("int32")
    assert list(vision._evaluate(model, "mrope", config, images, labels)) == ["mrope"]


def test_accuracy_is_the_fraction_predicted_right():
    keras.utils.set_random_seed(2)
    model = vision.build_model("sinusoidal_2d", 2)
    # More images than one evaluation batch, the last batch partial.
    count = 2 * vision.EVALUATION_BATCH + 44
    images = np.random.default_rng(2).random((count, 8, 8, 1)).astype("float32")
    predicted = np.argmax(model.predict(images, verbose=0), axis=-1)
    labels = np.where(
        np.arange(count) % 3 == 0, predicted, (predicted + 1) % 10
    ).astype("int32")
    expected = np.mean(np.argmax(model.predict(images, verbose=0), axis=-1) == labels)
    assert vision.accuracy(model, images, labels) == pytest.approx(expected)
    assert expected == pytest.approx(len(range(0, count, 3)) / count)


def test_findings_compare_with_none_and_the_resize():
    config = VISION_QUICK  # grids 2, 3, 4
    means = {
        "none": {2: 0.5, 3: 0.4, 4: 0.3},
        "learned": {2: 0.8, 3: 0.3, 4: 0.2},
        "learned_bicubic": {2: 0.8, 3: 0.6, 4: 0.5},
        "sinusoidal_raster": {2: 0.45, 3: 0.3, 4: 0.25},
        "axial_rope": {2: 0.9, 3: 0.85, 4: 0.7},
    }
    lines = vision.findings(means, config)
    assert "axial RoPE: 0.900 at 2x2, 0.700 at 4x4 (-0.200)." in lines
    assert "learned + bicubic resize: 0.800 at 2x2, 0.500 at 4x4 (-0.300)." in lines
    assert (
        "At the training grid every encoding beats none (0.500): "
        "no, not sinusoidal 1-D, raster order." in lines
    )
    assert (
        "Resizing the learned table bicubically at 4x4: +0.300 against leaving "
        "it as trained." in lines
    )
    assert lines[-1] == "Holds best at 4x4: axial RoPE (0.700)."
    # Positions scaled: one model with axial RoPE's, at the training grid too.
    scaled = dict(
        means,
        sinusoidal_raster={2: 0.6, 3: 0.3, 4: 0.25},
        axial_rope_scaled={2: 0.9, 3: 0.88, 4: 0.8},
    )
    lines = vision.findings(scaled, config)
    assert "axial RoPE, positions scaled: 0.900 at 2x2, 0.800 at 4x4 (-0.100)." in lines
    assert (
        "Scaling the positions of axial RoPE to the trained grid at 4x4: "
        "+0.100 against leaving them as they are." in lines
    )
    assert "At the training grid every encoding beats none (0.500): yes." in lines
    assert lines[-1] == "Holds best at 4x4: axial RoPE, positions scaled (0.800)."
    # The learned table's two rows are one model at the training grid: it
    # is named once; the names hold commas, so semicolons separate them.
    weak = dict(
        means,
        learned={2: 0.4, 3: 0.3, 4: 0.2},
        learned_bicubic={2: 0.4, 3: 0.35, 4: 0.3},
    )
    assert (
        "At the training grid every encoding beats none (0.500): "
        "no, not learned, not resized; sinusoidal 1-D, raster order."
        in vision.findings(weak, config)
    )
    del means["sinusoidal_raster"]
    lines = vision.findings(means, config)
    assert "At the training grid every encoding beats none (0.500): yes." in lines
    # One row alone: nothing to compare.
    lines = vision.findings({"mrope": {2: 0.7, 3: 0.6, 4: 0.5}}, config)
    assert lines == ["M-RoPE sections: 0.700 at 2x2, 0.500 at 4x4 (-0.200)."]


def test_every_table_row_has_a_label():
    rows = list(VISION_LABELS)
    evaluations = {key for key, _ in VISION_EVALUATIONS.values()}
    assert set(rows) == set(VISION_ENCODINGS) | evaluations
    assert len(rows) == len(VISION_ENCODINGS) + len(evaluations)
    # Each evaluation right after its model's row.
    for name, (key, label) in VISION_EVALUATIONS.items():
        assert rows.index(key) == rows.index(name) + 1
        assert VISION_LABELS[key] == label
    assert VISION_LABELS["axial_rope_scaled"] == "axial RoPE, positions scaled"
    assert (
        VISION_LABELS["sinusoidal_2d_scaled"] == "sinusoidal 2-D, positions scaled"
    )


def test_run_fails_when_a_reloaded_model_differs(tmp_path, capsys, monkeypatch):
    load_model = keras.models.load_model

    def load_perturbed_model(*args, **kwargs):
        model = load_model(*args, **kwargs)
        kernel = model.layers[-1].kernel
        kernel.assign(kernel + 1e-3)
        return model

    monkeypatch.setattr(keras.models, "load_model", load_perturbed_model)
    config = VISION_QUICK.replace(encodings=["none"], steps=1)
    assert vision.run(config, tmp_path) == 1
    assert "predicts differently" in capsys.readouterr().err
    assert not (tmp_path / "accuracy.csv").exists()
    assert (tmp_path / "vit_none.keras").exists()
