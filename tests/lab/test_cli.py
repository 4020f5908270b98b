import contextlib
import csv
import io
import math
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc_lab import cli
from keras_posenc_lab import runner
from keras_posenc_lab import language
from keras_posenc_lab import graph
from keras_posenc_lab import training
from keras_posenc_lab import vision
from keras_posenc_lab.config import GRAPH_ENCODINGS
from keras_posenc_lab.config import GRAPH_LABELS
from keras_posenc_lab.config import GRAPH_QUICK
from keras_posenc_lab.config import VISION_DEMO_ENCODINGS
from keras_posenc_lab.config import VISION_ENCODINGS
from keras_posenc_lab.config import VISION_EVALUATIONS
from keras_posenc_lab.config import VISION_LABELS
from keras_posenc_lab.config import VISION_QUICK
from keras_posenc_lab.cli import main
from keras_posenc_lab import config as demo_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT_NAMES = ["encoding_heatmap.png", "similarity.png", "rope_wavelengths.png"]

def assert_pngs(out_dir):
    for name in PLOT_NAMES:
        with open(out_dir / name, "rb") as file:
            assert file.read(8) == PNG_SIGNATURE
        assert os.path.getsize(out_dir / name) > 10_000


def test_plot_writes_the_pngs_and_prints_their_paths(tmp_path, capsys):
    out_dir = tmp_path / "plots"
    status = main(
        ["plot", "--length", "32", "--dim", "16", "--out", str(out_dir)]
    )
    assert status == 0
    assert sorted(os.listdir(out_dir)) == sorted(PLOT_NAMES)
    assert_pngs(out_dir)
    printed = capsys.readouterr().out.split()
    assert printed == [str(out_dir / name) for name in PLOT_NAMES]


def test_plot_help_names_the_files_it_writes(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["plot", "--help"])
    assert raised.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for name in PLOT_NAMES:
        assert name in help_text


