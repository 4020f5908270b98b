"""Positions: the one reader every layer uses, grids, ids, multimodal ids."""

import numbers

import keras
import numpy as np

from keras_posenc.ops import _backend
from keras_posenc.ops._checks import (
    check_grid_shape,
    check_integer_scalar,
    check_not_text,
    check_num_axes,
    check_positive_int,
)
from keras_posenc.ops._renamed import renamed_arguments


def _expected_positions(shape, length, batch_size, per_batch, num_axes):
    """None if positions of `shape` fit, else the shapes that would."""
    shape = tuple(shape)
    rank = len(shape)

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
        and fits(shape[-1], length)
        and (rank == 1 or shape[0] == 1 or fits(shape[0], batch_size))
    ):
        return None
    if length is not None or batch_size is not None:
        expected += (
            f" for inputs of sequence length {length} and batch "
            f"size {batch_size}"
        )
    return expected


@renamed_arguments({"sequence_length": "length"})
def read_positions(
    positions,
    num_axes=1,
    length=None,
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
        length: int or None. The inputs' sequence length (the
            tokens that have positions), if known. Defaults to `None`.
        batch_size: int or None. The inputs' batch size, if known. Defaults
            to `None`.
        per_batch: bool. Whether positions may differ along a batch axis.
            Defaults to `True`.
        name: str. The argument's name, for the message. Defaults to
            `"positions"`.
        integer: bool. Whether positions must be integers. Defaults to
            `False`.

    Float positions must be finite: NaN or Inf raises a `ValueError` where
    their values are known (eager mode), an `InvalidArgumentError` when a
    TensorFlow graph runs. Compiled code cannot raise: there a position
    that is not finite is made NaN, so that the encoding shows it (an
    infinite one could give finite numbers). Integer positions must fit in
    int32, in which the layers compute them: an int64 position past it
    raises a `ValueError` where known, an `InvalidArgumentError` when a
    TensorFlow graph runs, rather than wrap.

    Returns:
        A tensor of shape `(sequence,)` or `(batch, sequence)` for one axis,
        `(sequence, num_axes)` or `(batch, sequence, num_axes)` for more, in
        the dtype given.

    Example:

    >>> tuple(read_positions(np.arange(4)).shape)
    (4,)
    >>> tuple(read_positions(grid_positions((2, 3)), num_axes=2).shape)
    (6, 2)
    """
    check_num_axes(num_axes)
    check_not_text(name, positions, "integers or floats")
    # The dtype as given: a backend without 64-bit numbers (JAX's default)
    # converts float64 to float32, and the message names what was passed.
    given_dtype = getattr(positions, "dtype", None)
    if (
        given_dtype is not None
        and keras.backend.standardize_dtype(given_dtype) in _WIDER_THAN_INT32
    ):
        # Checked as given: JAX (without 64-bit numbers) converts int64 to
        # int32, wrapping what does not fit.
        positions = _within_int32(positions, name)
    positions = keras.ops.convert_to_tensor(positions)
    dtype = keras.backend.standardize_dtype(
        positions.dtype if given_dtype is None else given_dtype
    )
    is_integer = dtype.startswith(("int", "uint"))
    if keras.backend.standardize_dtype(positions.dtype) in _WIDER_THAN_INT32:
        positions = _within_int32(positions, name)
    if integer and not is_integer:
        raise ValueError(
            f"`{name}` must be integers. Received: {name} of dtype {dtype}"
        )
    if not (is_integer or "float" in dtype):
        raise ValueError(
            f"`{name}` must be integers or floats. Received: {name} of dtype "
            f"{dtype}"
        )
    shape = tuple(positions.shape)
    expected = _expected_positions(
        shape, length, batch_size, per_batch, num_axes
    )
    if expected:
        raise ValueError(
            f"`{name}` must have shape {expected}. Received: {name} of dtype "
            f"{dtype} and shape {shape}"
        )
    if num_axes == 1 and len(shape) == 3:
        positions = positions[..., 0]  # (batch, sequence)
    if is_integer:
        return positions
    finite = keras.ops.isfinite(positions)
    known = _backend.static_value(finite)
    if known is None:
        # Compiled code cannot raise: an infinite position is made NaN,
        # which every encoding shows, where Inf could give finite numbers.
        return _backend.checked_or_nan(
            positions, finite, f"`{name}` must be finite (no NaN or Inf)."
        )
    if not known.all():
        index = tuple(int(i) for i in np.argwhere(~known)[0])
        value = _backend.static_value(positions)[index]
        raise ValueError(
            f"`{name}` must be finite. Received: {name}[{', '.join(map(str, index))}]"
            f"={value} (shape {shape})"
        )
    return positions


# Integer dtypes that hold values past int32, in which positions are
# computed.
_WIDER_THAN_INT32 = ("int64", "uint32", "uint64")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def past_int32(positions):
    """Whether integer positions wider than int32 hold a value past it.

    For compiled code, which cannot raise (`read_positions` raises where
    the values are known): a caller that casts the positions to int32 can
    make its output NaN where this holds, rather than compute at the
    wrapped positions.

    Args:
        positions: tensor of integer positions, any shape.

    Returns:
        A bool scalar tensor where the values are not known; None for
        int32 and narrower dtypes, and where the values are known.
    """
    dtype = keras.backend.standardize_dtype(positions.dtype)
    if dtype not in _WIDER_THAN_INT32 or _backend.static_value(positions) is not None:
        return None
    return keras.ops.logical_not(
        keras.ops.all(_inside_int32(positions))
    )


def check_given(positions, name="positions"):
    """Raise a `ValueError` for positions that a backend would misread.

    For a layer's `__call__`, before Keras converts its NumPy arguments:
    JAX (without 64-bit numbers) wraps an int64 position past int32, and
    parses strings of digits as numbers. `read_positions` checks the
    rest, in `call`.

    Args:
        positions: the argument as given.
        name: str. The argument's name, for the message. Defaults to
            `"positions"`.
    """
    check_not_text(name, positions, "integers or floats")
    if (
        isinstance(positions, np.ndarray)
        and positions.dtype.kind in "iu"
        and positions.size
    ):
        _within_int32(positions, name)


def _inside_int32(positions):
    """Where integer `positions` fit in int32, a bool tensor of their shape."""
    return keras.ops.logical_and(
        keras.ops.greater_equal(positions, _INT32_MIN),
        keras.ops.less_equal(positions, _INT32_MAX),
    )


def _within_int32(positions, name):
    """`positions` (integers), checked to fit in int32.

    A `ValueError` naming the first position past int32 where the values
    are known; in a TensorFlow graph an `InvalidArgumentError` when it
    runs (see `_backend.checked`).
    """
    message = (
        f"`{name}` must fit in int32, from {_INT32_MIN} to {_INT32_MAX}: "
        "positions are computed in int32."
    )
    known = _backend.static_value(positions)
    if known is not None:
        outside = (known < _INT32_MIN) | (known > _INT32_MAX)
        if outside.any():
            index = tuple(int(i) for i in np.argwhere(outside)[0])
            raise ValueError(
                f"{message} Received: {name}[{', '.join(map(str, index))}]="
                f"{known[index]} (dtype {keras.backend.standardize_dtype(known.dtype)})"
            )
        return positions
    return _backend.checked(positions, _inside_int32(positions), message)


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

    >>> keras.ops.convert_to_numpy(grid_positions((2, 3))).tolist()
    [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    check_grid_shape(grid_shape)
    coordinates = keras.ops.meshgrid(
        *[keras.ops.arange(size, dtype="int32") for size in grid_shape],
        indexing="ij",
    )  # num_axes of grid_shape
    return keras.ops.reshape(
        keras.ops.stack(coordinates, axis=-1), (-1, len(grid_shape))
    )  # (prod(grid_shape), num_axes)


@renamed_arguments({"sequence_length": "length"})
def position_ids(length, start_index=0):
    """Positions `start_index, ..., start_index + length - 1`.

    Args:
        length: int or scalar integer tensor.
        start_index: int or scalar integer tensor. Defaults to `0`.

    Returns:
        An int32 tensor of shape `(length,)`.
    """
    check_integer_scalar("start_index", start_index)
    return keras.ops.arange(length, dtype="int32") + keras.ops.cast(
        start_index, "int32"
    )


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

    >>> positions = multimodal_positions([2, (1, 4, 6), 1], 2)
    >>> t, h, w = keras.ops.convert_to_numpy(positions).T
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
    return keras.ops.convert_to_tensor(positions, "int32")  # (sequence, 3)
