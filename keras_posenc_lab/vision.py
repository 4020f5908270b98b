"""Train at one resolution, test at higher ones: one small ViT per grid encoding.

The experiment behind FixRes (Touvron et al. 2019) and RoPE-ViT (Heo et al.
2024), shrunk to run on a CPU in minutes, on real images that install with
scikit-learn: its handwritten digits (`sklearn.datasets.load_digits`, 1797
scans of 8 x 8 pixels by 16 grey levels, from the UCI repository). Every
digit is rendered at a training size whose patches make a grid of
`config.grids[0]` per side, and the same held-out digits again at larger
sizes, as a model trained at 224 px is run at 384 px. The same small ViT
(patches from `keras.layers.Conv2D`, a class token, pre-norm encoder blocks
of `PositionalMultiHeadAttention`) is trained with each encoding at the
training grid and its test accuracy measured at every grid.

The learned table is scored twice at the larger grids: as trained, resized
bicubically to the new grid (what timm and Hugging Face do), and without
resizing, its rows kept at the positions it has and zeros beyond them. The
resize maps the larger grid onto the trained one; its like for the 2-D
sinusoidal encoding and axial RoPE is position interpolation (Chen et al.
2023): their trained models are scored twice too, with the patches'
positions as they are and scaled by `train_grid / grid` into the trained
range.

Every trained model is saved to `.keras`, reloaded with `safe_mode=True` and
checked to predict bit-identically, at the training grid and the largest,
before the reloaded model is evaluated.
"""

import functools
import os
import sys
import time

import keras
import numpy as np

import keras_posenc
from keras_posenc import ops
from keras_posenc_lab import encodings
from keras_posenc_lab import training
from keras_posenc_lab.config import VISION_DEFAULT
from keras_posenc_lab.config import VISION_DEMO_ENCODINGS
from keras_posenc_lab.config import VISION_EVALUATIONS
from keras_posenc_lab.config import VISION_FULL_ONLY
from keras_posenc_lab.config import VISION_LABELS

PATCH_SIZE = 4
WIDTH = 64
NUM_HEADS = 4
FEED_FORWARD_DIM = 128
NUM_LAYERS = VISION_DEFAULT.num_layers
NUM_CLASSES = 10
STEPS_PER_EXECUTION = 10
# The digits held out for testing, stratified by class, the same for every
# seed: a seed changes the weights and the order of training, not the test.
TEST_FRACTION = 0.25
SPLIT_SEED = 0
# The encoding added to the patch grid before it is flattened.
GRID_EMBEDDINGS = ("learned",)
# The encodings whose trained models `scaled_copy` evaluates with their
# positions scaled: `VISION_EVALUATIONS` but the learned table's resize.
SCALED_POSITIONS = tuple(name for name in VISION_EVALUATIONS if name != "learned")
# Images scored per batch of evaluation.
EVALUATION_BATCH = 512


