"""Hugging Face configs read as transformers reads them: composite models."""

import re

import pytest

from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import RotaryEmbedding
from keras_posenc import hf_attention
from keras_posenc import hf_config
from tests.test_rotary_grid import QWEN3_VL_TEXT

QWEN2_VL_VISION = {"depth": 32, "embed_dim": 1280, "num_heads": 16}
# Qwen/Qwen2-VL-2B-Instruct's config.json as first published: the text
# model's fields at the top level, M-RoPE in rope_scaling under "type".
QWEN2_VL_FLAT = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": QWEN2_VL_VISION,
}
# ... as transformers 4.5x saves it again: the text model's fields in
# text_config ("type" and "rope_type" both), the wrapper's at the top.
QWEN2_VL_NESTED = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "image_token_id": 151655,
    "video_token_id": 151656,
    "text_config": {
        "model_type": "qwen2_vl_text",
        "hidden_size": 1536,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {
            "type": "mrope",
            "rope_type": "default",
            "mrope_section": [16, 24, 24],
        },
    },
    "vision_config": QWEN2_VL_VISION,
}
# ... and as transformers 5 writes it: the base inside rope_parameters.
QWEN2_VL_NESTED_5 = {
    "model_type": "qwen2_vl",
    "text_config": {
        "model_type": "qwen2_vl_text",
        "hidden_size": 1536,
        "num_attention_heads": 12,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "default",
            "mrope_section": [16, 24, 24],
            "rope_theta": 1000000.0,
        },
    },
    "vision_config": QWEN2_VL_VISION,
}
# Qwen/Qwen3-VL-8B-Instruct's config.json: the text model only in
# text_config.
QWEN3_VL = {
    "architectures": ["Qwen3VLForConditionalGeneration"],
    "model_type": "qwen3_vl",
    "image_token_id": 151655,
    "text_config": {**QWEN3_VL_TEXT, "num_key_value_heads": 8},
    "vision_config": {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152},
}
QWEN2_VL_ARGUMENTS = {
    "max_wavelength": 1000000.0,
    "pairing": "half",
    "rotary_dim": None,
    "scaling": None,
    "num_axes": 3,
    "axis_layout": "sections",
    "axis_sections": [16, 24, 24],
}
QWEN3_VL_ARGUMENTS = {
    "max_wavelength": 5000000,
    "pairing": "half",
    "rotary_dim": None,
    "scaling": None,
    "num_axes": 3,
    "axis_layout": "cyclic",
    "axis_sections": [24, 20, 20],
}


@pytest.mark.parametrize(
    "config, expected",
    [
        (QWEN2_VL_FLAT, QWEN2_VL_ARGUMENTS),
        (QWEN2_VL_NESTED, QWEN2_VL_ARGUMENTS),
        (QWEN2_VL_NESTED_5, QWEN2_VL_ARGUMENTS),
        (QWEN3_VL, QWEN3_VL_ARGUMENTS),
    ],
    ids=["qwen2-vl-flat", "qwen2-vl-nested", "qwen2-vl-transformers-5", "qwen3-vl"],
)
def test_multimodal_configs_as_published(config, expected):
    assert hf_config.rotary_embedding_arguments(config) == expected
    layer = RotaryEmbedding.from_hf_config(config, name="text_rope")
    assert layer.name == "text_rope"
    assert {key: getattr(layer, key) for key in expected} == expected


@pytest.mark.parametrize(
    "config",
    [QWEN2_VL_NESTED, QWEN2_VL_NESTED_5, QWEN3_VL],
    ids=["qwen2-vl-nested", "qwen2-vl-transformers-5", "qwen3-vl"],
)
def test_a_wrapper_reads_as_its_text_config(config):
    wrapped = RotaryEmbedding.from_hf_config(config, name="rope")
    alone = RotaryEmbedding.from_hf_config(config["text_config"], name="rope")
    assert wrapped.get_config() == alone.get_config()


