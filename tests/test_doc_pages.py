"""The Python examples on the README and the docs pages run as written.

Each ```python block runs alone, in a namespace of its own, in a fresh
folder, as a reader who copies that one block into a new file would run
it. A block that reads what the one before it wrote (a SavedModel served
by another process) says so on its first line, `# In the folder of the
block above`: the block above runs first, in its own namespace, in the
same folder. A line `print(...)  # expected` must print exactly what its
comment says. A model an example saves, it loads back and checks.
"""

import contextlib
import io
import itertools
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
    saved = 'np.save("x.npy", x)\nmodel.save("a.keras")\n'
    assert saved_without_loading_back(saved) == ["a.keras"]
    loaded = 'vit.save("a.keras")\nr = keras.saving.load_model("a.keras")\n'
    assert saved_without_loading_back(loaded) == ["a.keras"]
    checked = loaded + "print(np.allclose(r(x), vit(x)))  # True\n"
    assert saved_without_loading_back(checked) == []


# The first line of a block that reads the files of the block above it.
AFTER_THE_BLOCK_ABOVE = "# In the folder of the block above"

# Each block alone: `(page, index of the block on the page)`.
BLOCKS = [
    (page, index)
    for page in PAGES_WITH_CODE
    for index in range(len(python_blocks(page)))
]


def block_id(block):
    page, index = block
    return f"{page.relative_to(ROOT)}:{index}"


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_every_saved_model_is_loaded_back_and_checked(block):
    page, index = block
    code = python_blocks(page)[index]
    assert saved_without_loading_back(code) == [], (
        "saved and never loaded back with keras.saving.load_model and its "
        "outputs compared in the same block"
    )


# The blocks that are TensorFlow's by nature: they import TensorFlow (a
# SavedModel served, TFLite) or export a SavedModel, and their page says so.
# Every other block runs on every backend.
TENSORFLOW_BLOCK = re.compile(r"^import tensorflow\b|\.export\(", re.MULTILINE)


def test_only_the_serving_examples_are_tensorflows():
    tensorflows = [
        (str(page.relative_to(ROOT)), index)
        for page in PAGES_WITH_CODE
        for index, block in enumerate(python_blocks(page))
        if TENSORFLOW_BLOCK.search(block)
    ]
    # Saving's export, its plain TensorFlow process, and TFLite.
    assert tensorflows == [("docs/saving.md", 2), ("docs/saving.md", 3), ("docs/saving.md", 4)]


# The blocks this backend runs: all on TensorFlow, all but TensorFlow's
# own elsewhere.
RUNNABLE_BLOCKS = [
    (page, index)
    for page, index in BLOCKS
    if keras.backend.backend() == "tensorflow"
    or not TENSORFLOW_BLOCK.search(python_blocks(page)[index])
]


@pytest.mark.parametrize("block", RUNNABLE_BLOCKS, ids=block_id)
def test_each_example_runs_alone(block, tmp_path, monkeypatch):
    # Its own namespace and folder, and Keras' global state as a new
    # process has it: nothing that another block made.
    page, index = block
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(page)
    first = index
    while blocks[first].startswith(AFTER_THE_BLOCK_ABOVE):
        first -= 1
    for number in range(first, index + 1):
        namespace = {"__name__": "__main__", "_check_print": _check_print}
        keras.backend.clear_session()
        code = with_checks(blocks[number])
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(code, f"{page.relative_to(ROOT)}:{number}", "exec"), namespace)
        finally:
            keras.mixed_precision.set_global_policy("float32")
            keras.backend.clear_session()


def test_a_block_reads_another_blocks_files_only_where_it_says_so():
    # The one such block: the SavedModel served by plain TensorFlow.
    following = [
        (str(page.relative_to(ROOT)), index)
        for page, index in BLOCKS
        if python_blocks(page)[index].startswith(AFTER_THE_BLOCK_ABOVE)
    ]
    assert following == [("docs/saving.md", 3)]


# One number per fact. The Results page's tables are the source of the
# demo's results and of the benchmarks (docs/hooks.py draws the figures
# from them too). A page that repeats a table repeats its rows as they are;
# README's shorter tables and a number in a sentence are checked against
# their source below.


