"""What the demo's tasks share: compiling, training, saving, and their tables.

Each task (`language`, `vision`, `graph`) trains one small model per
encoding with these, saves and reloads it, and writes its table of scores
per seed with `combine`, `format_markdown` and `write_csv`.
"""

import csv
import sys
import time

import keras
import numpy as np

from keras_posenc_lab.config import DEMO_MINUTES

LEARNING_RATE = 2e-3
# What a `--quick` run prints in place of its findings, as `bench --tiny`
# judges no ratio.
QUICK_NOTE = (
    "A quick run: it checks that every model trains, saves, loads back and "
    "is scored, too briefly for its numbers to compare the encodings, so it "
    "draws no conclusions from them. Run without --quick for those."
)


@keras.saving.register_keras_serializable(package="keras_posenc_lab")
class DenseAdam(keras.optimizers.Adam):
    """Keras' Adam, given every gradient dense: the same Adam on every backend.

    On TensorFlow the gradient of a table read by lookups (a token
    embedding, a bias per hop count) is a `tf.IndexedSlices` with one slice
    per lookup, and Keras' Adam squares those slices one by one for its
    second moment, where Adam squares their sum. A row read many times in a
    batch then takes larger steps than on JAX and PyTorch, whose gradients
    are dense, and the backends train apart. Summing the slices first gives
    the same update on all three.

    Saved models name it: `keras_posenc_lab` is imported before they load.
    """

    def apply(self, grads, trainable_variables=None):
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            grads = [
                tf.convert_to_tensor(grad)
                if isinstance(grad, tf.IndexedSlices)
                else grad
                for grad in grads
            ]
        return super().apply(grads, trainable_variables)


def compiled(model, jit_compile, steps_per_execution, loss=None):
    """`model` compiled with Adam at `LEARNING_RATE` and cross-entropy on logits.

    The Adam is `DenseAdam`, which trains alike on the three backends.

    Under XLA each call of the training function runs `steps_per_execution`
    steps: the demos' steps are tiny, and running several per call saves
    Python's overhead, at the cost of compiling a loop. `jit_compile` says
    whether TensorFlow's backend trains under XLA; JAX's always does (its
    eager mode compiles every op on its own, which costs a tiny model's
    step more than compiling the step whole), and PyTorch's never, as in
    Keras' own default (its trainer runs one step per call, and
    `torch.compile` would take longer than the demo's training).

    Args:
        model: a `keras.Model`.
        jit_compile: bool. Whether to train under XLA on TensorFlow.
        steps_per_execution: int. Steps per call under XLA.
        loss: a `keras.losses.Loss` or None. `None` for sparse categorical
            cross-entropy on logits. Defaults to `None`.

    Returns:
        `model`, compiled.
    """
    backend = keras.backend.backend()
    xla = backend == "jax" or (backend == "tensorflow" and jit_compile)
    model.compile(
        optimizer=DenseAdam(LEARNING_RATE),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=steps_per_execution if xla else 1,
        jit_compile=xla,
    )
    return model


def fit(model, inputs, targets, batch_size, label):
    """Train `model` one pass over `inputs`, with progress where it helps.

    `label` is printed first. On a terminal Keras' own progress bar follows
    it, redrawn in place: the step, the time left and the loss. In a file
    or a CI log the bar would be thousands of characters of ANSI codes and
    carriage returns, so there one line after training says it.

    Args:
        model: a compiled `keras.Model`.
        inputs: array, or a dict of arrays for a model of several inputs.
            One row per example, in training order.
        targets: array. One row per example.
        batch_size: int. Examples per step.
        label: str. What is trained: the task, the model's number and its
            encoding.
    """
    steps = len(targets) // batch_size
    interactive = sys.stdout.isatty()
    print(f"\n{label}:", flush=True)
    started = time.perf_counter()
    # Its variables made now, not inside the training function's first
    # trace: TensorFlow traces a function again when its first trace made
    # variables, and that second trace took half of a quick run's training.
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    history = model.fit(
        inputs,
        targets,
        batch_size=batch_size,
        epochs=1,
        shuffle=False,
        verbose=1 if interactive else 0,
    )
    if not interactive:
        print(
            f"Trained {steps} steps in {time.perf_counter() - started:.0f} s; "
            f"final loss {history.history['loss'][-1]:.3f}."
        )