@keras.saving.register_keras_serializable(package="keras_posenc_demo")
class PatchTokens(keras.layers.Layer):
    """Patches `(batch, h, w, features)` to tokens, a learned class token first.

    Returns the tokens `(batch, 1 + h * w, features)` and the patches' grid
    positions `(h * w, num_axes)`, row-major, which the attention and the
    2-D sinusoidal encoding read; the class token has none. With
    `num_axes=3` the positions are Qwen2-VL's for one image, `(0, row,
    column)`: a single frame.

    Args:
        num_axes: int. 2 for `(row, column)`, 3 for `(frame, row, column)`.
            Defaults to `2`.
        position_scale: float or None. When given, the positions are float32
            and multiplied by it: `train_grid / grid` maps a larger grid's
            positions onto the trained range (position interpolation, Chen
            et al. 2023). `None` gives int32 positions. Defaults to `None`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`.
    """

    def __init__(self, num_axes=2, position_scale=None, **kwargs):
        super().__init__(**kwargs)
        if num_axes not in (2, 3):
            raise ValueError(
                f"`num_axes` must be 2 or 3. Received: num_axes={num_axes!r}"
            )
        if position_scale is not None and not (
            isinstance(position_scale, (int, float))
            and not isinstance(position_scale, bool)
            and position_scale > 0
        ):
            raise ValueError(
                "`position_scale` must be a positive number or None. "
                f"Received: position_scale={position_scale!r}"
            )
        self.num_axes = num_axes
        self.position_scale = (
            None if position_scale is None else float(position_scale)
        )

    def build(self, input_shape):
        self.class_token = self.add_weight(
            name="class_token",
            shape=(1, 1, input_shape[-1]),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )

    def call(self, patches):
        shape = keras.ops.shape(patches)
        batch, height, width = shape[0], shape[1], shape[2]
        tokens = keras.ops.reshape(
            patches, (batch, height * width, patches.shape[-1])
        )  # (batch, h * w, features)
        class_tokens = keras.ops.broadcast_to(
            keras.ops.cast(self.class_token, tokens.dtype),
            (batch, 1, patches.shape[-1]),
        )  # (batch, 1, features)
        grid = (height, width) if self.num_axes == 2 else (1, height, width)
        positions = ops.grid_positions(grid)  # (h * w, num_axes)
        if self.position_scale is not None:
            positions = keras.ops.cast(positions, "float32") * self.position_scale
        return keras.ops.concatenate([class_tokens, tokens], axis=1), positions

    def compute_output_shape(self, input_shape):
        batch, height, width, features = input_shape
        cells = None if None in (height, width) else height * width
        tokens = None if cells is None else 1 + cells
        return (batch, tokens, features), (cells, self.num_axes)

    def compute_output_spec(self, patches):
        tokens_shape, positions_shape = self.compute_output_shape(patches.shape)
        return (
            keras.KerasTensor(tokens_shape, dtype=patches.dtype),
            keras.KerasTensor(
                positions_shape,
                dtype="int32" if self.position_scale is None else "float32",
            ),
        )

    def get_config(self):
        return {
            **super().get_config(),
            "num_axes": self.num_axes,
            "position_scale": self.position_scale,
        }


def load_digits(grids):
    """The digits, split, rendered at each grid's image size.

    Args:
        grids: tuple of int. Patches per side of each rendering; the first
            is the training grid.

    Returns:
        A tuple `(train_images, train_labels, test_images, test_labels)`:
        float32 `(n, size, size, 1)` images in [0, 1] at the training grid's
        size, int32 labels, and a dict from grid to the held-out images at
        its size.
    """
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    digits = sklearn_digits()
    images = digits.images.astype("float32") / 16.0  # (n, 8, 8), 16 grey levels
    train, test, train_labels, test_labels = train_test_split(
        images,
        digits.target.astype("int32"),
        test_size=TEST_FRACTION,
        stratify=digits.target,
        random_state=SPLIT_SEED,
    )
    return (
        render(train, grids[0]),
        train_labels,
        {grid: render(test, grid) for grid in grids},
        test_labels,
    )


def render(images, grid):
    """Digits `(n, 8, 8)` upsampled bilinearly to `grid * PATCH_SIZE` pixels a side.

    Half-pixel centres, as `tf.image.resize`: output pixel `d` reads the
    input at `(d + 0.5) * 8 / size - 0.5`, clamped to the image, between its
    two nearest pixels. In NumPy, so that every backend trains on the same
    pixels.

    Returns:
        float32 `(n, size, size, 1)`.
    """
    size = grid * PATCH_SIZE
    rows = _bilinear_matrix(images.shape[1], size)  # (size, 8)
    columns = _bilinear_matrix(images.shape[2], size)  # (size, 8)
    resized = np.einsum("ri,nij,cj->nrc", rows, images, columns)  # (n, size, size)
    return resized.astype("float32")[..., None]


def _bilinear_matrix(in_size, out_size):
    """`(out_size, in_size)` weights of half-pixel-centre linear interpolation."""
    source = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    source = np.clip(source, 0.0, in_size - 1.0)  # (out_size,)
    lower = np.floor(source).astype(int)
    upper = np.minimum(lower + 1, in_size - 1)
    fraction = source - lower
    weights = np.zeros((out_size, in_size))
    np.add.at(weights, (np.arange(out_size), lower), 1.0 - fraction)
    np.add.at(weights, (np.arange(out_size), upper), fraction)
    return weights


