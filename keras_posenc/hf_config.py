"""Hugging Face config.json -> layer arguments.

A model's `config.json`, parsed into a dict, is read here as Hugging Face
transformers reads it, and turned into the arguments of a layer's
constructor; the layer's own classmethod (`RotaryEmbedding.from_hf_config`)
builds the layer from them; `position_arguments_per_layer` reads the
position of each layer of a model that mixes layers with RoPE and without,
and `positions_per_layer` builds them, through Keras' registry of the
package's layers (this module imports none). Nothing here computes with
tensors.
"""

import math
import numbers
import warnings

import keras

from keras_posenc import ops
from keras_posenc import rope_scaling
from keras_posenc.ops import _backend

# The keys under which transformers' `PretrainedConfig.get_text_config()`
# looks for a composite model's text config, in its order: encoders', then
# decoders'.
TEXT_CONFIG_KEYS = ("text_encoder", "decoder", "generator", "text_config")

_DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
# Models whose RoPE turns adjacent features (2i, 2i + 1) together: Llama 4
# multiplies them as complex numbers, Cohere's rotate_half takes x[..., ::2]
# and x[..., 1::2].
_INTERLEAVED_MODEL_TYPES = ("llama4", "llama4_text", "cohere", "cohere2")
_LLAMA4_MODEL_TYPES = ("llama4", "llama4_text")
# Models with a RoPE switch per layer, `no_rope_layers` (1: RoPE, 0: none),
# by default every `no_rope_layer_interval`-th layer without.
_NO_ROPE_MODEL_TYPES = (*_LLAMA4_MODEL_TYPES, "smollm3")
# The entries of `layer_types` that transformers' `layer_type_validation`
# allows.
_LAYER_TYPES = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
)
# transformers' mrope_section when a Qwen-VL config gives none.
_MROPE_SECTIONS = {
    "qwen2_vl": [16, 24, 24],
    "qwen2_5_vl": [16, 24, 24],
    "qwen3_vl": [24, 20, 20],
    "qwen3_vl_moe": [24, 20, 20],
}


def text_config(config):
    """The config of a model's text part, as transformers' `get_text_config()`.

    A composite model's config (Qwen2-VL, Qwen3-VL, Gemma 3, LLaVA) nests
    its text model's config under one of `TEXT_CONFIG_KEYS`, most often
    `"text_config"`; a config with none of them is its own text config (a
    text-only model, or a multimodal one written flat, as Qwen2-VL's first
    `config.json`: transformers then builds the text config from the
    top-level keys). Like transformers, more than one is ambiguous. The
    nested config's `model_type`, when it gives none, is the outer one's:
    transformers picks the text config's class by the outer model.

    Args:
        config: dict. A parsed `config.json`.

    Returns:
        A tuple `(text, name)`: the text config, a dict, and how messages
        name it (`"config"`, or `"config['text_config']"`).

    Example:

    >>> qwen3_vl = {
    ...     "model_type": "qwen3_vl",
    ...     "text_config": {"head_dim": 128, "rope_theta": 5000000},
    ...     "vision_config": {"depth": 27},
    ... }
    >>> text, name = text_config(qwen3_vl)
    >>> name, text["model_type"], text["rope_theta"]
    ("config['text_config']", 'qwen3_vl', 5000000)
    >>> text_config({"model_type": "llama", "head_dim": 128})[1]
    'config'
    """
    nested = [
        key for key in TEXT_CONFIG_KEYS if isinstance(config.get(key), dict)
    ]
    if len(nested) > 1:
        raise ValueError(
            f"`config` holds more than one text config, {nested}, so which "
            "one serves the text is ambiguous (as transformers' "
            "get_text_config() finds): pass the one to read. Received: config "
            f"with keys {sorted(config)}"
        )
    if not nested:
        return config, "config"
    text = dict(config[nested[0]])
    if "model_type" in config:
        text.setdefault("model_type", config["model_type"])
    return text, f"config[{nested[0]!r}]"


