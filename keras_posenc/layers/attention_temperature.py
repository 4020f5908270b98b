import math
import numbers

import keras
import numpy as np

from keras_posenc import hf_config
from keras_posenc import ops
from keras_posenc.layers.attention_position import AttentionPosition
from keras_posenc.ops import _backend


@keras.saving.register_keras_serializable(package="keras_posenc")
class AttentionTemperature(AttentionPosition):
    """Llama 4's attention temperature, for layers without positions (NoPE).

    A layer without positions (`PositionalMultiHeadAttention(position=None)`,
    NoPE: Kazemnejad et al. 2023) sees the order of the tokens through the
    causal mask alone. Over long contexts its attention spreads thin: the
    softmax is over more keys, each logit no larger. Llama 4 sharpens it
    again on its layers without RoPE by scaling each query at position `p`
    by

        s(p) = log1p(floor((p + 1) / floor_scale)) * attn_scale + 1,

    a step function of the position, 1 up to `floor_scale - 2` and growing
    with the logarithm of the length beyond (Nakanishi 2025's scalable
    softmax, in steps of `floor_scale` tokens). The keys and values are
    unchanged, so a key/value cache holds them as a layer without positions
    would.

    `p` is each query's position as the attention gives it
    (`query_positions`, `cache_update_index + 0, 1, ...` with a cache), so
    cached decoding scales each new query as a pass over the whole
    sequence does. transformers' `Llama4TextAttention` counts the tokens
    instead (`0, 1, ...` after the cached ones), which is the same at the
    default positions; with left padding or packed sequences, give the
    positions that the model's RoPE layers read.

    The factor is computed in float32 whatever the dtype policy, the
    queries multiplied by it in float32 and cast back to their dtype, as
    transformers does. It adds nothing to the logits and has no weights.
    Called on its own, the layer returns the factors of the positions
    given.

    Args:
        floor_scale: int or float. The number of tokens per step of the
            temperature, Llama 4's `floor_scale` (its trained context,
            8192 tokens). Must be positive. Defaults to `8192`.
        attn_scale: float. How much the temperature grows per step of the
            logarithm, Llama 4's `attn_scale`. Must be at least 0 (0 leaves
            the queries unchanged). Defaults to `0.1`.
        **kwargs: other keyword arguments of `keras.layers.Layer`, such as
            `name` or `dtype`.

    Call arguments:
        positions: integer tensor of any shape: the positions of queries.

    Returns:
        The float32 factors `s(p)`, of the shape of `positions`.

    Example:

    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> temperature = AttentionTemperature(floor_scale=4, attn_scale=0.5)
    >>> factors = temperature(keras.ops.arange(12, dtype="int32"))
    >>> [round(float(f), 3) for f in keras.ops.convert_to_numpy(factors)]
    [1.0, 1.0, 1.0, 1.347, 1.347, 1.347, 1.347, 1.549, 1.549, 1.549, 1.549, 1.693]
    >>> attention = PositionalMultiHeadAttention(
    ...     num_heads=2, key_dim=8, position=temperature
    ... )
    >>> tokens = np.random.default_rng(0).normal(size=(1, 12, 16))
    >>> tuple(attention(tokens, tokens, use_causal_mask=True).shape)
    (1, 12, 16)

    References:
        - [Kazemnejad et al., 2023](https://arxiv.org/abs/2305.19466)
        - [Nakanishi, 2025](https://arxiv.org/abs/2501.19399)
    """

    def __init__(self, floor_scale=8192, attn_scale=0.1, **kwargs):
        super().__init__(**kwargs)
        if (
            isinstance(floor_scale, bool)
            or not isinstance(floor_scale, numbers.Real)
            or not math.isfinite(floor_scale)
            or not floor_scale > 0
        ):
            raise ValueError(
                "`floor_scale` must be a finite positive number of tokens. "
                f"Received: floor_scale={floor_scale!r}"
            )
        if (
            isinstance(attn_scale, bool)
            or not isinstance(attn_scale, numbers.Real)
            or not math.isfinite(attn_scale)
            or not attn_scale >= 0
        ):
            raise ValueError(
                "`attn_scale` must be a finite number of at least 0. "
                f"Received: attn_scale={attn_scale!r}"
            )
        self.floor_scale = floor_scale
        self.attn_scale = attn_scale

    def _factors(self, positions):
        """`s(p)` in float32, of the shape of `positions`.

        Below position -1 the step is negative and `log1p` is -inf or NaN:
        a `ValueError` where the positions are known, NaN in compiled code.
        """
        steps = keras.ops.floor(
            (keras.ops.cast(positions, "float32") + 1.0) / float(self.floor_scale)
        )
        valid = steps >= 0.0
        known = _backend.static_value(valid)
        if known is not None and not known.all():
            index = tuple(int(i) for i in np.argwhere(~known)[0])
            value = _backend.static_value(positions)[index]
            raise ValueError(
                "`positions` of AttentionTemperature must be at least -1: "
                "log1p(floor((p + 1) / floor_scale)) is undefined below. "
                f"Received: positions[{', '.join(map(str, index))}]={value}"
            )
        factors = keras.ops.log1p(steps) * float(self.attn_scale) + 1.0
        return _backend.checked_or_nan(
            factors, valid, "`positions` of AttentionTemperature must be at least -1."
        )

    def __call__(self, positions, **kwargs):
        # Before Keras converts them: JAX parses strings of digits.
        ops.positions.check_given(positions, "positions")
        return super().__call__(positions, **kwargs)

    def call(self, positions):
        return self._factors(positions)

    def compute_output_spec(self, positions):
        return keras.KerasTensor(positions.shape, dtype="float32")

    def transform_query_key(self, query, key, context):
        factors = self._factors(context.query_positions)  # (batch or 1, query)
        scaled = keras.ops.cast(query, "float32") * factors[:, :, None, None]
        return keras.ops.cast(scaled, query.dtype), key

    @classmethod
    def from_hf_config(cls, config, **kwargs):
        """An `AttentionTemperature` from a Hugging Face Llama 4 `config.json`.

        Reads `attn_temperature_tuning`, `floor_scale` and `attn_scale` of
        the text config (a composite model's, as
        `keras_posenc.hf_config.text_config` finds it), with transformers'
        defaults for Llama 4 (`"model_type"` `"llama4"` or `"llama4_text"`):
        tuning on, 8192 and 0.1. A config whose temperature tuning is off,
        or another model's config that does not turn it on, is a
        `ValueError`: its layers without RoPE take `position=None`. The
        temperature serves the layers without RoPE only; see
        `keras_posenc.hf_attention.positions_per_layer` for the position of
        every layer.

        Args:
            config: dict. The parsed `config.json`.
            **kwargs: passed to the constructor, such as `name` or `dtype`.

        Returns:
            An `AttentionTemperature`.

        Example:

        >>> scout = {
        ...     "model_type": "llama4",
        ...     "text_config": {"attn_temperature_tuning": True, "floor_scale": 8192,
        ...                     "attn_scale": 0.1},
        ... }
        >>> temperature = AttentionTemperature.from_hf_config(scout)
        >>> temperature.floor_scale, temperature.attn_scale
        (8192, 0.1)
        """
        return cls(**hf_config.attention_temperature_arguments(config), **kwargs)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"floor_scale": self.floor_scale, "attn_scale": self.attn_scale}
        )
        return config
