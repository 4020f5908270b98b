import os
import pathlib
import re
import subprocess
import sys

import keras

import keras_posenc


def test_public_api():
    assert keras_posenc.__version__.count(".") == 2
    for name in keras_posenc.__all__:
        assert getattr(keras_posenc, name) is not None
    for name in (
        "AlibiBias",
        "GridRelativePositionBias",
        "PositionEmbedding",
        "PositionalMultiHeadAttention",
        "RelativePositionBias",
        "RelativePositionEmbedding",
        "RotaryEmbedding",
        "SinusoidalPositionEncoding",
        "TokenAndPositionEmbedding",
    ):
        registered = keras.saving.get_registered_object(f"keras_posenc>{name}")
        assert registered is getattr(keras_posenc, name)


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


def test_no_module_imports_keras_private_modules():
    # Keras' private names are read in one place, the attention layer's
    # module, through its public classes; nothing imports `keras.src`.
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
