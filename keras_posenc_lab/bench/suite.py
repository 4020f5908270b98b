"""All the speed and memory benchmarks in one run: `keras-posenc bench`.

Runs, in this one process, `keras_posenc_lab.bench.absolute` (the additive encodings
against keras-hub and the precomputed-table floor),
`keras_posenc_lab.bench.rotary_embedding` (RoPE against keras-hub and its floor) and
`keras_posenc_lab.bench.attention` (one self-attention call per position scheme against
plain `keras.layers.MultiHeadAttention`, and the peak memory of each, Shaw's
included), `keras_posenc_lab.bench.decoding` (cached generation, a token at a
time after a prompt, per scheme against plain attention with the same
cache) and `keras_posenc_lab.bench.grid` (the layers on a grid of patches
against their floors, their 1-D paths and plain attention), and prints a description of the machine followed by each
benchmark's table of ratios, as Markdown. They run on the backend that
`KERAS_BACKEND` names (TensorFlow by default), which the description
states: on TensorFlow and JAX every call is compiled with XLA, on PyTorch
it runs eagerly (`keras_posenc_lab.bench.compiled`); ratios are medians over
rounds of paired calls (see `keras_posenc_lab.bench.timing`).

Peak memory is not timed but read from XLA: `keras_posenc_lab.bench.attention` takes
each candidate's compiled call's buffer assignment (its temporary buffers,
output and constants; not its input and weights), which is exact and the
same from run to run. PyTorch compiles no XLA program: there the memory
columns are left out, and the report says so.

Needs the `bench` extra (keras-hub, the baseline):

    pip install "keras-posenc[bench] @ git+https://github.com/keras-posenc/keras-posenc"
    keras-posenc bench [--out bench.md] [--repeats 30] [--tiny]
"""

import datetime
import os
import platform

import keras
import keras_hub

from keras_posenc_lab.bench import absolute
from keras_posenc_lab.bench import attention
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import decoding
from keras_posenc_lab.bench import grid
from keras_posenc_lab.bench import grouped
from keras_posenc_lab.bench import rotary_embedding

# Sizes of `tiny=True`: enough to run every candidate, too small to time.
TINY_ABSOLUTE = {"shape": (1, 16, 8), "vocabulary_size": 50}
TINY_ROTARY_SHAPE = (1, 16, 2, 8)
TINY_ATTENTION = {"batch": 1, "length": 8, "heads": 2, "key_dim": 4}
TINY_DECODING = {
    "batch": 1,
    "prompt": 8,
    "new_tokens": 4,
    "heads": 2,
    "key_dim": 4,
}
TINY_GROUPED = {
    "batch": 1,
    "length": 8,
    "heads": 2,
    "key_value_heads": 1,
    "key_dim": 4,
    "slots": 8,
}
TINY_MEMORY_LENGTH = 16
TINY_LONG_MEMORY_LENGTH = 32
TINY_GRID = {
    "grid": (4, 4),
    "batch": 1,
    "features": 8,
    "heads": 2,
    "key_dim": 8,
    "attention_batch": 1,
}
TINY_REPEATS = 2
TINY_WARMUP = 1
WARMUP = 3
TINY_NOTE = (
    "**A tiny run**: it checks that every benchmark runs, at sizes too small "
    "for their times to mean anything, so it judges no ratio against its "
    "target."
)

METHOD = (
    "Every candidate is compiled with XLA (`jit_compile=True` on "
    "TensorFlow, `jax.jit` on JAX) and timed in "
    "this one process, in rounds that call each candidate of a benchmark "
    "once, in a new order each round; a ratio is the median over rounds of "
    "the two calls' times in a round, so the load of a busy machine falls "
    "on both alike. A second copy of one candidate measures how far two "
    "identical programs time apart: a ratio past its target by no more "
    'than that reads "within noise". Peak memory is the bytes that '
    "XLA's buffer assignment gives one compiled call: its temporary "
    "buffers, at the most that is live at once, its output and its "
    "constants, not its input and weights; exact, and the same from run "
    "to run."
)
# PyTorch's candidates run as they are: nothing compiled, nothing to read.
EAGER_METHOD = (
    "Every candidate runs eagerly (Keras' PyTorch backend compiles with no "
    "XLA) and is timed in this one process, in rounds that call each "
    "candidate of a benchmark once, in a new order each round; a ratio is "
    "the median over rounds of the two calls' times in a round, so the "
    "load of a busy machine falls on both alike. A second copy of one "
    "candidate measures how far two identical programs time apart: a ratio "
    'past its target by no more than that reads "within noise". Peak '
    "memory, read from XLA's buffer assignment on TensorFlow and JAX, is "
    "not measured here: the attention table has no memory columns."
)


