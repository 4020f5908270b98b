import copy
import numbers

import keras

from keras_posenc import hf_config
from keras_posenc import ops
from keras_posenc import rope_scaling
from keras_posenc.ops import _checks
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.layers._schemes import read_rotation_arguments
from keras_posenc.layers._grid_config import add_grid_arguments
from keras_posenc.layers._renamed import renamed_arguments


@keras.saving.register_keras_serializable(package="keras_posenc")
@renamed_arguments(
    {"layout": "pairing"}, {"axis_layout": {"interleaved": "cyclic"}}
)
class RotaryEmbedding(AttentionPosition):
    """Rotary position embedding (RoPE): rotate queries and keys by position.

    Each pair of features of the token at position `m` turns by the angle
    `m * w_i`, with frequencies `w_i = max_wavelength ** (-2i / d)` (Su et al.
    2021). A query at `m` and a key at `n` then have a dot product that
    depends on `m - n` only, so attention sees relative positions while each
    token is encoded on its own, and cached decoding needs no recomputation.
    The rotation is computed element-wise, `x * cos + rotate(x) * sin`, never
    with a rotation matrix.

    `pairing` chooses which features form a pair, and must match the
    checkpoint: `"half"` pairs feature `i` with `i + d / 2` (GPT-NeoX, Llama,
    Hugging Face, keras-hub); `"interleaved"` pairs `2i` with `2i + 1`
    (RoFormer, GPT-J, rotary-embedding-torch). `scaling` takes a Hugging Face
    `rope_scaling` dict to stretch the frequencies for contexts longer than
    the trained one (see `keras_posenc.rope_scaling`); `"dynamic"` and
    `"longrope"` follow the current length, the largest position plus one.

    On a grid (images, video, multimodal sequences) a position has
    `num_axes` coordinates `p_a`, and pair `i` turns by the angle
    `sum_a Theta[i, a] * p_a`. A query and a key then have a dot product
    that depends on the per-axis differences of their positions only.
    `axis_layout` says which axis each pair reads and at which frequency
    (with `num_axes=1` every layout is the 1-D RoPE above):

    - `"blocks"` (the default; axial RoPE, as EVA-02, rotary-embedding-torch's
      axial frequencies and Qwen2-VL's vision encoder): the pairs split into
      `num_axes` contiguous blocks, block `a` reads axis `a` with a schedule
      of its own over its width, so every axis gets the whole range of
      frequencies, from 1 down to `1 / max_wavelength`. That is why it is
      the default: no axis is left with only slow or only fast pairs, and
      it is the axial setting that learned frequencies start from.
    - `"sections"` (Qwen2-VL's M-RoPE, `mrope_section`): one 1-D schedule
      over the whole rotary width, whose contiguous sections of
      `axis_sections[a]` pairs read axes `t, h, w` in turn; the later axes
      get the slower frequencies.
    - `"cyclic"` (Qwen3-VL's M-RoPE, which its config calls interleaved):
      one 1-D schedule, pair `i` reading axis `i % num_axes` (`t, h, w, t,
      h, w, ...`), so every axis spans the range of frequencies. With `axis_sections`, as
      Qwen3-VL's `mrope_section` `[24, 20, 20]`, axis `a >= 1` reads pairs
      `a, a + n, ...` below `n * axis_sections[a]` and axis 0 the rest (the
      last 4 pairs there).
    - `"alternating"` (Pixtral's 2-D RoPE): one 1-D schedule whose
      frequencies are dealt to the axes in turn (`w_0, w_2, ...` to rows,
      `w_1, w_3, ...` to columns) while the pairs stay in contiguous blocks
      (the first half of the pairs read rows, the second half columns).

    Qwen3-VL and Pixtral give each axis the same frequencies but put them in
    different pairs: cyclic, pair `2j` reads rows and `2j + 1` columns
    at frequency `w_2j` and `w_2j+1`; alternating, pair `j` reads rows at
    `w_2j` and pair `d / 4 + j` columns at `w_2j+1`. The two differ by a
    fixed permutation of the pairs, so they give the same attention scores
    for queries and keys whose features are permuted alike, but a
    checkpoint's projection weights match one of them only.

    With `learned_frequencies=True`, `Theta` is a trainable float32 weight
    of shape `(heads, rotary_dim / 2, num_axes)`, one per head and axis,
    initialised from `axis_layout` (RoPE-Mixed, Heo et al. 2024): each pair
    may then learn to read a mixture of the axes, diagonal directions.

    `num_prefix_tokens` leading tokens (class or register tokens, as in
    timm's ViTs) have no grid position and are left unrotated; the positions
    given cover the tokens after them.

    Angles, cosines and sines and the rotation are computed in float32
    whatever the dtype policy, and the output is cast to the compute dtype
    at the end. Masks pass through unchanged.

    Args:
        max_wavelength: float. The base of the frequencies, `rope_theta` in
            Hugging Face configs (500000 for Llama 3). Defaults to `10000.0`.
        pairing: str. Which features form a pair: `"half"` or
            `"interleaved"`, as above. Defaults to `"half"`.
        rotary_dim: int or None. Rotate only the first `rotary_dim` features
            and pass the rest through unchanged (GPT-NeoX, Phi); the
            frequencies are spaced over `rotary_dim`. Must be even. `None`
            rotates all features. Defaults to `None`.
        scaling: dict or None. A Hugging Face style `rope_scaling` dict, such
            as `{"rope_type": "linear", "factor": 4.0}`, with `"rope_type"`
            one of `"linear"`, `"dynamic"`, `"yarn"`, `"llama3"`,
            `"longrope"`, `"proportional"` and that schedule's keys; the
            trained context length is always
            `"original_max_position_embeddings"`. The older key `"type"`
            is read as `"rope_type"`, with a `DeprecationWarning`, as
            transformers reads it. `None` leaves the frequencies alone.
            Defaults to `None`.
        sequence_axis: int. The axis of positions. Defaults to `1`.
        feature_axis: int. The axis of features. Defaults to `-1`.
        num_axes: int. The number of coordinates of a position: 1 for text,
            2 for an image, 3 for video or Qwen2-VL's `(t, h, w)`. Defaults
            to `1`.
        axis_layout: str. Which axis each rotary pair reads, and at which
            frequency: `"blocks"`, `"sections"`, `"cyclic"` or
            `"alternating"`, as above. Defaults to `"blocks"`.
        axis_sections: list of ints or None. The number of rotary pairs of
            each axis, summing to `rotary_dim / 2` (Qwen2-VL's
            `mrope_section`, `[16, 24, 24]` for heads of 128). `None` shares
            the pairs equally. Not for `"alternating"`. Defaults to `None`.
        learned_frequencies: bool. Whether `Theta` is a trainable weight per
            head and axis, initialised from `axis_layout` (RoPE-Mixed). Then
            the layer takes inputs `(batch, sequence, heads, head_dim)` or
            `(batch, sequence, dim)` (one head), with the default axes, and
            no `scaling`. Defaults to `False`.
        num_prefix_tokens: int. Leading tokens that have no position and are
            left unrotated (class and register tokens). Defaults to `0`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor with a sequence and a feature axis, typically
            `(batch, sequence, heads, head_dim)` or `(batch, sequence, dim)`.
        start_index: int or integer scalar tensor. The position of the first
            element, for cached decoding; one axis only (with `num_axes` >
            1 it must be `0`). Defaults to `0`.
        positions: optional tensor of shape `(sequence,)` or
            `(batch, sequence)`, integer or float, or `(sequence, num_axes)`
            or `(batch, sequence, num_axes)` on a grid, such as
            `keras_posenc.ops.grid_positions(grid_shape)` or
            `keras_posenc.ops.multimodal_positions(...)`; `sequence` counts
            the tokens after the `num_prefix_tokens`. Overrides
            `start_index`: left padding, packed sequences.
        grid_shape: optional list of `num_axes` ints, or of integer scalar
            tensors (all one or the other: Keras takes no mix of tensors
            and ints in a call argument), such as `(rows, columns)`: the
            tokens after the prefix are that grid, row-major, and take the
            positions `ops.grid_positions(grid_shape)`. With `num_axes` > 1, pass
            `positions` or `grid_shape`.

    Returns:
        The rotated inputs, of the same shape, in the layer's compute dtype.

    Example:

    >>> queries = np.ones((2, 6, 4, 16), "float32")  # (batch, seq, heads, dim)
    >>> rotated = RotaryEmbedding()(queries)
    >>> tuple(rotated.shape)
    (2, 6, 4, 16)
    >>> llama_3_1 = RotaryEmbedding(
    ...     max_wavelength=500000.0,
    ...     scaling={
    ...         "rope_type": "llama3",
    ...         "factor": 8.0,
    ...         "low_freq_factor": 1.0,
    ...         "high_freq_factor": 4.0,
    ...         "original_max_position_embeddings": 8192,
    ...     },
    ... )
    >>> tuple(llama_3_1(queries, start_index=100000).shape)
    (2, 6, 4, 16)

    On a 2 x 3 grid of image patches after a class token, axial RoPE:

    >>> patches = np.ones((2, 1 + 2 * 3, 4, 16), "float32")
    >>> axial = RotaryEmbedding(num_axes=2, num_prefix_tokens=1)
    >>> tuple(axial(patches, grid_shape=(2, 3)).shape)
    (2, 7, 4, 16)
    >>> qwen2_vl = RotaryEmbedding(
    ...     max_wavelength=1e6, num_axes=3, axis_layout="sections",
    ...     axis_sections=[2, 3, 3],
    ... )
    >>> tokens = np.ones((1, 9, 2, 16), "float32")  # text, a 2 x 3 image, text
    >>> positions = ops.multimodal_positions([2, (1, 2, 3), 1])
    >>> tuple(qwen2_vl(tokens, positions=positions).shape)
    (1, 9, 2, 16)

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [Chen et al., 2023](https://arxiv.org/abs/2306.15595)
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071)
        - [Fang et al., 2023 (EVA-02)](https://arxiv.org/abs/2303.11331)
        - [Wang et al., 2024 (Qwen2-VL)](https://arxiv.org/abs/2409.12191)
        - [Heo et al., 2024 (RoPE-Mixed)](https://arxiv.org/abs/2403.13298)
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        pairing="half",
        rotary_dim=None,
        scaling=None,
        sequence_axis=1,
        feature_axis=-1,
        num_axes=1,
        axis_layout="blocks",
        axis_sections=None,
        learned_frequencies=False,
        num_prefix_tokens=0,
        **kwargs,
    ):
        # Float positions are call arguments that Keras would otherwise
        # round to the compute dtype (bfloat16) before angles are formed;
        # the layer casts inputs and outputs itself.
        super().__init__(autocast=False, **kwargs)
        scaling = read_rotation_arguments(
            max_wavelength, pairing, rotary_dim, scaling, sequence_axis, feature_axis
        )
        _check_grid_arguments(
            num_axes,
            axis_layout,
            axis_sections,
            learned_frequencies,
            num_prefix_tokens,
            rotary_dim,
            scaling,
            sequence_axis,
            feature_axis,
        )
        self.max_wavelength = float(max_wavelength)
        self.pairing = pairing
        self.rotary_dim = rotary_dim
        self.scaling = copy.deepcopy(scaling)
        self.sequence_axis = sequence_axis
        self.feature_axis = feature_axis
        self.num_axes = num_axes
        self.axis_layout = axis_layout
        self.axis_sections = None if axis_sections is None else list(axis_sections)
        self.learned_frequencies = learned_frequencies
        self.num_prefix_tokens = num_prefix_tokens
        self.supports_masking = True
        self.frequencies = None

    def _axes(self, input_shape):
        """`(sequence_axis, feature_axis, rotated)` for inputs of this shape.

        Axes come back non-negative; `rotated` is the number of rotated
        features.
        """
        rank = len(input_shape)
        sequence_axis, feature_axis, rotated = ops.rotary_axes(
            input_shape, self.sequence_axis, self.feature_axis, self.rotary_dim
        )
        rope_scaling.check_scaling(self.scaling, rotated)
        if self._on_grid:
            # Whether the sections fit the pairs, known from the width only.
            ops.rope_pair_axes(
                rotated // 2, self.num_axes, self.axis_layout, self.axis_sections
            )
        if self.learned_frequencies and (
            rank not in (3, 4) or (rank == 4 and input_shape[2] is None)
        ):
            raise ValueError(
                "With learned_frequencies=True, RotaryEmbedding takes inputs "
                "of shape (batch, sequence, heads, head_dim), with a known "
                "number of heads, or (batch, sequence, dim). Received inputs "
                f"of shape {tuple(input_shape)}"
            )
        return sequence_axis, feature_axis, rotated

    @property
    def _on_grid(self):
        """Whether angles come from a frequency matrix, not today's 1-D path."""
        return self.num_axes > 1 or self.learned_frequencies

    def build(self, input_shape):
        # Called on its own: inputs with heads, or one head of `dim` features.
        self._axes(input_shape)
        if self.learned_frequencies:
            heads = input_shape[2] if len(input_shape) == 4 else 1
            self._check_frequencies(heads, input_shape[-1])
            if self.frequencies is None:
                self.build_weights(heads, input_shape[-1], input_shape[-1])

    def _check_frequencies(self, heads, features):
        """Learned already, for other inputs or another attention: a `ValueError`."""
        if self.frequencies is None:
            return
        _, _, rotated = self._axes((None, None, heads, features))
        shape = (heads, rotated // 2, self.num_axes)
        if tuple(self.frequencies.shape) != shape:
            raise ValueError(
                "This RotaryEmbedding learned frequencies of shape "
                f"{tuple(self.frequencies.shape)} (heads, pairs, "
                f"num_axes). Received: inputs that need {shape}"
            )

    def build_weights(self, num_heads, key_dim, value_dim, features=None):
        if not self.learned_frequencies:
            return
        _, _, rotated = self._axes((None, None, num_heads, key_dim))

        def axial(shape, dtype=None):
            # Tiled, not broadcast: PyTorch assigns no view of shared memory.
            matrix = self._fixed_frequency_matrix(rotated)  # (pairs, num_axes)
            return keras.ops.tile(matrix[None], (shape[0], 1, 1))

        self.frequencies = self.add_weight(
            name="frequencies",
            shape=(num_heads, rotated // 2, self.num_axes),
            initializer=axial,
            # Float32, and read so: angles at grid coordinates in the
            # thousands, even inside a mixed precision attention.
            dtype="float32",
            autocast=False,
        )

    def _fixed_frequency_matrix(self, rotated):
        """`Theta` of `axis_layout`: float32 `(rotated / 2, num_axes)`."""
        return ops.rope_frequency_matrix(
            rotated,
            self.num_axes,
            self.axis_layout,
            self.axis_sections,
            self.max_wavelength,
        )

    def build_from_config(self, config):
        if config and "frequencies_shape" in config:
            # Older files: the learned frequencies' shape, that of inputs
            # of `heads` heads of `2 pairs` features.
            heads, pairs, _ = config["frequencies_shape"]
            config = {"input_shape": (None, None, heads, 2 * pairs)}
        super().build_from_config(config)

    def _positions(self, inputs, sequence_axis, start_index, positions, grid_shape):
        """The positions of the tokens after the prefix, as `read_positions` gives."""
        length = inputs.shape[sequence_axis]
        if length is not None:
            if length < self.num_prefix_tokens:
                raise ValueError(
                    f"Inputs must hold at least the {self.num_prefix_tokens} "
                    "prefix tokens (num_prefix_tokens). Received inputs of "
                    f"shape {tuple(inputs.shape)}"
                )
            length -= self.num_prefix_tokens
        if self.num_axes > 1 and not (
            isinstance(start_index, numbers.Integral) and start_index == 0
        ):
            raise ValueError(
                f"`start_index` offsets positions on one axis; with "
                f"num_axes={self.num_axes} pass `positions` instead. "
                f"Received: start_index={start_index!r}"
            )
        if grid_shape is not None:
            if positions is not None:
                raise ValueError(
                    "Pass `positions` or `grid_shape`, not both. Received: "
                    f"grid_shape={grid_shape!r} and positions of shape "
                    f"{tuple(keras.ops.convert_to_tensor(positions).shape)}"
                )
            ops.check_grid_shape(grid_shape, num_axes=self.num_axes)
            positions = ops.grid_positions(grid_shape)  # (tokens, num_axes)
            if self.num_axes == 1:
                positions = positions[:, 0]  # (tokens,)
        if positions is not None:
            # Per-batch positions need a batch axis before the sequence axis.
            return ops.read_positions(
                positions,
                self.num_axes,
                length=length,
                batch_size=inputs.shape[0],
                per_batch=sequence_axis > 0,
            )
        if self.num_axes > 1:
            axes = ", ".join(f"p{axis}" for axis in range(self.num_axes))
            raise ValueError(
                f"RotaryEmbedding with num_axes={self.num_axes} needs the "
                "position of each token: pass `grid_shape=` the grid of the "
                "tokens after the prefix, such as (rows, columns), or "
                f"`positions=` of shape (sequence, {self.num_axes}) or "
                f"(batch, sequence, {self.num_axes}), a ({axes}) per token "
                "(see keras_posenc.ops.grid_positions). Received neither"
            )
        if length is None:
            length = keras.ops.shape(inputs)[sequence_axis] - self.num_prefix_tokens
        return ops.position_ids(length, start_index)

    def __call__(self, inputs, *args, **kwargs):
        # Before Keras converts them: JAX parses strings of digits, and
        # wraps int64 positions past int32.
        _checks.check_not_text("inputs", inputs, "floats: queries or keys")
        ops.positions.check_given(kwargs.get("positions"), "positions")
        return super().__call__(inputs, *args, **kwargs)

    def call(self, inputs, start_index=0, positions=None, grid_shape=None):
        sequence_axis, feature_axis, rotated = self._axes(inputs.shape)
        last = len(inputs.shape) - 1
        if feature_axis != last:
            inputs = keras.ops.moveaxis(inputs, feature_axis, last)
            if sequence_axis > feature_axis:
                sequence_axis -= 1
        # Positions `start_index + 0, 1, ...`: the tables come from those of
        # `0, 1, ...` turned by the start (see `ops.shifted_cos_sin`).
        consecutive = positions is None and grid_shape is None and not self._on_grid
        positions = self._positions(
            inputs, sequence_axis, start_index, positions, grid_shape
        )
        outputs = self._rotate_after_prefix(
            inputs,
            sequence_axis,
            rotated,
            positions,
            rope_scaling.current_length(self.scaling, positions),
            start_index if consecutive else None,
        )
        if feature_axis != last:
            outputs = keras.ops.moveaxis(outputs, last, feature_axis)
        return outputs

    def _rotate_after_prefix(
        self, inputs, sequence_axis, rotated, positions, length, start_index=None
    ):
        """`_rotate` the tokens after the `num_prefix_tokens`; keep the prefix."""
        if not self.num_prefix_tokens:
            return self._rotate(
                inputs, sequence_axis, rotated, positions, length, start_index
            )
        before = (slice(None),) * sequence_axis
        prefix = inputs[(*before, slice(None, self.num_prefix_tokens))]
        tokens = inputs[(*before, slice(self.num_prefix_tokens, None))]
        return keras.ops.concatenate(
            [
                keras.ops.cast(prefix, self.compute_dtype),
                self._rotate(
                    tokens, sequence_axis, rotated, positions, length, start_index
                ),
            ],
            axis=sequence_axis,
        )

    def _rotate(
        self, inputs, sequence_axis, rotated, positions, length, start_index=None
    ):
        """Rotate `inputs`, features last, by `positions` along `sequence_axis`.

        With `start_index`, the positions are `start_index + 0, 1, ...` and
        the rotation reads tables of cos and sin made once
        (`ops.shifted_cos_sin`), not the angles.
        """
        rank = len(inputs.shape)
        last = rank - 1
        if self._on_grid:
            phases, batched = self._grid_phases(positions, rotated, rank)
            attention_factor = 1.0  # no scaling on a grid
        else:
            frequencies, attention_factor = rope_scaling.rope_parameters(
                self.scaling, rotated, self.max_wavelength, length
            )
            if start_index is None:
                phases = ops.angles(
                    positions, frequencies
                )  # ([batch,] seq, rotated / 2)
            else:
                length = inputs.shape[sequence_axis]
                if length is None:
                    length = keras.ops.shape(inputs)[sequence_axis]
                phases = ops.shifted_cos_sin(
                    length, start_index, frequencies
                )  # cos and sin, (seq, rotated / 2) each
            batched = start_index is None and len(phases.shape) == 3

        def table_shape(table):
            # Size-1 axes wherever the table has none: heads (unless learned
            # per head), and batch when the positions are shared.
            table_axes = {sequence_axis, last} | ({0} if batched else set())
            if self.learned_frequencies and rank == 4:
                table_axes.add(2)
            for axis in range(rank):
                if axis not in table_axes:
                    table = keras.ops.expand_dims(table, axis)
            return table  # (batch | 1, seq, 1, rotated / 2) for 4-D inputs

        selected = keras.ops.cast(inputs[..., :rotated], "float32")
        if start_index is None:
            turned = ops.rotate(selected, table_shape(phases), self.pairing)
        else:
            cos, sin = phases
            turned = ops.rotate_by_tables(
                selected, table_shape(cos), table_shape(sin), self.pairing
            )  # like inputs, rotated features only
        if attention_factor != 1.0:
            turned = turned * attention_factor  # scales cos and sin alike
        outputs = keras.ops.cast(turned, self.compute_dtype)
        if rotated < inputs.shape[-1]:
            outputs = keras.ops.concatenate(
                [outputs, keras.ops.cast(inputs[..., rotated:], self.compute_dtype)],
                -1,
            )
        return outputs

    def _grid_phases(self, positions, rotated, rank):
        """Angles from `Theta`, and whether they have a batch axis.

        `phases` is `([batch,] seq, rotated / 2)`, or `([batch,] seq, heads,
        rotated / 2)` for learned frequencies and inputs with heads.
        """
        positions = keras.ops.convert_to_tensor(positions)
        if self.num_axes == 1:
            positions = positions[..., None]  # ([batch,] seq, 1)
        batched = len(positions.shape) == 3
        if self.learned_frequencies:
            phases = ops.grid_angles(
                positions, self.frequencies
            )  # ([batch,] seq, heads, rotated / 2)
            if rank == 3:
                phases = phases[..., 0, :]  # one head: ([batch,] seq, rotated / 2)
        else:
            phases = ops.grid_angles(
                positions, self._fixed_frequency_matrix(rotated)
            )  # ([batch,] seq, rotated / 2)
        return phases, batched

    def check_attention(self, num_heads, key_dim, value_dim):
        heads_shape = (None, None, num_heads, key_dim)
        sequence_axis, feature_axis, _ = self._axes(heads_shape)
        if (sequence_axis, feature_axis) != (1, 3):
            raise ValueError(
                "Inside attention, RotaryEmbedding rotates projected heads of "
                "shape (batch, sequence, heads, key_dim), so it needs "
                "sequence_axis=1 and feature_axis=-1. Received: "
                f"sequence_axis={self.sequence_axis}, "
                f"feature_axis={self.feature_axis}"
            )
        # One layer may serve several attentions, or calls on its own, of
        # the sizes its frequencies were learned for.
        self._check_frequencies(num_heads, key_dim)

    def transform_query_key(self, query, key, context):
        query_positions = context.query_positions
        key_positions = context.key_positions
        # One schedule for both, at the length of all positions together.
        length = rope_scaling.current_length(
            self.scaling, query_positions, key_positions
        )
        rotated = self._axes(query.shape)[2]
        return (
            self._rotate_after_prefix(query, 1, rotated, query_positions, length),
            self._rotate_after_prefix(key, 1, rotated, key_positions, length),
        )

    def compute_output_shape(self, input_shape):
        self._axes(input_shape)
        return tuple(input_shape)

    @classmethod
    def from_hf_config(cls, config, layer_type=None, **kwargs):
        """A `RotaryEmbedding` from a Hugging Face model's `config.json`.

        Reads the config as Hugging Face transformers reads it:

        - A composite model's config (Qwen2-VL, Qwen3-VL, Gemma 3, LLaVA)
          is read where transformers' `get_text_config()` finds its text
          model: the dict under `"text_config"` (or `"text_encoder"`,
          `"decoder"`, `"generator"`), else the top level, as Qwen2-VL's
          first configs keep their text fields
          (`keras_posenc.hf_config.text_config`).
        - The schedule is `rope_scaling`, or else the newer
          `rope_parameters`, named by its `"rope_type"`; the legacy key
          `"type"` stands in when `"rope_type"` is missing and is dropped
          when both are present (configs that transformers has saved again
          carry both). `"su"` is read as `"longrope"`.
        - The base is the schedule's `rope_theta`, else the config's
          `rope_theta` (GPT-NeoX: `rotary_emb_base`); the rotated share is
          `partial_rotary_factor` (GPT-NeoX: `rotary_pct`) of `head_dim`, or
          of `hidden_size / num_attention_heads` (GPT-2 style: `n_embd /
          n_head`).
        - A `"llama3"`, `"yarn"` or `"longrope"` schedule without
          `original_max_position_embeddings` takes the config's
          `original_max_position_embeddings` or `max_position_embeddings`,
          and a `"yarn"` or `"longrope"` one without `factor` takes
          `max_position_embeddings / original`. A `"dynamic"` schedule's
          trained length is always `max_position_embeddings`: like
          transformers, it ignores `original_max_position_embeddings`, at
          the top level or in the schedule.
        - Features pair in the `"half"` pairing, as Llama-style models pair
          them. GPT-J (`"model_type": "gptj"`) pairs them `"interleaved"`
          and rotates its `rotary_dim` features. Llama 4 and Cohere
          (`"llama4"`, `"llama4_text"`, `"cohere"`, `"cohere2"`) pair them
          `"interleaved"` too. For a model that mixes layers with RoPE and
          without, `keras_posenc.hf_attention.positions_per_layer` gives each
          layer's position.
        - Some models give each layer type its own RoPE: a `rope_parameters`
          holding one dict per layer type (Gemma 3 as transformers 5 writes
          it: `"full_attention"` and `"sliding_attention"`; Gemma 4), or an
          older Gemma 3 config, whose `rope_theta` and `rope_scaling` serve
          its `"full_attention"` layers and whose `rope_local_base_freq`
          (default schedule) serves its `"sliding_attention"` ones. Then
          `layer_type` picks one, and leaving it out is a `ValueError` that
          lists them. The config's `layer_types` (older Gemma 3: every
          `sliding_window_pattern`-th layer is full attention) says which
          layer has which. Gemma 4's full attention layers use
          `"proportional"` RoPE over their `global_head_dim` wide heads.

        Grids (see the class docstring for the layouts):

        - Qwen2-VL and Qwen2.5-VL (`"model_type"` `"qwen2_vl"`,
          `"qwen2_5_vl"`, or their `"_text"` configs): M-RoPE over `(t, h,
          w)`, `num_axes=3`, `axis_layout="sections"` with
          `axis_sections=` the schedule's `mrope_section` (`[16, 24, 24]`
          when missing, as transformers). Its `"type"` or `"rope_type"`
          `"mrope"` is the default schedule; any other schedule (YaRN) on a
          grid is a `ValueError`, as the constructor does not support it.
          Build the positions with `keras_posenc.ops.multimodal_positions`.
        - Qwen3-VL (`"qwen3_vl"`, `"qwen3_vl_moe"`, their `"_text"`
          configs, or any `"mrope_interleaved": true`): likewise with
          `axis_layout="cyclic"` (`mrope_section` `[24, 20, 20]`
          when missing). Its text config carries them in `rope_scaling`
          or, as transformers 5 writes it, `rope_parameters`.
        - Pixtral's vision encoder (`"model_type": "pixtral"`, its
          `vision_config`): 2-D RoPE over rows and columns of patches,
          `num_axes=2`, `axis_layout="alternating"`, over the whole head
          (`head_dim`, or `hidden_size / num_attention_heads`), with base
          `rope_theta` (10000 by default). A patch's position is its
          `(row, column)` in its image, up to `image_size // patch_size - 1`
          on each axis. Features pair as transformers' converted weights
          pair them, `"half"`; Mistral's own checkpoints pair them
          `"interleaved"`.

        DeepSeek-V2 and V3 (`"model_type"` `"deepseek_v2"` or
        `"deepseek_v3"`) rotate a separate slice of each head, of
        `qk_rope_head_dim` features, with frequencies spaced over that
        width and pairs `(2i, 2i + 1)`: `"interleaved"` (V2 always, V3
        unless `"rope_interleave": false`). Apply the returned layer to that
        slice only: the last `qk_rope_head_dim` features of each query head
        (the first `qk_nope_head_dim` are not rotated), and the
        `qk_rope_head_dim` key features that the key projection emits once
        for all heads; then concatenate. Applied to a whole head it would
        rotate the wrong features. transformers' DeepSeek-V3 hands back its
        rotated slices with each pair moved to the places the `"half"`
        pairing gives it: the same rotation in another feature order, which
        leaves every query-key dot product as it is. Their YaRN attention
        factor is `mscale(factor, mscale) / mscale(factor, mscale_all_dim)`
        (1 in the released configs); the further `mscale(factor,
        mscale_all_dim) ** 2` that DeepSeek-V3's attention multiplies its
        softmax scale by belongs to the attention, not to this layer.

        Args:
            config: dict. The parsed `config.json` (for a multimodal model,
                its `"text_config"`).
            layer_type: str or None. Which layer type's RoPE to build, such
                as `"full_attention"` or `"sliding_attention"`, for configs
                that give one per layer type; for other configs, one of their
                `layer_types` or `None`. Defaults to `None`.
            **kwargs: passed to the constructor, such as `name` or `dtype`.

        Returns:
            A `RotaryEmbedding`.

        Example:

        >>> config = {
        ...     "hidden_size": 4096,
        ...     "num_attention_heads": 32,
        ...     "max_position_embeddings": 131072,
        ...     "rope_theta": 500000.0,
        ...     "rope_scaling": {
        ...         "rope_type": "llama3",
        ...         "factor": 8.0,
        ...         "low_freq_factor": 1.0,
        ...         "high_freq_factor": 4.0,
        ...         "original_max_position_embeddings": 8192,
        ...     },
        ... }
        >>> layer = RotaryEmbedding.from_hf_config(config)
        >>> layer.max_wavelength, layer.scaling["rope_type"]
        (500000.0, 'llama3')
        >>> gemma_3 = {
        ...     "head_dim": 256,
        ...     "rope_parameters": {
        ...         "full_attention": {
        ...             "rope_type": "linear", "factor": 8.0, "rope_theta": 1e6
        ...         },
        ...         "sliding_attention": {
        ...             "rope_type": "default", "rope_theta": 10000.0
        ...         },
        ...     },
        ... }
        >>> local = RotaryEmbedding.from_hf_config(
        ...     gemma_3, layer_type="sliding_attention"
        ... )
        >>> local.max_wavelength, local.scaling
        (10000.0, None)
        >>> qwen2_vl = RotaryEmbedding.from_hf_config(
        ...     {
        ...         "model_type": "qwen2_vl",
        ...         "hidden_size": 3584,
        ...         "num_attention_heads": 28,
        ...         "rope_theta": 1000000.0,
        ...         "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
        ...     }
        ... )
        >>> qwen2_vl.num_axes, qwen2_vl.axis_layout, qwen2_vl.axis_sections
        (3, 'sections', [16, 24, 24])
        """
        arguments = hf_config.rotary_embedding_arguments(config, layer_type)
        return cls(**arguments, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "pairing": self.pairing,
                "rotary_dim": self.rotary_dim,
                "scaling": copy.deepcopy(self.scaling),
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
            }
        )
        return add_grid_arguments(
            config,
            {
                "num_axes": self.num_axes,
                "axis_layout": self.axis_layout,
                "axis_sections": copy.copy(self.axis_sections),
                "learned_frequencies": self.learned_frequencies,
                "num_prefix_tokens": self.num_prefix_tokens,
            },
            {
                "num_axes": 1,
                "axis_layout": "blocks",
                "axis_sections": None,
                "learned_frequencies": False,
                "num_prefix_tokens": 0,
            },
            on_a_grid=self.num_axes > 1,
        )


def _check_grid_arguments(
    num_axes,
    axis_layout,
    axis_sections,
    learned_frequencies,
    num_prefix_tokens,
    rotary_dim,
    scaling,
    sequence_axis,
    feature_axis,
):
    """Raise a `ValueError` unless the grid arguments make a RotaryEmbedding."""
    ops.check_axis_layout(axis_layout, num_axes, axis_sections)
    ops.check_bool("learned_frequencies", learned_frequencies)
    if (
        isinstance(num_prefix_tokens, bool)
        or not isinstance(num_prefix_tokens, int)
        or num_prefix_tokens < 0
    ):
        raise ValueError(
            "`num_prefix_tokens` must be a non-negative integer. "
            f"Received: num_prefix_tokens={num_prefix_tokens!r}"
        )
    if rotary_dim is not None and axis_sections is not None:
        ops.rope_pair_axes(rotary_dim // 2, num_axes, axis_layout, axis_sections)
    if scaling is not None and (num_axes > 1 or learned_frequencies):
        raise ValueError(
            "`scaling` stretches a 1-D schedule and is not supported with "
            "num_axes > 1 or learned frequencies (the Qwen-VL and Pixtral "
            "configs use the default schedule). Received: "
            f"scaling={scaling!r}, num_axes={num_axes}, "
            f"learned_frequencies={learned_frequencies}"
        )
    if learned_frequencies and (sequence_axis, feature_axis) != (1, -1):
        raise ValueError(
            "With learned_frequencies=True, RotaryEmbedding takes inputs "
            "(batch, sequence, [heads,] features): sequence_axis=1 and "
            f"feature_axis=-1. Received: sequence_axis={sequence_axis}, "
            f"feature_axis={feature_axis}"
        )