def rotary_embedding_arguments(config, layer_type=None):
    """`RotaryEmbedding`'s constructor arguments from a Hugging Face config.

    See `RotaryEmbedding.from_hf_config`, which builds the layer from
    them, for how each field is read.

    Args:
        config: dict. The parsed `config.json`; a composite model's text
            config is read as `text_config` finds it.
        layer_type: str or None. Which layer type's RoPE, for configs that
            give one per layer type. Defaults to `None`.

    Returns:
        A dict of keyword arguments of `RotaryEmbedding`.

    Example:

    >>> rotary_embedding_arguments(
    ...     {"head_dim": 64, "rope_theta": 500000.0, "partial_rotary_factor": 0.5}
    ... )
    {'max_wavelength': 500000.0, 'pairing': 'half', 'rotary_dim': 32,
     'scaling': None}
    """
    _check_dict(config)
    config, name = text_config(config)
    # Also what a composite config's wrapper fails on, when its text config
    # is under a name transformers does not look for, before its lack of
    # RoPE keys could read as the default RoPE.
    head_dim = _head_dim(config, name)
    parameters, base = _rope_entry(config, layer_type, name)
    given = dict(parameters)
    if "type" in parameters:
        # transformers reads "rope_type" first; "type" is its older name.
        legacy_type = parameters.pop("type")
        parameters.setdefault("rope_type", legacy_type)
    if parameters.get("rope_type") == "su":
        parameters["rope_type"] = "longrope"
    base = parameters.pop("rope_theta", base)
    model_type = config.get("model_type")
    if model_type == "pixtral":
        # Rows and columns of patches, the whole head; "axial" names it.
        return {
            "max_wavelength": base,
            "num_axes": 2,
            "axis_layout": "alternating",
        }
    grid = _mrope_arguments(model_type, parameters)
    rope_type = parameters.get("rope_type", "default")
    # GPT-NeoX's config.json names the share rotary_pct.
    partial = parameters.pop(
        "partial_rotary_factor",
        config.get("partial_rotary_factor", config.get("rotary_pct", 1.0)),
    )
    if (
        isinstance(partial, bool)
        or not isinstance(partial, numbers.Real)
        or not 0 < partial <= 1
    ):
        raise ValueError(
            f"`{name}`'s `partial_rotary_factor` (or `rotary_pct`) must be a "
            "number in (0, 1], the share of each head that rotates. "
            f"Received: partial_rotary_factor={partial!r}"
        )
    if parameters and "rope_type" not in parameters:
        # transformers 4 refuses it (a KeyError); transformers 5 reads it as
        # the default RoPE, its keys unrecognized: either way not scaled.
        key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
        raise ValueError(
            f"`{name}['{key}']` must name its schedule: `rope_type` (or its "
            f"older name `type`). Received: {key}={given!r}"
        )
    pairing, rotary_dim = "half", None
    if model_type in _DEEPSEEK_MODEL_TYPES:
        ops.check_positive_int(
            f"{name}['qk_rope_head_dim']", config.get("qk_rope_head_dim")
        )
        # V2 multiplies adjacent pairs as complex numbers; V3 does the
        # same unless rope_interleave is false.
        if model_type == "deepseek_v2" or config.get("rope_interleave", True):
            pairing = "interleaved"
    elif "qk_rope_head_dim" in config:
        raise ValueError(
            f"`{name}` gives `qk_rope_head_dim`, a separately rotated slice "
            "of each head (multi-head latent attention), but its pairing is "
            f"known only for model types {_DEEPSEEK_MODEL_TYPES}. Received: "
            f"model_type={model_type!r}"
        )
    elif model_type == "gptj":
        # GPT-J pairs features 2i and 2i + 1 and gives the rotated width.
        pairing = "interleaved"
        rotary_dim = config.get("rotary_dim")
    elif rope_type == "proportional":
        # Spaced over the whole head, the share rotating: a schedule key.
        parameters["partial_rotary_factor"] = partial
    elif partial != 1.0:
        rotary_dim = int(head_dim * partial)
    if model_type in _INTERLEAVED_MODEL_TYPES:
        pairing = "interleaved"
    scaling = None if rope_type == "default" else parameters
    if rope_type == "dynamic":
        if "max_position_embeddings" not in config:
            raise ValueError(
                f"`{name}` needs `max_position_embeddings`, the trained "
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
            parameters["factor"] = config["max_position_embeddings"] / original
    _warn_as_transformers(rope_type, parameters, config, name)
    if rope_type == "default":
        unused = sorted(key for key in parameters if key != "rope_type")
        if unused:
            # transformers warns of them and rotates without them.
            warnings.warn(
                f"In `{name}`'s RoPE: unrecognized keys for "
                f"rope_type='default', which are not used: {unused}. "
                f"Received: {parameters!r}",
                UserWarning,
                stacklevel=2,
            )
    return {
        "max_wavelength": base,
        "pairing": pairing,
        "rotary_dim": rotary_dim,
        "scaling": scaling,
        **grid,
    }


def attention_temperature_arguments(config):
    """`AttentionTemperature`'s constructor arguments from a Hugging Face config.

    See `AttentionTemperature.from_hf_config`, which builds the layer from
    them.

    Args:
        config: dict. The parsed `config.json`; a composite model's text
            config is read as `text_config` finds it.

    Returns:
        A dict of keyword arguments of `AttentionTemperature`.

    Example:

    >>> attention_temperature_arguments({"model_type": "llama4_text"})
    {'floor_scale': 8192, 'attn_scale': 0.1}
    """
    _check_dict(config)
    config, name = text_config(config)
    if not _temperature_tuning(config, name):
        raise ValueError(
            f"`{name}` has no attention temperature: Llama 4's "
            "`attn_temperature_tuning` is off or missing, so its layers "
            "without RoPE take `position=None`. Received: "
            f"attn_temperature_tuning={config.get('attn_temperature_tuning')!r}"
            f" for model_type={config.get('model_type')!r}"
        )
    return {
        "floor_scale": config.get("floor_scale", 8192),
        "attn_scale": config.get("attn_scale", 0.1),
    }


def position_arguments_per_layer(config):
    """The position of each attention layer of a Hugging Face model's config.

    Models that mix layers with RoPE and layers without give the pattern in
    their config, read here as transformers' modeling code reads it:

    - Llama 4 and SmolLM3 (`"model_type"` `"llama4"`, `"llama4_text"`,
      `"smollm3"`), and any config with `no_rope_layers`: layer `i` has
      RoPE where `no_rope_layers[i]` is 1 and none where it is 0. Without
      the list (Llama 4: or with an empty one), every
      `no_rope_layer_interval`-th layer (4 by default) has none: layers 3,
      7, 11, ... Llama 4's layers without RoPE take its attention
      temperature (`AttentionTemperature.from_hf_config`) where
      `attn_temperature_tuning` is on, its default.
    - Cohere2 (`"cohere2"`, Command R7B and A): RoPE on its
      `"sliding_attention"` layers only, none on its `"full_attention"`
      ones. Without `layer_types`, every `sliding_window_pattern`-th layer
      (4 by default) is full attention. A config whose `sliding_window` is
      null has RoPE on no layer, as in transformers.
    - Any other config: RoPE on every layer.

    Each RoPE's arguments are `rotary_embedding_arguments(config,
    layer_type=...)`, with the layer's type where the config gives
    `layer_types` (a model with one RoPE per layer type, Gemma 3, gets each
    layer's). Llama 4 and Cohere rotate adjacent features `(2i, 2i + 1)`
    together (`pairing="interleaved"`), for weights as their checkpoints
    hold them. `positions_per_layer` builds the layers from these
    arguments.

    Only the positions are read; the attention's other per-layer settings
    are left to the caller: Llama 4's chunked attention on its RoPE layers
    (`attention_chunk_size`, keys in the query's chunk of 8192 tokens only)
    and the L2 norm of queries and keys there (`use_qk_norm`); the sliding
    windows of Cohere2's `"sliding_attention"` layers and of SmolLM3's with
    `use_sliding_window` (Keras 3.15 and later take `sliding_window=` in the
    attention: give it `config["sliding_window"]` on those layers).

    Args:
        config: dict. The parsed `config.json`; a composite model's text
            config is read as `text_config` finds it. Must give
            `num_hidden_layers`.

    Returns:
        A list of `num_hidden_layers` entries, one per layer, in order:
        `("RotaryEmbedding", arguments)`, `("AttentionTemperature",
        arguments)`, each with the layer's constructor arguments, or None
        (no positions).

    Example:

    >>> smollm3 = {
    ...     "model_type": "smollm3", "num_hidden_layers": 6, "head_dim": 128,
    ...     "rope_theta": 5000000.0, "no_rope_layer_interval": 4,
    ... }
    >>> [entry and entry[0] for entry in position_arguments_per_layer(smollm3)]
    ['RotaryEmbedding', 'RotaryEmbedding', 'RotaryEmbedding', None,
     'RotaryEmbedding', 'RotaryEmbedding']
    >>> scout = {
    ...     "model_type": "llama4",
    ...     "text_config": {"num_hidden_layers": 4, "head_dim": 128,
    ...                     "no_rope_layers": [1, 1, 1, 0]},
    ... }
    >>> position_arguments_per_layer(scout)[3]
    ('AttentionTemperature', {'floor_scale': 8192, 'attn_scale': 0.1})
    """
    _check_dict(config)
    text, name = text_config(config)
    num_layers = text.get("num_hidden_layers")
    ops.check_positive_int(f"{name}['num_hidden_layers']", num_layers)
    layer_types = text.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list) or len(layer_types) != num_layers
    ):
        raise ValueError(
            f"`{name}['layer_types']` must list one type per layer, "
            f"num_hidden_layers={num_layers}. Received: "
            f"layer_types={layer_types!r}"
        )
    if layer_types is not None:
        unknown = sorted(
            {str(entry) for entry in layer_types if entry not in _LAYER_TYPES}
        )
        if unknown:
            # transformers refuses them too (`layer_type_validation`).
            raise ValueError(
                f"`{name}['layer_types']` entries must be in {_LAYER_TYPES}. "
                f"Received: layer_types with {unknown}"
            )
    with_rope = _rope_layers(text, name, num_layers)
    temperature = None
    if text.get("model_type") in _LLAMA4_MODEL_TYPES and _temperature_tuning(
        text, name
    ):
        temperature = attention_temperature_arguments(config)
    positions = []
    for index, rope in enumerate(with_rope):
        if rope:
            positions.append(
                (
                    "RotaryEmbedding",
                    rotary_embedding_arguments(
                        config,
                        layer_type=None if layer_types is None else layer_types[index],
                    ),
                )
            )
        elif temperature is not None:
            positions.append(("AttentionTemperature", dict(temperature)))
        else:
            positions.append(None)
    return positions


