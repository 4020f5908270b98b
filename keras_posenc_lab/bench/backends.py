"""Benchmark: the attention on each backend's own kernel, against its best.

One self-attention call `layer(x, x)` per scheme, on the backend that
`KERAS_BACKEND` names, against what that backend's users have:

- PyTorch: x-transformers' `Attention(flash=True)` (it calls torch's
  `scaled_dot_product_attention`) with the same scheme: plain, RoPE,
  ALiBi, T5 and xPos (causal, as xPos needs), and CoPE (64 positions,
  causal, on x-transformers' attention that writes the logits, which
  CoPE reads); KERPLE and FIRE, which x-transformers lacks, against its
  ALiBi. Targets: RoPE, ALiBi, T5 and xPos at most 1.10 times; KERPLE
  and FIRE at most 1.15 times its ALiBi; CoPE at most 1.6 times its CoPE.
  Keras' own `MultiHeadAttention` is timed beside them.
- JAX: Keras' own `MultiHeadAttention` on JAX, under `jax.jit` as the
  candidates.

Each candidate holds its own random weights; the shapes are the same:
`(batch, length, 512)` float32 inputs, 8 heads of 64. Time: all candidates
are built and called once, then called in rounds, each round calling every
candidate once in a new order; a ratio is the median over rounds of the
two calls' times in that round (`torch.cuda.synchronize` or
`block_until_ready` inside each call's time).

Memory: the peak of one call at `(1, --memory-length)` where asked
(`--memory`): on a GPU, PyTorch's `max_memory_allocated` above what was
allocated before the call, and JAX's compiled `memory_analysis()` (its
temporary buffers and output); on the CPU, PyTorch's growth of the
process's resident high-water mark (`VmHWM`) over one call, each
candidate in a fresh process, and JAX's compiled `memory_analysis()`.

`--flash` adds the flash rows: RoPE inside `PositionalMultiHeadAttention(
flash_attention=True)` against Keras' `MultiHeadAttention(
flash_attention=True)`, in bfloat16 (the flash kernels' dtype), causal.

    KERAS_BACKEND=torch python -m keras_posenc_lab.bench.backends
    KERAS_BACKEND=jax python -m keras_posenc_lab.bench.backends --memory
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

import keras
import numpy as np

import keras_posenc

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
# Per scheme: the baseline it is judged against on PyTorch, and the target.
TORCH_TARGETS = {
    "rope": ("rope", 1.10),
    "alibi": ("alibi", 1.10),
    "t5": ("t5", 1.10),
    "xpos": ("xpos", 1.10),
    "kerple": ("alibi", 1.15),
    "fire": ("alibi", 1.15),
    "cope": ("cope", 1.6),
}


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


def torch_candidates(flash):
    """`{label: (function of x, causal)}` on PyTorch: this package, Keras, x-transformers."""
    import torch
    from x_transformers.x_transformers import AlibiPositionalBias
    from x_transformers.x_transformers import Attention
    from x_transformers.x_transformers import RelativePositionBias
    from x_transformers.x_transformers import RotaryEmbedding

    device = "cuda" if torch.cuda.is_available() else "cpu"
    candidates = {}
    for name, causal in SCHEMES.items():
        layer = keras_layer(name)
        candidates[f"keras-posenc {name}"] = (
            lambda x, layer=layer, causal=causal: layer(x, x, use_causal_mask=causal),
            causal,
        )
    keras_plain = plain_keras_layer()
    candidates["keras MultiHeadAttention"] = (lambda x: keras_plain(x, x), False)

    def x_transformers(causal, flash=True, options=None, **arguments):
        attention = Attention(
            dim=WIDTH,
            heads=HEADS,
            dim_head=HEAD_DIM,
            flash=flash,
            causal=causal,
            **(options or {}),
        ).to(device).eval()
        return lambda x: attention(x, **{k: v(x) for k, v in arguments.items()})

    rotary = RotaryEmbedding(HEAD_DIM).to(device)
    xpos = RotaryEmbedding(HEAD_DIM, use_xpos=True).to(device)
    alibi = AlibiPositionalBias(heads=HEADS, total_heads=HEADS).to(device)
    t5 = RelativePositionBias(scale=HEAD_DIM**0.5, heads=HEADS).to(device)
    references = {
        "plain": x_transformers(False),
        "rope": x_transformers(
            False, rotary_pos_emb=lambda x: rotary.forward_from_seq_len(x.shape[1])
        ),
        "alibi": x_transformers(False, rel_pos=lambda x: alibi),
        "t5": x_transformers(False, rel_pos=lambda x: t5),
        "xpos": x_transformers(
            True, rotary_pos_emb=lambda x: xpos.forward_from_seq_len(x.shape[1])
        ),
        # CoPE reads the logits: x-transformers computes them itself there.
        "cope": x_transformers(
            True, flash=False, options=dict(use_cope=True, cope_max_pos=COPE_POSITIONS)
        ),
    }
    for name, function in references.items():
        candidates[f"x-transformers {name}"] = (function, SCHEMES[name])
    if flash:
        flash_rope = keras_layer("rope", "bfloat16", flash_attention=True)
        flash_plain = plain_keras_layer("bfloat16", flash_attention=True)
        candidates["keras-posenc rope, flash, bfloat16"] = (
            lambda x: flash_rope(x, x, use_causal_mask=True),
            True,
        )
        candidates["keras MultiHeadAttention, flash, bfloat16"] = (
            lambda x: flash_plain(x, x, use_causal_mask=True),
            True,
        )
    return candidates


def jax_candidates(flash, batch):
    """`{label: (jitted function of x, causal)}` on JAX."""
    import jax

    candidates = {}

    def jitted(layer, causal):
        trainable = [v.value for v in layer.trainable_variables]
        frozen = [v.value for v in layer.non_trainable_variables]
        call = jax.jit(
            lambda x: layer.stateless_call(
                trainable, frozen, x, x, use_causal_mask=causal
            )[0]
        )
        return call

    for name, causal in SCHEMES.items():
        candidates[f"keras-posenc {name}"] = (
            jitted(keras_layer(name, batch=batch), causal),
            causal,
        )
    candidates["keras MultiHeadAttention"] = (
        jitted(plain_keras_layer(batch=batch), False),
        False,
    )
    if flash:
        candidates["keras-posenc rope, flash, bfloat16"] = (
            jitted(keras_layer("rope", "bfloat16", True, batch), True),
            True,
        )
        candidates["keras MultiHeadAttention, flash, bfloat16"] = (
            jitted(plain_keras_layer("bfloat16", True, batch), True),
            True,
        )
    return candidates


def device_name():
    """The device the backend computes on, in words."""
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name()
        return "CPU"
    import jax

    return jax.devices()[0].device_kind


def inputs_for(batch, length):
    x = np.random.default_rng(0).normal(size=(batch, length, WIDTH)).astype("float32")
    if keras.backend.backend() == "torch":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.from_numpy(x).to(device)
    return keras.ops.convert_to_tensor(x)


def finished(output):
    """Wait for `output`'s computation (GPUs run asynchronously)."""
    if keras.backend.backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    else:
        output.block_until_ready()