def build_model(
    encoding,
    train_grid,
    table_grid=None,
    position_scale=None,
    jit_compile=False,
    num_layers=NUM_LAYERS,
):
    """The ViT with one encoding, for images of any size.

    Args:
        encoding: str. One of `VISION_ENCODINGS`.
        train_grid: int. Patches per side at training: the learned table's
            and Swin's window.
        table_grid: int or None. For `"learned"`, a table of this grid that
            is never resized (the unresized evaluation); `None` for the
            trained table, resized bicubically to the input's grid.
            Defaults to `None`.
        position_scale: float or None. For `"sinusoidal_2d"` and
            `"axial_rope"`, the factor of the patches' positions, as
            `scaled_copy` evaluates them; `None` for the positions as
            trained. Defaults to `None`.
        jit_compile: bool. Whether `fit` runs under XLA on TensorFlow,
            with `STEPS_PER_EXECUTION` steps per call (on JAX it always
            does, on PyTorch never: `training.compiled`). Defaults to
            `False`.
        num_layers: int. Transformer blocks. Defaults to `NUM_LAYERS`.

    Returns:
        A compiled functional `keras.Model` from images `(batch, h, w, 1)`,
        `h` and `w` multiples of `PATCH_SIZE`, to class logits `(batch, 10)`.
    """
    if position_scale is not None and encoding not in SCALED_POSITIONS:
        raise ValueError(
            f"`position_scale` scales the positions of "
            f"{' and '.join(SCALED_POSITIONS)}. Received: "
            f"position_scale={position_scale!r} for encoding={encoding!r}"
        )
    rotary = encodings.VISION[encoding].layer == "RotaryEmbedding"
    scaled_rotary = rotary and position_scale is not None
    images = keras.Input(shape=(None, None, 1), name="images")
    patches = keras.layers.Conv2D(WIDTH, PATCH_SIZE, strides=PATCH_SIZE)(
        images
    )  # (b, h, w, width)
    # Added to the patch grid: the learned table.
    if encoding in GRID_EMBEDDINGS:
        if table_grid is None:
            table = encodings.build("vision", encoding, grid_shape=(train_grid, train_grid))
        else:
            table = encodings.build(
                "vision",
                encoding,
                grid_shape=(table_grid, table_grid),
                interpolation=None,
            )
        patches = table(patches)
    tokens, positions = PatchTokens(
        encodings.VISION[encoding].arguments.get("num_axes", 2),
        # The attention reads integer positions: RoPE scales its frequencies.
        position_scale=None if rotary else position_scale,
    )(patches)  # (b, 1 + h * w, width), (h * w, axes)
    # Added to the flattened tokens, the class token first: the raster order
    # counts them, the 2-D encoding reads the patches' positions.
    if encoding == "sinusoidal_raster":
        tokens = encodings.build("vision", encoding)(tokens)
    elif encoding == "sinusoidal_2d":
        tokens = encodings.build("vision", encoding)(tokens, positions=positions)
    blocks = []
    for _ in range(num_layers):
        normed = keras.layers.LayerNormalization()(tokens)
        position = encodings.build(
            "vision",
            encoding,
            role="attention",
            num_heads=NUM_HEADS,
            grid_shape=(train_grid, train_grid),
            # Theta a weight, to be scaled below.
            **({"learned_frequencies": True} if scaled_rotary else {}),
        )
        attention = keras_posenc.PositionalMultiHeadAttention(
            NUM_HEADS, WIDTH // NUM_HEADS, position=position
        )
        blocks.append(attention)
        if attention.position is None:
            attended = attention(normed, normed)
        else:
            attended = attention(
                normed, normed, query_positions=positions, key_positions=positions
            )
        tokens = tokens + attended
        hidden = keras.layers.Dense(FEED_FORWARD_DIM, activation="gelu")(
            keras.layers.LayerNormalization()(tokens)
        )  # (b, 1 + h * w, feed_forward)
        tokens = tokens + keras.layers.Dense(WIDTH)(hidden)
    class_token = keras.layers.LayerNormalization()(tokens)[:, 0]  # (b, width)
    logits = keras.layers.Dense(NUM_CLASSES)(class_token)  # (b, classes)
    model = keras.Model(images, logits, name=f"vit_{encoding}")
    if scaled_rotary:
        # The angles of positions p * s: (p * s) Theta = p (s Theta), as
        # Hugging Face's "linear" RoPE scaling divides the frequencies.
        for attention in blocks:
            frequencies = attention.position.frequencies  # (heads, pairs, axes)
            frequencies.assign(frequencies * position_scale)
    return training.compiled(model, jit_compile, STEPS_PER_EXECUTION)


