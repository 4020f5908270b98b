"""Timing shared by the benchmarks: medians of XLA-compiled calls.

Every candidate is compiled with XLA on the backend `KERAS_BACKEND` names
(`compiled.jit`: `tf.function(jit_compile=True)` or `jax.jit`; PyTorch's
run as they are) and returns its whole output, so XLA computes all of it;
each call is timed until that output is ready. The candidates run in rounds, in a new order each round, so
the noise of a busy machine falls on all of them alike.
"""

import argparse
import random
import statistics
import time

from keras_posenc_lab._arguments import int_at_least
from keras_posenc_lab.bench import compiled as backend_programs

_wait_for = backend_programs.wait_for


def rounds(candidates, args, repeats=30, warmup=3):
    """Seconds of each candidate's call, round by round, on the same arguments.

    Args:
        candidates: dict of str to callable. Functions of tensors, each
            compiled here with XLA (`compiled.jit`).
        args: tuple. The positional arguments of every call.
        repeats: int. Timed rounds; each calls every candidate once.
            Defaults to `30`.
        warmup: int. Untimed calls of each candidate first, the first of
            which traces and compiles it. Defaults to `3`.

    Returns:
        A dict of the same names to lists of `repeats` wall-clock seconds,
        entry `i` of every list from round `i`.
    """
    if repeats < 1:
        raise ValueError(
            f"`repeats` must be at least 1. Received: repeats={repeats}"
        )
    compiled = {name: backend_programs.jit(fn) for name, fn in candidates.items()}
    names = list(compiled)
    for _ in range(warmup):
        for name in names:
            _wait_for(compiled[name](*args))
    seconds = {name: [] for name in names}
    # Each round runs the candidates in a new order: in a fixed cycle each
    # would always follow the same one, and inherit its caches and clocks.
    order = random.Random(0)
    for _ in range(repeats):
        for name in order.sample(names, len(names)):
            start = time.perf_counter()
            _wait_for(compiled[name](*args))
            seconds[name].append(time.perf_counter() - start)
    return seconds


def compare(candidates, args, repeats=30, warmup=3):
    """Median seconds of each candidate's call on the same arguments.

    Args:
        candidates: dict of str to callable, as for `rounds`.
        args: tuple. The positional arguments of every call.
        repeats: int. Timed calls of each candidate. Defaults to `30`.
        warmup: int. Untimed calls of each candidate first. Defaults to `3`.

    Returns:
        A dict of the same names to the median wall-clock seconds of a call.
    """
    seconds = rounds(candidates, args, repeats, warmup)
    return {name: statistics.median(times) for name, times in seconds.items()}


def paired_ratio(seconds, numerator, denominator):
    """The median over rounds of one candidate's time over another's.

    Two calls of one round ran moments apart, under the same load, so their
    ratio is steadier than the ratio of two medians on a shared machine.

    Args:
        seconds: dict of str to lists, as `rounds` returns.
        numerator: str. A candidate's name.
        denominator: str. Another candidate's name.

    Returns:
        A float.
    """
    return statistics.median(
        mine / theirs
        for mine, theirs in zip(seconds[numerator], seconds[denominator])
    )


def median_time(fn, *args, repeats=30, warmup=3):
    """Median seconds of a call of `fn(*args)` compiled with XLA.

    Args:
        fn: callable. A function of tensors.
        *args: its positional arguments.
        repeats: int. Timed calls. Defaults to `30`.
        warmup: int. Untimed calls first. Defaults to `3`.

    Returns:
        The median wall-clock seconds of a call, a float.
    """
    return compare({"fn": fn}, args, repeats, warmup)["fn"]


def verdict(ratio, target, noise=1.0, judged=True):
    """Whether a ratio meets its target: "yes", "within noise" or "no".

    Args:
        ratio: float. A measured time or memory ratio.
        target: float. The most it may be.
        noise: float. How far apart two copies of one program measure here
            (1.0 or more): a ratio past the target by no more than that is
            not told apart from meeting it. Defaults to `1.0`.
        judged: bool. `False` for a ratio measured at sizes too small to
            mean anything (the tiny run): no verdict, "tiny run". Defaults
            to `True`.

    Returns:
        A str.
    """
    if not judged:
        return "tiny run"
    if ratio <= target:
        return "yes"
    if ratio <= target * noise:
        return "within noise"
    return "no"


def noise_band(self_ratio):
    """The noise factor of `verdict` from a candidate timed against its copy."""
    return max(self_ratio, 1 / self_ratio)


def argument_parser(module, description, repeats_help="timed rounds"):
    """The argument parser of `python -m keras_posenc_lab.bench.<module>`.

    Every benchmark takes `--repeats`, a positive number of timed rounds
    (default 30); the caller adds its own sizes.

    Args:
        module: str. The benchmark's module in `keras_posenc.bench`.
        description: str. What the benchmark times, for `--help`.
        repeats_help: str. What `--repeats` counts. Defaults to
            `"timed rounds"`.

    Returns:
        An `argparse.ArgumentParser`.
    """
    parser = argparse.ArgumentParser(
        prog=f"python -m keras_posenc_lab.bench.{module}", description=description
    )
    parser.add_argument(
        "--repeats",
        type=int_at_least(1),
        default=30,
        help=f"{repeats_help} (default: 30)",
    )
    return parser