def positions_per_layer(config):
    """One `position` per attention layer of a Hugging Face model's config.

    For a model that mixes layers with RoPE and layers without (Llama 4,
    SmolLM3, Cohere2): the pattern is read as transformers reads it
    (`position_arguments_per_layer` says how), and each layer's position is
    built: a `RotaryEmbedding`, an `AttentionTemperature` (Llama 4's layers
    without RoPE) or None (no positions). Any other model gets a
    `RotaryEmbedding` on every layer.

    Args:
        config: dict. The parsed `config.json`.

    Returns:
        A list of `num_hidden_layers` positions, one per layer, in order,
        each for `PositionalMultiHeadAttention(position=...)`.

    Example:

    >>> smollm3 = {
    ...     "model_type": "smollm3", "num_hidden_layers": 4, "head_dim": 64,
    ...     "rope_theta": 5000000.0, "no_rope_layer_interval": 4,
    ... }
    >>> positions = positions_per_layer(smollm3)
    >>> [type(position).__name__ for position in positions]
    ['RotaryEmbedding', 'RotaryEmbedding', 'RotaryEmbedding', 'NoneType']
    >>> from keras_posenc import PositionalMultiHeadAttention
    >>> attention = PositionalMultiHeadAttention(2, 64, position=positions[0])
    """
    return [
        None
        if entry is None
        else keras.saving.get_registered_object(f"keras_posenc>{entry[0]}")(
            **entry[1]
        )
        for entry in position_arguments_per_layer(config)
    ]


def _temperature_tuning(config, name):
    """Whether a text config turns on Llama 4's attention temperature.

    transformers' Llama 4 turns it on by default; no other model has it.
    A number or null reads as transformers reads it, true unless zero or
    null (Llama 4 Scout's config.json gives 4); a string is refused, since
    transformers would read `"false"` as on.
    """
    tuning = config.get(
        "attn_temperature_tuning", config.get("model_type") in _LLAMA4_MODEL_TYPES
    )
    if tuning is not None and not isinstance(tuning, numbers.Real):
        raise ValueError(
            f"`{name}['attn_temperature_tuning']` must be true or false. "
            f"Received: attn_temperature_tuning={tuning!r}"
        )
    return bool(tuning)


def _rope_layers(config, name, num_layers):
    """Whether each of the `num_layers` layers of a text config has RoPE."""
    model_type = config.get("model_type")
    if model_type in _NO_ROPE_MODEL_TYPES or "no_rope_layers" in config:
        flags = config.get("no_rope_layers")
        # SmolLM3 builds the default list when it is missing, Llama 4 also
        # when it is empty.
        if flags is None or (not flags and model_type in _LLAMA4_MODEL_TYPES):
            interval = config.get("no_rope_layer_interval", 4)
            ops.check_positive_int(f"{name}['no_rope_layer_interval']", interval)
            return [(index + 1) % interval != 0 for index in range(num_layers)]
        if (
            not isinstance(flags, list)
            or len(flags) < num_layers
            or any(flag not in (0, 1) for flag in flags)
        ):
            raise ValueError(
                f"`{name}['no_rope_layers']` must list a 1 (RoPE) or a 0 (no "
                f"RoPE) for each of the num_hidden_layers={num_layers} "
                f"layers. Received: no_rope_layers={flags!r}"
            )
        return [bool(flag) for flag in flags[:num_layers]]
    if model_type == "cohere2":
        layer_types = config.get("layer_types")
        if layer_types is None:
            pattern = config.get("sliding_window_pattern", 4)
            ops.check_positive_int(f"{name}['sliding_window_pattern']", pattern)
            layer_types = [
                "sliding_attention" if (index + 1) % pattern else "full_attention"
                for index in range(num_layers)
            ]
        # Its attention rotates where it has a sliding window: the sliding
        # layers', unless the config's window is null (4096 by default).
        window = config.get("sliding_window", 4096)
        return [
            layer_type == "sliding_attention" and window is not None
            for layer_type in layer_types
        ]
    return [True] * num_layers


def _check_dict(config):
    """Raise a `ValueError` unless `config` is a dict."""
    if not isinstance(config, dict):
        raise ValueError(
            "`config` must be a dict parsed from a Hugging Face config.json. "
            f"Received: config={config!r}"
        )


def _mrope_arguments(model_type, parameters):
    """The grid arguments of a Qwen-VL config's M-RoPE, `{}` for other configs.

    Takes `mrope_section` and `mrope_interleaved` out of `parameters` and
    reads the `"mrope"` schedule as the default one, as transformers does.
    """
    base_type = (model_type or "").removesuffix("_text")
    sections = parameters.pop("mrope_section", None)
    interleaved = parameters.pop("mrope_interleaved", False)
    if parameters.get("rope_type") == "mrope":
        parameters["rope_type"] = "default"
    if sections is None:
        # The Qwen-VL text models apply M-RoPE whatever their config says.
        sections = _MROPE_SECTIONS.get(base_type)
    if sections is None:
        return {}
    # Qwen3-VL's text model interleaves (axis_layout="cyclic") whatever its
    # config says.
    if interleaved or base_type.startswith("qwen3_vl"):
        axis_layout = "cyclic"
    else:
        axis_layout = "sections"
    return {
        "num_axes": len(sections),
        "axis_layout": axis_layout,
        "axis_sections": list(sections),
    }


