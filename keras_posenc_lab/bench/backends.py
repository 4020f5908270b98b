"""Benchmark: the attention on each backend's own kernel, against its best.

One self-attention call `layer(x, x)` per scheme, on the backend that
`KERAS_BACKEND` names, against what that backend's users have, at
`(batch, length, 512)`, 8 heads of 64, for every length (`--length`),
dtype (`--dtype`: float32, or bfloat16 as Keras' `mixed_bfloat16` policy
against the peers' bfloat16) and mode (`--mode`: `forward`, under
`no_grad` on PyTorch, or `training`, the forward and the gradients of the
output's sum with respect to the weights):

- PyTorch: x-transformers' `Attention(flash=True)` (it calls torch's
  `scaled_dot_product_attention`) with the same scheme: plain, RoPE,
  ALiBi, T5 and xPos (causal, as xPos needs), and CoPE (64 positions,
  causal, on x-transformers' attention that writes the logits, which
  CoPE reads); KERPLE and FIRE, which x-transformers lacks, against its
  ALiBi. Targets: RoPE and xPos at most 1.10 times; ALiBi and T5 at most
  1.0 times (x-transformers writes the whole bias); KERPLE and FIRE at
  most 1.15 times its ALiBi; CoPE at most 1.6 times its CoPE.
- JAX, under `jax.jit`: the same projections written by hand around
  `jax.nn.dot_product_attention` (cuDNN in bfloat16 on a GPU, XLA
  otherwise), with RoPE's and xPos' tables, or a whole `(1, 8, length,
  length)` bias, computed beforehand and passed in. Target: every scheme
  at most 1.10 times.

Keras' own `MultiHeadAttention` is timed beside them. `--anchors` adds
the kernels alone on projected heads `(batch, 8, length, 64)`: on PyTorch
SDPA plain and with the whole ALiBi bias, FlexAttention
(`torch.compile`d on a GPU) plain and with ALiBi as a `score_mod`; on JAX
`dot_product_attention` with XLA and with cuDNN (bfloat16 on a GPU), plain
and with the ALiBi bias. `--flash` adds RoPE inside
`PositionalMultiHeadAttention(flash_attention=True)` against Keras'
`MultiHeadAttention(flash_attention=True)`, causal, in bfloat16 (target on
JAX: at most 1.05 times).

Time: each candidate's first call (tracing, compiling, autotuning) is timed
and printed apart (on JAX every program of a table is traced, then all are
compiled at once in threads: each one's time is its lowering, its compile
beside the others and its first call), a second call is not timed, then
the candidates are called in rounds, each once per round, in the list's
order and then in reverse; a ratio is the median over rounds of the two
calls' times in that round (`torch.cuda.synchronize` or
`block_until_ready` inside each call's time).

Memory (`--memory`): the peak of one forward call at `(1,
--memory-length)`, float32, of every scheme (target: at most 1 GiB) and of
Keras' own attention (not of x-transformers', whose bias schemes write the
whole `(heads, length, length)` bias): on a GPU, PyTorch's
`max_memory_allocated` above what was allocated before the call, and JAX's
compiled `memory_analysis()` (its temporary buffers and output); on the
CPU, PyTorch's growth of the process's resident high-water mark over one
call, reset before each (or each candidate in a fresh process where
Linux cannot reset it), and JAX's compiled `memory_analysis()`.

Equality (`--equality`): every scheme of the language, vision and graph
tasks, the same layer with the same weights called on the accelerator and
on the CPU in float32, causal and not; the largest absolute difference,
within 1e-4 on PyTorch and 2e-3 on JAX (its default float32 matmul
precision on GPUs). The command exits with status 1 when one is not.

Each section (a table) runs on its own: one that fails prints a line and
the others still run; past `--budget` seconds, the candidates and sections
left print a line each instead. They run in this order: equality, memory,
the comparisons, the flash rows, the kernels alone.

    KERAS_BACKEND=torch python -m keras_posenc_lab.bench.backends
    KERAS_BACKEND=jax python -m keras_posenc_lab.bench.backends --memory
"""

import argparse
import contextlib
import ctypes
import gc
import math
import os
import re
import statistics
import subprocess
import sys
import time
import warnings

import keras
import numpy as np

import keras_posenc
from keras_posenc_lab import encodings

HEADS = 8
HEAD_DIM = 64
# CoPE's positions, as the language task's (its training length).
COPE_POSITIONS = 64
WIDTH = HEADS * HEAD_DIM
# The schemes, and whether each is called with the causal mask.
SCHEMES = {
    "plain": False,
    "rope": False,
    "alibi": False,
    "t5": False,
    "xpos": True,
    "kerple": False,
    "fire": False,
    "cope": True,
}
# Per scheme: the x-transformers scheme it is judged against on PyTorch,
# and the target (None: shown, not judged).
TORCH_TARGETS = {
    "plain": ("plain", None),
    "rope": ("rope", 1.10),
    "xpos": ("xpos", 1.10),
    "alibi": ("alibi", 1.0),
    "t5": ("t5", 1.0),
    "kerple": ("alibi", 1.15),
    "fire": ("alibi", 1.15),
    "cope": ("cope", 1.6),
}
# Per scheme on JAX: the hand-written attention it is judged against (what
# it precomputes, and whether causal), all at most 1.10 times.
JAX_TARGETS = {
    "plain": ("plain", 1.10),
    "rope": ("rotary", 1.10),
    "xpos": ("rotary, causal", 1.10),
    "alibi": ("bias", 1.10),
    "t5": ("bias", 1.10),
    "kerple": ("bias", 1.10),
    "fire": ("bias", 1.10),
    "cope": ("bias, causal", 1.10),
}
JAX_FLASH_TARGET = 1.05
MEMORY_TARGET_MIB = 1024
TOLERANCE = {"torch": 1e-4, "jax": 2e-3}
# The equality rows' shapes: batch, length, and the vision task's grid
# (a class token first).
EQUALITY_BATCH = 2
EQUALITY_LENGTH = 128
EQUALITY_GRID = (8, 8)
EQUALITY_NODES = 24


