"""The `keras-posenc` command, also `python -m keras_posenc_lab`.

`keras-posenc plot` draws the encodings to PNG files; `keras-posenc demo`
trains one small causal language model per encoding at one length and
evaluates it at longer ones (train short, test long), one small ViT per
grid encoding at one image size and evaluates it at larger ones, and one
small graph transformer per graph encoding on small graphs and evaluates it
on larger ones; `keras-posenc bench` runs the speed and memory benchmarks.

Every command runs on the backend Keras is set to (`KERAS_BACKEND`,
TensorFlow by default): TensorFlow, JAX or PyTorch. It parses its arguments
first and imports Keras and the backend's library only then, with
TensorFlow's C++ start-up logging hidden unless `--verbose`: `--help` and
`--version` answer at once. A missing extra, or a backend whose library is
not installed, is named in one line.
"""

import argparse
import contextlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys

from keras_posenc_lab import __version__
from keras_posenc_lab import config as demo_config
from keras_posenc_lab import runner
from keras_posenc_lab._arguments import int_at_least

# What each subcommand imports beyond the base install and the backend's
# library, as (module, distribution) pairs, and the extra of setup.cfg that
# installs them. Each runs on the backend Keras is set to, whose library
# comes with its own extra (`tensorflow`, `jax`, `torch`).
NEEDS = {
    "plot": ((("matplotlib", "matplotlib"),), "plot"),
    "demo": ((("matplotlib", "matplotlib"), ("sklearn", "scikit-learn")), "demo"),
    # keras-hub is the baseline of three of the benchmarks.
    "bench": ((("keras_hub", "keras-hub"),), "bench"),
    # `bench --backend torch` and `--backend jax`: the attention on their
    # own kernels, against x-transformers on PyTorch.
    "bench-torch": ((("torch", "torch"), ("x_transformers", "x-transformers")), "bench-torch"),
    "bench-jax": ((("jax", "jax"),), "jax"),
}
TASKS = ("language", "vision", "graph")
# Only the language task reads these options.
LANGUAGE_OPTIONS = ("data", "train_length", "lengths", "gpu")


