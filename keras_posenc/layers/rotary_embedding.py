import copy

import keras
import tensorflow as tf

from keras_posenc import ops
from keras_posenc import rope_scaling
from keras_posenc.layers._attention_position import AttentionPosition


@keras.saving.register_keras_serializable(package="keras_posenc")
class RotaryEmbedding(AttentionPosition):
    """Rotary position embedding (RoPE): rotate queries and keys by position.

    Each pair of features of the token at position `m` turns by the angle
    `m * w_i`, with frequencies `w_i = max_wavelength ** (-2i / d)` (Su et al.
    2021). A query at `m` and a key at `n` then have a dot product that
    depends on `m - n` only, so attention sees relative positions while each
    token is encoded on its own, and cached decoding needs no recomputation.
    The rotation is computed element-wise, `x * cos + rotate(x) * sin`, never
    with a rotation matrix.

    `layout` chooses which features form a pair, and must match the
    checkpoint: `"half"` pairs feature `i` with `i + d / 2` (GPT-NeoX, Llama,
    Hugging Face, keras-hub); `"interleaved"` pairs `2i` with `2i + 1`
    (RoFormer, GPT-J, rotary-embedding-torch). `scaling` takes a Hugging Face
    `rope_scaling` dict to stretch the frequencies for contexts longer than
    the trained one (see `keras_posenc.rope_scaling`); `"dynamic"` and
    `"longrope"` follow the current length, the largest position plus one.

    Angles, cosines and sines and the rotation are computed in float32
    whatever the dtype policy, and the output is cast to the compute dtype
    at the end. Masks pass through unchanged.

    Args:
        max_wavelength: float. The base of the frequencies, `rope_theta` in
            Hugging Face configs (500000 for Llama 3). Defaults to `10000.0`.
        layout: str. `"half"` or `"interleaved"`, as above. Defaults to
            `"half"`.
        rotary_dim: int or None. Rotate only the first `rotary_dim` features
            and pass the rest through unchanged (GPT-NeoX, Phi); the
            frequencies are spaced over `rotary_dim`. Must be even. `None`
            rotates all features. Defaults to `None`.
        scaling: dict or None. A Hugging Face style `rope_scaling` dict, such
            as `{"rope_type": "linear", "factor": 4.0}`, with `"rope_type"`
            one of `"linear"`, `"dynamic"`, `"yarn"`, `"llama3"`,
            `"longrope"` and that schedule's keys; the trained context length
            is always `"original_max_position_embeddings"`. `None` leaves the
            frequencies alone. Defaults to `None`.
        sequence_axis: int. The axis of positions. Defaults to `1`.
        feature_axis: int. The axis of features. Defaults to `-1`.
        **kwargs: other keyword arguments passed to `keras.layers.Layer`,
            including `name`, `dtype` etc.

    Call arguments:
        inputs: float tensor with a sequence and a feature axis, typically
            `(batch, sequence, heads, head_dim)` or `(batch, sequence, dim)`.
        start_index: int or integer scalar tensor. The position of the first
            element, for cached decoding. Defaults to `0`.
        positions: optional tensor of shape `(sequence,)` or
            `(batch, sequence)`, integer or float. Overrides `start_index`:
            left padding, packed sequences.

    Returns:
        The rotated inputs, of the same shape, in the layer's compute dtype.

    Example:

    >>> queries = np.ones((2, 6, 4, 16), "float32")  # (batch, seq, heads, dim)
    >>> rotated = RotaryEmbedding()(queries)
    >>> rotated.shape
    TensorShape([2, 6, 4, 16])
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
    >>> llama_3_1(queries, start_index=100000).shape
    TensorShape([2, 6, 4, 16])

    References:
        - [Su et al., 2021](https://arxiv.org/abs/2104.09864)
        - [Chen et al., 2023](https://arxiv.org/abs/2306.15595)
        - [Peng et al., 2023](https://arxiv.org/abs/2309.00071)
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        layout="half",
        rotary_dim=None,
        scaling=None,
        sequence_axis=1,
        feature_axis=-1,
        **kwargs,
    ):
        # Float positions are call arguments that Keras would otherwise
        # round to the compute dtype (bfloat16) before angles are formed;
        # the layer casts inputs and outputs itself.
        super().__init__(autocast=False, **kwargs)
        ops.check_max_wavelength(max_wavelength)
        ops.check_rope_layout(layout)
        ops.check_positive_int("rotary_dim", rotary_dim, allow_none=True)
        if rotary_dim is not None and rotary_dim % 2:
            raise ValueError(
                "`rotary_dim` must be even: features are rotated in pairs. "
                f"Received: rotary_dim={rotary_dim}"
            )
        rope_scaling.check_scaling(scaling, rotary_dim)
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
        self.max_wavelength = float(max_wavelength)
        self.layout = layout
        self.rotary_dim = rotary_dim
        self.scaling = copy.deepcopy(scaling)
        self.sequence_axis = sequence_axis
        self.feature_axis = feature_axis
        self.supports_masking = True

    def _axes(self, input_shape):
        """`(sequence_axis, feature_axis, rotated)` for inputs of this shape.

        Axes come back non-negative; `rotated` is the number of rotated
        features.
        """
        rank = len(input_shape)
        axes = []
        for name, axis in (
            ("sequence_axis", self.sequence_axis),
            ("feature_axis", self.feature_axis),
        ):
            if not -rank <= axis < rank:
                raise ValueError(
                    f"`{name}` is out of range for inputs of rank {rank}. "
                    f"Received: {name}={axis}, inputs of shape "
                    f"{tuple(input_shape)}"
                )
            axes.append(axis % rank)
        sequence_axis, feature_axis = axes
        if sequence_axis == feature_axis:
            raise ValueError(
                "`sequence_axis` and `feature_axis` name the same axis of "
                f"inputs of shape {tuple(input_shape)}. Received: "
                f"sequence_axis={self.sequence_axis}, "
                f"feature_axis={self.feature_axis}"
            )
        features = input_shape[feature_axis]
        if features is None:
            raise ValueError(
                "RotaryEmbedding needs the feature dimension of its inputs to "
                f"be known. Received inputs of shape {tuple(input_shape)}"
            )
        rotated = features if self.rotary_dim is None else self.rotary_dim
        if rotated % 2:
            raise ValueError(
                "RotaryEmbedding rotates features in pairs, so the feature "
                "dimension must be even (or set an even `rotary_dim`). "
                f"Received inputs of shape {tuple(input_shape)}"
            )
        if rotated > features:
            raise ValueError(
                "`rotary_dim` must not exceed the feature dimension of the "
                f"inputs. Received: rotary_dim={self.rotary_dim}, inputs of "
                f"shape {tuple(input_shape)}"
            )
        rope_scaling.check_scaling(self.scaling, rotated)
        return sequence_axis, feature_axis, rotated

    def build(self, input_shape):
        self._axes(input_shape)

    def _positions(self, inputs, sequence_axis, start_index, positions):
        """The positions to encode: `(seq,)` or `(batch, seq)`."""
        if positions is None:
            return ops.position_ids(tf.shape(inputs)[sequence_axis], start_index)
        positions = tf.convert_to_tensor(positions)
        # Per-batch positions need a batch axis before the sequence axis.
        ops.check_positions(
            positions,
            inputs.shape[sequence_axis],
            inputs.shape[0],
            per_batch=sequence_axis > 0,
        )
        return positions

    def call(self, inputs, start_index=0, positions=None):
        sequence_axis, feature_axis, rotated = self._axes(inputs.shape)
        last = inputs.shape.rank - 1
        if feature_axis != last:
            inputs = tf.experimental.numpy.moveaxis(inputs, feature_axis, last)
            if sequence_axis > feature_axis:
                sequence_axis -= 1
        positions = self._positions(inputs, sequence_axis, start_index, positions)
        outputs = self._rotate(
            inputs, sequence_axis, rotated, positions, self._length(positions)
        )
        if feature_axis != last:
            outputs = tf.experimental.numpy.moveaxis(outputs, last, feature_axis)
        return outputs

    def _length(self, *positions):
        """The current length for the schedule: the largest position + 1."""
        if not rope_scaling.depends_on_length(self.scaling):
            return None
        return (
            tf.reduce_max(
                [tf.reduce_max(tf.cast(p, "float32")) for p in positions]
            )
            + 1.0
        )

    def _rotate(self, inputs, sequence_axis, rotated, positions, length):
        """Rotate `inputs`, features last, by `positions` along `sequence_axis`."""
        rank = inputs.shape.rank
        last = rank - 1
        frequencies, attention_factor = rope_scaling.rope_parameters(
            self.scaling, rotated, self.max_wavelength, length
        )
        phases = ops.angles(positions, frequencies)  # ([batch,] seq, rotated / 2)
        # Size-1 axes wherever the table has none: heads, and batch when the
        # positions are shared.
        table_axes = {sequence_axis, last} | ({0} if phases.shape.rank == 3 else set())
        for axis in range(rank):
            if axis not in table_axes:
                phases = tf.expand_dims(phases, axis)
        # (batch | 1, seq, 1, rotated / 2) for 4-D inputs
        turned = ops.rotate(
            tf.cast(inputs[..., :rotated], "float32"), phases, self.layout
        )  # like inputs, rotated features only
        if attention_factor != 1.0:
            turned = turned * attention_factor  # scales cos and sin alike
        outputs = tf.cast(turned, self.compute_dtype)
        if rotated < inputs.shape[-1]:
            outputs = tf.concat(
                [outputs, tf.cast(inputs[..., rotated:], self.compute_dtype)], -1
            )
        return outputs

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

    def transform_query_key(self, query, key, query_positions, key_positions):
        # One schedule for both, at the length of all positions together.
        length = self._length(query_positions, key_positions)
        rotated = self._axes(query.shape)[2]
        return (
            self._rotate(query, 1, rotated, query_positions, length),
            self._rotate(key, 1, rotated, key_positions, length),
        )

    def compute_output_shape(self, input_shape):
        self._axes(input_shape)
        return tuple(input_shape)

    @classmethod
    def from_hf_config(cls, config, **kwargs):
        """A `RotaryEmbedding` from a Hugging Face model's `config.json`.

        Reads `rope_theta`, `rope_scaling` (or the newer `rope_parameters`,
        with the legacy key `"type"` for `"rope_type"`),
        `partial_rotary_factor`, `head_dim` (or `hidden_size /
        num_attention_heads`) and `max_position_embeddings`. As Hugging Face
        does, a schedule without `original_max_position_embeddings` takes
        the config's `original_max_position_embeddings` or
        `max_position_embeddings`, and a `"yarn"` or `"longrope"` schedule
        without `factor` takes `max_position_embeddings / original`.
        Features pair in the `"half"` layout, as Hugging Face's Llama-style
        models pair them, except for GPT-J (`"model_type": "gptj"`), which
        pairs them `"interleaved"` and rotates its `rotary_dim` features;
        GPT-NeoX's `rotary_emb_base` and `rotary_pct` are read too.

        Args:
            config: dict. The parsed `config.json`.
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
        """
        if not isinstance(config, dict):
            raise ValueError(
                "`config` must be a dict parsed from a Hugging Face config.json. "
                f"Received: config={config!r}"
            )
        parameters = dict(
            config.get("rope_scaling") or config.get("rope_parameters") or {}
        )
        if "type" in parameters and "rope_type" not in parameters:
            parameters["rope_type"] = parameters.pop("type")
        # GPT-NeoX's config.json names them rotary_emb_base and rotary_pct.
        base = parameters.pop(
            "rope_theta",
            config.get("rope_theta", config.get("rotary_emb_base", 10000.0)),
        )
        partial = parameters.pop(
            "partial_rotary_factor",
            config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)),
        )
        # GPT-2 style configs (GPT-J) name the widths n_embd and n_head.
        hidden_size = config.get("hidden_size", config.get("n_embd"))
        num_heads = config.get("num_attention_heads", config.get("n_head"))
        head_dim = config.get("head_dim")
        if not head_dim:
            if not (hidden_size and num_heads):
                raise ValueError(
                    "`config` must give `head_dim`, or `hidden_size` and "
                    "`num_attention_heads`. Received: config with keys "
                    f"{sorted(config)}"
                )
            head_dim = hidden_size // num_heads
        rotary_dim = None if partial == 1.0 else int(head_dim * partial)
        layout = "half"
        if config.get("model_type") == "gptj":
            # GPT-J pairs features 2i and 2i + 1 and gives the rotated width.
            layout = "interleaved"
            rotary_dim = config.get("rotary_dim")
        rope_type = parameters.get("rope_type", "default")
        scaling = None if rope_type == "default" else parameters
        if rope_type in ("dynamic", "yarn", "llama3", "longrope"):
            original = parameters.setdefault(
                "original_max_position_embeddings",
                config.get(
                    "original_max_position_embeddings",
                    config.get("max_position_embeddings"),
                ),
            )
            if rope_type in ("yarn", "longrope") and "factor" not in parameters:
                parameters["factor"] = (
                    config["max_position_embeddings"] / original
                )
        return cls(
            max_wavelength=base,
            layout=layout,
            rotary_dim=rotary_dim,
            scaling=scaling,
            **kwargs,
        )

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "layout": self.layout,
                "rotary_dim": self.rotary_dim,
                "scaling": copy.deepcopy(self.scaling),
                "sequence_axis": self.sequence_axis,
                "feature_axis": self.feature_axis,
            }
        )
        return config