def _rope_entry(config, layer_type, name="config"):
    """`(parameters, base)` for `layer_type` from a Hugging Face config dict.

    `parameters` is a copy of the RoPE dict that serves `layer_type` (empty
    for the default schedule), `base` the base to use if it names none.
    `name` is how messages name `config`.
    """
    key = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    rope = config.get(key) or {}
    if not isinstance(rope, dict):
        raise ValueError(
            f"`{name}['{key}']` must be a dict or null. Received: {key}={rope!r}"
        )
    # GPT-NeoX's config.json names the base rotary_emb_base.
    base = config.get("rope_theta", config.get("rotary_emb_base", 10000.0))
    if rope and all(isinstance(entry, dict) for entry in rope.values()):
        _check_layer_type(
            layer_type,
            list(rope),
            f"`{name}['{key}']` holds one RoPE per layer type",
        )
        return dict(rope[layer_type]), base
    if "rope_local_base_freq" in config:
        # Gemma 3 before transformers 5: rope_theta and rope_scaling serve the
        # full attention layers, rope_local_base_freq the sliding window ones.
        _check_layer_type(
            layer_type,
            ["full_attention", "sliding_attention"],
            f"`{name}` gives `rope_local_base_freq` for its sliding window "
            "layers and `rope_theta` and `rope_scaling` for the others, one "
            "RoPE per layer type",
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


def _head_dim(config, name="config"):
    """The head width a config gives: `head_dim`, or hidden size / heads."""
    head_dim = config.get("head_dim")
    if head_dim:
        ops.check_positive_int(f"{name}['head_dim']", head_dim)
        return head_dim
    # GPT-2 style configs (GPT-J) name the widths n_embd and n_head.
    hidden_size = config.get("hidden_size", config.get("n_embd"))
    num_heads = config.get("num_attention_heads", config.get("n_head"))
    for key in ("hidden_size", "n_embd", "num_attention_heads", "n_head"):
        if config.get(key) is not None:
            ops.check_positive_int(f"{name}['{key}']", config[key])
    if not (hidden_size and num_heads):
        # A composite model whose text config has a name of its own
        # ("language_config", "llm_config", "thinker_config").
        nested = sorted(
            key
            for key, value in config.items()
            if key.endswith("_config") and isinstance(value, dict)
        )
        multimodal = (
            f" (for a multimodal model, pass its text model's config, one of "
            f"{nested})"
            if nested
            else ""
        )
        raise ValueError(
            f"`{name}` must give `head_dim`, or `hidden_size` and "
            f"`num_attention_heads`{multimodal}. Received: config with keys "
            f"{sorted(config)}"
        )
    return hidden_size // num_heads


def _warn_as_transformers(rope_type, parameters, config, name):
    """Warn where transformers' `RotaryEmbeddingConfigMixin.validate_rope` warns.

    Only its warnings about values the layer takes as they are; what it
    refuses, and the keys and values the schedules cannot take, the
    layer's constructor refuses (`rope_scaling.check_scaling`).
    """
    factor = parameters.get("factor")
    trained = config.get("max_position_embeddings")
    original = parameters.get("original_max_position_embeddings")
    problems = []
    if rope_type in ("linear", "dynamic", "yarn", "llama3", "longrope") and (
        isinstance(factor, (int, float)) and factor < 1
    ):
        problems.append(f"`factor` should be at least 1. Received: factor={factor!r}")
    if rope_type == "yarn" and trained and original and factor is not None:
        implicit = trained / original
        if implicit not in (factor, 1):
            problems.append(
                "`factor` should be max_position_embeddings / "
                f"original_max_position_embeddings = {implicit}; the explicit "
                f"factor is used. Received: factor={factor!r}"
            )
    if rope_type == "llama3" and trained and original and original >= trained:
        problems.append(
            "`original_max_position_embeddings` should be less than "
            f"max_position_embeddings={trained}. Received: "
            f"original_max_position_embeddings={original!r}"
        )
    for problem in problems:
        warnings.warn(f"In `{name}`'s RoPE: {problem}", UserWarning, stacklevel=3)


# The decoders whose attention `attention_from_hf` builds, by `model_type`.
_ATTENTION_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3",
    "gemma3_text",
    "llama4",
    "llama4_text",
)
_GEMMA3_MODEL_TYPES = ("gemma3", "gemma3_text")
# The encoders of Transformer-XL's relative attention: the names of their
# attention's weights, in the order query, key, value, output, position
# projection, content bias `u`, position bias `v`; the position's arguments.
_RELATIVE_ENCODERS = {
    "parakeet_encoder": (
        ("q_proj", "k_proj", "v_proj", "o_proj", "relative_k_proj", "bias_u", "bias_v"),
        {},
    ),
    "wav2vec2-conformer": (
        ("linear_q", "linear_k", "linear_v", "linear_out", "linear_pos",
         "pos_bias_u", "pos_bias_v"),
        {},
    ),
    "xlnet": (("q", "k", "v", "o", "r", "r_w_bias", "r_r_bias"), {"pairing": "half"}),
}
# DeBERTa-v2's attention weights, its encoder's relative embeddings and their
# LayerNorm, and the LayerNorm after the residual, which is not the
# attention's.
_DEBERTA_WEIGHTS = (
    "query_proj",
    "key_proj",
    "value_proj",
    "pos_key_proj",
    "pos_query_proj",
    "output.dense",
    "rel_embeddings",
    "encoder.LayerNorm",
    "output.LayerNorm",
)
# XLNet's weights outside its content stream's attention: the segment
# term's (`seg_mat`) and the LayerNorm after the residual.
_XLNET_OTHER_WEIGHTS = ("r_s_bias", "seg_embed", "layer_norm.weight", "layer_norm.bias")
# Whether each family's projections have biases, from its config: Qwen2's
# query, key and value always, its output never; the others' all or none,
# as `attention_bias` says.
_PROJECTION_NAMES = (
    ("q_proj", "query"),
    ("k_proj", "key"),
    ("v_proj", "value"),
    ("o_proj", "output"),
)


