import keras

from keras_posenc import ops
from keras_posenc.layers._absolute import AbsoluteEncoding


@keras.saving.register_keras_serializable(package="keras_posenc")
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

    Args:
        max_wavelength: float. The longest wavelength, in positions. Defaults
            to `10000.0`.
        layout: str. Where the sines and cosines go. `"interleaved"` (the
            paper's, and keras-hub's `SinePositionEncoding`) pairs feature
            `2i` (sine) with `2i + 1` (cosine); an odd width ends with a sine.
            `"concat"` puts all sines first, then all cosines; the width must
            be even. Defaults to `"interleaved"`.
        merge_mode: str or None. `"add"` adds the encoding to the inputs,
            `"concat"` appends an encoding of width `output_dim` to the
            features, `None` returns the encoding alone, broadcast to the
            batch. Defaults to `"add"`.
        output_dim: int or None. The encoding width for `merge_mode="concat"`
            (required) or `None` (defaults to the input width). Must be
            `None` for `"add"`. Defaults to `None`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor of shape `(batch, sequence, features)`.
        start_index: int or integer scalar tensor. The position of the first
            element, for cached decoding. Defaults to `0`.
        positions: optional tensor of shape `(sequence,)` or
            `(batch, sequence)`, integer or float. Overrides `start_index`:
            left padding, packed sequences, timestamps.

    Returns:
        A tensor in the layer's compute dtype: the inputs plus the encoding,
        the inputs and the encoding concatenated, or the encoding alone of
        shape `(batch, sequence, output_dim)`.

    Example:

    >>> embeddings = np.zeros((2, 5, 8), "float32")
    >>> encoded = SinusoidalPositionEncoding()(embeddings)
    >>> encoded.shape
    TensorShape([2, 5, 8])
    >>> [round(float(v), 4) for v in encoded[0, 1, :2]]  # sin(1), cos(1)
    [0.8415, 0.5403]

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762)
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        layout="interleaved",
        merge_mode="add",
        output_dim=None,
        **kwargs,
    ):
        super().__init__(merge_mode=merge_mode, output_dim=output_dim, **kwargs)
        ops.check_max_wavelength(max_wavelength)
        ops.check_layout(layout)
        if layout == "concat" and output_dim is not None and output_dim % 2:
            raise ValueError(
                "`output_dim` must be even for layout='concat'. "
                f"Received: output_dim={output_dim}"
            )
        self.max_wavelength = float(max_wavelength)
        self.layout = layout

    def _encoding_dim(self, input_shape):
        dim = super()._encoding_dim(input_shape)
        if self.layout == "concat" and dim % 2:
            raise ValueError(
                "layout='concat' needs an even encoding width. "
                f"Received inputs of shape {tuple(input_shape)}"
            )
        return dim

    def _encode(self, positions, dim):
        return ops.sinusoidal(
            positions, dim, self.max_wavelength, self.layout
        )  # (..., dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"max_wavelength": self.max_wavelength, "layout": self.layout}
        )
        return config
