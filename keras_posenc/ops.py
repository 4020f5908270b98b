"""Pure TensorFlow functions behind the layers: frequencies, angles, tables.

Everything here takes and returns TensorFlow tensors, holds no Keras state and
imports nothing from the rest of the package. Angles and tables are float32;
the layers cast them to their compute dtype at the very end.
"""

import math
import numbers

import tensorflow as tf

LAYOUTS = ("interleaved", "concat")
ROPE_LAYOUTS = ("half", "interleaved")


def check_layout(layout):
    """Raise a `ValueError` unless `layout` is a known sin/cos layout."""
    if layout not in LAYOUTS:
        raise ValueError(
            f"`layout` must be one of {LAYOUTS}. Received: layout={layout!r}"
        )


def check_rope_layout(layout):
    """Raise a `ValueError` unless `layout` is a known rotary pairing."""
    if layout not in ROPE_LAYOUTS:
        raise ValueError(
            f"`layout` must be one of {ROPE_LAYOUTS}. Received: layout={layout!r}"
        )


def check_number_above_one(name, value):
    """Raise a `ValueError` naming `name` unless `value` is a number above 1."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not value > 1
    ):
        raise ValueError(
            f"`{name}` must be a number greater than 1. "
            f"Received: {name}={value!r}"
        )


def check_max_wavelength(max_wavelength):
    """Raise a `ValueError` unless `max_wavelength` is a number above 1."""
    check_number_above_one("max_wavelength", max_wavelength)


def check_positive_int(name, value, allow_none=False):
    """Raise a `ValueError` unless `value` is a positive int (or allowed None).

    Args:
        name: str. The argument's name, for the message.
        value: the value received.
        allow_none: bool. Whether `None` is accepted.
    """
    if value is None and allow_none:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < 1
    ):
        expected = "a positive integer" + (" or None" if allow_none else "")
        raise ValueError(
            f"`{name}` must be {expected}. Received: {name}={value!r}"
        )


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
    exponents = tf.range(0, dim, 2, dtype="float32") / float(dim)
    return tf.pow(tf.constant(1.0 / max_wavelength, "float32"), exponents)


def angles(positions, frequencies):
    """The outer product of positions and frequencies, in float32.

    Args:
        positions: tensor of any shape, integer or float.
        frequencies: float tensor of shape `(num_frequencies,)`.

    Returns:
        A float32 tensor of shape `positions.shape + (num_frequencies,)`.
    """
    positions = tf.cast(positions, "float32")
    frequencies = tf.cast(frequencies, "float32")
    return positions[..., tf.newaxis] * frequencies  # (..., num_frequencies)


def sinusoidal(
    positions, dim, max_wavelength=10000.0, layout="interleaved", num_axes=1
):
    """The sinusoidal position encoding of Vaswani et al. (2017), in float32.

    `PE(p, 2i) = sin(p / max_wavelength ** (2i / dim))` and
    `PE(p, 2i + 1) = cos(p / max_wavelength ** (2i / dim))`.

    With `layout="interleaved"` (the paper's, and keras-hub's
    `SinePositionEncoding`) sines sit at even and cosines at odd features; an
    odd `dim` drops the last cosine, so the last feature is a sine. With
    `layout="concat"` all `dim / 2` sines come first, then all cosines; `dim`
    must then be even.

    With `num_axes` > 1 (a position on a grid, as in MAE) `positions` end in
    an axis of `num_axes` coordinates, and the features split into
    `num_axes` equal blocks: block `a` is this encoding, in `layout`, of
    coordinate `a` with `dim / num_axes` features. `dim` must then be a
    multiple of `num_axes` (of `2 * num_axes` for `layout="concat"`).

    Args:
        positions: tensor of any shape, integer or float, ending in an axis
            of `num_axes` coordinates when `num_axes` > 1. Float positions
            (timestamps, say) are encoded as they are.
        dim: int. The encoding width.
        max_wavelength: float. The longest wavelength. Defaults to `10000.0`.
        layout: `"interleaved"` or `"concat"`. Defaults to `"interleaved"`.
        num_axes: int. The number of coordinates of a position. Defaults to
            `1`.

    Returns:
        A float32 tensor of shape `positions.shape + (dim,)` for one axis,
        `positions.shape[:-1] + (dim,)` for more.

    Example:

    >>> table = sinusoidal(tf.range(4), dim=6)
    >>> table.shape
    TensorShape([4, 6])
    >>> [round(float(v), 4) for v in table[1, :2]]  # sin(1), cos(1)
    [0.8415, 0.5403]
    >>> grid = sinusoidal(grid_positions((2, 3)), dim=8, num_axes=2)
    >>> grid.shape  # (row, column) blocks of 4 features each
    TensorShape([6, 8])
    """
    check_layout(layout)
    check_positive_int("dim", dim)
    check_num_axes(num_axes)
    if num_axes > 1:
        return _sinusoidal_on_axes(
            positions, dim, max_wavelength, layout, num_axes
        )
    if layout == "concat" and dim % 2:
        raise ValueError(
            "`dim` must be even for layout='concat'. "
            f"Received: dim={dim}"
        )
    phases = angles(
        positions, inverse_frequencies(dim, max_wavelength)
    )  # (..., ceil(dim / 2))
    sines, cosines = tf.sin(phases), tf.cos(phases)
    if layout == "concat":
        return tf.concat([sines, cosines], axis=-1)  # (..., dim)
    pairs = tf.stack([sines, cosines], axis=-1)  # (..., ceil(dim / 2), 2)
    table = tf.reshape(
        pairs, tf.concat([tf.shape(phases)[:-1], [2 * phases.shape[-1]]], 0)
    )  # (..., 2 * ceil(dim / 2))
    return table[..., :dim]


def _sinusoidal_on_axes(positions, dim, max_wavelength, layout, num_axes):
    """`sinusoidal` of each coordinate in its own block of `dim / num_axes`."""
    block = 2 * num_axes if layout == "concat" else num_axes
    if dim % block:
        raise ValueError(
            f"`dim` must be a multiple of {block} for num_axes={num_axes} "
            f"and layout={layout!r}. Received: dim={dim}"
        )
    positions = tf.convert_to_tensor(positions)
    if positions.shape.rank is None or positions.shape[-1] != num_axes:
        raise ValueError(
            f"`positions` must end in an axis of {num_axes} coordinates for "
            f"num_axes={num_axes}. Received positions of shape {positions.shape}"
        )
    return tf.concat(
        [
            sinusoidal(positions[..., axis], dim // num_axes, max_wavelength, layout)
            for axis in range(num_axes)
        ],
        axis=-1,
    )  # (..., dim)


def translation_matrix(shift, dim, max_wavelength=10000.0):
    """The matrix `T` with `sinusoidal(p + shift) == sinusoidal(p) @ T`.

    For the interleaved layout each (sin, cos) feature pair turns by the angle
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

    >>> p = tf.constant([3.0, 7.0])
    >>> shifted = sinusoidal(p, 8) @ translation_matrix(5, 8)
    >>> bool(tf.reduce_all(tf.abs(shifted - sinusoidal(p + 5, 8)) < 1e-5))
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
    cosines, sines = tf.cos(phases), tf.sin(phases)
    blocks = tf.stack(
        [tf.stack([cosines, -sines], -1), tf.stack([sines, cosines], -1)], -2
    )  # (..., dim / 2, 2, 2)
    identity = tf.eye(dim // 2, dtype="float32")  # (dim / 2, dim / 2)
    matrix = tf.einsum(
        "ij,...iab->...iajb", identity, blocks
    )  # (..., dim / 2, 2, dim / 2, 2)
    return tf.reshape(
        matrix, tf.concat([tf.shape(phases)[:-1], [dim, dim]], 0)
    )  # (..., dim, dim)


def check_num_axes(num_axes):
    """Raise a `ValueError` unless `num_axes` is a positive int."""
    check_positive_int("num_axes", num_axes)


def _expected_positions(shape, sequence_length, batch_size, per_batch, num_axes):
    """None if positions of `shape` fit, else the shapes that would."""
    rank = shape.rank

    def fits(size, expected):
        return size is None or expected is None or size == expected

    if num_axes == 1:
        if rank == 3 and shape[-1] == 1:
            shape, rank = shape[:-1], 2  # (batch, sequence, 1)
        axes_fit = True
        expected = "(sequence,) or (batch, sequence)" if per_batch else "(sequence,)"
    else:
        axes_fit = rank in (2, 3) and shape[-1] == num_axes
        if axes_fit:
            shape, rank = shape[:-1], rank - 1
        expected = (
            f"(sequence, {num_axes}) or (batch, sequence, {num_axes})"
            if per_batch
            else f"(sequence, {num_axes})"
        ) + f" for num_axes={num_axes}"
    if (
        axes_fit
        and rank in ((1, 2) if per_batch else (1,))
        and fits(shape[-1], sequence_length)
        and (rank == 1 or shape[0] == 1 or fits(shape[0], batch_size))
    ):
        return None
    if sequence_length is not None or batch_size is not None:
        expected += (
            f" for inputs of sequence length {sequence_length} and batch "
            f"size {batch_size}"
        )
    return expected


def read_positions(
    positions,
    num_axes=1,
    sequence_length=None,
    batch_size=None,
    per_batch=True,
    name="positions",
    integer=False,
):
    """Positions as a layer reads them: checked, one form per number of axes.

    The one reader of positions in the package: every layer and attention
    scheme calls it, so each takes the same shapes. A position is a number
    per axis, integer or float. With one axis (text, audio, time) positions
    have shape `(sequence,)` or `(batch, sequence)` (a trailing axis of size
    1 is also taken); with `num_axes` > 1 (image and video grids, multimodal
    sequences) `(sequence, num_axes)` or `(batch, sequence, num_axes)`, such
    as `grid_positions(grid_shape)`.

    Args:
        positions: tensor-like of one of the shapes above.
        num_axes: int. The number of coordinates of a position. Defaults to
            `1`.
        sequence_length: int or None. The inputs' sequence length (the
            tokens that have positions), if known. Defaults to `None`.
        batch_size: int or None. The inputs' batch size, if known. Defaults
            to `None`.
        per_batch: bool. Whether positions may differ along a batch axis.
            Defaults to `True`.
        name: str. The argument's name, for the message. Defaults to
            `"positions"`.
        integer: bool. Whether positions must be integers. Defaults to
            `False`.

    Returns:
        A tensor of shape `(sequence,)` or `(batch, sequence)` for one axis,
        `(sequence, num_axes)` or `(batch, sequence, num_axes)` for more, in
        the dtype given.

    Example:

    >>> read_positions(np.arange(4)).shape
    TensorShape([4])
    >>> read_positions(grid_positions((2, 3)), num_axes=2).shape
    TensorShape([6, 2])
    """
    check_num_axes(num_axes)
    positions = tf.convert_to_tensor(positions)
    if integer and not positions.dtype.is_integer:
        raise ValueError(
            f"`{name}` must be integers. Received: {name} of dtype "
            f"{positions.dtype.name}"
        )
    if not (positions.dtype.is_integer or positions.dtype.is_floating):
        raise ValueError(
            f"`{name}` must be integers or floats. Received: {name} of dtype "
            f"{positions.dtype.name}"
        )
    expected = _expected_positions(
        positions.shape, sequence_length, batch_size, per_batch, num_axes
    )
    if expected:
        raise ValueError(
            f"`{name}` must have shape {expected}. Received: {name} of dtype "
            f"{positions.dtype.name} and shape {positions.shape}"
        )
    if num_axes == 1 and positions.shape.rank == 3:
        positions = positions[..., 0]  # (batch, sequence)
    return positions


def grid_positions(grid_shape):
    """The coordinates of every cell of a grid, row-major, in int32.

    For `(height, width)`: `(0, 0), (0, 1), ..., (0, width - 1), (1, 0),
    ...`, the order in which a ViT flattens its patches (row, then column);
    for `(time, height, width)`, frame by frame. Sizes may be ints or integer
    scalar tensors (a grid whose size is known only when the graph runs).

    Args:
        grid_shape: list or tuple of positive ints or integer scalar tensors.

    Returns:
        An int32 tensor of shape `(prod(grid_shape), len(grid_shape))`.

    Example:

    >>> grid_positions((2, 3)).numpy().tolist()
    [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    check_grid_shape(grid_shape)
    coordinates = tf.meshgrid(
        *[tf.range(size, dtype="int32") for size in grid_shape], indexing="ij"
    )  # num_axes of grid_shape
    return tf.reshape(
        tf.stack(coordinates, axis=-1), [-1, len(grid_shape)]
    )  # (prod(grid_shape), num_axes)


def check_grid_shape(grid_shape, name="grid_shape", num_axes=None):
    """Raise a `ValueError` unless `grid_shape` is a list of grid sizes.

    Args:
        grid_shape: the value received: a list or tuple of positive ints or
            integer scalar tensors.
        name: str. The argument's name, for the message. Defaults to
            `"grid_shape"`.
        num_axes: int or None. The number of sizes it must have, if known.
            Defaults to `None`.
    """

    def is_size(size):
        if tf.is_tensor(size):
            return size.dtype.is_integer and size.shape.rank == 0
        return (
            isinstance(size, numbers.Integral)
            and not isinstance(size, bool)
            and size >= 1
        )

    if (
        not isinstance(grid_shape, (list, tuple))
        or not grid_shape
        or not all(is_size(size) for size in grid_shape)
        or (num_axes is not None and len(grid_shape) != num_axes)
    ):
        sizes = "" if num_axes is None else f"{num_axes} "
        raise ValueError(
            f"`{name}` must be a list or tuple of {sizes}positive integers, "
            f"one per grid axis. Received: {name}={grid_shape!r}"
        )


def check_integer_scalar(name, value):
    """Raise a `ValueError` unless `value` is an int or an integer scalar tensor.

    Args:
        name: str. The argument's name, for the message.
        value: the argument.
    """
    if isinstance(value, bool) or not (
        isinstance(value, numbers.Integral)
        or (
            tf.is_tensor(value)
            and value.dtype.is_integer
            and value.shape.rank == 0
        )
    ):
        raise ValueError(
            f"`{name}` must be an integer or an integer scalar tensor. "
            f"Received: {name}={value!r}"
        )


def position_ids(sequence_length, start_index=0):
    """Positions `start_index, ..., start_index + sequence_length - 1`.

    Args:
        sequence_length: int or scalar integer tensor.
        start_index: int or scalar integer tensor. Defaults to `0`.

    Returns:
        An int32 tensor of shape `(sequence_length,)`.
    """
    check_integer_scalar("start_index", start_index)
    return tf.range(sequence_length, dtype="int32") + tf.cast(
        start_index, "int32"
    )


def rotate(inputs, phases, layout="half"):
    """Turn each pair of features by an angle: the rotary position embedding.

    Pair `i` of the last axis, `(a, b)`, turned by the angle `t = phases[i]`
    becomes `(a cos t - b sin t, b cos t + a sin t)`, computed in the
    element-wise form `inputs * cos + rotate(inputs) * sin` of Su et al.
    (2021), eq. 34, never with a rotation matrix. With `layout="half"`
    (GPT-NeoX, Llama, Hugging Face, keras-hub) feature `i` pairs with
    `i + d / 2`; with `layout="interleaved"` (RoFormer, GPT-J) feature `2i`
    pairs with `2i + 1`.

    Args:
        inputs: float tensor of shape `(..., d)`, `d` even.
        phases: tensor of shape `(..., d / 2)`, one angle per pair,
            broadcastable against `inputs[..., : d / 2]`, in the dtype of
            `inputs`.
        layout: `"half"` or `"interleaved"`. Defaults to `"half"`.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Example:

    >>> x = tf.constant([[1.0, 0.0, 2.0, 0.0]])  # pairs (1, 0) and (2, 0)
    >>> quarter_and_half_turn = tf.constant([[np.pi / 2, np.pi]])
    >>> turned = rotate(x, quarter_and_half_turn, "interleaved")
    >>> np.round(turned.numpy(), 6) + 0.0
    array([[ 0.,  1., -2.,  0.]], dtype=float32)
    """
    check_rope_layout(layout)
    # The angles are laid out at full width before cos and sin, which lets
    # XLA fuse the whole rotation into one loop over the inputs.
    phases = _full_width(phases, layout)  # (..., d)
    return inputs * tf.cos(phases) + _turned(inputs, layout) * tf.sin(phases)


def _full_width(pairs, layout):
    """One value per pair `(..., d / 2)` laid out per feature `(..., d)`."""
    if layout == "half":
        return tf.concat([pairs, pairs], axis=-1)
    return tf.repeat(pairs, 2, axis=-1)


def _turned(inputs, layout):
    """Each pair `(a, b)` of `inputs` as `(-b, a)`: the quarter turn."""
    if layout == "half":
        first, second = tf.split(inputs, 2, axis=-1)  # (..., d / 2) each
        return tf.concat([-second, first], axis=-1)  # (..., d)
    shape = tf.shape(inputs)
    pairs = tf.reshape(inputs, tf.concat([shape[:-1], [-1, 2]], 0))  # (..., d / 2, 2)
    return tf.reshape(tf.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), shape)


def rotate_by_tables(inputs, cos, sin, layout="half"):
    """`rotate` with the cosines and sines of the angles given.

    Args:
        inputs: float tensor of shape `(..., d)`, `d` even.
        cos: tensor of shape `(..., d / 2)`, the cosine of each pair's
            angle, broadcastable against `inputs[..., : d / 2]`, in the
            dtype of `inputs`.
        sin: tensor like `cos`, the sine of each pair's angle.
        layout: `"half"` or `"interleaved"`. Defaults to `"half"`.

    Returns:
        A tensor of the shape and dtype of `inputs`.
    """
    check_rope_layout(layout)
    return inputs * _full_width(cos, layout) + _turned(inputs, layout) * _full_width(
        sin, layout
    )


def shifted_cos_sin(length, start_index, frequencies):
    """cos and sin of `(start_index + n) * frequencies`, `n = 0 .. length - 1`.

    Turning by `(s + n) w` is turning by `n w`, then by `s w`. By the
    angle-sum formulas, with `C = diag(cos s w)` and `S = diag(sin s w)`
    over the frequencies,

        [cos, sin]((s + n) w) = [cos, sin](n w) @ [[C, S], [-S, C]],

    a table fixed once the length is, times one `(2f, 2f)` matrix holding a
    2 x 2 rotation per frequency: the sines computed at run time are those
    of `s w` alone.

    Written as `cos((s + n) w)` with a start read at run time, XLA fuses the
    sines into the rotation that reads them and computes each one again for
    every batch row and head it is broadcast over. A matrix product is not
    fused into what reads it: XLA makes the table once, and the rotation
    reads it.

    Args:
        length: int or scalar integer tensor. How many positions.
        start_index: int or scalar integer tensor. The first position.
        frequencies: float tensor of shape `(f,)`.

    Returns:
        `(cos, sin)`: float32 tensors of shape `(length, f)`.
    """
    frequencies = tf.cast(frequencies, "float32")
    steps = angles(tf.range(length), frequencies)  # (length, f): n w
    table = tf.concat([tf.cos(steps), tf.sin(steps)], axis=-1)  # (length, 2f)
    start = tf.cast(start_index, "float32") * frequencies  # (f,): s w
    cos_start = tf.linalg.diag(tf.cos(start))  # (f, f): C
    sin_start = tf.linalg.diag(tf.sin(start))  # (f, f): S
    rotation = tf.concat(
        [
            tf.concat([cos_start, sin_start], axis=1),
            tf.concat([-sin_start, cos_start], axis=1),
        ],
        axis=0,
    )  # (2f, 2f)
    cos, sin = tf.split(tf.matmul(table, rotation), 2, axis=-1)  # (length, f) each
    return cos, sin


# Rotary position embedding on grids (issue 14): which axis each pair reads.

AXIS_LAYOUTS = ("blocks", "sections", "interleaved", "alternating")


def check_axis_layout(axis_layout, num_axes, axis_sections=None):
    """Raise a `ValueError` unless these describe a rotary layout of axes.

    Checks what is known before the width: the layout's name, and that
    `axis_sections`, if given, holds one positive int per axis. Whether the
    sections fit the rotary pairs is checked by `rope_pair_axes`.

    Args:
        axis_layout: str. One of `AXIS_LAYOUTS`.
        num_axes: int. The number of coordinates of a position.
        axis_sections: list of ints or None. Pairs per axis.
    """
    check_num_axes(num_axes)
    if axis_layout not in AXIS_LAYOUTS:
        raise ValueError(
            f"`axis_layout` must be one of {AXIS_LAYOUTS}. "
            f"Received: axis_layout={axis_layout!r}"
        )
    if axis_sections is None:
        return
    if axis_layout == "alternating":
        raise ValueError(
            "`axis_sections` cannot be given with axis_layout='alternating', "
            "which deals the frequencies to the axes in turn, an equal share "
            f"each. Received: axis_sections={axis_sections!r}"
        )
    if (
        not isinstance(axis_sections, (list, tuple))
        or len(axis_sections) != num_axes
        or not all(
            isinstance(size, numbers.Integral)
            and not isinstance(size, bool)
            and size >= 1
            for size in axis_sections
        )
    ):
        raise ValueError(
            f"`axis_sections` must be a list of {num_axes} positive integers "
            f"(num_axes={num_axes}), the rotary pairs of each axis. "
            f"Received: axis_sections={axis_sections!r}"
        )


def rope_pair_axes(num_pairs, num_axes, axis_layout="blocks", axis_sections=None):
    """The axis that each rotary pair reads, and its place in its schedule.

    Pair `i` turns by `Theta[i, axis[i]] * p[axis[i]]` (see
    `rope_frequency_matrix`). With `num_axes=1` every layout gives every
    pair to axis 0 at its own place in one schedule: 1-D RoPE.

    - `"blocks"`: contiguous blocks of `axis_sections[a]` pairs (equal
      blocks by default), block `a` reading axis `a` with a schedule of its
      own over its width (axial RoPE, as EVA-02).
    - `"sections"`: contiguous sections read the axes in turn, as in
      `"blocks"`, but pair `i` keeps place `i` of one schedule over the
      whole width (Qwen2-VL's M-RoPE, `mrope_section`).
    - `"interleaved"`: pair `i` reads axis `i % num_axes` and keeps place `i`
      (Qwen3-VL's interleaved M-RoPE). With `axis_sections`, as Qwen3-VL
      does: axis `a >= 1` reads the pairs `i = a, a + n, ...` below
      `n * axis_sections[a]`, and axis 0 every other pair.
    - `"alternating"`: contiguous equal blocks, as `"blocks"`, but the one
      schedule's places are dealt to the axes in turn: pair `j` of block `a`
      takes place `n * j + a` (Pixtral).

    Args:
        num_pairs: int. The number of rotary pairs, `rotary_dim / 2`.
        num_axes: int. The number of coordinates of a position.
        axis_layout: str. One of `AXIS_LAYOUTS`. Defaults to `"blocks"`.
        axis_sections: list of ints or None. Pairs per axis; must sum to
            `num_pairs`. `None` shares them equally. Defaults to `None`.

    Returns:
        A tuple `(axes, places, widths)` of lists of `num_pairs` ints: the
        axis pair `i` reads, its place in its schedule, and that schedule's
        width in features.

    Example:

    >>> rope_pair_axes(6, 2, "blocks")
    ([0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2], [6, 6, 6, 6, 6, 6])
    >>> rope_pair_axes(6, 2, "alternating")[:2]
    ([0, 0, 0, 1, 1, 1], [0, 2, 4, 1, 3, 5])
    """
    check_positive_int("num_pairs", num_pairs)
    check_axis_layout(axis_layout, num_axes, axis_sections)
    if axis_sections is None:
        if axis_layout != "interleaved" and num_pairs % num_axes:
            raise ValueError(
                f"axis_layout={axis_layout!r} with num_axes={num_axes} splits "
                f"the {num_pairs} rotary pairs (rotary width "
                f"{2 * num_pairs}) equally between the axes, but {num_pairs} "
                f"is not divisible by {num_axes}: pass `axis_sections`, "
                "pairs per axis, or a rotary width of a multiple of "
                f"{2 * num_axes}. Received: axis_sections=None"
            )
        sections = [num_pairs // num_axes] * num_axes
    else:
        sections = list(axis_sections)
        if sum(sections) != num_pairs:
            raise ValueError(
                f"`axis_sections` must sum to the number of rotary pairs, "
                f"{num_pairs} (half the rotary width {2 * num_pairs}). "
                f"Received: axis_sections={axis_sections!r}"
            )
    if axis_layout == "interleaved":
        axes = [0] * num_pairs
        for axis in range(1, num_axes):
            count = (
                len(range(axis, num_pairs, num_axes))
                if axis_sections is None
                else sections[axis]
            )
            last = axis + num_axes * (count - 1)
            if last >= num_pairs:
                raise ValueError(
                    f"`axis_sections` gives axis {axis} {count} pairs, but "
                    f"interleaved it can read at most "
                    f"{len(range(axis, num_pairs, num_axes))} of the "
                    f"{num_pairs} rotary pairs (every {num_axes}th from pair "
                    f"{axis}). Received: axis_sections={axis_sections!r}"
                )
            for pair in range(axis, last + 1, num_axes):
                axes[pair] = axis
        return axes, list(range(num_pairs)), [2 * num_pairs] * num_pairs
    axes = [axis for axis, size in enumerate(sections) for _ in range(size)]
    if axis_layout == "blocks":
        places = [place for size in sections for place in range(size)]
        widths = [2 * size for size in sections for _ in range(size)]
        return axes, places, widths
    if axis_layout == "sections":
        return axes, list(range(num_pairs)), [2 * num_pairs] * num_pairs
    places = [  # alternating
        num_axes * place + axis
        for axis, size in enumerate(sections)
        for place in range(size)
    ]
    return axes, places, [2 * num_pairs] * num_pairs


def rope_frequency_matrix(
    rotary_dim,
    num_axes,
    axis_layout="blocks",
    axis_sections=None,
    max_wavelength=10000.0,
):
    """RoPE's frequencies on a grid: `Theta` of shape `(pairs, num_axes)`.

    Pair `i` turns by the angle `sum_a Theta[i, a] * p_a` for a position
    `p` with one coordinate per axis. Each pair reads one axis here:
    `Theta[i, axes[i]]` is place `places[i]` of the geometric schedule
    `inverse_frequencies(widths[i], max_wavelength)` and the rest of the row
    is 0 (see `rope_pair_axes` for the layouts). With `num_axes=1` the only
    column is `inverse_frequencies(rotary_dim, max_wavelength)`.

    Args:
        rotary_dim: int. The rotated width, even.
        num_axes: int. The number of coordinates of a position.
        axis_layout: str. One of `AXIS_LAYOUTS`. Defaults to `"blocks"`.
        axis_sections: list of ints or None. Pairs per axis, summing to
            `rotary_dim / 2`; `None` shares them equally. Defaults to `None`.
        max_wavelength: float. The base of the frequencies. Defaults to
            `10000.0`.

    Returns:
        A float32 tensor of shape `(rotary_dim / 2, num_axes)`.

    Example:

    >>> theta = rope_frequency_matrix(8, 2, "blocks", max_wavelength=100.0)
    >>> theta.numpy().tolist()  # two blocks, each with the schedule of width 4
    [[1.0, 0.0], [0.10000000149011612, 0.0], [0.0, 1.0], [0.0, 0.10000000149011612]]
    """
    axes, places, widths = rope_pair_axes(
        rotary_dim // 2, num_axes, axis_layout, axis_sections
    )
    frequencies = tf.stack(
        [
            inverse_frequencies(width, max_wavelength)[place]
            for place, width in zip(places, widths)
        ]
    )  # (pairs,)
    return tf.one_hot(axes, num_axes, dtype="float32") * frequencies[:, tf.newaxis]


def grid_angles(positions, frequency_matrix):
    """RoPE's angles on a grid, `sum_a Theta[..., i, a] * p_a`, in float32.

    Multiplied and summed element-wise, not with a matrix product, which a
    GPU may round to TensorFloat-32 (10 bits of mantissa): the angles stay
    as exact as float32 at grid coordinates in the thousands.

    Args:
        positions: tensor of shape `(..., num_axes)`, integer or float.
        frequency_matrix: float tensor of shape `(pairs, num_axes)`, or
            `(heads, pairs, num_axes)` for frequencies per head.

    Returns:
        A float32 tensor of shape `positions.shape[:-1] + (pairs,)`, or
        `positions.shape[:-1] + (heads, pairs)`.

    Example:

    >>> theta = tf.constant([[1.0, 0.0], [0.0, 0.5]])
    >>> grid_angles(tf.constant([[2, 4]]), theta).numpy()
    array([[2., 2.]], dtype=float32)
    """
    positions = tf.cast(positions, "float32")
    frequency_matrix = tf.cast(frequency_matrix, "float32")
    for _ in range(frequency_matrix.shape.rank - 1):
        positions = positions[..., tf.newaxis, :]  # (..., [1,] 1, num_axes)
    return tf.reduce_sum(
        positions * frequency_matrix, axis=-1
    )  # (..., [heads,] pairs)


def multimodal_positions(segments, spatial_merge_size=1):
    """Qwen2-VL's M-RoPE positions `(t, h, w)` of a text and vision sequence.

    A Python-side helper (run it where the inputs are prepared, not in a
    graph). Text tokens take one position on all three axes, counting on
    from the previous token; an image or video takes the grid of its merged
    patches, `(frame, row, column)`, each coordinate offset by the position
    where the grid starts; the text after it continues from the largest
    position so far plus one (Wang et al. 2024, section 2.1), as in
    transformers' `Qwen2VLModel.get_rope_index` for one unpadded sequence.
    transformers 5 advances past a video by its merged `max(h, w)`, leaving
    out its frames: the two agree on images and on videos of no more frames
    than merged rows or columns. Qwen2.5-VL's spacing of video frames by
    `tokens_per_second` is not applied.

    Args:
        segments: list. In sequence order, each an int `n`, `n` text tokens,
            or a tuple `(t, h, w)` of positive ints, a grid of patches as
            `image_grid_thw` or `video_grid_thw` give it (before the spatial
            merge; `t = 1` for an image): `t * (h / m) * (w / m)` tokens,
            frame by frame, row-major, for `m = spatial_merge_size`.
        spatial_merge_size: int. How many patches along each spatial axis
            the vision encoder merges into one token (2 in Qwen2-VL's
            `vision_config`). Defaults to `1`.

    Returns:
        An int32 tensor of shape `(sequence, 3)`.

    Example:

    >>> t, h, w = multimodal_positions([2, (1, 4, 6), 1], 2).numpy().T
    >>> t.tolist()  # two text tokens, a 2 x 3 grid of merged patches, text
    [0, 1, 2, 2, 2, 2, 2, 2, 5]
    >>> h.tolist()
    [0, 1, 2, 2, 2, 3, 3, 3, 5]
    >>> w.tolist()
    [0, 1, 2, 3, 4, 2, 3, 4, 5]
    """
    check_positive_int("spatial_merge_size", spatial_merge_size)
    if not isinstance(segments, (list, tuple)) or not segments:
        raise ValueError(
            "`segments` must be a non-empty list of text lengths (ints) and "
            f"vision grids ((t, h, w) tuples). Received: segments={segments!r}"
        )
    positions = []  # (t, h, w) per token
    start = 0
    for segment in segments:
        if isinstance(segment, numbers.Integral) and not isinstance(segment, bool):
            check_positive_int("text length in `segments`", segment)
            positions += [(start + step,) * 3 for step in range(segment)]
            start += segment
            continue
        if (
            not isinstance(segment, (list, tuple))
            or len(segment) != 3
            or not all(
                isinstance(size, numbers.Integral)
                and not isinstance(size, bool)
                and size >= 1
                for size in segment
            )
            or segment[1] % spatial_merge_size
            or segment[2] % spatial_merge_size
        ):
            raise ValueError(
                "Each entry of `segments` must be a positive int (text "
                "tokens) or a tuple (t, h, w) of positive ints whose h and w "
                f"are multiples of spatial_merge_size={spatial_merge_size}. "
                f"Received: {segment!r} in segments={segments!r}"
            )
        frames, rows, columns = segment
        rows //= spatial_merge_size
        columns //= spatial_merge_size
        positions += [
            (start + frame, start + row, start + column)
            for frame in range(frames)
            for row in range(rows)
            for column in range(columns)
        ]
        start += max(frames, rows, columns)  # the largest position + 1
    return tf.constant(positions, "int32")  # (sequence, 3)


def alibi_slopes(num_heads):
    """The slopes of ALiBi's attention biases, one per head, in float32.

    As in the authors' code (Press et al. 2022, section 3): for `num_heads`
    a power of two, the geometric sequence `2 ** (-8 * h / num_heads)` for
    `h = 1 .. num_heads`, from `2 ** (-8 / num_heads)` down to `2 ** -8`.
    Otherwise the slopes of the closest power of two below, `c`, followed by
    every other slope of `2 * c` (its first, third, fifth...), the first
    `num_heads - c` of them, so that the slopes still spread over the same
    range.

    Args:
        num_heads: int. The number of attention heads.

    Returns:
        A float32 tensor of shape `(num_heads,)`.

    Example:

    >>> [float(slope) for slope in alibi_slopes(8)]  # 1/2, 1/4, ..., 1/256
    [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
    >>> [float(slope) for slope in alibi_slopes(3)]  # 2 heads', then 4's first
    [0.0625, 0.00390625, 0.25]
    """
    check_positive_int("num_heads", num_heads)
    closest = 2 ** (num_heads.bit_length() - 1)  # the power of two <= num_heads
    exponents = [-8.0 * h / closest for h in range(1, closest + 1)]
    # Odd h of the next power, 2 * closest: slopes between those above.
    exponents += [
        -8.0 * h / (2 * closest) for h in range(1, 2 * (num_heads - closest), 2)
    ]
    return tf.constant([2.0**exponent for exponent in exponents], "float32")


def relative_distance_shape(query_shape, key_shape, num_axes=1):
    """The shape `relative_distance` gives for positions of these shapes.

    Args:
        query_shape: tuple. The shape of `query_positions`, `(query,)` or
            `(batch or 1, query)`, with a last axis of `num_axes` when it is
            more than 1; sizes may be None.
        key_shape: tuple. The shape of `key_positions`, likewise.
        num_axes: int. The number of coordinates of a position. Defaults to
            `1`.

    Returns:
        A tuple `(batch or 1, query, key)`, and `num_axes` last when it is
        more than 1; the batch is None when unknown.
    """
    if num_axes > 1:
        query_shape, key_shape = tuple(query_shape)[:-1], tuple(key_shape)[:-1]
    batches = [
        shape[0] if len(shape) == 2 else 1 for shape in (query_shape, key_shape)
    ]
    unshared = [batch for batch in batches if batch != 1]
    known = [batch for batch in unshared if batch is not None]
    batch = known[0] if known else (None if unshared else 1)
    axes = (num_axes,) if num_axes > 1 else ()
    return (batch, query_shape[-1], key_shape[-1]) + axes


def relative_distance(query_positions, key_positions, num_axes=1):
    """The relative position `key - query` of every query and key, in int32.

    The convention of every relative scheme here: a key `j` positions after
    the query `i` is at `j - i > 0`, one before it at `j - i < 0`. On a grid
    (`num_axes` > 1) the difference is taken per axis.

    Args:
        query_positions: integer tensor of shape `(batch or 1, query)`, or
            `(query,)` for positions shared by the batch; with `num_axes` >
            1, `(batch or 1, query, num_axes)` or `(query, num_axes)`.
        key_positions: integer tensor of shape `(batch or 1, key)`, or
            `(key,)`; likewise with a last axis of `num_axes`.
        num_axes: int. The number of coordinates of a position. Defaults to
            `1`.

    Returns:
        An int32 tensor of shape `(batch or 1, query, key)`, or
        `(batch or 1, query, key, num_axes)` when `num_axes` > 1.

    Example:

    >>> relative_distance([[10]], [[0, 1, 9, 10]]).numpy()  # cached decoding
    array([[[-10,  -9,  -1,   0]]], dtype=int32)
    >>> relative_distance(tf.range(3), tf.range(2)).shape
    TensorShape([1, 3, 2])
    >>> on_grid = relative_distance(grid_positions((2, 2)), [[1, 1]], num_axes=2)
    >>> on_grid[0, :, 0].numpy().tolist()  # key (1, 1) from each query
    [[1, 1], [1, 0], [0, 1], [0, 0]]
    """
    check_num_axes(num_axes)
    checked = []
    for name, positions in (
        ("query_positions", query_positions),
        ("key_positions", key_positions),
    ):
        positions = read_positions(
            positions, num_axes, name=name, integer=True
        )  # ([batch,] sequence[, num_axes])
        if positions.shape.rank == (1 if num_axes == 1 else 2):
            positions = positions[tf.newaxis]  # (1, sequence[, num_axes])
        checked.append(tf.cast(positions, "int32"))
    query_positions, key_positions = checked
    query_batch, key_batch = query_positions.shape[0], key_positions.shape[0]
    if (
        None not in (query_batch, key_batch)
        and 1 not in (query_batch, key_batch)
        and query_batch != key_batch
    ):
        raise ValueError(
            "`query_positions` and `key_positions` must have the same batch "
            f"size, or 1. Received: query_positions of shape "
            f"{query_positions.shape}, key_positions of shape "
            f"{key_positions.shape}"
        )
    return (
        key_positions[:, tf.newaxis, :] - query_positions[:, :, tf.newaxis]
    )  # (batch or 1, query, key[, num_axes])


def clipped_distance_rows(query_positions, key_positions, max_distance, batch_size=None):
    """Rows `clip(j - i, -k, k) + k` of a table of the `2k + 1` clipped distances.

    Shaw et al.'s tables (and T5's buckets, all alike past `max_distance`)
    are read by the relative distance clipped to `k = max_distance`.

    Args:
        query_positions: integer tensor, as `relative_distance` takes it.
        key_positions: integer tensor, as `relative_distance` takes it.
        max_distance: int. The clipping distance `k`.
        batch_size: None, or int or scalar integer tensor: the batch the
            rows are broadcast to, one row of indices per batch element.
            Defaults to `None`.

    Returns:
        An int32 tensor of shape `(batch or 1, query, key)`, or `(batch_size,
        query, key)`, each entry in `[0, 2k]`.

    Example:

    >>> clipped_distance_rows([[10]], [[0, 8, 10, 11, 20]], 2).numpy()
    array([[[0, 0, 2, 3, 4]]], dtype=int32)
    """
    rows = (
        tf.clip_by_value(
            relative_distance(query_positions, key_positions),
            -max_distance,
            max_distance,
        )
        + max_distance
    )  # (batch or 1, query, key)
    if batch_size is None:
        return rows
    shape = tf.shape(rows)
    return tf.broadcast_to(rows, [batch_size, shape[1], shape[2]])


def check_relative_position_buckets(num_buckets, max_distance, bidirectional):
    """Raise a `ValueError` unless these make a working T5 bucketing.

    Each direction needs at least one exactly-placed bucket, `max_exact =
    buckets_per_direction // 2 >= 1`, and `max_distance` must exceed it, or
    the log-spaced buckets, `log(distance / max_exact) /
    log(max_distance / max_exact)`, are undefined.

    Args:
        num_buckets: int. The number of buckets; at least 2, or, if
            `bidirectional`, even and at least 4 (half per direction).
        max_distance: int. Greater than `max_exact`: `num_buckets // 4` if
            `bidirectional`, else `num_buckets // 2`.
        bidirectional: bool.
    """
    if not isinstance(bidirectional, bool):
        raise ValueError(
            "`bidirectional` must be a bool. "
            f"Received: bidirectional={bidirectional!r}"
        )
    check_positive_int("num_buckets", num_buckets)
    if bidirectional and (num_buckets < 4 or num_buckets % 2):
        raise ValueError(
            "`num_buckets` must be even and at least 4 when bidirectional: "
            "half the buckets hold each direction. "
            f"Received: num_buckets={num_buckets}"
        )
    if num_buckets < 2:
        raise ValueError(
            f"`num_buckets` must be at least 2. Received: num_buckets={num_buckets}"
        )
    check_positive_int("max_distance", max_distance)
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"`max_distance` must be greater than {max_exact}, the number of "
            "exactly placed distances per direction "
            f"(num_buckets={num_buckets}, bidirectional={bidirectional}). "
            f"Received: max_distance={max_distance}"
        )


def _log_bucket_starts(num_buckets, max_exact, max_distance):
    """The smallest distance of each log-spaced bucket past `max_exact`.

    Mesh TensorFlow's bucket of a distance `n >= max_exact` is
    `max_exact + int(log(n / max_exact) / log(max_distance / max_exact) *
    (num_buckets - max_exact))`, a nondecreasing function of `n`; this finds
    where it reaches each of `max_exact + 1 .. num_buckets - 1`, in Python
    float64, near `max_exact * (max_distance / max_exact) ** (k / (num_buckets
    - max_exact))`.

    Returns:
        A list of `num_buckets - max_exact - 1` nondecreasing ints.
    """
    log_ratio = math.log(max_distance / max_exact)
    num_log_buckets = num_buckets - max_exact

    def bucket(distance):
        return max_exact + int(
            math.log(distance / max_exact) / log_ratio * num_log_buckets
        )

    starts = []
    start = max_exact
    for target in range(max_exact + 1, num_buckets):
        estimate = max_exact * math.exp(
            log_ratio * (target - max_exact) / num_log_buckets
        )
        lowest = start
        start = max(start, math.floor(estimate) - 1)
        while bucket(start) < target:
            start += 1
        while start > lowest and bucket(start - 1) >= target:
            start -= 1
        # Positions are int32: a start beyond is never reached.
        starts.append(min(start, 2**31 - 1))
    return starts


def relative_position_bucket(
    relative_position, bidirectional=True, num_buckets=32, max_distance=128
):
    """T5's bucket of each relative position `key - query`, in int32.

    As Mesh TensorFlow's and Hugging Face's `_relative_position_bucket`
    (Raffel et al. 2020, section 2.1). With `bidirectional=True` (encoders)
    half the buckets hold keys at or before the query and half the keys
    after it; with `bidirectional=False` (decoders) all buckets hold keys at
    or before the query and every later key falls in bucket 0. Within a
    direction of `b` buckets, distances `0 .. b // 2 - 1` each have their own
    bucket; longer ones share buckets whose widths grow logarithmically up to
    `max_distance`, and every distance from `max_distance` on falls in the
    last bucket. As in T5, bidirectional bucket `num_buckets // 2` (distance
    0 after the query) is never used.

    The distances where each log-spaced bucket starts are found once, in
    Python, from Mesh TensorFlow's formula, and the graph only compares
    integers with them: the buckets are the same eagerly, under XLA and on
    every device. A float32 log in the graph puts a distance that falls
    exactly on a boundary, such as 40 with 128 buckets and `max_distance=50`,
    in a bucket one lower under XLA than eagerly.

    Args:
        relative_position: integer tensor of any shape, `key - query`.
        bidirectional: bool. Whether keys after the query get buckets of
            their own. Defaults to `True`.
        num_buckets: int. The number of buckets; at least 2, or, if
            `bidirectional`, even and at least 4. Defaults to `32`.
        max_distance: int. The distance from which all fall in the last
            bucket of their direction. Must be greater than the exactly
            placed distances per direction, `num_buckets // 4` if
            `bidirectional`, else `num_buckets // 2`. Defaults to `128`.

    Returns:
        An int32 tensor of the shape of `relative_position`, with values in
        `0 .. num_buckets - 1`.

    Example:

    >>> relative_position_bucket(tf.constant([-200, -20, -1, 0, 1, 20, 200])).numpy()
    array([15, 10,  1,  0, 17, 26, 31], dtype=int32)
    >>> relative_position_bucket(
    ...     tf.constant([-20, -1, 0, 1, 20]), bidirectional=False
    ... ).numpy()
    array([17,  1,  0,  0,  0], dtype=int32)
    """
    check_relative_position_buckets(num_buckets, max_distance, bidirectional)
    relative_position = tf.convert_to_tensor(relative_position)
    if not relative_position.dtype.is_integer:
        raise ValueError(
            "`relative_position` must be an integer tensor. Received: "
            f"relative_position of dtype {relative_position.dtype.name}"
        )
    relative_position = tf.cast(relative_position, "int32")
    if bidirectional:
        num_buckets //= 2
        # Keys after the query take the upper half of the buckets.
        offset = tf.cast(relative_position > 0, "int32") * num_buckets
        distance = tf.abs(relative_position)
    else:
        offset = 0
        distance = -tf.minimum(relative_position, 0)  # later keys: 0
    max_exact = num_buckets // 2
    log_bucket = tf.fill(tf.shape(distance), max_exact)
    for start in _log_bucket_starts(num_buckets, max_exact, max_distance):
        log_bucket += tf.cast(distance >= start, "int32")
    return offset + tf.where(distance < max_exact, distance, log_bucket)


INTERPOLATIONS = ("linear", "bilinear", "bicubic")


def check_interpolation(interpolation, allowed=INTERPOLATIONS, allow_none=True):
    """Raise a `ValueError` unless `interpolation` is one of `allowed`."""
    if interpolation is None and allow_none:
        return
    if interpolation not in allowed:
        choices = tuple(allowed) + ((None,) if allow_none else ())
        raise ValueError(
            f"`interpolation` must be one of {choices}. "
            f"Received: interpolation={interpolation!r}"
        )


def _cubic(distance, a):
    """Keys' cubic convolution kernel at `|distance|`, with parameter `a`."""
    distance = tf.abs(distance)
    near = ((a + 2.0) * distance - (a + 3.0)) * distance * distance + 1.0
    far = ((a * distance - 5.0 * a) * distance + 8.0 * a) * distance - 4.0 * a
    return tf.where(
        distance < 1.0, near, tf.where(distance < 2.0, far, tf.zeros_like(distance))
    )


def resize_matrix(input_size, output_size, interpolation="bicubic", antialias=False):
    """The matrix that resamples `input_size` values to `output_size`, in float32.

    PyTorch's convention, `torch.nn.functional.interpolate(x, size=...,
    mode=..., align_corners=False)`, the one timm's `resample_abs_pos_embed`
    and Hugging Face's `interpolate_pos_encoding` resize position tables
    with: output `o` reads the input at `(o + 0.5) * input_size /
    output_size - 0.5`. `"linear"` and `"bilinear"` (the same along one
    axis) mix its two neighbours, the position first clamped at 0;
    `"bicubic"` mixes four with Keys' cubic kernel at `a = -0.75`, indices
    clamped at the edges. `tf.image.resize`'s bicubic uses `a = -0.5` and
    gives other numbers.

    With `antialias=True` (timm's default) the kernel is PyTorch's
    antialiasing one, as Pillow's: `a = -0.5` for bicubic, stretched by the
    scale when shrinking, each row's weights normalised to sum to 1 over the
    inputs it covers.

    Args:
        input_size: int. The number of input values (static).
        output_size: int or integer scalar tensor.
        interpolation: `"linear"`, `"bilinear"` or `"bicubic"`. Defaults to
            `"bicubic"`.
        antialias: bool. PyTorch's `antialias=True`. Defaults to `False`.

    Returns:
        A float32 tensor `M` of shape `(output_size, input_size)`: resized
        values are `M @ values`.

    Example:

    >>> resize_matrix(2, 4, "bilinear").numpy().tolist()
    [[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]]
    """
    check_positive_int("input_size", input_size)
    check_interpolation(interpolation, allow_none=False)
    scale = tf.cast(input_size, "float32") / tf.cast(output_size, "float32")
    outputs = tf.range(output_size, dtype="float32")[:, tf.newaxis]  # (out, 1)
    inputs = tf.range(input_size, dtype="float32")[tf.newaxis]  # (1, in)
    if antialias:
        # PyTorch's _upsample_*_aa: a kernel of support 1 (linear) or 2
        # (cubic), stretched by the scale when shrinking.
        stretch = tf.maximum(scale, 1.0)
        distance = (inputs - outputs * scale - 0.5 * scale + 0.5) / stretch
        if interpolation == "bicubic":
            weights = _cubic(distance, -0.5)
        else:
            weights = tf.maximum(1.0 - tf.abs(distance), 0.0)
        return weights / tf.reduce_sum(weights, axis=1, keepdims=True)
    source = (outputs + 0.5) * scale - 0.5  # (out, 1)
    if interpolation == "bicubic":
        first = tf.floor(source)
        fraction = source - first
        taps = first + tf.range(-1.0, 3.0)  # (out, 4)
        tap_weights = _cubic(taps - source, -0.75)  # (out, 4)
    else:
        source = tf.maximum(source, 0.0)
        first = tf.floor(source)
        fraction = source - first
        taps = first + tf.range(0.0, 2.0)  # (out, 2)
        tap_weights = tf.concat([1.0 - fraction, fraction], axis=1)  # (out, 2)
    taps = tf.clip_by_value(taps, 0.0, float(input_size - 1))
    hits = tf.cast(
        tf.equal(taps[:, :, tf.newaxis], inputs[:, tf.newaxis]), "float32"
    )  # (out, taps, in)
    return tf.reduce_sum(tap_weights[:, :, tf.newaxis] * hits, axis=1)  # (out, in)


def resize_grid(values, grid_shape, new_grid_shape, interpolation="bicubic", antialias=False):
    """Resample values laid out on a grid to another grid, axis by axis.

    `values` holds one row per grid cell in row-major order (a position
    table's rows, as `grid_positions` orders them); each axis is resampled
    with `resize_matrix`, which for two axes is PyTorch's 2-D
    `interpolate(..., align_corners=False)` (separable, as PyTorch computes
    it).

    Args:
        values: float tensor of shape `(prod(grid_shape), channels)`.
        grid_shape: list of ints. The grid the rows of `values` cover.
        new_grid_shape: list of ints or integer scalar tensors, as many.
        interpolation: `"linear"`, `"bilinear"` or `"bicubic"`. Defaults to
            `"bicubic"`.
        antialias: bool. PyTorch's `antialias=True`. Defaults to `False`.

    Returns:
        A float32 tensor of shape `(prod(new_grid_shape), channels)`.
    """
    check_grid_shape(grid_shape)
    check_grid_shape(new_grid_shape, "new_grid_shape", num_axes=len(grid_shape))
    channels = values.shape[-1]
    grid = tf.reshape(
        tf.cast(values, "float32"), list(grid_shape) + [channels]
    )  # (*grid_shape, channels)
    for axis, (size, new_size) in enumerate(zip(grid_shape, new_grid_shape)):
        matrix = resize_matrix(size, new_size, interpolation, antialias)
        grid = tf.tensordot(matrix, grid, axes=[[1], [axis]])  # new axis first
        grid = tf.experimental.numpy.moveaxis(grid, 0, axis)
    return tf.reshape(grid, [-1, channels])  # (prod(new_grid_shape), channels)


def grid_relative_position_index(relative_position, grid_shape):
    """Swin's row, in a table of every relative position in a window, of each.

    A window of `grid_shape` `(w_1, ..., w_n)` spans `2 w_a - 1` distances
    along axis `a`, `prod(2 w_a - 1)` relative positions in all; Swin's
    table (Liu et al. 2021, section 3.2) holds one row per relative
    position, in row-major order of `query - key + w_a - 1` per axis, as its
    `relative_position_index` reads it. Distances beyond `w_a - 1` either way
    are clipped per axis, so that positions on a larger grid read the rows of
    the window's edge.

    Args:
        relative_position: integer tensor of shape `(..., num_axes)`: `key -
            query` per axis, as `relative_distance` gives it.
        grid_shape: list or tuple of positive ints, one per axis: the
            window.

    Returns:
        An int32 tensor of shape `(...)`, each entry in `[0, prod(2 w_a -
        1))`.

    Example:

    >>> grid_relative_position_index(
    ...     [[0, 0], [1, 0], [-1, 0], [0, -1], [5, 5]], (2, 2)
    ... ).numpy().tolist()
    [4, 1, 7, 5, 0]
    """
    check_grid_shape(grid_shape)
    relative_position = tf.cast(relative_position, "int32")  # (..., num_axes)
    index = tf.zeros(tf.shape(relative_position)[:-1], "int32")  # (...)
    for axis, size in enumerate(grid_shape):
        # Swin's `coords_q - coords_k`, shifted to start from 0.
        shifted = tf.clip_by_value(
            -relative_position[..., axis], 1 - size, size - 1
        ) + (size - 1)  # (...)
        stride = math.prod(2 * later - 1 for later in grid_shape[axis + 1 :])
        index += shifted * stride
    return index  # (...)


# Graphs: a batch of graphs is a dense adjacency `(batch, nodes, nodes)`,
# `adjacency[b, i, j]` the weight of the edge from node i to node j (0 for
# none), with an optional node mask `(batch, nodes)` for padded batches.

LAPLACIAN_NORMALIZATIONS = ("sym", None)


def check_laplacian_normalization(normalization):
    """Raise a `ValueError` unless `normalization` names a Laplacian here."""
    if normalization not in LAPLACIAN_NORMALIZATIONS:
        raise ValueError(
            f"`normalization` must be one of {LAPLACIAN_NORMALIZATIONS}: "
            "'sym' for I - D^-1/2 A D^-1/2, None for D - A. "
            f"Received: normalization={normalization!r}"
        )


def _first_bad_entry(adjacency, symmetric):
    """Why a NumPy adjacency is refused, or None: the first bad entry named."""
    import numpy as np

    for condition, what in (
        (~np.isfinite(adjacency), "finite"),
        (adjacency < 0, "non-negative"),
    ):
        if condition.any():
            index = tuple(int(i) for i in np.argwhere(condition)[0])
            return f"entries must be {what}; adjacency{list(index)}={adjacency[index]}"
    if symmetric:
        asymmetric = adjacency != np.swapaxes(adjacency, -1, -2)
        if asymmetric.any():
            b, i, j = (int(i) for i in np.argwhere(asymmetric)[0])
            return (
                "it must be symmetric (an undirected graph); "
                f"adjacency[{b}, {i}, {j}]={adjacency[b, i, j]} but "
                f"adjacency[{b}, {j}, {i}]={adjacency[b, j, i]}"
            )
    return None


def check_adjacency_shape(shape, num_nodes=None):
    """Raise a `ValueError` unless `shape` is `(batch, nodes, nodes)`.

    Args:
        shape: tuple or `tf.TensorShape`. The adjacency's shape, as known.
        num_nodes: int or None. The number of nodes the inputs have, when
            known. Defaults to `None`.
    """
    shape = tf.TensorShape(shape)
    # The sizes known of the two node axes and of the inputs' nodes.
    sizes = set()
    if shape.rank == 3:
        sizes = {size for size in (shape[1], shape[2], num_nodes) if size is not None}
    if shape.rank != 3 or len(sizes) > 1:
        nodes = "nodes" if num_nodes is None else num_nodes
        raise ValueError(
            f"`adjacency` must have shape (batch, {nodes}, {nodes}): one row "
            "and one column per node. Received: adjacency of shape "
            f"{tuple(shape) if shape.rank is not None else shape}"
        )


def read_adjacency(adjacency, symmetric=True, num_nodes=None, node_mask=None):
    """`adjacency` as float32 `(batch, nodes, nodes)`, checked, padding removed.

    The shape is checked where it is known, when the graph is traced; the
    entries (finite, non-negative, and symmetric if `symmetric`) when they
    are known then (a constant: a `ValueError`), and otherwise when the
    graph runs (an `InvalidArgumentError`), except under XLA, which drops
    run-time assertions. Rows and columns of the nodes that `node_mask`
    marks as padding are set to zero: those nodes have no edges.

    Args:
        adjacency: float, integer or bool tensor of shape `(batch, nodes,
            nodes)`.
        symmetric: bool. Whether the graph must be undirected. Defaults to
            `True`.
        num_nodes: int or None. The number of nodes the inputs have, when
            known. Defaults to `None`.
        node_mask: bool tensor of shape `(batch, nodes)` or None: `True` at
            real nodes. Defaults to `None`, every node real.

    Returns:
        A float32 tensor of shape `(batch, nodes, nodes)`.
    """
    adjacency = tf.convert_to_tensor(adjacency)
    check_adjacency_shape(adjacency.shape, num_nodes)
    adjacency = tf.cast(adjacency, "float32")
    static = tf.get_static_value(adjacency)
    if static is not None:
        problem = _first_bad_entry(static, symmetric)
        if problem is not None:
            raise ValueError(f"`adjacency` is not a graph's: {problem}")
    else:
        # One assertion for all (XLA, which drops them, logs a line for
        # each), its message static (XLA has no strings at run time).
        square = tf.equal(tf.shape(adjacency)[1], tf.shape(adjacency)[2])
        problems = {
            "square": tf.logical_not(square),
            "finite": tf.logical_not(tf.reduce_all(tf.math.is_finite(adjacency))),
            "non-negative": tf.reduce_any(adjacency < 0),
        }
        requirements = "square, (batch, nodes, nodes), with finite, non-negative entries"
        if symmetric:
            problems["symmetric"] = tf.cond(
                square,
                lambda: tf.reduce_any(
                    adjacency != tf.linalg.matrix_transpose(adjacency)
                ),
                lambda: tf.constant(False),
            )
            requirements += ", and symmetric (an undirected graph)"
        failed = tf.stack(list(problems.values()))
        checks = [
            tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(failed)),
                [
                    f"`adjacency` must be {requirements}. Failed, of "
                    f"({', '.join(problems)}):",
                    failed,
                ],
                summarize=len(problems),
            )
        ]
        with tf.control_dependencies(checks):
            adjacency = tf.identity(adjacency)
    if node_mask is not None:
        node_mask = tf.cast(node_mask, "float32")  # (batch, nodes)
        adjacency = adjacency * node_mask[:, :, tf.newaxis] * node_mask[:, tf.newaxis]
    # An encoding of the graph, the model's input: nothing to differentiate.
    return tf.stop_gradient(adjacency)  # (batch, nodes, nodes)


def laplacian(adjacency, normalization="sym"):
    """The graph Laplacian of each graph, self loops ignored.

    `"sym"` gives `I - D^-1/2 A D^-1/2` and `None` gives `D - A`, with `D`
    the diagonal of row sums of `A`, the adjacency without its diagonal, as
    PyTorch Geometric's `get_laplacian` builds them: a node without edges
    has `D^-1/2 = 0`, so its row of the normalized Laplacian is that of the
    identity.

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`, symmetric.
        normalization: `"sym"` or None. Defaults to `"sym"`.

    Returns:
        A float32 tensor of shape `(batch, nodes, nodes)`.

    Example:

    >>> path = [[[0, 1, 0], [1, 0, 1], [0, 1, 0]]]  # 0 - 1 - 2
    >>> laplacian(path, normalization=None).numpy()[0]
    array([[ 1., -1.,  0.],
           [-1.,  2., -1.],
           [ 0., -1.,  1.]], dtype=float32)
    """
    check_laplacian_normalization(normalization)
    adjacency = tf.linalg.set_diag(
        tf.cast(adjacency, "float32"),
        tf.zeros(tf.shape(adjacency)[:-1], "float32"),
    )  # (batch, nodes, nodes), no self loops
    degree = tf.reduce_sum(adjacency, axis=-1)  # (batch, nodes)
    if normalization is None:
        return tf.linalg.diag(degree) - adjacency
    scale = tf.math.divide_no_nan(1.0, tf.sqrt(degree))  # (batch, nodes)
    normalized = adjacency * scale[:, :, tf.newaxis] * scale[:, tf.newaxis]
    return tf.eye(tf.shape(adjacency)[-1], dtype="float32") - normalized


def laplacian_eigenvectors(adjacency, k, normalization="sym", node_mask=None):
    """The eigenvectors of the `k` smallest non-trivial Laplacian eigenvalues.

    As PyTorch Geometric's `AddLaplacianEigenvectorPE` (Dwivedi et al.):
    the eigenvectors sorted by eigenvalue, the first (the constant one, on
    a connected graph) left out, the next `k` kept. A graph of `n` nodes has
    `n - 1` of them: the columns from `n - 1` on are zero, as are padded
    nodes' rows. Computed by `tf.linalg.eigh` in float32, on every device.
    An eigenvector's sign is arbitrary; here its entry of largest magnitude
    is made positive (the first of equal ones), so that a graph gets one
    encoding.

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`, symmetric,
            non-negative.
        k: int. How many eigenvectors.
        normalization: `"sym"` or None, as `laplacian` takes it. Defaults to
            `"sym"`.
        node_mask: bool tensor of shape `(batch, nodes)` or None: `True` at
            real nodes. Defaults to `None`, every node real.

    Returns:
        A tuple `(eigenvalues, eigenvectors)` of float32 tensors of shapes
        `(batch, k)` and `(batch, nodes, k)`.

    Example:

    >>> path = [[[0, 1, 0], [1, 0, 1], [0, 1, 0]]]  # 0 - 1 - 2
    >>> values, vectors = laplacian_eigenvectors(path, k=3)
    >>> np.round(values.numpy(), 4).tolist()  # the third column: no such
    [[1.0, 2.0, 0.0]]
    >>> (np.round(vectors.numpy()[0, :, 0] ** 2, 4) + 0.0).tolist()  # squares
    [0.5, 0.0, 0.5]
    >>> bool(vectors[0, 0, 0] > 0)  # the sign: the largest entry positive
    True
    """
    check_positive_int("k", k)
    adjacency = tf.cast(adjacency, "float32")
    nodes = tf.shape(adjacency)[-1]
    if node_mask is None:
        node_mask = tf.ones(tf.shape(adjacency)[:-1], "bool")
    node_mask = tf.cast(node_mask, "bool")  # (batch, nodes)
    real = tf.cast(node_mask, "float32")
    adjacency = adjacency * real[:, :, tf.newaxis] * real[:, tf.newaxis]
    matrix = laplacian(adjacency, normalization)  # (batch, nodes, nodes)
    # Padded nodes, without edges, are moved past every real eigenvalue (at
    # most 2, or twice the largest degree for D - A): the real eigenvectors,
    # zero on padded nodes, then come first in their order.
    if normalization is None:
        bound = 2.0 * tf.reduce_max(
            tf.reduce_sum(adjacency, axis=-1), axis=-1, keepdims=True
        )  # (batch, 1)
    else:
        bound = tf.fill([tf.shape(adjacency)[0], 1], 2.0)
    matrix = tf.linalg.set_diag(
        matrix, tf.where(node_mask, tf.linalg.diag_part(matrix), bound + 1.0)
    )
    eigenvalues, eigenvectors = tf.linalg.eigh(matrix)  # ascending
    # Columns 1 .. k; a graph of fewer than k + 1 nodes has fewer.
    take = tf.clip_by_value(nodes - 1, 0, k)
    eigenvalues = eigenvalues[:, 1 : 1 + take]  # (batch, take)
    eigenvectors = eigenvectors[:, :, 1 : 1 + take] * real[
        :, :, tf.newaxis
    ]  # (batch, nodes, take)
    columns = tf.range(take)  # (take,)
    exists = columns[tf.newaxis] < tf.reduce_sum(
        tf.cast(node_mask, "int32"), axis=-1, keepdims=True
    ) - 1  # (batch, take)
    largest = tf.gather(
        eigenvectors,
        tf.argmax(tf.abs(eigenvectors), axis=1, output_type="int32"),
        axis=1,
        batch_dims=1,
    )  # (batch, take, take): entry [b, c, c] is column c's largest
    sign = tf.where(tf.linalg.diag_part(largest) < 0, -1.0, 1.0)  # (batch, take)
    sign = tf.where(exists, sign, 0.0)
    eigenvalues = tf.where(exists, eigenvalues, 0.0)
    eigenvectors = eigenvectors * sign[:, tf.newaxis]
    padding = [[0, 0], [0, k - take]]
    eigenvalues = tf.pad(eigenvalues, padding)  # (batch, k)
    eigenvectors = tf.pad(eigenvectors, [[0, 0]] + padding)  # (batch, nodes, k)
    eigenvalues.set_shape(adjacency.shape[:1] + [k])
    eigenvectors.set_shape(adjacency.shape[:2] + [k])
    return eigenvalues, eigenvectors


def random_walk_probabilities(adjacency, steps):
    """Each node's probability of standing on itself after 1 .. `steps` steps.

    The random-walk structural encoding (RWSE, Dwivedi et al. 2022), as
    PyTorch Geometric's `AddRandomWalkPE`: the diagonal of `P^s` for `s = 1
    .. steps`, with `P = D^-1 A` the random walk's transition matrix, `D`
    the row sums of `A` (self loops included). A node without edges has a
    zero row of `P`. On unweighted graphs this is PyTorch Geometric's
    value; on weighted ones PyTorch Geometric gives every edge `1 / degree`,
    whatever its weight, where here an edge's weight weighs its step.

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`,
            non-negative; `adjacency[b, i, j]` weighs the step from `i` to
            `j`.
        steps: int. The longest walk.

    Returns:
        A float32 tensor of shape `(batch, nodes, steps)`.

    Example:

    >>> triangle = [[[0, 1, 1], [1, 0, 1], [1, 1, 0]]]
    >>> random_walk_probabilities(triangle, steps=3).numpy()[0, 0].tolist()
    [0.0, 0.5, 0.25]
    """
    check_positive_int("steps", steps)
    adjacency = tf.cast(adjacency, "float32")
    transition = tf.math.divide_no_nan(
        adjacency, tf.reduce_sum(adjacency, axis=-1, keepdims=True)
    )  # (batch, nodes, nodes): P
    walks = transition  # P^s
    diagonals = [tf.linalg.diag_part(walks)]  # (batch, nodes) each
    for _ in range(steps - 1):
        walks = tf.matmul(walks, transition)
        diagonals.append(tf.linalg.diag_part(walks))
    return tf.stack(diagonals, axis=-1)  # (batch, nodes, steps)


def hop_counts(adjacency, max_distance):
    """Shortest-path hop counts between all nodes, clipped, with unreachable.

    The spatial positions of Graphormer (Ying et al. 2021): the number of
    edges on a shortest path from node `i` to node `j`, an edge where
    `adjacency[b, i, j]` is not zero, clipped to `max_distance`, and
    `max_distance + 1` where no path leads from `i` to `j`. Found by
    boolean matrix products: the nodes within `d` hops are those within `d
    - 1`, and their neighbours (`max_distance - 1` products), and the
    reachable ones by squaring the within-`d` relation until it stops
    growing (about `log2(nodes / max_distance)` more).

    Args:
        adjacency: float tensor of shape `(batch, nodes, nodes)`.
        max_distance: int. The largest hop count told apart.

    Returns:
        An int32 tensor of shape `(batch, nodes, nodes)`, entries in `[0,
        max_distance + 1]`.

    Example:

    >>> path = [[[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]]
    >>> hop_counts(path, max_distance=1).numpy()[0]  # 0 - 1 - 2, and 3
    array([[0, 1, 1, 2],
           [1, 0, 1, 2],
           [1, 1, 0, 2],
           [2, 2, 2, 0]], dtype=int32)
    """
    check_positive_int("max_distance", max_distance)
    adjacency = tf.cast(adjacency, "float32")
    identity = tf.eye(tf.shape(adjacency)[-1], dtype="float32")
    # One step, or staying: 0/1 entries, so products count paths exactly.
    step = tf.cast(tf.logical_or(adjacency != 0, identity > 0), "float32")
    within = tf.broadcast_to(identity, tf.shape(adjacency))  # within 0 hops
    # hops = the number of d in 0 .. max_distance - 1 with j not within d.
    hops = tf.zeros(tf.shape(adjacency), "int32")
    for _ in range(max_distance):
        hops += tf.cast(within == 0, "int32")
        within = tf.cast(tf.matmul(within, step) > 0, "float32")

    def growing(reachable, previous):
        return tf.reduce_any(reachable != previous)

    def square(reachable, previous):
        return tf.cast(tf.matmul(reachable, reachable) > 0, "float32"), reachable

    reachable, _ = tf.while_loop(
        growing, square, (tf.cast(tf.matmul(within, step) > 0, "float32"), within)
    )  # (batch, nodes, nodes): 1 where a path leads from i to j
    return tf.where(reachable > 0, hops, max_distance + 1)
