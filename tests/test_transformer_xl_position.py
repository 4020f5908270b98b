"""TransformerXLPosition against the references' own code, and its contract.

The fixture `relative_attention.npz` holds weights, inputs and outputs of
Hugging Face's `ParakeetEncoderAttention`, `Wav2Vec2ConformerSelfAttention`
(relative), `XLNetRelativeAttention` (content stream, with memory and
`clamp_len`) and ESPnet's `LegacyRelPositionMultiHeadedAttention`, run in
float64 (`fixtures/generate_relative_attention.py`).
"""

import json
import pathlib

import keras
import numpy as np
import pytest

from keras_posenc import AttentionContext
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc import TransformerXLPosition
from tests.backend import compiled
from tests.backend import numpy

FIXTURE = np.load(
    pathlib.Path(__file__).parent / "fixtures" / "relative_attention.npz"
)


def case(name):
    arrays = {
        key.split("/", 1)[1]: FIXTURE[key]
        for key in FIXTURE.files
        if key.startswith(name + "/")
    }
    return arrays, json.loads(str(arrays["config"]))


def torch_dense(weight, heads):
    """A torch Linear's `(out, in)` weight as Keras' `(in, heads, dim)` kernel."""
    return weight.T.reshape(weight.shape[1], heads, -1)


def conformer_attention(arrays, config, names, **position):
    """The Keras attention holding a Conformer reference's weights."""
    heads, features = config["num_heads"], config["hidden_size"]
    attention = PositionalMultiHeadAttention(
        num_heads=heads,
        key_dim=features // heads,
        position=TransformerXLPosition(**position),
    )
    tokens = np.zeros((1, 3, features), "float32")
    attention(tokens, tokens)
    for dense, name in zip(
        (attention._query_dense, attention._key_dense, attention._value_dense),
        names[:3],
    ):
        dense.kernel.assign(torch_dense(arrays[f"{name}.weight"], heads))
        dense.bias.assign(arrays[f"{name}.bias"].reshape(heads, -1))
    output = arrays[f"{names[3]}.weight"]  # (features, heads * dim)
    attention._output_dense.kernel.assign(output.T.reshape(heads, -1, features))
    attention._output_dense.bias.assign(arrays[f"{names[3]}.bias"])
    scheme = attention.position
    scheme.position_kernel.assign(torch_dense(arrays[f"{names[4]}.weight"], heads))
    scheme.content_bias.assign(arrays[names[5]])
    scheme.position_bias.assign(arrays[names[6]])
    return attention


CONFORMERS = {
    "parakeet": (
        ("q_proj", "k_proj", "v_proj", "o_proj", "relative_k_proj", "bias_u", "bias_v"),
        {},
    ),
    "w2v2_conformer": (
        ("linear_q", "linear_k", "linear_v", "linear_out", "linear_pos", "pos_bias_u", "pos_bias_v"),
        {},
    ),
    "espnet_legacy": (
        ("linear_q", "linear_k", "linear_v", "linear_out", "linear_pos", "pos_bias_u", "pos_bias_v"),
        {"shift": "legacy"},
    ),
    "espnet_legacy_maxlen_t": (
        ("linear_q", "linear_k", "linear_v", "linear_out", "linear_pos", "pos_bias_u", "pos_bias_v"),
        {"shift": "legacy", "legacy_max_length": 6},
    ),
}


def real_queries(allowed):
    """The query rows that attend to some key: padded ones may attend to none."""
    return allowed.any(-1)  # (batch, query)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
@pytest.mark.parametrize("name", list(CONFORMERS))
def test_conformer_references(name, masked):
    arrays, config = case(name)
    names, position = CONFORMERS[name]
    attention = conformer_attention(arrays, config, names, **position)
    tokens = arrays["hidden_states"].astype("float32")
    variant = "mask" if masked else "nomask"
    mask = arrays["mask/allowed"] if masked else None
    output = numpy(attention(tokens, tokens, attention_mask=mask))
    expected = arrays[f"{variant}/output"]
    rows = real_queries(arrays["mask/allowed"]) if masked else np.ones(tokens.shape[:2], bool)
    # ESPnet's legacy table is float32 at positions near 5000, as ours.
    tolerance = 1e-4 if name == "espnet_legacy" else 2e-5
    np.testing.assert_allclose(output[rows], expected[rows], rtol=tolerance, atol=tolerance)


