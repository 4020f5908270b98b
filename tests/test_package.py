import ast
import os
import pathlib
import re
import subprocess
import sys

import keras
import pytest

import keras_posenc


ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = pathlib.Path(keras_posenc.__file__).parent
PUBLIC_LAYERS = [
    getattr(keras_posenc, name)
    for name in keras_posenc.layers.__all__
    if issubclass(getattr(keras_posenc, name), keras.layers.Layer)
]


def test_public_api():
    assert keras_posenc.__version__.count(".") == 2
    assert keras_posenc.__all__ == [*keras_posenc.layers.__all__, "ops", "rope_scaling"]
    for name in keras_posenc.__all__:
        assert getattr(keras_posenc, name) is not None


def test_every_public_layer_file_is_exported():
    # One public layer per file, the file named after the class; the one
    # export that is not a layer is the protocol's context, beside it.
    assert keras_posenc.AttentionContext.__module__ == (
        "keras_posenc.layers.attention_position"
    )
    # The file is the class name in snake case, an acronym one word
    # (TransformerXLPosition in transformer_xl_position.py).
    exported = {
        re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", layer.__name__).lower(): layer
        for layer in PUBLIC_LAYERS
    }
    for path in (PACKAGE / "layers").glob("*.py"):
        if path.name.startswith("_"):
            continue
        assert path.stem in exported, path.name
        assert exported[path.stem].__module__ == f"keras_posenc.layers.{path.stem}"
    assert len(exported) == len(
        [path for path in (PACKAGE / "layers").glob("*.py") if not path.name.startswith("_")]
    )
    assert set(keras_posenc.layers.__all__) == {
        layer.__name__ for layer in PUBLIC_LAYERS
    } | {"AttentionContext"}


@pytest.mark.parametrize("layer", PUBLIC_LAYERS, ids=lambda layer: layer.__name__)
def test_every_public_layer_is_registered_documented_and_has_an_example(layer):
    registered = keras.saving.get_registered_object(f"keras_posenc>{layer.__name__}")
    assert registered is layer
    # Its API page entry, and a `>>>` example that the docs tests run.
    assert f"::: keras_posenc.{layer.__name__}\n" in (ROOT / "docs" / "api.md").read_text()
    assert ">>> " in layer.__doc__


def test_other_backends_are_refused_with_advice():
    environment = dict(os.environ, KERAS_BACKEND="numpy")
    result = subprocess.run(
        [sys.executable, "-c", "import keras_posenc"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert "KERAS_BACKEND" in result.stderr
    assert "tensorflow, jax, torch" in result.stderr


SOURCE = "git+https://github.com/keras-posenc/keras-posenc"
TORCH_CPU = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def _import_with_libraries(backend, present):
    """`import keras_posenc`'s last line of error under `KERAS_BACKEND=backend`.

    Of the three backends' libraries, those in `present` look installed (a
    module with a spec, which `importlib.util.find_spec` finds, in
    `sys.modules`) and the others not (`None` there makes their import fail
    as if they were not installed), whichever this venv holds.
    """
    setup = "; ".join(
        f"sys.modules[{name!r}] = "
        + (
            f"types.ModuleType({name!r}); sys.modules[{name!r}].__spec__ = "
            f"importlib.machinery.ModuleSpec({name!r}, None)"
            if name in present
            else "None"
        )
        for name in ("tensorflow", "jax", "torch")
    )
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import importlib.machinery, sys, types; {setup}; import keras_posenc",
        ],
        env=dict(os.environ, KERAS_BACKEND=backend),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    return result.stderr.strip().splitlines()[-1]


def _chose(backend):
    return (
        f"ImportError: Keras chose the {backend!r} backend (KERAS_BACKEND, else "
        f"~/.keras/keras.json, else tensorflow), whose library {backend} is not "
        "installed."
    )


def _install(backend):
    line = f'install {backend} with: pip install "keras-posenc[{backend}] @ {SOURCE}"'
    if backend == "torch":
        line += f" (PyTorch's CPU build first: {TORCH_CPU})"
    return line


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_a_missing_backend_library_gives_readmes_install_line(backend):
    assert _import_with_libraries(backend, present=()) == (
        f"{_chose(backend)} To use it, {_install(backend)}"
    )


@pytest.mark.parametrize(
    "backend, present",
    [("tensorflow", ("torch",)), ("jax", ("tensorflow",)), ("torch", ("tensorflow", "jax"))],
)
def test_a_missing_backend_library_names_the_backend_installed(backend, present):
    # As a user with PyTorch alone and KERAS_BACKEND unset meets it.
    settings = " or ".join(f"KERAS_BACKEND={name}" for name in present)
    verb = "is" if len(present) == 1 else "are"
    assert _import_with_libraries(backend, present) == (
        f"{_chose(backend)} {' and '.join(present)} {verb} installed: set "
        f"{settings} before importing keras to use it, or {_install(backend)}"
    )


def test_the_install_lines_are_readmes():
    # README installs from the repository: no release is on PyPI yet.
    readme = (ROOT / "README.md").read_text()
    for backend in ("tensorflow", "jax", "torch"):
        assert f'pip install "keras-posenc[{backend}] @ {SOURCE}"' in readme
    assert TORCH_CPU in readme


def test_no_module_imports_keras_private_modules():
    # Keras' private names are read in one place, the attention layer's
    # `layers/_keras_attention.py`, through its public classes; nothing
    # imports `keras.src`.
    package = pathlib.Path(keras_posenc.__file__).parent
    for path in package.rglob("*.py"):
        assert "keras.src" not in path.read_text(), path


def test_the_library_asks_the_backend_in_one_module():
    # The layers, the ops and the schedules compute with keras.ops; only
    # ops/_backend.py imports a backend's own library.
    package = pathlib.Path(keras_posenc.__file__).parent
    library = [
        *(package / "layers").glob("*.py"),
        *(package / "ops").glob("*.py"),
        package / "rope_scaling.py",
        package / "hf_config.py",
        package / "__init__.py",
    ]
    for path in library:
        if path.name == "_backend.py":
            continue
        source = path.read_text()
        for library_name in ("tensorflow", "jax", "torch"):
            assert not re.search(
                rf"^\s*(import|from) {library_name}\b", source, re.MULTILINE
            ), (path, library_name)


def test_nothing_builds_a_layer_through_keras_registry():
    # Layers are built where their class is imported, so that every
    # dependency on them is an import.
    for path in PACKAGE.rglob("*.py"):
        assert "get_registered_object" not in path.read_text(), path


def imported_modules(tree):
    """The modules that the `import` statements of `tree` name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_hf_config_reads_configs_below_the_layers():
    # hf_config turns configs into arguments and imports no layer; its two
    # deprecated names alone reach hf_attention, above, inside the call.
    tree = ast.parse((PACKAGE / "hf_config.py").read_text())
    module_level = [
        node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
    ]
    for name in imported_modules(ast.Module(body=module_level, type_ignores=[])):
        assert not name.startswith(("keras_posenc.layers", "keras_posenc.hf_attention")), name
        assert name.split(".")[0] != "keras", name
    for name in imported_modules(tree):
        assert not name.startswith("keras_posenc.layers"), name


def test_the_library_never_imports_the_lab():
    # The lab (the command, the demo, the benchmarks) sits on top.
    for path in PACKAGE.rglob("*.py"):
        assert "keras_posenc_lab" not in path.read_text(), path
