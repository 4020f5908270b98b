"""Rotary embeddings: rotations, cos/sin tables, axes of grids."""

import keras

from keras_posenc.ops import _backend
from keras_posenc.ops._checks import (
    AXIS_LAYOUTS,
    check_axis_layout,
    check_pairing,
    check_positive_int,
)
from keras_posenc.ops._renamed import renamed_arguments
from keras_posenc.ops.sinusoidal import (
    angles,
    inverse_frequencies,
)


@renamed_arguments({"layout": "pairing", "phases": "angles"})
def rotate(inputs, angles, pairing="half"):
    """Turn each pair of features by an angle: the rotary position embedding.

    Pair `i` of the last axis, `(a, b)`, turned by the angle `t = angles[i]`
    becomes `(a cos t - b sin t, b cos t + a sin t)`, computed in the
    element-wise form `inputs * cos + rotate(inputs) * sin` of Su et al.
    (2021), eq. 34, never with a rotation matrix. With `pairing="half"`
    (GPT-NeoX, Llama, Hugging Face, keras-hub) feature `i` pairs with
    `i + d / 2`; with `pairing="interleaved"` (RoFormer, GPT-J) feature `2i`
    pairs with `2i + 1`.

    Args:
        inputs: float tensor of shape `(..., d)`, `d` even.
        angles: tensor of shape `(..., d / 2)`, one angle per pair,
            broadcastable against `inputs[..., : d / 2]`, in the dtype of
            `inputs`.
        pairing: `"half"` or `"interleaved"`: which features form a pair.
            Defaults to `"half"`.

    Returns:
        A tensor of the shape and dtype of `inputs`.

    Example:

    >>> x = np.array([[1.0, 0.0, 2.0, 0.0]], "float32")  # pairs (1, 0), (2, 0)
    >>> quarter_and_half_turn = np.array([[np.pi / 2, np.pi]], "float32")
    >>> turned = rotate(x, quarter_and_half_turn, "interleaved")
    >>> np.round(keras.ops.convert_to_numpy(turned), 6) + 0.0
    array([[ 0.,  1., -2.,  0.]], dtype=float32)
    """
    check_pairing(pairing)
    inputs = keras.ops.convert_to_tensor(inputs)
    angles = keras.ops.convert_to_tensor(angles)
    if _backend.computes_tables_apart():
        # One cosine and one sine per pair, each a tensor of its own
        # (`_backend.computed_apart`), then laid out per feature.
        cosines, sines = (
            _full_width(_backend.computed_apart(table), pairing)
            for table in (keras.ops.cos(angles), keras.ops.sin(angles))
        )  # (..., d) each
    else:
        # The angles laid out at full width before cos and sin, which lets
        # XLA fuse the whole rotation into one loop over the inputs.
        angles = _full_width(angles, pairing)  # (..., d)
        cosines, sines = keras.ops.cos(angles), keras.ops.sin(angles)
    return inputs * cosines + _turned(inputs, pairing) * sines


def _full_width(pairs, pairing):
    """One value per pair `(..., d / 2)` laid out per feature `(..., d)`."""
    if pairing == "half":
        return keras.ops.concatenate([pairs, pairs], axis=-1)
    return keras.ops.repeat(pairs, 2, axis=-1)


def _turned(inputs, pairing):
    """Each pair `(a, b)` of `inputs` as `(-b, a)`: the quarter turn."""
    if pairing == "half":
        first, second = keras.ops.split(inputs, 2, axis=-1)  # (..., d / 2) each
        return keras.ops.concatenate([-second, first], axis=-1)  # (..., d)
    shape = keras.ops.shape(inputs)  # static sizes, tensors where unknown
    pairs = keras.ops.reshape(
        inputs, (*shape[:-1], inputs.shape[-1] // 2, 2)
    )  # (..., d / 2, 2)
    return keras.ops.reshape(
        keras.ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), shape
    )