def predict(model, inputs):
    """`model`'s outputs on `inputs`, called eagerly, as a NumPy array.

    The call is eager: the evaluations call each model a few times per
    shape, where tracing and compiling would cost more than they save.
    On PyTorch the outputs hold the graph of their gradients, which NumPy
    cannot read: `keras.ops.convert_to_numpy` detaches them.
    """
    return keras.ops.convert_to_numpy(model(inputs, training=False))


def save_and_reload(model, path, probes):
    """Save `model` to `path`, reload it, and check it predicts identically.

    Args:
        model: a `keras.Model`.
        path: str. A `.keras` file.
        probes: list of arrays. Inputs both models must map to bit-identical
            outputs.

    Returns:
        The reloaded model, loaded with `safe_mode=True`.

    Raises:
        RuntimeError: when the reloaded model predicts differently.
    """
    model.save(path)
    reloaded = keras.models.load_model(path, safe_mode=True)
    for probe in probes:
        if not np.array_equal(predict(model, probe), predict(reloaded, probe)):
            raise RuntimeError(
                f"the model reloaded from {path} predicts differently from "
                "the trained model."
            )
    print(f"Saved to {path}; reloaded with safe_mode=True, predictions identical.")
    return reloaded


def left_out_line(names):
    """The line naming the rows `make demo` leaves to `--full`, and why."""
    return (
        f"Left out to keep the demo within {DEMO_MINUTES} minutes: "
        f"{', '.join(names)}; `keras-posenc demo --full` trains every encoding."
    )


def seeds(config):
    """The training seeds of `config`: `num_seeds` from `config.seed` on."""
    return range(config.seed, config.seed + config.num_seeds)


def seeds_line(config):
    """One line saying which seeds the table averages, and how to get more."""
    if config.num_seeds == 1:
        return (
            f"One seed ({config.seed}): `--seeds 3` trains each model three "
            "times and gives the mean and the spread."
        )
    return (
        f"{config.num_seeds} seeds ({', '.join(map(str, seeds(config)))}): "
        "each cell is the mean, with the sample standard deviation after ±."
    )


def combine(runs):
    """Per-seed tables as one: `{row: {column: [value per seed] or None}}`.

    Args:
        runs: list of dicts, one per seed, each `{row: {column: value or
            None}}`, with the same rows and columns.

    Returns:
        A dict in the first run's row order.
    """
    return {
        row: {
            column: (
                None
                if value is None
                else [run[row][column] for run in runs]
            )
            for column, value in columns.items()
        }
        for row, columns in runs[0].items()
    }


def mean(values):
    """The mean of a list of floats, or `None` for `None` or an empty list."""
    return float(np.mean(values)) if values else None


def cell(values):
    """A table cell: `n/a`, a value, or the mean ± the sample deviation."""
    if values is None:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def format_markdown(results, columns, headers=None, extra=()):
    """A Markdown table: one row per entry of `results`, a column per `columns`.

    Args:
        results: dict from row name to `{column: [values] or None}`, as
            `combine` gives.
        columns: list. The columns' keys, in order.
        headers: list of str or None. Their headers; `None` for the keys.
            Defaults to `None`.
        extra: list of `(header, {row: str})` pairs: more columns after
            those, blank where a row has no entry. Defaults to `()`.

    Returns:
        A str.
    """
    headers = [str(column) for column in columns] if headers is None else headers
    names = list(headers) + [header for header, _ in extra]
    lines = [
        "| encoding | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for name, scores in results.items():
        cells = [cell(scores[column]) for column in columns]
        cells += [texts.get(name, "") for _, texts in extra]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(path, results, columns, headers=None, extra=()):
    """Write the table as CSV: the mean of each column, `n/a` where undefined.

    With more than one seed each column is followed by its sample standard
    deviation, headed `<column> std`. `extra` is a list of `(header, {row:
    float or None})` columns written after them.
    """
    headers = [str(column) for column in columns] if headers is None else headers
    spread = any(
        values is not None and len(values) > 1
        for scores in results.values()
        for values in scores.values()
    )
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(
            ["encoding"]
            + [
                name
                for header in headers
                for name in ([header, f"{header} std"] if spread else [header])
            ]
            + [header for header, _ in extra]
        )
        for name, scores in results.items():
            row = [name]
            for column in columns:
                values = scores[column]
                row.append("n/a" if values is None else f"{np.mean(values):.4f}")
                if spread:
                    row.append(
                        "n/a"
                        if values is None
                        else f"{np.std(values, ddof=1):.4f}"
                    )
            for _, numbers in extra:
                value = numbers.get(name)
                row.append("" if value is None else f"{value:.1f}")
            writer.writerow(row)