def attention_from_hf(config, state_dict, layer_index=0, shared_position=None):
    """A Hugging Face decoder layer's attention, with its weights, in one call.

    Reads a model's `config.json` (parsed into a dict) and one layer's
    attention weights as transformers' `state_dict` names them (NumPy
    arrays, or anything `np.asarray` reads; keys such as `"q_proj.weight"`,
    with or without the model's prefix, `"model.layers.0.self_attn."`), and
    returns a built `PositionalMultiHeadAttention` that computes what that
    layer computes: its position (`positions_per_layer`), its key/value
    heads (`num_key_value_heads`), its query/key normalisation, its
    sliding window, and its weights, transposed and reshaped from torch's
    `Linear` layout `(out, in)` to Keras' `(in, heads, head_dim)` and
    `(heads, head_dim, out)`. No torch is needed. RoPE's buffers that
    older checkpoints save with each layer (Llama 2's
    `rotary_emb.inv_freq`) are checked against the frequencies the layer
    computes, in the checkpoint's precision, and skipped: a `ValueError`
    shows both where they differ.

    Families (`model_type`):

    - `"llama"` (Llama 2 and 3, with llama3 RoPE scaling), `"mistral"`
      (its sliding window on every layer), `"qwen2"` (biases on the query,
      key and value projections; sliding-window layers as its `layer_types`
      or `use_sliding_window` and `max_window_layers` give them) and
      `"qwen3"` (`q_norm` and `k_norm`, RMSNorm per head before RoPE:
      `qk_norm="head"`);
    - `"gemma3"`, `"gemma3_text"`: sliding-window and full layers, each
      with its RoPE, the per-head RMSNorm of queries and keys with Gemma's
      scale `1 + weight`, and the logits' scale `query_pre_attn_scalar **
      -0.5`, folded into the query norm's scale where it is not the head
      size's. A logit soft cap (`attn_logit_softcapping`, Gemma 2's) is
      refused;
    - `"parakeet_encoder"`, `"wav2vec2-conformer"` (with
      `position_embeddings_type="relative"`) and `"xlnet"`: Transformer-XL's
      relative attention (`TransformerXLPosition`), its position
      projection and its content and position biases; XLNet's content
      stream, without the segment term, and up to the einsum with `o`: its
      residual and LayerNorm are the caller's (their weights, and the
      segment term's, are passed over);
    - `"deberta-v2"` (DeBERTa v2 and v3): its disentangled attention
      (`DisentangledPosition`), with the encoder's `rel_embeddings` and
      their LayerNorm (`norm_rel_ebd`) in the state dict beside the layer's
      `attention.self.*` and `attention.output.dense`, the output projection
      (the LayerNorm after the residual is passed over);
    - `"t5"`, `"mt5"`: T5's self-attention with its relative bias
      (`RelativePositionBias`), bidirectional in the encoder and causal
      where the config says `is_decoder` (pass `dict(config,
      is_decoder=True)` for a decoder layer). The bias lives in the first
      block (`relative_attention_bias.weight`) and serves every layer:
      give it in the state dict of any layer, or share the first layer's
      with `shared_position`. T5's logits are not scaled,
      so the query kernel is multiplied by `sqrt(d_kv)`;
    - `"llama4"`, `"llama4_text"`: RoPE and NoPE layers, the attention
      temperature of the NoPE layers, and with `use_qk_norm` the L2 norm of
      the RoPE layers' queries and keys after RoPE
      (`qk_norm="head_unscaled"`). transformers' temperature counts the
      tokens, left padding included, not the position ids: give a NoPE
      layer `0 .. length - 1` (the default) to match it. Llama 4's chunked
      attention (`attention_chunk_size`, keys in the query's chunk only) is
      not applied: the layer is exact for sequences up to that length, and
      warns of it.

    A sliding window needs Keras 3.15 or later (`sliding_window=`).

    Args:
        config: dict. The parsed `config.json`; a composite model's text
            config is read as `text_config` finds it.
        state_dict: dict of str to array. One layer's attention weights.
        shared_position: None, or the `position` of an attention this
            function built for another layer of the same model: T5's
            relative bias and DeBERTa's relative embeddings are one table
            for every layer, which this layer then shares (trained once,
            saved once) rather than holding a copy; the state dict need not
            hold it. Refused for the other families, whose positions are
            their own per layer. Defaults to `None`.
        layer_index: int. The layer's index, for a decoder's position and
            window (the encoders' attention is alike in every layer).
            Defaults to `0`.

    Returns:
        A built `PositionalMultiHeadAttention`, its projections, and the
        norms' scales where it has them, holding the layer's weights. Its
        input is the hidden states, `(batch, sequence, hidden_size)`, as
        `attention(x, x, use_causal_mask=True)`; give `query_positions` and
        `key_positions` where the model's position ids are not `0 ..
        length - 1` (left padding).

    Example:

    >>> rng = np.random.default_rng(0)
    >>> qwen3 = {
    ...     "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 1,
    ...     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    ...     "rope_theta": 1000000.0,
    ... }
    >>> state_dict = {
    ...     "q_proj.weight": rng.normal(size=(32, 32)),
    ...     "k_proj.weight": rng.normal(size=(16, 32)),
    ...     "v_proj.weight": rng.normal(size=(16, 32)),
    ...     "o_proj.weight": rng.normal(size=(32, 32)),
    ...     "q_norm.weight": np.ones(8), "k_norm.weight": np.ones(8),
    ... }
    >>> attention = attention_from_hf(qwen3, state_dict)
    >>> attention.num_key_value_heads, attention.qk_norm
    (2, 'head')
    >>> tuple(attention.key_dense.kernel.shape)
    (32, 2, 8)
    """
    import numpy as np

    _check_dict(config)
    text, name = text_config(config)
    model_type = text.get("model_type")
    readable = (
        _ATTENTION_MODEL_TYPES + tuple(_RELATIVE_ENCODERS) + ("deberta-v2", "t5", "mt5")
    )
    if model_type not in readable:
        raise ValueError(
            "`attention_from_hf` builds the attention of "
            f"{', '.join(map(repr, readable))} "
            "models. Received: "
            f"{name} with model_type={model_type!r}"
        )
    if model_type in _RELATIVE_ENCODERS:
        return _relative_encoder_attention(text, name, model_type, state_dict)
    if shared_position is not None and model_type not in ("deberta-v2", "t5", "mt5"):
        raise ValueError(
            "`shared_position` shares the one table of T5's relative bias or "
            "DeBERTa's relative embeddings between layers; a "
            f"{model_type} layer's position is its own. Received: "
            f"shared_position={type(shared_position).__name__}"
        )
    if model_type == "deberta-v2":
        return _deberta_attention(text, name, state_dict, shared_position)
    if model_type in ("t5", "mt5"):
        return _t5_attention(text, name, state_dict, shared_position)
    num_layers = text.get("num_hidden_layers")
    ops.check_positive_int(f"{name}['num_hidden_layers']", num_layers)
    if (
        isinstance(layer_index, bool)
        or not isinstance(layer_index, numbers.Integral)
        or not 0 <= layer_index < num_layers
    ):
        raise ValueError(
            f"`layer_index` must be a layer of the model, 0 to {num_layers - 1}. "
            f"Received: layer_index={layer_index!r}"
        )
    hidden_size = text.get("hidden_size")
    heads = text.get("num_attention_heads")
    for key, value in (("hidden_size", hidden_size), ("num_attention_heads", heads)):
        ops.check_positive_int(f"{name}[{key!r}]", value)
    key_value_heads = text.get("num_key_value_heads") or heads
    head_dim = _head_dim(text, name)
    llama4 = model_type in _LLAMA4_MODEL_TYPES
    position = positions_per_layer(config)[layer_index]
    arguments = dict(
        num_heads=heads,
        key_dim=head_dim,
        num_key_value_heads=key_value_heads,
        position=position,
        use_bias=model_type == "qwen2" or bool(text.get("attention_bias", False)),
    )
    gemma3 = model_type in _GEMMA3_MODEL_TYPES
    if gemma3 and text.get("attn_logit_softcapping") is not None:
        raise ValueError(
            "The attention's logits are capped (`attn_logit_softcapping`), which "
            "PositionalMultiHeadAttention does not compute. Received: "
            f"{name}['attn_logit_softcapping']={text['attn_logit_softcapping']!r}"
        )
    if model_type == "qwen3" or gemma3:
        arguments.update(qk_norm="head", qk_norm_epsilon=text.get("rms_norm_eps", 1e-6))
    if llama4 and text.get("use_qk_norm", True) and type(position).__name__ == "RotaryEmbedding":
        arguments.update(
            qk_norm="head_unscaled",
            qk_norm_after_position=True,
            qk_norm_epsilon=text.get("rms_norm_eps", 1e-5),
        )
    if llama4 and text.get("attention_chunk_size") and position is not None:
        warnings.warn(
            f"Llama 4's chunked attention ({name}['attention_chunk_size']="
            f"{text['attention_chunk_size']}) is not applied: the attention is "
            "exact for sequences up to that many tokens.",
            stacklevel=2,
        )
    window = _sliding_window_of(text, model_type, layer_index)
    if window is not None:
        ops.check_positive_int(f"{name}['sliding_window']", window)
        if "sliding_window" not in _multi_head_attention_arguments():
            raise ValueError(
                f"Layer {layer_index} of this {model_type} model attends over a "
                f"sliding window of {window} tokens, which needs Keras 3.15 or "
                f"later (`sliding_window=`): upgrade Keras. Received: Keras "
                f"{keras.version()}"
            )
        arguments["sliding_window"] = window
    attention = keras.saving.get_registered_object(
        "keras_posenc>PositionalMultiHeadAttention"
    )(**arguments)
    attention.build((None, None, hidden_size), (None, None, hidden_size))

    weights = _layer_weights(state_dict)
    projections = {
        "query": (attention.query_dense, heads),
        "key": (attention.key_dense, key_value_heads),
        "value": (attention.value_dense, key_value_heads),
        "output": (attention.output_dense, heads),
    }
    for hf_name, role in _PROJECTION_NAMES:
        dense, count = projections[role]
        kernel = weights.pop(f"{hf_name}.weight", None)
        if kernel is None:
            raise ValueError(
                f"`state_dict` must hold {hf_name}.weight, the {role} projection. "
                f"Received: keys {sorted(state_dict)}"
            )
        kernel = np.asarray(kernel, "float32")
        if role == "output":
            expected, shape = (hidden_size, heads * head_dim), (heads, head_dim, hidden_size)
        else:
            expected, shape = (count * head_dim, hidden_size), (hidden_size, count, head_dim)
        if kernel.shape != expected:
            raise ValueError(
                f"`state_dict['{hf_name}.weight']` must have shape {expected} for "
                f"this config. Received: shape {kernel.shape}"
            )
        # torch's `Linear` holds `(out, in)`; Keras' projections `(in, ...)`.
        dense.kernel.assign(kernel.T.reshape(shape))
        bias = weights.pop(f"{hf_name}.bias", None)
        if attention.use_bias:
            size = hidden_size if role == "output" else count * head_dim
            bias = np.zeros(size, "float32") if bias is None else np.asarray(bias, "float32")
            dense.bias.assign(bias if role == "output" else bias.reshape(count, head_dim))
        elif bias is not None:
            raise ValueError(
                f"`state_dict` holds {hf_name}.bias, which this {model_type} "
                "config's projections have none of (`attention_bias` false)."
            )
    for hf_name, role in (("q_norm.weight", "query"), ("k_norm.weight", "key")):
        scale = weights.pop(hf_name, None)
        if attention.qk_norm == "head":
            if scale is None:
                raise ValueError(
                    f"`state_dict` must hold {hf_name}, the {role} norm's scale "
                    f"of a {model_type} layer. Received: keys {sorted(state_dict)}"
                )
            scale = np.asarray(scale, "float32")
            if gemma3:
                # Gemma's RMSNorm scales by `1 + weight`, in float32.
                scale = np.float32(1.0) + scale
                if role == "query":
                    # Its logits' scale, `query_pre_attn_scalar ** -0.5`,
                    # where the layer's is `head_dim ** -0.5`.
                    scalar = text.get("query_pre_attn_scalar", head_dim)
                    scale = scale * np.float32(math.sqrt(head_dim / scalar))
            getattr(attention, f"{role}_norm_scale").assign(scale)
    _check_rotary_buffers(weights, position, head_dim)
    if weights:
        raise ValueError(
            f"`state_dict` holds weights that a {model_type} attention layer "
            f"has no place for: {sorted(weights)}"
        )
    return attention


