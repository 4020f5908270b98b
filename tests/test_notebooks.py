"""The committed notebooks, as a reader finds them on GitHub or in Colab.

pytest runs each notebook itself through nbmake (`--nbmake` in setup.cfg);
these tests check how they are stored: without outputs; a first markdown
cell that links to the notebook in Colab and to a documentation page; a
first code cell that installs keras-posenc, with the extras the notebook
imports, only where it is missing, so that CI never installs anything; the
TPU notebook's installs the package alone, onto what Colab's TPU runtime
has.
"""

import ast
import configparser
import importlib.util
import json
import pathlib
import re

import pytest
from IPython.core.inputtransformer2 import TransformerManager

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
EXPECTED = (
    "01_derivation.ipynb",
    "02_models.ipynb",
    "03_tpu_training.ipynb",
    "04_extrapolation.ipynb",
    "05_vision.ipynb",
    "06_graphs.ipynb",
)
PATHS = sorted(NOTEBOOKS.glob("*.ipynb"))
COLAB = "https://colab.research.google.com/github/keras-posenc/keras-posenc/blob/main/notebooks/"
SITE = "https://keras-posenc.github.io/keras-posenc/"
REPOSITORY = "git+https://github.com/keras-posenc/keras-posenc"
# The extra that a notebook importing a module (or a submodule of it)
# installs, and the modules each extra brings, which the install guards on:
# it installs when any of them is missing. `keras_posenc_lab.config` is
# plain Python and needs no extra.
EXTRA_OF_IMPORT = {
    "matplotlib": "plot",
    "keras_posenc.plot": "plot",
    "keras_posenc_lab.language": "demo",
    "keras_posenc_lab.vision": "demo",
    "keras_posenc_lab.graph": "demo",
    "keras_posenc_lab.bench": "bench",
}
MODULE_OF_EXTRA = {
    "plot": ("matplotlib",),
    "demo": ("matplotlib", "sklearn"),
    "bench": ("keras_hub",),
}
GUARDED_MODULES = {module for modules in MODULE_OF_EXTRA.values() for module in modules}
FIND_SPEC = importlib.util.find_spec
# The notebooks for Colab's TPU runtime, which has JAX, Keras and NumPy and
# no TensorFlow: their first cell adds keras-posenc alone (`--no-deps`, no
# extra), from KERAS_POSENC_SPEC where it is set. `make test-colab` runs
# them so, in a venv of JAX and Keras alone, installing the checkout.
ON_COLAB_TPU = ("03_tpu_training.ipynb",)

notebook_paths = pytest.mark.parametrize("path", PATHS, ids=lambda path: path.name)


def load(path):
    return json.loads(path.read_text())


def cells(notebook, cell_type):
    return [cell for cell in notebook["cells"] if cell["cell_type"] == cell_type]


def python(cell):
    """The cell's source as IPython runs it: magics become calls."""
    return TransformerManager().transform_cell("".join(cell["source"]))


def imported_modules(code_cells):
    """Every module the cells import; `from a import b` counts `a` and `a.b`."""
    modules = set()
    for cell in code_cells:
        for node in ast.walk(ast.parse(python(cell))):
            if isinstance(node, ast.Import):
                modules.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                modules.add(node.module)
                modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def extras_needed(notebook):
    """The extras of what the notebook imports after its install cell, sorted."""
    modules = imported_modules(cells(notebook, "code")[1:])
    return sorted(
        {
            extra
            for module in modules
            for name, extra in EXTRA_OF_IMPORT.items()
            if module == name or module.startswith(f"{name}.")
        }
    )


class RecordingShell:
    """Stands for `get_ipython()`: records the line magics a cell runs.

    As IPython does, it expands each `{name}` of a line from the cell's
    variables.
    """

    def __init__(self, namespace):
        self.namespace = namespace
        self.line_magics = []

    def run_line_magic(self, name, line):
        self.line_magics.append((name, line.format_map(self.namespace)))


def run_install_cell(cell, missing, monkeypatch):
    """Runs `cell` where the modules in `missing` are not installed.

    Returns:
        The `(name, line)` of each line magic the cell ran.
    """

    def find_spec_without_missing(name, *args, **kwargs):
        return None if name in missing else FIND_SPEC(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec_without_missing)
    namespace = {}
    shell = RecordingShell(namespace)
    namespace["get_ipython"] = lambda: shell
    exec(python(cell), namespace)
    return shell.line_magics


def test_the_six_notebooks_exist():
    names = {path.name for path in PATHS}
    assert set(EXPECTED) <= names


@notebook_paths
def test_notebook_is_saved_without_outputs(path):
    notebook = load(path)
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    for number, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {number} has outputs"
            assert cell["execution_count"] is None, f"cell {number} was run"


@notebook_paths
def test_first_cell_links_to_colab_and_to_a_page_of_the_site(path):
    first = load(path)["cells"][0]
    assert first["cell_type"] == "markdown"
    text = "".join(first["source"])
    assert f"]({COLAB}{path.name})" in text
    pages = re.findall(rf"\]\({re.escape(SITE)}([\w/]+)\.html\)", text)
    assert pages, f"no link to a page of {SITE}"
    for page in pages:
        assert (ROOT / "docs" / f"{page}.md").is_file(), f"no docs/{page}.md"


