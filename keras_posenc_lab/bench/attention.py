"""Benchmark: one self-attention call per position scheme against plain Keras.

The targets, against plain attention on Keras' einsum path (below): one
self-attention call `layer(x, x)` on a `(4, 1024, 512)` float32 input, 8
heads of key_dim 64, no mask, compiled with XLA, takes at most 1.05 times
as long with RoPE (`RotaryEmbedding`) and ALiBi (`AlibiBias`) inside
`PositionalMultiHeadAttention`, 1.10 times with T5 (`RelativePositionBias`),
1.15 times with KERPLE (`KerpleBias`, log form) and FIRE (`FireBias`),
1.25 times with Shaw et al.'s relative representations
(`RelativePositionEmbedding`, clipping distance k = 16), 1.6 times with
Transformer-XL's relative attention (`TransformerXLPosition`, which attends
by blocks of its `query_block` queries), and 1.4 times with DeBERTa-v3's
disentangled attention (`DisentangledPosition`, both terms, its own 2 * 256
rows reaching 512, also by blocks of queries). T5, KERPLE and FIRE are
timed in their bidirectional forms, the call having no mask.

xPos (`XPosEmbedding`) and CoPE (`ContextualPosition`, 64 positions, one
more product of queries and keys for its gates, by blocks of queries) hold
under a causal mask only: they are called with `use_causal_mask=True`, and
their baseline is the same plain attention called with it
(`CAUSAL_BASELINE`), at most 1.05 and 1.6 times its time. The table gives
that baseline's own time against the unmasked one.

At length 2048 one call needs at most 1.0 times the memory with RoPE and
ALiBi, 1.1 times with T5, KERPLE, FIRE and xPos (xPos against the causal
baseline), 1.15 times with Shaw's and 1.2 times with Transformer-XL's and
DeBERTa's; CoPE's memory is reported without a target. One more row, at
length 8192 and batch 1, gives each scheme's memory there, where the
(heads, 8192, 8192) float32 logits, 2 GiB, take most of it.

Time: all candidates are built, then compiled with XLA and called in one
process, in rounds that call each once in a new order; each ratio is the
median over rounds of the two calls' times in that round. A second copy of
the baseline measures how far two identical programs time apart.

Plain `keras.layers.MultiHeadAttention`, as a user calls it (no dropout, no
attention scores asked for), hands the projected heads to
`keras.ops.dot_product_attention`, which on TensorFlow is no fused kernel
but the same einsum, softmax, einsum, with the scale applied to the
`(batch, heads, query, key)` logits rather than to the queries: on XLA's
CPU backend that costs a second logits-sized buffer and a pass over it.
Asking for the scores takes Keras' other path, its einsum path (queries
scaled first), the fastest plain attention here and the one the position
schemes build on; the baseline asks for them and drops them, so that XLA
computes the output alone. The "/ plain" column keeps the ratio against
the `dot_product_attention` path.

The backend is the one `KERAS_BACKEND` names (TensorFlow by default): on
JAX the candidates are compiled by `jax.jit` and the baseline is the same
plain `MultiHeadAttention` on JAX; on PyTorch they run eagerly, and only
the times are measured (`compiled`). On JAX's CPU (jaxlib 0.10.2) XLA runs
the baseline's logits, softmax and product with the values as one kernel
that writes no logits, so its peak at 2048 is the projections' buffers
(64 MiB), and a scheme meets its memory target only where XLA takes its
work into that kernel too (`keras_posenc.ops._backend.fuses_attention`),
or where its tensors are those of a block of queries
(the schemes' `fused_query_block`).

Memory: each candidate's call is compiled with XLA for the CPU, as it is
timed, and its peak is the memory XLA's buffer assignment gives that one
module: on TensorFlow `experimental_get_compiler_ir(inputs)` of the
`tf.function` returns, at stage `"optimized_hlo_proto_serialized"`, an
`HloProto` that holds it; on JAX the compiled program's
`memory_analysis()` gives its temporary and output bytes.
Counted are the block of temporary buffers, which XLA's heap simulation of
the schedule sizes to the most that is live at once, the output, and the
constants folded into the program (index tables, at short lengths). Left
out are the parameters, the input and the weights: they exist before and
after the call, and differ between candidates by a few KiB of tables. The
call is compiled, not run, so measuring a long length allocates none of it;
the allocations are those of the timed call, one for one (an
`XLA_FLAGS=--xla_dump_to` dump of it shows the same), and only the scratch
that kernels take for themselves, such as a matrix product's packing
blocks, is not in them. The operating system's peak (`VmHWM`) cannot tell
this: TensorFlow keeps a compiled call's buffers from its first call, so a
second call reads about 8 MiB whatever the candidate, and the first one
mixes in the compiler's memory. The targets are judged on the peaks in
whole MiB, as the table prints them: ALiBi's slopes, 64 bytes of
constants, are not a miss.

Run from the repository root:

    python -m keras_posenc_lab.bench.attention [--length 1024] [--repeats 30] [--no-memory]
        [--long-memory-length 8192]
"""