def position_of(name):
    """The package's scheme called `name`, or None for plain attention."""
    return {
        "plain": lambda: None,
        "rope": lambda: keras_posenc.RotaryEmbedding(),
        "alibi": lambda: keras_posenc.AlibiBias(HEADS),
        "t5": lambda: keras_posenc.RelativePositionBias(HEADS),
        "xpos": lambda: keras_posenc.XPosEmbedding(),
        "kerple": lambda: keras_posenc.KerpleBias(HEADS),
        "fire": lambda: keras_posenc.FireBias(HEADS),
        "cope": lambda: keras_posenc.ContextualPosition(COPE_POSITIONS),
    }[name]()


def policy_of(dtype):
    """The Keras dtype policy of the rows in `dtype`."""
    return "mixed_bfloat16" if dtype == "bfloat16" else dtype


def keras_layer(name, dtype="float32", flash_attention=None, batch=1):
    """`PositionalMultiHeadAttention` with scheme `name`, built."""
    layer = keras_posenc.PositionalMultiHeadAttention(
        HEADS,
        HEAD_DIM,
        position=position_of(name),
        flash_attention=flash_attention,
        dtype=dtype,
    )
    layer.build((batch, None, WIDTH), (batch, None, WIDTH))
    return layer


def plain_keras_layer(dtype="float32", flash_attention=None, batch=1):
    layer = keras.layers.MultiHeadAttention(
        HEADS, HEAD_DIM, flash_attention=flash_attention, dtype=dtype
    )
    layer.build((batch, None, WIDTH), (batch, None, WIDTH))
    return layer


def alibi_slopes():
    """ALiBi's slope per head for 8 heads: 2^-1 ... 2^-8."""
    return 2.0 ** -np.arange(1, HEADS + 1, dtype="float32")  # (heads,)


def alibi_bias(length):
    """ALiBi's whole bias, `(1, heads, length, length)` float32 NumPy."""
    positions = np.arange(length, dtype="float32")
    distance = np.abs(positions[:, None] - positions[None, :])  # (query, key)
    return -alibi_slopes()[None, :, None, None] * distance[None, None]


def on_gpu():
    if keras.backend.backend() == "torch":
        import torch

        return torch.cuda.is_available()
    import jax

    return jax.default_backend() == "gpu"


def device_name():
    """The device the backend computes on, in words."""
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
        return "CPU"
    import jax

    return jax.devices()[0].device_kind


def versions():
    """The versions that the numbers depend on, in words."""
    names = [f"Keras {keras.__version__}"]
    if keras.backend.backend() == "torch":
        import torch
        import x_transformers  # noqa: F401
        from importlib.metadata import version

        names.insert(0, f"torch {torch.__version__}")
        names.append(f"x-transformers {version('x-transformers')}")
    else:
        import jax

        names.insert(0, f"JAX {jax.__version__}")
    return ", ".join(names)


def inputs_for(batch, length, dtype="float32", seed=0):
    x = np.random.default_rng(seed).normal(size=(batch, length, WIDTH)).astype("float32")
    if keras.backend.backend() == "torch":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.from_numpy(x).to(device=device, dtype=getattr(torch, dtype))
    return keras.ops.convert_to_tensor(x, dtype=dtype)


def finished(output):
    """Wait for `output`'s computation (GPUs run asynchronously)."""
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    else:
        import jax

        jax.block_until_ready(output)