def markdown_tables(text):
    """`{header line: {first cell: [cells]}}` of every table in `text`.

    A header that repeats an earlier one's is keyed with ` #2`, ` #3`, ...
    after it: the Results page gives both texts' tables with one header.
    """
    tables, lines = {}, text.splitlines()
    for index, line in enumerate(lines[:-1]):
        if line.startswith("| ") and lines[index + 1].startswith("|---"):
            rows = {}
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                name, *cells = [cell.strip() for cell in row.strip("|").split("|")]
                rows[name] = cells
            key, count = line, 1
            while key in tables:
                count += 1
                key = f"{line} #{count}"
            tables[key] = rows
    return tables


README_TABLES = markdown_tables((ROOT / "README.md").read_text())
RESULTS_TABLES = markdown_tables((ROOT / "docs" / "results.md").read_text())


def numbers(cell):
    """The decimal numbers of a cell, in order: `0.932 ± 0.011` gives two."""
    return [float(number) for number in re.findall(r"-?\d+\.\d+", cell)]


def table(tables, header):
    """The rows of the one table whose header is `header` or starts with it."""
    if header in tables:
        return tables[header]
    (rows,) = [rows for line, rows in tables.items() if line.startswith(header)]
    return rows


def source(header, row, column, index=0):
    """The number the Results page's table prints there, as written."""
    return re.findall(r"-?\d+\.\d+", table(RESULTS_TABLES, header)[row][column])[index]


# The language task's NLL per length on both texts (one header, so the
# second is keyed ` #2`), its training speeds, and where each holds.
MARKOV = "| encoding | 64 | 128 | 256 | 512 | 1024 | 2048 |"
PYTHON_SOURCE = f"{MARKOV} #2"
LANGUAGE_SPEED = "| encoding | train tokens/s |"
HOLDS = "| encoding | Markov, 8x |"
VISION = "| encoding | 8x8"
GRAPHS = "| encoding | 8–16 nodes"
SPEED = "| layer | against | time | target |"
ATTENTION = "RoPE, ALiBi, T5, Shaw, Transformer-XL, DeBERTa attention"
MEMORY = "the same, peak memory at length 2048"
LONG_CONTEXT = "KERPLE, FIRE attention; xPos, CoPE under the causal mask"
LONG_CONTEXT_MEMORY = "KERPLE, FIRE; xPos, CoPE: peak memory at length 2048"
JAX = "RoPE, ALiBi, T5, Shaw on JAX 0.10.2 (time; memory at 2048)"
DECODING = (
    "RoPE, ALiBi, T5, Shaw: a token decoded with a key/value cache, after a "
    "512-token prompt"
)
GRID_SPEED = table(RESULTS_TABLES, "| layer | median (ms) | against | ratio")


def held(name, text, multiple):
    """The holds table's rise of `name` on `text` at `multiple`, as written."""
    column = {"8x": 0, "16x": 1, "32x": 2}[multiple] + (4 if text == "real text" else 0)
    return table(RESULTS_TABLES, HOLDS)[name][column].lstrip("+")


def trained_length_losses():
    """The Markov source's means at 64 of every encoding with positions but ALiBi."""
    return [
        float(source(MARKOV, name, 0))
        for name in table(RESULTS_TABLES, MARKOV)
        if name not in ("none", "nope_temperature", "alibi") and not name.startswith("rope +")
    ]