def xlnet_attention(arrays, config, clamp_len=None):
    heads, features = config["num_heads"], config["d_model"]
    attention = PositionalMultiHeadAttention(
        num_heads=heads,
        key_dim=config["head_dim"],
        use_bias=False,
        position=TransformerXLPosition(pairing="half", clamp_len=clamp_len),
    )
    tokens = np.zeros((1, 3, features), "float32")
    attention(tokens, tokens)
    attention._query_dense.kernel.assign(arrays["q"])  # (d_model, heads, dim)
    attention._key_dense.kernel.assign(arrays["k"])
    attention._value_dense.kernel.assign(arrays["v"])
    attention._output_dense.kernel.assign(np.transpose(arrays["o"], (1, 2, 0)))
    scheme = attention.position
    scheme.position_kernel.assign(arrays["r"])
    scheme.content_bias.assign(arrays["r_w_bias"])
    scheme.position_bias.assign(arrays["r_r_bias"])
    return attention


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "padding-mask"])
@pytest.mark.parametrize("name", ["xlnet", "xlnet_mems", "xlnet_clamp"])
def test_xlnet_content_stream(name, masked):
    arrays, config = case(name)
    clamp_len = config["clamp_len"] if config["clamp_len"] > 0 else None
    attention = xlnet_attention(arrays, config, clamp_len)
    tokens = arrays["hidden_states"].astype("float32")
    keys, query_positions = tokens, None
    if config["mlen"]:
        # The memory comes first; the queries sit after it.
        keys = np.concatenate([arrays["memory"].astype("float32"), tokens], axis=1)
        query_positions = config["mlen"] + np.arange(config["qlen"])
    variant = "mask" if masked else "nomask"
    output = attention(
        tokens,
        keys,
        attention_mask=arrays["mask/allowed"] if masked else None,
        query_positions=query_positions,
    )
    np.testing.assert_allclose(
        numpy(output), arrays[f"{variant}/output"], rtol=2e-5, atol=2e-5
    )


def random_attention(seed=0, features=16, heads=2, **position):
    attention = PositionalMultiHeadAttention(
        num_heads=heads, key_dim=features // heads, position=TransformerXLPosition(**position)
    )
    tokens = np.zeros((1, 3, features), "float32")
    attention(tokens, tokens)
    rng = np.random.default_rng(seed)
    for weight in attention.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    return attention


@pytest.mark.parametrize("pairing", ["interleaved", "half"])
def test_every_path_reads_the_same_relative_positions(pairing):
    # The window read in place (default positions, by blocks of queries),
    # the product over features (positions given) and a table clamped
    # beyond every distance give one attention.
    length = 600  # over two blocks of 256 queries, and a rest
    attention = random_attention(pairing=pairing)
    clamped = random_attention(pairing=pairing, clamp_len=length)
    tokens = np.random.default_rng(1).normal(size=(2, length, 16)).astype("float32")
    default = numpy(attention(tokens, tokens))
    given = numpy(
        attention(tokens, tokens, query_positions=np.arange(length), key_positions=np.arange(length))
    )
    np.testing.assert_allclose(given, default, atol=2e-5)
    np.testing.assert_allclose(numpy(clamped(tokens, tokens)), default, atol=2e-5)
    blocks = 512  # two blocks of 256: the block path
    np.testing.assert_allclose(
        numpy(attention(tokens[:, :blocks], tokens[:, :blocks])),
        numpy(
            attention(
                tokens[:, :blocks],
                tokens[:, :blocks],
                query_positions=np.arange(blocks),
            )
        ),
        atol=2e-5,
    )


def test_cached_decoding_equals_one_causal_pass():
    attention = random_attention()
    tokens = np.random.default_rng(2).normal(size=(2, 7, 16)).astype("float32")
    full = numpy(attention(tokens, tokens, use_causal_mask=True))
    cache = np.zeros((2, 2, 7, 2, 8), "float32")
    prompt, cache = attention(
        tokens[:, :4], tokens[:, :4], use_causal_mask=True, cache=cache, cache_update_index=0
    )
    steps = [numpy(prompt)]
    for index in range(4, 7):
        step, cache = attention(
            tokens[:, index : index + 1],
            tokens[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
        )
        steps.append(numpy(step))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=2e-5)


def test_memory_segments_equal_the_longer_sequence():
    # Attending from the last tokens to memory + them, at their positions,
    # is the last rows of one pass over the whole sequence.
    attention = random_attention()
    tokens = np.random.default_rng(3).normal(size=(1, 9, 16)).astype("float32")
    whole = numpy(attention(tokens, tokens))
    tail = numpy(attention(tokens[:, 4:], tokens, query_positions=np.arange(4, 9)))
    np.testing.assert_allclose(tail, whole[:, 4:], atol=2e-5)