def test_text_config_finds_the_nested_config_as_transformers():
    text, name = hf_config.text_config(QWEN3_VL)
    assert name == "config['text_config']"
    assert text == QWEN3_VL["text_config"]
    # A text config never changes the config it came from.
    text["rope_theta"] = 1.0
    assert QWEN3_VL["text_config"]["rope_theta"] == 5000000
    # Flat configs, and a null text_config, are their own text config.
    assert hf_config.text_config(QWEN2_VL_FLAT) == (QWEN2_VL_FLAT, "config")
    flat_with_null = {**QWEN2_VL_FLAT, "text_config": None}
    assert hf_config.text_config(flat_with_null) == (flat_with_null, "config")
    assert (
        hf_config.rotary_embedding_arguments(flat_with_null) == QWEN2_VL_ARGUMENTS
    )
    # transformers' other names: an encoder's text_encoder, a decoder.
    for key in ("text_encoder", "decoder", "generator"):
        config = {"model_type": "composite", key: {"head_dim": 64}}
        assert hf_config.text_config(config)[1] == f"config[{key!r}]"


def test_a_nested_config_without_a_model_type_takes_the_wrappers():
    # transformers picks the text config's class by the wrapper: Qwen3-VL's
    # text model interleaves whatever its rope_scaling says.
    text = dict(QWEN3_VL["text_config"])
    del text["model_type"]
    text["rope_scaling"] = {"rope_type": "default", "mrope_section": [24, 20, 20]}
    config = {**QWEN3_VL, "text_config": text}
    assert hf_config.rotary_embedding_arguments(config) == QWEN3_VL_ARGUMENTS