def test_version(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0
    assert capsys.readouterr().out == f"keras-posenc {keras_posenc.__version__}\n"


# The installed command, beside this Python (the venv's bin folder).
COMMAND = str(pathlib.Path(sys.executable).parent / "keras-posenc")


@pytest.mark.parametrize(
    "command",
    [[COMMAND], [sys.executable, "-m", "keras_posenc_lab"]],
    ids=["keras-posenc", "python -m keras_posenc_lab"],
)
@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_import_neither_keras_nor_the_layers(command, option):
    # -X importtime lists every module imported, on stderr.
    result = subprocess.run(
        command + [option],
        env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    imported = {
        line.split("|")[-1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "keras_posenc_lab" in imported
    assert not imported & {
        "keras",
        "keras_posenc",
        "tensorflow",
        "numpy",
        "matplotlib",
    }
    if option == "--help":
        assert result.stdout.startswith("usage: keras-posenc")
    else:
        assert result.stdout == f"keras-posenc {keras_posenc.__version__}\n"


def test_importing_the_package_registers_the_layers_whatever_the_program(tmp_path):
    # A program named as the command imports the library as any other does.
    program = tmp_path / "keras-posenc"
    program.write_text(
        "import keras\n"
        "import keras_posenc\n"
        "print(keras.saving.get_registered_object("
        "'keras_posenc>RotaryEmbedding') is keras_posenc.RotaryEmbedding)\n"
    )
    result = subprocess.run(
        [sys.executable, str(program)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "True\n"


def test_command_hides_tensorflow_logging_unless_verbose(tmp_path):
    result = subprocess.run(
        [COMMAND, "plot", "--length", "8", "--dim", "4", "--out", str(tmp_path)],
        env={
            name: value
            for name, value in os.environ.items()
            if name != "TF_CPP_MIN_LOG_LEVEL"
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.split() == [str(tmp_path / name) for name in PLOT_NAMES]


MATPLOTLIB = '"matplotlib<4,>=3.8"'
SCIKIT_LEARN = '"scikit-learn<2,>=1.3"'
KERAS_HUB = '"keras-hub<0.33,>=0.21"'


@pytest.mark.parametrize(
    "command, backend, modules, distributions, pins",
    [
        ("plot", "tensorflow", ["matplotlib"], "matplotlib", MATPLOTLIB),
        ("demo", "tensorflow", ["matplotlib"], "matplotlib", MATPLOTLIB),
        ("demo", "jax", ["sklearn"], "scikit-learn", SCIKIT_LEARN),
        (
            "demo",
            "torch",
            ["matplotlib", "sklearn"],
            "matplotlib and scikit-learn",
            f"{MATPLOTLIB} {SCIKIT_LEARN}",
        ),
        ("bench", "tensorflow", ["keras_hub"], "keras-hub", KERAS_HUB),
        ("bench", "jax", ["keras_hub"], "keras-hub", KERAS_HUB),
    ],
    ids=["plot", "demo-matplotlib", "demo-sklearn", "demo-both", "bench", "bench-jax"],
)
def test_a_missing_extra_is_named_in_one_line(
    command, backend, modules, distributions, pins, monkeypatch, capsys
):
    find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name: None if name in modules else find_spec(name),
    )
    monkeypatch.setenv("KERAS_BACKEND", backend)
    assert main([command]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    # The benchmarks' extra is the same on every backend: the line says
    # which one they were to run on.
    on = f" on Keras' {backend} backend" if command == "bench" else ""
    assert line == (
        f"keras-posenc: error: `keras-posenc {command}`{on} needs {distributions}, "
        f"which the `{command}` extra installs. Install it with: pip install {pins}"
    )


@pytest.mark.parametrize("tasks, refused", [(["language"], False), (["vision"], True)])
def test_only_the_vision_task_needs_scikit_learn(tasks, refused, monkeypatch, capsys):
    find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name: None if name == "sklearn" else find_spec(name),
    )
    # What runs after the check, stopped there.
    monkeypatch.setattr(cli, "_import_backend", lambda verbose: "stopped after the check")
    assert main(["demo", "--quick", "--task", *tasks]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert ("needs scikit-learn" in line) == refused
    assert ("stopped after the check" in line) == (not refused)


def test_the_missing_extra_pins_are_this_packages_own():
    # The messages above quote setup.cfg's ranges, as installed.
    requirements = cli.importlib.metadata.requires("keras-posenc")
    for pin in ("matplotlib<4,>=3.8", "scikit-learn<2,>=1.3"):
        assert f'{pin}; extra == "demo"' in requirements
    assert 'keras-hub<0.33,>=0.21; extra == "bench"' in requirements
    # The backend's library comes with the backend's extra, not these.
    for extra in ("demo", "bench"):
        assert not [
            requirement
            for requirement in requirements
            if requirement.endswith(f'extra == "{extra}"')
            and requirement.startswith(("tensorflow", "jax", "torch"))
        ], extra


# Each backend's library, and the modules that stand for it in a process
# where it is to look not installed.
LIBRARIES = {
    "tensorflow": ("tensorflow", "tensorflow_text"),
    "jax": ("jax", "jaxlib"),
    "torch": ("torch",),
}


@pytest.mark.parametrize("backend", sorted(LIBRARIES))
@pytest.mark.parametrize("command", ["demo", "bench"])
def test_a_missing_backend_library_is_named_in_one_line(command, backend):
    # In a process where Keras is not imported yet and the library of the
    # backend KERAS_BACKEND names cannot be: the line says which backend
    # Keras chose and how to install it.
    hidden = "; ".join(f"sys.modules[{name!r}] = None" for name in LIBRARIES[backend])
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; {hidden}; from keras_posenc_lab.cli import main; "
            f"sys.exit(main([{command!r}, '--tiny' if {command!r} == 'bench' "
            "else '--quick']))",
        ],
        env=dict(os.environ, KERAS_BACKEND=backend),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"keras-posenc: error: Keras chose the '{backend}' backend (KERAS_BACKEND, "
    )
    assert f'pip install "keras-posenc[{backend}] @ ' in line


def test_bench_on_tensorflow_is_refused_under_another_keras_backend(
    monkeypatch, capsys
):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    with pytest.raises(SystemExit) as raised:
        main(["bench", "--backend", "tensorflow", "--tiny"])
    assert raised.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()[-1:]
    assert line.endswith(
        "`--backend tensorflow` runs every benchmark on TensorFlow, but "
        "KERAS_BACKEND=jax: unset it, or leave out --backend to run them on jax."
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plot", "--length", "0"], "argument --length: must be an integer"),
        (["plot", "--dim", "-3"], "argument --dim: must be an integer"),
        (["plot", "--dim", "wide"], "Received: 'wide'"),
        (["demo", "--steps", "0"], "argument --steps: must be an integer"),
        (["demo", "--lengths", "128", "0"], "argument --lengths: must be an integer"),
        (["demo", "--lengths", "-64"], "argument --lengths: must be an integer"),
        (["demo", "--train-length", "1"], "argument --train-length: must be"),
        (["demo", "--seed", "-1"], "argument --seed: must be an integer"),
        (["demo", "--encodings", "yarn"], "argument --encodings: invalid choice: 'yarn'"),
        (["demo", "--encodings"], "argument --encodings: expected at least one"),
        (["demo", "--lengths", "32"], "`lengths` must each be at least the training length 64"),
        (["demo", "--quick", "--train-length", "40"], "Received: lengths=[16, 32, 64]"),
        (["demo", "--seeds", "0"], "argument --seeds: must be an integer"),
        (["demo", "--data", "wiki"], "argument --data: invalid choice: 'wiki'"),
        (["demo", "--task", "pictures"], "argument --task: invalid choice: 'pictures'"),
        (["demo", "--task"], "argument --task: expected at least one"),
        (
            ["demo", "--encodings", "rope"],
            "`--encodings` names the encodings of one task",
        ),
        (
            ["demo", "--task", "vision", "--encodings", "rope"],
            "`encodings` must be among none, learned, sinusoidal_raster, "
            "sinusoidal_2d, axial_rope, mrope, swin_bias for the vision task. "
            "Received: encodings=['rope']",
        ),
        (
            ["demo", "--task", "language", "--encodings", "axial_rope"],
            "for the language task. Received: encodings=['axial_rope']",
        ),
        (
            ["demo", "--task", "graph", "--encodings", "rope"],
            "`encodings` must be among none, laplacian, random_walk, "
            "shortest_path for the graph task. Received: encodings=['rope']",
        ),
        (
            ["demo", "--task", "vision", "graph", "--encodings", "none"],
            "`--encodings` names the encodings of one task",
        ),
        (
            ["demo", "--task", "vision", "--lengths", "100"],
            "`--lengths` applies to the language task, not to --task vision.",
        ),
        (
            ["demo", "--task", "vision", "--train-length", "8"],
            "`--train-length` applies to the language task",
        ),
        (
            ["demo", "--task", "vision", "--data", "markov"],
            "`--data` applies to the language task",
        ),
        (
            ["demo", "--task", "vision", "--gpu"],
            "`--gpu` applies to the language task, not to --task vision.",
        ),
        (
            ["demo", "--quick", "--gpu"],
            "`--quick` and `--gpu` are two sizes of the language task",
        ),
        (
            ["demo", "--task", "graph", "vision", "--train-length", "8"],
            "`--train-length` applies to the language task, not to --task "
            "vision graph.",
        ),
        (["bench", "--repeats", "0"], "argument --repeats: must be an integer"),
        (["train"], "invalid choice: 'train'"),
        ([], "the following arguments are required"),
    ],
)
def test_bad_arguments_exit_with_a_one_line_message(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        main(argv)
    assert raised.value.code == 2
    error_lines = [
        line
        for line in capsys.readouterr().err.splitlines()
        if "error:" in line
    ]
    assert len(error_lines) == 1
    assert error_lines[0].startswith("keras-posenc")
    assert message in error_lines[0]


QUICK_LENGTHS = [str(length) for length in demo_config.QUICK.lengths]
QUICK_GRIDS = [f"{grid}x{grid}" for grid in VISION_QUICK.grids]
QUICK_SIZES = [graph.size_header(sizes) for sizes in GRAPH_QUICK.sizes]
SPEED_HEADERS = ["train tokens/s", "÷ sinusoidal", "Press et al. ÷ sinusoidal"]


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """The quick demo of every task: its output folder and what it printed."""
    out_dir = tmp_path_factory.mktemp("demo")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = main(["demo", "--quick", "--out", str(out_dir)])
    return status, out_dir, printed.getvalue()


def markdown_rows(markdown):
    """`{first cell: [other cells]}` of a Markdown table's body rows."""
    rows = {}
    for line in markdown.splitlines():
        if line.startswith("| ") and not line.startswith("| encoding |"):
            name, *cells = [cell.strip() for cell in line.strip("|").split("|")]
            rows[name] = cells
    return rows


def test_quick_demo_runs_every_task(quick_demo):
    status, _, printed = quick_demo
    assert status == 0
    language = printed.index("== The language task ==")
    vision = printed.index("== The vision task ==")
    graph = printed.index("== The graph task ==")
    done = printed.index("The language, vision and graph tasks done in")
    assert language < vision < graph < done
    # The vision and graph tasks ran alongside, one after the other in a
    # second process; its log comes whole after the language task's last
    # line.
    assert (
        "The vision and graph tasks run alongside, one after the other, in a "
        "second process" in printed[language:vision]
    )
    assert printed.index("nll.png in ") < vision < printed.index("accuracy.png in ")
    assert printed.index("accuracy.png in ") < graph
    assert graph < printed.index("graph_accuracy.csv in ")
    assert "The vision and graph tasks done in" in printed[graph:done]
    # A quick run is too short to compare the encodings: tables, no verdicts.
    for task in (printed[language:vision], printed[vision:graph], printed[graph:done]):
        assert training.QUICK_NOTE in task
    assert "nats from length" not in printed[language:vision]
    assert "beats none" not in printed[graph:done]
    # The language rows of `make demo`: all but those left to --full, which
    # the run names.
    assert demo_config.FULL_ONLY and set(demo_config.DEMO_ENCODINGS) == set(
        demo_config.ENCODINGS
    ) - set(demo_config.FULL_ONLY)
    # The vision rows likewise.
    assert demo_config.VISION_FULL_ONLY and set(VISION_DEMO_ENCODINGS) == set(
        VISION_ENCODINGS
    ) - set(demo_config.VISION_FULL_ONLY)
    assert printed.count("predictions identical") == len(
        demo_config.DEMO_ENCODINGS
    ) + len(VISION_DEMO_ENCODINGS) + len(GRAPH_ENCODINGS)
    for left_out, task in (
        (demo_config.FULL_ONLY, printed[language:vision]),
        (demo_config.VISION_FULL_ONLY, printed[vision:graph]),
    ):
        assert (
            f"Left out to keep the demo within {demo_config.DEMO_MINUTES} minutes: "
            + ", ".join(left_out)
            + "; `keras-posenc demo --full` trains every encoding."
        ) in task
    assert "Left out" not in printed[graph:done]
    # Not a terminal: one line per model and length, no progress bars (the
    # longest line is the language task's description of its model).
    assert "\x1b" not in printed and "\r" not in printed
    assert max(len(line) for line in printed.splitlines()) < 400


def test_quick_demo_trains_models_of_one_block(quick_demo):
    # A quick run's time is mostly each model's tracing, block by block:
    # its models have one block, the demo's two.
    status, out_dir, printed = quick_demo
    assert status == 0
    assert demo_config.QUICK.num_layers == VISION_QUICK.num_layers == 1
    assert GRAPH_QUICK.num_layers == 1
    for default in (demo_config.DEFAULT, demo_config.VISION_DEFAULT, demo_config.GRAPH_DEFAULT):
        assert default.num_layers == 2
    for file in ("lm_rope.keras", "vit_axial_rope.keras", "graph_shortest_path.keras"):
        model = keras.models.load_model(out_dir / file, safe_mode=True)
        assert vision.num_blocks(model) == 1, file
    assert "Model: 1 pre-norm causal transformer block, width" in printed
    assert "Model: a ViT of 1 pre-norm block, width" in printed
    assert "Model: 1 pre-norm transformer block over the nodes" in printed


def test_quick_demo_writes_a_table_of_every_encoding(quick_demo):
    status, out_dir, printed = quick_demo
    assert status == 0
    names = list(demo_config.DEMO_ENCODINGS) + [
        f"rope + {schedule}" for schedule in demo_config.ROPE_SCALINGS
    ]
    with open(out_dir / "nll.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding"] + QUICK_LENGTHS + ["train tokens/s"]
    assert sorted(row[0] for row in rows[1:]) == sorted(names)
    ceiling = math.log(language.VOCABULARY_SIZE) + 2.0
    for name, *cells, speed in rows[1:]:
        for length, cell in zip(demo_config.QUICK.lengths, cells):
            if name == "learned" and length > demo_config.QUICK.train_length:
                assert cell == "n/a"
            else:
                assert 0.0 < float(cell) < ceiling, (name, length, cell)
        # The scalings are the trained RoPE model's: not trained again.
        if name in demo_config.ENCODINGS:
            assert float(speed) > 0, name
        else:
            assert speed == "", name
    with open(out_dir / "nll.md") as file:
        markdown = file.read()
    title = (
        "Mean negative log-likelihood per token (nats), trained at length "
        f"{demo_config.QUICK.train_length}"
    )
    assert markdown.startswith(f"{title}; entropy rate ")
    assert f"{title}; entropy rate " in printed
    assert (
        "| encoding | " + " | ".join(QUICK_LENGTHS + SPEED_HEADERS) + " |" in markdown
    )
    table = markdown_rows(markdown)
    assert sorted(table) == sorted(names)
    assert table["sinusoidal"][-2:] == ["1.00x", "1.00x"]
    assert table["rope"][-1] == "0.70x" and table["t5"][-1] == "0.51x"
    assert table["none"][-1] == ""
    assert table["rope + yarn"][-3:] == ["", "", ""]
    for name in demo_config.DEMO_ENCODINGS:
        tokens_per_second, ratio, _ = table[name][-3:]
        assert float(tokens_per_second.replace(",", "")) > 0
        assert ratio.endswith("x") and float(ratio[:-1]) > 0
    assert "entropy rate" in printed and "nats per symbol" in printed
    assert printed.count(f"Trained {demo_config.QUICK.steps} steps in") == len(
        demo_config.DEMO_ENCODINGS
    )
    assert f"NLL per token at length {demo_config.QUICK.lengths[-1]}:" in printed
    with open(out_dir / "nll.png", "rb") as file:
        assert file.read(8) == PNG_SIGNATURE


@pytest.mark.parametrize("encoding", demo_config.DEMO_ENCODINGS)
def test_quick_demo_models_reload(quick_demo, encoding):
    _, out_dir, _ = quick_demo
    model = keras.models.load_model(
        out_dir / f"lm_{encoding}.keras", safe_mode=True
    )
    token_ids = np.zeros((2, demo_config.QUICK.train_length), "int32")
    logits = model.predict(token_ids, verbose=0)
    assert logits.shape == (2, demo_config.QUICK.train_length, language.VOCABULARY_SIZE)
    assert np.all(np.isfinite(logits))


def test_quick_demo_writes_the_vision_table(quick_demo):
    status, out_dir, printed = quick_demo
    assert status == 0
    # The trained models' rows, each evaluated model's after its own.
    evaluated = {
        VISION_EVALUATIONS[name][0]
        for name in VISION_DEMO_ENCODINGS
        if name in VISION_EVALUATIONS
    }
    labels = [
        label
        for key, label in VISION_LABELS.items()
        if key in VISION_DEMO_ENCODINGS or key in evaluated
    ]
    assert len(labels) == len(VISION_DEMO_ENCODINGS) + len(evaluated)
    with open(out_dir / "accuracy.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding"] + QUICK_GRIDS
    assert sorted(row[0] for row in rows[1:]) == sorted(labels)
    accuracies = {name: [float(cell) for cell in cells] for name, *cells in rows[1:]}
    for name, cells in accuracies.items():
        assert all(0.0 <= cell <= 1.0 for cell in cells), (name, cells)
    # At the trained grid there is nothing to resize: one model, one score.
    assert (
        accuracies["learned, not resized"][0]
        == accuracies["learned + bicubic resize"][0]
    )
    with open(out_dir / "accuracy.md") as file:
        markdown = file.read()
    title = "Test accuracy on held-out digits, trained at 2x2 patches"
    assert markdown.startswith(f"{title}. One seed (0)")
    assert f"{title}:" in printed
    assert "| encoding | " + " | ".join(QUICK_GRIDS) + " |" in markdown
    table = markdown_rows(markdown)
    assert sorted(table) == sorted(labels)
    for name, cells in table.items():
        assert [float(cell) for cell in cells] == pytest.approx(
            accuracies[name], abs=5e-4
        )
    assert printed.count(f"Trained {VISION_QUICK.steps} steps in") == len(
        VISION_DEMO_ENCODINGS
    )
    assert "Data: scikit-learn's handwritten digits" in printed
    # A quick run judges nothing: its table, and no findings.
    assert "Holds best at 4x4: " not in printed
    assert training.QUICK_NOTE in printed
    with open(out_dir / "accuracy.png", "rb") as file:
        assert file.read(8) == PNG_SIGNATURE


def test_quick_demo_writes_the_graph_table(quick_demo):
    status, out_dir, printed = quick_demo
    assert status == 0
    labels = [GRAPH_LABELS[encoding] for encoding in GRAPH_ENCODINGS]
    with open(out_dir / "graph_accuracy.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding"] + QUICK_SIZES
    assert [row[0] for row in rows[1:]] == labels
    for name, *cells in rows[1:]:
        assert all(0.0 <= float(cell) <= 1.0 for cell in cells), name
    with open(out_dir / "graph_accuracy.md") as file:
        markdown = file.read()
    assert "| encoding | " + " | ".join(QUICK_SIZES) + " |" in markdown
    assert list(markdown_rows(markdown)) == labels
    assert printed.count(f"Trained {GRAPH_QUICK.steps} steps in") == len(
        GRAPH_ENCODINGS
    )
    for encoding in GRAPH_ENCODINGS:
        model = keras.models.load_model(
            out_dir / f"graph_{encoding}.keras", safe_mode=True
        )
        inputs, _ = graph.make_graphs(2, (5, 9), np.random.default_rng(0))
        logits = model.predict(inputs, verbose=0)
        assert logits.shape == (2, 9, graph.NUM_CLASSES)
        assert np.all(np.isfinite(logits))


@pytest.mark.parametrize("encoding", VISION_DEMO_ENCODINGS)
def test_quick_demo_vision_models_reload(quick_demo, encoding):
    _, out_dir, _ = quick_demo
    model = keras.models.load_model(out_dir / f"vit_{encoding}.keras", safe_mode=True)
    assert any(
        isinstance(layer, vision.PatchTokens) for layer in model.layers
    )
    rng = np.random.default_rng(0)
    for size in (8, 16):  # the trained grid, 2 x 2 patches, and 4 x 4
        images = rng.random((2, size, size, 1)).astype("float32")
        logits = model.predict(images, verbose=0)
        assert logits.shape == (2, vision.NUM_CLASSES)
        assert np.all(np.isfinite(logits))


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--quick"],
        ["--quick", "--steps", "5", "--seed", "3", "--seeds", "2", "--verbose"],
        [
            "--data", "python-source", "--lengths", "16", "32",
            "--train-length", "8", "--out", "elsewhere",
        ],
        ["--task", "graph", "language", "--quick"],
    ],
    ids=["default", "quick", "steps-seeds-verbose", "language-options", "graph"],
)
def test_the_second_process_gets_the_other_tasks_configs(options):
    # With the language task, the others run in a second process, from
    # arguments of their own: they make the configs this process would have.
    parser = cli._make_parser()
    args = parser.parse_args(["demo", *options])
    configs = cli._demo_configs(parser, args)
    assert list(configs)[0] == "language"
    others = list(configs)[1:]
    child_args = parser.parse_args(runner._side_argv(args, others))
    assert cli._demo_configs(parser, child_args) == {
        task: configs[task] for task in others
    }
    assert (child_args.out, child_args.verbose) == (args.out, args.verbose)


def test_full_trains_every_language_encoding_and_the_default_all_but_its_own():
    parser = cli._make_parser()

    def language_config(*options):
        args = parser.parse_args(["demo", "--task", "language", *options])
        return cli._demo_configs(parser, args)["language"]

    full = language_config("--full")
    assert language_config() == demo_config.DEFAULT
    assert full == demo_config.FULL
    assert full.encodings == demo_config.ENCODINGS
    assert full.data == ("markov", "python-source") and full.num_seeds == 3
    assert demo_config.DEFAULT.encodings == demo_config.DEMO_ENCODINGS
    assert "cope" in demo_config.FULL_ONLY
    assert "cope" not in demo_config.DEMO_ENCODINGS
    assert language_config("--full", "--encodings", "cope").encodings == ("cope",)
    assert language_config("--full", "--data", "markov").data == ("markov",)
    assert language_config("--full", "--seeds", "1").num_seeds == 1
    assert language_config("--gpu") == demo_config.GPU
    assert language_config("--gpu", "--full") == demo_config.GPU_FULL
    assert language_config("--quick", "--full").encodings == demo_config.ENCODINGS


def test_full_trains_every_vision_encoding_and_every_task_with_3_seeds():
    parser = cli._make_parser()

    def configs(*options):
        args = parser.parse_args(["demo", *options])
        return cli._demo_configs(parser, args)

    default, full = configs(), configs("--full")
    assert default["vision"] == demo_config.VISION_DEFAULT
    assert default["vision"].encodings == VISION_DEMO_ENCODINGS
    assert default["graph"] == demo_config.GRAPH_DEFAULT
    assert full["vision"].encodings == VISION_ENCODINGS
    assert full["graph"].encodings == GRAPH_ENCODINGS
    for task in ("language", "vision", "graph"):
        assert full[task].num_seeds == 3, task
        # Only the encodings and the seeds differ from the default run's
        # (and the language task's texts, lengths, batches and tokens).
        assert full[task].steps == default[task].steps, task
    assert full["vision"].grids == default["vision"].grids
    assert full["graph"].sizes == default["graph"].sizes
    quick = configs("--quick", "--full", "--task", "vision", "graph")
    assert quick["vision"].encodings == VISION_ENCODINGS
    assert quick["vision"].steps == demo_config.VISION_QUICK.steps
    assert quick["graph"] == demo_config.GRAPH_QUICK
    # The second process is given --full.
    args = parser.parse_args(["demo", "--full"])
    child = parser.parse_args(runner._side_argv(args, ["vision", "graph"]))
    assert cli._demo_configs(parser, child) == {
        "vision": full["vision"],
        "graph": full["graph"],
    }


def test_the_help_says_what_the_sizes_run(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    # argparse wraps the help to the terminal's width.
    text = " ".join(capsys.readouterr().out.split())
    assert "trained at 512 tokens and scored up to 16384" in text
    assert (
        "with 3 seeds; the language task on both texts, scored up to 2048 tokens"
        in text
    )
    assert f"within {demo_config.DEMO_MINUTES} minutes" in text
    assert "10 minutes" not in text


def test_the_tasks_run_in_their_order_each_once():
    parser = cli._make_parser()
    args = parser.parse_args(["demo", "--task", "graph", "vision", "graph"])
    assert list(cli._demo_configs(parser, args)) == ["vision", "graph"]
    args = parser.parse_args(["demo"])
    assert list(cli._demo_configs(parser, args)) == ["language", "vision", "graph"]


class _Children:
    """`subprocess.Popen` that remembers every process it starts."""

    def __init__(self):
        self.started = []
        self._popen = subprocess.Popen

    def __call__(self, *args, **kwargs):
        process = self._popen(*args, **kwargs)
        self.started.append(process)
        return process


@pytest.mark.parametrize("failure", ["status", "interrupt"])
def test_the_second_process_ends_with_the_language_task(
    tmp_path, capsys, monkeypatch, failure
):
    children = _Children()
    monkeypatch.setattr(runner.subprocess, "Popen", children)

    def failing_run(config, out_dir, before_timing=None):
        if failure == "interrupt":
            raise KeyboardInterrupt
        return 1

    monkeypatch.setattr(language, "run", failing_run)
    argv = ["demo", "--quick", "--out", str(tmp_path)]
    if failure == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            main(argv)
    else:
        assert main(argv) == 1
    (side,) = children.started
    # Killed, not left training: importing TensorFlow alone outlasts this.
    assert side.returncode == -9
    printed = capsys.readouterr().out
    assert "== The vision task ==" not in printed
    assert not (tmp_path / "accuracy.csv").exists()
    assert not (tmp_path / "graph_accuracy.csv").exists()


def test_the_second_process_starts_before_this_one_imports_its_backend(
    tmp_path, capsys, monkeypatch
):
    # Its import of TensorFlow overlaps this process's, not follows it; if
    # this process cannot import its backend, the second one ends too.
    children = _Children()
    monkeypatch.setattr(runner.subprocess, "Popen", children)
    started = []

    def failing_import(verbose):
        started.append(len(children.started))
        return "No module named 'tensorflow'"

    monkeypatch.setattr(cli, "_import_backend", failing_import)
    assert main(["demo", "--quick", "--out", str(tmp_path)]) == 1
    assert started == [1]
    (side,) = children.started
    assert side.args[1:7] == ["-m", "keras_posenc_lab", "demo", "--task", "vision", "graph"]
    assert "--quick" in side.args
    # Killed, not left training: importing TensorFlow alone outlasts this.
    assert side.returncode == -9
    captured = capsys.readouterr()
    assert captured.err.strip() == "keras-posenc: error: No module named 'tensorflow'"
    assert "== The language task ==" not in captured.out


@pytest.fixture(scope="module")
def chosen_language_demo(tmp_path_factory):
    """The language task of two chosen encodings trained one step, other options set.

    Returns:
        Its status, output folder and what it printed.
    """
    out_dir = tmp_path_factory.mktemp("chosen")
    argv = [
        "demo", "--task", "language", "--quick", "--encodings", "alibi",
        "learned", "--steps", "1", "--lengths", "16", "48", "--seed", "5",
        "--out", str(out_dir),
    ]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = main(argv)
    return status, out_dir, printed.getvalue()


def test_demo_trains_the_chosen_encodings(chosen_language_demo):
    status, tmp_path, printed = chosen_language_demo
    assert status == 0
    with open(tmp_path / "nll.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding", "16", "48", "train tokens/s"]
    assert [row[0] for row in rows[1:]] == ["alibi", "learned"]
    assert rows[2][2] == "n/a"
    assert "Training: 1 steps of" in printed and "(seed 5)" in printed
    assert "One seed (5)" in printed
    # One task: no task headings.
    assert "== The" not in printed and "tasks done in" not in printed
    assert sorted(path.name for path in tmp_path.glob("*.keras")) == [
        "lm_alibi.keras",
        "lm_learned.keras",
    ]
    assert not (tmp_path / "accuracy.csv").exists()


def test_a_one_step_training_is_timed_after_it(chosen_language_demo):
    # The speed is timed in rounds after training, so even one step of
    # training (one call, which traces the function) gets a speed.
    status, tmp_path, printed = chosen_language_demo
    assert status == 0
    with open(tmp_path / "nll.csv", newline="") as file:
        header, *rows = list(csv.reader(file))
    assert header[-1] == "train tokens/s"
    assert all(float(row[-1]) > 0 for row in rows)
    with open(tmp_path / "nll.md") as file:
        assert "nan" not in file.read()
    # `--quick` times one round.
    assert demo_config.QUICK.speed_rounds == 1
    assert "Timing training: 1 round of one call per model." in printed
    # The speeds are in the table; a quick run compares nothing in words.
    assert training.QUICK_NOTE in printed


def test_demo_on_the_standard_librarys_bytes_then_the_markov_source(tmp_path, capsys):
    argv = [
        "demo", "--task", "language", "--data", "python-source", "markov",
        "--quick", "--encodings", "alibi", "--steps", "2", "--out", str(tmp_path),
    ]
    assert main(argv) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "lm_alibi.keras",
        "lm_python_source_alibi.keras",
        "nll.csv",
        "nll.md",
        "nll.png",
        "nll_python_source.csv",
        "nll_python_source.md",
        "nll_python_source.png",
    ]
    with open(tmp_path / "nll_python_source.csv", newline="") as file:
        header, alibi = list(csv.reader(file))
    assert header == ["encoding"] + QUICK_LENGTHS + ["train tokens/s"]
    assert alibi[0] == "alibi"
    ceiling = math.log(256) + 2.0
    assert all(0.0 < float(cell) < ceiling for cell in alibi[1:-1])
    assert float(alibi[-1]) > 0
    with open(tmp_path / "nll_python_source.md") as file:
        markdown = file.read()
    assert "entropy rate" not in markdown.lower()
    printed = capsys.readouterr().out
    # Each text under its heading, in the order given.
    first = printed.index("== The language task on python-source ==")
    second = printed.index("== The language task on markov ==")
    assert first < second
    assert "Text: the " in printed[first:second]
    assert "as bytes (a vocabulary of 256)" in printed[first:second]
    assert "entropy rate" not in printed[first:second].lower()
    assert "nats per symbol" in printed[second:]
    model = keras.models.load_model(
        tmp_path / "lm_python_source_alibi.keras", safe_mode=True
    )
    logits = model.predict(np.array([[0, 255, 10]], "int32"), verbose=0)
    assert logits.shape == (1, 3, 256)


def test_vision_demo_over_two_seeds(tmp_path, capsys):
    argv = [
        "demo", "--quick", "--task", "vision", "--encodings", "none", "learned",
        "--seeds", "2", "--steps", "2", "--out", str(tmp_path),
    ]
    assert main(argv) == 0
    assert sorted(path.name for path in tmp_path.glob("*.keras")) == [
        "vit_learned_seed0.keras",
        "vit_learned_seed1.keras",
        "vit_none_seed0.keras",
        "vit_none_seed1.keras",
    ]
    with open(tmp_path / "accuracy.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding"] + [
        name for grid in QUICK_GRIDS for name in (grid, f"{grid} std")
    ]
    assert [row[0] for row in rows[1:]] == [
        "none", "learned, not resized", "learned + bicubic resize"
    ]
    for name, *cells in rows[1:]:
        values = [float(cell) for cell in cells]
        assert all(0.0 <= value <= 1.0 for value in values[::2]), name
        assert all(value >= 0.0 for value in values[1::2]), name
    with open(tmp_path / "accuracy.md") as file:
        markdown = file.read()
    assert "2 seeds (0, 1)" in markdown
    table = markdown_rows(markdown)
    assert len(table) == 3
    for cells in table.values():
        assert len(cells) == len(QUICK_GRIDS)
        assert all(" ± " in cell for cell in cells)
    printed = capsys.readouterr().out
    assert "[vision 1/4, seed 0] Training with none:" in printed
    assert "[vision 3/4, seed 1] Training with none:" in printed
    assert "[vision 4/4, seed 1] Training with " in printed
    assert not (tmp_path / "nll.csv").exists()


def test_demo_fails_when_a_reloaded_model_differs(
    tmp_path, capsys, monkeypatch
):
    load_model = keras.models.load_model

    def load_perturbed_model(*args, **kwargs):
        model = load_model(*args, **kwargs)
        kernel = model.layers[-1].kernel
        kernel.assign(kernel + 1e-3)
        return model

    monkeypatch.setattr(keras.models, "load_model", load_perturbed_model)
    argv = [
        "demo", "--task", "language", "--quick", "--encodings", "alibi",
        "--steps", "1", "--out", str(tmp_path),
    ]
    assert main(argv) == 1
    assert "predicts differently" in capsys.readouterr().err
    assert not (tmp_path / "nll.csv").exists()


def test_bench_on_pytorch_names_its_extra(monkeypatch, capsys):
    find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name: None if name == "x_transformers" else find_spec(name),
    )
    assert main(["bench", "--backend", "torch"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "keras-posenc: error: `keras-posenc bench --backend torch` needs "
    )
    assert "x-transformers" in line and "`bench-torch` extra" in line


def test_bench_on_another_backend_runs_in_a_process_of_its_own(monkeypatch, capsys):
    # Keras reads its backend once, at import: a fresh interpreter, told.
    calls = []

    def run(command, env, **kwargs):
        calls.append((command, env["KERAS_BACKEND"]))
        return cli.subprocess.CompletedProcess(command, 0, stdout="| table |\n")

    monkeypatch.setattr(cli, "_missing", lambda needs, unused=(): None)
    monkeypatch.setattr(cli.subprocess, "run", run)
    assert main(["bench", "--backend", "jax", "--tiny"]) == 0
    ((command, backend),) = calls
    assert backend == "jax"
    assert command[1:3] == ["-m", "keras_posenc_lab.bench.backends"]
    assert capsys.readouterr().out == "| table |\n"
