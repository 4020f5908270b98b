"""Pure TensorFlow functions behind the layers: frequencies, angles, tables.

Everything here takes and returns TensorFlow tensors, holds no Keras state and
imports nothing from the rest of the package. Angles and tables are float32;
the layers cast them to their compute dtype at the very end.
"""

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


def check_max_wavelength(max_wavelength):
    """Raise a `ValueError` unless `max_wavelength` is a number above 1."""
    if (
        isinstance(max_wavelength, bool)
        or not isinstance(max_wavelength, numbers.Real)
        or not max_wavelength > 1
    ):
        raise ValueError(
            "`max_wavelength` must be a number greater than 1. "
            f"Received: max_wavelength={max_wavelength!r}"
        )


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


def sinusoidal(positions, dim, max_wavelength=10000.0, layout="interleaved"):
    """The sinusoidal position encoding of Vaswani et al. (2017), in float32.

    `PE(p, 2i) = sin(p / max_wavelength ** (2i / dim))` and
    `PE(p, 2i + 1) = cos(p / max_wavelength ** (2i / dim))`.

    With `layout="interleaved"` (the paper's, and keras-hub's
    `SinePositionEncoding`) sines sit at even and cosines at odd features; an
    odd `dim` drops the last cosine, so the last feature is a sine. With
    `layout="concat"` all `dim / 2` sines come first, then all cosines; `dim`
    must then be even.

    Args:
        positions: tensor of any shape, integer or float. Float positions
            (timestamps, say) are encoded as they are.
        dim: int. The encoding width.
        max_wavelength: float. The longest wavelength. Defaults to `10000.0`.
        layout: `"interleaved"` or `"concat"`. Defaults to `"interleaved"`.

    Returns:
        A float32 tensor of shape `positions.shape + (dim,)`.

    Example:

    >>> table = sinusoidal(tf.range(4), dim=6)
    >>> table.shape
    TensorShape([4, 6])
    >>> [round(float(v), 4) for v in table[1, :2]]  # sin(1), cos(1)
    [0.8415, 0.5403]
    """
    check_layout(layout)
    check_positive_int("dim", dim)
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


def check_positions(positions, sequence_length, batch_size=None, per_batch=True):
    """Raise a `ValueError` unless `positions` fit inputs of these sizes.

    Args:
        positions: tensor. Must have shape `(sequence,)` or, if `per_batch`,
            `(batch, sequence)` with a batch of 1 or `batch_size`.
        sequence_length: int or None. The inputs' sequence length, if known.
        batch_size: int or None. The inputs' batch size, if known.
        per_batch: bool. Whether positions may differ along a batch axis.
    """
    shape = positions.shape
    rank = shape.rank
    if rank == 2 and not per_batch:
        rank = None  # not allowed

    def fits(size, expected):
        return size is None or expected is None or size == expected

    if (
        rank not in (1, 2)
        or not fits(shape[-1], sequence_length)
        or (rank == 2 and not (shape[0] == 1 or fits(shape[0], batch_size)))
    ):
        expected = "(sequence,) or (batch, sequence)" if per_batch else "(sequence,)"
        raise ValueError(
            f"`positions` must have shape {expected} for inputs of sequence "
            f"length {sequence_length} and batch size {batch_size}. "
            f"Received positions of shape {shape}"
        )


def position_ids(sequence_length, start_index=0):
    """Positions `start_index, ..., start_index + sequence_length - 1`.

    Args:
        sequence_length: int or scalar integer tensor.
        start_index: int or scalar integer tensor. Defaults to `0`.

    Returns:
        An int32 tensor of shape `(sequence_length,)`.
    """
    if isinstance(start_index, bool) or not (
        isinstance(start_index, numbers.Integral)
        or (
            tf.is_tensor(start_index)
            and start_index.dtype.is_integer
            and start_index.shape.rank == 0
        )
    ):
        raise ValueError(
            "`start_index` must be an integer or an integer scalar tensor. "
            f"Received: start_index={start_index!r}"
        )
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
    if layout == "half":
        phases = tf.concat([phases, phases], axis=-1)  # (..., d)
        first, second = tf.split(inputs, 2, axis=-1)  # (..., d / 2) each
        turned = tf.concat([-second, first], axis=-1)  # (..., d)
    else:
        phases = tf.repeat(phases, 2, axis=-1)  # (..., d)
        shape = tf.shape(inputs)
        pairs = tf.reshape(
            inputs, tf.concat([shape[:-1], [-1, 2]], 0)
        )  # (..., d / 2, 2)
        turned = tf.reshape(
            tf.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), shape
        )  # (..., d)
    return inputs * tf.cos(phases) + turned * tf.sin(phases)