def test_gemma_3_wrapper_gives_one_rope_per_layer_type():
    config = {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "head_dim": 256,
            "hidden_size": 2560,
            "num_attention_heads": 8,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        },
        "vision_config": {"model_type": "siglip_vision_model"},
    }
    full = RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
    assert (full.max_wavelength, full.scaling) == (
        1000000.0,
        {"factor": 8.0, "rope_type": "linear"},
    )
    local = RotaryEmbedding.from_hf_config(config, layer_type="sliding_attention")
    assert (local.max_wavelength, local.scaling) == (10000.0, None)
    with pytest.raises(
        ValueError, match=r"`config\['text_config'\]` gives `rope_local_base_freq`"
    ):
        RotaryEmbedding.from_hf_config(config)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {**QWEN3_VL, "decoder": {"head_dim": 64}},
            r"more than one text config, \['decoder', 'text_config'\]",
        ),
        (
            {**QWEN3_VL, "text_config": {"rope_theta": 5000000}},
            r"`config\['text_config'\]` must give `head_dim`, or `hidden_size` and "
            r"`num_attention_heads`\. Received: config with keys \['model_type', "
            r"'rope_theta'\]",
        ),
        (
            # A text config under a name transformers' get_text_config()
            # does not look for: named, not read as the default RoPE.
            {
                "model_type": "internvl_chat",
                "llm_config": QWEN3_VL["text_config"],
                "vision_config": {"hidden_size": 1024},
            },
            r"`config` must give `head_dim`.*pass its text model's config, one "
            r"of \['llm_config', 'vision_config'\]",
        ),
        (
            {**QWEN3_VL, "text_config": {"head_dim": 64, "rope_scaling": 2.0}},
            r"`config\['text_config'\]\['rope_scaling'\]` must be a dict or null",
        ),
    ],
    ids=["ambiguous", "text-config-without-head-width", "unknown-name", "bad-rope"],
)
def test_configs_that_lack_fields_say_so(config, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding.from_hf_config(config)


def test_config_must_be_a_dict():
    with pytest.raises(ValueError, match=r"config='config\.json'"):
        hf_config.rotary_embedding_arguments("config.json")


@pytest.mark.parametrize(
    "config, message",
    [
        (
            # transformers 4 refuses it; 5 reads it as unscaled RoPE.
            {"head_dim": 64, "rope_scaling": {"factor": 4.0}},
            r"`config\['rope_scaling'\]` must name its schedule: `rope_type`.*"
            r"Received: rope_scaling=\{'factor': 4\.0\}",
        ),
        (
            {"head_dim": 64, "rope_parameters": {"rope_theta": 1e4, "factor": 2.0}},
            r"`config\['rope_parameters'\]` must name its schedule.*"
            r"rope_parameters=\{'rope_theta': 10000\.0, 'factor': 2\.0\}",
        ),
        (
            {"hidden_size": 64, "num_attention_heads": 0},
            r"`config\['num_attention_heads'\]` must be a positive integer\. "
            r"Received: config\['num_attention_heads'\]=0",
        ),
        (
            {"hidden_size": -64, "num_attention_heads": 4},
            r"`config\['hidden_size'\]` must be a positive integer\. "
            r"Received: config\['hidden_size'\]=-64",
        ),
        (
            {"head_dim": 64, "rope_theta": float("inf")},
            r"`max_wavelength` must be a finite number greater than 1\. "
            r"Received: max_wavelength=inf",
        ),
    ],
    ids=["untyped-rope-scaling", "untyped-rope-parameters", "no-heads",
         "negative-width", "infinite-theta"],
)
def test_configs_that_transformers_refuses_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding.from_hf_config(config)


@pytest.mark.parametrize("partial", ["0.5", 0.0, 1.5, True, None])
def test_a_rotary_share_not_in_0_to_1_is_refused_naming_it(partial):
    config = {"head_dim": 64, "partial_rotary_factor": partial}
    message = rf"partial_rotary_factor.*in \(0, 1\].*partial_rotary_factor={re.escape(repr(partial))}"
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding.from_hf_config(config)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"head_dim": 64, "rope_scaling": {**YARN, "beta_fast": 1.0, "beta_slow": 32.0}},
            r"`scaling\['beta_fast'\]` should be greater than `scaling\['beta_slow'\]`"
            r".*beta_fast=1\.0 \(32 if None\), beta_slow=32\.0",
        ),
        (
            {"head_dim": 64, "rope_scaling": {**YARN, "beta_fast": 0.5}},
            r"beta_fast=0\.5 \(32 if None\), beta_slow=None",
        ),
        (
            {"head_dim": 64, "rope_scaling": {"rope_type": "linear", "factor": 0.5}},
            r"`factor` should be at least 1\. Received: factor=0\.5",
        ),
        (
            {"head_dim": 64, "max_position_embeddings": 512, "rope_scaling": YARN},
            r"`factor` should be max_position_embeddings / "
            r"original_max_position_embeddings = 8\.0.*Received: factor=4\.0",
        ),
        (
            {
                "head_dim": 64,
                "max_position_embeddings": 8192,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            },
            r"`original_max_position_embeddings` should be less than "
            r"max_position_embeddings=8192\. Received: "
            r"original_max_position_embeddings=8192",
        ),
        (
            # transformers rotates with the default frequencies and warns of
            # the keys that rope_type='default' does not take.
            {"head_dim": 64, "rope_scaling": {"rope_type": "default", "factor": 4.0}},
            r"`config`'s RoPE: unrecognized keys for rope_type='default', "
            r"which are not used: \['factor'\]",
        ),
    ],
    ids=["yarn-betas", "yarn-beta-fast-below-default-slow", "factor-below-one",
         "yarn-factor", "llama3-lengths", "factor-of-the-default"],
)
def test_configs_that_transformers_warns_of_warn(config, message):
    with pytest.warns(UserWarning, match=message):
        RotaryEmbedding.from_hf_config(config)


def test_the_default_schedule_with_a_factor_rotates_unscaled():
    config = {"head_dim": 64, "rope_scaling": {"rope_type": "default", "factor": 4.0}}
    with pytest.warns(UserWarning, match="not used"):
        arguments = hf_config.rotary_embedding_arguments(config)
    assert arguments == hf_config.rotary_embedding_arguments({"head_dim": 64})


# Each model's pattern as transformers builds it (its config's __post_init__
# and its attention's `use_rope` / `sliding_window`, transformers 5.24.0):
# Llama 4 and SmolLM3 rotate where `no_rope_layers[i]` is 1, by default all
# but every `no_rope_layer_interval`-th layer; Cohere2 rotates on its
# sliding window layers only.
# A published Llama 4 config.json (transformers 4.51), cut to 8 layers.
LLAMA4_SCOUT = {
    "model_type": "llama4",
    "text_config": {
        "model_type": "llama4_text",
        "num_hidden_layers": 8,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "head_dim": 128,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 262144,
        "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0],
        "attention_chunk_size": 8192,
        # As published (transformers reads any true value as on).
        "attn_temperature_tuning": 4,
        "floor_scale": 8192,
        "attn_scale": 0.1,
        "use_qk_norm": True,
    },
    "vision_config": {"hidden_size": 1408},
}
SMOLLM3 = {
    "model_type": "smollm3",
    "num_hidden_layers": 8,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "rope_theta": 5000000.0,
    "no_rope_layer_interval": 4,
}
COHERE2 = {
    "model_type": "cohere2",
    "num_hidden_layers": 8,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "rope_theta": 50000.0,
    "sliding_window": 4096,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"],
}