def one_line(error):
    """An exception in one line: its type and its message's first real line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.startswith("Exception encountered when calling")
    ]
    message = lines[0] if lines else ""
    return f"{type(error).__name__}: {message}"[:240]


# PyTorch.


def torch_models(dtype):
    """`{label: (function of x, parameters)}` on PyTorch, for `dtype`'s rows.

    `parameters()` lists the tensors a training step differentiates.
    """
    import torch
    from x_transformers.x_transformers import AlibiPositionalBias
    from x_transformers.x_transformers import Attention
    from x_transformers.x_transformers import RelativePositionBias
    from x_transformers.x_transformers import RotaryEmbedding

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype)
    models = {}

    def weights_of(layer):
        return lambda: [variable.value for variable in layer.trainable_variables]

    for name, causal in SCHEMES.items():
        layer = keras_layer(name, policy_of(dtype))
        models[f"keras-posenc {name}"] = (
            lambda x, layer=layer, causal=causal: layer(x, x, use_causal_mask=causal),
            weights_of(layer),
        )
    keras_plain = plain_keras_layer(policy_of(dtype))
    models["keras MultiHeadAttention"] = (
        lambda x: keras_plain(x, x),
        weights_of(keras_plain),
    )

    def x_transformers(causal, flash=True, options=None, position=None, **arguments):
        attention = Attention(
            dim=WIDTH,
            heads=HEADS,
            dim_head=HEAD_DIM,
            flash=flash,
            causal=causal,
            **(options or {}),
        ).to(device=device, dtype=torch_dtype).eval()
        modules = [attention] + ([position] if position is not None else [])

        def parameters():
            return [p for module in modules for p in module.parameters()]

        return (
            lambda x: attention(x, **{k: v(x) for k, v in arguments.items()}),
            parameters,
        )

    # As a user's `model.to(dtype)` leaves them: every module in the dtype.
    rotary = RotaryEmbedding(HEAD_DIM).to(device=device, dtype=torch_dtype)
    xpos = RotaryEmbedding(HEAD_DIM, use_xpos=True).to(device=device, dtype=torch_dtype)
    alibi = AlibiPositionalBias(heads=HEADS, total_heads=HEADS).to(
        device=device, dtype=torch_dtype
    )
    t5 = RelativePositionBias(scale=HEAD_DIM**0.5, heads=HEADS).to(
        device=device, dtype=torch_dtype
    )
    models["x-transformers plain"] = x_transformers(False)
    models["x-transformers rope"] = x_transformers(
        False, rotary_pos_emb=lambda x: rotary.forward_from_seq_len(x.shape[1])
    )
    models["x-transformers xpos"] = x_transformers(
        True, rotary_pos_emb=lambda x: xpos.forward_from_seq_len(x.shape[1])
    )
    models["x-transformers alibi"] = x_transformers(
        False, position=alibi, rel_pos=lambda x: alibi
    )
    models["x-transformers t5"] = x_transformers(False, position=t5, rel_pos=lambda x: t5)
    # CoPE reads the logits: x-transformers computes them itself there.
    models["x-transformers cope"] = x_transformers(
        True, flash=False, options=dict(use_cope=True, cope_max_pos=COPE_POSITIONS)
    )
    return models


def torch_step(function, parameters, x, training):
    """One call of `function(x)`: under `no_grad`, or with its gradients."""
    import torch

    if training:

        def step():
            output = function(x)
            return torch.autograd.grad(output.sum(), parameters(), allow_unused=True)

    else:

        def step():
            with torch.no_grad():
                return function(x)

    return step


_flex_attention = None


def torch_flex_attention():
    """FlexAttention: compiled once on a GPU; eager on the CPU."""
    global _flex_attention
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if not torch.cuda.is_available():
        return flex_attention
    if _flex_attention is None:
        # One compile per length, dtype, score_mod and grad mode: 16 here,
        # past Dynamo's 8, beyond which it would run FlexAttention eagerly.
        import torch._dynamo

        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), 64))
        _flex_attention = torch.compile(flex_attention, dynamic=False)
    return _flex_attention


def torch_anchors(batch, length, dtype, training):
    """`{label: step}` of the kernels alone on projected heads, and notes."""
    import torch
    import torch.nn.functional as F

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn((batch, HEADS, length, HEAD_DIM), generator=generator)
        .to(device=device, dtype=torch_dtype)
        .requires_grad_(training)
        for _ in range(3)
    )  # (batch, heads, length, head_dim)
    bias = torch.from_numpy(alibi_bias(length)).to(device=device, dtype=torch_dtype)
    slopes = torch.from_numpy(alibi_slopes()).to(device)
    flex = torch_flex_attention()

    def alibi_score(score, b, h, q_index, kv_index):
        return score - slopes[h] * (q_index - kv_index).abs()

    kernels = {
        "SDPA, plain": lambda: F.scaled_dot_product_attention(q, k, v),
        "SDPA, the whole ALiBi bias": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias
        ),
        "FlexAttention, plain": lambda: flex(q, k, v),
        "FlexAttention, ALiBi as a score_mod": lambda: flex(
            q, k, v, score_mod=alibi_score
        ),
    }
    steps = {}
    for label, kernel in kernels.items():
        if training:

            def step(kernel=kernel):
                return torch.autograd.grad(kernel().sum(), (q, k, v))

        else:

            def step(kernel=kernel):
                with torch.no_grad():
                    return kernel()

        steps[label] = step
    notes = []
    if not torch.cuda.is_available():
        notes.append(
            "no GPU: FlexAttention runs eagerly (unfused, not torch.compile'd) on the CPU"
        )
    return steps, notes


# JAX.


def jax_keras_model(layer, causal):
    """`(function(trainable, constants, x), trainable, constants)` of a Keras layer."""
    trainable = [variable.value for variable in layer.trainable_variables]
    frozen = [variable.value for variable in layer.non_trainable_variables]

    def function(trainable, frozen, x):
        return layer.stateless_call(trainable, frozen, x, x, use_causal_mask=causal)[0]

    return function, trainable, frozen


def _rotate_half(x):
    import jax.numpy as jnp

    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-second, first], axis=-1)


def rotary_tables(length, dtype, scaled):
    """RoPE's (and with `scaled`, xPos') cos and sin tables of queries and keys.

    Each `(length, 1, head_dim)`, halves paired (rotate-half), as
    x-transformers' and the package's defaults; xPos scales the queries by
    `scale ** (m / 512)` and the keys by its inverse (Sun et al. 2022).
    """
    positions = np.arange(length, dtype="float32")
    inverse_frequencies = 10000.0 ** (-np.arange(0, HEAD_DIM, 2, dtype="float32") / HEAD_DIM)
    angles = positions[:, None] * inverse_frequencies[None, :]  # (length, pairs)
    angles = np.concatenate([angles, angles], axis=-1)[:, None, :]  # (length, 1, head_dim)
    cos, sin = np.cos(angles), np.sin(angles)
    if scaled:
        scale = (np.arange(0, HEAD_DIM, 2) + 0.4 * HEAD_DIM) / (1.4 * HEAD_DIM)
        power = ((positions - length // 2) / 512.0)[:, None]  # (length, 1)
        query_scale = np.concatenate([scale, scale])[None, :] ** power  # (length, head_dim)
        query_scale = query_scale[:, None, :].astype("float32")
        tables = (cos * query_scale, sin * query_scale, cos / query_scale, sin / query_scale)
    else:
        tables = (cos, sin, cos, sin)
    return tuple(keras.ops.convert_to_tensor(t, dtype=dtype) for t in tables)


def jax_reference(kind, length, dtype, implementation, seed=0):
    """The attention written by hand around `jax.nn.dot_product_attention`.

    Returns `(function(weights, constants, x), weights, constants)`: the
    weights float32, cast to `dtype` in the call as a mixed policy does;
    the constants (RoPE's or xPos' tables, or the whole bias) computed
    beforehand in `dtype`.
    """
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    weights = {
        name: jnp.asarray(rng.normal(size=shape, scale=WIDTH**-0.5).astype("float32"))
        for name, shape in (
            ("query", (WIDTH, HEADS, HEAD_DIM)),
            ("key", (WIDTH, HEADS, HEAD_DIM)),
            ("value", (WIDTH, HEADS, HEAD_DIM)),
            ("output", (HEADS, HEAD_DIM, WIDTH)),
        )
    }
    for name in ("query", "key", "value"):
        weights[f"{name}_bias"] = jnp.zeros((HEADS, HEAD_DIM), "float32")
    weights["output_bias"] = jnp.zeros((WIDTH,), "float32")
    causal = kind.endswith("causal")
    constants = {}
    if kind.startswith("rotary"):
        constants["rotary"] = rotary_tables(length, dtype, scaled=causal)
    elif kind.startswith("bias"):
        constants["bias"] = jnp.asarray(alibi_bias(length), dtype)

    def function(weights, constants, x):
        w = {name: value.astype(dtype) for name, value in weights.items()}
        x = x.astype(dtype)
        q = jnp.einsum("btd,dnh->btnh", x, w["query"]) + w["query_bias"]
        k = jnp.einsum("btd,dnh->btnh", x, w["key"]) + w["key_bias"]
        v = jnp.einsum("btd,dnh->btnh", x, w["value"]) + w["value_bias"]
        if "rotary" in constants:
            q_cos, q_sin, k_cos, k_sin = constants["rotary"]  # (length, 1, head_dim)
            q = q * q_cos + _rotate_half(q) * q_sin
            k = k * k_cos + _rotate_half(k) * k_sin
        attended = jax.nn.dot_product_attention(
            q,
            k,
            v,
            bias=constants.get("bias"),
            is_causal=causal,
            implementation=implementation,
        )  # (batch, length, heads, head_dim)
        return jnp.einsum("btnh,nhd->btd", attended, w["output"]) + w["output_bias"]

    return function, weights, constants


def jax_program(model, x, training):
    """`(jitted, arguments)` of `model` on `x`: its output, or its weights' gradients."""
    import jax
    import jax.numpy as jnp

    function, trainable, constants = model
    if training:
        jitted = jax.jit(
            jax.grad(lambda t, c, x: jnp.sum(function(t, c, x).astype("float32")))
        )
    else:
        jitted = jax.jit(function)
    return jitted, (trainable, constants, x)


