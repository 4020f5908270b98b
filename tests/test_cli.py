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
from keras_posenc import cli
from keras_posenc import demo
from keras_posenc.cli import main

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
    [[COMMAND], [sys.executable, "-m", "keras_posenc"]],
    ids=["keras-posenc", "python -m keras_posenc"],
)
@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_import_neither_keras_nor_tensorflow(command, option):
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
    assert "keras_posenc" in imported
    assert not imported & {"keras", "tensorflow", "numpy", "matplotlib"}
    if option == "--help":
        assert result.stdout.startswith("usage: keras-posenc")
    else:
        assert result.stdout == f"keras-posenc {keras_posenc.__version__}\n"


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


def test_the_command_imports_the_layers_on_first_use():
    # As `keras-posenc` does: the package imports without Keras, and the
    # layers come (and register with Keras) when first used.
    script = (
        "import sys; sys.argv[0] = '/bin/keras-posenc'; "
        "import keras_posenc; "
        "assert 'keras' not in sys.modules; "
        "layer = keras_posenc.RotaryEmbedding; "
        "from keras_posenc import AlibiBias, ops; "
        "import keras; "
        "assert keras.saving.get_registered_object("
        "'keras_posenc>RotaryEmbedding') is layer; "
        "print(layer.__name__, AlibiBias.__name__, ops.__name__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "RotaryEmbedding", "AlibiBias", "keras_posenc.ops"
    ]


@pytest.mark.parametrize(
    "command, module, requirement",
    [
        ("plot", "matplotlib", '"matplotlib<4,>=3.8"'),
        ("demo", "matplotlib", '"matplotlib<4,>=3.8"'),
        ("bench", "keras_hub", '"keras-hub<0.33,>=0.21"'),
    ],
)
def test_a_missing_extra_is_named_in_one_line(
    command, module, requirement, monkeypatch, capsys
):
    find_spec = cli.importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name: None if name == module else find_spec(name),
    )
    assert main([command]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"keras-posenc: error: `keras-posenc {command}` needs")
    assert f"the `{command}` extra" in line
    assert line.endswith(f"pip install {requirement}")


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
        (["demo", "--encodings", "xpos"], "argument --encodings: invalid choice: 'xpos'"),
        (["demo", "--encodings"], "argument --encodings: expected at least one"),
        (["demo", "--lengths", "32"], "`lengths` must each be at least the training length 64"),
        (["demo", "--quick", "--train-length", "40"], "Received: lengths=[16, 32, 64]"),
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


QUICK_LENGTHS = [str(length) for length in demo.QUICK.lengths]


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """The quick demo's output folder and what it printed."""
    out_dir = tmp_path_factory.mktemp("demo")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        status = main(["demo", "--quick", "--out", str(out_dir)])
    return status, out_dir, printed.getvalue()


def test_quick_demo_writes_a_table_of_every_encoding(quick_demo):
    status, out_dir, printed = quick_demo
    assert status == 0
    names = list(demo.ENCODINGS) + [
        f"rope + {schedule}" for schedule in demo.ROPE_SCALINGS
    ]
    with open(out_dir / "nll.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding"] + QUICK_LENGTHS
    assert sorted(row[0] for row in rows[1:]) == sorted(names)
    ceiling = math.log(demo.VOCABULARY_SIZE) + 2.0
    for name, *cells in rows[1:]:
        for length, cell in zip(demo.QUICK.lengths, cells):
            if name == "learned" and length > demo.QUICK.train_length:
                assert cell == "n/a"
            else:
                assert 0.0 < float(cell) < ceiling, (name, length, cell)
    with open(out_dir / "nll.md") as file:
        markdown = file.read()
    title = (
        "Mean negative log-likelihood per token (nats), trained at length "
        f"{demo.QUICK.train_length}"
    )
    assert markdown.startswith(f"{title}; entropy rate ")
    assert f"{title}:" in printed
    assert "| encoding | " + " | ".join(QUICK_LENGTHS) + " |" in markdown
    assert "| learned | " in markdown and "n/a" in markdown
    assert "entropy rate" in printed and "nats per symbol" in printed
    assert "Entropy rate of the source (the floor)" in printed
    assert "predictions identical" in printed
    # Not a terminal: one line per model and length, no progress bars.
    assert "\x1b" not in printed and "\r" not in printed
    assert max(len(line) for line in printed.splitlines()) < 300
    assert printed.count(f"Trained {demo.QUICK.steps} steps in") == len(
        demo.ENCODINGS
    )
    assert f"NLL per token at length {demo.QUICK.lengths[-1]}:" in printed
    with open(out_dir / "nll.png", "rb") as file:
        assert file.read(8) == PNG_SIGNATURE


@pytest.mark.parametrize("encoding", demo.ENCODINGS)
def test_quick_demo_models_reload(quick_demo, encoding):
    _, out_dir, _ = quick_demo
    model = keras.models.load_model(
        out_dir / f"lm_{encoding}.keras", safe_mode=True
    )
    token_ids = np.zeros((2, demo.QUICK.train_length), "int32")
    logits = model.predict(token_ids, verbose=0)
    assert logits.shape == (2, demo.QUICK.train_length, demo.VOCABULARY_SIZE)
    assert np.all(np.isfinite(logits))


def test_demo_trains_the_chosen_encodings(tmp_path, capsys):
    argv = [
        "demo", "--quick", "--encodings", "alibi", "learned", "--steps", "3",
        "--lengths", "16", "48", "--seed", "5", "--out", str(tmp_path),
    ]
    assert main(argv) == 0
    with open(tmp_path / "nll.csv", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0] == ["encoding", "16", "48"]
    assert [row[0] for row in rows[1:]] == ["alibi", "learned"]
    assert rows[2][2] == "n/a"
    printed = capsys.readouterr().out
    assert "3 steps" in printed and "(seed 5)" in printed
    assert sorted(path.name for path in tmp_path.glob("*.keras")) == [
        "lm_alibi.keras",
        "lm_learned.keras",
    ]


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
        "demo", "--quick", "--encodings", "alibi", "--steps", "1",
        "--out", str(tmp_path),
    ]
    assert main(argv) == 1
    assert "predicts differently" in capsys.readouterr().err
    assert not (tmp_path / "nll.csv").exists()