positions_per_layer = hf_attention.positions_per_layer


def test_the_attentions_old_name_warns_and_gives_the_same_layers():
    with pytest.warns(DeprecationWarning, match="hf_attention.positions_per_layer"):
        old = PositionalMultiHeadAttention.positions_from_hf_config(LLAMA4_SCOUT)
    new = positions_per_layer(LLAMA4_SCOUT)
    assert [type(p) for p in old] == [type(p) for p in new]
    def arguments(position):
        return {k: v for k, v in position.get_config().items() if k != "name"}

    assert [arguments(p) for p in old] == [arguments(p) for p in new]


def test_position_arguments_per_layer_are_the_layers_constructor_arguments():
    entries = hf_config.position_arguments_per_layer(LLAMA4_SCOUT)
    assert [entry[0] for entry in entries] == ["RotaryEmbedding"] * 3 + [
        "AttentionTemperature"
    ] + ["RotaryEmbedding"] * 3 + ["AttentionTemperature"]
    assert entries[0][1] == hf_config.rotary_embedding_arguments(LLAMA4_SCOUT)
    assert entries[3][1] == hf_config.attention_temperature_arguments(LLAMA4_SCOUT)
    # Each layer's own dict: changing one changes no other.
    assert entries[3][1] is not entries[7][1]


def pattern(positions):
    return [
        "rope" if isinstance(p, RotaryEmbedding) else "none" if p is None else type(p).__name__
        for p in positions
    ]


EVERY_FOURTH = ["rope", "rope", "rope", "none"] * 2


def test_llama_4_rotates_where_no_rope_layers_says_and_tempers_the_others():
    positions = positions_per_layer(LLAMA4_SCOUT)
    temperature = "AttentionTemperature"
    assert pattern(positions) == ["rope", "rope", "rope", temperature] * 2
    rope, nope = positions[0], positions[3]
    # Llama 4 multiplies adjacent features as complex numbers.
    assert (rope.pairing, rope.max_wavelength) == ("interleaved", 500000.0)
    assert rope.scaling["rope_type"] == "llama3"
    assert (nope.floor_scale, nope.attn_scale) == (8192, 0.1)
    assert positions[3] is not positions[7]


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"no_rope_layers": [0, 1, 1, 1, 0, 1, 1, 1, 1]}, ["t", "rope", "rope", "rope", "t", "rope", "rope", "rope"]),
        # Missing or empty: every no_rope_layer_interval-th layer.
        ({"no_rope_layers": None}, ["rope", "rope", "rope", "t"] * 2),
        ({"no_rope_layers": [], "no_rope_layer_interval": 3}, ["rope", "rope", "t"] * 2 + ["rope", "rope"]),
        ({"attn_temperature_tuning": False}, EVERY_FOURTH),
    ],
    ids=["given", "missing", "empty", "temperature-off"],
)
def test_llama_4_patterns(changes, expected):
    config = {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"], **changes}}
    if config["text_config"]["no_rope_layers"] is None:
        del config["text_config"]["no_rope_layers"]
    expected = ["AttentionTemperature" if name == "t" else name for name in expected]
    assert pattern(positions_per_layer(config)) == expected


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, EVERY_FOURTH),
        ({"no_rope_layer_interval": 3}, ["rope", "rope", "none"] * 2 + ["rope", "rope"]),
        ({"no_rope_layers": [1, 0, 1, 0, 1, 1, 1, 1]}, ["rope", "none"] * 2 + ["rope"] * 4),
        # Sliding windows on the layers without RoPE change no position.
        (
            {"use_sliding_window": True, "sliding_window": 512,
             "layer_types": ["full_attention"] * 3 + ["sliding_attention"] + ["full_attention"] * 3 + ["sliding_attention"]},
            EVERY_FOURTH,
        ),
    ],
    ids=["default", "interval-3", "given", "sliding-window"],
)
def test_smollm3_patterns(changes, expected):
    positions = positions_per_layer({**SMOLLM3, **changes})
    assert pattern(positions) == expected
    # SmolLM3 rotates as Llama does, halves.
    assert positions[0].pairing == "half"
    assert positions[0].max_wavelength == 5000000.0


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({}, EVERY_FOURTH),
        # Without layer_types, every sliding_window_pattern-th (4) is global.
        ({"layer_types": None}, EVERY_FOURTH),
        ({"layer_types": None, "sliding_window_pattern": 2}, ["rope", "none"] * 4),
        # Its attention rotates where it has a window: with none, nowhere.
        ({"sliding_window": None}, ["none"] * 8),
    ],
    ids=["layer-types", "default-pattern", "pattern-2", "no-window"],
)
def test_cohere2_rotates_its_sliding_window_layers_only(changes, expected):
    config = {**COHERE2, **changes}
    if config["layer_types"] is None:
        del config["layer_types"]
    positions = positions_per_layer(config)
    assert pattern(positions) == expected
    rotated = [p for p in positions if p is not None]
    # Cohere's rotate_half pairs x[..., ::2] with x[..., 1::2].
    assert all(p.pairing == "interleaved" and p.max_wavelength == 50000.0 for p in rotated)


