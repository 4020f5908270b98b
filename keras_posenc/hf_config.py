"""Hugging Face config.json -> layer arguments.

A model's `config.json`, parsed into a dict, is read here as Hugging Face
transformers reads it, and turned into the arguments of a layer's
constructor; the layer's own classmethod (`RotaryEmbedding.from_hf_config`)
builds the layer from them; `position_arguments_per_layer` reads the
position of each layer of a model that mixes layers with RoPE and without,
and `attention_arguments` a layer's attention. What each model family
needs is one entry of `FAMILIES`, under transformers' `model_type`.
This module imports no layer: `keras_posenc.hf_attention`, above the
layers, builds them from these arguments. Nothing here computes with
tensors.
"""

import dataclasses
import math
import numbers
import typing
import warnings

from keras_posenc import ops

# The keys under which transformers' `PretrainedConfig.get_text_config()`
# looks for a composite model's text config, in its order: encoders', then
# decoders'.
TEXT_CONFIG_KEYS = ("text_encoder", "decoder", "generator", "text_config")

# The entries of `layer_types` that transformers' `layer_type_validation`
# allows.
_LAYER_TYPES = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
)


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
    family = _family(config.get("model_type"))
    own = family.rotary(config, parameters, base) if family.rotary else {}
    if "max_wavelength" in own:
        # The family reads its RoPE whole.
        return own
    grid = _mrope_arguments(parameters)
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
    rotary_dim = None
    if family.latent:
        # The layer turns the slice whole.
        ops.check_positive_int(
            f"{name}['qk_rope_head_dim']", config.get("qk_rope_head_dim")
        )
    elif "qk_rope_head_dim" in config:
        latent = tuple(key for key, entry in FAMILIES.items() if entry.latent)
        raise ValueError(
            f"`{name}` gives `qk_rope_head_dim`, a separately rotated slice "
            "of each head (multi-head latent attention), but its pairing is "
            f"known only for model types {latent}. Received: "
            f"model_type={config.get('model_type')!r}"
        )
    elif "rotary_dim" in own:
        # The family gives the rotated width itself.
        rotary_dim = own["rotary_dim"]
    elif rope_type == "proportional":
        # Spaced over the whole head, the share rotating: a schedule key.
        parameters["partial_rotary_factor"] = partial
    elif partial != 1.0:
        rotary_dim = int(head_dim * partial)
    pairing = "interleaved" if family.interleaved else "half"
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
        **own,
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
    hold them. `keras_posenc.hf_attention.positions_per_layer` builds the
    layers from these arguments.

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
    if _family(text.get("model_type")).temperature and _temperature_tuning(
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
    """Deprecated: `keras_posenc.hf_attention.positions_per_layer(config)`."""
    from keras_posenc import hf_attention

    _warn_moved("positions_per_layer")
    return hf_attention.positions_per_layer(config)


def attention_from_hf(config, state_dict, layer_index=0, shared_position=None):
    """Deprecated: `keras_posenc.hf_attention.attention_from_hf`, same arguments."""
    from keras_posenc import hf_attention

    _warn_moved("attention_from_hf")
    return hf_attention.attention_from_hf(
        config, state_dict, layer_index, shared_position
    )


def _warn_moved(function_name):
    """Warn that `function_name`, which builds layers, moved to `hf_attention`."""
    warnings.warn(
        f"`keras_posenc.hf_config.{function_name}` moved: use "
        f"`keras_posenc.hf_attention.{function_name}`, the same function "
        "(hf_config reads configs into arguments; hf_attention builds the "
        "layers).",
        DeprecationWarning,
        stacklevel=3,
    )


def _temperature_tuning(config, name):
    """Whether a text config turns on Llama 4's attention temperature.

    transformers' Llama 4 turns it on by default; no other model has it.
    A number or null reads as transformers reads it, true unless zero or
    null (Llama 4 Scout's config.json gives 4); a string is refused, since
    transformers would read `"false"` as on.
    """
    tuning = config.get(
        "attn_temperature_tuning", _family(config.get("model_type")).temperature
    )
    if tuning is not None and not isinstance(tuning, numbers.Real):
        raise ValueError(
            f"`{name}['attn_temperature_tuning']` must be true or false. "
            f"Received: attn_temperature_tuning={tuning!r}"
        )
    return bool(tuning)


def _rope_layers(config, name, num_layers):
    """Whether each of the `num_layers` layers of a text config has RoPE."""
    rope_layers = _family(config.get("model_type")).rope_layers
    if rope_layers is None and "no_rope_layers" in config:
        rope_layers = _no_rope_layers
    if rope_layers is None:
        return [True] * num_layers
    return rope_layers(config, name, num_layers)


def _family(model_type):
    """`FAMILIES[model_type]`, or an entry of defaults for other models."""
    return FAMILIES.get(model_type, _OTHER_FAMILY)


def _check_dict(config):
    """Raise a `ValueError` unless `config` is a dict."""
    if not isinstance(config, dict):
        raise ValueError(
            "`config` must be a dict parsed from a Hugging Face config.json. "
            f"Received: config={config!r}"
        )


def _mrope_arguments(parameters, sections=None, cyclic=False):
    """The grid arguments of a config's M-RoPE, `{}` for a RoPE on one axis.

    Takes `mrope_section` and `mrope_interleaved` out of `parameters` and
    reads the `"mrope"` schedule as the default one, as transformers does.
    `sections` serve where the config gives none, and `cyclic` interleaves
    (`axis_layout="cyclic"`) whatever the config says: a family's M-RoPE.
    """
    given = parameters.pop("mrope_section", None)
    interleaved = parameters.pop("mrope_interleaved", False)
    if parameters.get("rope_type") == "mrope":
        parameters["rope_type"] = "default"
    if given is not None:
        sections = given
    if sections is None:
        return {}
    return {
        "num_axes": len(sections),
        "axis_layout": "cyclic" if interleaved or cyclic else "sections",
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


@dataclasses.dataclass(frozen=True)
class Weight:
    """One weight of a family's attention, as a layer's `state_dict` holds it.

    Args:
        name: str. Its name, the model's prefix cut (`"q_proj.weight"`).
        variable: str. Where it goes, an attribute path of the attention
            (`"query_dense.kernel"`, `"position.content_bias"`).
        layout: str. How the array becomes the variable: `"input"` (torch's
            `Linear`, `(out, in)`, to Keras' `(in, heads, dim)`),
            `"output"` (`(out, in)` to `(heads, dim, out)`), `"heads_last"`
            (`(in, heads, dim)` to `(heads, dim, in)`), `"reshape"` (to the
            variable's shape) or `"as_is"`. Defaults to `"as_is"`.
        missing: str. `"error"` where it must be given, `"zeros"` where a
            missing one is zeros. Defaults to `"error"`.
        offset: float. Added to it, in float32 (Gemma's norms scale by
            `1 + weight`). Defaults to `0.0`.
        scale: float. Its factor, in float32, after the offset. Defaults
            to `1.0`.
    """

    name: str
    variable: str
    layout: str = "as_is"
    missing: str = "error"
    offset: float = 0.0
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Family:
    """What one model family needs, read from its config: a `FAMILIES` entry.

    Its positions (`rotary_embedding_arguments`,
    `position_arguments_per_layer`) and, where `arguments` is given, its
    attention with its weights
    (`keras_posenc.hf_attention.attention_from_hf`, which reads nothing
    else of the family).

    Args:
        interleaved: bool. Whether its RoPE turns adjacent features
            `(2i, 2i + 1)` together. Defaults to `False`.
        latent: bool. Whether its attention is multi-head latent
            attention, whose RoPE turns a slice of each head apart,
            `qk_rope_head_dim` wide, whole; the other families' configs
            may not give `qk_rope_head_dim`. Defaults to `False`.
        rotary: callable or None. `(text, parameters, base)` -> the
            `RotaryEmbedding` arguments the family reads itself, over those
            read from the config. `parameters` is the RoPE dict, the keys
            it reads taken out, and `base` its base. Where they give
            `rotary_dim`, `partial_rotary_factor` is not applied; where
            they give `max_wavelength`, they are all of them. Defaults to
            `None`.
        rope_layers: callable or None. `(text, name, num_layers)` -> whether
            each layer has RoPE; `None`: every layer (or as
            `no_rope_layers` says, where the config gives it). Defaults
            to `None`.
        temperature: bool. Whether Llama 4's attention temperature is on
            by default on its layers without RoPE. Defaults to `False`.
        arguments: callable or None. `(family, config, text, name,
            layer_index)` -> `(hidden_size, arguments)`: the attention's
            input width and `PositionalMultiHeadAttention`'s arguments,
            `position` as a `(class name, arguments)` entry or None.
            `None`: its attention is not read. Defaults to `None`.
        weights: callable or None. `(family, text, arguments)` -> the
            attention's `Weight`s. Defaults to `None`.
        weight_names: tuple. The names its state dict's keys are cut to
            where a key's last two parts do not name the weight.
            Defaults to `()`.
        passed_over: tuple. Weights of its layers that are not the
            attention's, or not read. Defaults to `()`.
        shared_weights: tuple. The weights of a table every layer shares
            (`shared_position`); empty where positions are per layer.
            Defaults to `()`.
        per_layer: bool. Whether its layers differ, so that `layer_index`
            must be one of the model's. Defaults to `False`.
        bias: bool or None. Whether its projections have biases; `None`:
            as `attention_bias` says. Defaults to `None`.
        qk_norm: dict. The query/key norm's arguments of the attention,
            empty for none. Defaults to `{}`.
        qk_norm_key: str or None. The config key that turns the norm off
            where false (on by default), with the norm on layers with RoPE
            only. Defaults to `None`.
        norm_epsilon: float. The norm's epsilon where `rms_norm_eps` is not
            given. Defaults to `1e-6`.
        norm_offset: float. Added to the norms' scales. Defaults to `0.0`.
        query_scalar_key: str or None. The config key of the logits' scale
            `key ** -0.5`, where it is not the head width's, folded into
            the query norm's scale. Defaults to `None`.
        sliding_window: callable or None. `(text, layer_index)` -> the
            layer's window or None. Defaults to `None`.
        refused: dict. Config keys that the attention does not compute,
            refused where not null, to what they are. Defaults to `{}`.
        unapplied: dict. Config keys that are not applied, warned of where
            set on a layer with a position, to the warning. Defaults to `{}`.
        sizes: tuple. The config keys of the model's width, heads and head
            width (`None`: width / heads). Defaults to Llama's.
        position: tuple or None. The position's class name and its
            arguments, for the encoders'. Defaults to `None`.
        names: tuple. The encoders' weight names, in the order query, key,
            value, output, then their position's. Defaults to `()`.
        position_keys: tuple. Config keys that are the position's
            arguments of the same name, where positive. Defaults to `()`.
        requires: dict. Config keys to the value (and default) the
            attention is read for. Defaults to `{}`.
    """

    interleaved: bool = False
    latent: bool = False
    rotary: typing.Optional[typing.Callable] = None
    rope_layers: typing.Optional[typing.Callable] = None
    temperature: bool = False
    arguments: typing.Optional[typing.Callable] = None
    weights: typing.Optional[typing.Callable] = None
    weight_names: tuple = ()
    passed_over: tuple = ()
    shared_weights: tuple = ()
    per_layer: bool = False
    bias: typing.Optional[bool] = None
    qk_norm: dict = dataclasses.field(default_factory=dict)
    qk_norm_key: typing.Optional[str] = None
    norm_epsilon: float = 1e-6
    norm_offset: float = 0.0
    query_scalar_key: typing.Optional[str] = None
    sliding_window: typing.Optional[typing.Callable] = None
    refused: dict = dataclasses.field(default_factory=dict)
    unapplied: dict = dataclasses.field(default_factory=dict)
    sizes: tuple = ("hidden_size", "num_attention_heads", None)
    position: typing.Optional[tuple] = None
    names: tuple = ()
    position_keys: tuple = ()
    requires: dict = dataclasses.field(default_factory=dict)


def attention_arguments(config, layer_index=0):
    """`PositionalMultiHeadAttention`'s arguments for a layer of a Hugging Face model.

    Read as `FAMILIES[model_type]` says; see
    `keras_posenc.hf_attention.attention_from_hf`, which builds the layer
    from them and gives it its weights.

    Args:
        config: dict. The parsed `config.json`; a composite model's text
            config is read as `text_config` finds it.
        layer_index: int. The layer's index, for a decoder's position and
            window. Defaults to `0`.

    Returns:
        A tuple `(hidden_size, arguments)`: the width of the layer's input,
        and a dict of keyword arguments of `PositionalMultiHeadAttention`,
        its `position` a `(class name, arguments)` entry or None.

    Example:

    >>> mistral = {
    ...     "model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
    ...     "num_attention_heads": 4, "num_key_value_heads": 2,
    ...     "sliding_window": 4096,
    ... }
    >>> hidden_size, arguments = attention_arguments(mistral)
    >>> hidden_size, arguments["key_dim"], arguments["sliding_window"]
    (64, 16, 4096)
    >>> arguments["position"][0]
    'RotaryEmbedding'
    """
    text, name, family = attention_family(config)
    return family.arguments(family, config, text, name, layer_index)


def attention_family(config):
    """`(text, name, family)`: a config's text config, its name, its `FAMILIES` entry.

    Raises a `ValueError` naming the families whose attention is read where
    the config's is not one of them.
    """
    _check_dict(config)
    text, name = text_config(config)
    model_type = text.get("model_type")
    family = FAMILIES.get(model_type)
    if family is None or family.arguments is None:
        readable = [key for key, entry in FAMILIES.items() if entry.arguments]
        raise ValueError(
            "`attention_from_hf` builds the attention of "
            f"{', '.join(map(repr, readable))} models. Received: "
            f"{name} with model_type={model_type!r}"
        )
    return text, name, family


def _sizes(family, text, name):
    """`(hidden_size, heads, head_dim)` from the config keys `family.sizes` names."""
    hidden_key, heads_key, head_key = family.sizes
    hidden_size, heads = text.get(hidden_key), text.get(heads_key)
    for key in family.sizes:
        if key is not None:
            ops.check_positive_int(f"{name}[{key!r}]", text.get(key))
    if head_key is not None:
        return hidden_size, heads, text[head_key]
    return hidden_size, heads, hidden_size // heads


def _decoder_arguments(family, config, text, name, layer_index):
    """A decoder layer's attention: its position, heads, norms and window."""
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
    hidden_size, heads, _ = _sizes(family, text, name)
    position = position_arguments_per_layer(config)[layer_index]
    arguments = dict(
        num_heads=heads,
        key_dim=_head_dim(text, name),
        num_key_value_heads=text.get("num_key_value_heads") or heads,
        position=position,
        use_bias=family.bias
        if family.bias is not None
        else bool(text.get("attention_bias", False)),
    )
    for key, what in family.refused.items():
        if text.get(key) is not None:
            raise ValueError(
                f"{what} (`{key}`), which PositionalMultiHeadAttention does not "
                f"compute. Received: {name}[{key!r}]={text[key]!r}"
            )
    rope = position is not None and position[0] == "RotaryEmbedding"
    if family.qk_norm and (
        family.qk_norm_key is None or (text.get(family.qk_norm_key, True) and rope)
    ):
        arguments.update(
            family.qk_norm,
            qk_norm_epsilon=text.get("rms_norm_eps", family.norm_epsilon),
        )
    for key, warning in family.unapplied.items():
        if text.get(key) and position is not None:
            warnings.warn(
                warning.format(setting=f"{name}[{key!r}]={text[key]}"), stacklevel=4
            )
    window = family.sliding_window and family.sliding_window(text, layer_index)
    if window is not None:
        ops.check_positive_int(f"{name}['sliding_window']", window)
        arguments["sliding_window"] = window
    return hidden_size, arguments


def _decoder_weights(family, text, arguments):
    """A decoder layer's projections (`q_proj` ...) and its norms' scales."""
    weights = []
    for hf_name, role in (
        ("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("o_proj", "output")
    ):
        layout = "output" if role == "output" else "input"
        weights.append(Weight(f"{hf_name}.weight", f"{role}_dense.kernel", layout))
        if arguments["use_bias"]:
            weights.append(
                Weight(f"{hf_name}.bias", f"{role}_dense.bias", "reshape", "zeros")
            )
    if arguments.get("qk_norm") == "head":
        head_dim = arguments["key_dim"]
        scalar = text.get(family.query_scalar_key, head_dim)
        for hf_name, role in (("q_norm", "query"), ("k_norm", "key")):
            weights.append(
                Weight(
                    f"{hf_name}.weight",
                    f"{role}_norm_scale",
                    offset=family.norm_offset,
                    scale=math.sqrt(head_dim / scalar) if role == "query" else 1.0,
                )
            )
    return tuple(weights)


def _encoder_arguments(family, config, text, name, layer_index):
    """Transformer-XL's relative attention of an encoder: Parakeet, Conformer, XLNet."""
    for key, (value, default) in family.requires.items():
        if text.get(key, default) != value:
            raise ValueError(
                f"`attention_from_hf` reads a {text['model_type']} attention with "
                f"{key}={value!r} only. Received: {name}[{key!r}]="
                f"{text.get(key, default)!r}"
            )
    hidden_size, heads, head_dim = _sizes(family, text, name)
    kind, position = family.position
    for key in family.position_keys:
        # Read where positive (XLNet's `clamp_len`, -1 for none).
        if (text.get(key) or 0) > 0:
            position = dict(position, **{key: text[key]})
    use_bias = family.bias
    if use_bias is None:
        use_bias = bool(text.get("attention_bias", True))
    return hidden_size, dict(
        num_heads=heads, key_dim=head_dim, use_bias=use_bias, position=(kind, position)
    )


def _encoder_weights(family, text, arguments):
    """Transformer-XL's: the projections, the position's and the biases `u`, `v`."""
    query, key, value, output, position_kernel, content_bias, position_bias = family.names
    # XLNet's weights are `(d_model, heads, dim)` already, under bare names.
    linear = family.sizes[0] == "hidden_size"
    suffix = ".weight" if linear else ""
    weights = [
        Weight(f"{query}{suffix}", "query_dense.kernel", "input" if linear else "as_is"),
        Weight(f"{key}{suffix}", "key_dense.kernel", "input" if linear else "as_is"),
        Weight(f"{value}{suffix}", "value_dense.kernel", "input" if linear else "as_is"),
        Weight(f"{output}{suffix}", "output_dense.kernel", "output" if linear else "heads_last"),
        Weight(
            f"{position_kernel}{suffix}",
            "position.position_kernel",
            "input" if linear else "as_is",
        ),
        Weight(content_bias, "position.content_bias"),
        Weight(position_bias, "position.position_bias"),
    ]
    if arguments["use_bias"]:
        for hf_name, role in ((query, "query"), (key, "key"), (value, "value")):
            weights.append(Weight(f"{hf_name}.bias", f"{role}_dense.bias", "reshape"))
        weights.append(Weight(f"{output}.bias", "output_dense.bias"))
    return tuple(weights)


def _deberta_arguments(family, config, text, name, layer_index):
    """DeBERTa-v2's disentangled attention, with its relative embeddings."""
    hidden_size, heads, head_dim = _sizes(family, text, name)
    head_dim = text.get("attention_head_size") or head_dim
    terms = text.get("pos_att_type") or []
    if isinstance(terms, str):
        terms = [term for term in terms.lower().split("|") if term]
    norms = [
        part.strip() for part in str(text.get("norm_rel_ebd", "none")).lower().split("|")
    ]
    position = None
    if text.get("relative_attention", False) and terms:
        max_relative = text.get("max_relative_positions", -1)
        if max_relative is None or max_relative < 1:
            max_relative = text.get("max_position_embeddings", 512)
        position = (
            "DisentangledPosition",
            dict(
                max_relative_positions=max_relative,
                position_buckets=text.get("position_buckets", -1),
                share_att_key=bool(text.get("share_att_key", False)),
                pos_att_type=list(terms),
                layer_norm="layer_norm" in norms,
                layer_norm_epsilon=text.get("layer_norm_eps", 1e-7),
            ),
        )
    return hidden_size, dict(num_heads=heads, key_dim=head_dim, position=position)


def _deberta_weights(family, text, arguments):
    """DeBERTa-v2's projections, output, relative embeddings and their LayerNorm."""
    weights = []
    for hf_name, role in (("query_proj", "query"), ("key_proj", "key"), ("value_proj", "value")):
        weights.append(Weight(f"{hf_name}.weight", f"{role}_dense.kernel", "input"))
        weights.append(Weight(f"{hf_name}.bias", f"{role}_dense.bias", "reshape"))
    weights.append(Weight("output.dense.weight", "output_dense.kernel", "output"))
    weights.append(Weight("output.dense.bias", "output_dense.bias"))
    if arguments["position"] is None:
        return tuple(weights)
    position = arguments["position"][1]
    weights.append(Weight("rel_embeddings.weight", "position.embeddings"))
    if position["layer_norm"]:
        weights.append(Weight("encoder.LayerNorm.weight", "position.layer_norm_gamma"))
        weights.append(Weight("encoder.LayerNorm.bias", "position.layer_norm_beta"))
    if not position["share_att_key"]:
        for term, role in (("c2p", "key"), ("p2c", "query")):
            if term in position["pos_att_type"]:
                weights.append(
                    Weight(f"pos_{role}_proj.weight", f"position.pos_{role}_kernel", "input")
                )
                weights.append(
                    Weight(f"pos_{role}_proj.bias", f"position.pos_{role}_bias", "reshape")
                )
    return tuple(weights)


def _t5_arguments(family, config, text, name, layer_index):
    """T5's self-attention, its relative bias inside, its projections unbiased."""
    hidden_size, heads, head_dim = _sizes(family, text, name)
    position = (
        "RelativePositionBias",
        dict(
            num_heads=heads,
            num_buckets=text.get("relative_attention_num_buckets", 32),
            max_distance=text.get("relative_attention_max_distance", 128),
            bidirectional=not text.get("is_decoder", False),
        ),
    )
    return hidden_size, dict(
        num_heads=heads, key_dim=head_dim, position=position, use_bias=False
    )


def _t5_weights(family, text, arguments):
    """T5's `q`, `k`, `v`, `o` and its relative bias."""
    # T5 does not scale its logits; the layer multiplies the queries by
    # `1 / sqrt(d_kv)`, which the query kernel undoes.
    return (
        Weight("q.weight", "query_dense.kernel", "input", scale=math.sqrt(arguments["key_dim"])),
        Weight("k.weight", "key_dense.kernel", "input"),
        Weight("v.weight", "value_dense.kernel", "input"),
        Weight("o.weight", "output_dense.kernel", "output"),
        Weight("relative_attention_bias.weight", "position.embeddings"),
    )


def _sliding_window_everywhere(text, layer_index):
    """Mistral's window: on every layer."""
    return text.get("sliding_window")


def _sliding_window_by_type(text, layer_index, pattern=None):
    """The window of a `"sliding_attention"` layer, as `layer_types` says.

    Without `layer_types`, every `pattern`-th layer is full attention.
    """
    window = text.get("sliding_window")
    if window is None:
        return None
    layer_types = text.get("layer_types")
    if layer_types is None and pattern is not None:
        interval = text.get("sliding_window_pattern", pattern)
        return None if (layer_index + 1) % interval == 0 else window
    if layer_types is not None:
        return window if layer_types[layer_index] == "sliding_attention" else None
    return None


def _qwen2_sliding_window(text, layer_index):
    """Qwen2's and Qwen3's window: `layer_types`, else `max_window_layers` on."""
    if text.get("sliding_window") is None or text.get("layer_types") is not None:
        return _sliding_window_by_type(text, layer_index)
    if not text.get("use_sliding_window", False):
        return None
    window = text["sliding_window"]
    return window if layer_index >= text.get("max_window_layers", 28) else None


def _gemma3_sliding_window(text, layer_index):
    """Gemma 3's window: transformers' default, every 6th layer full."""
    return _sliding_window_by_type(text, layer_index, pattern=6)


def _no_rope_layers(config, name, num_layers, empty_is_default=False):
    """`no_rope_layers` (1: RoPE, 0: none), by default every interval-th none.

    SmolLM3 builds the default list when it is missing, Llama 4 also when
    it is empty (`empty_is_default`).
    """
    flags = config.get("no_rope_layers")
    if flags is None or (not flags and empty_is_default):
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


def _llama4_rope_layers(config, name, num_layers):
    """Llama 4's RoPE layers: `no_rope_layers`, its default also when empty."""
    return _no_rope_layers(config, name, num_layers, empty_is_default=True)


def _cohere2_rope_layers(config, name, num_layers):
    """Cohere2's RoPE layers: its sliding-window ones, every 4th full by default."""
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


def _pixtral_rotary(text, parameters, base):
    """Pixtral's vision encoder: rows and columns of patches, the whole head.

    "Axial" RoPE, from its base alone.
    """
    return {"max_wavelength": base, "num_axes": 2, "axis_layout": "alternating"}


def _qwen2_vl_rotary(text, parameters, base):
    """Qwen2-VL's M-RoPE, which its text model applies whatever its config says.

    transformers' `mrope_section` where the config gives none.
    """
    return _mrope_arguments(parameters, sections=(16, 24, 24))


def _qwen3_vl_rotary(text, parameters, base):
    """Qwen3-VL's M-RoPE, interleaved (`"cyclic"`) whatever its config says."""
    return _mrope_arguments(parameters, sections=(24, 20, 20), cyclic=True)


def _deepseek_v3_rotary(text, parameters, base):
    """DeepSeek V3's pairs: adjacent features unless `rope_interleave` is false."""
    return {"pairing": "interleaved" if text.get("rope_interleave", True) else "half"}


def _gptj_rotary(text, parameters, base):
    """GPT-J's rotated width, `rotary_dim` (every feature where null)."""
    return {"rotary_dim": text.get("rotary_dim")}


_DECODER = dict(
    arguments=_decoder_arguments,
    weights=_decoder_weights,
    per_layer=True,
    # The norms' scales of a layer without that norm are not read.
    passed_over=("q_norm.weight", "k_norm.weight"),
)
_QWEN2 = Family(**_DECODER, bias=True, sliding_window=_qwen2_sliding_window)
_GEMMA3 = Family(
    **_DECODER,
    qk_norm={"qk_norm": "head"},
    # Gemma's RMSNorm scales by `1 + weight`, in float32, and its logits by
    # `query_pre_attn_scalar ** -0.5`.
    norm_offset=1.0,
    query_scalar_key="query_pre_attn_scalar",
    sliding_window=_gemma3_sliding_window,
    refused={"attn_logit_softcapping": "The attention's logits are capped"},
)
_LLAMA4 = Family(
    **_DECODER,
    # Llama 4 multiplies adjacent features as complex numbers.
    interleaved=True,
    rope_layers=_llama4_rope_layers,
    temperature=True,
    # The L2 norm of the RoPE layers' queries and keys, after RoPE.
    qk_norm={"qk_norm": "head_unscaled", "qk_norm_after_position": True},
    qk_norm_key="use_qk_norm",
    norm_epsilon=1e-5,
    unapplied={
        "attention_chunk_size": "Llama 4's chunked attention ({setting}) is not "
        "applied: the attention is exact for sequences up to that many tokens."
    },
)
_ENCODER = dict(
    arguments=_encoder_arguments,
    weights=_encoder_weights,
    position=("TransformerXLPosition", {}),
)
_PARAKEET_NAMES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "relative_k_proj", "bias_u", "bias_v"
)
_CONFORMER_NAMES = (
    "linear_q", "linear_k", "linear_v", "linear_out", "linear_pos", "pos_bias_u",
    "pos_bias_v",
)
_XLNET_NAMES = ("q", "k", "v", "o", "r", "r_w_bias", "r_r_bias")
_XLNET_OTHER_WEIGHTS = ("r_s_bias", "seg_embed", "layer_norm.weight", "layer_norm.bias")
_QWEN2_VL = Family(rotary=_qwen2_vl_rotary)
_QWEN3_VL = Family(rotary=_qwen3_vl_rotary)
_T5 = Family(
    arguments=_t5_arguments,
    weights=_t5_weights,
    weight_names=("q", "k", "v", "o", "relative_attention_bias"),
    shared_weights=("relative_attention_bias.weight",),
    sizes=("d_model", "num_heads", "d_kv"),
)

# The model families, under transformers' `model_type`: their positions,
# and for those with `arguments` their attention with its weights.
FAMILIES = {
    "llama": Family(**_DECODER),
    "mistral": Family(**_DECODER, sliding_window=_sliding_window_everywhere),
    # Biases on the query, key and value projections, none on the output.
    "qwen2": _QWEN2,
    "qwen3": dataclasses.replace(_QWEN2, bias=None, qk_norm={"qk_norm": "head"}),
    "gemma3": _GEMMA3,
    "gemma3_text": _GEMMA3,
    "llama4": _LLAMA4,
    "llama4_text": _LLAMA4,
    "smollm3": Family(rope_layers=_no_rope_layers),
    # Cohere's rotate_half takes x[..., ::2] and x[..., 1::2].
    "cohere": Family(interleaved=True),
    "cohere2": Family(interleaved=True, rope_layers=_cohere2_rope_layers),
    # V2 multiplies adjacent pairs as complex numbers.
    "deepseek_v2": Family(interleaved=True, latent=True),
    "deepseek_v3": Family(latent=True, rotary=_deepseek_v3_rotary),
    # GPT-J pairs features 2i and 2i + 1.
    "gptj": Family(interleaved=True, rotary=_gptj_rotary),
    "pixtral": Family(rotary=_pixtral_rotary),
    # M-RoPE, under the composite model's type or its text model's.
    "qwen2_vl": _QWEN2_VL,
    "qwen2_vl_text": _QWEN2_VL,
    "qwen2_5_vl": _QWEN2_VL,
    "qwen2_5_vl_text": _QWEN2_VL,
    "qwen3_vl": _QWEN3_VL,
    "qwen3_vl_text": _QWEN3_VL,
    "qwen3_vl_moe": _QWEN3_VL,
    "qwen3_vl_moe_text": _QWEN3_VL,
    "parakeet_encoder": Family(
        **_ENCODER, names=_PARAKEET_NAMES, weight_names=_PARAKEET_NAMES
    ),
    "wav2vec2-conformer": Family(
        **_ENCODER,
        names=_CONFORMER_NAMES,
        weight_names=_CONFORMER_NAMES,
        bias=True,
        requires={"position_embeddings_type": ("relative", "relative")},
    ),
    # XLNet's content stream, without the segment term (`seg_mat`) and the
    # LayerNorm after the residual.
    "xlnet": Family(
        arguments=_encoder_arguments,
        weights=_encoder_weights,
        position=("TransformerXLPosition", {"pairing": "half"}),
        position_keys=("clamp_len",),
        names=_XLNET_NAMES,
        weight_names=_XLNET_NAMES + _XLNET_OTHER_WEIGHTS,
        bias=False,
        sizes=("d_model", "n_head", "d_head"),
        passed_over=_XLNET_OTHER_WEIGHTS,
    ),
    # The LayerNorm after the residual is not the attention's.
    "deberta-v2": Family(
        arguments=_deberta_arguments,
        weights=_deberta_weights,
        weight_names=(
            "query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj",
            "output.dense", "rel_embeddings", "encoder.LayerNorm", "output.LayerNorm",
        ),
        passed_over=("output.LayerNorm.weight", "output.LayerNorm.bias"),
        shared_weights=(
            "rel_embeddings.weight", "encoder.LayerNorm.weight", "encoder.LayerNorm.bias"
        ),
    ),
    "t5": _T5,
    "mt5": _T5,
}
# Any other model: RoPE on every layer, its halves paired.
_OTHER_FAMILY = Family()