def num_blocks(model):
    """The transformer blocks of `model`, one attention layer each."""
    return sum(
        isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
        for layer in model.layers
    )


def unresized_copy(model, grid, train_grid):
    """The learned-table model at `grid` with its table zero-padded, not resized.

    Rows `(r, c)` with `r, c < train_grid` keep their trained vectors; the
    rest of the larger grid gets zeros: no position where the table has none.
    """
    copy = build_model(
        "learned", train_grid, table_grid=grid, num_layers=num_blocks(model)
    )
    copy.build((None, grid * PATCH_SIZE, grid * PATCH_SIZE, 1))
    weights = []
    for trained, target in zip(model.get_weights(), copy.get_weights()):
        if trained.shape != target.shape:  # the table, (cells, width)
            table = trained.reshape(train_grid, train_grid, -1)
            padding = grid - train_grid
            trained = np.pad(table, ((0, padding), (0, padding), (0, 0))).reshape(
                target.shape
            )
        weights.append(trained)
    copy.set_weights(weights)
    return copy


def scaled_copy(model, encoding, grid, train_grid):
    """The trained model of `encoding` at `grid`, its positions scaled to the trained grid.

    Position interpolation (Chen et al. 2023) on a grid, the like of the
    learned table's bicubic resize: the patch at `(r, c)` of a `grid` x
    `grid` image reads the position `(r, c) * train_grid / grid`, inside the
    trained range. The 2-D sinusoidal encoding takes these float positions;
    `PositionalMultiHeadAttention` reads integer positions only, so axial
    RoPE turns by the same angles with its frequencies `Theta` scaled (a
    weight of the copy, `learned_frequencies=True`) and the integer
    positions. Every trained weight is copied.

    Args:
        model: the trained model of `encoding`, one of `SCALED_POSITIONS`.
        encoding: str. `"sinusoidal_2d"` or `"axial_rope"`.
        grid: int. Patches per side of the images it is evaluated on.
        train_grid: int. Patches per side at training.

    Returns:
        A compiled `keras.Model`.
    """
    copy = build_model(
        encoding,
        train_grid,
        position_scale=train_grid / grid,
        num_layers=num_blocks(model),
    )
    frequencies = {
        id(layer.position.frequencies)
        for layer in copy.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
        and getattr(layer.position, "frequencies", None) is not None
    }
    trained = iter(model.get_weights())
    copy.set_weights(
        [
            keras.ops.convert_to_numpy(weight)
            if id(weight) in frequencies
            else next(trained)
            for weight in copy.weights
        ]
    )
    return copy


def accuracy(model, images, labels):
    """The fraction of `images` whose most likely class is the label."""
    correct = 0
    for start in range(0, len(images), EVALUATION_BATCH):
        logits = training.predict(model, images[start : start + EVALUATION_BATCH])
        correct += int(
            np.sum(np.argmax(logits, axis=-1) == labels[start : start + EVALUATION_BATCH])
        )
    return correct / len(images)