import functools
import statistics
import sys

import keras

import keras_posenc
from keras_posenc_lab import encodings
from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import timing

BATCH = 4
LENGTH = 1024
HEADS = 8
KEY_DIM = 64
MEMORY_LENGTH = 2048
# The long row: batch 1 at this length, memory only.
LONG_MEMORY_LENGTH = 8192
# A clipping distance from Shaw et al.'s ablation, which found no gain past
# k = 2; the cost hardly depends on it, the tables having 2k + 1 rows.
SCHEMES = (
    "rope",
    "alibi",
    "t5",
    "shaw",
    "transformer_xl",
    "deberta",
    "kerple",
    "fire",
    "xpos",
    "cope",
)
# The schemes that hold under a causal mask only, timed with one.
CAUSAL_SCHEMES = ("xpos", "cope")
# The baseline: plain attention on Keras' einsum path.
BASELINE = "plain_einsum_path"
# The baseline of the schemes that need the causal mask: the same plain
# attention, called with `use_causal_mask=True`.
CAUSAL_BASELINE = "plain_einsum_path_causal"
# The most each scheme's time may be, over the baseline's.
TARGETS = {
    "rope": 1.05,
    "alibi": 1.05,
    "t5": 1.10,
    "shaw": 1.25,
    "transformer_xl": 1.6,
    "deberta": 1.4,
    "kerple": 1.15,
    "fire": 1.15,
    "xpos": 1.05,
    "cope": 1.6,
}
# The most each scheme's peak memory may be, over the baseline's (CoPE has
# no target: its table is read per query and key, a block's at a time).
MEMORY_TARGETS = {
    "rope": 1.0,
    "alibi": 1.0,
    "t5": 1.1,
    "shaw": 1.15,
    "transformer_xl": 1.2,
    "deberta": 1.2,
    "kerple": 1.1,
    "fire": 1.1,
    "xpos": 1.1,
}
# Arguments that replace the language task's registry here: T5's buckets
# bidirectional, the attention timed being not causal; DeBERTa-v3's own
# table, 2 * 256 rows reaching 512 (the registry's, 2 * 32, are sized to
# the language task's short sequences).
BENCH_ARGUMENTS = {
    "t5": {"bidirectional": True},
    "deberta": {"position_buckets": 256, "max_relative_positions": 512},
    "kerple": {"bidirectional": True},
    "fire": {"bidirectional": True},
}
# The candidates whose peak memory is measured: all but the noise copy.
MEMORY_CANDIDATES = (BASELINE, "plain", CAUSAL_BASELINE) + SCHEMES
SHAW_MAX_RELATIVE_POSITION = encodings.LANGUAGE["shaw"].arguments[
    "max_relative_position"
]
LABELS = {
    "plain": "plain, `dot_product_attention` path",
    "plain_einsum_path": "plain `MultiHeadAttention`, Keras' einsum path",
    "plain_einsum_path_causal": "plain, einsum path, causal mask (baseline of the causal rows)",
    "rope": "RoPE (`RotaryEmbedding`)",
    "alibi": "ALiBi (`AlibiBias`)",
    "t5": "T5 (`RelativePositionBias`)",
    "shaw": f"Shaw, k = {SHAW_MAX_RELATIVE_POSITION} (`RelativePositionEmbedding`)",
    "transformer_xl": "Transformer-XL (`TransformerXLPosition`)",
    "deberta": "DeBERTa-v3 (`DisentangledPosition`)",
    "kerple": "KERPLE, log (`KerpleBias`)",
    "fire": "FIRE (`FireBias`)",
    "xpos": "xPos, causal (`XPosEmbedding`)",
    "cope": "CoPE, 64 positions, causal (`ContextualPosition`)",
}