def jax_compile(programs):
    """Compile `{label: (jitted, arguments)}`: `(steps, seconds, notes)`.

    Each is traced and lowered in turn (Python), then all are compiled at
    once in threads (XLA's compiler leaves Python's lock). `steps[label]()`
    calls the compiled program on its arguments; `seconds[label]` is its
    lowering and compiling time; a program that fails to lower or compile
    (a refusal, such as cuDNN's) is left out with a note.
    """
    from concurrent.futures import ThreadPoolExecutor

    lowered, seconds, notes = {}, {}, []
    for label, (jitted, arguments) in programs.items():
        if _spent():
            notes.append(f"{label}: not measured, the budget is spent")
            continue
        start = time.perf_counter()
        try:
            lowered[label] = jitted.lower(*arguments)
        except Exception as error:  # A refusal: one line, not a crash.
            notes.append(f"{label}: not measured, {one_line(error)}")
            continue
        seconds[label] = time.perf_counter() - start

    def compile_one(lowering):
        start = time.perf_counter()
        return lowering.compile(), time.perf_counter() - start

    steps = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {label: pool.submit(compile_one, low) for label, low in lowered.items()}
        for label, future in futures.items():
            try:
                compiled, compile_seconds = future.result()
            except Exception as error:
                notes.append(f"{label}: not measured, {one_line(error)}")
                del seconds[label]
                continue
            seconds[label] += compile_seconds
            arguments = programs[label][1]
            steps[label] = lambda compiled=compiled, arguments=arguments: compiled(*arguments)
    return steps, seconds, notes


def jax_implementation(dtype):
    """The reference's `dot_product_attention` implementation, and a note."""
    if dtype == "float32":
        return "xla", None
    if on_gpu():
        return "cudnn", None
    return "xla", "no GPU: the references run XLA's attention, not cuDNN's"


def jax_models(batch, length, dtype):
    """`{label: model}` on JAX for `dtype`'s rows, and notes."""
    models = {}
    for name, causal in SCHEMES.items():
        layer = keras_layer(name, policy_of(dtype), batch=batch)
        models[f"keras-posenc {name}"] = jax_keras_model(layer, causal)
    models["keras MultiHeadAttention"] = jax_keras_model(
        plain_keras_layer(policy_of(dtype), batch=batch), False
    )
    implementation, note = jax_implementation(dtype)
    for kind in dict.fromkeys(kind for kind, _ in JAX_TARGETS.values()):
        models[f"jax {kind}"] = jax_reference(kind, length, dtype, implementation)
    return models, [note] if note else []


