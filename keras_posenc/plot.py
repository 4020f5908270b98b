"""Figures of the sinusoidal encoding, drawn with matplotlib.

An optional extra (`pip install keras-posenc[plot]`): `import keras_posenc`
does not import this module. Figures are made with `matplotlib.figure.Figure`
rather than `pyplot`, so they need no display, hold no global state and are
freed like any other object; in a notebook, the returned figure shows itself.
"""

import numbers
import os

import tensorflow as tf

from keras_posenc import ops

try:
    from matplotlib.figure import Figure
except ImportError as error:
    raise ImportError(
        "keras_posenc.plot needs matplotlib. Install it with "
        "`pip install keras-posenc[plot]`."
    ) from error


def encoding_heatmap(
    length=128, dim=64, max_wavelength=10000.0, layout="interleaved"
):
    """A heatmap of the sinusoidal encoding of positions `0 .. length - 1`.

    Row `p` is `keras_posenc.ops.sinusoidal(p, dim)`: the fast sines and
    cosines on the left (low features) change at every position, the slow
    ones on the right barely move over the first hundred positions. With
    `layout="interleaved"` the columns alternate sine, cosine; with
    `"concat"` the sines fill the left half and the cosines the right.

    Args:
        length: int. The number of positions, drawn on the y axis. Defaults
            to `128`.
        dim: int. The encoding width, drawn on the x axis. Defaults to `64`.
        max_wavelength: float. The longest wavelength. Defaults to
            `10000.0`.
        layout: str. `"interleaved"` or `"concat"`. Defaults to
            `"interleaved"`.

    Returns:
        A `matplotlib.figure.Figure` with the heatmap and a colorbar.
    """
    ops.check_positive_int("length", length)
    table = ops.sinusoidal(
        tf.range(length), dim, max_wavelength, layout
    )  # (length, dim)
    figure = Figure(figsize=(8, 5), layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(
        table.numpy(),
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
        f"Sinusoidal position encoding ({layout}, dim={dim}, "
        f"max_wavelength={max_wavelength:g})"
    )
    return figure


def similarity_curve(length=128, dim=64, position=None, max_wavelength=10000.0):
    """The dot product of one position's encoding with every position's.

    `sinusoidal(p) . sinusoidal(q)` is a sum of `cos((p - q) w_i)`: it depends
    only on the distance `p - q`, peaks at `p == q` and falls off with
    distance, which is what lets attention tell near positions from far ones.
    (The sum is the same for either layout.)

    Args:
        length: int. The number of positions, drawn on the x axis. Defaults
            to `128`.
        dim: int. The encoding width. Defaults to `64`.
        position: int or None. The position compared with all the others, in
            `0 .. length - 1`. Defaults to `None`, meaning `length // 2`.
        max_wavelength: float. The longest wavelength. Defaults to
            `10000.0`.

    Returns:
        A `matplotlib.figure.Figure` with the curve and a vertical line at
        `position`.
    """
    ops.check_positive_int("length", length)
    if position is None:
        position = length // 2
    if (
        isinstance(position, bool)
        or not isinstance(position, numbers.Integral)
        or not 0 <= position < length
    ):
        raise ValueError(
            f"`position` must be an integer from 0 to length - 1 = "
            f"{length - 1}. Received: position={position!r}"
        )
    table = ops.sinusoidal(
        tf.range(length), dim, max_wavelength
    )  # (length, dim)
    similarity = tf.linalg.matvec(table, table[position])  # (length,)
    figure = Figure(figsize=(8, 4), layout="constrained")
    axes = figure.add_subplot()
    axes.plot(range(length), similarity.numpy(), label="dot product")
    axes.axvline(
        position, color="tab:red", linestyle="--", label=f"position {position}"
    )
    axes.set_xlabel("position")
    axes.set_ylabel(f"dot product with position {position}")
    axes.set_title(
        f"Similarity of position {position} to every position (dim={dim})"
    )
    axes.legend()
    return figure


def save_plots(out_dir, length=128, dim=64):
    """Write the heatmap and the similarity curve as PNG files.

    Draws `encoding_heatmap(length, dim)` to `encoding_heatmap.png` and
    `similarity_curve(length, dim)` to `similarity.png` in `out_dir`, which
    is created if needed.

    Args:
        out_dir: str or path-like. The folder to write to.
        length: int. The number of positions. Defaults to `128`.
        dim: int. The encoding width. Defaults to `64`.

    Returns:
        The list of the two written paths, as strings.
    """
    os.makedirs(out_dir, exist_ok=True)
    figures = {
        "encoding_heatmap.png": encoding_heatmap(length, dim),
        "similarity.png": similarity_curve(length, dim),
    }
    paths = []
    for filename, figure in figures.items():
        path = os.path.join(out_dir, filename)
        figure.savefig(path, dpi=100)
        paths.append(path)
    return paths