def time_rounds(candidates, x, rounds):
    """`{label: [seconds per round]}`, each round in a new order."""
    import contextlib

    no_grad = contextlib.nullcontext()
    if keras.backend.backend() == "torch":
        import torch

        no_grad = torch.no_grad()
    times = {label: [] for label in candidates}
    with no_grad:
        for function, _ in candidates.values():
            finished(function(x))
        order = list(candidates)
        for _ in range(rounds):
            random.shuffle(order)
            for label in order:
                start = time.perf_counter()
                finished(candidates[label][0](x))
                times[label].append(time.perf_counter() - start)
    return times


def ratio(times, label, baseline):
    return statistics.median(
        a / b for a, b in zip(times[label], times[baseline])
    )


def peak_mib(candidates, label, batch, length):
    """The memory one call of `label` needs at `(batch, length)`, in MiB."""
    function, _ = candidates[label]
    x = inputs_for(batch, length)
    if keras.backend.backend() == "torch":
        import torch

        if not torch.cuda.is_available():
            return _cpu_peak_in_a_fresh_process(label, batch, length)
        with torch.no_grad():
            finished(function(x))
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            finished(function(x))
            return (torch.cuda.max_memory_allocated() - before) / 2**20
    analysis = function.lower(x).compile().memory_analysis()
    return (analysis.temp_size_in_bytes + analysis.output_size_in_bytes) / 2**20


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


def _resident_high_water_mark_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _one_cpu_peak(label, batch, length):
    """In a fresh process: the growth of `VmHWM` over one call of `label`."""
    import torch

    candidates = torch_candidates(flash=False)
    function, _ = candidates[label]
    with torch.no_grad():
        function(inputs_for(batch, 8))
        x = inputs_for(batch, length)
        before = _resident_high_water_mark_mib()
        function(x)
    print(_resident_high_water_mark_mib() - before)