def baseline_of(name):
    """The baseline of candidate `name`: with the causal mask where it needs one."""
    return CAUSAL_BASELINE if name in CAUSAL_SCHEMES else BASELINE


def position_layer(scheme, heads):
    """The position layer of `scheme`, one of `SCHEMES`, for `heads` heads.

    The language task's schemes, with `BENCH_ARGUMENTS` in place of the
    registry's.
    """
    return encodings.build(
        "language", scheme, num_heads=heads, **BENCH_ARGUMENTS.get(scheme, {})
    )


def _candidate(name, heads, key_dim):
    """A built layer of candidate `name` and its self-attention call.

    Args:
        name: str. `"plain"`, `"plain_einsum_path"`,
            `"plain_einsum_path_again"` or one of `SCHEMES`.
        heads: int. Number of attention heads.
        key_dim: int. Size of each head.

    Returns:
        A function of the input `(batch, length, heads * key_dim)` that
        returns the attention output.
    """
    einsum_path = ("plain_einsum_path", "plain_einsum_path_again", CAUSAL_BASELINE)
    if name == "plain" or name in einsum_path:
        layer = keras.layers.MultiHeadAttention(heads, key_dim)
    else:
        layer = keras_posenc.PositionalMultiHeadAttention(
            heads, key_dim, position=position_layer(name, heads)
        )
    # Built eagerly on a short input, so no weight is made under XLA.
    short = compiled.zeros((1, 2, heads * key_dim))
    causal = name in CAUSAL_SCHEMES or name == CAUSAL_BASELINE
    layer(short, short, use_causal_mask=causal)
    # Partials, not lambdas: `tf.function` counts traces per code object,
    # and would warn of retracing when one lambda's code made every
    # candidate; and on JAX the partial's layer gives the weights to pass.
    if name == CAUSAL_BASELINE:
        return functools.partial(_causal_self_attention_einsum_path, layer)
    if name in einsum_path:
        return functools.partial(_self_attention_einsum_path, layer)
    if causal:
        return functools.partial(_causal_self_attention, layer)
    return functools.partial(_self_attention, layer)


def _self_attention(layer, inputs):
    return layer(inputs, inputs)


def _causal_self_attention(layer, inputs):
    return layer(inputs, inputs, use_causal_mask=True)


def _self_attention_einsum_path(layer, inputs):
    # Asking for the scores takes Keras' einsum path; the scores are dropped,
    # so XLA computes only the output.
    return layer(inputs, inputs, return_attention_scores=True)[0]


def _causal_self_attention_einsum_path(layer, inputs):
    return layer(inputs, inputs, use_causal_mask=True, return_attention_scores=True)[0]


def _inputs(batch, length, heads, key_dim, seed):
    return compiled.normal((batch, length, heads * key_dim), seed)


compiled_bytes = compiled.compiled_bytes


def logits_writes(name, batch, length, heads, key_dim):
    """How many `(batch, heads, length, length)` tensors one call writes.

    Read from the optimized HLO of the call compiled with XLA, as it is
    timed: the instructions of its entry computation (each fusion, matrix
    product or reduction that XLA did not fuse into another) whose result
    has the shape of the logits. Each is one pass over the logits writing
    its result, and reading at least one; the rest of the call is the
    projections, a few passes of (batch, length, heads * key_dim).

    Args:
        name: str. A name of `MEMORY_CANDIDATES`.
        batch, length, heads, key_dim: int. The sizes of the call.

    Returns:
        An int.
    """
    hlo = compiled.optimized_hlo(
        _candidate(name, heads, key_dim), compiled.zeros((batch, length, heads * key_dim))
    )
    return compiled.results_of_size(hlo, batch * heads * length * length)