def _train(encoding, config, data, out_dir, label, seed):
    """Train, save, reload and check one model; return the reloaded one."""
    train_images, train_labels, test_images, _ = data
    # The same order for every encoding at a seed: the rows of one seed
    # differ by their encodings, not by the digits they saw first, whose
    # order alone moves an accuracy.
    rng = np.random.default_rng(seed)
    count = config.steps * config.batch_size
    passes = -(-count // len(train_images))
    order = np.concatenate(
        [rng.permutation(len(train_images)) for _ in range(passes)]
    )[:count]  # shuffled afresh at each pass over the training digits
    keras.utils.set_random_seed(seed)
    model = build_model(
        encoding,
        config.grids[0],
        jit_compile=config.jit_compile,
        num_layers=config.num_layers,
    )
    training.fit(
        model,
        train_images[order],
        train_labels[order],
        config.batch_size,
        f"{label} Training with "
        + ("a learned table" if encoding == "learned" else VISION_LABELS[encoding]),
    )
    suffix = f"_seed{seed}" if config.num_seeds > 1 else ""
    path = os.path.join(out_dir, f"vit_{encoding}{suffix}.keras")
    probes = [test_images[grid][: config.batch_size] for grid in config.grids[::2]]
    return training.save_and_reload(model, path, probes)


def _evaluate(model, encoding, config, test_images, test_labels):
    """`{row: {grid: accuracy}}`: one row, two for the evaluated models."""
    train_grid = config.grids[0]
    scores = {}
    rows = {encoding: scores}
    for grid in config.grids:
        scores[grid] = accuracy(model, test_images[grid], test_labels)
        print(f"Accuracy at {grid}x{grid}: {scores[grid]:.3f}")
    if encoding not in VISION_EVALUATIONS:
        return rows
    evaluated = {}
    if encoding == "learned":
        # The model as trained resizes its table; its own row does not.
        rows = {"learned": evaluated, "learned_bicubic": scores}
        copy, how = unresized_copy, "without resizing the table"
    else:
        rows[VISION_EVALUATIONS[encoding][0]] = evaluated
        copy = functools.partial(scaled_copy, encoding=encoding)
        how = "with positions scaled to the trained grid"
    for grid in config.grids:
        if grid == train_grid:  # nothing to resize or scale
            evaluated[grid] = scores[grid]
            continue
        evaluated[grid] = accuracy(
            copy(model, grid=grid, train_grid=train_grid),
            test_images[grid],
            test_labels,
        )
        print(f"Accuracy at {grid}x{grid} {how}: {evaluated[grid]:.3f}")
    return rows


def findings(means, config):
    """Lines that say what the table shows, against the literature's direction.

    Args:
        means: dict from row key (`VISION_LABELS`) to `{grid: accuracy}`,
            the mean over seeds.
        config: `VisionConfig`.

    Returns:
        A list of str.
    """
    small, large = config.grids[0], config.grids[-1]
    evaluations = {key: name for name, (key, _) in VISION_EVALUATIONS.items()}
    lines = []
    for key, scores in means.items():
        lines.append(
            f"{VISION_LABELS[key]}: {scores[small]:.3f} at {small}x{small}, "
            f"{scores[large]:.3f} at {large}x{large} "
            f"({scores[large] - scores[small]:+.3f})."
        )
    if "none" in means and len(means) > 1:
        # An evaluated row is its model's at the training grid: named once.
        beaten = [
            VISION_LABELS[key]
            for key, scores in means.items()
            if key != "none"
            and key not in evaluations
            and scores[small] <= means["none"][small]
        ]
        lines.append(
            f"At the training grid every encoding beats none "
            f"({means['none'][small]:.3f}): "
            + ("yes." if not beaten else f"no, not {'; '.join(beaten)}.")
        )
    if "learned" in means:
        recovered = means["learned_bicubic"][large] - means["learned"][large]
        lines.append(
            f"Resizing the learned table bicubically at {large}x{large}: "
            f"{recovered:+.3f} against leaving it as trained."
        )
    for key, name in evaluations.items():
        if name != "learned" and key in means:
            recovered = means[key][large] - means[name][large]
            lines.append(
                f"Scaling the positions of {VISION_LABELS[name]} to the "
                f"trained grid at {large}x{large}: {recovered:+.3f} against "
                "leaving them as they are."
            )
    if len(means) > 1:
        best = max(means, key=lambda key: means[key][large])
        lines.append(
            f"Holds best at {large}x{large}: {VISION_LABELS[best]} "
            f"({means[best][large]:.3f})."
        )
    return lines


def run(config, out_dir):
    """Train every encoding at one grid, test it at larger ones, write the results.

    Args:
        config: `VisionConfig`. What to train and evaluate.
        out_dir: str or path-like. Where the models (`vit_*.keras`), the
            table (`accuracy.md`, `accuracy.csv`) and the plot
            (`accuracy.png`) go; created if needed.

    Returns:
        The exit status: `0`, or `1` if a reloaded model predicts
        differently from the trained one.
    """
    from keras_posenc import plot

    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    data = load_digits(config.grids)
    train_images, _, test_images, test_labels = data
    sizes = ", ".join(
        f"{grid}x{grid} ({grid * PATCH_SIZE} px)" for grid in config.grids
    )
    print(
        f"Data: scikit-learn's handwritten digits, {len(train_images)} trained "
        f"on and {len(test_labels)} held out, 8 x 8 pixels upsampled "
        f"bilinearly to grids of {PATCH_SIZE} x {PATCH_SIZE} px patches: {sizes}."
    )
    print(
        f"Model: a ViT of {config.num_layers} pre-norm "
        f"block{'s' if config.num_layers > 1 else ''}, width {WIDTH}, "
        f"{NUM_HEADS} heads, feed-forward {FEED_FORWARD_DIM}, a class token. "
        f"Training: {config.steps} steps of {config.batch_size} images at "
        f"{config.grids[0]}x{config.grids[0]}. " + training.seeds_line(config)
    )
    if VISION_FULL_ONLY and config.encodings == VISION_DEMO_ENCODINGS:
        print(training.left_out_line(VISION_FULL_ONLY))
    runs = []
    total = len(config.encodings) * config.num_seeds
    number = 0
    for seed in training.seeds(config):
        scores = {}
        for encoding in config.encodings:
            number += 1
            seed_text = f", seed {seed}" if config.num_seeds > 1 else ""
            try:
                model = _train(
                    encoding,
                    config,
                    data,
                    out_dir,
                    f"[vision {number}/{total}{seed_text}]",
                    seed,
                )
            except RuntimeError as error:
                print(f"Error: {error}", file=sys.stderr)
                return 1
            scores.update(
                _evaluate(model, encoding, config, test_images, test_labels)
            )
        runs.append(scores)
    results = training.combine(runs)
    labelled = {VISION_LABELS[key]: scores for key, scores in results.items()}
    headers = [f"{grid}x{grid}" for grid in config.grids]
    title = (
        f"Test accuracy on held-out digits, trained at "
        f"{config.grids[0]}x{config.grids[0]} patches"
    )
    table = training.format_markdown(labelled, config.grids, headers)
    markdown_path = os.path.join(out_dir, "accuracy.md")
    with open(markdown_path, "w") as file:
        file.write(f"{title}. {training.seeds_line(config)}\n\n{table}\n")
    csv_path = os.path.join(out_dir, "accuracy.csv")
    training.write_csv(csv_path, labelled, config.grids, headers)
    means = {
        key: {grid: training.mean(values) for grid, values in scores.items()}
        for key, scores in results.items()
    }
    spread = None
    if config.num_seeds > 1:
        spread = {
            VISION_LABELS[key]: [
                float(np.std(scores[grid], ddof=1)) for grid in config.grids
            ]
            for key, scores in results.items()
        }
    figure = plot.resolution_curves(
        list(config.grids),
        {
            VISION_LABELS[key]: [scores[grid] for grid in config.grids]
            for key, scores in means.items()
        },
        config.grids[0],
        spread,
    )
    plot_path = os.path.join(out_dir, "accuracy.png")
    figure.savefig(plot_path, dpi=100)

    print(f"\n{title}:\n\n{table}\n")
    if config.judged:
        print("\n".join(findings(means, config)))
    else:
        print(training.QUICK_NOTE)
    print(
        f"\nWrote {markdown_path}, {csv_path} and {plot_path} in "
        f"{time.perf_counter() - started:.0f} s."
    )
    return 0
