"""Benchmark: the absolute encodings under XLA against keras-hub and the floor.

The targets: adding an encoding to a `(8, 2048, 512)` float32 tensor (or
embedding `(8, 2048)` token ids from a vocabulary of 32,000 and adding one)
with each of `keras_posenc.SinusoidalPositionEncoding`, `PositionEmbedding`
and `TokenAndPositionEmbedding` takes at most as long as keras-hub's layer
doing the same (`SinePositionEncoding` and `PositionEmbedding`, whose
encodings are added to the inputs here, and `TokenAndPositionEmbedding`),
and at most 1.1 times the floor: the bare addition of a table computed
beforehand (a constant for the sinusoidal encoding, the variable itself for
the learned one), after `keras.ops.take` of the token table's rows for the
token embedding. keras-hub has no token embedding with a sinusoidal position; that
variant is timed against its floor alone.

All run compiled with XLA in one process, in rounds that call each candidate
of an encoding once in a new order; each ratio is the median over rounds of
the two calls' times in that round. A second copy of each keras_posenc layer
measures how far two identical programs time apart. Before timing, every
candidate's output is checked against the floor's, with the learned tables
copied between them, so that all of them compute the same thing. The
backend is the one `KERAS_BACKEND` names (`compiled`): XLA on TensorFlow
and JAX, eager on PyTorch.

Run from the repository root:

    python -m keras_posenc_lab.bench.absolute [--shape 8 2048 512] [--repeats 30]
"""

import statistics
import sys

import keras
import keras_hub
import numpy as np

import keras_posenc
from keras_posenc import ops
from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import compiled
from keras_posenc_lab.bench import timing

SHAPE = (8, 2048, 512)
VOCABULARY_SIZE = 32000
# The most each ratio may be: keras_posenc's time over the other's.
TARGETS = {"vs_keras_hub": 1.0, "vs_floor": 1.1}
# The encodings timed, each against its own candidates.
ENCODINGS = ("sinusoidal", "learned", "token_learned", "token_sinusoidal")
# The encodings that keras-hub has a layer for.
WITH_KERAS_HUB = ("sinusoidal", "learned", "token_learned")
LABELS = {
    "sinusoidal": "`SinusoidalPositionEncoding`",
    "learned": "`PositionEmbedding`",
    "token_learned": "`TokenAndPositionEmbedding`, learned",
    "token_sinusoidal": "`TokenAndPositionEmbedding`, sinusoidal",
}
# The implementations round their float32 angles `p * w` differently, by up
# to an ulp of the angle, about 1.2e-7 * p: so far apart can the sinusoidal
# tables be. The sums with the inputs round once more.
FLOAT32_ANGLE_ERROR = 1.2e-7
FLOAT32_SUM_ERROR = 1e-6


def _add_constant(table):
    """The floor of a fixed encoding: the inputs plus a constant table."""

    def add_constant(inputs):
        return inputs + table  # (batch, seq, dim)

    return add_constant


def _add_variable(variable):
    """The floor of a learned encoding: the inputs plus the table's rows."""

    def add_variable(inputs):
        return inputs + variable[: inputs.shape[1]]  # (batch, seq, dim)

    return add_variable


def _gather_and_add(token_table, position_table):
    """The floor of a token embedding: its rows plus the position table."""

    def gather_and_add(token_ids):
        embedded = keras.ops.take(token_table, token_ids, axis=0)  # (batch, seq, dim)
        return embedded + position_table[: token_ids.shape[1]]

    return gather_and_add


def _add_keras_hub(encoding):
    """keras-hub's encoding layer added to its inputs, as keras_posenc does."""

    def add_keras_hub(inputs):
        return inputs + encoding(inputs)  # (batch, seq, dim)

    return add_keras_hub


def _table_variable(table):
    """A copy of `table` in a variable of its own, as the floors read it.

    A variable, not a tensor: every backend passes it to the compiled call
    as an argument, as it does a layer's weights.
    """
    return keras.Variable(keras.ops.convert_to_numpy(table), trainable=False)


def _sinusoidal_table(sequence_length, dim):
    """The sinusoidal table as NumPy: a constant to the compiled call."""
    return keras.ops.convert_to_numpy(
        ops.sinusoidal(keras.ops.arange(sequence_length), dim)
    )


def _built(layer, inputs):
    """`layer`, built eagerly on `inputs`, so no weight is made under XLA."""
    layer(inputs)
    return layer