def table(candidates, times, memory):
    backend = keras.backend.backend()
    lines = []
    if backend == "torch":
        lines.append(
            "| scheme | keras-posenc ms | x-transformers ms | ratio | target |"
            + (" keras-posenc MiB | x-transformers MiB |" if memory else "")
        )
        lines.append("|---|---|---|---|---|" + ("---|---|" if memory else ""))
        for name, (baseline, target) in TORCH_TARGETS.items():
            label = f"keras-posenc {name}"
            reference = f"x-transformers {baseline}"
            value = ratio(times, label, reference)
            met = "met" if value <= target else "missed"
            row = (
                f"| {name}{'' if baseline == name else f' (vs {baseline})'} | "
                f"{1e3 * statistics.median(times[label]):.1f} | "
                f"{1e3 * statistics.median(times[reference]):.1f} | "
                f"{value:.2f}x | {target:.2f}x {met} |"
            )
            if memory:
                row += f" {memory.get(label, float('nan')):.0f} | "
                row += f"{memory.get(reference, float('nan')):.0f} |"
            lines.append(row)
        baseline = "x-transformers plain"
    else:
        lines.append(
            "| scheme | keras-posenc ms | / Keras MultiHeadAttention |"
            + (" MiB |" if memory else "")
        )
        lines.append("|---|---|---|" + ("---|" if memory else ""))
        for name in SCHEMES:
            label = f"keras-posenc {name}"
            row = (
                f"| {name} | {1e3 * statistics.median(times[label]):.1f} | "
                f"{ratio(times, label, 'keras MultiHeadAttention'):.2f}x |"
            )
            if memory:
                row += f" {memory.get(label, float('nan')):.0f} |"
            lines.append(row)
        baseline = "keras MultiHeadAttention"
    lines.append("")
    lines.append("| other | ms | / " + baseline + " |" + (" MiB |" if memory else ""))
    lines.append("|---|---|---|" + ("---|" if memory else ""))
    for label in candidates:
        if label.startswith("keras-posenc ") and "flash" not in label:
            continue
        if label.startswith("x-transformers ") and label != baseline:
            continue
        row = (
            f"| {label} | {1e3 * statistics.median(times[label]):.1f} | "
            f"{ratio(times, label, baseline):.2f}x |"
        )
        if memory:
            row += f" {memory.get(label, float('nan')):.0f} |"
        lines.append(row)
    flash = [label for label in candidates if "flash" in label]
    if len(flash) == 2:
        lines.append("")
        lines.append(
            f"Flash, bfloat16, causal: keras-posenc RoPE takes "
            f"{ratio(times, flash[0], flash[1]):.2f}x Keras' own flash attention."
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--memory", action="store_true", help="measure peaks")
    parser.add_argument("--memory-length", type=int, default=8192)
    parser.add_argument("--memory-batch", type=int, default=1)
    parser.add_argument("--flash", action="store_true", help="add the flash rows")
    parser.add_argument("--one-peak", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    backend = keras.backend.backend()
    if args.one_peak:
        _one_cpu_peak(args.one_peak, args.memory_batch, args.memory_length)
        return
    if backend == "torch":
        candidates = torch_candidates(args.flash)
    elif backend == "jax":
        candidates = jax_candidates(args.flash, args.batch)
    else:
        raise SystemExit(
            "This benchmark compares fused kernels: run it with "
            "KERAS_BACKEND=torch or KERAS_BACKEND=jax. TensorFlow's is "
            "`python -m keras_posenc_lab.bench.attention`."
        )
    times = time_rounds(candidates, inputs_for(args.batch, args.length), args.rounds)
    memory = {}
    if args.memory:
        if backend == "jax":
            candidates = jax_candidates(args.flash, args.memory_batch)
        for label in candidates:
            if "flash" in label:
                continue
            memory[label] = peak_mib(
                candidates, label, args.memory_batch, args.memory_length
            )
    print(
        f"{backend} on {device_name()}, (batch, length, width) = "
        f"({args.batch}, {args.length}, "
        f"{WIDTH}), {args.rounds} rounds"
        + (f"; memory at (1, {args.memory_length})" if memory else "")
    )
    print(table(candidates, times, memory))


if __name__ == "__main__":
    main()
