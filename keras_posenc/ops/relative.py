"""Relative positions (key - query), ALiBi slopes, T5 and DeBERTa buckets, grid index."""

import functools
import math

import keras

from keras_posenc.ops import _backend
from keras_posenc.ops._checks import (
    check_grid_shape,
    check_num_axes,
    check_positive_int,
    check_relative_position_buckets,
)
from keras_posenc.ops._renamed import renamed_function
from keras_posenc.ops.positions import (
    grid_positions,
    read_positions,
)


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
    return keras.ops.convert_to_tensor(
        [2.0**exponent for exponent in exponents], "float32"
    )


def relative_position_shape(query_shape, key_shape, num_axes=1):
    """The shape `relative_position` gives for positions of these shapes.

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


def relative_position(query_positions, key_positions, num_axes=1):
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

    >>> keras.ops.convert_to_numpy(
    ...     relative_position([[10]], [[0, 1, 9, 10]])
    ... )  # cached decoding
    array([[[-10,  -9,  -1,   0]]], dtype=int32)
    >>> tuple(relative_position(np.arange(3), np.arange(2)).shape)
    (1, 3, 2)
    >>> on_grid = relative_position(grid_positions((2, 2)), [[1, 1]], num_axes=2)
    >>> keras.ops.convert_to_numpy(on_grid[0, :, 0]).tolist()  # key (1, 1)
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
        if len(positions.shape) == (1 if num_axes == 1 else 2):
            positions = positions[None]  # (1, sequence[, num_axes])
        checked.append(keras.ops.cast(positions, "int32"))
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
            f"{tuple(query_positions.shape)}, key_positions of shape "
            f"{tuple(key_positions.shape)}"
        )
    return (
        key_positions[:, None, :] - query_positions[:, :, None]
    )  # (batch or 1, query, key[, num_axes])


def table_at(table, *indices):
    """The entries of a small table at integer indices, pointwise.

    `table[i, j, ...]` for tensors of indices that broadcast together: the
    one read a scheme's `score_bias` needs, which runs both on whole grids
    of indices and, inside PyTorch's FlexAttention, on one index each.

    Args:
        table: tensor of rank `len(indices)`.
        *indices: integer tensors or Python ints, one per axis of `table`,
            broadcast together, each within its axis.

    Returns:
        A tensor of the indices' broadcast shape.

    Example:

    >>> table = keras.ops.reshape(keras.ops.arange(6, dtype="float32"), (2, 3))
    >>> keras.ops.convert_to_numpy(table_at(table, np.array([[0], [1]]), np.array([2, 0])))
    array([[2., 0.],
           [5., 3.]], dtype=float32)
    """
    if len(indices) != len(table.shape):
        raise ValueError(
            f"`indices` must be one per axis of `table`, {len(table.shape)}. "
            f"Received: {len(indices)} indices"
        )
    return _backend.read_at(table, *indices)


def clipped_distance_rows(query_positions, key_positions, max_distance, batch_size=None):
    """Rows `clip(j - i, -k, k) + k` of a table of the `2k + 1` clipped distances.

    Shaw et al.'s tables (and T5's buckets, all alike past `max_distance`)
    are read by the relative distance clipped to `k = max_distance`.

    Args:
        query_positions: integer tensor, as `relative_position` takes it.
        key_positions: integer tensor, as `relative_position` takes it.
        max_distance: int. The clipping distance `k`.
        batch_size: None, or int or scalar integer tensor: the batch the
            rows are broadcast to, one row of indices per batch element.
            Defaults to `None`.

    Returns:
        An int32 tensor of shape `(batch or 1, query, key)`, or `(batch_size,
        query, key)`, each entry in `[0, 2k]`.

    Example:

    >>> keras.ops.convert_to_numpy(
    ...     clipped_distance_rows([[10]], [[0, 8, 10, 11, 20]], 2)
    ... )
    array([[[0, 0, 2, 3, 4]]], dtype=int32)
    """
    rows = (
        keras.ops.clip(
            relative_position(query_positions, key_positions),
            -max_distance,
            max_distance,
        )
        + max_distance
    )  # (batch or 1, query, key)
    if batch_size is None:
        return rows
    _, queries, keys = keras.ops.shape(rows)
    return keras.ops.broadcast_to(rows, (batch_size, queries, keys))


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

    >>> keras.ops.convert_to_numpy(
    ...     relative_position_bucket(np.array([-200, -20, -1, 0, 1, 20, 200]))
    ... )
    array([15, 10,  1,  0, 17, 26, 31], dtype=int32)
    >>> keras.ops.convert_to_numpy(
    ...     relative_position_bucket(np.array([-20, -1, 0, 1, 20]), bidirectional=False)
    ... )
    array([17,  1,  0,  0,  0], dtype=int32)
    """
    check_relative_position_buckets(num_buckets, max_distance, bidirectional)
    # The dtype as given: JAX's default converts float64 to float32.
    given_dtype = getattr(relative_position, "dtype", None)
    relative_position = keras.ops.convert_to_tensor(relative_position)
    if not _backend.is_integer(relative_position):
        dtype = keras.backend.standardize_dtype(
            relative_position.dtype if given_dtype is None else given_dtype
        )
        raise ValueError(
            "`relative_position` must be an integer tensor. Received: "
            f"relative_position of dtype {dtype}"
        )
    relative_position = keras.ops.cast(relative_position, "int32")
    if bidirectional:
        num_buckets //= 2
        # Keys after the query take the upper half of the buckets.
        offset = keras.ops.cast(relative_position > 0, "int32") * num_buckets
        distance = keras.ops.abs(relative_position)
    else:
        offset = 0
        distance = -keras.ops.minimum(relative_position, 0)  # later keys: 0
    max_exact = num_buckets // 2
    log_bucket = keras.ops.full_like(distance, max_exact)
    for start in _log_bucket_starts(num_buckets, max_exact, max_distance):
        log_bucket += keras.ops.cast(distance >= start, "int32")
    return offset + keras.ops.where(distance < max_exact, distance, log_bucket)


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
            query` per axis, as `relative_position` gives it; or a tuple of
            `num_axes` integer tensors of one shape, an axis each (the
            pointwise form of a scheme's `score_bias`).
        grid_shape: list or tuple of positive ints, one per axis: the
            window.

    Returns:
        An int32 tensor of shape `(...)`, each entry in `[0, prod(2 w_a -
        1))`.

    Example:

    >>> keras.ops.convert_to_numpy(grid_relative_position_index(
    ...     [[0, 0], [1, 0], [-1, 0], [0, -1], [5, 5]], (2, 2)
    ... )).tolist()
    [4, 1, 7, 5, 0]
    """
    check_grid_shape(grid_shape)
    if isinstance(relative_position, tuple):
        per_axis = [keras.ops.cast(axis, "int32") for axis in relative_position]
    else:
        relative_position = keras.ops.cast(
            relative_position, "int32"
        )  # (..., num_axes)
        per_axis = [relative_position[..., axis] for axis in range(len(grid_shape))]
    index = 0
    for axis, (size, distance) in enumerate(zip(grid_shape, per_axis)):
        # Swin's `coords_q - coords_k`, shifted to start from 0.
        shifted = keras.ops.clip(-distance, 1 - size, size - 1) + (size - 1)  # (...)
        # A list, not a generator, which PyTorch's compiler cannot trace.
        stride = math.prod([2 * later - 1 for later in grid_shape[axis + 1 :]])
        index = index + shifted * stride
    return index  # (...)


# The names before the renames, kept as aliases that warn.
relative_distance = renamed_function(relative_position, "relative_distance")
relative_distance_shape = renamed_function(
    relative_position_shape, "relative_distance_shape"
)


def _check_log_buckets(bucket_size, max_position):
    """Raise a `ValueError` unless DeBERTa's log buckets are defined for these."""
    check_positive_int("bucket_size", bucket_size)
    check_positive_int("max_position", max_position)
    if bucket_size < 2:
        raise ValueError(
            "`bucket_size` must be at least 2 (half of it is the exactly "
            f"placed distances). Received: bucket_size={bucket_size}"
        )
    if max_position - 1 <= bucket_size // 2:
        raise ValueError(
            "`max_position` must be greater than `bucket_size // 2 + 1`, the "
            "last exactly placed distance, so that the log buckets widen. "
            f"Received: max_position={max_position} with "
            f"bucket_size={bucket_size}"
        )


