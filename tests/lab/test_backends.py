"""The demo's three tasks, tiny, on the backend the suite runs on.

`make test-jax` and `make test-torch` run this file too (the Makefile's
`BACKEND_TESTS`). Each task trains, saves, reloads (checking that the
reloaded model predicts identically) and scores one encoding for two
steps, through the command, in a process of its own where, but on
TensorFlow's backend, TensorFlow cannot be imported: as where it is not
installed. Two steps compare nothing: the tests check what such a run makes
certain, the tables' rows, columns and ranges. Training's progress is
checked here too, on every backend: Keras' bar on a terminal, one line in a
log.
"""

import csv
import io
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_posenc_lab import graph
from keras_posenc_lab import language
from keras_posenc_lab import training
from keras_posenc_lab.config import GRAPH_LABELS
from keras_posenc_lab.config import GRAPH_QUICK
from keras_posenc_lab.config import VISION_QUICK

BACKEND = keras.backend.backend()
STEPS = 2
# One encoding of each task, each with the evaluations of its own that
# rebuild a model: none for ALiBi, the unresized table for the learned one.
TASKS = {
    "language": ["--encodings", "alibi", "--lengths", "16", "32"],
    "vision": ["--encodings", "learned"],
    "graph": ["--encodings", "shortest_path"],
}
LABELS = {
    "language": "[language 1/1] Training with alibi:",
    "vision": "[vision 1/1] Training with a learned table:",
    "graph": f"[graph 1/1] Training with {GRAPH_LABELS['shortest_path']}:",
}
# The command, each task in turn, where the modules named cannot be imported.
CHILD = """
import sys
for name in {hidden!r}:
    sys.modules[name] = None
from keras_posenc_lab.cli import main
for argv in {runs!r}:
    status = main(argv)
    if status:
        sys.exit(status)
"""


