"""Benchmark: the grid layers against their 1-D paths and precomputed floors.

The targets, on a 32 x 32 grid of patches (1024 tokens), everything compiled
with XLA:

- additive: `SinusoidalPositionEncoding(num_axes=2)` and
  `PositionEmbedding(grid_shape=(32, 32))` on `(8, 1024, 512)` float32
  token embeddings take at most 1.1 times the floor, the bare addition of
  the same table computed beforehand;
- rotary: `RotaryEmbedding(num_axes=2)`, axial (`axis_layout="blocks"`) and
  M-RoPE (`"sections"`), on `(8, 1024, 8, 64)` queries take at most 1.2
  times the floor, the bare rotation with the same cos/sin tables computed
  beforehand;
- attention: one self-attention call on `(4, 1024, 512)`, 8 heads of
  key_dim 64, with a grid scheme inside `PositionalMultiHeadAttention`
  (2-D RoPE, Swin's grid bias) takes at most 1.15 times plain
  `keras.layers.MultiHeadAttention(8, 64)`.

Each grid layer is also timed against the same layer's 1-D path on the same
number of tokens (positions 0 .. 1023 on a line): what reading positions on
a grid costs, reported without a target. The floors' tables come from the
layers themselves, called once eagerly (the additive encodings with
`merge_mode=None`, the rotations on a unit input, whose output is each
pair's cos and sin), so the floors compute exactly what the layers do, and
every candidate's output is checked against its floor's before timing.

Ratios are medians over rounds of paired calls in one process (see
`keras_posenc_lab.bench.timing`). Run from the repository root:

    python -m keras_posenc_lab.bench.grid [--grid 32 32] [--repeats 30]
"""

import statistics
import sys

import keras
import numpy as np

import keras_posenc
from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import timing

GRID = (32, 32)
BATCH = 8
FEATURES = 512
HEADS = 8
KEY_DIM = 64
ATTENTION_BATCH = 4
# The most each ratio may be, over the floor (additive, rotary) or over
# plain MultiHeadAttention (attention).
TARGETS = {
    "sinusoidal": 1.1,
    "learned": 1.1,
    "rotary_blocks": 1.2,
    "rotary_sections": 1.2,
    "attention_rotary": 1.15,
    "attention_grid_bias": 1.15,
}
LABELS = {
    "sinusoidal": "`SinusoidalPositionEncoding(num_axes=2)`",
    "learned": "`PositionEmbedding(grid_shape=...)`",
    "rotary_blocks": "`RotaryEmbedding(num_axes=2)`, axial blocks",
    "rotary_sections": "`RotaryEmbedding(num_axes=2)`, M-RoPE sections",
    "attention_rotary": "attention, 2-D RoPE",
    "attention_grid_bias": "attention, Swin's grid bias",
}
# float32 tables rounded differently by a few ulps, times inputs of order 4.
TOLERANCE = 1e-4


def _floor_add(table):
    """The floor of an additive encoding: the inputs plus a constant table."""

    def add(inputs):
        return inputs + table  # (batch, tokens, features)

    return add


def _floor_rotate(cos, sin):
    """The floor of a rotation in the half pairing, with its tables given."""

    def rotate(inputs):
        first, second = keras.ops.split(inputs, 2, axis=-1)  # (..., dim / 2) each
        turned = keras.ops.concatenate([-second, first], axis=-1)  # (..., dim)
        return inputs * cos + turned * sin

    return rotate