@pytest.mark.parametrize(
    "path",
    [path for path in PATHS if path.name not in ON_COLAB_TPU],
    ids=lambda path: path.name,
)
def test_first_code_cell_installs_only_what_is_missing(path, monkeypatch):
    notebook = load(path)
    install = cells(notebook, "code")[0]
    extras = extras_needed(notebook)
    requirement = f"keras-posenc[{','.join(extras)}]" if extras else "keras-posenc"
    pip = ("pip", f'install --quiet "{requirement} @ {REPOSITORY}"')
    needed = {"keras_posenc"}.union(*(MODULE_OF_EXTRA[extra] for extra in extras))

    # Where everything is installed, as in CI: nothing runs.
    assert run_install_cell(install, set(), monkeypatch) == []
    # Where any one module the notebook needs is missing: one install.
    for module in sorted(needed):
        assert run_install_cell(install, {module}, monkeypatch) == [pip], module
    # Where only what another extra brings is missing: nothing.
    for module in sorted(GUARDED_MODULES - needed):
        assert run_install_cell(install, {module}, monkeypatch) == [], module


@pytest.mark.parametrize("name", ON_COLAB_TPU)
def test_the_tpu_notebook_installs_the_package_alone(name, monkeypatch):
    install = cells(load(NOTEBOOKS / name), "code")[0]
    monkeypatch.delenv("KERAS_POSENC_SPEC", raising=False)

    # Where it is installed, as in CI's other runs: nothing runs, whatever
    # else is missing.
    for missing in [set(), *({module} for module in sorted(GUARDED_MODULES))]:
        assert run_install_cell(install, missing, monkeypatch) == [], missing
    # Where it is missing, as on Colab: the package from GitHub, alone.
    pip = ("pip", f"install --quiet --no-deps {REPOSITORY}")
    assert run_install_cell(install, {"keras_posenc"}, monkeypatch) == [pip]
    # CI's stand-in for Colab names its checkout.
    monkeypatch.setenv("KERAS_POSENC_SPEC", "/checkout")
    pip = ("pip", "install --quiet --no-deps /checkout")
    assert run_install_cell(install, {"keras_posenc"}, monkeypatch) == [pip]


def setup_cfg():
    setup = configparser.ConfigParser(interpolation=None)
    setup.read(ROOT / "setup.cfg")
    return setup


@pytest.mark.parametrize("name", ON_COLAB_TPU)
def test_the_tpu_notebook_names_no_extra_that_pulls_tensorflow(name, monkeypatch):
    extras = setup_cfg()["options.extras_require"]
    pulling = {
        extra
        for extra, requirements in extras.items()
        if re.search(r"^\s*tensorflow\b", requirements, re.MULTILINE)
    }
    # The backend's extra alone: the demo's and the benchmarks' run on any.
    assert pulling == {"tensorflow"}
    install = cells(load(NOTEBOOKS / name), "code")[0]
    source = "".join(install["source"])
    named = {
        extra.strip()
        for group in re.findall(r"keras-posenc\[([^\]]*)\]", source)
        for extra in group.split(",")
    }
    assert not named & pulling, named & pulling


def test_the_extras_the_notebooks_need_are_declared_in_setup_cfg():
    declared = set(setup_cfg()["options.extras_require"])
    # The TPU notebook takes the lab's data and none of its tasks: it needs
    # no extra, whatever its imports map to.
    needed = {
        extra
        for path in PATHS
        if path.name not in ON_COLAB_TPU
        for extra in extras_needed(load(path))
    }
    assert needed == {"plot", "demo"}  # 01 and 06 plot; 04 to 06 run the demo's code
    assert needed <= declared
    assert set(MODULE_OF_EXTRA) <= declared


def test_extras_needed_reads_every_form_of_import():
    notebook = {
        "cells": [
            {"cell_type": "code", "source": ["%pip install keras-posenc"]},
            {"cell_type": "markdown", "source": ["import matplotlib"]},
            {
                "cell_type": "code",
                "source": [
                    "%matplotlib inline\n",
                    "import keras_posenc_lab.bench.suite\n",
                    "from keras_posenc_lab import language\n",
                ],
            },
        ]
    }
    assert extras_needed(notebook) == ["bench", "demo"]
    notebook["cells"][2]["source"].append("from matplotlib.figure import Figure\n")
    assert extras_needed(notebook) == ["bench", "demo", "plot"]


def test_extras_needed_maps_each_demo_module():
    def needs(source):
        return extras_needed(
            {
                "cells": [
                    {"cell_type": "code", "source": ["%pip install keras-posenc"]},
                    {"cell_type": "code", "source": [source]},
                ]
            }
        )

    # The configurations are plain Python; the tasks need the demo extra.
    assert needs("from keras_posenc_lab import config as demo_config") == []
    assert needs("from keras_posenc_lab import config, vision as demo_vision") == ["demo"]
    assert needs("import keras_posenc_lab.vision") == ["demo"]
    assert needs("from keras_posenc_lab import graph") == ["demo"]
    assert needs("from keras_posenc_lab.language import run") == ["demo"]
