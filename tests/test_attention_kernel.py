"""The attention's kernel: every path equals the reference and float64 NumPy.

`keras_posenc.layers._attention_kernel.attend` runs one of four paths,
chosen from the backend, the device and what the scheme contributes. Each
path is forced here in turn (blocks of 4 queries, so that 11 queries make
two whole blocks and a tail of 3) and compared with the float64 reference
of `test_positional_multi_head_attention` where it knows the scheme, and
with the reference path for every scheme. The fused paths call the
backend's own kernel (PyTorch's SDPA, JAX's `dot_product_attention`), so
they are checked on PyTorch and JAX; TensorFlow has none.
"""

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import PositionalMultiHeadAttention
from keras_posenc.layers import _attention_kernel
from keras_posenc_lab.bench import compiled as compiled_program
from tests.backend import BACKEND
from tests.backend import compiled
from tests.backend import gradients
from tests.backend import numpy
from tests.test_positional_multi_head_attention import HEADS
from tests.test_positional_multi_head_attention import KEY_DIM
from tests.test_positional_multi_head_attention import SCHEMES
from tests.test_positional_multi_head_attention import assert_close
from tests.test_positional_multi_head_attention import randomize_weights
from tests.test_positional_multi_head_attention import reference_attention

BATCH = 2
LENGTH = 11
BLOCK = 4
# Even: Transformer-XL's sinusoids of the inputs' width pair sines and cosines.
FEATURES = 6

# The float64 reference knows these; the others are compared with the
# reference path (each has its own float64 test in its own file).
KNOWN = {
    "none": SCHEMES["none"],
    "rotary": SCHEMES["rotary"],
    "alibi": SCHEMES["alibi"],
    "alibi-bidirectional": SCHEMES["alibi-bidirectional"],
    "t5": SCHEMES["t5"],
    "t5-unidirectional": SCHEMES["t5-unidirectional"],
    "shaw": SCHEMES["shaw"],
}
OTHERS = {
    "xpos": lambda: keras_posenc.XPosEmbedding(scale_base=16),
    "temperature": lambda: keras_posenc.AttentionTemperature(floor_scale=4),
    "kerple": lambda: keras_posenc.KerpleBias(HEADS),
    "kerple-power": lambda: keras_posenc.KerpleBias(HEADS, form="power"),
    "fire": lambda: keras_posenc.FireBias(HEADS),
    "transformer-xl": lambda: keras_posenc.TransformerXLPosition(),
    "deberta": lambda: keras_posenc.DisentangledPosition(
        position_buckets=4, max_relative_positions=8
    ),
    "cope": lambda: keras_posenc.ContextualPosition(4),
}
# Schemes that hold under a causal mask only.
CAUSAL_ONLY = {"xpos", "cope"}
# The fused kernels take no value term and no weights.
FUSED_PATHS = ("fused", "fused_blocks") if BACKEND in ("torch", "jax") else ()
PATHS = ("reference", "reference_blocks") + FUSED_PATHS


def takes_path(position, path):
    """Whether `path` can serve `position` (a fused kernel has no value term)."""
    contributions = frozenset() if position is None else position.contributions
    return not (path in FUSED_PATHS and "value_term" in contributions)


@pytest.fixture
def force_path(monkeypatch):
    """Make `attend` take `path`, in blocks of `BLOCK` where it has blocks."""

    def force(path):
        block = BLOCK if path.endswith("blocks") else None
        monkeypatch.setattr(
            _attention_kernel, "choose", lambda *args, **kwargs: (path, block)
        )

    return force


def built(make_position, seed=1, **kwargs):
    layer = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=make_position(), **kwargs
    )
    layer.build((1, 1, FEATURES), (1, 1, FEATURES))
    randomize_weights(layer, seed)
    return layer