def _make_parser():
    parser = argparse.ArgumentParser(
        prog="keras-posenc",
        description=(
            "Positional encodings for transformers, as Keras 3 layers on "
            "TensorFlow, JAX and PyTorch."
        ),
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {__version__}",
    )
    # Every subcommand takes it, after its name.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's C++ logging (hidden by default; on the "
        "TensorFlow backend)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    plot_parser = commands.add_parser(
        "plot",
        parents=[common],
        help="draw the sinusoidal encoding, its similarity curve and RoPE's "
        "wavelengths",
        description=(
            "Write encoding_heatmap.png, similarity.png and "
            "rope_wavelengths.png. Needs matplotlib (the `plot` extra)."
        ),
    )
    plot_parser.add_argument(
        "--length",
        type=int_at_least(1),
        default=128,
        help="number of positions (default: 128)",
    )
    plot_parser.add_argument(
        "--dim",
        type=int_at_least(1),
        default=64,
        help="encoding width (default: 64)",
    )
    plot_parser.add_argument(
        "--out", default="plots", help="output folder (default: plots)"
    )

    demo_parser = commands.add_parser(
        "demo",
        parents=[common],
        help="train small, test large: one small model per encoding, on text, "
        "on images and on graphs",
        description=(
            "Language: train the same small causal transformer with each "
            "encoding on a synthetic order-2 Markov source (or the bytes of "
            "Python's standard library, --data python-source) at one length "
            "and evaluate its negative log-likelihood per token at longer "
            "ones. Vision: train the same small ViT with each grid encoding "
            "on scikit-learn's handwritten digits at one image size and "
            "evaluate its accuracy at larger ones. Graph: train the same small "
            "graph transformer with each graph encoding to tell every node's "
            "hop distance to a marked node, on random graphs of 8 to 16 nodes, "
            "and evaluate its accuracy on larger ones. Every model is saved "
            "and reloaded, and each task writes its table (the language and "
            "vision tasks a plot too). Runs on the backend Keras is set to "
            "(KERAS_BACKEND: tensorflow, the default, jax or torch). Needs "
            "matplotlib and scikit-learn (the `demo` extra)."
        ),
    )
    demo_parser.add_argument(
        "--task",
        nargs="+",
        choices=TASKS,
        default=None,
        metavar="TASK",
        help="which experiments to run, from: "
        + ", ".join(TASKS)
        + " (default: all three, the vision and graph tasks one after the "
        "other in a second process alongside the language task; several "
        "without language run one after the other)",
    )
    demo_parser.add_argument(
        "--data",
        nargs="+",
        choices=demo_config.DATA,
        default=None,
        metavar="TEXT",
        help="the language task's texts, each in turn: markov, the synthetic "
        "source, or python-source, the bytes of the standard library's .py "
        "files (default: markov; both with --full)",
    )
    demo_parser.add_argument(
        "--out",
        default="demo-output",
        help="output folder (default: demo-output)",
    )
    demo_parser.add_argument(
        "--encodings",
        nargs="+",
        choices=list(
            dict.fromkeys(
                demo_config.ENCODINGS
                + demo_config.VISION_ENCODINGS
                + demo_config.GRAPH_ENCODINGS
            )
        ),
        default=None,
        metavar="ENCODING",
        help=(
            "encodings to train, with --task language from: "
            + ", ".join(demo_config.ENCODINGS)
            + " (rope also reports its yarn, linear and dynamic scalings); "
            "with --task vision from: "
            + ", ".join(demo_config.VISION_ENCODINGS)
            + "; with --task graph from: "
            + ", ".join(demo_config.GRAPH_ENCODINGS)
            + " (default: all, but without --full "
            + ", ".join(demo_config.FULL_ONLY)
            + " for language and "
            + ", ".join(demo_config.VISION_FULL_ONLY)
            + " for vision)"
        ),
    )
    demo_parser.add_argument(
        "--steps",
        type=int_at_least(1),
        default=None,
        help=(
            "training steps of each model (default: "
            f"{demo_config.DEFAULT.steps} for language, "
            f"{demo_config.VISION_DEFAULT.steps} for vision, "
            f"{demo_config.GRAPH_DEFAULT.steps} for graph; "
            f"{demo_config.QUICK.steps}, {demo_config.VISION_QUICK.steps} and "
            f"{demo_config.GRAPH_QUICK.steps} with --quick)"
        ),
    )
    demo_parser.add_argument(
        "--train-length",
        type=int_at_least(2),
        default=None,
        help=(
            f"training sequence length (default: {demo_config.DEFAULT.train_length}; "
            f"{demo_config.QUICK.train_length} with --quick)"
        ),
    )
    demo_parser.add_argument(
        "--lengths",
        type=int_at_least(1),
        nargs="+",
        default=None,
        metavar="LENGTH",
        help=(
            "evaluation lengths (default: "
            + " ".join(map(str, demo_config.DEFAULT.lengths))
            + "; "
            + " ".join(map(str, demo_config.QUICK.lengths))
            + " with --quick)"
        ),
    )
    demo_parser.add_argument(
        "--seed",
        type=int_at_least(0),
        default=0,
        help="seed of the Markov source and the first training seed "
        "(default: 0)",
    )
    demo_parser.add_argument(
        "--seeds",
        type=int_at_least(1),
        default=None,
        metavar="N",
        help="train each model N times, with seeds --seed to --seed + N - 1, "
        "and report the mean and the spread (default: 1)",
    )
    demo_parser.add_argument(
        "--full",
        action="store_true",
        default=None,
        help=(
            "train every encoding, also those the default run leaves out to "
            f"stay within {demo_config.DEMO_MINUTES} minutes, with "
            f"{demo_config.FULL.num_seeds} seeds; the language task on both "
            f"texts, scored up to {demo_config.FULL.lengths[-1]} tokens"
        ),
    )
    demo_parser.add_argument(
        "--gpu",
        action="store_true",
        default=None,
        help=(
            "with the language task, its setting for one GPU: trained at "
            f"{demo_config.GPU.train_length} tokens and scored up to "
            f"{demo_config.GPU.lengths[-1]}, in larger batches"
        ),
    )
    demo_parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny configurations, for tests: models of one block, trained "
        "briefly; under a minute on 2 idle cores for all three tasks",
    )

    bench_parser = commands.add_parser(
        "bench",
        parents=[common],
        help="run the speed and memory benchmarks and print their ratios",
        description=(
            "Time every layer against keras-hub, plain Keras and precomputed "
            "tables, in one process, on the backend Keras is set to "
            "(KERAS_BACKEND: tensorflow, the default, jax or torch), under "
            "XLA on TensorFlow and JAX, and measure peak memory; print one "
            "Markdown table of ratios. Needs keras-hub (the `bench` extra)."
        ),
    )
    bench_parser.add_argument(
        "--out",
        default=None,
        help="also write the tables and the machine's description to this "
        "Markdown file",
    )
    bench_parser.add_argument(
        "--repeats",
        type=int_at_least(1),
        default=30,
        help="timed rounds of each benchmark (default: 30)",
    )
    bench_parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny shapes and few rounds: checks that it runs, times nothing",
    )
    bench_parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        default=None,
        help="jax or torch: the attention of each scheme on that backend's "
        "own kernel against its best (Keras' own attention; x-transformers "
        "on PyTorch), with the peak memory of one call at (1, 8192); "
        "tensorflow: every benchmark, on TensorFlow (default: every "
        "benchmark, on the backend KERAS_BACKEND names)",
    )
    return parser


