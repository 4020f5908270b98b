"""The committed notebooks: the four of them, saved without outputs.

pytest runs each notebook itself through nbmake (`--nbmake` in setup.cfg);
these tests check how they are stored.
"""

import json
import pathlib

import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = (
    "01_derivation.ipynb",
    "02_models.ipynb",
    "03_tpu_training.ipynb",
    "04_extrapolation.ipynb",
)


def test_the_four_notebooks_exist():
    names = {path.name for path in NOTEBOOKS.glob("*.ipynb")}
    assert set(EXPECTED) <= names


@pytest.mark.parametrize(
    "path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda path: path.name
)
def test_notebook_is_saved_without_outputs(path):
    notebook = json.loads(path.read_text())
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {number} has outputs"
            assert cell["execution_count"] is None, f"cell {number} was run"