# The most log buckets whose starts are found exactly: every distance of
# int32 for DeBERTa's configurations (1,525 for 256 buckets up to 512).
_MAX_EXACT_LOG_BUCKETS = 4096


@functools.lru_cache(maxsize=None)
def _deberta_log_bucket_starts(mid, max_position):
    """The smallest distance of buckets `mid + 1, mid + 2, ...`, exactly.

    DeBERTa's bucket of a distance `a > mid` is `mid + ceil(log(a / mid) /
    log((max_position - 1) / mid) * (mid - 1))`: it is at least `mid + k`
    when `a > mid * ((max_position - 1) / mid) ** ((k - 1) / (mid - 1))`,
    that is when `a ** (mid - 1) * mid ** (k - 1) > (max_position - 1) **
    (k - 1) * mid ** (mid - 1)`, compared here in Python integers, so that
    a distance on a boundary (`max_position - 1`, whose bucket is
    `2 mid - 1`) falls where the formula puts it on every backend.

    Returns:
        A tuple of nondecreasing ints, up to the first beyond int32 or
        `_MAX_EXACT_LOG_BUCKETS` of them.
    """
    if mid < 2:
        # `mid - 1 = 0`: every distance past `mid` is bucket `mid`.
        return ()
    largest = 2**31 - 1
    log_ratio = math.log((max_position - 1) / mid)
    power = mid ** (mid - 1)
    starts = []
    start = mid + 1
    for k in range(1, _MAX_EXACT_LOG_BUCKETS + 1):
        left = mid ** (k - 1)
        right = (max_position - 1) ** (k - 1) * power

        def beyond(distance):
            return distance ** (mid - 1) * left > right

        estimate = mid * math.exp(log_ratio * (k - 1) / (mid - 1))
        if estimate > 2 * largest:
            break
        start = max(start, math.floor(estimate))
        while start > mid + 1 and beyond(start - 1):
            start -= 1
        while not beyond(start):
            start += 1
        if start > largest:
            break
        starts.append(start)
    return tuple(starts)


