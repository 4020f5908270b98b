"""Argument types shared by the `keras-posenc` command and the benchmarks."""

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
