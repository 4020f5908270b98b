"""Benchmark: `RotaryEmbedding` under XLA against keras-hub and the floor.

The targets: rotating a `(8, 2048, 8, 64)` float32 tensor with
`keras_posenc.RotaryEmbedding()` takes at most as long as
`keras_hub.layers.RotaryEmbedding()`, and at most 1.2 times the floor, the
bare rotation `x * cos + rotate_half(x) * sin` with its cos/sin tables
computed beforehand. With a start index read at run time (cached decoding
after a prefill), whose tables XLA cannot fold into constants, it takes at
most 1.2 times the floor still and at most half keras-hub's time there. All
run compiled with XLA in one process, in rounds that call each candidate
once in a new order; each ratio is the median over rounds of the two
calls' times in that round. A second copy of the layer measures how far
two identical programs time apart. The backend is the one `KERAS_BACKEND`
names (`compiled`): XLA on TensorFlow and JAX, eager on PyTorch.

Run from the repository root:

    python -m keras_posenc_lab.bench.rotary_embedding [--shape 8 2048 8 64] [--repeats 30]
"""

import statistics
import sys

import keras
import keras_hub
import numpy as np

import keras_posenc
from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import timing

SHAPE = (8, 2048, 8, 64)
# The most each ratio may be: keras_posenc's time over the other's.
TARGETS = {
    "vs_keras_hub": 1.0,
    "vs_floor": 1.2,
    "runtime_start_vs_keras_hub": 0.5,
    "runtime_start_vs_floor": 1.2,
}
MAX_WAVELENGTH = 10000.0
# The implementations round their float32 angles `p * w` differently, by up
# to an ulp of the angle, about 1.2e-7 * p: so far apart can the outputs be,
# per unit of input.
FLOAT32_ANGLE_ERROR = 1.2e-7


def _half_pairing_tables(sequence_length, dim):
    """cos and sin of the half pairing, as Hugging Face computes them.

    Held in variables, so that every backend passes them to the compiled
    call as arguments rather than folding them into it.
    """
    exponents = keras.ops.arange(0, dim, 2, dtype="float32") / dim  # (dim / 2,)
    inverse_frequencies = 1.0 / MAX_WAVELENGTH**exponents
    positions = keras.ops.arange(sequence_length, dtype="float32")  # (seq,)
    angles = positions[:, None] * inverse_frequencies  # (seq, dim / 2)
    angles = keras.ops.concatenate([angles, angles], axis=-1)[:, None, :]  # (seq, 1, dim)
    return (
        keras.Variable(keras.ops.cos(angles), trainable=False),
        keras.Variable(keras.ops.sin(angles), trainable=False),
    )


def _floor(cos, sin):
    """The bare rotation, with `cos` and `sin` tables given."""

    def rotate(inputs):
        first, second = keras.ops.split(inputs, 2, axis=-1)  # (..., dim / 2) each
        turned = keras.ops.concatenate([-second, first], axis=-1)  # (..., dim)
        return inputs * cos + turned * sin

    return rotate