def measure_peak(name, batch, length, heads, key_dim):
    """Bytes that one compiled call of candidate `name` needs at its peak.

    Args:
        name: str. A name of `MEMORY_CANDIDATES`.
        batch, length, heads, key_dim: int. The sizes of the call.

    Returns:
        The bytes XLA assigns to the call, as `compiled_bytes` counts them.
    """
    return compiled_bytes(
        _candidate(name, heads, key_dim), compiled.zeros((batch, length, heads * key_dim))
    )


def memory_peaks(batch, length, heads, key_dim, names=MEMORY_CANDIDATES):
    """Peak bytes of one call of each candidate.

    Args:
        batch, length, heads, key_dim: int. The sizes of the call.
        names: tuple of str. Candidates of `MEMORY_CANDIDATES`. Defaults to
            all of them.

    Returns:
        A dict of the names to bytes.
    """
    return {
        name: measure_peak(name, batch, length, heads, key_dim)
        for name in names
    }


def run(
    batch=BATCH,
    length=LENGTH,
    heads=HEADS,
    key_dim=KEY_DIM,
    repeats=30,
    warmup=3,
    memory_length=MEMORY_LENGTH,
    long_memory_length=None,
    seed=0,
):
    """Time one self-attention call of each candidate, and its peak memory.

    Args:
        batch: int. Batch size. Defaults to `4`.
        length: int. Sequence length of the timed calls. Defaults to `1024`.
        heads: int. Number of attention heads. Defaults to `8`.
        key_dim: int. Size of each head, even (RoPE pairs features).
            Defaults to `64`.
        repeats: int. Timed rounds. Defaults to `30`.
        warmup: int. Untimed calls of each candidate first. Defaults to `3`.
        memory_length: int or None. Sequence length of the memory
            measurement, or `None` to skip it. Defaults to `2048`.
        long_memory_length: int or None. Sequence length of a second memory
            measurement at batch 1, or `None` to skip it. Defaults to `None`.
        seed: int. Seed of the weights and the input. Defaults to `0`.

    Returns:
        A dict: median seconds of a call under `"plain"`,
        `"plain_einsum_path"` (the baseline), `"plain_einsum_path_again"`
        and each of `SCHEMES`; the median over rounds of each scheme's time
        over the baseline's under `"<scheme>_vs_plain_einsum_path"` and over
        plain's under `"<scheme>_vs_plain"`; `"plain_vs_plain_einsum_path"`;
        the baseline's over its copy's under `"vs_itself"`; how many
        logits-sized tensors each of `MEMORY_CANDIDATES` writes under
        `"<name>_logits_writes"` (`logits_writes`). With
        `memory_length`, also the peak MiB of one call of each of
        `MEMORY_CANDIDATES` under `"<name>_peak_mib"` and its ratio to the
        baseline's under `"<name>_memory_vs_plain_einsum_path"`; with
        `long_memory_length`, the peak MiB there under
        `"<name>_long_peak_mib"` and the MiB of the float32 logits there
        under `"long_logits_mib"`.
    """
    keras.utils.set_random_seed(seed)
    names = (BASELINE, "plain", CAUSAL_BASELINE) + SCHEMES + ("plain_einsum_path_again",)
    # A second, separately compiled copy of the baseline: how far apart two
    # identical programs time on this machine.
    candidates = {name: _candidate(name, heads, key_dim) for name in names}
    inputs = _inputs(batch, length, heads, key_dim, seed)
    seconds = timing.rounds(candidates, (inputs,), repeats, warmup)
    results = {
        name: statistics.median(times) for name, times in seconds.items()
    }
    for name in SCHEMES + (CAUSAL_BASELINE,):
        results[f"{name}_vs_plain_einsum_path"] = timing.paired_ratio(
            seconds, name, BASELINE if name == CAUSAL_BASELINE else baseline_of(name)
        )
        results[f"{name}_vs_plain"] = timing.paired_ratio(seconds, name, "plain")
    results["plain_vs_plain_einsum_path"] = timing.paired_ratio(
        seconds, "plain", BASELINE
    )
    results["vs_itself"] = timing.paired_ratio(
        seconds, BASELINE, "plain_einsum_path_again"
    )
    if not compiled.has_programs():
        # PyTorch runs the calls as they are: no compiled program to read.
        return results
    for name in MEMORY_CANDIDATES:
        results[f"{name}_logits_writes"] = logits_writes(
            name, batch, length, heads, key_dim
        )
    if memory_length is not None:
        peaks = memory_peaks(batch, memory_length, heads, key_dim)
        for name, peak in peaks.items():
            results[f"{name}_peak_mib"] = peak / 2**20
            results[f"{name}_memory_vs_plain_einsum_path"] = peak / peaks[
                BASELINE if name == CAUSAL_BASELINE else baseline_of(name)
            ]
    if long_memory_length is not None:
        peaks = memory_peaks(1, long_memory_length, heads, key_dim)
        for name, peak in peaks.items():
            results[f"{name}_long_peak_mib"] = peak / 2**20
        results["long_logits_mib"] = heads * long_memory_length**2 * 4 / 2**20
    return results