def _candidates(encoding, shape, vocabulary_size, inputs, token_ids):
    """The candidates of `encoding`, built, with the same tables.

    Args:
        encoding: str. One of `ENCODINGS`.
        shape: tuple of 3 ints. `(batch, sequence, dim)`.
        vocabulary_size: int. The number of token ids.
        inputs: float32 tensor of `shape`, for the additive encodings.
        token_ids: int32 tensor of `shape[:2]`, for the token embeddings.

    Returns:
        A dict of names (`"keras_posenc"`, `"keras_posenc_again"`, `"floor"`
        and, where keras-hub has the layer, `"keras_hub"`) to functions of
        the encoding's input.
    """
    sequence_length, dim = shape[1], shape[2]
    if encoding == "sinusoidal":
        # Computed once, outside the timed function: a constant to XLA.
        table = _sinusoidal_table(sequence_length, dim)
        return {
            "keras_posenc": keras_posenc.SinusoidalPositionEncoding(),
            "keras_posenc_again": keras_posenc.SinusoidalPositionEncoding(),
            "keras_hub": _add_keras_hub(
                keras_hub.layers.SinePositionEncoding()
            ),
            "floor": _add_constant(table),
        }
    if encoding == "learned":
        layer = _built(keras_posenc.PositionEmbedding(sequence_length), inputs)
        again = _built(keras_posenc.PositionEmbedding(sequence_length), inputs)
        hub_layer = _built(
            keras_hub.layers.PositionEmbedding(sequence_length), inputs
        )
        again.embeddings.assign(layer.embeddings)
        hub_layer.position_embeddings.assign(layer.embeddings)
        return {
            "keras_posenc": layer,
            "keras_posenc_again": again,
            "keras_hub": _add_keras_hub(hub_layer),
            "floor": _add_variable(_table_variable(layer.embeddings)),
        }
    position_encoding = "learned" if encoding == "token_learned" else "sinusoidal"
    layer, again = (
        _built(
            keras_posenc.TokenAndPositionEmbedding(
                vocabulary_size,
                dim,
                sequence_length,
                position_encoding=position_encoding,
            ),
            token_ids,
        )
        for _ in range(2)
    )
    again.token_embedding.embeddings.assign(layer.token_embedding.embeddings)
    token_table = _table_variable(layer.token_embedding.embeddings)
    candidates = {"keras_posenc": layer, "keras_posenc_again": again}
    if position_encoding == "sinusoidal":
        position_table = _sinusoidal_table(sequence_length, dim)
    else:
        again.position_embedding.embeddings.assign(
            layer.position_embedding.embeddings
        )
        hub_layer = _built(
            keras_hub.layers.TokenAndPositionEmbedding(
                vocabulary_size, sequence_length, dim
            ),
            token_ids,
        )
        hub_layer.token_embedding.embeddings.assign(token_table)
        hub_layer.position_embedding.position_embeddings.assign(
            layer.position_embedding.embeddings
        )
        candidates["keras_hub"] = hub_layer
        position_table = _table_variable(layer.position_embedding.embeddings)
    candidates["floor"] = _gather_and_add(token_table, position_table)
    return candidates


def _check_agreement(encoding, candidates, encoding_inputs, sequence_length):
    """Fail unless every candidate's output is the floor's, within rounding.

    Args:
        encoding: str. One of `ENCODINGS`, for the message and the tolerance.
        candidates: dict of str to callable, `"floor"` among them.
        encoding_inputs: tensor. The argument of every call.
        sequence_length: int. The largest position plus one, which bounds
            how far float32 angles round.

    Raises:
        AssertionError: naming the candidate that differs.
    """
    outputs = {
        name: keras.ops.convert_to_numpy(compiled.jit(fn)(encoding_inputs))
        for name, fn in candidates.items()
    }
    largest = np.max(np.abs(outputs["floor"]))
    tolerance = FLOAT32_SUM_ERROR * max(largest, 1.0)
    if encoding.endswith("sinusoidal"):
        tolerance += FLOAT32_ANGLE_ERROR * sequence_length
    for name, output in outputs.items():
        np.testing.assert_allclose(
            output,
            outputs["floor"],
            rtol=0,
            atol=tolerance,
            err_msg=f"{encoding}: {name} and the floor disagree",
        )


