"""What a user installs: the wheel holds the package alone, the sdist the tests too.

Both are built here, without build isolation, by the setuptools of the test
extra (in the range pyproject.toml's build-system asks for).
"""

import email
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest

import keras_posenc

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Folders of the source tree that the tests read, and the files beside them.
SDIST_FOLDERS = ("tests", "notebooks", "docs", "benchmarks")
SDIST_FILES = (
    "LICENSE",
    "MANIFEST.in",
    "Makefile",
    "README.md",
    "mkdocs.yml",
    "pyproject.toml",
    "setup.cfg",
)
# Made by tools, never sources: not in the sdist.
GENERATED = ("__pycache__", ".ipynb_checkpoints", ".pytest_cache")


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist


def _wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = email.message_from_bytes(
            archive.read(f"keras_posenc-{keras_posenc.__version__}.dist-info/METADATA")
        )
        license_text = archive.read(
            f"keras_posenc-{keras_posenc.__version__}.dist-info/licenses/LICENSE"
        )
    return names, metadata, license_text


def test_the_wheel_holds_the_library_and_the_lab_alone(dist):
    names, _, license_text = _wheel_metadata(dist[0])
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {
        "keras_posenc_lab",
        "keras_posenc",
        f"keras_posenc-{keras_posenc.__version__}.dist-info",
    }
    for module in ("layers/__init__.py", "ops/__init__.py", "plot.py"):
        assert f"keras_posenc/{module}" in names
    for module in ("__main__.py", "cli.py", "encodings.py", "bench/suite.py"):
        assert f"keras_posenc_lab/{module}" in names
    assert license_text == (ROOT / "LICENSE").read_bytes()


def test_the_wheel_metadata(dist):
    _, metadata, _ = _wheel_metadata(dist[0])
    assert metadata["License-Expression"] == "Apache-2.0"
    urls = dict(
        value.split(", ", 1) for value in metadata.get_all("Project-URL")
    )
    assert set(urls) == {"Documentation", "Source", "Issues"}
    classifiers = metadata.get_all("Classifier")
    # The Python versions CI runs, and no other: 3.11 (`make test`, the
    # floors, PyTorch) and 3.12 (JAX's newest and Colab's runtime).
    pythons = sorted(
        classifier.rsplit(" ", 1)[1]
        for classifier in classifiers
        if classifier.startswith("Programming Language :: Python :: 3.")
    )
    assert pythons == ["3.11", "3.12"]
    assert metadata["Requires-Python"] == "<3.13,>=3.11"
    assert set(metadata.get_all("Provides-Extra")) >= {
        "tensorflow",
        "jax",
        "torch",
        "plot",
        "demo",
        "bench",
    }
    requirements = metadata.get_all("Requires-Dist")
    # The layers need Keras alone; each backend's library is an extra.
    base = {
        requirement.split("<")[0].split(">")[0]
        for requirement in requirements
        if "extra ==" not in requirement
    }
    assert base == {"keras", "numpy"}
    for backend in ("tensorflow", "jax", "torch"):
        assert any(
            requirement.startswith(backend)
            and requirement.endswith(f'extra == "{backend}"')
            for requirement in requirements
        ), backend
    bench = [
        requirement
        for requirement in requirements
        if requirement.endswith('extra == "bench"')
    ]
    assert any(requirement.startswith("keras-hub") for requirement in bench)


def test_the_sdist_holds_the_whole_test_suite(dist):
    with tarfile.open(dist[1]) as archive:
        prefix = f"keras_posenc-{keras_posenc.__version__}/"
        members = {
            member.name[len(prefix):] for member in archive.getmembers() if member.isfile()
        }
    expected = set(SDIST_FILES)
    for folder in SDIST_FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            relative = path.relative_to(ROOT)
            if path.is_file() and not set(relative.parts) & set(GENERATED):
                expected.add(relative.as_posix())
    # docs/figures/ is drawn by the docs build, not written by hand.
    expected = {name for name in expected if not name.startswith("docs/figures/")}
    assert {"tests/__init__.py", "tests/conftest.py", "tests/references.py"} <= members
    assert expected - members == set()
    assert not any(name.startswith("docs/figures/") for name in members)
