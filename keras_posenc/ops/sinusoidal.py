"""Frequencies, angles, sinusoidal tables and the translation matrix."""

import keras

from keras_posenc.ops._checks import (
    check_max_wavelength,
    check_num_axes,
    check_pairing,
    check_positive_int,
)
from keras_posenc.ops._renamed import renamed_arguments
from keras_posenc.ops.positions import grid_positions


def inverse_frequencies(dim, max_wavelength=10000.0):
    """The geometric frequencies `max_wavelength ** (-2i / dim)`, in float32.

    One frequency per sin/cos pair: `ceil(dim / 2)` of them, from 1 down to
    nearly `1 / max_wavelength` (Vaswani et al. 2017, section 3.5).

    Args:
        dim: int. The encoding width.
        max_wavelength: float. The longest wavelength, in positions.

    Returns:
        A float32 tensor of shape `(ceil(dim / 2),)`.
    """
    check_positive_int("dim", dim)
    check_max_wavelength(max_wavelength)
    exponents = keras.ops.arange(0, dim, 2, dtype="float32") / float(dim)
    return keras.ops.power(
        keras.ops.convert_to_tensor(1.0 / max_wavelength, "float32"), exponents
    )


def angles(positions, frequencies):
    """The outer product of positions and frequencies, in float32.

    Args:
        positions: tensor of any shape, integer or float.
        frequencies: float tensor of shape `(num_frequencies,)`.

    Returns:
        A float32 tensor of shape `positions.shape + (num_frequencies,)`.
    """
    positions = keras.ops.cast(positions, "float32")
    frequencies = keras.ops.cast(frequencies, "float32")
    return positions[..., None] * frequencies  # (..., num_frequencies)


@renamed_arguments({"layout": "pairing"}, {"pairing": {"concat": "half"}})
def sinusoidal(
    positions, dim, max_wavelength=10000.0, pairing="interleaved", num_axes=1
):
    """The sinusoidal position encoding of Vaswani et al. (2017), in float32.

    `PE(p, 2i) = sin(p / max_wavelength ** (2i / dim))` and
    `PE(p, 2i + 1) = cos(p / max_wavelength ** (2i / dim))`.

    With `pairing="interleaved"` (the paper's, and keras-hub's
    `SinePositionEncoding`) sines sit at even and cosines at odd features,
    feature `2i` pairing with `2i + 1`; an odd `dim` drops the last cosine,
    so the last feature is a sine. With `pairing="half"` all `dim / 2` sines
    come first, then all cosines, feature `i` pairing with `i + dim / 2`;
    `dim` must then be even.

    With `num_axes` > 1 (a position on a grid, as in MAE) `positions` end in
    an axis of `num_axes` coordinates, and the features split into
    `num_axes` equal blocks: block `a` is this encoding, in `pairing`, of
    coordinate `a` with `dim / num_axes` features. `dim` must then be a
    multiple of `num_axes` (of `2 * num_axes` for `pairing="half"`).

    Args:
        positions: tensor of any shape, integer or float, ending in an axis
            of `num_axes` coordinates when `num_axes` > 1. Float positions
            (timestamps, say) are encoded as they are.
        dim: int. The encoding width.
        max_wavelength: float. The longest wavelength. Defaults to `10000.0`.
        pairing: `"interleaved"` or `"half"`: which features form a
            (sin, cos) pair. Defaults to `"interleaved"`.
        num_axes: int. The number of coordinates of a position. Defaults to
            `1`.

    Returns:
        A float32 tensor of shape `positions.shape + (dim,)` for one axis,
        `positions.shape[:-1] + (dim,)` for more.

    Example:

    >>> table = sinusoidal(keras.ops.arange(4), dim=6)
    >>> tuple(table.shape)
    (4, 6)
    >>> [round(float(v), 4) for v in keras.ops.convert_to_numpy(table[1, :2])]
    [0.8415, 0.5403]
    >>> grid = sinusoidal(grid_positions((2, 3)), dim=8, num_axes=2)
    >>> tuple(grid.shape)  # (row, column) blocks of 4 features each
    (6, 8)
    """
    check_pairing(pairing)
    check_positive_int("dim", dim)
    check_num_axes(num_axes)
    if num_axes > 1:
        return _sinusoidal_on_axes(
            positions, dim, max_wavelength, pairing, num_axes
        )
    if pairing == "half" and dim % 2:
        raise ValueError(
            "`dim` must be even for pairing='half'. "
            f"Received: dim={dim}"
        )
    phases = angles(
        positions, inverse_frequencies(dim, max_wavelength)
    )  # (..., ceil(dim / 2))
    sines, cosines = keras.ops.sin(phases), keras.ops.cos(phases)
    if pairing == "half":
        return keras.ops.concatenate([sines, cosines], axis=-1)  # (..., dim)
    pairs = keras.ops.stack([sines, cosines], axis=-1)  # (..., ceil(dim / 2), 2)
    table = keras.ops.reshape(
        pairs, keras.ops.shape(phases)[:-1] + (2 * phases.shape[-1],)
    )  # (..., 2 * ceil(dim / 2))
    return table[..., :dim]


