"""`hf_attention.attention_from_hf` against transformers' own attention layers.

`tests/fixtures/hf_attention.npz` holds what transformers' `LlamaAttention`
(llama3 RoPE scaling), `Qwen2Attention`, `Qwen3Attention`,
`MistralAttention` (a sliding window), `Gemma3Attention` and `Llama4TextAttention` (a RoPE
layer with the L2 norm of queries and keys, a NoPE layer with the
temperature) compute in float64 on tiny random configs with grouped heads:
a causal pass, a left-padded batch, and cached decoding a token at a time
(`generate_hf_attention.py` says how). The layer built from each config and
state dict must give the same outputs to float32 rounding. Gemma 3's pair
(a sliding-window layer with the local RoPE, a full one with the global)
has a `query_pre_attn_scalar` other than the head size.
"""

import json
import pathlib
import warnings

import keras
import numpy as np
import pytest

from keras_posenc import hf_attention
from keras_posenc import hf_config
from tests.backend import numpy

FIXTURE = np.load(pathlib.Path(__file__).parent / "fixtures" / "hf_attention.npz")
FAMILIES = (
    "llama3",
    "qwen2",
    "qwen3",
    "mistral",
    "gemma3_sliding",
    "gemma3_full",
    "llama4_rope",
    "llama4_nope",
)
HIDDEN = FIXTURE["hidden_states"].astype("float32")  # (batch, length, 32)
BATCH, LENGTH = HIDDEN.shape[:2]
PREFILL = 5
# float32 projections and logits against float64: sums of 32 products of
# order 1, then 8 heads of 8 into the output.
ATOL = 2e-5
KERAS_HAS_SLIDING_WINDOW = "sliding_window" in __import__("inspect").signature(
    keras.layers.MultiHeadAttention.__init__
).parameters


def config_of(family):
    return json.loads(str(FIXTURE[f"{family}/config"]))


def state_dict_of(family, prefix=""):
    start = f"{family}/"
    names = [
        key for key in FIXTURE.files
        if key.startswith(start) and key.count("/") == 1 and key != f"{family}/config"
    ]
    return {prefix + key[len(start):]: FIXTURE[key] for key in names}


def layer_index_of(family):
    return 1 if family in ("llama4_nope", "gemma3_full") else 0


def built(family, prefix=""):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return hf_attention.attention_from_hf(
            config_of(family), state_dict_of(family, prefix), layer_index_of(family)
        )


def assert_close(actual, expected, err_msg=""):
    np.testing.assert_allclose(
        np.asarray(numpy(actual), "float64"), expected, rtol=0, atol=ATOL, err_msg=err_msg
    )


def needs_window(family):
    """Whether the family's layer has a sliding window this Keras cannot take."""
    return family in ("mistral", "gemma3_sliding") and not KERAS_HAS_SLIDING_WINDOW


@pytest.mark.parametrize("family", FAMILIES)
def test_a_causal_pass_equals_transformers(family):
    if needs_window(family):
        with pytest.raises(ValueError, match="Keras 3.15 or later"):
            built(family)
        return
    attention = built(family)
    output = attention(HIDDEN, HIDDEN, use_causal_mask=True)
    assert_close(output, FIXTURE[f"{family}/full/output"])


@pytest.mark.parametrize("family", FAMILIES)
def test_left_padding_equals_transformers(family):
    if needs_window(family):
        return test_a_causal_pass_equals_transformers(family)
    attention = built(family)
    real = FIXTURE[f"{family}/left/mask"].astype(bool)  # (batch, length)
    # The positions `generate` gives: counted over the real tokens.
    positions = np.where(real, np.cumsum(real, axis=1) - 1, 1).astype("int32")
    if family == "llama4_nope":
        # transformers' temperature counts the tokens, pads included
        # (`arange + past_seen_tokens`), not the position ids.
        positions = np.broadcast_to(np.arange(LENGTH, dtype="int32"), (BATCH, LENGTH))
    output = attention(
        HIDDEN,
        HIDDEN,
        use_causal_mask=True,
        query_positions=positions,
        key_positions=positions,
        attention_mask=np.broadcast_to(real[:, None, :], (BATCH, LENGTH, LENGTH)),
    )
    expected = FIXTURE[f"{family}/left/output"]
    for b in range(BATCH):
        assert_close(numpy(output)[b, real[b]], expected[b, real[b]], err_msg=f"entry {b}")


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_decoding_equals_transformers(family):
    if needs_window(family):
        return test_a_causal_pass_equals_transformers(family)
    assert_close(decoded(built(family)), FIXTURE[f"{family}/decode/output"])