def _keras_backend():
    """The backend `KERAS_BACKEND` names, `"tensorflow"` where it is unset."""
    return os.environ.get("KERAS_BACKEND", "tensorflow")


def _missing(command, unused=()):
    """A one-line message if `command` lacks what it imports, else `None`.

    `unused`: modules of `NEEDS[command]` that this run does not import.
    """
    modules, extra = NEEDS[command]
    missing = [
        distribution
        for module, distribution in modules
        if module not in unused and importlib.util.find_spec(module) is None
    ]
    if not missing:
        return None
    # The version range from this package's own metadata, when installed.
    try:
        requirements = importlib.metadata.requires("keras-posenc") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = []
    pinned = []
    for distribution in missing:
        pin = distribution
        for line in requirements:
            requirement, _, marker = line.partition(";")
            if marker.strip() == f'extra == "{extra}"' and requirement.startswith(
                distribution
            ):
                pin = requirement.strip()
        pinned.append(f'"{pin}"')
    # The suite's extra is the same on every backend: the message says
    # which one it was asked to run on.
    on = f" on Keras' {_keras_backend()} backend" if command == "bench" else ""
    return (
        f"`keras-posenc {command.replace('bench-', 'bench --backend ')}`{on} "
        f"needs {' and '.join(missing)}, which the "
        f"`{extra}` extra installs. Install it with: pip install "
        + " ".join(pinned)
    )