# (page, a pattern whose groups are numbers, their values from the source,
# how far a figure may be from its source: half its last digit by default,
# one digit for a difference of two rounded cells).
FACTS = [
    ("docs/index.md", r"others \(([\d.]+)x plain", [source(SPEED, ATTENTION, 1, 3)]),
    (
        "docs/encodings/attention.md",
        r"takes ([\d.]+)x to ([\d.]+)x the\s+time",
        [source(SPEED, JAX, 1, 0), source(SPEED, JAX, 1, 3)],
    ),
    *(
        (
            "docs/results.md",
            rf"\| {re.escape(row)} \| [\d.]+ \| ([\d.]+)x \|"
            r".* \| ([\d.]+)x \| <= [\d.]+x \| \w+ \|$",
            [source(SPEED, ATTENTION, 1, index), source(SPEED, MEMORY, 1, index)],
        )
        for index, row in enumerate(
            [
                "RoPE (`RotaryEmbedding`)",
                "ALiBi (`AlibiBias`)",
                "T5 (`RelativePositionBias`)",
                "Shaw, k = 16 (`RelativePositionEmbedding`)",
            ]
        )
    ),
    *(
        (
            "docs/results.md",
            rf"^\| {re.escape(row)} \| [\d.]+x, \d, \d+ MiB \(([\d.]+)x\) \| "
            r"([\d.]+)x, \d, \d+ MiB \(([\d.]+)x\)",
            [
                source(SPEED, MEMORY, 1, index),
                source(SPEED, JAX, 1, index),
                source(SPEED, JAX, 1, 4 + index),
            ],
        )
        for index, row in enumerate(["RoPE", "ALiBi", "T5", "Shaw, k = 16"])
    ),
    *(
        (
            "docs/results.md",
            rf"^\| {re.escape(row)} \| \d+ \| [\d.]+ \| ([\d.]+)x \|",
            [source(SPEED, DECODING, 1, index)],
        )
        for index, row in enumerate(
            [
                "RoPE (`RotaryEmbedding`)",
                "ALiBi (`AlibiBias`)",
                "T5 (`RelativePositionBias`)",
                "Shaw, k = 16 (`RelativePositionEmbedding`)",
            ]
        )
    ),
    (
        "docs/results.md",
        r"KERPLE's\s+learned\s+log\s+kernel\s+ends\s+([\d.]+)\s+nats\s+below\s+ALiBi's\s+fixed\s+"
        r"slopes\s+at\s+2048\s+on\s+the\s+Markov\s+source\s+and\s+([\d.]+)\s+on\s+real\s+text",
        [
            float(source(header, "alibi", 5)) - float(source(header, "kerple", 5))
            for header in (MARKOV, PYTHON_SOURCE)
        ],
        0.0015,
    ),
    (
        "docs/results.md",
        r"Transformer-XL is the best of all at 2048 on both\s+texts \(([\d.]+) and ([\d.]+)\)",
        [source(header, "transformer_xl", 5) for header in (MARKOV, PYTHON_SOURCE)],
    ),
    (
        "docs/results.md",
        r"RoPE trains at ([\d.]+)x sinusoidal's speed, ALiBi at ([\d.]+)x and T5 at\s+([\d.]+)x",
        [source(LANGUAGE_SPEED, name, 1) for name in ("rope", "alibi", "t5")],
    ),
    (
        "docs/results.md",
        r"Shaw's relative embeddings cost ([\d.]+)x,[\s\S]*?bucket table\) ([\d.]+)x and\s+"
        r"([\d.]+)x, and FIRE's[\s\S]*?the slowest, ([\d.]+)x and ([\d.]+)x",
        [
            source(LANGUAGE_SPEED, name, 1)
            for name in ("shaw", "transformer_xl", "deberta", "fire", "cope")
        ],
    ),
    (
        "README.md",
        r"part past 16x on real text \(\+([\d.]+) and \+([\d.]+) at 32x\)",
        [held(name, "real text", "32x") for name in ("shaw", "xpos")],
    ),
    (
        "docs/results.md",
        r"part at\s+32x \(\+([\d.]+) and \+([\d.]+)\)",
        [held(name, "real text", "32x") for name in ("shaw", "xpos")],
    ),
    (
        "docs/results.md",
        r"sinusoidal \(\+([\d.]+) nats at 8x on the Markov source\),\s+RoPE \(\+([\d.]+)\), "
        r"T5 \(\+([\d.]+)\), DeBERTa \(\+([\d.]+)\), FIRE \(\+([\d.]+)\)\s+and CoPE "
        r"\(\+([\d.]+)\)",
        [
            held(name, "Markov", "8x")
            for name in ("sinusoidal", "rope", "t5", "deberta", "fire", "cope")
        ],
    ),
    (
        "docs/results.md",
        r"YaRN \(([\d.]+)\) and dynamic NTK\s+\(([\d.]+)\) beat plain RoPE \(([\d.]+)\) on "
        r"the Markov source; linear\s+interpolation without fine-tuning does worse "
        r"\(([\d.]+)\)",
        [
            source(MARKOV, name, 2)
            for name in ("rope + yarn", "rope + dynamic", "rope", "rope + linear")
        ],
    ),
    (
        "docs/results.md",
        r"On real text NoPE rises by ([\d.]+) nats to 32x",
        [held("none", "real text", "32x")],
    ),
    (
        "docs/results.md",
        r"ALiBi\s+is\s+the\s+furthest\s+from\s+the\s+floor\s+on\s+the\s+Markov\s+source\s+"
        r"\(([\d.]+),\s+against\s+([\d.]+)\s+to\s+([\d.]+)\s+for\s+the\s+other\s+encodings\)",
        [
            source(MARKOV, "alibi", 0),
            min(trained_length_losses()),
            max(trained_length_losses()),
        ],
    ),
    (
        "README.md",
        r"positions scaled to the trained\s+grid \(([\d.]+)\s+and\s+([\d.]+) at 2x\) and\s+"
        r"the learned table resized bicubically\s+\(([\d.]+)\)",
        [
            source(VISION, "sinusoidal 2-D, positions scaled", 2),
            source(VISION, "axial RoPE, positions scaled", 2),
            source(VISION, "learned + bicubic resize", 2),
        ],
    ),
    (
        "docs/grids.md",
        r"resized bicubically held \(([\d.]+) at 8 x 8,\s+([\d.]+) at 16 x 16\), "
        r"and so did axial RoPE, the best at the training grid\s+\(([\d.]+)\)",
        [
            source(VISION, "learned + bicubic resize", 0),
            source(VISION, "learned + bicubic resize", 2),
            source(VISION, "axial RoPE", 0),
        ],
    ),
    (
        "README.md",
        r"eigenvectors \(([\d.]+)\s+at\s+the\s+training\s+sizes\)",
        [source(GRAPHS, "Laplacian eigenvectors", 0)],
    ),
    (
        "docs/graphs.md",
        r"training-size graph well enough for ([\d.]+) ",
        [source(GRAPHS, "Laplacian eigenvectors", 0)],
    ),
    (
        "docs/graphs.md",
        r"training sizes and ([\d.]+) on\s+graphs twice as large",
        [source(GRAPHS, "shortest-path bias", 1)],
    ),
    (
        "docs/grids.md",
        r"rotations at ([\d.]+)x to ([\d.]+)x their floors and ([\d.]+)x to "
        r"([\d.]+)x their 1-D\s+paths, attention with 2-D RoPE at ([\d.]+)x and "
        r"with Swin's bias at ([\d.]+)x",
        [
            min(numbers(cells[2])[0] for cells in list(GRID_SPEED.values())[:4]),
            max(numbers(cells[2])[0] for cells in list(GRID_SPEED.values())[:4]),
            min(numbers(cells[5])[0] for cells in list(GRID_SPEED.values())[:4]),
            max(numbers(cells[5])[0] for cells in list(GRID_SPEED.values())[:4]),
            numbers(GRID_SPEED["attention, 2-D RoPE"][2])[0],
            numbers(GRID_SPEED["attention, Swin's grid bias"][2])[0],
        ],
    ),
]