def jax_anchors(batch, length, dtype, training):
    """`{label: step}` of `dot_product_attention` alone on projected heads, and notes."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    q, k, v = (
        jnp.asarray(rng.normal(size=(batch, length, HEADS, HEAD_DIM)), dtype)
        for _ in range(3)
    )  # (batch, length, heads, head_dim)
    bias = jnp.asarray(alibi_bias(length), dtype)  # (1, heads, length, length)
    implementations = ["xla"]
    notes = []
    if dtype != "bfloat16":
        notes.append("cuDNN: run in bfloat16 only")
    elif not on_gpu():
        notes.append("cuDNN: unmeasured, no GPU")
    else:
        implementations.append("cudnn")
    programs = {}
    for implementation in implementations:
        for label, with_bias in (("plain", False), ("ALiBi bias", True)):

            def attention(q, k, v, bias, implementation=implementation, with_bias=with_bias):
                return jax.nn.dot_product_attention(
                    q, k, v, bias=bias if with_bias else None, implementation=implementation
                )

            if training:
                jitted = jax.jit(
                    jax.grad(
                        lambda q, k, v, bias, attention=attention: jnp.sum(
                            attention(q, k, v, bias).astype("float32")
                        ),
                        argnums=(0, 1, 2),
                    )
                )
            else:
                jitted = jax.jit(attention)
            name = {"xla": "XLA", "cudnn": "cuDNN"}[implementation]
            programs[f"dot_product_attention, {name}, {label}"] = (jitted, (q, k, v, bias))
    steps, setup, refusals = jax_compile(programs)
    return steps, notes + refusals, setup


# Timing.


def paired_rounds(steps, rounds, setup=None):
    """Time `{label: step}`: `(seconds per round, first call's seconds, notes)`.

    Each step's first call is timed alone (it traces, compiles, autotunes;
    with `setup[label]`, seconds spent compiling it beforehand, added), a
    second is not timed; a step whose warm-up raises is left out with a
    note. Then `rounds` rounds call each step once, in the list's order and
    in reverse by turns.
    """
    setup = setup or {}
    first, notes = {}, []
    for label, step in list(steps.items()):
        if _spent():
            notes.append(f"{label}: not measured, the budget is spent")
            del steps[label]
            continue
        try:
            start = time.perf_counter()
            finished(step())
            first[label] = time.perf_counter() - start + setup.get(label, 0.0)
            finished(step())
        except Exception as error:  # A refusal or a failure: one line, not a crash.
            notes.append(f"{label}: not measured, {one_line(error)}")
            del steps[label]
            _release_memory()
    order = list(steps)
    times = {label: [] for label in order}
    for index in range(rounds):
        for label in order if index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            finished(steps[label]())
            times[label].append(time.perf_counter() - start)
    return times, first, notes


def ratio(times, label, baseline):
    return statistics.median(a / b for a, b in zip(times[label], times[baseline]))


def _ms(times, label):
    return f"{1e3 * statistics.median(times[label]):.2f}"


def _release_memory():
    gc.collect()
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _mode_name(training):
    return "training step" if training else "forward"


# Sections: each prints its own table.


def comparison_section(batch, length, dtype, training, rounds):
    """Every scheme against its baseline, in one `dtype` and mode."""
    backend = keras.backend.backend()
    x = inputs_for(batch, length, dtype)
    notes, setup = [], {}
    if backend == "torch":
        models = torch_models(dtype)
        steps = {
            label: torch_step(function, parameters, x, training)
            for label, (function, parameters) in models.items()
        }
        targets = {
            name: (f"x-transformers {baseline}", target)
            for name, (baseline, target) in TORCH_TARGETS.items()
        }
        plain = "x-transformers plain"
    else:
        models, notes = jax_models(batch, length, dtype)
        steps, setup, refusals = jax_compile(
            {label: jax_program(model, x, training) for label, model in models.items()}
        )
        notes += refusals
        targets = {
            name: (f"jax {kind}", target) for name, (kind, target) in JAX_TARGETS.items()
        }
        plain = "jax plain"
    times, first, failures = paired_rounds(steps, rounds, setup)
    lines = [
        "| scheme | baseline | keras-posenc ms | baseline ms | ratio | target | met "
        "| first call s (keras-posenc / baseline) |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for name, (baseline, target) in targets.items():
        label = f"keras-posenc {name}"
        if label not in times or baseline not in times:
            lines.append(f"| {name} | {baseline} | | | unmeasured | | | |")
            continue
        value = ratio(times, label, baseline)
        judged = "" if target is None else ("yes" if value <= target else "no")
        lines.append(
            f"| {name} | {baseline} | {_ms(times, label)} | {_ms(times, baseline)} | "
            f"{value:.2f}x | {'' if target is None else f'≤ {target:.2f}x'} | {judged} | "
            f"{first[label]:.2f} / {first[baseline]:.2f} |"
        )
    other = "keras MultiHeadAttention"
    if other in times and plain in times:
        lines.append("")
        lines.append(
            f"Keras' own MultiHeadAttention: {_ms(times, other)} ms, "
            f"{ratio(times, other, plain):.2f}x {plain} (first call {first[other]:.2f} s)."
        )
    return lines, notes + failures


def anchors_section(batch, length, dtype, training, rounds):
    """The kernels alone, on projected heads `(batch, 8, length, 64)`."""
    if keras.backend.backend() == "torch":
        steps, notes = torch_anchors(batch, length, dtype, training)
        setup = {}
    else:
        steps, notes, setup = jax_anchors(batch, length, dtype, training)
    with warnings.catch_warnings():
        # Eager FlexAttention on the CPU says that it is unfused: the note says so.
        warnings.filterwarnings("ignore", message=".*flex_attention.*")
        times, first, failures = paired_rounds(steps, rounds, setup)
    baseline = next(iter(times), None)
    lines = [
        f"| kernel | ms | / {baseline} | first call s (compile) |",
        "|---|---:|---:|---:|",
    ]
    for label in times:
        lines.append(
            f"| {label} | {_ms(times, label)} | {ratio(times, label, baseline):.2f}x | "
            f"{first[label]:.2f} |"
        )
    return lines, notes + failures


def flash_section(batch, length, training, rounds):
    """RoPE with `flash_attention=True` against Keras' flash attention, bfloat16."""
    backend = keras.backend.backend()
    x = inputs_for(batch, length, "bfloat16")
    policy = policy_of("bfloat16")
    layers = {
        "keras-posenc rope, flash": keras_layer("rope", policy, True, batch),
        "keras MultiHeadAttention, flash": plain_keras_layer(policy, True, batch),
    }
    setup, refusals = {}, []
    if backend == "torch":
        steps = {
            label: torch_step(
                lambda x, layer=layer: layer(x, x, use_causal_mask=True),
                lambda layer=layer: [v.value for v in layer.trainable_variables],
                x,
                training,
            )
            for label, layer in layers.items()
        }
    else:
        steps, setup, refusals = jax_compile({
            label: jax_program(jax_keras_model(layer, True), x, training)
            for label, layer in layers.items()
        })
    times, first, notes = paired_rounds(steps, rounds, setup)
    notes = refusals + notes
    lines = ["| candidate | ms | first call s |", "|---|---:|---:|"]
    for label in times:
        lines.append(f"| {label} | {_ms(times, label)} | {first[label]:.2f} |")
    if len(times) == 2:
        value = ratio(times, *layers)
        target = ""
        if backend == "jax":
            met = "met" if value <= JAX_FLASH_TARGET else "missed"
            target = f" (target ≤ {JAX_FLASH_TARGET:.2f}x: {met})"
        lines.append("")
        lines.append(
            f"RoPE with flash_attention=True takes {value:.2f}x Keras' own flash "
            f"attention{target}."
        )
    return lines, notes


