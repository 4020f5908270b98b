"""What the demo trains and evaluates: its tasks, encodings and configurations.

Plain Python, unlike the tasks' modules (`language`, `vision`, `graph`),
which import Keras and its backend: the `keras-posenc` command reads these
for its `--help` without importing them.
"""

import dataclasses

from keras_posenc_lab import encodings

# What `make demo` takes on 2 cores, measured; the rows it leaves to
# `--full` keep it so.
DEMO_MINUTES = 7
ENCODINGS = tuple(encodings.LANGUAGE)
# The language rows that `make demo` leaves to `--full`, to stay within its
# minutes, and the rows it trains.
FULL_ONLY = encodings.full_only("language")
DEMO_ENCODINGS = tuple(name for name in ENCODINGS if name not in FULL_ONLY)
# RoPE schedules applied to the trained RoPE model at evaluation time, with
# no retraining: each extends the trained length to the evaluated one.
ROPE_SCALINGS = ("yarn", "linear", "dynamic")
# The language task's text: the synthetic order-2 Markov source, or the
# bytes of the Python standard library's source files.
DATA = ("markov", "python-source")
# The vision task's encodings of a ViT's patch grid, and their rows in its
# table.
VISION_ENCODINGS = tuple(encodings.VISION)
# Those `make demo` leaves to `--full`, as the language task's, and the
# rows it trains.
VISION_FULL_ONLY = encodings.full_only("vision")
VISION_DEMO_ENCODINGS = tuple(
    name for name in VISION_ENCODINGS if name not in VISION_FULL_ONLY
)
# Rows that evaluate another row's trained model at the larger grids, with
# no retraining, each after its model's row: the learned table resized
# bicubically to the new grid (its model's own row is the table not
# resized), and the 2-D sinusoidal encoding and axial RoPE with their
# positions scaled to the trained grid (position interpolation), the
# resize's like.
VISION_EVALUATIONS = {
    "learned": ("learned_bicubic", "learned + bicubic resize"),
    "sinusoidal_2d": ("sinusoidal_2d_scaled", "sinusoidal 2-D, positions scaled"),
    "axial_rope": ("axial_rope_scaled", "axial RoPE, positions scaled"),
}


def _vision_rows():
    """The vision table's rows: the registry's, each evaluation after its model."""
    rows = {}
    for name, label in encodings.labels("vision").items():
        rows[name] = label
        if name in VISION_EVALUATIONS:
            key, evaluation_label = VISION_EVALUATIONS[name]
            rows[key] = evaluation_label
    return rows


VISION_LABELS = _vision_rows()
# The graph task's encodings of a graph's nodes, and their rows in its table.
GRAPH_ENCODINGS = tuple(encodings.GRAPH)
GRAPH_LABELS = encodings.labels("graph")


@dataclasses.dataclass(frozen=True)
class Config:
    """What the demo trains and evaluates.

    Args:
        encodings: tuple of str. Encodings to train, from `ENCODINGS`;
            by default all but `FULL_ONLY`.
        data: tuple of str. The texts, from `DATA`: each is trained on and
            scored in turn, with a table of its own.
        steps: int. Training steps of each model.
        num_layers: int. Transformer blocks of each model.
        batch_size: int. Sequences per training step.
        train_length: int. Tokens per training sequence.
        lengths: tuple of int. Evaluation lengths, ascending.
        evaluation_tokens: int. Target tokens scored at every evaluation
            length; the same tokens at each.
        evaluation_batch_tokens: int. Tokens the model reads per call
            while scoring: a batch holds this many over the length
            sequences, at least one.
        seed: int. Seed of the Markov source and the evaluation text, and
            the first seed of the training data and weights.
        num_seeds: int. How many times each model is trained, with seeds
            `seed, seed + 1, ...`; the table gives the mean and the spread.
        jit_compile: bool. Whether training runs under XLA on
            TensorFlow; on JAX it always does, on PyTorch never
            (`training.compiled`). Evaluation calls the models eagerly
            either way: a few calls per shape, where tracing and compiling
            would cost more than they save.
        judged: bool. Whether the run is long enough to compare the
            encodings: it prints its findings after the table; `--quick`
            runs print a note instead.
        speed_rounds: int. Calls of each model's training function timed
            for its speed, after the other tasks are done where the run is
            judged.
    """

    encodings: tuple = DEMO_ENCODINGS
    data: tuple = ("markov",)
    steps: int = 1000
    num_layers: int = 2
    batch_size: int = 8
    train_length: int = 64
    lengths: tuple = (64, 128, 256, 512, 1024)
    evaluation_tokens: int = 8192
    evaluation_batch_tokens: int = 8192
    seed: int = 0
    num_seeds: int = 1
    jit_compile: bool = True
    judged: bool = True
    speed_rounds: int = 3

    def replace(self, **changes):
        """A copy with the changes that are not `None`, checked.

        Args:
            **changes: fields of `Config`; a `None` value keeps the field.
                `data` may be one text's name.

        Returns:
            A new `Config`.

        Raises:
            ValueError: when an encoding or a text is unknown, or when an
                evaluation length is shorter than the training length.
        """
        changes = _checked(changes, ENCODINGS, "language")
        if "data" in changes:
            data = changes["data"]
            data = (data,) if isinstance(data, str) else tuple(dict.fromkeys(data))
            if not data or any(text not in DATA for text in data):
                raise ValueError(
                    f"`data` must be among {', '.join(DATA)}. "
                    f"Received: data={changes['data']!r}"
                )
            changes["data"] = data
        if "lengths" in changes:
            changes["lengths"] = tuple(sorted(set(changes["lengths"])))
        config = dataclasses.replace(self, **changes)
        if config.lengths[0] < config.train_length:
            raise ValueError(
                "`lengths` must each be at least the training length "
                f"{config.train_length}: the demo tests longer, not shorter. "
                f"Received: lengths={list(config.lengths)}"
            )
        return config


