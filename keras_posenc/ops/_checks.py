"""The validators of the ops' and the layers' arguments: plain Python, no tensors."""

import math
import numbers

import keras
import numpy as np

from keras_posenc.ops import _backend

PAIRINGS = ("interleaved", "half")


def check_pairing(pairing):
    """Raise a `ValueError` unless `pairing` names which features form a pair.

    `"interleaved"` pairs feature `2i` with `2i + 1`, `"half"` pairs feature
    `i` with `i + d / 2`: a (sin, cos) pair of a sinusoidal encoding, or the
    two features that a rotary embedding turns together.
    """
    if pairing not in PAIRINGS:
        raise ValueError(
            f"`pairing` must be one of {PAIRINGS}. Received: pairing={pairing!r}"
        )


def check_rotary_dim(rotary_dim):
    """Raise a `ValueError` unless `rotary_dim` is None or a positive even int."""
    check_positive_int("rotary_dim", rotary_dim, allow_none=True)
    if rotary_dim is not None and rotary_dim % 2:
        raise ValueError(
            "`rotary_dim` must be even: features are rotated in pairs. "
            f"Received: rotary_dim={rotary_dim}"
        )


def check_sequence_and_feature_axes(sequence_axis, feature_axis):
    """Raise a `ValueError` unless the two axes are two different ints."""
    for name, axis in (
        ("sequence_axis", sequence_axis),
        ("feature_axis", feature_axis),
    ):
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(
                f"`{name}` must be an integer. Received: {name}={axis!r}"
            )
    if sequence_axis == feature_axis:
        raise ValueError(
            "`sequence_axis` and `feature_axis` must differ. Received: "
            f"sequence_axis={sequence_axis}, feature_axis={feature_axis}"
        )


def rotary_axes(input_shape, sequence_axis, feature_axis, rotary_dim=None):
    """Where a rotation reads inputs of `input_shape`, or a `ValueError`.

    The rotation turns the first `rotary_dim` features (all of them for
    None) in pairs, by the positions along `sequence_axis`.

    Args:
        input_shape: tuple. The inputs' shape.
        sequence_axis: int. The axis of positions, negative from the end.
        feature_axis: int. The axis of features, likewise.
        rotary_dim: int or None. The rotated features. Defaults to `None`.

    Returns:
        A tuple `(sequence_axis, feature_axis, rotated)`: both axes
        non-negative, and the number of rotated features.

    Example:

    >>> rotary_axes((2, 5, 4, 16), 1, -1, rotary_dim=8)
    (1, 3, 8)
    """
    rank = len(input_shape)
    axes = []
    for name, axis in (
        ("sequence_axis", sequence_axis),
        ("feature_axis", feature_axis),
    ):
        if not -rank <= axis < rank:
            raise ValueError(
                f"`{name}` is out of range for inputs of rank {rank}. "
                f"Received: {name}={axis}, inputs of shape "
                f"{tuple(input_shape)}"
            )
        axes.append(axis % rank)
    if axes[0] == axes[1]:
        raise ValueError(
            "`sequence_axis` and `feature_axis` name the same axis of "
            f"inputs of shape {tuple(input_shape)}. Received: "
            f"sequence_axis={sequence_axis}, feature_axis={feature_axis}"
        )
    features = input_shape[axes[1]]
    if features is None:
        raise ValueError(
            "A rotation needs the feature dimension of its inputs to be "
            f"known. Received inputs of shape {tuple(input_shape)}"
        )
    rotated = features if rotary_dim is None else rotary_dim
    if rotated % 2:
        raise ValueError(
            "Features are rotated in pairs, so the feature dimension must be "
            "even (or set an even `rotary_dim`). Received inputs of shape "
            f"{tuple(input_shape)}"
        )
    if rotated > features:
        raise ValueError(
            "`rotary_dim` must not exceed the feature dimension of the "
            f"inputs. Received: rotary_dim={rotary_dim}, inputs of shape "
            f"{tuple(input_shape)}"
        )
    return axes[0], axes[1], rotated