def memory_section(length):
    """The peak of one forward call at `(1, length)`, float32, per candidate."""
    backend = keras.backend.backend()
    notes = []
    if backend == "torch":
        import torch

        # x-transformers' bias schemes and CoPE write `(heads, length,
        # length)` tensors: tens of GiB at these lengths, for which on the
        # CPU Linux's out-of-memory killer would end the whole run.
        models = {
            label: model
            for label, model in torch_models("float32").items()
            if not label.startswith("x-transformers ")
        }
        peaks = {}
        for label, (function, _) in models.items():
            try:
                peaks[label] = torch_peak_mib(label, function, length)
            except Exception as error:  # Out of memory on the GPU: a line.
                notes.append(f"{label}: not measured, {one_line(error)}")
            _release_memory()
        if torch.cuda.is_available():
            how = "torch.cuda.max_memory_allocated above what was allocated before the call"
        elif _can_reset_high_water_mark():
            how = "growth of the process's resident high-water mark, reset before each call"
        else:
            how = "growth of the resident high-water mark of a fresh process per call"
    else:
        import jax

        x = inputs_for(1, length)
        models = {
            f"keras-posenc {name}": jax_keras_model(keras_layer(name), causal)
            for name, causal in SCHEMES.items()
        }
        models["keras MultiHeadAttention"] = jax_keras_model(plain_keras_layer(), False)
        programs = {
            label: (jax.jit(function), (trainable, constants, x))
            for label, (function, trainable, constants) in models.items()
        }
        peaks, notes = jax_peaks_mib(programs)
        how = "the compiled call's memory_analysis(), temporary buffers and output"
    lines = [
        f"| candidate | MiB at (1, {length}) | target | met |",
        "|---|---:|---:|---|",
    ]
    for label, mib in peaks.items():
        judged = label.startswith("keras-posenc ")
        target = f"≤ {MEMORY_TARGET_MIB}" if judged else ""
        met = ("yes" if mib <= MEMORY_TARGET_MIB else "no") if judged else ""
        lines.append(f"| {label} | {mib:.0f} | {target} | {met} |")
    notes.append(f"memory: {how}")
    return lines, notes


def torch_peak_mib(label, function, length):
    """The memory one forward call of `function` needs at `(1, length)`, in MiB."""
    import torch

    if not torch.cuda.is_available():
        if not _can_reset_high_water_mark():
            return _cpu_peak_in_a_fresh_process(label, 1, length)
        return _cpu_peak_mib(function, length)
    with torch.no_grad():
        finished(function(inputs_for(1, 256)))  # Workspaces and caches first.
        x = inputs_for(1, length)
        finished(x)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        finished(function(x))
        return (torch.cuda.max_memory_allocated() - before) / 2**20


def jax_peaks_mib(programs):
    """`({label: MiB}, notes)`: each compiled program's temporary buffers and output."""
    from concurrent.futures import ThreadPoolExecutor

    lowered, notes = {}, []
    for label, (jitted, arguments) in programs.items():
        try:
            lowered[label] = jitted.lower(*arguments)
        except Exception as error:
            notes.append(f"{label}: not measured, {one_line(error)}")
    peaks = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {label: pool.submit(low.compile) for label, low in lowered.items()}
        for label, future in futures.items():
            try:
                analysis = future.result().memory_analysis()
            except Exception as error:
                notes.append(f"{label}: not measured, {one_line(error)}")
                continue
            peaks[label] = (
                analysis.temp_size_in_bytes + analysis.output_size_in_bytes
            ) / 2**20
    return peaks, notes