def run(shape=SHAPE, repeats=30, warmup=3, seed=0):
    """Time the three rotations of a random tensor of `shape`.

    Args:
        shape: tuple of 4 ints. `(batch, sequence, heads, head_dim)`, with
            `head_dim` even. Defaults to `(8, 2048, 8, 64)`.
        repeats: int. Timed calls of each. Defaults to `30`.
        warmup: int. Untimed calls of each first. Defaults to `3`.
        seed: int. Seed of the input tensor. Defaults to `0`.

    Returns:
        A dict: median seconds of a call under `"keras_posenc"`,
        `"keras_hub"` and `"floor"`; the median over rounds of
        keras_posenc's time over each other's under `"vs_keras_hub"` and
        `"vs_floor"`.

    Raises:
        AssertionError: when the three outputs differ by more than float32
            angles allow; then they would not be doing the same work.
    """
    sequence_length, dim = shape[1], shape[3]
    inputs = compiled.normal(shape, seed)
    cos, sin = _half_pairing_tables(sequence_length, dim)
    layer = keras_posenc.RotaryEmbedding()
    hub_layer = keras_hub.layers.RotaryEmbedding()
    candidates = {
        "keras_posenc": layer,
        "keras_hub": hub_layer,
        "floor": _floor(cos, sin),
        # A second, separately compiled copy: how far apart two identical
        # programs time on this machine.
        "keras_posenc_again": keras_posenc.RotaryEmbedding(),
    }
    # A start index read at run time (cached decoding), which XLA cannot
    # fold into constant tables.
    start_index = keras.Variable(0, dtype="int32", trainable=False)
    runtime_start = {
        "keras_posenc_runtime_start": lambda x: layer(x, start_index=start_index),
        "keras_hub_runtime_start": lambda x: hub_layer(x, start_index=start_index),
    }

    candidates.update(runtime_start)
    outputs = {
        name: keras.ops.convert_to_numpy(compiled.jit(fn)(inputs))
        for name, fn in candidates.items()
    }
    largest_input = np.max(np.abs(keras.ops.convert_to_numpy(inputs)))
    tolerance = FLOAT32_ANGLE_ERROR * sequence_length * largest_input
    for name in candidates:
        np.testing.assert_allclose(
            outputs[name],
            outputs["floor"],
            rtol=0,
            atol=tolerance,
            err_msg=f"{name} and the floor disagree",
        )

    seconds = timing.rounds(candidates, (inputs,), repeats, warmup)
    return {
        **{name: statistics.median(times) for name, times in seconds.items()},
        "vs_keras_hub": timing.paired_ratio(seconds, "keras_posenc", "keras_hub"),
        "vs_floor": timing.paired_ratio(seconds, "keras_posenc", "floor"),
        "vs_itself": timing.paired_ratio(
            seconds, "keras_posenc", "keras_posenc_again"
        ),
        "runtime_start_vs_keras_hub": timing.paired_ratio(
            seconds, "keras_posenc_runtime_start", "keras_hub_runtime_start"
        ),
        "runtime_start_vs_floor": timing.paired_ratio(
            seconds, "keras_posenc_runtime_start", "floor"
        ),
    }


def format_table(results, judged=True):
    """A Markdown table of `run`'s results and whether the targets are met.

    Args:
        results: dict. What `run` returns.
        judged: bool. `False` for a run at sizes too small to mean
            anything (the tiny run): its "met" cells give no verdict.
            Defaults to `True`.

    Returns:
        A str.
    """
    lines = [
        "| keras_posenc against | its median (ms) | keras_posenc / it | target | met |",
        "|---|---:|---:|---:|---|",
        f"| (keras_posenc itself) | {results['keras_posenc'] * 1e3:.2f} | | | |",
    ]
    noise = timing.noise_band(results["vs_itself"])

    def judged_rows(prefix, medians):
        # One row per baseline: its median, keras_posenc's ratio to it under
        # `<prefix>vs_<name>`, the target of that key and the verdict.
        for name, median in medians:
            ratio = results[f"{prefix}vs_{name}"]
            target = TARGETS[f"{prefix}vs_{name}"]
            met = timing.verdict(ratio, target, noise, judged=judged)
            lines.append(
                f"| {name} | {median * 1e3:.2f} | {ratio:.3f}x "
                f"| <= {target:.1f}x | {met} |"
            )

    judged_rows(
        "", (("keras_hub", results["keras_hub"]), ("floor", results["floor"]))
    )
    lines += [
        f"| a second copy of itself (noise) | "
        f"{results['keras_posenc_again'] * 1e3:.2f} | "
        f"{results['vs_itself']:.3f}x | | |",
        "",
        "With a start index read at run time (cached decoding), which XLA "
        "cannot fold into constant tables:",
        "",
        "| keras_posenc against | its median (ms) | keras_posenc / it | target | met |",
        "|---|---:|---:|---:|---|",
        f"| (keras_posenc itself) | "
        f"{results['keras_posenc_runtime_start'] * 1e3:.2f} | | | |",
    ]
    judged_rows(
        "runtime_start_",
        (
            ("keras_hub", results["keras_hub_runtime_start"]),
            ("floor", results["floor"]),
        ),
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
        "rotary_embedding",
        (
            "Time RotaryEmbedding, under XLA where the backend has it, "
            "against keras-hub's and the bare rotation with precomputed "
            "tables."
        ),
        "timed calls of each candidate",
    )
    parser.add_argument(
        "--shape",
        type=int_at_least(1),
        nargs=4,
        default=SHAPE,
        metavar=("BATCH", "SEQUENCE", "HEADS", "HEAD_DIM"),
        help="input shape (default: 8 2048 8 64)",
    )
    args = parser.parse_args(argv)
    shape = tuple(args.shape)
    results = run(shape, args.repeats)
    print(f"Keras {keras.__version__} on its {compiled.backend()} backend: {compiled.versions()}")
    print(
        f"RotaryEmbedding on a {shape} float32 tensor "
        f"{'under XLA' if compiled.has_programs() else 'eager'}, "
        f"median of {args.repeats} calls\n"
    )
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