@pytest.mark.parametrize(
    "fact", FACTS, ids=lambda fact: f"{fact[0]}: {fact[1][:40]}"
)
def test_a_repeated_number_agrees_with_its_source(fact):
    page, pattern, expected, *tolerance = fact
    match = re.search(pattern, (ROOT / page).read_text(), re.MULTILINE)
    assert match, f"{page} no longer says {pattern!r}: update the fact"
    for written, value in zip(match.groups(), expected):
        # A figure and its source agree to the coarser one's last digit.
        digits = min(decimals(written), decimals(value))
        allowed = tolerance[0] if tolerance else 0.5 * 10**-digits + 1e-9
        assert abs(float(written) - float(value)) <= allowed, (
            f"{page} says {written} where its source says {value}"
        )


def decimals(number):
    """The digits after the point of a number as written (a float: all)."""
    return len(number.split(".")[1]) if isinstance(number, str) else 16


@pytest.mark.parametrize(
    "page", PAGES, ids=lambda page: str(page.relative_to(ROOT))
)
def test_a_repeated_table_repeats_the_results_pages_rows(page):
    if page.name == "results.md":
        return
    for header, rows in markdown_tables(page.read_text()).items():
        if header in RESULTS_TABLES:
            for name, cells in rows.items():
                assert cells == RESULTS_TABLES[header].get(name), (
                    f"{header} row {name} differs from the Results page's"
                )