def make_log_bucket_position(relative_position, bucket_size, max_position):
    """DeBERTa's log bucket of each relative position, in int32.

    As Hugging Face's `make_log_bucket_position` (DeBERTa v2 and v3, He et
    al. 2021): with `mid = bucket_size // 2`, a relative position `r` with
    `|r| <= mid` is its own bucket; a longer one goes to `sign(r) * (mid +
    ceil(log(|r| / mid) / log((max_position - 1) / mid) * (mid - 1)))`,
    buckets that widen logarithmically: `|r| = max_position - 1` is bucket
    `2 mid - 1` and the buckets go on growing, slowly, past it. The sign is
    kept, `bucket(-r) = -bucket(r)`, so the function serves either
    convention; DeBERTa's relative position is `query - key`.

    The log is taken in float32 as in the reference, then the bucket is
    checked against the distances where each bucket starts, found once in
    Python integers: a distance on a boundary falls in the same bucket
    eagerly, under XLA and on every backend (for up to 4096 buckets, every
    int32 distance in DeBERTa's configurations).

    Args:
        relative_position: integer tensor of any shape.
        bucket_size: int. DeBERTa's `position_buckets`, at least 2.
        max_position: int. DeBERTa's `max_relative_positions`: greater than
            `bucket_size // 2 + 1`.

    Returns:
        An int32 tensor of the shape of `relative_position`.

    Example:

    >>> keras.ops.convert_to_numpy(make_log_bucket_position(
    ...     np.array([-30, -8, -7, -3, -2, 0, 2, 3, 7, 8, 30]),
    ...     bucket_size=4,
    ...     max_position=8,
    ... ))  # 3 .. 7 share bucket 3, max_position - 1 = 7 its last
    array([-5, -4, -3, -3, -2,  0,  2,  3,  3,  4,  5], dtype=int32)
    """
    _check_log_buckets(bucket_size, max_position)
    relative_position = keras.ops.convert_to_tensor(relative_position)
    if not _backend.is_integer(relative_position):
        raise ValueError(
            "`relative_position` must be an integer tensor. Received: "
            "relative_position of dtype "
            f"{keras.backend.standardize_dtype(relative_position.dtype)}"
        )
    relative_position = keras.ops.cast(relative_position, "int32")
    mid = bucket_size // 2
    distance = keras.ops.abs(relative_position)
    starts = _deberta_log_bucket_starts(mid, max_position)
    if not starts:
        log_bucket = keras.ops.full_like(distance, mid)
    else:
        # Float32 as the reference, then moved by one where it rounded
        # across a start. Distances up to `mid` take no log: 1 for them.
        ratio = keras.ops.cast(keras.ops.maximum(distance, mid + 1), "float32") / mid
        estimate = keras.ops.cast(
            keras.ops.ceil(
                keras.ops.log(ratio)
                / math.log((max_position - 1) / mid)
                * (mid - 1)
            ),
            "int32",
        )  # k of bucket mid + k, or one off
        count = len(starts)
        index = keras.ops.clip(estimate, 1, count)
        lower = keras.ops.take(
            keras.ops.convert_to_tensor(starts, "int32"), index - 1
        )  # where bucket mid + index starts
        upper = keras.ops.take(
            keras.ops.convert_to_tensor(starts[1:] + starts[-1:], "int32"),
            index - 1,
        )  # where bucket mid + index + 1 starts (past int32 for the last)
        exact = (
            index
            + keras.ops.cast((distance >= upper) & (index < count), "int32")
            - keras.ops.cast(distance < lower, "int32")
        )
        # Past the last exact start (never, for every int32 distance of
        # DeBERTa's configurations) the float32 estimate stands.
        log_bucket = mid + keras.ops.where(estimate > count, estimate, exact)
    return keras.ops.where(
        distance <= mid,
        relative_position,
        keras.ops.sign(relative_position) * log_bucket,
    )


