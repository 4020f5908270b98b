import keras

from keras_posenc import ops
from keras_posenc.layers._absolute import AbsoluteEncoding
from keras_posenc.layers._grid_config import add_grid_arguments
from keras_posenc.layers._renamed import renamed_arguments


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments({"layout": "pairing"}, {"pairing": {"concat": "half"}})
class SinusoidalPositionEncoding(AbsoluteEncoding):
    """The fixed sinusoidal position encoding of "Attention Is All You Need".

    Each position `p` is encoded by sines and cosines of `p` at geometrically
    spaced frequencies `w_i = max_wavelength ** (-2i / d)`:
    `PE(p, 2i) = sin(p w_i)`, `PE(p, 2i + 1) = cos(p w_i)`. Because a shift in
    position is a rotation of each (sin, cos) pair (see
    `keras_posenc.ops.translation_matrix`), attention can read relative
    offsets from it, and it is defined at any position, integer or not.

    The layer takes token embeddings of shape `(batch, sequence, features)`
    and, by default, returns them with the encoding added, so it stacks in a
    `keras.Sequential`. The table is computed in float32 and cast to the
    layer's compute dtype at the end, so it stays right at long lengths under
    `mixed_bfloat16`. Masks pass through unchanged.

    On a grid (images, video; `num_axes` > 1) a position is a coordinate per
    axis, and the features split into `num_axes` equal blocks: block `a` is
    the 1-D encoding above of coordinate `a`, with `features / num_axes`
    features, in the layer's `pairing`. With `num_axes=2` and
    `pairing="half"` this is MAE's fixed 2-D encoding, with one quirk
    matched by swapping coordinates: MAE's `get_2d_sincos_pos_embed` builds
    its grid with `np.meshgrid(grid_w, grid_h)`, so its first block encodes
    the column and its second the row, while this layer takes `(row,
    column)` in that order. Pass
    `positions=keras.ops.flip(ops.grid_positions((h, w)), axis=-1)` (PyTorch
    tensors take no negative strides, `[:, ::-1]`) to get MAE's table
    exactly. Inputs of shape `(batch, height,
    width, features)` (or `(batch, time, height, width, features)` for
    `num_axes=3`) take their coordinates from their axes, row-major, and
    come back in that shape; token inputs `(batch, sequence, features)`
    take `grid_shape` or `positions`. Float coordinates (normalised or
    jittered) work as on a line.

    The first `num_prefix_tokens` tokens (class or register tokens, as in
    timm) have no position: they get a zero encoding, so with
    `merge_mode="add"` they come back unchanged, and with `"concat"` or
    `None` their encoding features are zeros (MAE's class token gets the
    same zero row).

    Args:
        max_wavelength: float. The longest wavelength, in positions. Defaults
            to `10000.0`.
        pairing: str. Which features form a (sin, cos) pair.
            `"interleaved"` (the paper's, and keras-hub's
            `SinePositionEncoding`) pairs feature `2i` (sine) with `2i + 1`
            (cosine); an odd width ends with a sine. `"half"` pairs feature
            `i` with `i + width / 2`: all sines first, then all cosines; the
            width must be even. Defaults to `"interleaved"`.
        merge_mode: str or None. `"add"` adds the encoding to the inputs,
            `"concat"` appends an encoding of width `output_dim` to the
            features, `None` returns the encoding alone, broadcast to the
            batch. Defaults to `"add"`.
        output_dim: int or None. The encoding width for `merge_mode="concat"`
            (required) or `None` (defaults to the input width). Must be
            `None` for `"add"`. Defaults to `None`.
        num_axes: int. The number of coordinates of a position: `1` for a
            line, `2` for an image grid, `3` for video. The encoding width
            must be a multiple of it (of twice it for `pairing="half"`).
            Defaults to `1`.
        num_prefix_tokens: int. The number of tokens before those with
            positions, which get no encoding. Defaults to `0`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor of shape `(batch, sequence, features)`, or of
            shape `(batch, *grid, features)` with `num_axes` grid axes.
        start_index: int or integer scalar tensor. The position of the first
            element, for cached decoding; one axis only. Defaults to `0`.
        positions: optional tensor of shape `(sequence,)` or
            `(batch, sequence)` (one axis), `(sequence, num_axes)` or
            `(batch, sequence, num_axes)` (a grid), integer or float, for
            the tokens after the prefix. Overrides `start_index`: left
            padding, packed sequences, timestamps, grid coordinates.
        grid_shape: optional list of ints or integer scalar tensors, one per
            axis: token inputs are the cells of this grid, row-major, after
            the prefix.

    Returns:
        A tensor in the layer's compute dtype: the inputs plus the encoding,
        the inputs and the encoding concatenated, or the encoding alone of
        shape `(batch, sequence, output_dim)`.

    Example:

    >>> embeddings = np.zeros((2, 5, 8), "float32")
    >>> encoded = SinusoidalPositionEncoding()(embeddings)
    >>> tuple(encoded.shape)
    (2, 5, 8)
    >>> first = keras.ops.convert_to_numpy(encoded[0, 1, :2])
    >>> [round(float(v), 4) for v in first]  # sin(1), cos(1)
    [0.8415, 0.5403]

    On a 2-D grid of patches, as MAE's encoder (the first 4 features encode
    the row, the last 4 the column):

    >>> patches = np.zeros((2, 3, 4, 8), "float32")  # (batch, h, w, features)
    >>> layer = SinusoidalPositionEncoding(num_axes=2, pairing="half")
    >>> encoded = layer(patches)
    >>> tuple(encoded.shape)
    (2, 3, 4, 8)
    >>> first = keras.ops.convert_to_numpy(encoded[0, 1, 2, ::4])
    >>> [round(float(v), 4) for v in first]  # sin(1), sin(2)
    [0.8415, 0.9093]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
        - [He et al., 2021 (MAE)](https://arxiv.org/abs/2111.06377)
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        pairing="interleaved",
        merge_mode="add",
        output_dim=None,
        num_axes=1,
        num_prefix_tokens=0,
        **kwargs,
    ):
        super().__init__(
            merge_mode=merge_mode,
            output_dim=output_dim,
            num_axes=num_axes,
            num_prefix_tokens=num_prefix_tokens,
            **kwargs,
        )
        ops.check_max_wavelength(max_wavelength)
        ops.check_pairing(pairing)
        if pairing == "half" and output_dim is not None and output_dim % 2:
            raise ValueError(
                "`output_dim` must be even for pairing='half'. "
                f"Received: output_dim={output_dim}"
            )
        block = 2 * num_axes if pairing == "half" else num_axes
        if num_axes > 1 and output_dim is not None and output_dim % block:
            raise ValueError(
                f"`output_dim` must be a multiple of {block} for "
                f"num_axes={num_axes} and pairing={pairing!r}. "
                f"Received: output_dim={output_dim}"
            )
        self.max_wavelength = float(max_wavelength)
        self.pairing = pairing

    def _encoding_dim(self, input_shape):
        dim = super()._encoding_dim(input_shape)
        if self.pairing == "half" and dim % 2:
            raise ValueError(
                "pairing='half' needs an even encoding width. "
                f"Received inputs of shape {tuple(input_shape)}"
            )
        block = 2 * self.num_axes if self.pairing == "half" else self.num_axes
        if self.num_axes > 1 and dim % block:
            raise ValueError(
                f"num_axes={self.num_axes} and pairing={self.pairing!r} need an "
                f"encoding width that is a multiple of {block}. "
                f"Received inputs of shape {tuple(input_shape)}"
            )
        return dim

    def _encode(self, positions, dim):
        return ops.sinusoidal(
            positions, dim, self.max_wavelength, self.pairing, self.num_axes
        )  # (..., dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"max_wavelength": self.max_wavelength, "pairing": self.pairing}
        )
        return add_grid_arguments(
            config,
            {"num_axes": self.num_axes},
            {"num_axes": 1},
            on_a_grid=self.num_axes > 1,
        )
