"""Figures of the encodings and of the demo's results, drawn with matplotlib.

An optional extra (`pip install keras-posenc[plot]`): `import keras_posenc`
does not import this module. Figures are made with `matplotlib.figure.Figure`
rather than `pyplot`, so they need no display, hold no global state and are
freed like any other object. In a notebook, run `%matplotlib inline` first and
the figure a cell returns is drawn below it.
"""

import math
import numbers
import os

import keras
import numpy as np

from keras_posenc import ops
from keras_posenc import rope_scaling
from keras_posenc.ops._renamed import renamed_arguments

try:
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullLocator
except ImportError as error:
    raise ImportError(
        "keras_posenc.plot needs matplotlib. Install it with "
        "`pip install keras-posenc[plot]`."
    ) from error


@renamed_arguments({"layout": "pairing"}, {"pairing": {"concat": "half"}})
def encoding_heatmap(
    length=128, dim=64, max_wavelength=10000.0, pairing="interleaved"
):
    """A heatmap of the sinusoidal encoding of positions `0 .. length - 1`.

    Row `p` is `keras_posenc.ops.sinusoidal(p, dim)`: the fast sines and
    cosines on the left (low features) change at every position, the slow
    ones on the right barely move over the first hundred positions. With
    `pairing="interleaved"` the columns alternate sine, cosine; with
    `"half"` the sines fill the left half and the cosines the right.

    Args:
        length: int. The number of positions, drawn on the y axis. Defaults
            to `128`.
        dim: int. The encoding width, drawn on the x axis. Defaults to `64`.
        max_wavelength: float. The longest wavelength. Defaults to
            `10000.0`.
        pairing: str. Which features form a (sin, cos) pair: `"interleaved"`
            or `"half"`. Defaults to `"interleaved"`.

    Returns:
        A `matplotlib.figure.Figure` with the heatmap and a colorbar.
    """
    ops.check_positive_int("length", length)
    table = keras.ops.convert_to_numpy(
        ops.sinusoidal(keras.ops.arange(length), dim, max_wavelength, pairing)
    )  # (length, dim)
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(
        table,
        aspect="auto",
        cmap="RdBu",
        vmin=-1.0,
        vmax=1.0,
        interpolation="nearest",
    )
    figure.colorbar(image, ax=axes, label="encoding value")
    axes.set_xlabel("feature")
    axes.set_ylabel("position")
    axes.set_title(
        f"Sinusoidal position encoding ({pairing} pairing, dim={dim}, "
        f"max_wavelength={max_wavelength:g})"
    )
    return figure


