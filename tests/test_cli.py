import os

import keras
import numpy as np
import pytest

from keras_posenc import SinusoidalPositionEncoding
from keras_posenc.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOT_NAMES = ["encoding_heatmap.png", "similarity.png"]

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
    assert sorted(os.listdir(out_dir)) == PLOT_NAMES
    assert_pngs(out_dir)
    printed = capsys.readouterr().out.split()
    assert printed == [str(out_dir / name) for name in PLOT_NAMES]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plot", "--length", "0"], "argument --length: must be an integer"),
        (["plot", "--dim", "-3"], "argument --dim: must be an integer"),
        (["plot", "--dim", "wide"], "Received: 'wide'"),
        (["demo", "--epochs", "0"], "argument --epochs: must be an integer"),
        (["demo", "--samples", "0"], "argument --samples: must be an integer"),
        (["demo", "--seed", "-1"], "argument --seed: must be an integer"),
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


def test_demo_trains_saves_reloads_and_plots(tmp_path, capsys):
    out_dir = tmp_path / "demo"
    argv = ["demo", "--epochs", "1", "--samples", "64", "--out", str(out_dir)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "with SinusoidalPositionEncoding:" in printed
    assert "without a position encoding:" in printed
    assert "permutation-invariant" in printed
    assert "bit-identical" in printed
    assert sorted(os.listdir(out_dir)) == ["demo_model.keras"] + PLOT_NAMES
    assert_pngs(out_dir)
    reloaded = keras.models.load_model(
        out_dir / "demo_model.keras", safe_mode=True
    )
    assert any(
        isinstance(layer, SinusoidalPositionEncoding)
        for layer in reloaded.layers
    )
    token_ids = np.ones((3, 16), "int32")
    assert reloaded.predict(token_ids, verbose=0).shape == (3, 1)


def test_demo_fails_when_the_reloaded_model_differs(
    tmp_path, capsys, monkeypatch
):
    load_model = keras.models.load_model

    def load_perturbed_model(*args, **kwargs):
        model = load_model(*args, **kwargs)
        kernel = model.layers[-1].kernel
        kernel.assign(kernel + 1e-3)
        return model

    monkeypatch.setattr(keras.models, "load_model", load_perturbed_model)
    argv = ["demo", "--epochs", "1", "--samples", "64", "--out", str(tmp_path)]
    assert main(argv) == 1
    assert "predicts differently" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "similarity.png")