def check_number_above_one(name, value):
    """Raise a `ValueError` naming `name` unless `value` is a finite number above 1."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not value > 1
        or not math.isfinite(value)
    ):
        raise ValueError(
            f"`{name}` must be a finite number greater than 1. "
            f"Received: {name}={value!r}"
        )


def check_positive_number(name, value):
    """Raise a `ValueError` naming `name` unless `value` is a finite number above 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(
            f"`{name}` must be a positive number. Received: {name}={value!r}"
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


def check_bool(name, value):
    """Raise a `ValueError` unless `value` is a bool.

    Args:
        name: str. The argument's name, for the message.
        value: the value received.
    """
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be a bool. Received: {name}={value!r}")


def check_num_axes(num_axes):
    """Raise a `ValueError` unless `num_axes` is a positive int."""
    check_positive_int("num_axes", num_axes)


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
        if keras.ops.is_tensor(size):
            return _backend.is_integer(size) and len(size.shape) == 0
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
            keras.ops.is_tensor(value)
            and _backend.is_integer(value)
            and len(value.shape) == 0
        )
    ):
        raise ValueError(
            f"`{name}` must be an integer or an integer scalar tensor. "
            f"Received: {name}={value!r}"
        )


# Rotary position embedding on grids: which axis each pair reads.

AXIS_LAYOUTS = ("blocks", "sections", "cyclic", "alternating")


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
    check_bool("bidirectional", bidirectional)
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


def check_graph_dtype(name, dtype):
    """Raise a `ValueError` unless `dtype` holds numbers: float, integer or bool.

    Args:
        name: str. `"adjacency"` (edge weights) or `"inputs"` (the nodes'
            features), for the message.
        dtype: str. The dtype as given (NumPy's name for strings, which a
            backend would parse or refuse when it converts them).
    """
    if not (dtype == "bool" or dtype.startswith(("int", "uint", "float", "bfloat"))):
        what = "the nodes' features" if name == "inputs" else "edge weights"
        raise ValueError(
            f"`{name}` must be {what}: float, integer or bool. Received: "
            f"{name} of dtype {dtype}"
        )


def check_adjacency_shape(shape, num_nodes=None):
    """Raise a `ValueError` unless `shape` is `(batch, nodes, nodes)`.

    Args:
        shape: tuple (`None` for an unknown size), or TensorFlow's
            `TensorShape`, or None for an unknown rank. The adjacency's
            shape, as known.
        num_nodes: int or None. The number of nodes the inputs have, when
            known. Defaults to `None`.
    """
    rank = _rank(shape)
    if rank is not None:
        shape = tuple(shape)
    # The sizes known of the two node axes and of the inputs' nodes.
    sizes = set()
    if rank == 3:
        sizes = {size for size in (shape[1], shape[2], num_nodes) if size is not None}
    if rank != 3 or len(sizes) > 1:
        nodes = "nodes" if num_nodes is None else num_nodes
        raise ValueError(
            f"`adjacency` must have shape (batch, {nodes}, {nodes}): one row "
            "and one column per node. Received: adjacency of shape "
            f"{shape}"
        )


def _rank(shape):
    """The number of axes of `shape`, or None where it is unknown."""
    if shape is None:
        return None
    try:
        return len(shape)
    except (TypeError, ValueError):  # a TensorShape of unknown rank
        return None


def check_not_text(name, value, expected):
    """Raise a `ValueError` naming `name` where `value` holds text.

    For a call's argument, before Keras converts it: JAX parses strings of
    digits as numbers, TensorFlow's cast refuses them with a message of
    its own. NumPy arrays of strings or objects, and TensorFlow's string
    tensors, are refused; anything else passes.

    Args:
        name: str. The argument's name, for the message.
        value: the argument as given.
        expected: str. What it must hold, for the message: `"floats"`.
    """
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return
    if isinstance(dtype, np.dtype):
        text, shown = dtype.kind in "OSUV", str(dtype)
    else:
        try:
            shown = keras.backend.standardize_dtype(dtype)
        except ValueError:
            shown = str(dtype)
        text = shown == "string"
    if text:
        raise ValueError(
            f"`{name}` must hold {expected}. Received: {name} of dtype {shown}"
        )


def check_mask_shape(name, shape, expected, described, subject=None):
    """A `ValueError` unless a mask's `shape` is `expected`, where sizes are known.

    Args:
        name: str. The mask's argument name (`"query_mask"`, say).
        shape: tuple. The mask's shape.
        expected: tuple. The shape wanted, `None` where unknown.
        described: str. The shape and meaning in words, as the error says
            it (`"(batch, query), here (2, 8), True for the queries that
            attend"`).
        subject: None, or what the error's first words name instead of
            the argument (`"`mask` of LaplacianPositionEncoding"`).
    """
    shape, expected = tuple(shape), tuple(expected)
    if len(shape) != len(expected) or any(
        None not in (size, wanted) and size != wanted
        for size, wanted in zip(shape, expected)
    ):
        raise ValueError(
            f"{subject or f'`{name}`'} must have shape {described}. "
            f"Received: {name} of shape {shape}"
        )