def _sinusoidal_on_axes(positions, dim, max_wavelength, pairing, num_axes):
    """`sinusoidal` of each coordinate in its own block of `dim / num_axes`."""
    block = 2 * num_axes if pairing == "half" else num_axes
    if dim % block:
        raise ValueError(
            f"`dim` must be a multiple of {block} for num_axes={num_axes} "
            f"and pairing={pairing!r}. Received: dim={dim}"
        )
    positions = keras.ops.convert_to_tensor(positions)
    if positions.ndim in (None, 0) or positions.shape[-1] != num_axes:
        shape = positions.shape if positions.ndim is None else tuple(positions.shape)
        raise ValueError(
            f"`positions` must end in an axis of {num_axes} coordinates for "
            f"num_axes={num_axes}. Received positions of shape {shape}"
        )
    return keras.ops.concatenate(
        [
            sinusoidal(positions[..., axis], dim // num_axes, max_wavelength, pairing)
            for axis in range(num_axes)
        ],
        axis=-1,
    )  # (..., dim)


def translation_matrix(shift, dim, max_wavelength=10000.0):
    """The matrix `T` with `sinusoidal(p + shift) == sinusoidal(p) @ T`.

    For the interleaved pairing each (sin, cos) feature pair turns by the angle
    `shift * w_i`, so `T` is block diagonal with 2x2 rotations
    `[[cos, -sin], [sin, cos]]`: a translation in position is a linear map of
    the encoding, which is why attention can learn relative offsets
    (Vaswani et al. 2017, section 3.5).

    Args:
        shift: scalar or tensor, integer or float. A tensor of shape `S`
            gives a stack of matrices of shape `S + (dim, dim)`.
        dim: int. The encoding width; must be even.
        max_wavelength: float. The longest wavelength. Defaults to `10000.0`.

    Returns:
        A float32 tensor of shape `shift.shape + (dim, dim)`.

    Example:

    >>> p = np.array([3.0, 7.0], "float32")
    >>> shifted = keras.ops.matmul(sinusoidal(p, 8), translation_matrix(5, 8))
    >>> error = keras.ops.abs(shifted - sinusoidal(p + 5, 8))
    >>> bool(keras.ops.all(error < 1e-5))
    True
    """
    check_positive_int("dim", dim)
    if dim % 2:
        raise ValueError(
            f"`dim` must be even for a translation matrix. Received: dim={dim}"
        )
    phases = angles(
        shift, inverse_frequencies(dim, max_wavelength)
    )  # (..., dim / 2)
    cosines, sines = keras.ops.cos(phases), keras.ops.sin(phases)
    blocks = keras.ops.stack(
        [
            keras.ops.stack([cosines, -sines], -1),
            keras.ops.stack([sines, cosines], -1),
        ],
        -2,
    )  # (..., dim / 2, 2, 2)
    identity = keras.ops.eye(dim // 2, dtype="float32")  # (dim / 2, dim / 2)
    matrix = keras.ops.einsum(
        "ij,...iab->...iajb", identity, blocks
    )  # (..., dim / 2, 2, dim / 2, 2)
    return keras.ops.reshape(
        matrix, keras.ops.shape(phases)[:-1] + (dim, dim)
    )  # (..., dim, dim)