README_LANGUAGE = "| encoding | Markov, 64 | Markov, 2048 | real text, 64 | real text, 2048 | speed |"
README_SPEED = "| scheme | RoPE |"
# README's speed columns: (the Results page's summary row, index in its
# time cell and in its memory cell).
SPEED_COLUMNS = {
    "RoPE": (ATTENTION, 0),
    "ALiBi": (ATTENTION, 1),
    "T5": (ATTENTION, 2),
    "Shaw": (ATTENTION, 3),
    "Transformer-XL": (ATTENTION, 4),
    "DeBERTa": (ATTENTION, 5),
    "KERPLE": (LONG_CONTEXT, 0),
    "FIRE": (LONG_CONTEXT, 1),
    "xPos, causal": (LONG_CONTEXT, 2),
    "CoPE, causal": (LONG_CONTEXT, 3),
}


def test_readmes_language_table_is_the_results_pages():
    # README gives the means; the Results page the mean ± the deviation.
    markov, python_source = table(RESULTS_TABLES, MARKOV), table(RESULTS_TABLES, PYTHON_SOURCE)
    speeds = table(RESULTS_TABLES, LANGUAGE_SPEED)
    rows = table(README_TABLES, README_LANGUAGE)
    assert len(rows) >= 10
    for name, cells in rows.items():
        expected = [
            re.findall(r"-?\d+\.\d+", cell)[0]
            for cell in (
                markov[name][0],
                markov[name][5],
                python_source[name][0],
                python_source[name][5],
            )
        ]
        expected.append(speeds[name][1] if name in speeds else "")
        assert cells == expected, name


def test_readmes_speed_table_is_the_results_pages():
    # One column per scheme, a row of times and one of peak memory.
    (header,) = [line for line in README_TABLES if line.startswith(README_SPEED)]
    schemes = [cell.strip() for cell in header.strip("|").split("|")][1:]
    assert schemes == list(SPEED_COLUMNS)
    rows = README_TABLES[header]
    assert set(rows) == {"time", "peak memory"}
    for column, name in enumerate(schemes):
        row, index = SPEED_COLUMNS[name]
        memory_row = MEMORY if row == ATTENTION else LONG_CONTEXT_MEMORY
        assert rows["time"][column] == f"{source(SPEED, row, 1, index)}x", name
        assert rows["peak memory"][column] == f"{source(SPEED, memory_row, 1, index)}x", name


# The multiples of the trained length (64) the holds table gives, and the
# columns of the length tables they are at.
MULTIPLES = {"8x": 3, "16x": 4, "32x": 5}


def test_the_holds_table_is_the_length_tables_rises():
    rows = table(RESULTS_TABLES, HOLDS)
    assert len(rows) >= 16
    for name, cells in rows.items():
        for offset, header in ((0, MARKOV), (4, PYTHON_SOURCE)):
            means = [numbers(cell)[0] for cell in table(RESULTS_TABLES, header)[name]]
            changes = {
                multiple: means[column] - means[0] for multiple, column in MULTIPLES.items()
            }
            for index, (multiple, change) in enumerate(changes.items()):
                assert abs(float(cells[offset + index]) - change) <= 0.0015, (name, multiple)
            # Held to the last multiple before the first rise past 0.05.
            held = list(itertools.takewhile(lambda multiple: changes[multiple] <= 0.05, changes))
            assert cells[offset + 3] == (held[-1] if held else "no"), (name, header)