def _status_mib(field):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_high_water_mark():
    """Free what can be freed, and reset `VmHWM` to the resident size (Linux)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _can_reset_high_water_mark():
    try:
        _reset_high_water_mark()
    except OSError:
        return False
    return True


def _cpu_peak_mib(function, length):
    """The growth of the resident high-water mark over one call, in MiB."""
    import torch

    with torch.no_grad():
        function(inputs_for(1, 8))
        x = inputs_for(1, length)
        _reset_high_water_mark()
        before = _status_mib("VmRSS")
        function(x)
        return _status_mib("VmHWM") - before


def _cpu_peak_in_a_fresh_process(label, batch, length):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_posenc_lab.bench.backends",
            "--one-peak",
            label,
            "--memory-length",
            str(length),
            "--memory-batch",
            str(batch),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    if result.returncode:
        return float("nan")
    return float(result.stdout.strip().splitlines()[-1])


def _one_cpu_peak(label, batch, length):
    """In a fresh process: the growth of `VmHWM` over one call of `label`."""
    import torch

    function, _ = torch_models("float32")[label]
    with torch.no_grad():
        function(inputs_for(batch, 8))
        x = inputs_for(batch, length)
        before = _status_mib("VmHWM")
        function(x)
    print(_status_mib("VmHWM") - before)


# Equality.


def equality_cases():
    """`[(label, make the layer, call arguments as NumPy, length)]`.

    Every attention scheme of the lab's tasks, as the tasks build it:
    the language task's, causal and not (xPos and CoPE causal only); the
    vision task's on an 8 x 8 grid after a class token; the graph task's
    on an adjacency.
    """
    cases = []
    for name, encoding in encodings.LANGUAGE.items():
        if encoding.role not in ("none", "attention"):
            continue
        layer = encoding.layer
        causal_only = layer in ("XPosEmbedding", "ContextualPosition")
        for causal in (True,) if causal_only else (False, True):
            cases.append((
                f"{'plain' if layer is None else name}{', causal' if causal else ''}",
                lambda name=name: encodings.build("language", name, num_heads=HEADS),
                {"use_causal_mask": causal},
                EQUALITY_LENGTH,
            ))
    for name, encoding in encodings.VISION.items():
        if encoding.role != "attention":
            continue
        axes = encoding.arguments.get("num_axes", 2)
        grid = EQUALITY_GRID if axes == 2 else (1, *EQUALITY_GRID)
        positions = np.stack(
            np.meshgrid(*(np.arange(size) for size in grid), indexing="ij"), axis=-1
        ).reshape(-1, axes).astype("int32")  # (cells, axes), row-major
        # M-RoPE's sections, given for the task's heads, scaled to 32 pairs.
        sections = encoding.arguments.get("axis_sections")
        overrides = {}
        if sections is not None:
            overrides["axis_sections"] = [
                size * HEAD_DIM // 2 // sum(sections) for size in sections
            ]
        cases.append((
            f"vision {name}",
            lambda name=name, overrides=overrides: encodings.build(
                "vision", name, num_heads=HEADS, grid_shape=EQUALITY_GRID, **overrides
            ),
            {"query_positions": positions, "key_positions": positions},
            1 + math.prod(EQUALITY_GRID),
        ))
    rng = np.random.default_rng(0)
    edges = rng.random((EQUALITY_BATCH, EQUALITY_NODES, EQUALITY_NODES)) < 0.15
    adjacency = np.logical_or(edges, np.swapaxes(edges, 1, 2))
    ring = np.roll(np.eye(EQUALITY_NODES, dtype=bool), 1, axis=1)
    adjacency = np.logical_or(adjacency, np.logical_or(ring, ring.T))
    adjacency[:, np.arange(EQUALITY_NODES), np.arange(EQUALITY_NODES)] = False
    for name, encoding in encodings.GRAPH.items():
        if encoding.role != "attention":
            continue
        cases.append((
            f"graph {name}",
            lambda name=name: encodings.build("graph", name, num_heads=HEADS),
            {"adjacency": adjacency.astype("float32")},
            EQUALITY_NODES,
        ))
    return cases


def _attention_of(make):
    return keras_posenc.PositionalMultiHeadAttention(HEADS, HEAD_DIM, position=make())


def _arguments_on_device(arguments):
    return {
        key: keras.ops.convert_to_tensor(value) if isinstance(value, np.ndarray) else value
        for key, value in arguments.items()
    }


def torch_difference(make, arguments, length):
    """The largest difference of one layer's output on the device and on the CPU."""
    x = np.random.default_rng(1).normal(size=(EQUALITY_BATCH, length, WIDTH)).astype("float32")
    layer = _attention_of(make)
    on_device = keras.ops.convert_to_tensor(x)
    output = keras.ops.convert_to_numpy(
        layer(on_device, on_device, **_arguments_on_device(arguments))
    )
    with keras.device("cpu"):
        twin = _attention_of(make)
        on_cpu = keras.ops.convert_to_tensor(x)
        cpu_arguments = _arguments_on_device(arguments)
        twin(on_cpu, on_cpu, **cpu_arguments)
        twin.set_weights(layer.get_weights())
        reference = keras.ops.convert_to_numpy(twin(on_cpu, on_cpu, **cpu_arguments))
    return float(np.max(np.abs(output - reference)))


def torch_differences(cases):
    """`{label: difference, or the error's line}` of every case, one by one."""
    differences = {}
    for label, make, arguments, length in cases:
        try:
            differences[label] = torch_difference(make, arguments, length)
        except Exception as error:
            differences[label] = one_line(error)
        _release_memory()
    return differences


def jax_differences(cases):
    """The same on JAX: each case jitted on the default device and on the CPU.

    Every program is traced first, then all are compiled at once.
    """
    import jax

    cpu = jax.devices("cpu")[0]
    programs = {}
    for label, make, arguments, length in cases:
        x = np.random.default_rng(1).normal(
            size=(EQUALITY_BATCH, length, WIDTH)
        ).astype("float32")
        layer = _attention_of(make)
        layer.build((EQUALITY_BATCH, None, WIDTH), (EQUALITY_BATCH, None, WIDTH))
        causal = arguments.get("use_causal_mask", False)
        tensors = {key: value for key, value in arguments.items() if key != "use_causal_mask"}
        trainable = [variable.value for variable in layer.trainable_variables]
        frozen = [variable.value for variable in layer.non_trainable_variables]

        def call(trainable, frozen, x, tensors, layer=layer, causal=causal):
            return layer.stateless_call(
                trainable, frozen, x, x, use_causal_mask=causal, **tensors
            )[0]

        on_device = (trainable, frozen, x, tensors)
        programs[f"{label} on the device"] = (jax.jit(call), on_device)
        if on_gpu():
            programs[f"{label} on the CPU"] = (
                jax.jit(call),
                jax.device_put(on_device, cpu),
            )
    steps, _, notes = jax_compile(programs)
    if not on_gpu():
        # The CPU is the device: its one program stands for both.
        steps.update({
            label.replace("on the device", "on the CPU"): step
            for label, step in list(steps.items())
        })
    differences = {}
    for label, *_ in cases:
        device, host = f"{label} on the device", f"{label} on the CPU"
        if device not in steps or host not in steps:
            differences[label] = "; ".join(
                note for note in notes if note.startswith(f"{label} on the ")
            )
            continue
        try:
            output = np.asarray(steps[device]())
            reference = np.asarray(steps[host]())
        except Exception as error:
            differences[label] = one_line(error)
            continue
        differences[label] = float(np.max(np.abs(output - reference)))
    return differences