def _rotation_tables(layer, tokens, dim, **call_arguments):
    """cos and sin of `layer`'s rotation, `(tokens, 1, dim)`, from the layer.

    In the half pairing pair `i` is features `i` and `i + dim / 2`; the unit
    input `(1, 0)` of every pair turns into `(cos, sin)` of the pair's angle.
    """
    unit = np.concatenate([np.ones(dim // 2), np.zeros(dim // 2)]).astype(
        "float32"
    )
    turned = layer(
        np.broadcast_to(unit, (1, tokens, 1, dim)).copy(), **call_arguments
    )[0]
    turned = keras.ops.convert_to_numpy(turned)  # (tokens, 1, dim)
    cos, sin = turned[..., : dim // 2], turned[..., dim // 2 :]
    return (
        np.concatenate([cos, cos], axis=-1),
        np.concatenate([sin, sin], axis=-1),
    )


def _additive(name, grid, batch, features):
    """The candidates of an additive encoding and their input."""
    tokens = int(np.prod(grid))
    inputs = compiled.normal((batch, tokens, features), seed=1)
    if name == "sinusoidal":
        layer = keras_posenc.SinusoidalPositionEncoding(num_axes=len(grid))
        line = keras_posenc.SinusoidalPositionEncoding()
        table = keras_posenc.SinusoidalPositionEncoding(
            num_axes=len(grid), merge_mode=None
        )(inputs[:1], grid_shape=grid)[0]
        table = keras.ops.convert_to_numpy(table)
    else:
        layer = keras_posenc.PositionEmbedding(grid_shape=grid)
        line = keras_posenc.PositionEmbedding(sequence_length=tokens)
        layer(inputs[:1], grid_shape=grid)
        line(inputs[:1])
        line.embeddings.assign(layer.embeddings)
        table = layer.embeddings
    candidates = {
        "grid": lambda x: layer(x, grid_shape=grid),
        # Compiled on its own: how far two identical programs time apart.
        "grid_again": lambda x: layer(x, grid_shape=grid),
        "line": line,
        "floor": _floor_add(table),
    }
    return candidates, inputs


def _rotary(name, grid, batch, heads, key_dim):
    """The candidates of a grid rotation and their input."""
    tokens = int(np.prod(grid))
    inputs = compiled.normal((batch, tokens, heads, key_dim), seed=2)
    if name == "rotary_blocks":
        layer = keras_posenc.RotaryEmbedding(
            num_axes=len(grid), axis_layout="blocks"
        )
    else:
        pairs = key_dim // 2
        sections = [pairs // len(grid)] * len(grid)
        sections[0] += pairs - sum(sections)
        layer = keras_posenc.RotaryEmbedding(
            num_axes=len(grid), axis_layout="sections", axis_sections=sections
        )
    cos, sin = _rotation_tables(layer, tokens, key_dim, grid_shape=grid)
    candidates = {
        "grid": lambda x: layer(x, grid_shape=grid),
        "grid_again": lambda x: layer(x, grid_shape=grid),
        "line": keras_posenc.RotaryEmbedding(),
        "floor": _floor_rotate(cos, sin),
    }
    return candidates, inputs


def _attention(name, grid, batch, heads, key_dim):
    """Plain attention and attention with a grid scheme, the same weights."""
    tokens = int(np.prod(grid))
    inputs = compiled.normal((batch, tokens, heads * key_dim), seed=3)
    if name == "attention_rotary":
        position = keras_posenc.RotaryEmbedding(num_axes=len(grid))
    else:
        position = keras_posenc.GridRelativePositionBias(heads, grid)
    layer = keras_posenc.PositionalMultiHeadAttention(
        heads, key_dim, position=position
    )
    plain = keras.layers.MultiHeadAttention(heads, key_dim)
    layer(inputs[:1], inputs[:1], grid_shape=grid)
    plain(inputs[:1], inputs[:1])
    for mine, theirs in zip(
        (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense),
        (plain.query_dense, plain.key_dense, plain.value_dense, plain.output_dense),
    ):
        theirs.set_weights(mine.get_weights())
    candidates = {
        "grid": lambda x: layer(x, x, grid_shape=grid),
        "plain": lambda x: plain(x, x),
        # Compiled on its own: how far two identical programs time apart.
        "plain_again": lambda x: plain(x, x),
    }
    return candidates, inputs


def _check_agreement(name, candidates, inputs, reference):
    """Fail unless the grid candidate's output is `reference`'s, within rounding."""
    outputs = {
        candidate: keras.ops.convert_to_numpy(
            compiled.jit(candidates[candidate])(inputs)
        )
        for candidate in ("grid", reference)
    }
    np.testing.assert_allclose(
        outputs["grid"],
        outputs[reference],
        rtol=0,
        atol=TOLERANCE * max(1.0, float(np.max(np.abs(outputs[reference])))),
        err_msg=f"{name}: the grid layer and its {reference} disagree",
    )


def run(
    grid=GRID,
    batch=BATCH,
    features=FEATURES,
    heads=HEADS,
    key_dim=KEY_DIM,
    attention_batch=ATTENTION_BATCH,
    repeats=30,
    warmup=3,
):
    """Time every grid layer against its floor (or plain attention) and 1-D path.

    Args:
        grid: tuple of ints. The grid of patches. Defaults to `(32, 32)`.
        batch: int. The batch of the additive and rotary calls. Defaults to
            `8`.
        features: int. The width of the additive encodings' inputs.
            Defaults to `512`.
        heads, key_dim: int. The heads of the rotations and the attention.
            Defaults to `8` and `64`.
        attention_batch: int. The batch of the attention call. Defaults to
            `4`.
        repeats: int. Timed rounds. Defaults to `30`.
        warmup: int. Untimed calls of each candidate first. Defaults to `3`.

    Returns:
        A dict of benchmark names (`TARGETS`' keys) to dicts: the median
        seconds of each candidate and `"vs_floor"` or `"vs_plain"` and, for
        the additive and rotary layers, `"vs_line"` (the grid call over the
        1-D call on as many tokens).
    """
    grid = tuple(grid)
    results = {}
    for name in TARGETS:
        if name in ("sinusoidal", "learned"):
            candidates, inputs = _additive(name, grid, batch, features)
            reference = "floor"
        elif name.startswith("rotary"):
            candidates, inputs = _rotary(name, grid, batch, heads, key_dim)
            reference = "floor"
        else:
            candidates, inputs = _attention(
                name, grid, attention_batch, heads, key_dim
            )
            reference = None
        if reference is not None:
            _check_agreement(name, candidates, inputs, reference)
        seconds = timing.rounds(candidates, (inputs,), repeats, warmup)
        result = {
            candidate: statistics.median(times)
            for candidate, times in seconds.items()
        }
        if reference is None:
            result["vs_plain"] = timing.paired_ratio(seconds, "grid", "plain")
            result["vs_itself"] = timing.paired_ratio(
                seconds, "plain_again", "plain"
            )
        else:
            result["vs_floor"] = timing.paired_ratio(seconds, "grid", "floor")
            result["vs_line"] = timing.paired_ratio(seconds, "grid", "line")
            result["vs_itself"] = timing.paired_ratio(
                seconds, "grid_again", "grid"
            )
        results[name] = result
    return results


def format_table(results, judged=True):
    """A Markdown table of `run`'s results and whether the targets are met.

    Args:
        results: dict. What `run` returns.
        judged: bool. `False` for a run too small to mean anything (the
            tiny run): its "met" cells give no verdict. Defaults to `True`.

    Returns:
        A str.
    """
    lines = [
        "| layer | median (ms) | against | ratio | target | met | / its 1-D path | noise |",
        "|---|---:|---|---:|---:|---|---:|---:|",
    ]
    for name, result in results.items():
        if "vs_plain" in result:
            against, ratio = "plain `MultiHeadAttention`", result["vs_plain"]
            line = ""
        else:
            against, ratio = "floor", result["vs_floor"]
            line = f"{result['vs_line']:.3f}x"
        # A ratio past its target by no more than two identical programs
        # time apart is not told apart from meeting it.
        noise = timing.noise_band(result["vs_itself"])
        met = timing.verdict(ratio, TARGETS[name], noise, judged=judged)
        lines.append(
            f"| {LABELS[name]} | {result['grid'] * 1e3:.2f} | {against} | "
            f"{ratio:.3f}x | <= {TARGETS[name]:.2f}x | {met} | {line} | "
            f"{result['vs_itself']:.3f}x |"
        )
    return "\n".join(lines)


def describe(grid, batch, features, heads, key_dim, attention_batch, repeats):
    """One sentence of what `run` timed, for the report."""
    tokens = int(np.prod(grid))
    return (
        f"A {' x '.join(map(str, grid))} grid ({tokens} tokens) under XLA, "
        f"median of {repeats} rounds: additive encodings on "
        f"({batch}, {tokens}, {features}), rotations of ({batch}, {tokens}, "
        f"{heads}, {key_dim}), one self-attention call on ({attention_batch}, "
        f"{tokens}, {heads * key_dim}) with {heads} heads of key_dim "
        f"{key_dim}. Targets: additive at most 1.1x the floor, rotary at "
        "most 1.2x the floor, attention at most 1.15x plain "
        "`MultiHeadAttention`"
    )


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
        "grid",
        (
            "Time the grid layers under XLA against precomputed floors, "
            "plain MultiHeadAttention and their own 1-D paths."
        ),
    )
    parser.add_argument(
        "--grid",
        type=int_at_least(1),
        nargs=2,
        default=GRID,
        metavar=("HEIGHT", "WIDTH"),
        help="grid of patches (default: 32 32)",
    )
    args = parser.parse_args(argv)
    grid = tuple(args.grid)
    results = run(grid, repeats=args.repeats)
    print(
        describe(
            grid, BATCH, FEATURES, HEADS, KEY_DIM, ATTENTION_BATCH, args.repeats
        )
        + ".\n"
    )
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