def format_table(results, judged=True):
    """A Markdown table of `run`'s results and whether the targets are met.

    Args:
        results: dict. What `run` returns.
        judged: bool. `False` for a run at sizes too small to mean
            anything (the tiny run): its "met" cells give no verdict.
            Defaults to `True`.

    Returns:
        A str: the table, and with `run`'s long measurement a second one.
    """
    with_memory = f"{BASELINE}_peak_mib" in results
    header = (
        "| scheme | median (ms) | / einsum path | target | met | / plain "
        "| logits writes |"
    )
    rule = "|---|---:|---:|---:|---|---:|---:|"
    if with_memory:
        header += " peak (MiB) | / einsum path | target | met |"
        rule += "---:|---:|---:|---|"
    # Two copies of one program time this far apart here: a ratio past its
    # target by no more than that is not told apart from meeting it.
    noise = timing.noise_band(results["vs_itself"])
    lines = [header, rule]
    for name in (BASELINE,) + SCHEMES + (
        CAUSAL_BASELINE,
        "plain",
        "plain_einsum_path_again",
    ):
        if name == "plain_einsum_path_again":
            lines.append(
                f"| a second copy of the einsum path (noise) | "
                f"{results[name] * 1e3:.1f} | {1 / results['vs_itself']:.3f}x "
                "| | | | |" + (" | | | |" if with_memory else "")
            )
            continue
        cells = [LABELS[name], f"{results[name] * 1e3:.1f}"]
        if name == BASELINE:
            cells += ["", "", "", ""]
        elif name == "plain":
            cells += [f"{results['plain_vs_plain_einsum_path']:.3f}x", "", "", ""]
        elif name == CAUSAL_BASELINE:
            cells += [f"{results[f'{name}_vs_plain_einsum_path']:.3f}x", "", "", ""]
        else:
            ratio = results[f"{name}_vs_plain_einsum_path"]
            target = TARGETS[name]
            cells += [
                f"{ratio:.3f}x",
                f"<= {target:.2f}x",
                timing.verdict(ratio, target, noise, judged=judged),
                f"{results[f'{name}_vs_plain']:.3f}x",
            ]
        cells.append(str(results.get(f"{name}_logits_writes", "")))
        if with_memory:
            cells.append(f"{results[f'{name}_peak_mib']:.0f}")
            if name == BASELINE:
                cells += ["", "", ""]
            elif name == CAUSAL_BASELINE:
                cells += [f"{results[f'{name}_memory_vs_plain_einsum_path']:.2f}x", "", ""]
            else:
                ratio = results[f"{name}_memory_vs_plain_einsum_path"]
                cells.append(f"{ratio:.2f}x")
                if name in MEMORY_TARGETS:
                    target = MEMORY_TARGETS[name]
                    # Judged in whole MiB, as the peak column shows them:
                    # the bytes of a few constants (ALiBi's slopes, T5's
                    # table of 257 rows) are not told apart.
                    whole = round(results[f"{baseline_of(name)}_peak_mib"])
                    if whole:
                        ratio = round(results[f"{name}_peak_mib"]) / whole
                    cells += [
                        f"<= {target:.2f}x",
                        timing.verdict(ratio, target, judged=judged),
                    ]
                else:
                    cells += ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    if "long_logits_mib" in results:
        logits = results["long_logits_mib"]
        baseline = results[f"{BASELINE}_long_peak_mib"]
        lines += [
            "",
            f"| scheme | peak (MiB) | beyond one logits tensor ({logits:.0f} "
            "MiB) | beyond the einsum path |",
            "|---|---:|---:|---:|",
        ]
        for name in MEMORY_CANDIDATES:
            peak = results[f"{name}_long_peak_mib"]
            lines.append(
                f"| {LABELS[name]} | {peak:.0f} | {peak - logits:+.0f} | "
                f"{peak - baseline:+.0f} |"
            )
    return "\n".join(lines)