def _checked(changes, encodings, task):
    """`changes` without its `None` values, its encodings checked and deduplicated."""
    changes = {name: value for name, value in changes.items() if value is not None}
    if "encodings" in changes:
        # In the order given, each once.
        changes["encodings"] = tuple(dict.fromkeys(changes["encodings"]))
        unknown = [name for name in changes["encodings"] if name not in encodings]
        if unknown:
            raise ValueError(
                f"`encodings` must be among {', '.join(encodings)} for the "
                f"{task} task. Received: encodings={list(changes['encodings'])}"
            )
    return changes


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """What the vision demo trains and evaluates.

    Args:
        encodings: tuple of str. Encodings to train, from
            `VISION_ENCODINGS`; by default all but `VISION_FULL_ONLY`.
        steps: int. Training steps of each model.
        num_layers: int. Transformer blocks of each model.
        batch_size: int. Images per training step.
        grids: tuple of int. Patches per side of the evaluated renderings,
            ascending; the first is the training grid.
        seed: int. The first seed of the training order and the weights.
        num_seeds: int. How many times each model is trained, with seeds
            `seed, seed + 1, ...`; the table gives the mean and the spread.
        jit_compile: bool. Whether training runs under XLA on
            TensorFlow; on JAX it always does, on PyTorch never
            (`training.compiled`).
        judged: bool. Whether the run is long enough to compare the
            encodings: it prints its findings after the table; `--quick`
            runs print a note instead.
    """

    encodings: tuple = VISION_DEMO_ENCODINGS
    steps: int = 300
    num_layers: int = 2
    batch_size: int = 32
    grids: tuple = (8, 12, 16)
    seed: int = 0
    num_seeds: int = 1
    jit_compile: bool = True
    judged: bool = True

    def replace(self, **changes):
        """A copy with the changes that are not `None`, checked.

        Args:
            **changes: fields of `VisionConfig`; a `None` value keeps the
                field.

        Returns:
            A new `VisionConfig`.

        Raises:
            ValueError: when an encoding is unknown.
        """
        return dataclasses.replace(self, **_checked(changes, VISION_ENCODINGS, "vision"))


@dataclasses.dataclass(frozen=True)
class GraphConfig:
    """What the graph demo trains and evaluates.

    Args:
        encodings: tuple of str. Encodings to train, from `GRAPH_ENCODINGS`.
        steps: int. Training steps of each model.
        num_layers: int. Transformer blocks of each model.
        batch_size: int. Graphs per training step.
        sizes: tuple of `(smallest, largest)` pairs. The numbers of nodes of
            the evaluated graphs, each drawn uniformly from its pair, in
            ascending order; the first pair is also the training graphs'.
        test_graphs: int. Held-out graphs of each pair of sizes.
        seed: int. The first seed of the training graphs and the weights.
        num_seeds: int. How many times each model is trained, with seeds
            `seed, seed + 1, ...`; the table gives the mean and the spread.
        jit_compile: bool. Whether training runs under XLA on
            TensorFlow; on JAX it always does, on PyTorch never
            (`training.compiled`).
        judged: bool. Whether the run is long enough to compare the
            encodings: it prints its findings after the table; `--quick`
            runs print a note instead.
    """

    encodings: tuple = GRAPH_ENCODINGS
    steps: int = 400
    num_layers: int = 2
    batch_size: int = 32
    sizes: tuple = ((8, 16), (24, 32), (48, 64))
    test_graphs: int = 256
    seed: int = 0
    num_seeds: int = 1
    jit_compile: bool = True
    judged: bool = True

    def replace(self, **changes):
        """A copy with the changes that are not `None`, checked.

        Args:
            **changes: fields of `GraphConfig`; a `None` value keeps the
                field.

        Returns:
            A new `GraphConfig`.

        Raises:
            ValueError: when an encoding is unknown.
        """
        return dataclasses.replace(self, **_checked(changes, GRAPH_ENCODINGS, "graph"))


