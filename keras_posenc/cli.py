"""The `keras-posenc` command.

`keras-posenc plot` draws the sinusoidal encoding to PNG files;
`keras-posenc demo` trains a small transformer with and without it on a task
that only positions can solve, saves and reloads the trained model, and draws
the plots.
"""

import argparse


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
        help="train with and without the encoding on an order task",
        description=(
            "Train a one-block transformer to tell whether token A comes "
            "before token B, with and without SinusoidalPositionEncoding; "
            "save, reload and check the model; write the plots."
        ),
    )
    demo_parser.add_argument(
        "--out",
        default="demo-output",
        help="output folder (default: demo-output)",
    )
    demo_parser.add_argument(
        "--epochs",
        type=int_at_least(1),
        default=10,
        help="training epochs of each model (default: 10)",
    )
    demo_parser.add_argument(
        "--seed",
        type=int_at_least(0),
        default=0,
        help="seed of the data and the weights (default: 0)",
    )
    demo_parser.add_argument(
        "--samples",
        type=int_at_least(1),
        default=8000,
        help="number of training sequences (default: 8000)",
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
    args = _make_parser().parse_args(argv)
    # Imported on use: both need matplotlib (the `plot` extra); `--help` and
    # bad arguments do not.
    if args.command == "plot":
        from keras_posenc import plot

        for path in plot.save_plots(args.out, args.length, args.dim):
            print(path)
        return 0
    from keras_posenc import demo

    return demo.run(args.out, args.epochs, args.seed, args.samples)