def decoded(attention):
    """The outputs of tokens PREFILL.. decoded a token at a time after the prompt's."""
    cache = keras.ops.zeros(
        (BATCH, 2, LENGTH, attention.num_key_value_heads, attention.key_dim)
    )
    _, cache = attention(
        HIDDEN[:, :PREFILL], HIDDEN[:, :PREFILL],
        cache=cache, cache_update_index=0, use_causal_mask=True,
    )
    steps = []
    for step in range(PREFILL, LENGTH):
        token = HIDDEN[:, step : step + 1]
        output, cache = attention(
            token, token, cache=cache, cache_update_index=step, use_causal_mask=True
        )
        steps.append(numpy(output))
    return np.concatenate(steps, axis=1)


def test_families_are_read_as_transformers_builds_them():
    layers = {family: built(family) for family in FAMILIES if not needs_window(family)}
    for attention in layers.values():
        assert (attention.num_heads, attention.num_key_value_heads, attention.key_dim) == (4, 2, 8)
    assert layers["qwen2"].use_bias and not layers["llama3"].use_bias
    assert layers["qwen3"].qk_norm == "head"
    assert (layers["llama4_rope"].qk_norm, layers["llama4_rope"].qk_norm_after_position) == (
        "head_unscaled", True
    )
    assert layers["llama4_nope"].qk_norm is None
    assert type(layers["llama4_nope"].position).__name__ == "AttentionTemperature"
    assert layers["gemma3_full"].qk_norm == "head"
    if KERAS_HAS_SLIDING_WINDOW:
        assert layers["gemma3_full"]._sliding_window is None
        assert layers["mistral"]._sliding_window == 4
        assert layers["gemma3_sliding"]._sliding_window == 4


def test_a_model_prefix_on_the_weights_is_cut():
    attention = built("qwen2", prefix="model.layers.0.self_attn.")
    output = attention(HIDDEN, HIDDEN, use_causal_mask=True)
    assert_close(output, FIXTURE["qwen2/full/output"])


def test_llama4_chunked_attention_is_named_in_a_warning():
    config = dict(config_of("llama4_rope"), attention_chunk_size=8192)
    with pytest.warns(UserWarning, match="attention_chunk_size'\\]=8192"):
        hf_attention.attention_from_hf(config, state_dict_of("llama4_rope"))


def llama3_inverse_frequencies(config):
    """transformers' `_compute_llama3_parameters`, in float64 NumPy."""
    rope = config["rope_parameters"]
    dim = config["head_dim"]
    inverse = 1.0 / rope["rope_theta"] ** (np.arange(0, dim, 2) / dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    context = rope["original_max_position_embeddings"]
    wavelength = 2 * np.pi / inverse
    scaled = np.where(wavelength > context / low, inverse / factor, inverse)
    smooth = (context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(medium, smoothed, scaled)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rope_buffers_in_the_state_dict_are_checked_and_skipped(dtype):
    # Older Llama 2 checkpoints save `rotary_emb.inv_freq` with each layer,
    # in the checkpoint's precision.
    config = config_of("llama3")
    prefix = "model.layers.0.self_attn."
    state_dict = dict(
        state_dict_of("llama3", prefix),
        **{f"{prefix}rotary_emb.inv_freq": llama3_inverse_frequencies(config).astype(dtype)},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention = hf_attention.attention_from_hf(config, state_dict)
    assert_close(
        attention(HIDDEN, HIDDEN, use_causal_mask=True), FIXTURE["llama3/full/output"]
    )
    assert len(attention.weights) == 4  # the projections' kernels alone


def test_rope_buffers_other_than_the_configs_raise_value_error_naming_them():
    config = config_of("llama3")
    # The frequencies without llama3's scaling: another config's.
    unscaled = 1.0 / 500000.0 ** (np.arange(0, 8, 2) / 8)
    state_dict = dict(state_dict_of("llama3"), **{"rotary_emb.inv_freq": unscaled})
    with pytest.raises(
        ValueError,
        match=r"`state_dict\['rotary_emb.inv_freq'\]` must be the inverse frequencies",
    ):
        hf_attention.attention_from_hf(config, state_dict)
    wrong_size = dict(state_dict_of("llama3"), **{"rotary_emb.inv_freq": np.ones(8)})
    with pytest.raises(ValueError, match=r"of shape \(8,\)"):
        hf_attention.attention_from_hf(config, wrong_size)


def test_a_rope_buffer_on_a_layer_without_rope_has_no_place():
    state_dict = dict(state_dict_of("llama4_nope"), **{"rotary_emb.inv_freq": np.ones(4)})
    with pytest.raises(ValueError, match="has no place for: \\['rotary_emb.inv_freq'\\]"):
        hf_attention.attention_from_hf(
            config_of("llama4_nope"), state_dict, layer_index_of("llama4_nope")
        )


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, s: (dict(c, model_type="gemma2"), s), "model_type='gemma2'"),
        (lambda c, s: (c, {k: v for k, v in s.items() if k != "k_proj.weight"}), "k_proj.weight"),
        (lambda c, s: (c, dict(s, **{"k_proj.weight": s["k_proj.weight"][:8]})), r"shape \(8, 32\)"),
        (lambda c, s: (c, dict(s, **{"o_proj.bias": np.ones(32)})), "o_proj.bias"),
        (lambda c, s: (c, {k: v for k, v in s.items() if k != "q_norm.weight"}), "q_norm.weight"),
    ],
)
def test_bad_config_or_weights_raise_value_error_naming_them(change, message):
    family = "qwen3" if "norm" in message else "llama3"
    config, state_dict = change(config_of(family), state_dict_of(family))
    with pytest.raises(ValueError, match=message):
        hf_attention.attention_from_hf(config, state_dict)