DEFAULT = Config()
# `--full`: every encoding, on both texts, with 3 seeds, up to 32x the
# trained length, in batches twice the size, scored on four times the
# tokens (16 windows of 2048).
FULL = DEFAULT.replace(
    encodings=ENCODINGS,
    data=DATA,
    batch_size=16,
    lengths=DEFAULT.lengths + (2048,),
    evaluation_tokens=32768,
    num_seeds=3,
)
# `--gpu`: trained at 512 tokens and scored up to 16,384 (32x), in larger
# batches, for one GPU.
GPU = Config(
    train_length=512,
    lengths=(512, 1024, 2048, 4096, 8192, 16384),
    batch_size=32,
    evaluation_tokens=131072,
    evaluation_batch_tokens=65536,
)
GPU_FULL = GPU.replace(encodings=ENCODINGS, data=DATA, num_seeds=3)
# `--quick`: every model smaller (one block, not two: what a quick run
# spends is mostly tracing each model's training step, block by block),
# trained briefly on short sequences.
QUICK = Config(
    steps=40,
    num_layers=1,
    batch_size=16,
    train_length=16,
    lengths=(16, 32, 64),
    evaluation_tokens=1024,
    jit_compile=False,
    judged=False,
    speed_rounds=1,
)
VISION_DEFAULT = VisionConfig()
# `--full`: every encoding, with 3 seeds.
VISION_FULL = VISION_DEFAULT.replace(encodings=VISION_ENCODINGS, num_seeds=3)
VISION_QUICK = VisionConfig(
    steps=12,
    num_layers=1,
    batch_size=16,
    grids=(2, 3, 4),
    jit_compile=False,
    judged=False,
)
GRAPH_DEFAULT = GraphConfig()
# `--full`: every encoding, as the default, with 3 seeds.
GRAPH_FULL = GRAPH_DEFAULT.replace(num_seeds=3)
GRAPH_QUICK = GraphConfig(
    steps=10,
    num_layers=1,
    batch_size=8,
    sizes=((4, 6), (8, 10), (12, 16)),
    test_graphs=16,
    jit_compile=False,
    judged=False,
)


def language_config(quick=False, full=False, gpu=False):
    """The language task's configuration for the command's size options.

    Args:
        quick: bool. `--quick`: `QUICK`, every encoding with `full`.
            Defaults to `False`.
        full: bool. `--full`: `FULL`, or `GPU_FULL` with `gpu`. Defaults
            to `False`.
        gpu: bool. `--gpu`: `GPU`. Defaults to `False`.

    Returns:
        A `Config`.

    Raises:
        ValueError: when `quick` and `gpu` are both set.
    """
    if quick and gpu:
        raise ValueError(
            "`--quick` and `--gpu` are two sizes of the language task: give one."
        )
    if quick:
        return QUICK.replace(encodings=ENCODINGS if full else None)
    if gpu:
        return GPU_FULL if full else GPU
    return FULL if full else DEFAULT


def vision_config(quick=False, full=False):
    """The vision task's configuration for the command's size options.

    Args:
        quick: bool. `--quick`: `VISION_QUICK`, every encoding with
            `full`. Defaults to `False`.
        full: bool. `--full`: `VISION_FULL`. Defaults to `False`.

    Returns:
        A `VisionConfig`.
    """
    if quick:
        return VISION_QUICK.replace(encodings=VISION_ENCODINGS if full else None)
    return VISION_FULL if full else VISION_DEFAULT


def graph_config(quick=False, full=False):
    """The graph task's configuration for the command's size options.

    Args:
        quick: bool. `--quick`: `GRAPH_QUICK`, whatever `full`. Defaults to
            `False`.
        full: bool. `--full`: `GRAPH_FULL`. Defaults to `False`.

    Returns:
        A `GraphConfig`.
    """
    if quick:
        return GRAPH_QUICK
    return GRAPH_FULL if full else GRAPH_DEFAULT