@pytest.fixture(scope="module")
def tiny_tasks(tmp_path_factory):
    """The three tasks' tiny runs: the process's result and the output folder."""
    out_dir = tmp_path_factory.mktemp("tiny")
    runs = [
        ["demo", "--quick", "--task", task, *options, "--steps", str(STEPS),
         "--out", str(out_dir)]
        for task, options in TASKS.items()
    ]
    hidden = () if BACKEND == "tensorflow" else ("tensorflow", "tensorflow_text")
    result = subprocess.run(
        [sys.executable, "-c", CHILD.format(hidden=hidden, runs=runs)],
        env=dict(os.environ, KERAS_BACKEND=BACKEND),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return result, out_dir


def read_csv(path):
    with open(path, newline="") as file:
        return list(csv.reader(file))


def test_every_task_runs_tiny_on_this_backend(tiny_tasks):
    result, out_dir = tiny_tasks
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout
    for label in LABELS.values():
        assert label in printed
    assert printed.count(f"Trained {STEPS} steps in") == 3
    assert printed.count("predictions identical") == 3
    # Not a terminal: no progress bar.
    assert "\x1b" not in printed and "\r" not in printed
    assert sorted(path.name for path in out_dir.glob("*.keras")) == [
        "graph_shortest_path.keras",
        "lm_alibi.keras",
        "vit_learned.keras",
    ]


def test_the_language_table(tiny_tasks):
    _, out_dir = tiny_tasks
    header, row = read_csv(out_dir / "nll.csv")
    assert header == ["encoding", "16", "32", "train tokens/s"]
    name, *nlls, speed = row
    assert name == "alibi"
    # Two steps from a uniform guess, log(16) nats, cannot go far from it.
    for nll in nlls:
        assert 0.0 < float(nll) < math.log(language.VOCABULARY_SIZE) + 2.0
    assert float(speed) > 0
    with open(out_dir / "nll.md") as file:
        assert "| alibi | " in file.read()


def test_the_vision_table(tiny_tasks):
    _, out_dir = tiny_tasks
    header, *rows = read_csv(out_dir / "accuracy.csv")
    assert header == ["encoding"] + [f"{grid}x{grid}" for grid in VISION_QUICK.grids]
    accuracies = {name: [float(cell) for cell in cells] for name, *cells in rows}
    assert list(accuracies) == ["learned, not resized", "learned + bicubic resize"]
    for cells in accuracies.values():
        assert all(0.0 <= cell <= 1.0 for cell in cells)
    # At the trained grid there is nothing to resize: one model, one score.
    assert accuracies["learned, not resized"][0] == accuracies["learned + bicubic resize"][0]


def test_the_graph_table(tiny_tasks):
    _, out_dir = tiny_tasks
    header, row = read_csv(out_dir / "graph_accuracy.csv")
    assert header == ["encoding"] + [graph.size_header(sizes) for sizes in GRAPH_QUICK.sizes]
    name, *cells = row
    assert name == GRAPH_LABELS["shortest_path"]
    assert all(0.0 <= float(cell) <= 1.0 for cell in cells)


class Terminal(io.StringIO):
    """Standard output as a terminal shows it."""

    def isatty(self):
        return True


def tiny_fit(label):
    """`training.fit` of a one-layer model, 8 steps of 2 rows."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6)])
    training.compiled(model, False, 1, loss=keras.losses.MeanSquaredError())
    inputs = np.random.default_rng(0).normal(size=(16, 6)).astype("float32")
    training.fit(model, inputs, inputs, 2, label)


def test_training_shows_the_task_encoding_and_step_on_a_terminal(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    tiny_fit("[language 3/7] Training with rope")
    shown = terminal.getvalue()
    assert shown.startswith("\n[language 3/7] Training with rope:\n")
    # Keras' bar, redrawn in place: the step of the steps, then the loss.
    assert "\r" in shown
    assert "8/8" in shown and "loss:" in shown
    assert "Trained 8 steps in" not in shown


def test_training_prints_one_line_in_a_log(capsys):
    tiny_fit("[graph 1/4] Training with none")
    printed = capsys.readouterr().out
    assert printed.startswith("\n[graph 1/4] Training with none:\nTrained 8 steps in ")
    assert printed.count("\n") == 3
    assert "\x1b" not in printed and "\r" not in printed


def test_training_compiles_a_step_as_the_backend_runs_it_best():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6)])
    for jit_compile in (False, True):
        training.compiled(model, jit_compile, 10)
        # XLA on TensorFlow as asked, on JAX always (its eager mode compiles
        # each op alone), on PyTorch never (one step per call).
        expected = {
            "tensorflow": jit_compile,
            "jax": True,
            "torch": False,
        }[BACKEND]
        assert model.jit_compile is expected
        assert model.steps_per_execution == (10 if expected else 1)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_training_adam_sums_a_table_rows_lookups_before_squaring(jit_compile):
    # Row 0 is read three times in one example, row 1 once, row 2 never:
    # on TensorFlow its gradient arrives as one slice per lookup.
    ids = np.array([[0, 0, 0, 1]], "int32")
    target = np.array([[1.0, -2.0]], "float32")
    model = keras.Sequential(
        [
            keras.Input((4,), dtype="int32"),
            keras.layers.Embedding(3, 2, embeddings_initializer="ones"),
            keras.layers.GlobalAveragePooling1D(),
        ]
    )
    training.compiled(
        model, jit_compile, 1, loss=keras.losses.MeanSquaredError()
    )
    model.fit(ids, target, batch_size=1, epochs=2, shuffle=False, verbose=0)
    # Adam (Kingma and Ba 2015) in float64 on the dense gradient, as Keras
    # writes it: the bias corrections folded into the step size.
    table = np.ones((3, 2))
    m, v = np.zeros_like(table), np.zeros_like(table)
    counts = np.bincount(ids[0], minlength=3)[:, None]  # (3, 1)
    for step in range(1, 3):
        mean = (table[ids[0]]).mean(axis=0)
        gradient = counts / ids.shape[1] * 2 * (mean - target[0]) / target.shape[1]
        m += (gradient - m) * 0.1
        v += (gradient**2 - v) * 0.001
        alpha = training.LEARNING_RATE * np.sqrt(1 - 0.999**step) / (1 - 0.9**step)
        table -= m * alpha / (np.sqrt(v) + 1e-7)
    got = keras.ops.convert_to_numpy(model.layers[0].embeddings)
    np.testing.assert_allclose(got, table, rtol=0, atol=1e-6)