def run(
    shape=SHAPE, vocabulary_size=VOCABULARY_SIZE, repeats=30, warmup=3, seed=0
):
    """Time each absolute encoding against keras-hub's and its floor.

    Args:
        shape: tuple of 3 ints. `(batch, sequence, dim)` of the embeddings;
            the token ids are `(batch, sequence)`. Defaults to
            `(8, 2048, 512)`.
        vocabulary_size: int. The number of token ids. Defaults to `32000`.
        repeats: int. Timed rounds of each encoding. Defaults to `30`.
        warmup: int. Untimed calls of each candidate first. Defaults to `3`.
        seed: int. Seed of the inputs, the token ids and the tables.
            Defaults to `0`.

    Returns:
        A dict, for each encoding `e` of `ENCODINGS`: the median seconds of
        a call under `"<e>_keras_posenc"`, `"<e>_keras_posenc_again"`,
        `"<e>_floor"` and, but for `"token_sinusoidal"`, `"<e>_keras_hub"`;
        the median over rounds of keras_posenc's time over each other's
        under `"<e>_vs_floor"`, `"<e>_vs_itself"` and, where keras-hub has
        the layer, `"<e>_vs_keras_hub"`.

    Raises:
        AssertionError: when a candidate's output differs from the floor's
            by more than float32 rounding; then they would not be doing the
            same work.
    """
    keras.utils.set_random_seed(seed)
    sequence_length = shape[1]
    inputs = compiled.normal(shape, seed)
    token_ids = keras.ops.convert_to_tensor(
        np.random.default_rng(seed).integers(vocabulary_size, size=shape[:2]),
        "int32",
    )
    results = {}
    for encoding in ENCODINGS:
        encoding_inputs = token_ids if encoding.startswith("token") else inputs
        candidates = _candidates(
            encoding, shape, vocabulary_size, inputs, token_ids
        )
        _check_agreement(encoding, candidates, encoding_inputs, sequence_length)
        seconds = timing.rounds(candidates, (encoding_inputs,), repeats, warmup)
        for name, times in seconds.items():
            results[f"{encoding}_{name}"] = statistics.median(times)
        for other in ("keras_hub", "floor", "keras_posenc_again"):
            if other in seconds:
                key = "itself" if other == "keras_posenc_again" else other
                results[f"{encoding}_vs_{key}"] = timing.paired_ratio(
                    seconds, "keras_posenc", other
                )
    return results


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
    hub_target, floor_target = TARGETS["vs_keras_hub"], TARGETS["vs_floor"]
    lines = [
        "| encoding | keras_posenc (ms) | keras-hub (ms) | floor (ms) "
        "| / keras-hub | target | met | / floor | target | met "
        "| / a second copy (noise) |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---|---:|",
    ]
    for encoding in ENCODINGS:
        # Two copies of one program time this far apart here: a ratio past
        # its target by no more than that is not told apart from meeting it.
        noise = timing.noise_band(results[f"{encoding}_vs_itself"])
        cells = [
            LABELS[encoding],
            f"{results[f'{encoding}_keras_posenc'] * 1e3:.2f}",
        ]
        if encoding in WITH_KERAS_HUB:
            ratio = results[f"{encoding}_vs_keras_hub"]
            hub_cells = [
                f"{ratio:.3f}x",
                f"<= {hub_target:.1f}x",
                timing.verdict(ratio, hub_target, noise, judged=judged),
            ]
            cells.append(f"{results[f'{encoding}_keras_hub'] * 1e3:.2f}")
        else:
            hub_cells = ["", "", ""]
            cells.append("(none)")
        ratio = results[f"{encoding}_vs_floor"]
        cells += [
            f"{results[f'{encoding}_floor'] * 1e3:.2f}",
            *hub_cells,
            f"{ratio:.3f}x",
            f"<= {floor_target:.1f}x",
            timing.verdict(ratio, floor_target, noise, judged=judged),
            f"{results[f'{encoding}_vs_itself']:.3f}x",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "keras-hub has no token embedding with a sinusoidal position. The "
        "floors: the inputs plus a precomputed constant table (sinusoidal), "
        "plus the table variable's first rows (learned); for the token "
        "embeddings, `keras.ops.take` of the token table's rows plus those.",
    ]
    return "\n".join(lines)


def describe(shape, vocabulary_size, repeats):
    """One line that says what `run` timed: shapes, XLA and rounds.

    Args:
        shape: tuple of 3 ints. `(batch, sequence, dim)`.
        vocabulary_size: int. The number of token ids.
        repeats: int. Timed rounds.

    Returns:
        A str.
    """
    return (
        f"Absolute encodings added to a {shape} float32 tensor, or to the "
        f"embeddings of {shape[:2]} token ids from a vocabulary of "
        f"{vocabulary_size}, {'under XLA' if compiled.has_programs() else 'eager'}: "
        f"median of {repeats} rounds"
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
        "absolute",
        (
            "Time the absolute encodings, under XLA where the backend has "
            "it, against keras-hub's and the bare addition of precomputed "
            "tables."
        ),
        "timed rounds of each encoding",
    )
    parser.add_argument(
        "--shape",
        type=int_at_least(1),
        nargs=3,
        default=SHAPE,
        metavar=("BATCH", "SEQUENCE", "DIM"),
        help="shape of the embeddings (default: 8 2048 512)",
    )
    parser.add_argument(
        "--vocabulary-size",
        type=int_at_least(1),
        default=VOCABULARY_SIZE,
        help=f"number of token ids (default: {VOCABULARY_SIZE})",
    )
    args = parser.parse_args(argv)
    shape = tuple(args.shape)
    results = run(shape, args.vocabulary_size, args.repeats)
    print(f"Keras {keras.__version__} on its {compiled.backend()} backend: {compiled.versions()}")
    print(describe(shape, args.vocabulary_size, args.repeats))
    print()
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
