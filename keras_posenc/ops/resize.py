"""Resizing tables on grids: interpolation matrices, as a matmul."""

import keras

from keras_posenc.ops._checks import (
    check_grid_shape,
    check_interpolation,
    check_positive_int,
)
from keras_posenc.ops.positions import grid_positions


def _cubic(distance, a):
    """Keys' cubic convolution kernel at `|distance|`, with parameter `a`."""
    distance = keras.ops.abs(distance)
    near = ((a + 2.0) * distance - (a + 3.0)) * distance * distance + 1.0
    far = ((a * distance - 5.0 * a) * distance + 8.0 * a) * distance - 4.0 * a
    return keras.ops.where(
        distance < 1.0,
        near,
        keras.ops.where(distance < 2.0, far, keras.ops.zeros_like(distance)),
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

    >>> keras.ops.convert_to_numpy(resize_matrix(2, 4, "bilinear")).tolist()
    [[1.0, 0.0], [0.75, 0.25], [0.25, 0.75], [0.0, 1.0]]
    """
    check_positive_int("input_size", input_size)
    check_interpolation(interpolation, allow_none=False)
    scale = keras.ops.cast(input_size, "float32") / keras.ops.cast(
        output_size, "float32"
    )
    outputs = keras.ops.arange(output_size, dtype="float32")[:, None]  # (out, 1)
    inputs = keras.ops.arange(input_size, dtype="float32")[None]  # (1, in)
    if antialias:
        # PyTorch's _upsample_*_aa: a kernel of support 1 (linear) or 2
        # (cubic), stretched by the scale when shrinking.
        stretch = keras.ops.maximum(scale, 1.0)
        distance = (inputs - outputs * scale - 0.5 * scale + 0.5) / stretch
        if interpolation == "bicubic":
            weights = _cubic(distance, -0.5)
        else:
            weights = keras.ops.maximum(1.0 - keras.ops.abs(distance), 0.0)
        return weights / keras.ops.sum(weights, axis=1, keepdims=True)
    source = (outputs + 0.5) * scale - 0.5  # (out, 1)
    if interpolation == "bicubic":
        first = keras.ops.floor(source)
        fraction = source - first
        taps = first + keras.ops.arange(-1.0, 3.0, dtype="float32")  # (out, 4)
        tap_weights = _cubic(taps - source, -0.75)  # (out, 4)
    else:
        source = keras.ops.maximum(source, 0.0)
        first = keras.ops.floor(source)
        fraction = source - first
        taps = first + keras.ops.arange(0.0, 2.0, dtype="float32")  # (out, 2)
        tap_weights = keras.ops.concatenate(
            [1.0 - fraction, fraction], axis=1
        )  # (out, 2)
    taps = keras.ops.clip(taps, 0.0, float(input_size - 1))
    hits = keras.ops.cast(
        keras.ops.equal(taps[:, :, None], inputs[:, None]), "float32"
    )  # (out, taps, in)
    return keras.ops.sum(tap_weights[:, :, None] * hits, axis=1)  # (out, in)


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
    grid = keras.ops.reshape(
        keras.ops.cast(values, "float32"), tuple(grid_shape) + (channels,)
    )  # (*grid_shape, channels)
    for axis, (size, new_size) in enumerate(zip(grid_shape, new_grid_shape)):
        matrix = resize_matrix(size, new_size, interpolation, antialias)
        grid = keras.ops.tensordot(matrix, grid, axes=[[1], [axis]])  # new axis first
        grid = keras.ops.moveaxis(grid, 0, axis)
    return keras.ops.reshape(
        grid, (-1, channels)
    )  # (prod(new_grid_shape), channels)