def test_other_models_rotate_every_layer_with_its_layer_types_rope():
    llama = {"num_hidden_layers": 3, "head_dim": 64, "rope_theta": 500000.0}
    positions = positions_per_layer(llama)
    assert pattern(positions) == ["rope"] * 3
    assert positions[0].pairing == "half"
    gemma_3 = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 3,
        "head_dim": 256,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
    local, _, full = positions_per_layer(gemma_3)
    assert (local.max_wavelength, local.scaling) == (10000.0, None)
    assert (full.max_wavelength, full.scaling["factor"]) == (1e6, 8.0)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"head_dim": 64}, r"`config\['num_hidden_layers'\]` must be a positive integer"),
        (
            {**SMOLLM3, "no_rope_layers": [1, 0, 1]},
            r"`config\['no_rope_layers'\]` must list a 1 \(RoPE\) or a 0.*"
            r"num_hidden_layers=8.*Received: no_rope_layers=\[1, 0, 1\]",
        ),
        (
            {**SMOLLM3, "no_rope_layers": [2] * 8},
            r"Received: no_rope_layers=\[2, 2",
        ),
        (
            {**COHERE2, "layer_types": ["full_attention"]},
            r"`config\['layer_types'\]` must list one type per layer.*num_hidden_layers=8",
        ),
        (
            {**LLAMA4_SCOUT, "text_config": {"num_hidden_layers": 0}},
            r"`config\['text_config'\]\['num_hidden_layers'\]` must be a positive integer",
        ),
        ("config.json", r"must be a dict.*Received: config='config\.json'"),
        (
            # transformers refuses it (layer_type_validation); read as a
            # layer without RoPE, it would change the model.
            {**COHERE2, "layer_types": ["sliding"] * 7 + ["full_attention"]},
            r"`config\['layer_types'\]` entries must be in \('full_attention', "
            r"'sliding_attention', 'chunked_attention', 'linear_attention'\)\. "
            r"Received: layer_types with \['sliding'\]",
        ),
        (
            {**LLAMA4_SCOUT, "text_config": {**LLAMA4_SCOUT["text_config"],
                                             "attn_temperature_tuning": "false"}},
            r"`config\['text_config'\]\['attn_temperature_tuning'\]` must be true "
            r"or false\. Received: attn_temperature_tuning='false'",
        ),
    ],
    ids=["no-layers", "short-list", "bad-flags", "short-layer-types", "nested-name",
         "not-a-dict", "unknown-layer-type", "temperature-tuning-string"],
)
def test_positions_per_layer_refuses_bad_configs(config, message):
    with pytest.raises(ValueError, match=message):
        positions_per_layer(config)


def test_llama_4_and_cohere_rotate_adjacent_features():
    for model_type in ("llama4_text", "cohere", "cohere2"):
        arguments = hf_config.rotary_embedding_arguments({"model_type": model_type, "head_dim": 64})
        assert arguments["pairing"] == "interleaved", model_type
