"""mkdocs hooks: draw the site's figures, and turn its TeX into MathML.

The encoding figures come from `keras_posenc.plot`. Small ones that `plot`
does not have, ALiBi's bias matrix, T5's and DeBERTa's buckets,
Transformer-XL's two shifts and what the graph layers read of a small graph, are drawn here.
The results figures redraw the demo's tables of the Results page
(docs/results.md), since running the demo takes minutes. A figure is written only when its
bytes change, so that `mkdocs serve` does not rebuild forever.

Formulas are converted to MathML when the site is built, which browsers
render natively, so a page shows its maths with no script and no network
(opened from disk, offline, behind a firewall).
"""

import html
import io
import os
import re
import warnings

import latex2mathml.converter

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# A build prints no TensorFlow C++ lines (as the command): not even the
# "failed call to cuInit" error of a machine without a GPU.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# A figure drawn with an old argument name of the package fails the build:
# its DeprecationWarnings say "`old` is deprecated: use `new`".
warnings.filterwarnings(
    "error", message=r".* is deprecated: use ", category=DeprecationWarning
)

# The Results page's tables of the demo: the language task's columns are
# lengths (speed columns may follow), the vision task's grids such as `8x8`.
_LENGTH_HEADER = re.compile(r"^\| encoding((?: \| \d+)+) \|")
_GRID_HEADER = re.compile(r"^\| encoding((?: \| \d+x\d+)+) \|$")
# pymdownx.arithmatex's generic output: inline \(...\) in a span, display
# \[...\] in a div, the TeX HTML-escaped.
_ARITHMATEX = re.compile(
    r'<(span|div) class="arithmatex">\s*\\[([](.*?)\\[)\]]\s*</\1>', re.DOTALL
)
# latex2mathml keeps a command it does not know as text ("\foo"), the `&`
# of an environment it does not know (aligned) as a bare "&", and writes
# `\!` as an mspace of a width no browser reads.
_UNCONVERTED = re.compile(r'\\|&(?!#?\w+;)|width="[a-z]')
_TABLE = re.compile(r"<table>.*?</table>", re.DOTALL)
_INLINE_CODE = re.compile(r"<code>([^<]*)</code>")


def _write(figure, path):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    data = buffer.getvalue()
    if os.path.exists(path):
        with open(path, "rb") as existing:
            if existing.read() == data:
                return
    with open(path, "wb") as output:
        output.write(data)


def _alibi_bias_figure(num_heads=8, length=16):
    """ALiBi's causal bias for query and key positions, of the first and last head."""
    import keras
    import numpy as np
    from matplotlib.figure import Figure

    import keras_posenc

    alibi = keras_posenc.AlibiBias(num_heads=num_heads)
    positions = np.arange(length)
    bias = alibi(positions, positions)  # (1, heads, query, key)
    bias = keras.ops.convert_to_numpy(bias)[0]  # (heads, query, key)
    # Keys after the query are masked in a causal model.
    causal = np.tril(np.ones((length, length), bool))
    figure = Figure(figsize=(9, 4), layout="constrained")
    for number, head in enumerate((0, num_heads - 1)):
        axes = figure.add_subplot(1, 2, number + 1)
        image = axes.imshow(
            np.where(causal, bias[head], np.nan), cmap="viridis", vmax=0.0
        )
        figure.colorbar(image, ax=axes, shrink=0.8)
        slope = float(keras_posenc.ops.alibi_slopes(num_heads)[head])
        axes.set_title(f"head {head + 1} of {num_heads}, slope {slope:g}")
        axes.set_xticks(range(0, length, 4))
        axes.set_yticks(range(0, length, 4))
        axes.set_xlabel("key position j")
        axes.set_ylabel("query position i")
    figure.suptitle("ALiBi bias -m (i - j) under a causal mask")
    return figure


