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
            `"longrope"`, `"proportional"` and that schedule's keys; the
            trained context length is always
            `"original_max_position_embeddings"`. `None` leaves the
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
    def from_hf_config(cls, config, layer_type=None, **kwargs):
        """A `RotaryEmbedding` from a Hugging Face model's `config.json`.

        Reads the config as Hugging Face transformers reads it:

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
        - Features pair in the `"half"` layout, as Llama-style models pair
          them. GPT-J (`"model_type": "gptj"`) pairs them `"interleaved"`
          and rotates its `rotary_dim` features.
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
        layout gives it: the same rotation in another feature order, which
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
        """
        if not isinstance(config, dict):
            raise ValueError(
                "`config` must be a dict parsed from a Hugging Face config.json. "
                f"Received: config={config!r}"
            )
        # Also what a multimodal config's wrapper fails on, before its lack
        # of RoPE keys could read as the default RoPE.
        head_dim = _head_dim(config)
        parameters, base = _rope_entry(config, layer_type)
        if "type" in parameters:
            # transformers reads "rope_type" first; "type" is its older name.
            legacy_type = parameters.pop("type")
            parameters.setdefault("rope_type", legacy_type)
        if parameters.get("rope_type") == "su":
            parameters["rope_type"] = "longrope"
        base = parameters.pop("rope_theta", base)
        rope_type = parameters.get("rope_type", "default")
        # GPT-NeoX's config.json names the share rotary_pct.
        partial = parameters.pop(
            "partial_rotary_factor",
            config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)),
        )
        model_type = config.get("model_type")
        layout, rotary_dim = "half", None
        if model_type in _DEEPSEEK_MODEL_TYPES:
            ops.check_positive_int(
                "config['qk_rope_head_dim']", config.get("qk_rope_head_dim")
            )
            # V2 multiplies adjacent pairs as complex numbers; V3 does the
            # same unless rope_interleave is false.
            if model_type == "deepseek_v2" or config.get("rope_interleave", True):
                layout = "interleaved"
        elif "qk_rope_head_dim" in config:
            raise ValueError(
                "`config` gives `qk_rope_head_dim`, a separately rotated slice "
                "of each head (multi-head latent attention), but its pairing is "
                f"known only for model types {_DEEPSEEK_MODEL_TYPES}. Received: "
                f"model_type={model_type!r}"
            )
        elif model_type == "gptj":
            # GPT-J pairs features 2i and 2i + 1 and gives the rotated width.
            layout = "interleaved"
            rotary_dim = config.get("rotary_dim")
        elif rope_type == "proportional":
            # Spaced over the whole head, the share rotating: a schedule key.
            parameters["partial_rotary_factor"] = partial
        elif partial != 1.0:
            rotary_dim = int(head_dim * partial)
        scaling = None if rope_type == "default" else parameters
        if rope_type == "dynamic":
            if "max_position_embeddings" not in config:
                raise ValueError(
                    "`config` needs `max_position_embeddings`, the trained "
                    "length of a 'dynamic' schedule. Received: config with "
                    f"keys {sorted(config)}"
                )
            parameters["original_max_position_embeddings"] = config[
                "max_position_embeddings"
            ]
        elif rope_type in ("yarn", "llama3", "longrope"):
            original = parameters.setdefault(
                "original_max_position_embeddings",
                config.get(
                    "original_max_position_embeddings",
                    config.get("max_position_embeddings"),
                ),
            )
            if (
                rope_type in ("yarn", "longrope")
                and "factor" not in parameters
                and "max_position_embeddings" in config
                and original
            ):
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


_DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")


def _rope_entry(config, layer_type):
    """`(parameters, base)` for `layer_type` from a Hugging Face config dict.

    `parameters` is a copy of the RoPE dict that serves `layer_type` (empty
    for the default schedule), `base` the base to use if it names none.
    """
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    rope = config.get(key) or {}
    if not isinstance(rope, dict):
        raise ValueError(
            f"`config['{key}']` must be a dict or null. Received: {key}={rope!r}"
        )
    # GPT-NeoX's config.json names the base rotary_emb_base.
    base = config.get("rope_theta", config.get("rotary_emb_base", 10000.0))
    if rope and all(isinstance(entry, dict) for entry in rope.values()):
        _check_layer_type(
            layer_type, list(rope), f"`config['{key}']` holds one RoPE per layer type"
        )
        return dict(rope[layer_type]), base
    if "rope_local_base_freq" in config:
        # Gemma 3 before transformers 5: rope_theta and rope_scaling serve the
        # full attention layers, rope_local_base_freq the sliding window ones.
        _check_layer_type(
            layer_type,
            ["full_attention", "sliding_attention"],
            "`config` gives `rope_local_base_freq` for its sliding window layers "
            "and `rope_theta` and `rope_scaling` for the others, one RoPE per "
            "layer type",
        )
        if layer_type == "sliding_attention":
            return {}, config["rope_local_base_freq"]
        return dict(rope), base
    layer_types = config.get("layer_types") or []
    if layer_type is not None and layer_type not in layer_types:
        raise ValueError(
            "`layer_type` picks one of the RoPEs of a config that gives one per "
            "layer type, but this config gives one for all its layers, whose "
            f"types are {sorted(set(layer_types))}. Received: "
            f"layer_type={layer_type!r}"
        )
    return dict(rope), base


def _check_layer_type(layer_type, layer_types, nesting):
    """Raise a `ValueError` unless `layer_type` is one of `layer_types`."""
    if layer_type not in layer_types:
        raise ValueError(
            f"{nesting}: {layer_types}. Pass `layer_type=` one of them to "
            f"choose. Received: layer_type={layer_type!r}"
        )


def _head_dim(config):
    """The head width a config gives: `head_dim`, or hidden size / heads."""
    head_dim = config.get("head_dim")
    if head_dim:
        return head_dim
    # GPT-2 style configs (GPT-J) name the widths n_embd and n_head.
    hidden_size = config.get("hidden_size", config.get("n_embd"))
    num_heads = config.get("num_attention_heads", config.get("n_head"))
    if not (hidden_size and num_heads):
        multimodal = (
            " (for a multimodal model, pass its config's 'text_config')"
            if "text_config" in config
            else ""
        )
        raise ValueError(
            "`config` must give `head_dim`, or `hidden_size` and "
            f"`num_attention_heads`{multimodal}. Received: config with keys "
            f"{sorted(config)}"
        )
    return hidden_size // num_heads