def _check_rotary_buffers(weights, position, head_dim):
    """Take RoPE's buffers (`rotary_emb.inv_freq`) out of `weights`, checked.

    Older checkpoints (Llama 2's) save transformers' inverse frequencies
    with each layer: they are no weight, but they must be the frequencies
    that `position` computes, in the checkpoint's precision. A layer
    without RoPE leaves them in `weights`, which have no place then.
    """
    import numpy as np

    if type(position).__name__ != "RotaryEmbedding":
        return
    for name in [name for name in weights if name.split(".")[-1] == "inv_freq"]:
        given = np.asarray(weights[name])
        rotated = position.rotary_dim or head_dim
        expected, _ = rope_scaling.rope_parameters(
            position.scaling, rotated, position.max_wavelength
        )
        # Not Keras' conversion, which warns on PyTorch (NumPy 2's `copy`).
        expected = _backend.static_value(expected)
        # A checkpoint in float16 or bfloat16 rounds them to 8 or 11 bits.
        half = given.dtype.itemsize <= 2
        if given.shape != expected.shape or not np.allclose(
            given.astype("float64"),
            expected,
            rtol=2.0**-8 if half else 1e-5,
            atol=2.0**-24 if half else 0.0,
        ):
            raise ValueError(
                f"`state_dict['{name}']` must be the inverse frequencies of "
                f"this config's RoPE, {np.array2string(expected, precision=6)} "
                f"(rope_theta={position.max_wavelength}, scaling="
                f"{position.scaling}), which the layer computes. Received: "
                f"{np.array2string(given.astype('float64'), precision=6)} of "
                f"shape {given.shape}"
            )
        del weights[name]