def build_relative_position(
    query_positions, key_positions, bucket_size=-1, max_position=-1
):
    """DeBERTa's relative position of each query and key, `query - key`, in int32.

    As Hugging Face's `build_relative_position` for DeBERTa v2 and v3, from
    positions rather than lengths: `query_position - key_position` (the
    opposite sign of `relative_position`), in log buckets
    (`make_log_bucket_position`) when `bucket_size` and `max_position` are
    both positive.

    Args:
        query_positions: integer tensor of shape `(batch or 1, query)` or
            `(query,)`.
        key_positions: integer tensor of shape `(batch or 1, key)` or
            `(key,)`.
        bucket_size: int. DeBERTa's `position_buckets`; 0 or less for no
            buckets. Defaults to `-1`.
        max_position: int. DeBERTa's `max_relative_positions`; 0 or less
            for no buckets. Defaults to `-1`.

    Returns:
        An int32 tensor of shape `(batch or 1, query, key)`.

    Example:

    >>> keras.ops.convert_to_numpy(build_relative_position(
    ...     np.arange(2), np.arange(9), bucket_size=4, max_position=8
    ... ))
    array([[[ 0, -1, -2, -3, -3, -3, -3, -3, -4],
            [ 1,  0, -1, -2, -3, -3, -3, -3, -3]]], dtype=int32)
    """
    query_minus_key = -relative_position(
        query_positions, key_positions
    )  # (batch or 1, query, key)
    if bucket_size > 0 and max_position > 0:
        return make_log_bucket_position(query_minus_key, bucket_size, max_position)
    return query_minus_key