@renamed_arguments({"layout": "pairing"})
def rotate_by_tables(inputs, cos, sin, pairing="half"):
    """`rotate` with the cosines and sines of the angles given.

    Args:
        inputs: float tensor of shape `(..., d)`, `d` even.
        cos: tensor of shape `(..., d / 2)`, the cosine of each pair's
            angle, broadcastable against `inputs[..., : d / 2]`, in the
            dtype of `inputs`.
        sin: tensor like `cos`, the sine of each pair's angle.
        pairing: `"half"` or `"interleaved"`: which features form a pair.
            Defaults to `"half"`.

    Returns:
        A tensor of the shape and dtype of `inputs`.
    """
    check_pairing(pairing)
    inputs = keras.ops.convert_to_tensor(inputs)
    cos = keras.ops.convert_to_tensor(cos)
    sin = keras.ops.convert_to_tensor(sin)
    return inputs * _full_width(cos, pairing) + _turned(
        inputs, pairing
    ) * _full_width(sin, pairing)


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
    frequencies = keras.ops.cast(frequencies, "float32")
    steps = angles(
        keras.ops.arange(length, dtype="int32"), frequencies
    )  # (length, f): n w
    table = keras.ops.concatenate(
        [keras.ops.cos(steps), keras.ops.sin(steps)], axis=-1
    )  # (length, 2f)
    start = keras.ops.cast(start_index, "float32") * frequencies  # (f,): s w
    # Diagonal matrices by a select on the identity's pattern, not
    # `keras.ops.diag`, which Keras 3.8 wraps in a `tf.cond` of unknown
    # output shape (XLA then cannot split the product below).
    diagonal = keras.ops.eye(frequencies.shape[0], dtype="bool")  # (f, f)
    cos_start = keras.ops.where(diagonal, keras.ops.cos(start)[None], 0.0)  # (f, f): C
    sin_start = keras.ops.where(diagonal, keras.ops.sin(start)[None], 0.0)  # (f, f): S
    rotation = keras.ops.concatenate(
        [
            keras.ops.concatenate([cos_start, sin_start], axis=1),
            keras.ops.concatenate([-sin_start, cos_start], axis=1),
        ],
        axis=0,
    )  # (2f, 2f)
    cos, sin = keras.ops.split(
        keras.ops.matmul(table, rotation), 2, axis=-1
    )  # (length, f) each
    return cos, sin


@renamed_arguments(values={"axis_layout": {"interleaved": "cyclic"}})
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
    - `"cyclic"`: pair `i` reads axis `i % num_axes` and keeps place `i`
      (Qwen3-VL's M-RoPE, which its config calls interleaved). With `axis_sections`, as Qwen3-VL
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
        if axis_layout != "cyclic" and num_pairs % num_axes:
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
    if axis_layout == "cyclic":
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


@renamed_arguments(values={"axis_layout": {"interleaved": "cyclic"}})
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
    >>> # two blocks, each with the schedule of width 4
    >>> keras.ops.convert_to_numpy(theta).tolist()
    [[1.0, 0.0], [0.10000000149011612, 0.0], [0.0, 1.0], [0.0, 0.10000000149011612]]
    """
    axes, places, widths = rope_pair_axes(
        rotary_dim // 2, num_axes, axis_layout, axis_sections
    )
    frequencies = keras.ops.stack(
        [
            inverse_frequencies(width, max_wavelength)[place]
            for place, width in zip(places, widths)
        ]
    )  # (pairs,)
    return (
        keras.ops.one_hot(axes, num_axes, dtype="float32") * frequencies[:, None]
    )  # (pairs, num_axes)


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

    >>> theta = np.array([[1.0, 0.0], [0.0, 0.5]], "float32")
    >>> keras.ops.convert_to_numpy(grid_angles(np.array([[2, 4]]), theta))
    array([[2., 2.]], dtype=float32)
    """
    positions = keras.ops.cast(positions, "float32")
    frequency_matrix = keras.ops.cast(frequency_matrix, "float32")
    for _ in range(len(frequency_matrix.shape) - 1):
        positions = keras.ops.expand_dims(positions, -2)  # (..., [1,] 1, num_axes)
    return keras.ops.sum(
        positions * frequency_matrix, axis=-1
    )  # (..., [heads,] pairs)