def _proc_field(path, name):
    """The value of field `name` in a /proc file such as /proc/meminfo.

    Returns:
        The text after the field's colon, stripped, or `None` where the file
        or the field is missing.
    """
    try:
        with open(path) as file:
            for line in file:
                field, _, value = line.partition(":")
                if field.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def _cpu_model():
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    return (
        _proc_field("/proc/cpuinfo", "model name")
        or platform.processor()
        or "unknown"
    )


def _memory():
    """The machine's memory in GiB, as text, from /proc/meminfo."""
    total = _proc_field("/proc/meminfo", "MemTotal")  # "24576000 kB"
    if total is None:
        return "unknown"
    return f"{int(total.split()[0]) / 2**20:.1f} GiB"


def describe_machine():
    """The machine and the software the benchmarks ran on, as Markdown.

    Returns:
        A str: a bullet list of the CPU model, logical cores, memory, the
        GPUs the backend sees, the backend measured, the versions of its
        library, Keras, keras-hub and Python, and today's date.
    """
    gpus = ", ".join(compiled.accelerators()) or "none"
    return "\n".join(
        [
            f"- CPU: {_cpu_model()}, {os.cpu_count()} logical cores",
            f"- Memory: {_memory()}",
            f"- GPUs seen by {compiled.library()}: {gpus}",
            f"- Backend measured: Keras' {keras.backend.backend()} backend",
            f"- {compiled.versions()}, Keras {keras.__version__}, "
            f"keras-hub {keras_hub.__version__}, "
            f"Python {platform.python_version()}",
            f"- Date: {datetime.date.today().isoformat()}",
        ]
    )


def _progress(message):
    print(message, flush=True)