def _t5_buckets_figure(num_buckets=32, max_distance=128, span=160):
    """T5's bucket of every relative position, both directions and one."""
    import keras
    import numpy as np
    from matplotlib.figure import Figure

    import keras_posenc

    relative = np.arange(-span, span + 1)  # (2 span + 1,)
    figure = Figure(figsize=(8, 4), layout="constrained")
    axes = figure.add_subplot()
    for bidirectional in (True, False):
        buckets = keras_posenc.ops.relative_position_bucket(
            relative, bidirectional, num_buckets, max_distance
        )  # (2 span + 1,)
        axes.step(
            relative,
            keras.ops.convert_to_numpy(buckets),
            where="mid",
            label=f"bidirectional={bidirectional}",
        )
    for distance in (-max_distance, max_distance):
        axes.axvline(distance, color="gray", linestyle=":")
    axes.set_xlabel("relative position j - i")
    axes.set_ylabel("bucket")
    axes.set_title(
        f"T5 buckets (num_buckets={num_buckets}, max_distance={max_distance})"
    )
    axes.legend()
    return figure


def _transformer_xl_figure(length=12, features=16, heads=2):
    """Transformer-XL's position term of one head, by the full and the legacy shift."""
    import keras
    import numpy as np
    from matplotlib.figure import Figure

    import keras_posenc

    rng = np.random.default_rng(0)
    # One query at every position: the term is then a function of where
    # each logit reads the encoding.
    query = np.broadcast_to(
        rng.normal(size=(1, 1, heads, features // heads)),
        (1, length, heads, features // heads),
    ).astype("float32")
    keys = np.zeros_like(query)  # no content term: the position term alone
    positions = keras.ops.arange(length, dtype="int32")[None]
    context = keras_posenc.AttentionContext(
        query_positions=positions, key_positions=positions, consecutive=True
    )
    kernel = rng.normal(size=(features, heads, features // heads)).astype("float32")
    terms = {}
    for shift in ("full", "legacy"):
        scheme = keras_posenc.TransformerXLPosition(
            shift=shift, legacy_max_length=length
        )
        scheme.build_for_attention(heads, features // heads, features // heads, features)
        scheme.position_kernel.assign(kernel)
        terms[shift] = keras.ops.convert_to_numpy(
            scheme.logits_bias(query, keys, context)
        )[0, 0]  # (query, key), head 1
    low = min(term.min() for term in terms.values())
    high = max(term.max() for term in terms.values())
    figure = Figure(figsize=(9, 4), layout="constrained")
    for number, (shift, term) in enumerate(terms.items()):
        axes = figure.add_subplot(1, 2, number + 1)
        image = axes.imshow(term, cmap="viridis", vmin=low, vmax=high)
        figure.colorbar(image, ax=axes, shrink=0.8)
        axes.set_title(f'shift="{shift}"')
        axes.set_xlabel("key position j")
        axes.set_ylabel("query position i")
    figure.suptitle("(q_i + v) . W_R R_(i - j) of one head: full reads i - j everywhere")
    return figure


def _deberta_buckets_figure(span=600):
    """DeBERTa's log bucket of every relative position, at two settings."""
    import numpy as np
    from matplotlib.figure import Figure

    import keras_posenc

    relative = np.arange(-span, span + 1)  # (2 span + 1,): query - key
    figure = Figure(figsize=(8, 4), layout="constrained")
    axes = figure.add_subplot()
    for buckets, longest in ((256, 512), (32, 128)):
        bucket = keras_posenc.ops.make_log_bucket_position(
            relative, buckets, longest
        )  # (2 span + 1,)
        # The row each distance reads, clipped to the table's 2 k rows.
        rows = np.clip(np.asarray(bucket) + buckets, 0, 2 * buckets - 1)
        axes.step(
            relative,
            rows - buckets,
            where="mid",
            label=f"position_buckets={buckets}, max_relative_positions={longest}",
        )
    axes.set_xlabel("relative position p_i - p_j (query - key)")
    axes.set_ylabel("table row - k")
    axes.set_title("DeBERTa's log buckets: exact up to k / 2, logarithmic to the last")
    axes.legend()
    return figure


def _graph_encodings_figure():
    """What the graph layers read of one small graph: a ring of 5 and one of 7, joined.

    Its nodes coloured by their entry in the Laplacian's first non-trivial
    eigenvector, their random-walk return probabilities, and the hop counts
    between every two of them.
    """
    import keras
    import numpy as np
    from matplotlib.figure import Figure

    import keras_posenc

    sizes, nodes = (5, 7), 12
    adjacency = np.zeros((nodes, nodes), "float32")
    coordinates = []
    start = 0
    for size, (center, turn) in zip(sizes, ((-1.4, 0.0), (1.6, np.pi))):
        angles = turn + 2 * np.pi * np.arange(size) / size
        coordinates += [(center + np.cos(a), np.sin(a)) for a in angles]
        for node in range(size):
            i, j = start + node, start + (node + 1) % size
            adjacency[i, j] = adjacency[j, i] = 1.0
        start += size
    adjacency[0, 5] = adjacency[5, 0] = 1.0  # the bridge
    coordinates = np.array(coordinates)  # (nodes, 2), for drawing only
    graph = adjacency[np.newaxis]  # (1, nodes, nodes)
    _, eigenvectors = keras_posenc.ops.laplacian_eigenvectors(graph, k=1)
    first = keras.ops.convert_to_numpy(eigenvectors)[0, :, 0]  # (nodes,)
    walks = keras_posenc.ops.random_walk_probabilities(graph, steps=6)
    walks = keras.ops.convert_to_numpy(walks)[0]  # (nodes, steps)
    hops = keras_posenc.ops.hop_counts(graph, max_hops=8)
    hops = keras.ops.convert_to_numpy(hops)[0]  # (nodes, nodes)

    figure = Figure(figsize=(13, 4), layout="constrained")
    drawing, walk_axes, hop_axes = figure.subplots(
        1, 3, gridspec_kw={"width_ratios": [1.4, 0.9, 1.0]}
    )
    for i, j in zip(*np.nonzero(np.triu(adjacency))):
        drawing.plot(*coordinates[[i, j]].T, color="gray", linewidth=1, zorder=1)
    limit = np.abs(first).max()
    points = drawing.scatter(
        *coordinates.T, s=320, c=first, cmap="coolwarm", vmin=-limit, vmax=limit,
        edgecolors="black", zorder=2,
    )
    for node, (x, y) in enumerate(coordinates):
        drawing.annotate(str(node), (x, y), ha="center", va="center", fontsize=8)
    figure.colorbar(points, ax=drawing, shrink=0.8)
    drawing.set_aspect("equal")
    drawing.margins(0.12)
    drawing.axis("off")
    drawing.set_title("first Laplacian eigenvector")
    image = walk_axes.imshow(walks, cmap="viridis", aspect="auto")
    figure.colorbar(image, ax=walk_axes, shrink=0.8)
    walk_axes.set_xticks(range(6), [str(step) for step in range(1, 7)])
    walk_axes.set_yticks(range(0, nodes, 2))
    walk_axes.set_xlabel("steps")
    walk_axes.set_ylabel("node")
    walk_axes.set_title("random-walk return probabilities")
    image = hop_axes.imshow(hops, cmap="viridis")
    figure.colorbar(image, ax=hop_axes, shrink=0.8, label="hops")
    hop_axes.set_xticks(range(0, nodes, 2))
    hop_axes.set_yticks(range(0, nodes, 2))
    hop_axes.set_xlabel("node j")
    hop_axes.set_ylabel("node i")
    hop_axes.set_title("hop counts (ShortestPathBias)")
    return figure


def _tables(path, header):
    """Every table of the page at `path` whose header matches `header`, in order.

    Each is `(columns, rows)`: the column names the pattern's group holds,
    and from each row's first cell to its values in those columns, a cell
    `mean ± spread` read as the pair, `n/a` as `None`, a number as `(value,
    None)`. Columns after the matched ones are left out.
    """
    with open(path, encoding="utf-8") as page:
        lines = page.read().splitlines()
    tables = []
    for index, line in enumerate(lines):
        match = header.match(line)
        if not match:
            continue
        columns = [column.strip() for column in match.group(1).split("|") if column.strip()]
        rows = {}
        # Skip the header and its |---| line; the table ends at the first
        # line that is not a row.
        for row in lines[index + 2 :]:
            if not row.startswith("|"):
                break
            cells = [cell.strip() for cell in row.strip("|").split("|")]
            rows[cells[0]] = [
                None
                if cell == "n/a"
                else tuple(float(part) for part in cell.split(" ± "))
                if " ± " in cell
                else (float(cell), None)
                for cell in cells[1 : 1 + len(columns)]
            ]
        tables.append((columns, rows))
    if not tables:
        raise ValueError(
            f"No table with a header like {header.pattern!r} in {path}."
        )
    return tables


def _means(rows):
    return {
        name: [None if cell is None else cell[0] for cell in cells]
        for name, cells in rows.items()
    }


def _spreads(rows):
    """The standard deviation of each cell, `0.0` where a cell gives none."""
    return {
        name: [0.0 if cell is None or cell[1] is None else cell[1] for cell in cells]
        for name, cells in rows.items()
    }


def on_pre_build(config):
    from keras_posenc import plot
    from keras_posenc_lab import config as demo_config
    from keras_posenc_lab import language as language_task

    out_dir = os.path.join(config["docs_dir"], "figures")
    os.makedirs(out_dir, exist_ok=True)
    results = os.path.join(config["docs_dir"], "results.md")
    # The Markov source's table first, then the standard library's.
    (lengths, markov), (source_lengths, python_source) = _tables(
        results, _LENGTH_HEADER
    )[:2]
    ((grids, vision),) = _tables(results, _GRID_HEADER)
    language = demo_config.DEFAULT
    figures = {
        "encoding_heatmap.png": plot.encoding_heatmap(),
        "encoding_heatmap_half.png": plot.encoding_heatmap(pairing="half"),
        "similarity.png": plot.similarity_curve(),
        "rope_wavelengths.png": plot.rope_wavelengths(),
        "grid_similarity.png": plot.grid_similarity(),
        "rope_axis_assignment.png": plot.rope_axis_assignment(),
        "alibi_bias.png": _alibi_bias_figure(),
        "t5_buckets.png": _t5_buckets_figure(),
        "graph_encodings.png": _graph_encodings_figure(),
        "transformer_xl_shift.png": _transformer_xl_figure(),
        "deberta_buckets.png": _deberta_buckets_figure(),
        "extrapolation.png": plot.extrapolation_curves(
            [int(length) for length in lengths],
            _means(markov),
            language_task.MarkovSource(language.seed).entropy_rate,
            language.train_length,
            _spreads(markov),
        ),
        "extrapolation_python_source.png": plot.extrapolation_curves(
            [int(length) for length in source_lengths],
            _means(python_source),
            None,
            language.train_length,
            _spreads(python_source),
        ),
        "resolution.png": plot.resolution_curves(
            [int(grid.split("x")[0]) for grid in grids],
            _means(vision),
            demo_config.VISION_DEFAULT.grids[0],
            _spreads(vision),
        ),
    }
    for filename, figure in figures.items():
        _write(figure, os.path.join(out_dir, filename))


def _mathml(match, page):
    element, tex = match.group(1), html.unescape(match.group(2))
    display = "block" if element == "div" else "inline"
    try:
        mathml = latex2mathml.converter.convert(tex, display=display)
    except Exception as error:
        raise ValueError(
            f"{page.file.src_path}: latex2mathml cannot convert {tex!r}: {error}"
        ) from error
    if _UNCONVERTED.search(mathml):
        raise ValueError(
            f"{page.file.src_path}: latex2mathml leaves part of {tex!r} "
            f"unconverted: {mathml}. Rewrite it with commands it knows."
        )
    return f'<{element} class="arithmatex">{mathml}</{element}>'


def _breakable_names(table):
    """The table with a <wbr> after each underscore of its inline code.

    A long name such as `original_max_position_embeddings` may then wrap
    at an underscore rather than widen its column past the page.
    """
    return _INLINE_CODE.sub(
        lambda code: f"<code>{code.group(1).replace('_', '_<wbr>')}</code>",
        table.group(0),
    )


def on_page_content(content, page, **kwargs):
    """Formulas as MathML (the docstrings' too); names in tables breakable."""
    content = _TABLE.sub(_breakable_names, content)
    content = _ARITHMATEX.sub(lambda match: _mathml(match, page), content)
    # A formula in a form the pattern does not know would stay raw TeX.
    leftover = re.search(r'class="arithmatex">(?!<math)(.{0,80})', content, re.DOTALL)
    if leftover:
        raise ValueError(
            f"{page.file.src_path}: a formula not converted: {leftover.group(1)!r}"
        )
    return content