def test_a_layer_past_the_model_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="layer_index=2"):
        hf_attention.attention_from_hf(config_of("llama3"), state_dict_of("llama3"), 2)


def test_gemma_logit_soft_cap_raises_value_error_naming_it():
    config = dict(config_of("gemma3_full"), attn_logit_softcapping=50.0)
    with pytest.raises(ValueError, match="attn_logit_softcapping'\\]=50.0"):
        hf_attention.attention_from_hf(config, state_dict_of("gemma3_full"), 1)


# Transformer-XL's encoders, from `relative_attention.npz`
# (`generate_relative_attention.py`): the references' own modules, with and
# without a padding mask. The configs are theirs, as `config.json` names the
# sizes.
RELATIVE = np.load(pathlib.Path(__file__).parent / "fixtures" / "relative_attention.npz")


def relative_case(name):
    arrays = {
        key.split("/", 1)[1]: RELATIVE[key]
        for key in RELATIVE.files
        if key.startswith(name + "/")
    }
    return arrays, json.loads(str(arrays.pop("config")))


def hf_config_of(name, config):
    if name == "parakeet":
        return {
            "model_type": "parakeet_encoder",
            "hidden_size": config["hidden_size"],
            "num_attention_heads": config["num_heads"],
            "attention_bias": config["attention_bias"],
        }
    if name == "w2v2_conformer":
        return {
            "model_type": "wav2vec2-conformer",
            "hidden_size": config["hidden_size"],
            "num_attention_heads": config["num_heads"],
            "position_embeddings_type": "relative",
        }
    return {
        "model_type": "xlnet",
        "d_model": config["d_model"],
        "n_head": config["num_heads"],
        "d_head": config["head_dim"],
        "clamp_len": config["clamp_len"],
    }


# The weights each reference's attention module holds, under its names.
RELATIVE_WEIGHTS = {
    "parakeet": ("q_proj", "k_proj", "v_proj", "o_proj", "relative_k_proj", "bias_u", "bias_v"),
    "w2v2_conformer": (
        "linear_q", "linear_k", "linear_v", "linear_out", "linear_pos", "pos_bias_u", "pos_bias_v",
    ),
    "xlnet": (
        "q", "k", "v", "o", "r", "r_w_bias", "r_r_bias", "r_s_bias", "seg_embed", "layer_norm",
    ),
}


def relative_state_dict(name, arrays, prefix="encoder.layers.0.self_attn."):
    family = "xlnet" if name.startswith("xlnet") else name
    return {
        prefix + key: value
        for key, value in arrays.items()
        if key.split(".")[0] in RELATIVE_WEIGHTS[family]
    }


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
@pytest.mark.parametrize("name", ["parakeet", "w2v2_conformer", "xlnet", "xlnet_mems", "xlnet_clamp"])
def test_transformer_xl_encoders_equal_their_references(name, masked):
    arrays, config = relative_case(name)
    attention = hf_attention.attention_from_hf(
        hf_config_of(name, config), relative_state_dict(name, arrays)
    )
    assert type(attention.position).__name__ == "TransformerXLPosition"
    tokens = arrays["hidden_states"].astype("float32")
    keys, query_positions = tokens, None
    if config.get("mlen"):
        # XLNet's memory comes first; the queries sit after it.
        keys = np.concatenate([arrays["memory"].astype("float32"), tokens], axis=1)
        query_positions = config["mlen"] + np.arange(config["qlen"])
    allowed = arrays["mask/allowed"]
    output = numpy(
        attention(
            tokens, keys, attention_mask=allowed if masked else None,
            query_positions=query_positions,
        )
    )
    expected = arrays[f"{'mask' if masked else 'nomask'}/output"]
    rows = allowed.any(-1) if masked else np.ones(tokens.shape[:2], bool)
    np.testing.assert_allclose(output[rows], expected[rows], rtol=0, atol=ATOL)