def run(out=None, repeats=30, tiny=False):
    """Run every benchmark, print their tables, and write them to `out`.

    Args:
        out: str or None. A Markdown file to write the machine's
            description and the tables to (its folders are made), or `None`.
            Defaults to `None`.
        repeats: int. Timed rounds of each benchmark; at least 1. Ignored
            with `tiny`. Defaults to `30`.
        tiny: bool. Tiny shapes, 2 rounds, 1 warm-up call and a short memory
            length: checks that everything runs, in seconds, and times
            nothing. Defaults to `False`.

    Returns:
        `0`, whether or not the targets are met: timings on a busy machine
        are for a person to read.
    """
    if repeats < 1:
        raise ValueError(
            f"`repeats` must be at least 1. Received: repeats={repeats}"
        )
    if tiny:
        repeats, warmup = TINY_REPEATS, TINY_WARMUP
        absolute_sizes = TINY_ABSOLUTE
        rotary_shape = TINY_ROTARY_SHAPE
        attention_sizes = TINY_ATTENTION
        decoding_sizes = TINY_DECODING
        memory_length = TINY_MEMORY_LENGTH
        long_memory_length = TINY_LONG_MEMORY_LENGTH
        grid_sizes = TINY_GRID
        grouped_sizes = TINY_GROUPED
    else:
        warmup = WARMUP
        absolute_sizes = {
            "shape": absolute.SHAPE,
            "vocabulary_size": absolute.VOCABULARY_SIZE,
        }
        rotary_shape = rotary_embedding.SHAPE
        attention_sizes = {
            "batch": attention.BATCH,
            "length": attention.LENGTH,
            "heads": attention.HEADS,
            "key_dim": attention.KEY_DIM,
        }
        decoding_sizes = {
            "batch": decoding.BATCH,
            "prompt": decoding.PROMPT,
            "new_tokens": decoding.NEW_TOKENS,
            "heads": decoding.HEADS,
            "key_dim": decoding.KEY_DIM,
        }
        memory_length = attention.MEMORY_LENGTH
        long_memory_length = attention.LONG_MEMORY_LENGTH
        grouped_sizes = {
            "batch": grouped.BATCH,
            "length": grouped.LENGTH,
            "heads": grouped.HEADS,
            "key_value_heads": grouped.KEY_VALUE_HEADS,
            "key_dim": grouped.KEY_DIM,
            "slots": grouped.SLOTS,
        }
        grid_sizes = {
            "grid": grid.GRID,
            "batch": grid.BATCH,
            "features": grid.FEATURES,
            "heads": grid.HEADS,
            "key_dim": grid.KEY_DIM,
            "attention_batch": grid.ATTENTION_BATCH,
        }

    _progress(
        "Timing additive encodings (SinusoidalPositionEncoding, "
        "PositionEmbedding, TokenAndPositionEmbedding) ..."
    )
    absolute_results = absolute.run(
        **absolute_sizes, repeats=repeats, warmup=warmup
    )
    _progress("Timing RotaryEmbedding ...")
    rotary_results = rotary_embedding.run(rotary_shape, repeats, warmup)
    _progress(
        "Timing attention per position scheme"
        + (
            ", then reading each one's peak memory from XLA's buffer "
            "assignment ..."
            if compiled.has_programs()
            else " ..."
        )
    )
    attention_results = attention.run(
        **attention_sizes,
        repeats=repeats,
        warmup=warmup,
        memory_length=memory_length,
        long_memory_length=long_memory_length,
    )
    _progress(
        "Timing cached generation per position scheme, a prompt cached, "
        "then a token at a time ..."
    )
    decoding_results = decoding.run(
        **decoding_sizes, repeats=repeats, warmup=warmup
    )
    _progress(
        "Timing grouped-query attention with RoPE against Keras' "
        "GroupQueryAttention ..."
    )
    grouped_results = grouped.run(**grouped_sizes, repeats=repeats, warmup=warmup)
    _progress(
        "Timing the grid layers against their floors, their 1-D paths and "
        "plain attention ..."
    )
    grid_results = grid.run(**grid_sizes, repeats=repeats, warmup=warmup)

    width = attention_sizes["heads"] * attention_sizes["key_dim"]
    attention_input = (
        attention_sizes["batch"],
        attention_sizes["length"],
        width,
    )
    memory_input = (attention_sizes["batch"], memory_length, width)
    mode = "under XLA" if compiled.has_programs() else "eager"
    if compiled.has_programs():
        memory_sentence = (
            f" Peak memory of one call at {memory_input}, as XLA assigns it "
            "(targets: RoPE and ALiBi at most 1.0x, T5 1.1x, Shaw 1.15x), "
            f"and below at (1, {long_memory_length}, {width})."
        )
    else:
        memory_sentence = (
            " Peak memory is not measured on PyTorch: no XLA program to read."
        )
    report = "\n".join(
        [
            "# keras-posenc benchmarks",
            "",
            describe_machine(),
            "",
            METHOD if compiled.has_programs() else EAGER_METHOD,
            "",
            *([TINY_NOTE, ""] if tiny else []),
            "## Additive encodings",
            "",
            absolute.describe(
                absolute_sizes["shape"],
                absolute_sizes["vocabulary_size"],
                repeats,
            )
            + ". Targets: at most 1.0x keras-hub, at most 1.1x the floor.",
            "",
            absolute.format_table(absolute_results, judged=not tiny),
            "",
            "## Rotary embedding",
            "",
            f"`RotaryEmbedding` on a {rotary_shape} float32 tensor {mode}: "
            f"median of {repeats} rounds. Targets: at most 1.0x keras-hub, "
            "at most 1.2x the floor (the bare rotation with precomputed "
            "cos/sin tables); with a start index read at run time, at most "
            "1.2x the floor and 0.5x keras-hub.",
            "",
            rotary_embedding.format_table(rotary_results, judged=not tiny),
            "",
            "## Attention per position scheme",
            "",
            f"One self-attention call on a {attention_input} float32 input, "
            f"{attention_sizes['heads']} heads of key_dim "
            f"{attention_sizes['key_dim']}, no mask, {mode}: median of "
            f"{repeats} rounds, against plain `MultiHeadAttention` on Keras' "
            "einsum path (the \"/ plain\" column: against its "
            "`dot_product_attention` path). Targets: RoPE and ALiBi at most "
            "1.05x, T5 1.10x, Shaw 1.25x." + memory_sentence,
            "",
            attention.format_table(attention_results, judged=not tiny),
            "",
            "## Cached generation",
            "",
            decoding.describe(**decoding_sizes, repeats=repeats)
            + ". Targets: RoPE, ALiBi and T5 at most 1.10x plain's time "
            "per token.",
            "",
            decoding.format_table(decoding_results, judged=not tiny),
            "",
            "## Grouped-query attention",
            "",
            grouped.describe(**grouped_sizes, repeats=repeats)
            + ". Targets: RoPE at most 1.05x Keras' layer; a decoding step "
            "at most 1.10x Keras' step.",
            "",
            grouped.format_table(grouped_results, judged=not tiny),
            "",
            "## Grids: images, video, multimodal",
            "",
            grid.describe(**grid_sizes, repeats=repeats) + ".",
            "",
            grid.format_table(grid_results, judged=not tiny),
            "",
        ]
    )
    print()
    print(report)
    if out is not None:
        folder = os.path.dirname(os.path.abspath(out))
        os.makedirs(folder, exist_ok=True)
        with open(out, "w") as file:
            file.write(report)
        print(out)
    return 0
