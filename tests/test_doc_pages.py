"""The Python examples on the README and the docs pages run as written.

Each page's ```python blocks run in order in one namespace, in a fresh
folder, as a reader pasting them into one session would. A line
`print(...)  # expected` must print exactly what its comment says. A model
an example saves, it loads back and checks.
"""

import contextlib
import io
import pathlib
import re

import keras
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda path: str(path.relative_to(ROOT)),
)
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
CHECKED_PRINT = re.compile(r"^(\s*)print\((.*)\)\s+# (.+)$")
# A model saved by an example, `model.save("model.keras")` (not NumPy's
# `np.save`), and what loads it back and compares outputs.
SAVED = re.compile(r"(?<![\w.])(?!np\.)\w+\.save\(\s*([\"'])(.+?)\1")
COMPARED = re.compile(r"allclose|array_equal|assert ")

# The saving page shows `tf.lite.Interpreter` and says that TensorFlow warns
# it is deprecated in favour of the separate `ai_edge_litert` package.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*tf.lite.Interpreter is deprecated:UserWarning"
)


def python_blocks(page):
    return BLOCK.findall(page.read_text())


def with_checks(block):
    """Rewrites each commented print into a call that checks its output."""
    lines = []
    for line in block.splitlines():
        match = CHECKED_PRINT.match(line)
        if match:
            indent, arguments, expected = match.groups()
            line = f"{indent}_check_print({arguments}, expected={expected!r})"
        lines.append(line)
    return "\n".join(lines)


def _check_print(*values, expected):
    printed = " ".join(str(value) for value in values)
    assert printed == expected, f"printed {printed!r}, the page says {expected!r}"


def saved_without_loading_back(code):
    """Each file `code` saves a model to and does not load back and check.

    A file counts as loaded back where `load_model` reads it later in the
    page's code and, after that, outputs are compared (`np.allclose`,
    `np.array_equal` or an `assert`), as the examples print them.
    """
    missing = []
    for saved in SAVED.finditer(code):
        path = saved.group(2)
        after = code[saved.end() :]
        loaded = re.search(r"load_model\(\s*[\"']" + re.escape(path) + "[\"']", after)
        if loaded is None or not COMPARED.search(after[loaded.end() :]):
            missing.append(path)
    return missing


PAGES_WITH_CODE = [page for page in PAGES if python_blocks(page)]


def test_the_pages_with_examples_are_found():
    names = {str(page.relative_to(ROOT)) for page in PAGES_WITH_CODE}
    assert {"README.md", "docs/index.md", "docs/saving.md", "docs/tpu.md"} <= names


def test_checked_prints_are_rewritten():
    rewritten = with_checks('x = 1\n    print(f(x), "a")  # 2 a\nprint(x)\n')
    assert rewritten.splitlines() == [
        "x = 1",
        "    _check_print(f(x), \"a\", expected='2 a')",
        "print(x)",
    ]
    with pytest.raises(AssertionError, match="the page says '3'"):
        _check_print(1, 2, expected="3")


def test_a_save_without_loading_back_is_found():
    assert saved_without_loading_back('np.save("x.npy", x)\nmodel.save("a.keras")\n') == [
        "a.keras"
    ]
    loaded = 'vit.save("a.keras")\nr = keras.saving.load_model("a.keras")\n'
    assert saved_without_loading_back(loaded) == ["a.keras"]
    checked = loaded + "print(np.allclose(r(x), vit(x)))  # True\n"
    assert saved_without_loading_back(checked) == []


@pytest.mark.parametrize(
    "page", PAGES_WITH_CODE, ids=lambda page: str(page.relative_to(ROOT))
)
def test_every_saved_model_is_loaded_back_and_checked(page):
    code = "\n".join(python_blocks(page))
    assert saved_without_loading_back(code) == [], (
        "saved and never loaded back with keras.saving.load_model and its "
        "outputs compared"
    )


@pytest.mark.parametrize(
    "page", PAGES_WITH_CODE, ids=lambda page: str(page.relative_to(ROOT))
)
def test_page_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__main__", "_check_print": _check_print}
    try:
        for block in python_blocks(page):
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(with_checks(block), str(page), "exec"), namespace)
    finally:
        keras.mixed_precision.set_global_policy("float32")
        keras.backend.clear_session()
