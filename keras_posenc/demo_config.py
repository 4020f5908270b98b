"""What the demo trains and evaluates: its encodings and configurations.

Plain Python, apart from `keras_posenc.demo`, which imports TensorFlow: the
`keras-posenc` command reads these for its `--help` without importing it.
"""

import dataclasses

ENCODINGS = ("none", "sinusoidal", "learned", "rope", "alibi", "shaw", "t5")
# RoPE schedules applied to the trained RoPE model at evaluation time, with
# no retraining: each extends the trained length to the evaluated one.
ROPE_SCALINGS = ("yarn", "linear", "dynamic")


@dataclasses.dataclass(frozen=True)
class Config:
    """What the demo trains and evaluates.

    Args:
        encodings: tuple of str. Encodings to train, from `ENCODINGS`.
        steps: int. Training steps of each model.
        batch_size: int. Sequences per training step.
        train_length: int. Tokens per training sequence.
        lengths: tuple of int. Evaluation lengths, ascending.
        evaluation_tokens: int. Target tokens scored at every evaluation
            length; the same tokens at each.
        seed: int. Seed of the source, the data and the weights.
        jit_compile: bool. Whether training runs under XLA. Evaluation
            calls the models eagerly either way: a few calls per shape,
            where tracing and compiling would cost more than they save.
    """

    encodings: tuple = ENCODINGS
    steps: int = 1000
    batch_size: int = 32
    train_length: int = 64
    lengths: tuple = (64, 128, 256, 512)
    evaluation_tokens: int = 32768
    seed: int = 0
    jit_compile: bool = True

    def replace(self, **changes):
        """A copy with the changes that are not `None`, checked.

        Args:
            **changes: fields of `Config`; a `None` value keeps the field.

        Returns:
            A new `Config`.

        Raises:
            ValueError: when an encoding is unknown, or when an evaluation
                length is shorter than the training length.
        """
        changes = {name: value for name, value in changes.items() if value is not None}
        if "encodings" in changes:
            # In the order given, each once.
            changes["encodings"] = tuple(dict.fromkeys(changes["encodings"]))
            unknown = [name for name in changes["encodings"] if name not in ENCODINGS]
            if unknown:
                raise ValueError(
                    f"`encodings` must be among {', '.join(ENCODINGS)}. "
                    f"Received: encodings={list(changes['encodings'])}"
                )
        if "lengths" in changes:
            changes["lengths"] = tuple(sorted(set(changes["lengths"])))
        config = dataclasses.replace(self, **changes)
        if config.lengths[0] < config.train_length:
            raise ValueError(
                "`lengths` must each be at least the training length "
                f"{config.train_length}: the demo tests longer, not shorter. "
                f"Received: lengths={list(config.lengths)}"
            )
        return config


DEFAULT = Config()
QUICK = Config(
    steps=40,
    batch_size=16,
    train_length=16,
    lengths=(16, 32, 64),
    evaluation_tokens=1024,
    jit_compile=False,
)
