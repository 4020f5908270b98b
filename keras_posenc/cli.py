"""The `keras-posenc` command.

`keras-posenc plot` draws the encodings to PNG files; `keras-posenc demo`
trains one small causal language model per encoding at one length and
evaluates it at longer ones (train short, test long); `keras-posenc bench`
runs the speed and memory benchmarks.
"""

import argparse

from keras_posenc import demo


def int_at_least(minimum):
    """An argparse `type` that accepts integers of at least `minimum`.

    Args:
        minimum: int. The smallest value accepted.

    Returns:
        A function of the argument's text that returns its value, or raises
        `argparse.ArgumentTypeError` with a one-line reason.
    """

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be an integer of at least {minimum}. Received: {text!r}"
            )
        return value

    return parse


def _make_parser():
    parser = argparse.ArgumentParser(
        prog="keras-posenc",
        description="Positional encodings for Keras 3 on TensorFlow.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    plot_parser = commands.add_parser(
        "plot",
        help="draw the sinusoidal encoding and its similarity curve",
        description="Write encoding_heatmap.png and similarity.png.",
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
        help="train short, test long: one small language model per encoding",
        description=(
            "Train the same small causal transformer with each encoding on "
            "a synthetic order-2 Markov source at one length, evaluate its "
            "negative log-likelihood per token at longer ones, save and "
            "reload every model, and write the table and the plot."
        ),
    )
    demo_parser.add_argument(
        "--out",
        default="demo-output",
        help="output folder (default: demo-output)",
    )
    demo_parser.add_argument(
        "--encodings",
        nargs="+",
        choices=demo.ENCODINGS,
        default=None,
        metavar="ENCODING",
        help=(
            "encodings to train, from: " + ", ".join(demo.ENCODINGS)
            + " (default: all; rope also reports its yarn, linear and "
            "dynamic scalings)"
        ),
    )
    demo_parser.add_argument(
        "--steps",
        type=int_at_least(1),
        default=None,
        help=(
            f"training steps of each model (default: {demo.DEFAULT.steps}; "
            f"{demo.QUICK.steps} with --quick)"
        ),
    )
    demo_parser.add_argument(
        "--train-length",
        type=int_at_least(2),
        default=None,
        help=(
            f"training sequence length (default: {demo.DEFAULT.train_length}; "
            f"{demo.QUICK.train_length} with --quick)"
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
            + " ".join(map(str, demo.DEFAULT.lengths))
            + "; "
            + " ".join(map(str, demo.QUICK.lengths))
            + " with --quick)"
        ),
    )
    demo_parser.add_argument(
        "--seed",
        type=int_at_least(0),
        default=0,
        help="seed of the source, the data and the weights (default: 0)",
    )
    demo_parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny configuration, for tests: about a minute on 2 cores",
    )

    bench_parser = commands.add_parser(
        "bench",
        help="run the speed and memory benchmarks and print their ratios",
        description=(
            "Time every layer under XLA against keras-hub, plain Keras and "
            "precomputed tables, in one process, and measure peak memory; "
            "print one Markdown table of ratios."
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
    return parser


def main(argv=None):
    """Run the `keras-posenc` command.

    Args:
        argv: list of str or None. The arguments after the program name.
            Defaults to `None`, meaning `sys.argv[1:]`.

    Returns:
        The exit status, `0` on success. Bad arguments exit with status 2
        and a one-line message.
    """
    parser = _make_parser()
    args = parser.parse_args(argv)
    # Imported on use: `plot` needs matplotlib (the `plot` extra), `bench`
    # keras-hub; `--help` and bad arguments need neither.
    if args.command == "plot":
        from keras_posenc import plot

        for path in plot.save_plots(args.out, args.length, args.dim):
            print(path)
        return 0
    if args.command == "bench":
        from benchmarks import suite

        return suite.run(out=args.out, repeats=args.repeats, tiny=args.tiny)
    config = demo.QUICK if args.quick else demo.DEFAULT
    try:
        config = config.replace(
            encodings=args.encodings,
            steps=args.steps,
            train_length=args.train_length,
            lengths=args.lengths,
            seed=args.seed,
        )
    except ValueError as error:
        parser.error(str(error))
    return demo.run(config, args.out)
