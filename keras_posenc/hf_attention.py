"""Hugging Face config.json and state dict -> built layers, with their weights.

Above the layers: `keras_posenc.hf_config` reads a config into arguments
(each family's, `hf_config.FAMILIES`); this module builds the layers from
them, imported plainly, and gives the attention the weights of a layer's
`state_dict`.
"""

import inspect

import keras
import numpy as np

from keras_posenc import hf_config
from keras_posenc import rope_scaling
from keras_posenc.layers.attention_temperature import AttentionTemperature
from keras_posenc.layers.disentangled_position import DisentangledPosition
from keras_posenc.layers.positional_multi_head_attention import (
    PositionalMultiHeadAttention,
)
from keras_posenc.layers.relative_position_bias import RelativePositionBias
from keras_posenc.layers.rotary_embedding import RotaryEmbedding
from keras_posenc.layers.transformer_xl_position import TransformerXLPosition
from keras_posenc.ops import _backend

# The positions that `hf_config`'s entries name, by class name.
_POSITIONS = {
    layer.__name__: layer
    for layer in (
        AttentionTemperature,
        DisentangledPosition,
        RelativePositionBias,
        RotaryEmbedding,
        TransformerXLPosition,
    )
}


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
        _position(entry) for entry in hf_config.position_arguments_per_layer(config)
    ]


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

    A sliding window needs Keras 3.15 or later (`sliding_window=`). Each
    family is an entry of `keras_posenc.hf_config.FAMILIES`, which this
    function reads.

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
    text, name, family = hf_config.attention_family(config)
    model_type = text["model_type"]
    if shared_position is not None and not family.shared_weights:
        raise ValueError(
            "`shared_position` shares the one table of T5's relative bias or "
            "DeBERTa's relative embeddings between layers; a "
            f"{model_type} layer's position is its own. Received: "
            f"shared_position={type(shared_position).__name__}"
        )
    hidden_size, arguments = hf_config.attention_arguments(config, layer_index)
    window = arguments.get("sliding_window")
    if window is not None and "sliding_window" not in inspect.signature(
        keras.layers.MultiHeadAttention.__init__
    ).parameters:
        raise ValueError(
            f"Layer {layer_index} of this {model_type} model attends over a "
            f"sliding window of {window} tokens, which needs Keras 3.15 or "
            f"later (`sliding_window=`): upgrade Keras. Received: Keras "
            f"{keras.version()}"
        )
    position = _position(arguments["position"])
    shared = _check_shared(shared_position, position)
    attention = PositionalMultiHeadAttention(
        **dict(arguments, position=shared or position)
    )
    attention.build((None, None, hidden_size), (None, None, hidden_size))
    weights = _layer_weights(
        state_dict, family.weight_names + family.passed_over + family.shared_weights
    )
    for weight in family.weights(family, text, arguments):
        if shared is not None and weight.variable.startswith("position."):
            continue
        _load(attention, weight, weights, state_dict)
    for other in family.passed_over + (family.shared_weights if shared else ()):
        weights.pop(other, None)
    _check_rotary_buffers(weights, attention.position, arguments["key_dim"])
    if weights:
        raise ValueError(
            f"`state_dict` holds weights that a {model_type} attention layer "
            f"has no place for: {sorted(weights)}"
        )
    return attention


def _position(entry):
    """The position layer of a `(class name, arguments)` entry, or None."""
    if entry is None:
        return None
    kind, arguments = entry
    return _POSITIONS[kind](**arguments)


def _load(attention, weight, weights, state_dict):
    """Take `weight` out of `weights` and assign it to its variable of `attention`."""
    variable = attention
    for part in weight.variable.split("."):
        variable = getattr(variable, part)
    array = weights.pop(weight.name, None)
    if array is None:
        if weight.missing == "zeros":
            array = np.zeros(variable.shape, "float32")
        else:
            raise ValueError(
                f"`state_dict` must hold {weight.name}. Received: keys "
                f"{sorted(state_dict)}"
            )
    array = np.asarray(array, "float32")
    shape = tuple(variable.shape)
    if weight.layout in ("input", "output"):
        width = int(np.prod(shape[1:] if weight.layout == "input" else shape[:-1]))
        # torch's `Linear` holds `(out, in)`; Keras' projections `(in, ...)`.
        expected = (width, shape[0]) if weight.layout == "input" else (shape[-1], width)
        if array.shape != expected:
            raise ValueError(
                f"`state_dict['{weight.name}']` must have shape {expected} for "
                f"this config. Received: shape {array.shape}"
            )
        array = array.T.reshape(shape)
    elif weight.layout == "heads_last":
        array = np.transpose(array, (1, 2, 0))  # (heads, dim, in)
    elif weight.layout == "reshape" and array.size == np.prod(shape):
        array = array.reshape(shape)
    if weight.offset:
        array = np.float32(weight.offset) + array
    if weight.scale != 1.0:
        array = array * np.float32(weight.scale)
    _assign(variable, array, weight.name)


def _check_rotary_buffers(weights, position, head_dim):
    """Take RoPE's buffers (`rotary_emb.inv_freq`) out of `weights`, checked.

    Older checkpoints (Llama 2's) save transformers' inverse frequencies
    with each layer: they are no weight, but they must be the frequencies
    that `position` computes, in the checkpoint's precision. A layer
    without RoPE leaves them in `weights`, which have no place then.
    """
    if not isinstance(position, RotaryEmbedding):
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

def _assign(variable, array, weight_name):
    """`variable.assign(array)`, or a `ValueError` naming a weight of another shape."""
    if tuple(array.shape) != tuple(variable.shape):
        raise ValueError(
            f"`state_dict['{weight_name}']` does not fit this config's "
            f"{variable.path}, of shape {tuple(variable.shape)}. Received: "
            f"shape {tuple(array.shape)}"
        )
    variable.assign(array)

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