def tokens_and_mask(masked):
    rng = np.random.default_rng(0)
    tokens = rng.normal(size=(BATCH, LENGTH, FEATURES)).astype("float32")
    mask = None
    if masked:
        mask = rng.uniform(size=(BATCH, LENGTH, LENGTH)) < 0.7
        mask[:, 5] = False  # a query with no key: zero output, as the reference
    return tokens, mask


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scheme", KNOWN)
def test_every_path_equals_float64_reference(scheme, causal, masked, path, force_path):
    layer = built(KNOWN[scheme])
    if not takes_path(layer.position, path):
        path = "reference_blocks"
    tokens, mask = tokens_and_mask(masked)
    expected, _ = reference_attention(layer, tokens, tokens, mask=mask, causal=causal)
    force_path(path)
    # Without a position, positions given take the kernel (else Keras' own).
    positions = {"query_positions": np.arange(LENGTH)} if scheme == "none" else {}
    output = layer(
        tokens, tokens, attention_mask=mask, use_causal_mask=causal, **positions
    )
    assert_close(output, expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("scheme", OTHERS)
def test_every_path_equals_the_reference_path(scheme, masked, path, force_path):
    layer = built(OTHERS[scheme])
    if not takes_path(layer.position, path):
        path = "reference_blocks"
    tokens, mask = tokens_and_mask(masked)
    causal = True

    def call():
        return numpy(
            layer(tokens, tokens, attention_mask=mask, use_causal_mask=causal)
        ).astype("float64")

    force_path("reference")
    expected = call()
    force_path(path)
    assert_close(call(), expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scheme", ["rotary", "alibi", "t5"])
def test_every_path_at_positions_given_per_batch(scheme, path, force_path):
    layer = built(KNOWN[scheme])
    tokens, _ = tokens_and_mask(False)
    positions = np.array([np.arange(LENGTH) * 3, np.arange(LENGTH) + 40])
    expected, _ = reference_attention(
        layer,
        tokens,
        tokens,
        query_positions=positions,
        key_positions=positions,
        causal=True,
    )
    force_path(path)
    output = layer(
        tokens,
        tokens,
        use_causal_mask=True,
        query_positions=positions,
        key_positions=positions,
    )
    assert_close(output, expected)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("default", [False, True], ids=["given", "default"])
def test_every_path_gives_nan_to_the_queries_that_read_a_position_out_of_range(
    masked, default, path, force_path
):
    # xPos's queries and keys past its range are NaN: a query there, and
    # every query that attends to such a key, gives NaN; the others not.
    # Its range: within 64 * scale_base of the centre. Positions 0 .. 10
    # from a centre at -58, or 58 .. 68 from 0: from the eighth on, out.
    limit = 64
    center = -(limit - 6) if default else 0
    layer = built(
        lambda: keras_posenc.XPosEmbedding(scale_base=1.0, scale_center=center)
    )
    tokens, mask = tokens_and_mask(masked)
    positions = np.arange(LENGTH) + (0 if default else limit - 6)
    given = {} if default else {"query_positions": positions, "key_positions": positions}
    force_path(path)
    output = numpy(
        layer(tokens, tokens, attention_mask=mask, use_causal_mask=True, **given)
    )  # (batch, query, features)
    out = np.abs(positions - center) > limit  # (key,)
    attends = np.tril(np.ones((LENGTH, LENGTH), bool))[None]
    if mask is not None:
        attends = attends & mask
    reads_out = np.broadcast_to(
        (attends & out[None, None]).any(-1) | out[None], (BATCH, LENGTH)
    )  # (batch, query)
    assert reads_out.any() and not reads_out.all()
    np.testing.assert_array_equal(np.isnan(output).all(-1), reads_out)
    np.testing.assert_array_equal(np.isnan(output).any(-1), reads_out)


@pytest.mark.parametrize("path", ("reference",) + FUSED_PATHS[:1])
@pytest.mark.parametrize("scheme", ["rotary", "alibi", "xpos", "kerple"])
def test_cached_decoding_on_every_path_equals_one_causal_pass(
    scheme, path, force_path
):
    make = {**KNOWN, **OTHERS}[scheme]
    layer = built(make)
    tokens, _ = tokens_and_mask(False)
    force_path("reference")
    expected = numpy(layer(tokens, tokens, use_causal_mask=True))
    force_path(path)
    cache = np.zeros((BATCH, 2, LENGTH, HEADS, KEY_DIM), "float32")
    prompt, cache = layer(
        tokens[:, :6], tokens[:, :6], use_causal_mask=True, cache=cache,
        cache_update_index=0,
    )
    outputs = [numpy(prompt)]
    for index in range(6, LENGTH):
        step, cache = layer(
            tokens[:, index : index + 1],
            tokens[:, index : index + 1],
            use_causal_mask=True,
            cache=cache,
            cache_update_index=index,
        )
        outputs.append(numpy(step))
    assert_close(np.concatenate(outputs, axis=1), expected.astype("float64"))


@pytest.mark.parametrize("path", PATHS[1:])
@pytest.mark.parametrize("scheme", ["rotary", "alibi", "t5", "fire"])
def test_gradients_on_every_path_equal_the_reference_path(scheme, path, force_path):
    layer = built({**KNOWN, **OTHERS}[scheme])
    tokens, _ = tokens_and_mask(False)

    def call(x):
        return layer(x, x, use_causal_mask=True)

    force_path("reference")
    expected = gradients(call, tokens)[0]
    force_path(path)
    assert_close(gradients(call, tokens)[0], expected.astype("float64"))


@pytest.mark.parametrize("path", PATHS)
def test_every_path_compiles(path, force_path):
    layer = built(KNOWN["alibi"])
    tokens, _ = tokens_and_mask(False)
    force_path("reference")
    expected = numpy(layer(tokens, tokens, use_causal_mask=True))
    force_path(path)
    output = compiled(lambda x: layer(x, x, use_causal_mask=True))(tokens)
    assert_close(output, expected.astype("float64"))


def test_an_eager_call_in_blocks_hands_no_code_to_autograph(force_path, monkeypatch):
    # TensorFlow's `tf.map_fn` hands its body to AutoGraph, eagerly too;
    # converting the attention's call path took 8 to 16 s of a first call
    # past the blocks' size. The other backends have no AutoGraph: there
    # the blocks' values alone are checked.
    layer = built(KNOWN["t5"])
    tokens, _ = tokens_and_mask(False)
    force_path("reference")
    expected = numpy(layer(tokens, tokens, use_causal_mask=True))
    force_path("reference_blocks")
    converted = []
    if BACKEND == "tensorflow":
        from tensorflow.python.autograph.impl import api

        convert = api.converted_call

        def recording(function, *args, **kwargs):
            converted.append(getattr(function, "__name__", repr(function)))
            return convert(function, *args, **kwargs)

        monkeypatch.setattr(api, "converted_call", recording)
    output = layer(tokens, tokens, use_causal_mask=True)
    assert converted == []
    assert_close(output, expected.astype("float64"))


@pytest.mark.parametrize("path", [p for p in PATHS if p.endswith("blocks")])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("scheme", ["alibi", "t5", "cope"])
def test_causal_groups_read_the_keys_up_to_their_last_query(
    scheme, masked, path, force_path, monkeypatch
):
    # 19 queries in blocks of 4: four whole blocks and a tail of 3, in
    # three groups of 4, 4, and 8 + 3 queries, reading 4, 8 and 19 keys.
    length = 19
    monkeypatch.setattr(_attention_kernel, "CAUSAL_GROUPS", 3)
    layer = built({**KNOWN, **OTHERS}[scheme])
    rng = np.random.default_rng(3)
    tokens = rng.normal(size=(BATCH, length, FEATURES)).astype("float32")
    mask = rng.uniform(size=(BATCH, length, length)) < 0.7 if masked else None
    force_path("reference")
    expected = numpy(
        layer(tokens, tokens, attention_mask=mask, use_causal_mask=True)
    ).astype("float64")
    force_path(path)
    keys_read = []
    for name in ("reference", "fused"):
        inner = getattr(_attention_kernel, name)

        def spy(attention, query, key, *args, inner=inner, **kwargs):
            keys_read.append((query.shape[1], key.shape[1]))
            return inner(attention, query, key, *args, **kwargs)

        monkeypatch.setattr(_attention_kernel, name, spy)
    output = layer(tokens, tokens, attention_mask=mask, use_causal_mask=True)
    assert_close(output, expected)
    # Each block's queries, and the keys it read.
    assert sorted(set(keys_read)) == [(3, 19), (4, 4), (4, 8), (4, 19)]
    # Positions given: no group, every key read.
    keys_read.clear()
    layer(tokens, tokens, use_causal_mask=True, query_positions=np.arange(length))
    assert {keys for _, keys in keys_read} == {length}


def chosen(monkeypatch):
    """The paths `attend` takes from now on, as a list it appends to."""
    taken = []
    choose = _attention_kernel.choose

    def spy(*args, **kwargs):
        taken.append(choose(*args, **kwargs)[0])
        return choose(*args, **kwargs)

    monkeypatch.setattr(_attention_kernel, "choose", spy)
    return taken


def test_the_path_follows_the_backend_and_the_scheme(monkeypatch):
    monkeypatch.setattr(_attention_kernel, "QUERY_BLOCK", 4)
    monkeypatch.setattr(_attention_kernel, "LOGITS_ELEMENTS", 1)
    # Blocks of 4 queries on the fused path too: 3 heads of 11 keys.
    monkeypatch.setattr(_attention_kernel, "BLOCK_ELEMENTS", 4 * 3 * LENGTH)
    monkeypatch.setattr(_attention_kernel, "SMALLEST_QUERY_BLOCK", 4)
    monkeypatch.setattr(_attention_kernel, "FUSED_XLA_QUERY_BLOCK", 4)
    monkeypatch.setattr(_attention_kernel, "FUSED_XLA_VALUE_TERM_QUERY_BLOCK", 4)
    tokens, _ = tokens_and_mask(False)
    rope = built(KNOWN["rotary"])
    alibi = built(KNOWN["alibi"])
    shaw = built(KNOWN["shaw"])
    taken = chosen(monkeypatch)
    rope(tokens, tokens)
    alibi(tokens, tokens)
    shaw(tokens, tokens)
    rope(tokens, tokens, return_attention_scores=True)
    short = tokens[:, :3]
    alibi(short, short)
    fused = BACKEND == "torch"
    assert taken == (
        ["fused", "fused_blocks", "reference_blocks", "reference", "fused"]
        if fused
        else ["reference_blocks"] * 3 + ["reference"] * 2
    )


# At (4, 1024) the logits are whole at 2 ** 25 entries; at (1, 8192) blocks
# of 2 ** 25 logits under XLA (TensorFlow, JAX's CPU before its fused
# kernel), or where each step writes a tensor of a block's size (eager
# PyTorch), of 2 ** 22 logits, or a bias of that many, on its fused path.
BLOCKS_BY_BACKEND = {
    ("shaw", 1024): {"torch": ("reference", None), "xla": ("reference", None)},
    ("shaw", 8192): {
        "torch": ("reference_blocks", 64),
        "xla": ("reference_blocks", 512),
    },
    ("alibi", 1024): {"torch": ("fused", None), "xla": ("reference", None)},
    ("alibi", 8192): {
        "torch": ("fused_blocks", 64),
        "xla": ("reference_blocks", 512),
    },
}


@pytest.mark.parametrize("scheme, batch, length", [
    ("shaw", 4, 1024), ("shaw", 1, 8192), ("alibi", 4, 1024), ("alibi", 1, 8192)
])
def test_the_blocks_bound_the_logits_and_the_bias(scheme, batch, length):
    position = {
        # Shaw's value term keeps it off the fused path on every backend.
        "shaw": lambda: keras_posenc.RelativePositionEmbedding(max_relative_position=4),
        "alibi": lambda: keras_posenc.AlibiBias(8),
    }[scheme]()
    attention = _attention_kernel.Attention(
        position=position,
        dropout=0.0,
        dropout_layer=None,
        flash_attention=False,
        sliding_window=None,
        scores_dtype="float32",
    )
    heads = keras.KerasTensor((batch, length, 8, 64))
    context = keras_posenc.AttentionContext(
        query_positions=keras.KerasTensor((1, length), dtype="int32"),
        key_positions=keras.KerasTensor((1, length), dtype="int32"),
    )
    if keras_posenc.ops._backend.fuses_attention():
        # JAX's CPU: its own small blocks, whatever the length.
        expected = (
            "reference_blocks",
            _attention_kernel.FUSED_XLA_VALUE_TERM_QUERY_BLOCK
            if scheme == "shaw"
            else _attention_kernel.FUSED_XLA_QUERY_BLOCK,
        )
    else:
        expected = BLOCKS_BY_BACKEND[scheme, length][
            "torch" if BACKEND == "torch" else "xla"
        ]
    assert _attention_kernel.choose(attention, heads, heads, context, False, False) == expected


def test_dropout_in_training_takes_the_reference(monkeypatch):
    layer = built(KNOWN["rotary"], dropout=0.5)
    taken = chosen(monkeypatch)
    tokens, _ = tokens_and_mask(False)
    layer(tokens, tokens, training=True)
    layer(tokens, tokens, training=False)
    assert taken[0] == "reference"
    assert taken[1] == ("fused" if BACKEND == "torch" else "reference")


def largest_tensor_on_torch(call):
    """The most elements of any tensor an aten op writes during `call()`."""
    from torch.utils._python_dispatch import TorchDispatchMode

    largest = [0]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, op, types, args=(), kwargs=None):
            outputs = op(*args, **(kwargs or {}))
            for output in outputs if isinstance(outputs, (tuple, list)) else [outputs]:
                if hasattr(output, "numel"):
                    largest[0] = max(largest[0], output.numel())
            return outputs

    with Largest():
        call()
    return largest[0]


@pytest.mark.parametrize(
    "scheme, causal",
    [
        pytest.param(scheme, causal, id=f"{scheme}-{'causal' if causal else 'full'}")
        for scheme in ("rope", "xpos", "alibi", "t5", "kerple", "fire")
        for causal in (False, True)
        # xPos holds under a causal mask only.
        if causal or scheme != "xpos"
    ],
)
def test_no_tensor_of_the_logits_size_is_written(scheme, causal, monkeypatch):
    # FIRE names blocks of 256 queries: two of them.
    batch, length, heads, key_dim, block = 2, 512, 4, 16, 64
    monkeypatch.setattr(_attention_kernel, "QUERY_BLOCK", block)
    monkeypatch.setattr(_attention_kernel, "BLOCK_ELEMENTS", block * heads * length)
    monkeypatch.setattr(_attention_kernel, "LOGITS_ELEMENTS", 1)
    position = {
        "rope": lambda: keras_posenc.RotaryEmbedding(),
        "xpos": lambda: keras_posenc.XPosEmbedding(),
        "alibi": lambda: keras_posenc.AlibiBias(heads),
        "t5": lambda: keras_posenc.RelativePositionBias(heads),
        "kerple": lambda: keras_posenc.KerpleBias(heads),
        "fire": lambda: keras_posenc.FireBias(heads),
    }[scheme]()
    layer = PositionalMultiHeadAttention(heads, key_dim, position=position)
    inputs = keras.random.normal((batch, length, heads * key_dim), seed=0)
    logits = batch * heads * length * length
    # RoPE's largest tensors are the inputs'; a bias scheme's are one
    # block's logits (PyTorch's flash kernel takes no bias that needs a
    # gradient: its other kernels then write the block's logits).
    allowed = logits // 8 if scheme in ("rope", "xpos") else batch * heads * block * length
    if BACKEND == "torch":
        layer(inputs, inputs, use_causal_mask=causal)
        found = largest_tensor_on_torch(
            lambda: layer(inputs, inputs, use_causal_mask=causal)
        )
        assert found <= allowed
    else:
        hlo = compiled_program.optimized_hlo(
            lambda x: layer(x, x, use_causal_mask=causal), inputs
        )
        assert compiled_program.results_of_size(hlo, logits) == 0


def test_flash_attention_takes_rope_and_refuses_a_bias():
    rope = PositionalMultiHeadAttention(
        HEADS, KEY_DIM, position=keras_posenc.RotaryEmbedding(), flash_attention=True
    )
    assert rope.position is not None
    with pytest.raises(ValueError, match="AlibiBias adds to the logits"):
        PositionalMultiHeadAttention(
            HEADS, KEY_DIM, position=keras_posenc.AlibiBias(HEADS), flash_attention=True
        )
    with pytest.raises(ValueError, match="RelativePositionEmbedding"):
        PositionalMultiHeadAttention(
            HEADS,
            KEY_DIM,
            position=keras_posenc.RelativePositionEmbedding(2),
            flash_attention=True,
        )


def test_flash_attention_with_rope_equals_float64_reference_or_says_why_not():
    layer = built(KNOWN["rotary"], flash_attention=True)
    tokens, _ = tokens_and_mask(False)
    expected, _ = reference_attention(layer, tokens, tokens, causal=True)
    if BACKEND == "torch":
        # PyTorch's flash kernel runs on the CPU too.
        assert_close(layer(tokens, tokens, use_causal_mask=True), expected)
    else:
        with pytest.raises(ValueError, match="needs a flash kernel"):
            layer(tokens, tokens, use_causal_mask=True)


@pytest.mark.parametrize("fuses", [False, True])
def test_the_kernel_tells_the_scheme_whether_xla_fuses_the_attention(fuses, monkeypatch):
    # The schemes ask the context, which the kernel fills from the backend's
    # one answer; the output is the float64 reference's either way.
    monkeypatch.setattr(_attention_kernel._backend, "fuses_attention", lambda: fuses)
    # Shaw's scheme: its bias comes from `logits_bias` on every path.
    layer = built(KNOWN["shaw"])
    seen = []
    logits_bias = layer.position.logits_bias

    def recording(query, key, context):
        seen.append(context.fused)
        return logits_bias(query, key, context)

    monkeypatch.setattr(layer.position, "logits_bias", recording)
    tokens, _ = tokens_and_mask(False)
    output = layer(tokens, tokens)
    assert seen and set(seen) == {fuses}
    expected, _ = reference_attention(layer, tokens, tokens)
    assert_close(output, expected)