@renamed_arguments({"position": "reference_position"})
def similarity_curve(
    length=128, dim=64, reference_position=None, max_wavelength=10000.0
):
    """The dot product of one position's encoding with every position's.

    `sinusoidal(p) . sinusoidal(q)` is a sum of `cos((p - q) w_i)`: it depends
    only on the distance `p - q`, peaks at `p == q` and falls off with
    distance, which is what lets attention tell near positions from far ones.
    (The sum is the same for either pairing.)

    Args:
        length: int. The number of positions, drawn on the x axis. Defaults
            to `128`.
        dim: int. The encoding width. Defaults to `64`.
        reference_position: int or None. The position compared with all the
            others, in `0 .. length - 1`. Defaults to `None`, meaning
            `length // 2`.
        max_wavelength: float. The longest wavelength. Defaults to
            `10000.0`.

    Returns:
        A `matplotlib.figure.Figure` with the curve and a vertical line at
        `reference_position`.
    """
    ops.check_positive_int("length", length)
    if reference_position is None:
        reference_position = length // 2
    if (
        isinstance(reference_position, bool)
        or not isinstance(reference_position, numbers.Integral)
        or not 0 <= reference_position < length
    ):
        raise ValueError(
            f"`reference_position` must be an integer from 0 to length - 1 = "
            f"{length - 1}. Received: reference_position={reference_position!r}"
        )
    table = keras.ops.convert_to_numpy(
        ops.sinusoidal(keras.ops.arange(length), dim, max_wavelength)
    )  # (length, dim)
    similarity = table @ table[reference_position]  # (length,)
    figure = Figure(figsize=(8, 4), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(range(length), similarity, label="dot product")
    axes.axvline(
        reference_position,
        color="tab:red",
        linestyle="--",
        label=f"position {reference_position}",
    )
    axes.set_xlabel("position")
    axes.set_ylabel(f"dot product with position {reference_position}")
    axes.set_title(
        f"Similarity of position {reference_position} to every position (dim={dim})"
    )
    axes.legend()
    return figure


def rope_wavelengths(
    head_dim=128,
    max_wavelength=10000.0,
    factor=8.0,
    original_max_position_embeddings=8192,
):
    """The RoPE wavelength of every feature pair under each scaling schedule.

    Feature pair `i` turns once every `2 pi / theta_i` positions. Without
    scaling (`default`) the wavelengths grow geometrically with `i`, from
    `2 pi` to nearly `2 pi * max_wavelength`, a straight line on the log
    axis. Extending the context from `original_max_position_embeddings` to
    `factor` times it, each schedule of `keras_posenc.rope_scaling` moves
    that line differently:

    - `linear` (position interpolation) divides every frequency by `factor`:
      the whole line moves up by `factor`, the short wavelengths included.
    - `yarn` keeps the pairs that turn more than `beta_fast = 32` times
      within the trained length, divides by `factor` those that turn fewer
      than `beta_slow = 1` times, and ramps between the two.
    - `llama3` does the same by wavelength: above
      `original / low_freq_factor` (`low_freq_factor = 1`) divided by
      `factor`, below `original / high_freq_factor` (`high_freq_factor = 4`)
      kept, blended between.
    - `dynamic` (NTK) raises the base, drawn here at the extended length
      `factor * original_max_position_embeddings`: the shortest wavelength
      stays, the others grow the more the longer they are.

    Horizontal lines mark the trained length and `factor` times it: a pair
    whose wavelength is past the trained length never completed a turn in
    training, which is why the schedules leave the short wavelengths alone
    and stretch the long ones.

    Args:
        head_dim: int. The number of rotated features, even and at least 4;
            the figure has `head_dim / 2` pairs. Defaults to `128`.
        max_wavelength: float. The base, `rope_theta`. Defaults to
            `10000.0`.
        factor: float. The context extension factor, greater than 1.
            Defaults to `8.0`.
        original_max_position_embeddings: int. The trained context length.
            Defaults to `8192`.

    Returns:
        A `matplotlib.figure.Figure` with one line per schedule, in the
        order default, linear, yarn, llama3, dynamic, then the two
        horizontal lines.

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [Chen et al., 2023](https://arxiv.org/abs/2306.15595)
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071)
        - [Llama Team, 2024](https://arxiv.org/abs/2407.21783)
    """
    if (
        isinstance(head_dim, bool)
        or not isinstance(head_dim, numbers.Integral)
        or head_dim < 4
        or head_dim % 2
    ):
        raise ValueError(
            "`head_dim` must be an even integer of at least 4: features are "
            f"rotated in pairs. Received: head_dim={head_dim!r}"
        )
    ops.check_max_wavelength(max_wavelength)
    ops.check_number_above_one("factor", factor)
    ops.check_positive_int(
        "original_max_position_embeddings", original_max_position_embeddings
    )
    original = original_max_position_embeddings
    extended = factor * original
    schedules = {
        "default (no scaling)": None,
        "linear": {"rope_type": "linear", "factor": factor},
        "yarn": {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": original,
        },
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
        f"dynamic (at length {extended:.10g})": {
            "rope_type": "dynamic",
            "factor": factor,
            "original_max_position_embeddings": original,
        },
    }
    pairs = range(head_dim // 2)
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    for label, scaling in schedules.items():
        inverse_frequencies, _ = rope_scaling.rope_parameters(
            scaling, head_dim, max_wavelength, length=extended
        )  # (head_dim / 2,)
        wavelengths = 2 * math.pi / keras.ops.convert_to_numpy(inverse_frequencies).astype(
            "float64"
        )
        axes.plot(pairs, wavelengths, label=label)
    axes.axhline(
        original,
        color="black",
        linestyle="--",
        label=f"trained length ({original})",
    )
    axes.axhline(
        extended,
        color="black",
        linestyle=":",
        label=f"{factor:g} x trained length ({extended:.10g})",
    )
    axes.set_yscale("log")
    axes.set_xlabel("feature pair i")
    axes.set_ylabel(r"wavelength $2\pi / \theta_i$ (positions)")
    axes.set_title(
        f"RoPE wavelengths (head_dim={head_dim}, "
        f"max_wavelength={max_wavelength:g}, factor={factor:g})"
    )
    # The lines rise to the right: the lower right corner is free.
    axes.legend(loc="lower right")
    return figure


# One marker per line, so that encodings past the ten colors of the cycle
# still differ.
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h")


def _is_finite_number(value):
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def _check_extrapolation_inputs(
    lengths, nll, entropy_rate, train_length, names=("lengths", "nll", "train_length")
):
    """Raise a `ValueError` unless these suit `extrapolation_curves`.

    `names` are the arguments' names in the caller, for the messages.
    """
    lengths_name, nll_name, train_name = names
    if (
        not isinstance(lengths, (list, tuple))
        or not lengths
        or not all(
            isinstance(length, numbers.Integral)
            and not isinstance(length, bool)
            and length > 0
            for length in lengths
        )
        or any(a >= b for a, b in zip(lengths, lengths[1:]))
    ):
        raise ValueError(
            f"`{lengths_name}` must be a non-empty list of positive integers "
            f"in ascending order. Received: {lengths_name}={lengths!r}"
        )
    if not isinstance(nll, dict) or not nll:
        raise ValueError(
            f"`{nll_name}` must be a non-empty dict from encoding name to a "
            f"list of values. Received: {nll_name}={nll!r}"
        )
    for name, values in nll.items():
        if (
            not isinstance(values, (list, tuple))
            or len(values) != len(lengths)
            or not all(
                value is None or _is_finite_number(value) for value in values
            )
        ):
            raise ValueError(
                f"`{nll_name}[{name!r}]` must be a list of {len(lengths)} "
                f"finite numbers or None, one per entry of `{lengths_name}`. "
                f"Received: {nll_name}[{name!r}]={values!r}"
            )
    if entropy_rate is not None and (
        not _is_finite_number(entropy_rate) or entropy_rate < 0
    ):
        raise ValueError(
            "`entropy_rate` must be a finite number >= 0, or None where the "
            f"floor is unknown. Received: entropy_rate={entropy_rate!r}"
        )
    ops.check_positive_int(train_name, train_length)


def extrapolation_curves(lengths, nll, entropy_rate, train_length, spread=None):
    """Loss per token against evaluation length: train short, test long.

    One line per encoding, with a marker at each evaluation length where its
    loss is defined; `None` (a learned table asked for positions it does not
    have) leaves that point out and breaks the line there. Where `spread`
    gives the standard deviation over seeds, a band of one deviation either
    side shades the line. A dashed line marks the source's entropy rate,
    the lowest loss any model can reach (left out when it is unknown, as
    for real text), and a dotted one the length the models were trained at.

    The y axis stops at `max(entropy_rate + 1.5, m + 1)`, where `m` is the
    largest loss at the evaluation lengths up to the trained length (the
    shortest length, if all are longer), or lower if every loss fits below
    it. So an encoding whose loss explodes past the trained length does not
    squash the others into a flat band at the bottom; its line leaves the
    top of the axes, and its legend entry gives its largest loss.

    Args:
        lengths: list of int. The evaluation lengths, positive and
            ascending, drawn on a log-2 axis with a tick at each.
        nll: dict. From encoding name (str) to a list of `len(lengths)`
            mean negative log-likelihoods per token in nats, one per length,
            each a float or `None` where undefined. Drawn in the dict's
            order.
        entropy_rate: float or None. The source's entropy rate in nats per
            token; `None` where it is unknown.
        train_length: int. The sequence length the models were trained at.
        spread: dict or None. From encoding name to a list of
            `len(lengths)` standard deviations over seeds, each a float
            `>= 0` or `None` where undefined; names it lacks get no band.
            Defaults to `None`.

    Returns:
        A `matplotlib.figure.Figure`.
    """
    _check_extrapolation_inputs(lengths, nll, entropy_rate, train_length)
    for name, deviations in (spread or {}).items():
        if (
            name not in nll
            or not isinstance(deviations, (list, tuple))
            or len(deviations) != len(lengths)
            or not all(
                deviation is None or (_is_finite_number(deviation) and deviation >= 0)
                for deviation in deviations
            )
        ):
            raise ValueError(
                f"`spread[{name!r}]` must be a list of {len(lengths)} finite "
                "numbers >= 0 or None, one per entry of `lengths`, for an "
                f"encoding of `nll`. Received: spread[{name!r}]={deviations!r}"
            )
    floor = [] if entropy_rate is None else [entropy_rate]
    in_training = [
        index for index, length in enumerate(lengths) if length <= train_length
    ] or [0]
    defined = [
        value for values in nll.values() for value in values if value is not None
    ]
    trained_losses = [
        values[index]
        for values in nll.values()
        for index in in_training
        if values[index] is not None
    ]
    limit = max(
        [value + 1.5 for value in floor] + [loss + 1.0 for loss in trained_losses]
    )
    top = min(max(defined, default=limit), limit)
    bottom = min(floor + defined)
    # Equal losses still get a visible range.
    margin = 0.05 * max(top - bottom, 0.1)

    figure = Figure(figsize=(9, 5), layout="constrained")
    axes = figure.add_subplot()
    for number, (name, values) in enumerate(nll.items()):
        losses = np.array(
            [np.nan if value is None else value for value in values], "float64"
        )  # (len(lengths),)
        largest = max(
            (value for value in values if value is not None), default=None
        )
        label = name
        if largest is not None and largest > top + margin:
            label = f"{name} (off the axis, up to {largest:.2f})"
        (line,) = axes.plot(
            lengths,
            losses,
            marker=_MARKERS[number % len(_MARKERS)],
            label=label,
        )
        if spread is not None and name in spread:
            deviations = np.array(
                [np.nan if value is None else value for value in spread[name]],
                "float64",
            )  # (len(lengths),)
            axes.fill_between(
                lengths,
                losses - deviations,
                losses + deviations,
                color=line.get_color(),
                alpha=0.2,
                linewidth=0,
            )
    for value in floor:
        axes.axhline(
            value, color="black", linestyle="--", label="entropy rate (floor)"
        )
    axes.axvline(
        train_length, color="gray", linestyle=":", label="trained length"
    )
    axes.set_xscale("log", base=2)
    axes.set_xticks(lengths, labels=[str(length) for length in lengths])
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_ylim(bottom - margin, top + margin)
    axes.set_xlabel("evaluation length (tokens)")
    axes.set_ylabel("NLL per token (nats)")
    axes.set_title("Train short, test long")
    figure.legend(loc="outside right upper")
    return figure


def resolution_curves(grids, accuracy, train_grid, spread=None):
    """Test accuracy against the grid of patches: train at one, test larger.

    One line per encoding, with a marker at each grid and, where `spread`
    gives one, an error bar of that size; a dotted line marks the grid the
    models were trained at and a dashed one chance, 1 in 10.

    Args:
        grids: list of int. Patches per side of each evaluated grid,
            positive and ascending.
        accuracy: dict. From encoding name (str) to a list of
            `len(grids)` accuracies in [0, 1], drawn in the dict's order.
        train_grid: int. The grid the models were trained at.
        spread: dict or None. From encoding name to a list of
            `len(grids)` standard deviations over seeds. Defaults to `None`.

    Returns:
        A `matplotlib.figure.Figure`.
    """
    _check_extrapolation_inputs(
        grids, accuracy, None, train_grid, names=("grids", "accuracy", "train_grid")
    )
    for name, values in accuracy.items():
        if any(value is None or not 0 <= value <= 1 for value in values):
            raise ValueError(
                f"`accuracy[{name!r}]` must hold accuracies in [0, 1]. "
                f"Received: accuracy[{name!r}]={values!r}"
            )
    figure = Figure(figsize=(9, 5), layout="constrained")
    axes = figure.add_subplot()
    for number, (name, values) in enumerate(accuracy.items()):
        axes.errorbar(
            grids,
            values,
            yerr=None if spread is None else spread.get(name),
            marker=_MARKERS[number % len(_MARKERS)],
            capsize=3,
            label=name,
        )
    axes.axhline(0.1, color="black", linestyle="--", label="chance (1 in 10)")
    axes.axvline(train_grid, color="gray", linestyle=":", label="trained grid")
    axes.set_xticks(grids, labels=[f"{grid}x{grid}" for grid in grids])
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("grid of patches at test (the same digits, rendered larger)")
    axes.set_ylabel("test accuracy")
    axes.set_title("Train at one resolution, test at higher ones")
    figure.legend(loc="outside right upper")
    return figure


def grid_similarity(grid_shape=(14, 14), dim=64, max_wavelength=10000.0, anchors=None):
    """The similarity of a 2-D encoding's cells to a few cells of the grid.

    Each panel shows, for one anchor cell, the cosine similarity of every
    cell's `SinusoidalPositionEncoding(num_axes=2)` encoding (half the
    features for the row, half for the column) to the anchor's: it peaks at
    the anchor and falls off along rows and columns alike, the picture of
    Dosovitskiy et al.'s figure 7 for learned tables, here in closed form.

    Args:
        grid_shape: tuple of 2 ints. `(height, width)`. Defaults to
            `(14, 14)`, ViT-B/16 at 224 pixels.
        dim: int. The encoding width, a multiple of 4. Defaults to `64`.
        max_wavelength: float. The longest wavelength. Defaults to
            `10000.0`.
        anchors: list of `(row, column)` pairs or None. The cells compared
            with all the others. Defaults to `None`, meaning a corner, an
            edge and the centre.

    Returns:
        A `matplotlib.figure.Figure` with one heatmap per anchor.
    """
    ops.check_grid_shape(grid_shape, num_axes=2)
    height, width = grid_shape
    if anchors is None:
        anchors = [(0, 0), (0, width // 2), (height // 2, width // 2)]
    for anchor in anchors:
        if not (
            isinstance(anchor, (list, tuple))
            and len(anchor) == 2
            and all(isinstance(value, numbers.Integral) for value in anchor)
            and 0 <= anchor[0] < height
            and 0 <= anchor[1] < width
        ):
            raise ValueError(
                "`anchors` must be (row, column) cells of the grid "
                f"{tuple(grid_shape)}. Received: anchors={anchors!r}"
            )
    table = keras.ops.convert_to_numpy(
        ops.sinusoidal(ops.grid_positions(grid_shape), dim, max_wavelength, num_axes=2)
    )  # (height * width, dim)
    table = table / np.linalg.norm(table, axis=-1, keepdims=True)
    similarities = [
        (table @ table[row * width + column]).reshape(height, width)
        for row, column in anchors
    ]
    # One colour scale for all panels, from the least similar cell to 1.
    lowest = min(float(similarity.min()) for similarity in similarities)
    figure = Figure(figsize=(3.2 * len(anchors) + 1, 3.4), layout="constrained")
    panels = figure.subplots(1, len(anchors), squeeze=False)[0]
    for panel, (row, column), similarity in zip(panels, anchors, similarities):
        image = panel.imshow(similarity, cmap="viridis", vmin=lowest, vmax=1.0)
        panel.plot(column, row, marker="x", color="white")
        panel.set_title(f"cell ({row}, {column})")
        panel.set_xlabel("column")
        panel.set_ylabel("row")
    figure.colorbar(image, ax=list(panels), label="cosine similarity")
    figure.suptitle(
        f"2-D sinusoidal encoding on a {height} x {width} grid (dim={dim})"
    )
    return figure


# The settings `rope_axis_assignment` draws: (title, num_axes, axis_layout,
# axis_sections), for a head of 128 features, 64 rotary pairs.
ROPE_AXIS_HEAD_DIM = 128
ROPE_AXIS_SETTINGS = (
    ("axial blocks (EVA-02), 2 axes", 2, "blocks", None),
    ("alternating (Pixtral), 2 axes", 2, "alternating", None),
    ("M-RoPE sections (Qwen2-VL), t/h/w = 16/24/24", 3, "sections", [16, 24, 24]),
    ("cyclic M-RoPE (Qwen3-VL), t/h/w = 24/20/20", 3, "cyclic", [24, 20, 20]),
)


def rope_axis_assignment(max_wavelength=10000.0):
    """Which axis each rotary pair reads on a grid, and at what frequency.

    One panel per axis layout of `RotaryEmbedding(num_axes=...)`: a bar per
    rotary pair, its height the pair's frequency (log scale), its colour the
    axis it turns with. Axial blocks give every axis the whole range of
    frequencies over a block of its own; M-RoPE sections keep the 1-D
    schedule and give each axis a contiguous run of it, so time gets only
    the fast frequencies and width only the slow ones; the cyclic and
    alternating layouts deal the schedule out to the axes in turn, so every
    axis spans it.

    The head is Qwen2-VL's: 128 features, 64 rotary pairs.

    Args:
        max_wavelength: float. The base of the frequencies. Defaults to
            `10000.0`.

    Returns:
        A `matplotlib.figure.Figure` with one panel per setting of
        `ROPE_AXIS_SETTINGS`.
    """
    ops.check_max_wavelength(max_wavelength)
    rotary_dim = ROPE_AXIS_HEAD_DIM
    pairs = rotary_dim // 2
    figure = Figure(figsize=(9, 7), layout="constrained")
    panels = figure.subplots(len(ROPE_AXIS_SETTINGS), 1, sharex=True)
    colours = ("tab:blue", "tab:orange", "tab:green")
    names = {2: ("row", "column"), 3: ("time", "row", "column")}
    for panel, (title, num_axes, axis_layout, sections) in zip(
        panels, ROPE_AXIS_SETTINGS
    ):
        theta = keras.ops.convert_to_numpy(
            ops.rope_frequency_matrix(
                rotary_dim, num_axes, axis_layout, sections, max_wavelength
            )
        )  # (pairs, num_axes)
        axes = np.argmax(theta, axis=-1)
        frequencies = theta.max(axis=-1)
        for axis in range(num_axes):
            chosen = axes == axis
            panel.bar(
                np.arange(pairs)[chosen],
                frequencies[chosen],
                width=0.85,
                color=colours[axis],
                label=names[num_axes][axis],
            )
        panel.set_yscale("log")
        panel.set_title(title, fontsize="medium")
        panel.set_ylabel("frequency")
        panel.legend(loc="upper right", fontsize="small", ncols=num_axes)
    panels[-1].set_xlabel("rotary pair")
    figure.suptitle(f"RoPE on grids: the axis and frequency of each pair (rotary_dim={rotary_dim})")
    return figure


def save_plots(out_dir, length=128, dim=64):
    """Write the heatmap, the similarity curve and the RoPE wavelengths as PNGs.

    Draws `encoding_heatmap(length, dim)` to `encoding_heatmap.png`,
    `similarity_curve(length, dim)` to `similarity.png` and
    `rope_wavelengths()` (its defaults, a Llama-sized head) to
    `rope_wavelengths.png` in `out_dir`, which is created if needed.

    Args:
        out_dir: str or path-like. The folder to write to.
        length: int. The number of positions. Defaults to `128`.
        dim: int. The encoding width. Defaults to `64`.

    Returns:
        The list of the three written paths, as strings, in that order.
    """
    os.makedirs(out_dir, exist_ok=True)
    figures = {
        "encoding_heatmap.png": encoding_heatmap(length, dim),
        "similarity.png": similarity_curve(length, dim),
        "rope_wavelengths.png": rope_wavelengths(),
    }
    paths = []
    for filename, figure in figures.items():
        path = os.path.join(out_dir, filename)
        figure.savefig(path, dpi=100)
        paths.append(path)
    return paths