def equality_section():
    """Every scheme's layer on the device against the same on the CPU."""
    backend = keras.backend.backend()
    tolerance = TOLERANCE[backend]
    cases = equality_cases()
    if backend == "torch":
        differences = torch_differences(cases)
    else:
        differences = jax_differences(cases)
    lines = [
        "| case | max abs difference | tolerance | result |",
        "|---|---:|---:|---|",
    ]
    failed = False
    notes = []
    if not on_gpu():
        notes.append("no GPU: the CPU against itself, a check of the path only")
    for label, value in differences.items():
        if isinstance(value, str):
            lines.append(f"| {label} | | {tolerance:g} | FAIL |")
            notes.append(f"{label}: {value}")
            failed = True
            continue
        ok = value <= tolerance  # NaN fails.
        failed = failed or not ok
        lines.append(
            f"| {label} | {value:.2e} | {tolerance:g} | {'OK' if ok else 'FAIL'} |"
        )
    return lines, notes, failed


# The run.


def sections_of(args):
    """`[(title, run)]` in the order they run.

    Equality first, then memory, the comparisons (every length, dtype and
    mode), the flash rows, and last the kernels alone, whose compiles
    (FlexAttention's) are the longest: past the budget, the last are left.
    """
    sections = []
    if args.equality:
        sections.append((
            f"GPU against CPU, float32, ({EQUALITY_BATCH}, {EQUALITY_LENGTH}, {WIDTH})",
            equality_section,
        ))
    if args.memory:
        sections.append((
            f"Memory of one forward call at (1, {args.memory_length}), float32",
            lambda: memory_section(args.memory_length),
        ))
    configurations = [
        (length, dtype, mode == "training")
        for length in args.length
        for dtype in args.dtype
        for mode in args.mode
    ]
    for length, dtype, training in configurations:
        sections.append((
            f"({args.batch}, {length}, {WIDTH}), {dtype}, {_mode_name(training)}",
            lambda length=length, dtype=dtype, training=training: comparison_section(
                args.batch, length, dtype, training, args.rounds
            ),
        ))
    if args.flash:
        for length, training in dict.fromkeys(
            (length, training) for length, _, training in configurations
        ):
            sections.append((
                f"Flash, ({args.batch}, {length}, {WIDTH}), bfloat16, causal, "
                f"{_mode_name(training)}",
                lambda length=length, training=training: flash_section(
                    args.batch, length, training, args.rounds
                ),
            ))
    if args.anchors:
        for length, dtype, training in configurations:
            sections.append((
                f"Anchors on projected heads ({args.batch}, {HEADS}, {length}, "
                f"{HEAD_DIM}), {dtype}, {_mode_name(training)}",
                lambda length=length, dtype=dtype, training=training: anchors_section(
                    args.batch, length, dtype, training, args.rounds
                ),
            ))
    return sections


# When the budget is spent (`time.perf_counter()`), or None: sections and
# candidates not yet started are left.
_deadline = None


def _spent():
    return _deadline is not None and time.perf_counter() > _deadline


def run_sections(sections, budget):
    """Print each section's table; returns whether an equality row failed."""
    global _deadline
    start = time.perf_counter()
    _deadline = None if budget is None else start + budget
    failed = False
    for title, run in sections:
        print(f"\n### {title}\n", flush=True)
        elapsed = time.perf_counter() - start
        if _spent():
            print(f"- skipped: the budget of {budget:.0f} s is spent ({elapsed:.0f} s)", flush=True)
            continue
        section_start = time.perf_counter()
        try:
            result = run()
        except Exception as error:  # One section's failure leaves the others to run.
            print(f"- failed: {one_line(error)}", flush=True)
            failed = failed or run is equality_section
            _release_memory()
            continue
        lines, notes = result[:2]
        if len(result) == 3:
            failed = failed or result[2]
        print("\n".join(lines))
        for note in notes:
            print(f"- {note}")
        print(f"- section: {time.perf_counter() - section_start:.1f} s", flush=True)
        _release_memory()
    _deadline = None
    return failed


def main(argv=None):
    """Run the benchmark; returns 1 when an equality row failed, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, nargs="+", default=[1024])
    parser.add_argument(
        "--dtype", nargs="+", choices=("float32", "bfloat16"), default=["float32"]
    )
    parser.add_argument(
        "--mode", nargs="+", choices=("forward", "training"), default=["forward"]
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--memory", action="store_true", help="measure peaks")
    parser.add_argument("--memory-length", type=int, default=8192)
    parser.add_argument("--memory-batch", type=int, default=1)
    parser.add_argument("--flash", action="store_true", help="add the flash rows")
    parser.add_argument(
        "--anchors", action="store_true", help="add the kernels alone (SDPA, FlexAttention, cuDNN)"
    )
    parser.add_argument(
        "--equality", action="store_true", help="add the GPU against CPU rows"
    )
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds after which the sections left are skipped, each with a line",
    )
    parser.add_argument("--one-peak", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backend = keras.backend.backend()
    if args.one_peak:
        _one_cpu_peak(args.one_peak, args.memory_batch, args.memory_length)
        return 0
    if backend not in ("torch", "jax"):
        raise SystemExit(
            "This benchmark compares fused kernels: run it with "
            "KERAS_BACKEND=torch or KERAS_BACKEND=jax. TensorFlow's is "
            "`python -m keras_posenc_lab.bench.attention`."
        )
    print(
        f"{backend} on {device_name()} ({versions()}): (batch, length, width) = "
        f"({args.batch}, {'/'.join(map(str, args.length))}, {WIDTH}), {HEADS} heads "
        f"of {HEAD_DIM}, {args.rounds} rounds; bfloat16 is Keras' mixed_bfloat16 "
        "policy against the peers in bfloat16",
        flush=True,
    )
    failed = run_sections(sections_of(args), args.budget)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