def test_conformer_with_rotary_positions_is_refused_by_name():
    arrays, config = relative_case("w2v2_conformer")
    hf = dict(hf_config_of("w2v2_conformer", config), position_embeddings_type="rotary")
    with pytest.raises(ValueError, match="position_embeddings_type'\\]='rotary'"):
        hf_attention.attention_from_hf(hf, relative_state_dict("w2v2_conformer", arrays))


DEBERTA_CASES = (
    "deberta_share_c2p_p2c", "deberta_noshare_c2p_p2c", "deberta_noshare_p2c", "deberta_nobuckets",
)


def deberta_inputs(name):
    arrays, config = relative_case(name)
    hf = {
        "model_type": "deberta-v2",
        "hidden_size": config["hidden_size"],
        "num_attention_heads": config["num_heads"],
        "relative_attention": True,
        "max_relative_positions": config["max_relative_positions"],
        "position_buckets": config["position_buckets"],
        "pos_att_type": "|".join(config["pos_att_type"]),
        "share_att_key": config["share_att_key"],
        "norm_rel_ebd": config["norm_rel_ebd"],
        "layer_norm_eps": 1e-7,
    }
    hidden = config["hidden_size"]
    prefix = "deberta.encoder.layer.0.attention."
    state_dict = {
        prefix + "self." + key: value
        for key, value in arrays.items()
        if key.split(".")[0] in ("query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj")
    }
    for key in ("encoder.rel_embeddings.weight", "encoder.LayerNorm.weight", "encoder.LayerNorm.bias"):
        if key in arrays:
            state_dict["deberta." + key] = arrays[key]
    # The reference's output is the context, before `DebertaV2SelfOutput`:
    # its dense layer here the identity, and its LayerNorm, after the
    # residual, none of the attention's.
    state_dict[prefix + "output.dense.weight"] = np.eye(hidden)
    state_dict[prefix + "output.dense.bias"] = np.zeros(hidden)
    state_dict[prefix + "output.LayerNorm.weight"] = np.ones(hidden)
    state_dict[prefix + "output.LayerNorm.bias"] = np.zeros(hidden)
    return arrays, hf, state_dict


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
@pytest.mark.parametrize("name", DEBERTA_CASES)
def test_deberta_equals_transformers(name, masked):
    arrays, hf, state_dict = deberta_inputs(name)
    attention = hf_attention.attention_from_hf(hf, state_dict)
    assert attention.position.share_att_key == hf["share_att_key"]
    tokens = arrays["hidden_states"].astype("float32")
    allowed = arrays["mask/allowed"]
    output = numpy(attention(tokens, tokens, attention_mask=allowed if masked else None))
    expected = arrays[f"{'mask' if masked else 'nomask'}/output"]
    rows = allowed.any(-1) if masked else np.ones(tokens.shape[:2], bool)
    np.testing.assert_allclose(output[rows], expected[rows], rtol=0, atol=ATOL)


def test_deberta_of_a_whole_model_raises_value_error_naming_the_repeat():
    arrays, hf, state_dict = deberta_inputs("deberta_share_c2p_p2c")
    # A second layer's weights: one layer's are wanted.
    state_dict.update(
        {key.replace("layer.0.", "layer.1."): value for key, value in state_dict.items()}
    )
    with pytest.raises(ValueError, match="twice"):
        hf_attention.attention_from_hf(hf, state_dict)


@pytest.mark.parametrize("family", ["t5_encoder", "t5_decoder"])
def test_t5_equals_transformers(family):
    config = config_of(family)
    attention = hf_attention.attention_from_hf(config, state_dict_of(family))
    causal = config["is_decoder"]
    assert attention.position.bidirectional == (not causal)
    output = attention(HIDDEN, HIDDEN, use_causal_mask=causal)
    assert_close(output, FIXTURE[f"{family}/full/output"])
    # Left padding: T5 reads its bias at token indices, the default positions.
    real = FIXTURE[f"{family}/left/mask"].astype(bool)
    output = numpy(
        attention(
            HIDDEN, HIDDEN, use_causal_mask=causal,
            attention_mask=np.broadcast_to(real[:, None, :], (BATCH, LENGTH, LENGTH)),
        )
    )
    expected = FIXTURE[f"{family}/left/output"]
    for b in range(BATCH):
        assert_close(output[b, real[b]], expected[b, real[b]], err_msg=f"entry {b}")
    if causal:
        assert_close(decoded(attention), FIXTURE[f"{family}/decode/output"])