def _relative_encoder_attention(text, name, model_type, state_dict):
    """`attention_from_hf` of a Transformer-XL encoder: Parakeet, Conformer, XLNet."""
    import numpy as np

    names, position_arguments = _RELATIVE_ENCODERS[model_type]
    xlnet = model_type == "xlnet"
    if model_type == "wav2vec2-conformer":
        kind = text.get("position_embeddings_type", "relative")
        if kind != "relative":
            raise ValueError(
                "`attention_from_hf` reads a Wav2Vec2-Conformer's relative "
                "attention only. Received: "
                f"{name}['position_embeddings_type']={kind!r}"
            )
    if xlnet:
        hidden_size, heads = text.get("d_model"), text.get("n_head")
        head_dim = text.get("d_head")
        for key, value in (("d_model", hidden_size), ("n_head", heads), ("d_head", head_dim)):
            ops.check_positive_int(f"{name}[{key!r}]", value)
        clamp_len = text.get("clamp_len", -1)
        if clamp_len is not None and clamp_len > 0:
            position_arguments = dict(position_arguments, clamp_len=clamp_len)
    else:
        hidden_size, heads = text.get("hidden_size"), text.get("num_attention_heads")
        for key, value in (("hidden_size", hidden_size), ("num_attention_heads", heads)):
            ops.check_positive_int(f"{name}[{key!r}]", value)
        head_dim = hidden_size // heads
    weights = _layer_weights(state_dict, names + (_XLNET_OTHER_WEIGHTS if xlnet else ()))
    query, key, value, output, position_kernel, content_bias, position_bias = names
    # Parakeet's projections have biases as `attention_bias` says, the
    # Conformer's always, XLNet's never.
    use_bias = (not xlnet) and (
        model_type == "wav2vec2-conformer" or bool(text.get("attention_bias", True))
    )
    attention = keras.saving.get_registered_object(
        "keras_posenc>PositionalMultiHeadAttention"
    )(
        num_heads=heads,
        key_dim=head_dim,
        use_bias=use_bias,
        position=keras.saving.get_registered_object(
            "keras_posenc>TransformerXLPosition"
        )(**position_arguments),
    )
    attention.build((None, None, hidden_size), (None, None, hidden_size))

    def kernel_of(weight_name, heads_last):
        """The weight as Keras' `(in, heads, dim)` or `(heads, dim, out)` kernel."""
        array = _required(weights, weight_name)
        if xlnet:
            # XLNet's are `(d_model, heads, dim)` already.
            return array if not heads_last else np.transpose(array, (1, 2, 0))
        if heads_last:
            return array.T.reshape(heads, head_dim, hidden_size)
        return array.T.reshape(array.shape[1], heads, head_dim)

    suffix = "" if xlnet else ".weight"
    for dense, weight_name in (
        (attention.query_dense, query),
        (attention.key_dense, key),
        (attention.value_dense, value),
    ):
        _assign(dense.kernel, kernel_of(weight_name + suffix, False), weight_name)
        if use_bias:
            bias = _required(weights, f"{weight_name}.bias")
            _assign(dense.bias, bias.reshape(heads, head_dim), f"{weight_name}.bias")
    _assign(attention.output_dense.kernel, kernel_of(output + suffix, True), output)
    if use_bias:
        _assign(attention.output_dense.bias, _required(weights, f"{output}.bias"), f"{output}.bias")
    scheme = attention.position
    _assign(scheme.position_kernel, kernel_of(position_kernel + suffix, False), position_kernel)
    _assign(scheme.content_bias, _required(weights, content_bias), content_bias)
    _assign(scheme.position_bias, _required(weights, position_bias), position_bias)
    for other in _XLNET_OTHER_WEIGHTS if xlnet else ():
        weights.pop(other, None)
    if weights:
        raise ValueError(
            f"`state_dict` holds weights that a {model_type} attention layer "
            f"has no place for: {sorted(weights)}"
        )
    return attention


def _check_shared(shared_position, position):
    """`shared_position`, if it is a position of the config's kind and sizes, or None."""
    if shared_position is None:
        return None
    if type(shared_position) is not type(position) or (
        shared_position.get_config() | {"name": None}
    ) != (position.get_config() | {"name": None}):
        raise ValueError(
            "`shared_position` must be the position of another layer of the "
            f"same model: a {type(position).__name__} of the config's "
            f"arguments. Received: shared_position={shared_position!r}"
        )
    return shared_position


def _deberta_attention(text, name, state_dict, shared_position=None):
    """`attention_from_hf` of DeBERTa-v2's disentangled attention."""
    hidden_size, heads = text.get("hidden_size"), text.get("num_attention_heads")
    for key, value in (("hidden_size", hidden_size), ("num_attention_heads", heads)):
        ops.check_positive_int(f"{name}[{key!r}]", value)
    head_dim = text.get("attention_head_size") or hidden_size // heads
    terms = text.get("pos_att_type") or []
    if isinstance(terms, str):
        terms = [term for term in terms.lower().split("|") if term]
    position = None
    share = bool(text.get("share_att_key", False))
    norms = [
        part.strip() for part in str(text.get("norm_rel_ebd", "none")).lower().split("|")
    ]
    if text.get("relative_attention", False) and terms:
        max_relative = text.get("max_relative_positions", -1)
        if max_relative is None or max_relative < 1:
            max_relative = text.get("max_position_embeddings", 512)
        position = keras.saving.get_registered_object(
            "keras_posenc>DisentangledPosition"
        )(
            max_relative_positions=max_relative,
            position_buckets=text.get("position_buckets", -1),
            share_att_key=share,
            pos_att_type=list(terms),
            layer_norm="layer_norm" in norms,
            layer_norm_epsilon=text.get("layer_norm_eps", 1e-7),
        )
    shared = _check_shared(shared_position, position)
    position = shared or position
    attention = keras.saving.get_registered_object(
        "keras_posenc>PositionalMultiHeadAttention"
    )(num_heads=heads, key_dim=head_dim, position=position)
    attention.build((None, None, hidden_size), (None, None, hidden_size))
    weights = _layer_weights(state_dict, _DEBERTA_WEIGHTS)

    def heads_kernel(weight_name):
        return _required(weights, weight_name).T.reshape(hidden_size, heads, head_dim)

    def heads_bias(weight_name):
        return _required(weights, weight_name).reshape(heads, head_dim)

    for dense, weight_name in (
        (attention.query_dense, "query_proj"),
        (attention.key_dense, "key_proj"),
        (attention.value_dense, "value_proj"),
    ):
        _assign(dense.kernel, heads_kernel(f"{weight_name}.weight"), weight_name)
        _assign(dense.bias, heads_bias(f"{weight_name}.bias"), f"{weight_name}.bias")
    output = _required(weights, "output.dense.weight")  # (hidden, heads * dim)
    _assign(
        attention.output_dense.kernel,
        output.T.reshape(heads, head_dim, hidden_size),
        "output.dense.weight",
    )
    _assign(attention.output_dense.bias, _required(weights, "output.dense.bias"), "output.dense.bias")
    if position is not None and shared is None:
        _assign(position.embeddings, _required(weights, "rel_embeddings.weight"), "rel_embeddings")
        if position.layer_norm:
            _assign(position.layer_norm_gamma, _required(weights, "encoder.LayerNorm.weight"), "encoder.LayerNorm.weight")
            _assign(position.layer_norm_beta, _required(weights, "encoder.LayerNorm.bias"), "encoder.LayerNorm.bias")
        if not share:
            for term, role in (("c2p", "key"), ("p2c", "query")):
                if term in position.pos_att_type:
                    weight_name = f"pos_{role}_proj"
                    _assign(getattr(position, f"pos_{role}_kernel"), heads_kernel(f"{weight_name}.weight"), weight_name)
                    _assign(getattr(position, f"pos_{role}_bias"), heads_bias(f"{weight_name}.bias"), f"{weight_name}.bias")
    if shared is not None:
        # The shared table is the other layer's; a copy given here is the same.
        for other in ("rel_embeddings.weight", "encoder.LayerNorm.weight", "encoder.LayerNorm.bias"):
            weights.pop(other, None)
    for other in ("output.LayerNorm.weight", "output.LayerNorm.bias"):
        weights.pop(other, None)
    if weights:
        raise ValueError(
            "`state_dict` holds weights that a deberta-v2 attention layer has "
            f"no place for: {sorted(weights)}"
        )
    return attention