@contextlib.contextmanager
def _stderr_closed():
    """Send file descriptor 2 to /dev/null: TensorFlow's C++ code writes there."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _import_backend(verbose):
    """Import Keras on its backend; a one-line message if it cannot, else `None`.

    On TensorFlow's backend TensorFlow is imported first, quietly unless
    `verbose`: its C++ start-up lines (no CUDA driver, CPU features, cuInit)
    are logged before its log level applies; `TF_CPP_MIN_LOG_LEVEL=3` hides
    the later ones. A level the user set is kept. Where the backend's
    library is not installed, the message is the library's own: which
    backend Keras chose and the line that installs it.
    """
    if _keras_backend() == "tensorflow" and importlib.util.find_spec("tensorflow"):
        quiet = not verbose and "tensorflow" not in sys.modules
        if quiet:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        with _stderr_closed() if quiet else contextlib.nullcontext():
            import tensorflow  # noqa: F401
    try:
        import keras_posenc  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def _bench_on(backend, args):
    """`keras_posenc_lab.bench.backends` under `backend`, in a process of its own.

    Keras reads its backend once, at import: the benchmark runs in a fresh
    interpreter with `KERAS_BACKEND` set. Its tables go to the terminal,
    and to `--out` as well.
    """
    arguments = ["--rounds", str(args.repeats), "--memory", "--flash"]
    if args.tiny:
        arguments = ["--rounds", "1", "--batch", "1", "--length", "64", "--memory",
                     "--memory-length", "128"]
    result = subprocess.run(
        [sys.executable, "-m", "keras_posenc_lab.bench.backends", *arguments],
        env=dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
        stdout=subprocess.PIPE,
        text=True,
    )
    print(result.stdout, end="")
    if args.out is not None and result.returncode == 0:
        with open(args.out, "w") as out:
            out.write(result.stdout)
    return result.returncode


def main(argv=None):
    """Run the `keras-posenc` command.

    Args:
        argv: list of str or None. The arguments after the program name.
            Defaults to `None`, meaning `sys.argv[1:]`.

    Returns:
        The exit status, `0` on success, `1` when the subcommand needs an
        extra, or the library of the backend Keras is set to, that is not
        installed (with a one-line message naming it). Bad arguments exit
        with status 2 and a one-line message.
    """
    parser = _make_parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        configs = _demo_configs(parser, args)
    if (
        args.command == "bench"
        and args.backend == "tensorflow"
        and _keras_backend() != "tensorflow"
    ):
        parser.error(
            "`--backend tensorflow` runs every benchmark on TensorFlow, but "
            f"KERAS_BACKEND={_keras_backend()}: unset it, or leave out "
            f"--backend to run them on {_keras_backend()}."
        )
    needs = args.command
    if args.command == "bench" and args.backend in ("jax", "torch"):
        needs = f"bench-{args.backend}"
    # Only the vision task reads scikit-learn's digits.
    unused = ("sklearn",) if args.command == "demo" and "vision" not in configs else ()
    message = _missing(needs, unused)
    if message is not None:
        print(f"keras-posenc: error: {message}", file=sys.stderr)
        return 1
    side = None
    if args.command == "demo":
        runner.set_threads(configs)
        # The second process, where there is one, imports its backend
        # while this one does.
        side = runner.start(configs, args)
    if args.command == "bench" and args.backend in ("jax", "torch"):
        return _bench_on(args.backend, args)
    imported = False
    try:
        message = _import_backend(args.verbose)
        imported = message is None
    finally:
        # A failed or interrupted import ends the second process too.
        if side is not None and not imported:
            side.stop()
    if message is not None:
        print(f"keras-posenc: error: {message}", file=sys.stderr)
        return 1
    if args.command == "plot":
        from keras_posenc import plot

        for path in plot.save_plots(args.out, args.length, args.dim):
            print(path)
        return 0
    if args.command == "bench":
        from keras_posenc_lab.bench import suite

        return suite.run(out=args.out, repeats=args.repeats, tiny=args.tiny)
    return runner.run(configs, args, side)


def _demo_configs(parser, args):
    """`{task: config}` from the demo's arguments; bad ones exit via `parser`.

    The tasks come in the order of `TASKS` (language first), each once.
    """
    tasks = TASKS if args.task is None else tuple(
        task for task in TASKS if task in args.task
    )
    task_text = " ".join(tasks)
    if args.encodings is not None and len(tasks) > 1:
        parser.error(
            "`--encodings` names the encodings of one task: add --task "
            f"language, --task vision or --task graph. Received: --encodings "
            f"{' '.join(args.encodings)}"
        )
    if "language" not in tasks:
        for name in LANGUAGE_OPTIONS:
            if getattr(args, name) is not None:
                option = "--" + name.replace("_", "-")
                parser.error(
                    f"`{option}` applies to the language task, not to --task "
                    f"{task_text}."
                )
    configs = {}
    try:
        if "language" in tasks:
            config = demo_config.language_config(args.quick, args.full, args.gpu)
            configs["language"] = config.replace(
                encodings=args.encodings,
                data=args.data,
                steps=args.steps,
                train_length=args.train_length,
                lengths=args.lengths,
                seed=args.seed,
                num_seeds=args.seeds,
            )
        if "vision" in tasks:
            config = demo_config.vision_config(args.quick, args.full)
            configs["vision"] = config.replace(
                encodings=args.encodings,
                steps=args.steps,
                seed=args.seed,
                num_seeds=args.seeds,
            )
        if "graph" in tasks:
            config = demo_config.graph_config(args.quick, args.full)
            configs["graph"] = config.replace(
                encodings=args.encodings,
                steps=args.steps,
                seed=args.seed,
                num_seeds=args.seeds,
            )
    except ValueError as error:
        parser.error(str(error))
    return configs