def main(argv=None):
    """Run the benchmark and print its Markdown table.

    Args:
        argv: list of str or None. The arguments after the program name.
            Defaults to `None`, meaning `sys.argv[1:]`.

    Returns:
        `0`, whether or not the targets are met: timings on a busy machine
        are for a person to read.
    """
    parser = timing.argument_parser(
        "attention",
        (
            "Time one self-attention call under XLA with each position "
            "scheme against plain keras.layers.MultiHeadAttention on Keras' "
            "einsum path, and measure the peak memory of one call at two "
            "longer lengths."
        ),
    )
    parser.add_argument(
        "--batch",
        type=int_at_least(1),
        default=BATCH,
        help=f"batch size (default: {BATCH})",
    )
    parser.add_argument(
        "--length",
        type=int_at_least(1),
        default=LENGTH,
        help=f"sequence length of the timed calls (default: {LENGTH})",
    )
    parser.add_argument(
        "--heads",
        type=int_at_least(1),
        default=HEADS,
        help=f"attention heads (default: {HEADS})",
    )
    parser.add_argument(
        "--key-dim",
        type=int_at_least(2),
        default=KEY_DIM,
        help=f"size of each head, even (default: {KEY_DIM})",
    )
    parser.add_argument(
        "--memory-length",
        type=int_at_least(1),
        default=MEMORY_LENGTH,
        help=f"sequence length of the memory measurement (default: {MEMORY_LENGTH})",
    )
    parser.add_argument(
        "--long-memory-length",
        type=int_at_least(1),
        default=LONG_MEMORY_LENGTH,
        help="sequence length of the second memory measurement, at batch 1 "
        f"(default: {LONG_MEMORY_LENGTH})",
    )
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the memory measurements",
    )
    args = parser.parse_args(argv)
    no_memory = args.no_memory or not compiled.has_programs()
    memory_length = None if no_memory else args.memory_length
    long_memory_length = None if no_memory else args.long_memory_length
    results = run(
        args.batch,
        args.length,
        args.heads,
        args.key_dim,
        args.repeats,
        memory_length=memory_length,
        long_memory_length=long_memory_length,
    )
    width = args.heads * args.key_dim
    print(f"Keras {keras.__version__} on its {compiled.backend()} backend: {compiled.versions()}")
    print(
        f"One self-attention call on a ({args.batch}, {args.length}, {width}) "
        f"float32 input, {args.heads} heads of key_dim {args.key_dim}, no "
        f"mask, {'under XLA' if compiled.has_programs() else 'eager'}: median "
        f"of {args.repeats} rounds, against plain attention on Keras' einsum path"
    )
    if memory_length is not None:
        print(
            f"Peak memory of one call at ({args.batch}, {memory_length}, "
            f"{width}), and below at (1, {long_memory_length}, {width}), as "
            "XLA assigns it: temporary buffers, output and constants"
        )
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