def _t5_attention(text, name, state_dict, shared_position=None):
    """`attention_from_hf` of T5's self-attention, its relative bias inside."""
    import numpy as np

    hidden_size, heads, head_dim = text.get("d_model"), text.get("num_heads"), text.get("d_kv")
    for key, value in (("d_model", hidden_size), ("num_heads", heads), ("d_kv", head_dim)):
        ops.check_positive_int(f"{name}[{key!r}]", value)
    position = keras.saving.get_registered_object("keras_posenc>RelativePositionBias")(
        heads,
        num_buckets=text.get("relative_attention_num_buckets", 32),
        max_distance=text.get("relative_attention_max_distance", 128),
        bidirectional=not text.get("is_decoder", False),
    )
    shared = _check_shared(shared_position, position)
    position = shared or position
    attention = keras.saving.get_registered_object(
        "keras_posenc>PositionalMultiHeadAttention"
    )(num_heads=heads, key_dim=head_dim, position=position, use_bias=False)
    attention.build((None, None, hidden_size), (None, None, hidden_size))
    weights = _layer_weights(state_dict, ("q", "k", "v", "o", "relative_attention_bias"))
    # T5 does not scale its logits; the layer multiplies the queries by
    # `1 / sqrt(d_kv)`, which the query kernel undoes.
    unscaled = np.float32(math.sqrt(head_dim))
    for dense, weight_name, factor in (
        (attention.query_dense, "q", unscaled),
        (attention.key_dense, "k", 1.0),
        (attention.value_dense, "v", 1.0),
    ):
        kernel = _required(weights, f"{weight_name}.weight")  # (heads * d_kv, d_model)
        if kernel.shape != (heads * head_dim, hidden_size):
            raise ValueError(
                f"`state_dict['{weight_name}.weight']` must have shape "
                f"{(heads * head_dim, hidden_size)} for this config. Received: "
                f"shape {kernel.shape}"
            )
        _assign(dense.kernel, kernel.T.reshape(hidden_size, heads, head_dim) * factor, weight_name)
    output = _required(weights, "o.weight")  # (d_model, heads * d_kv)
    if output.shape != (hidden_size, heads * head_dim):
        raise ValueError(
            f"`state_dict['o.weight']` must have shape {(hidden_size, heads * head_dim)} "
            f"for this config. Received: shape {output.shape}"
        )
    _assign(
        attention.output_dense.kernel,
        output.T.reshape(heads, head_dim, hidden_size),
        "o.weight",
    )
    if shared is None:
        _assign(
            position.embeddings,
            _required(weights, "relative_attention_bias.weight"),
            "relative_attention_bias.weight",
        )
    else:
        weights.pop("relative_attention_bias.weight", None)
    if weights:
        raise ValueError(
            "`state_dict` holds weights that a T5 attention layer has no place "
            f"for: {sorted(weights)}"
        )
    return attention


def _required(weights, weight_name):
    """`weights[weight_name]` as float32 NumPy, taken out, or a `ValueError`."""
    import numpy as np

    if weight_name not in weights:
        raise ValueError(
            f"`state_dict` must hold {weight_name}. Received: keys "
            f"{sorted(weights)}"
        )
    return np.asarray(weights.pop(weight_name), "float32")


def _assign(variable, array, weight_name):
    """`variable.assign(array)`, or a `ValueError` naming a weight of another shape."""
    if tuple(array.shape) != tuple(variable.shape):
        raise ValueError(
            f"`state_dict['{weight_name}']` does not fit this config's "
            f"{variable.path}, of shape {tuple(variable.shape)}. Received: "
            f"shape {tuple(array.shape)}"
        )
    variable.assign(array)


def _sliding_window_of(text, model_type, layer_index):
    """The layer's sliding window, as transformers reads the config, or None."""
    window = text.get("sliding_window")
    if model_type == "mistral":
        return window
    if model_type in _GEMMA3_MODEL_TYPES and window is not None:
        layer_types = text.get("layer_types")
        if layer_types is None:
            # transformers' default: every `sliding_window_pattern`-th (6th)
            # layer full, the others sliding.
            pattern = text.get("sliding_window_pattern", 6)
            return None if (layer_index + 1) % pattern == 0 else window
        return window if layer_types[layer_index] == "sliding_attention" else None
    if model_type not in ("qwen2", "qwen3") or window is None:
        return None
    layer_types = text.get("layer_types")
    if layer_types is not None:
        return window if layer_types[layer_index] == "sliding_attention" else None
    if not text.get("use_sliding_window", False):
        return None
    return window if layer_index >= text.get("max_window_layers", 28) else None


def _layer_weights(state_dict, names=None):
    """`state_dict` keyed by the attention's own names, the model's prefix cut.

    A key is cut to the one of `names` it ends with (`"r_w_bias"`,
    `"q_proj"`, with `.weight` or `.bias` after it), or else to its last two
    parts (`"q_proj.weight"`).
    """
    if not isinstance(state_dict, dict):
        raise ValueError(
            "`state_dict` must be a dict of weight names to arrays. Received: "
            f"{type(state_dict).__name__}"
        )
    known = set()
    for weight_name in names or ():
        known.update((weight_name, f"{weight_name}.weight", f"{weight_name}.bias"))
    weights = {}
    for key, value in state_dict.items():
        parts = str(key).split(".")
        short = next(
            (
                ".".join(parts[-count:])
                for count in (3, 2, 1)
                if ".".join(parts[-count:]) in known
            ),
            ".".join(parts[-2:]),
        )
        if short in weights:
            raise ValueError(
                f"`state_dict` holds {short} twice (one layer's weights only). "
                f"Received: keys {sorted(state_dict)}"
            )
        weights[short] = value
    return weights


def _multi_head_attention_arguments():
    import inspect

    return inspect.signature(keras.layers.MultiHeadAttention.__init__).parameters