def test_t5_later_layer_takes_the_first_blocks_bias():
    # A later block has no bias of its own: the first block's serves it.
    config = config_of("t5_encoder")
    weights = state_dict_of("t5_encoder", prefix="encoder.block.3.layer.0.SelfAttention.")
    bias = weights.pop("encoder.block.3.layer.0.SelfAttention.relative_attention_bias.weight")
    with pytest.raises(ValueError, match="relative_attention_bias.weight"):
        hf_attention.attention_from_hf(config, weights)
    weights["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = bias
    attention = hf_attention.attention_from_hf(config, weights)
    assert_close(attention(HIDDEN, HIDDEN), FIXTURE["t5_encoder/full/output"])


def test_t5_layers_share_the_first_blocks_bias():
    config = config_of("t5_encoder")
    first = hf_attention.attention_from_hf(config, state_dict_of("t5_encoder"))
    later_weights = {
        key: value for key, value in state_dict_of("t5_encoder").items()
        if not key.startswith("relative_attention_bias")
    }
    later = hf_attention.attention_from_hf(
        config, later_weights, layer_index=1, shared_position=first.position
    )
    assert later.position is first.position
    inputs = keras.Input((None, 32))
    model = keras.Model(inputs, later(first(inputs, inputs), first(inputs, inputs)))
    # One table in the model: trained once, saved once.
    tables = [w for w in model.weights if w.path.endswith("embeddings")]
    assert len(tables) == 1
    assert_close(later(HIDDEN, HIDDEN), FIXTURE["t5_encoder/full/output"])


def test_deberta_layers_share_the_relative_embeddings():
    arrays, hf, state_dict = deberta_inputs("deberta_share_c2p_p2c")
    first = hf_attention.attention_from_hf(hf, state_dict)
    later = hf_attention.attention_from_hf(
        hf,
        {key: value for key, value in state_dict.items() if "encoder.rel" not in key},
        shared_position=first.position,
    )
    assert later.position is first.position
    tokens = arrays["hidden_states"].astype("float32")
    np.testing.assert_allclose(
        numpy(later(tokens, tokens)), arrays["nomask/output"], rtol=0, atol=ATOL
    )


def test_a_shared_position_of_another_kind_raises_value_error_naming_it():
    t5 = hf_attention.attention_from_hf(config_of("t5_encoder"), state_dict_of("t5_encoder"))
    with pytest.raises(ValueError, match="shared_position=RelativePositionBias"):
        hf_attention.attention_from_hf(
            config_of("llama3"), state_dict_of("llama3"), shared_position=t5.position
        )
    decoder = dict(config_of("t5_encoder"), is_decoder=True)
    with pytest.raises(ValueError, match="another layer of the same model"):
        hf_attention.attention_from_hf(
            decoder, state_dict_of("t5_encoder"), shared_position=t5.position
        )


def test_the_old_name_in_hf_config_warns_and_gives_the_same_layer():
    with pytest.warns(DeprecationWarning, match="keras_posenc.hf_attention.attention_from_hf"):
        old = hf_config.attention_from_hf(config_of("qwen3"), state_dict_of("qwen3"))
    new = built("qwen3")
    assert type(old.position) is type(new.position)
    for old_weight, new_weight in zip(old.weights, new.weights, strict=True):
        np.testing.assert_array_equal(numpy(old_weight), numpy(new_weight))
    np.testing.assert_array_equal(
        numpy(old(HIDDEN, HIDDEN, use_causal_mask=True)),
        numpy(new(HIDDEN, HIDDEN, use_causal_mask=True)),
    )
    with pytest.warns(DeprecationWarning, match="keras_posenc.hf_attention.positions_per_layer"):
        positions = hf_config.positions_per_layer(config_of("llama4_rope"))
    assert [type(p) for p in positions] == [
        type(p) for p in hf_attention.positions_per_layer(config_of("llama4_rope"))
    ]


def test_every_family_is_one_entry_that_the_loader_reads():
    # The families whose attention is read are the registry's entries with
    # `arguments`; a config of another model names them all.
    readable = [key for key, family in hf_config.FAMILIES.items() if family.arguments]
    assert {"llama", "gemma3", "llama4", "xlnet", "deberta-v2", "t5"} <= set(readable)
    with pytest.raises(ValueError, match=", ".join(map(repr, readable))):
        hf_attention.attention_from_hf({"model_type": "gpt2"}, {})