def test_compiled_and_saved(tmp_path):
    inputs = keras.Input((12, 16))
    attention = PositionalMultiHeadAttention(
        num_heads=2, key_dim=8, position=TransformerXLPosition(clamp_len=5)
    )
    model = keras.Model(inputs, attention(inputs, inputs, use_causal_mask=True))
    rng = np.random.default_rng(4)
    for weight in model.weights:
        weight.assign(0.3 * rng.normal(size=weight.shape).astype("float32"))
    tokens = rng.normal(size=(3, 12, 16)).astype("float32")
    eager = model.predict(tokens, verbose=0)
    np.testing.assert_allclose(numpy(compiled(model)(tokens)), eager, atol=2e-5)
    model.save(tmp_path / "xl.keras")
    restored = keras.saving.load_model(tmp_path / "xl.keras")
    np.testing.assert_array_equal(restored.predict(tokens, verbose=0), eager)
    position = restored.layers[1].position
    assert position.get_config() == attention.position.get_config()
    assert TransformerXLPosition.from_config(position.get_config()).clamp_len == 5


def test_mixed_bfloat16_keeps_the_logits_in_float32():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        attention = random_attention()
        tokens = np.random.default_rng(5).normal(size=(2, 10, 16)).astype("float32")
        output = attention(tokens, tokens)
        assert keras.backend.standardize_dtype(output.dtype) == "bfloat16"
        assert keras.backend.standardize_dtype(attention.position.position_kernel.dtype) == "float32"
    finally:
        keras.config.set_dtype_policy("float32")
    reference = random_attention()
    np.testing.assert_allclose(
        numpy(output).astype("float32"), numpy(reference(tokens, tokens)), atol=0.1
    )


def test_training_moves_every_weight():
    inputs = keras.Input((8, 16))
    attention = PositionalMultiHeadAttention(num_heads=2, key_dim=8, position=TransformerXLPosition())
    model = keras.Model(inputs, keras.layers.Dense(1)(attention(inputs, inputs)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    rng = np.random.default_rng(6)
    x = rng.normal(size=(16, 8, 16)).astype("float32")
    before = [numpy(w).copy() for w in attention.position.weights]
    model.fit(x, np.cumsum(x[..., :1], 1), epochs=2, verbose=0)
    for old, weight in zip(before, attention.position.weights):
        assert not np.allclose(old, numpy(weight)), weight.name


@pytest.mark.parametrize(
    "arguments, match",
    [
        ({"pairing": "concat"}, "pairing"),
        ({"shift": "relative"}, "shift"),
        ({"max_wavelength": 0.5}, "max_wavelength"),
        ({"clamp_len": 0}, "clamp_len"),
        ({"clamp_len": 4, "shift": "legacy"}, "clamp_len"),
        ({"embedding_dim": 7}, "embedding_dim"),
        ({"legacy_max_length": -1}, "legacy_max_length"),
    ],
)
def test_bad_arguments_are_refused(arguments, match):
    with pytest.raises(ValueError, match=match):
        TransformerXLPosition(**arguments)


def test_legacy_needs_the_default_positions():
    attention = random_attention(shift="legacy")
    tokens = np.zeros((1, 4, 16), "float32")
    with pytest.raises(ValueError, match="shift='legacy'"):
        attention(tokens, tokens, query_positions=np.arange(4))
    with pytest.raises(ValueError, match="features"):
        PositionalMultiHeadAttention(2, 8, position=TransformerXLPosition())(
            np.zeros((1, 3, 15), "float32"), np.zeros((1, 3, 15), "float32")
        )


@pytest.mark.parametrize("queries, keys", [(1, 5), (3, 7), (7, 3), (1, 1), (0, 5), (5, 0)])
def test_any_lengths_read_the_same_relative_positions(queries, keys):
    # The window of the default positions against the product over the
    # encoding's features, one query included; no queries or no keys give
    # the attention's empty output or its bias alone, as without a scheme.
    attention = random_attention()
    rng = np.random.default_rng(7)
    query = rng.normal(size=(2, queries, 16)).astype("float32")
    value = rng.normal(size=(2, keys, 16)).astype("float32")
    default = numpy(attention(query, value))
    assert default.shape == (2, queries, 16)
    given = numpy(
        attention(query, value, query_positions=np.arange(queries), key_positions=np.arange(keys))
    )
    np.testing.assert_allclose(given, default, atol=2e-5)


def test_a_memory_of_other_features_than_built_on_is_refused_naming_value():
    attention = PositionalMultiHeadAttention(2, 4, position=TransformerXLPosition())
    frames = np.zeros((1, 4, 16), "float32")
    attention(frames, frames)
    memory_and_frames = np.zeros((1, 6, 20), "float32")
    with pytest.raises(ValueError, match=r"`value` must have 16 features.*shape \(1, 6, 20\)"):
        attention(frames, memory_and_frames)


def test_logits_bias_before_build_names_build_for_attention():
    heads = np.zeros((1, 4, 2, 4), "float32")
    positions = np.arange(4, dtype="int32")[None]
    context = AttentionContext(query_positions=positions, key_positions=positions)
    with pytest.raises(ValueError, match="`build_for_attention"):
        TransformerXLPosition().logits_bias(heads, heads, context)
