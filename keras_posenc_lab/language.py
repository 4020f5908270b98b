"""Train short, test long: one small language model per position encoding.

The experiment of Press et al. 2022 (Table 2), shrunk to run on a CPU in
minutes. A synthetic source emits sequences over `VOCABULARY_SIZE` symbols,
each drawn from a distribution that depends on the two symbols before it (an
order-2 Markov chain with a random transition table from a fixed seed). Its
entropy rate is the lowest mean negative log-likelihood per token that any
model can reach. The same small pre-norm causal transformer is trained with
each encoding on sequences of one length, then its mean negative
log-likelihood per token is measured on longer ones. Predicting the next
symbol needs exactly the last two, at relative distances 0 and 1, so a model
whose notion of position carries over to unseen lengths stays at the floor;
one that learned absolute positions, or relative ones only up to the
trained length, does not.

With `data="python-source"` the text is real instead: the bytes of the
Python standard library's own source files, which every Python installation
has (see `PythonSource`). It has no known floor.

Every trained model is saved to `.keras`, reloaded with `safe_mode=True` and
checked to predict bit-identically before the reloaded model is evaluated.
The training speed of each encoding, in tokens per second, is measured on
the same shapes in the same process, in interleaved rounds after training,
next to Press et al.'s Table 1.
"""

import math
import os
import sys
import sysconfig
import time

import keras
import numpy as np

import keras_posenc
from keras_posenc_lab import encodings
from keras_posenc_lab import training
from keras_posenc_lab.config import DEFAULT
from keras_posenc_lab.config import DEMO_ENCODINGS
from keras_posenc_lab.config import ENCODINGS
from keras_posenc_lab.config import FULL_ONLY
from keras_posenc_lab.config import ROPE_SCALINGS

VOCABULARY_SIZE = 16
# The Dirichlet concentration of each row of the transition table: small
# values make peaked rows, so the two previous symbols matter.
CONCENTRATION = 0.3
WIDTH = 64
NUM_HEADS = 4
FEED_FORWARD_DIM = 256
NUM_LAYERS = DEFAULT.num_layers
STEPS_PER_EXECUTION = 20
# The most an encoding's negative log-likelihood may rise from the trained
# length for it to hold at a longer one; what Press et al. found of ALiBi.
HOLD_TOLERANCE = 0.05
# The multiples of the trained length at which the findings say which
# encodings hold: Press et al. scored up to 30x (15,512 tokens after 512).
HOLD_MULTIPLES = (8, 16, 32)
# Press et al. 2022, Table 1: training words per second of their 247M
# language model on a V100, by encoding.
PRESS_WORDS_PER_SECOND = {
    "sinusoidal": 28.5e3,
    "rope": 20.0e3,
    "t5": 14.4e3,
    "alibi": 28.3e3,
}
# One file in this many of the sorted standard library is held out for
# evaluation.
HELD_OUT_EVERY = 10
BYTE_VOCABULARY_SIZE = 256
# The random stream of the evaluation tokens, `[seed, EVALUATION_STREAM]`,
# apart from each encoding's training stream, `[seed, stream]`. Fixed when
# the encodings were the first seven, so that an encoding added later
# changes no other row: its training stream skips this one.
EVALUATION_STREAM = 7


def _training_stream(encoding):
    """The stream of `encoding`'s training sequences: its index, past 7 one more."""
    index = ENCODINGS.index(encoding)
    return index if index < EVALUATION_STREAM else index + 1


class MarkovSource:
    """An order-2 Markov chain over `VOCABULARY_SIZE` symbols.

    Args:
        seed: int. Seed of the transition table.

    Attributes:
        transitions: float64 array `(vocab, vocab, vocab)`: entry `[a, b, c]`
            is the probability of `c` after `a, b`.
        pair_probabilities: float64 array `(vocab, vocab)`, the stationary
            distribution of consecutive pairs, where sequences start.
        entropy_rate: float. Nats per symbol: the stationary mean of the
            entropy of the next symbol given the previous two.
    """

    vocabulary_size = VOCABULARY_SIZE

    def __init__(self, seed):
        self.seed = seed
        rng = np.random.default_rng(seed)
        vocab = VOCABULARY_SIZE
        self.transitions = rng.dirichlet(
            np.full(vocab, CONCENTRATION), size=(vocab, vocab)
        )  # (a, b, c)
        # The chain on pairs: (a, b) -> (b, c) with probability P(c | a, b).
        pair_chain = np.zeros((vocab * vocab, vocab * vocab))
        for a in range(vocab):
            for b in range(vocab):
                pair_chain[a * vocab + b, b * vocab : (b + 1) * vocab] = (
                    self.transitions[a, b]
                )
        eigenvalues, eigenvectors = np.linalg.eig(pair_chain.T)
        stationary = np.real(eigenvectors[:, np.argmax(np.real(eigenvalues))])
        self.pair_probabilities = (stationary / stationary.sum()).reshape(
            vocab, vocab
        )
        with np.errstate(divide="ignore", invalid="ignore"):
            surprise = np.where(
                self.transitions > 0, -np.log(self.transitions), 0.0
            )
        conditional_entropy = np.sum(self.transitions * surprise, axis=-1)
        self.entropy_rate = float(
            np.sum(self.pair_probabilities * conditional_entropy)
        )

    def sample(self, num_sequences, length, rng):
        """Sequences from the stationary chain.

        Args:
            num_sequences: int. How many.
            length: int. Symbols in each, at least 2.
            rng: `numpy.random.Generator`.

        Returns:
            int32 array `(num_sequences, length)`.
        """
        vocab = VOCABULARY_SIZE
        symbols = np.empty((num_sequences, length), np.int32)
        first_pairs = rng.choice(
            vocab * vocab, size=num_sequences, p=self.pair_probabilities.ravel()
        )
        symbols[:, 0], symbols[:, 1] = np.divmod(first_pairs, vocab)
        cumulative = np.cumsum(self.transitions, axis=-1)  # (a, b, c)
        for t in range(2, length):
            rows = cumulative[symbols[:, t - 2], symbols[:, t - 1]]  # (n, vocab)
            draws = rng.random((num_sequences, 1))
            # The first symbol whose cumulative probability passes the draw;
            # `minimum` guards against a last sum rounded below 1.
            symbols[:, t] = np.minimum((rows < draws).sum(axis=-1), vocab - 1)
        return symbols

    def describe(self):
        """One line: what the source is and its floor."""
        return (
            f"Source: an order-2 Markov chain over {VOCABULARY_SIZE} symbols "
            f"(seed {self.seed}); "
            "its entropy rate, the floor of any model's loss, is "
            f"{self.entropy_rate:.3f} nats per symbol."
        )

    def evaluation_stream(self, rows, width, rng):
        """`rows` sequences of `width` symbols, as `sample`."""
        return self.sample(rows, width, rng)


class PythonSource:
    """Real text: the bytes of the Python standard library's source files.

    The `.py` files at the top of the standard library's folder
    (`sysconfig.get_paths()["stdlib"]`, about 170 files and 4.7 MB in
    Python 3.11), sorted by name; every `HELD_OUT_EVERY`-th of them is held
    out for evaluation, the rest trained on. Each split is the
    concatenation of its files' bytes, and a byte is a token: a vocabulary
    of 256, no tokenizer. Its entropy rate is unknown: `entropy_rate` is
    `None`.

    Args:
        directory: str or None. Where the `.py` files are; `None` for the
            running Python's standard library. Defaults to `None`.

    Attributes:
        train_files: list of str. The file names trained on.
        test_files: list of str. The file names held out.
        train_bytes: int32 array of the training text.
        test_bytes: int32 array of the held-out text.
    """

    vocabulary_size = BYTE_VOCABULARY_SIZE
    entropy_rate = None

    def __init__(self, directory=None):
        if directory is None:
            directory = sysconfig.get_paths()["stdlib"]
        self.directory = directory
        names = sorted(
            name
            for name in os.listdir(directory)
            if name.endswith(".py") and os.path.isfile(os.path.join(directory, name))
        )
        self.test_files = names[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY]
        held_out = set(self.test_files)
        self.train_files = [name for name in names if name not in held_out]
        self.train_bytes = self._read(self.train_files)
        self.test_bytes = self._read(self.test_files)

    def _read(self, names):
        chunks = []
        for name in names:
            with open(os.path.join(self.directory, name), "rb") as file:
                chunks.append(file.read())
        return np.frombuffer(b"".join(chunks), dtype=np.uint8).astype(np.int32)

    def describe(self):
        """One line: what the text is and how large."""
        return (
            f"Text: the {len(self.train_files) + len(self.test_files)} .py "
            f"files at the top of {self.directory}, as bytes (a vocabulary of "
            f"{self.vocabulary_size}); {len(self.train_files)} files, "
            f"{len(self.train_bytes) / 1e6:.2f} MB, trained on; every "
            f"{HELD_OUT_EVERY}th, {len(self.test_files)} files, "
            f"{len(self.test_bytes) / 1e6:.2f} MB, held out."
        )

    def sample(self, num_sequences, length, rng):
        """Training sequences from random places of the training text.

        Args:
            num_sequences: int. How many.
            length: int. Bytes in each.
            rng: `numpy.random.Generator`.

        Returns:
            int32 array `(num_sequences, length)`.
        """
        starts = rng.integers(
            0, len(self.train_bytes) - length + 1, size=num_sequences
        )  # (num_sequences,)
        return self.train_bytes[starts[:, None] + np.arange(length)]

    def evaluation_stream(self, rows, width, rng=None):
        """`rows` runs of the held-out text, evenly spaced through it.

        Args:
            rows: int. How many.
            width: int. Bytes in each, at most the held-out text over `rows`.
            rng: unused; the held-out runs are fixed.

        Returns:
            int32 array `(rows, width)`.
        """
        spacing = len(self.test_bytes) // rows
        if spacing < width:
            raise ValueError(
                f"The held-out text has {len(self.test_bytes)} bytes, too few "
                f"for {rows} runs of {width}: evaluate fewer tokens. Received: "
                f"rows={rows}, width={width}"
            )
        starts = np.arange(rows) * spacing  # (rows,)
        return self.test_bytes[starts[:, None] + np.arange(width)]


def build_model(
    encoding,
    train_length,
    scaling=None,
    jit_compile=False,
    vocabulary_size=VOCABULARY_SIZE,
    num_layers=NUM_LAYERS,
):
    """The pre-norm causal transformer language model with one encoding.

    Args:
        encoding: str. One of `ENCODINGS`: `"sinusoidal"` and `"learned"`
            add to the token embeddings; `"rope"`, `"alibi"`, `"shaw"` and
            `"t5"` act in every attention layer; `"none"` adds nothing.
        train_length: int. The trained length: the learned table's, and
            the one the registry's lengths that scale with it are set for
            (xPos's scale base, CoPE's rows, the temperature's floor).
        scaling: dict or None. The RoPE scaling of `"rope"`. Defaults to
            `None`.
        jit_compile: bool. Whether `fit` runs under XLA on TensorFlow,
            with `STEPS_PER_EXECUTION` training steps per call (on JAX it
            always does, on PyTorch never: `training.compiled`). Defaults
            to `False`.
        vocabulary_size: int. Token ids run from 0 to this less one.
            Defaults to `VOCABULARY_SIZE`, the Markov source's.
        num_layers: int. Transformer blocks. Defaults to `NUM_LAYERS`.

    Returns:
        A compiled functional `keras.Model` from int32 token ids
        `(batch, seq)` to next-token logits `(batch, seq, vocab)`.
    """
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocabulary_size, WIDTH)(token_ids)  # (b, seq, width)
    embedding = encodings.build(
        "language",
        encoding,
        role="embeddings",
        sequence_length=train_length,
        train_length=train_length,
    )
    if embedding is not None:
        x = embedding(x)
    for _ in range(num_layers):
        normed = keras.layers.LayerNormalization()(x)
        attention = keras_posenc.PositionalMultiHeadAttention(
            NUM_HEADS,
            WIDTH // NUM_HEADS,
            position=encodings.build(
                "language",
                encoding,
                role="attention",
                num_heads=NUM_HEADS,
                train_length=train_length,
                **({} if scaling is None else {"scaling": scaling}),
            ),
        )
        x = x + attention(normed, normed, use_causal_mask=True)
        normed = keras.layers.LayerNormalization()(x)
        hidden = keras.layers.Dense(FEED_FORWARD_DIM, activation="gelu")(
            normed
        )  # (b, seq, feed_forward)
        x = x + keras.layers.Dense(WIDTH)(hidden)  # (b, seq, width)
    x = keras.layers.LayerNormalization()(x)
    logits = keras.layers.Dense(vocabulary_size)(x)  # (b, seq, vocab)
    model = keras.Model(token_ids, logits, name=f"lm_{encoding}")
    return training.compiled(model, jit_compile, STEPS_PER_EXECUTION)


def rope_scaling(schedule, length, train_length):
    """The scaling dict of a RoPE schedule extending `train_length` to `length`.

    Args:
        schedule: str. One of `ROPE_SCALINGS`.
        length: int. The evaluated length.
        train_length: int. The trained length.

    Returns:
        A dict in Hugging Face's `rope_scaling` form. `linear` and `yarn`
        take the factor `length / train_length`; `dynamic` grows its base
        with the length it sees, from factor 1.
    """
    factor = float(length) / train_length
    if schedule == "linear":
        return {"rope_type": "linear", "factor": factor}
    return {
        "rope_type": schedule,
        "factor": 1.0 if schedule == "dynamic" else factor,
        "original_max_position_embeddings": train_length,
    }


def mean_nll(model, windows, batch_tokens=DEFAULT.evaluation_batch_tokens):
    """Mean negative log-likelihood per token, in nats.

    Args:
        model: `keras.Model` from token ids to next-token logits.
        windows: int32 array `(n, length + 1)`: the model reads the first
            `length` symbols of each and is scored on the last `length`.
        batch_tokens: int. Tokens per call: the model reads
            `batch_tokens // length` windows at a time, at least one.
            Defaults to `Config.evaluation_batch_tokens`'s default.

    Returns:
        A float.
    """
    batch_size = max(1, batch_tokens // (windows.shape[1] - 1))
    losses = []
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]  # (batch, length + 1)
        logits = training.predict(model, batch[:, :-1]).astype(
            "float64"
        )  # (batch, length, vocab)
        peak = logits.max(axis=-1, keepdims=True)  # (batch, length, 1)
        log_normalizer = peak[..., 0] + np.log(
            np.exp(logits - peak).sum(axis=-1)
        )  # (batch, length)
        target_logits = np.take_along_axis(
            logits, batch[:, 1:, None], axis=-1
        )[..., 0]  # (batch, length)
        losses.append(log_normalizer - target_logits)
    return float(np.mean(np.concatenate(losses, axis=0)))


def evaluation_windows(stream, length):
    """Cut every row of `stream` into windows of `length` targets each.

    Args:
        stream: int32 array `(rows, longest + 1)`.
        length: int. Targets per window, at most `longest`.

    Returns:
        int32 array `(rows * (longest // length), length + 1)`: consecutive
        windows overlapping by one symbol, the last of one being the first
        of the next, so every length scores the same targets.
    """
    per_row = (stream.shape[1] - 1) // length
    starts = np.arange(per_row) * length  # (per_row,)
    offsets = np.arange(length + 1)  # (length + 1,)
    windows = stream[:, starts[:, None] + offsets]  # (rows, per_row, length + 1)
    return windows.reshape(-1, length + 1)


class CallTimes(keras.callbacks.Callback):
    """The duration of each call of the compiled training function.

    Keras calls `on_train_batch_begin` and `on_train_batch_end` around each
    call (`steps_per_execution` steps), so the time between them is the
    call's alone, without `fit`'s own work before and after.
    """

    def __init__(self):
        super().__init__()
        self.durations = []
        self._began = None

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.durations.append(time.perf_counter() - self._began)


def training_speeds(models, inputs, targets, batch_size, rounds=DEFAULT.speed_rounds):
    """Training tokens per second of each model, timed in interleaved rounds.

    Each model trained already, so its training function is traced (and
    compiled under XLA) and each call is timed alone. Still, each model
    first runs one call untimed: on TensorFlow a model's training function
    is traced again on its first call after another model's training
    reseeded the global generator (`keras.utils.set_random_seed`), whose
    seed is part of what a traced function is kept under. In every round
    each model runs one call, `steps_per_execution` steps, the order
    turning by one model a round; a model's speed comes from the median of
    its rounds. Run one after another on a shared machine, models trained
    minutes apart differ by 30% from the machine alone; seconds apart, they
    share its state.

    Args:
        models: dict from name to a trained, compiled `keras.Model`, all
            taking `inputs` and `targets`. They train on: use copies that
            are done with.
        inputs: int32 array `(examples, length)`, at least one call's worth
            of rows.
        targets: array `(examples, length)`.
        batch_size: int. Rows per step.
        rounds: int. Calls timed per model. Defaults to
            `Config.speed_rounds`'s default.

    Returns:
        A dict from name to tokens (positions of `inputs`) per second.
    """
    names = list(models)
    durations = {name: [] for name in names}
    # Steps in one call: all of `inputs` if it holds fewer.
    steps = {
        name: min(model.steps_per_execution or 1, len(inputs) // batch_size)
        for name, model in models.items()
    }

    def call(name, callbacks=()):
        rows = steps[name] * batch_size
        models[name].fit(
            inputs[:rows],
            targets[:rows],
            batch_size=batch_size,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=list(callbacks),
        )

    for name in names:
        call(name)
    for round_number in range(rounds):
        turn = round_number % len(names)
        for name in names[turn:] + names[:turn]:
            timer = CallTimes()
            call(name, [timer])
            durations[name].extend(timer.durations)
    return {
        name: steps[name] * batch_size * inputs.shape[1] / float(np.median(durations[name]))
        for name in names
    }


def _train(encoding, config, source, out_dir, label, seed, prefix):
    """Train, save, reload and check one model.

    Its file is `<prefix>_<encoding>.keras` in `out_dir`, with `_seed<seed>`
    before the suffix when the run has several seeds.

    Returns:
        The trained model, the reloaded one, and the training sequences.
    """
    rng = np.random.default_rng([seed, _training_stream(encoding)])
    sequences = source.sample(
        config.steps * config.batch_size, config.train_length + 1, rng
    )  # (steps * batch, train_length + 1)
    keras.utils.set_random_seed(seed)
    model = build_model(
        encoding,
        config.train_length,
        jit_compile=config.jit_compile,
        vocabulary_size=source.vocabulary_size,
        num_layers=config.num_layers,
    )
    training.fit(
        model,
        sequences[:, :-1],
        sequences[:, 1:],
        config.batch_size,
        f"{label} Training with {encoding}",
    )
    suffix = f"_seed{seed}" if config.num_seeds > 1 else ""
    path = os.path.join(out_dir, f"{prefix}_{encoding}{suffix}.keras")
    reloaded = training.save_and_reload(model, path, [sequences[: config.batch_size, :-1]])
    return model, reloaded, sequences


def _evaluate(model, encoding, config, stream):
    """`{length: nll or None}` of `model`, `None` where undefined."""
    scores = {}
    for length in config.lengths:
        if encoding == "learned" and length > config.train_length:
            scores[length] = None  # The table has no rows past its length.
        else:
            scores[length] = mean_nll(
                model,
                evaluation_windows(stream, length),
                config.evaluation_batch_tokens,
            )
        print(f"NLL per token at length {length}: {_value(scores[length])}")
    return scores


def _evaluate_rope_scalings(model, plain_scores, config, stream, vocabulary_size):
    """`{"rope + schedule": {length: nll}}` of the trained RoPE model.

    Up to the trained length every schedule is plain RoPE, and dynamic
    scaling follows the length it sees: one model of it serves every length.
    """
    results = {}
    for schedule in ROPE_SCALINGS:
        scores = {}
        scaled = None
        for length in config.lengths:
            if length <= config.train_length:
                scores[length] = plain_scores[length]
                continue
            if scaled is None or schedule != "dynamic":
                scaled = build_model(
                    "rope",
                    config.train_length,
                    rope_scaling(schedule, length, config.train_length),
                    vocabulary_size=vocabulary_size,
                    num_layers=config.num_layers,
                )
                scaled.set_weights(model.get_weights())
            scores[length] = mean_nll(
                scaled,
                evaluation_windows(stream, length),
                config.evaluation_batch_tokens,
            )
            print(
                f"NLL per token with {schedule} scaling at length {length}: "
                f"{_value(scores[length])}"
            )
        results[f"rope + {schedule}"] = scores
    return results


def _spread(results, config):
    """`{row: [sample deviation over seeds or None per length]}` of `results`."""
    return {
        name: [
            None if scores[length] is None else float(np.std(scores[length], ddof=1))
            for length in config.lengths
        ]
        for name, scores in results.items()
    }


def _value(value):
    return "n/a" if value is None else f"{value:.3f}"


def speed_columns(speeds):
    """The table's speed columns from `{encoding: [tokens/s per seed]}`.

    Returns:
        A list of `(header, {row: str})`: the mean training tokens per
        second, its ratio to sinusoidal's, and Press et al.'s ratio (Table
        1) where they measured the encoding.
    """
    means = {name: training.mean(values) for name, values in speeds.items() if values}
    reference = means.get("sinusoidal")
    return [
        ("train tokens/s", {name: f"{value:,.0f}" for name, value in means.items()}),
        (
            "÷ sinusoidal",
            {}
            if reference is None
            else {name: f"{value / reference:.2f}x" for name, value in means.items()},
        ),
        (
            "Press et al. ÷ sinusoidal",
            {
                name: f"{words / PRESS_WORDS_PER_SECOND['sinusoidal']:.2f}x"
                for name, words in PRESS_WORDS_PER_SECOND.items()
                if name in means
            },
        ),
    ]


def hold_lengths(config):
    """`{length: multiple}`: the evaluated lengths `HOLD_MULTIPLES` of the trained one."""
    return {
        multiple * config.train_length: multiple
        for multiple in HOLD_MULTIPLES
        if multiple * config.train_length in config.lengths
    }


def rises(results, config):
    """Each row's rise from the shortest length to each of `hold_lengths`.

    Args:
        results: dict of row name to `{length: nll or None}` (the means
            over seeds).
        config: `Config`.

    Returns:
        `{row: {length: rise}}` in the order of `results`, for the rows
        scored at the shortest length and at every hold length (not the
        learned table's), each rise in nats.
    """
    short = config.lengths[0]
    lengths = list(hold_lengths(config))
    return {
        name: {length: scores[length] - scores[short] for length in lengths}
        for name, scores in results.items()
        if all(scores[length] is not None for length in [short, *lengths])
    }


def holds_to(row_rises):
    """The longest multiple of the trained length up to which a row holds.

    Args:
        row_rises: dict. `{length: rise}` of one row of `rises`, in
            ascending length.

    Returns:
        The longest hold length whose rise, and every shorter one's, is at
        most `HOLD_TOLERANCE`; `None` if the first is not.
    """
    longest = None
    for length, rise in row_rises.items():
        if rise > HOLD_TOLERANCE:
            break
        longest = length
    return longest


def rise_table(results, config):
    """A Markdown table of `rises`: where the encodings part, past 8x.

    One row per row of `rises`, a column per hold length headed with its
    multiple (`1024 (16x)`), then the longest length it holds to (`16x`,
    or `no` where it rises more than `HOLD_TOLERANCE` by the first).

    Returns:
        A str, empty when the run scores none of `HOLD_MULTIPLES`.
    """
    multiples = hold_lengths(config)
    if not multiples:
        return ""
    headers = [f"{length} ({multiple}x)" for length, multiple in multiples.items()]
    lines = [
        "| encoding | " + " | ".join(headers) + " | holds to |",
        "|---|" + "---:|" * len(headers) + "---|",
    ]
    for name, row in rises(results, config).items():
        longest = holds_to(row)
        lines.append(
            f"| {name} | "
            + " | ".join(f"{rise:+.3f}" for rise in row.values())
            + f" | {'no' if longest is None else f'{multiples[longest]}x'} |"
        )
    return "\n".join(lines)


def findings(results, config, entropy_rate, speeds=None):
    """Lines that say whether the table shows the paper's direction.

    Args:
        results: dict of encoding name to `{length: nll or None}`, one value
            per cell (the mean over seeds).
        config: `Config`.
        entropy_rate: float or None. The source's floor, if known.
        speeds: dict or None. Encoding name to training tokens per second.
            Defaults to `None`.

    Returns:
        A list of str, one per comparison the trained encodings allow.
    """
    short, long = config.lengths[0], config.lengths[-1]
    lines = []

    def rise(name):
        return results[name][long] - results[name][short]

    if "alibi" in results:
        lines.append(
            f"ALiBi: {rise('alibi'):+.3f} nats from length {short} to {long} "
            f"(within {HOLD_TOLERANCE}: "
            f"{'yes' if rise('alibi') <= HOLD_TOLERANCE else 'no'})."
        )
    for name in ("sinusoidal", "rope", "t5", "shaw", "none"):
        if name in results:
            lines.append(
                f"{name}: {rise(name):+.3f} nats from length {short} to {long}."
            )
    if "learned" in results:
        lines.append(
            f"learned: {_value(results['learned'][short])} at {short}; n/a past "
            f"its {config.train_length} positions."
        )
    # Press et al. and Peng et al. compare the schedules at 4x the trained
    # length.
    scaled = 4 * config.train_length
    if scaled not in config.lengths:
        scaled = long
    for schedule in ("yarn", "dynamic", "linear"):
        name = f"rope + {schedule}"
        if name in results:
            # Judged at the printed precision, so equal figures read "tie".
            ours = round(results[name][scaled], 3)
            plain = round(results["rope"][scaled], 3)
            verdict = "yes" if ours < plain else "tie" if ours == plain else "no"
            lines.append(
                f"{name}: {ours:.3f} at {scaled} against "
                f"plain RoPE's {plain:.3f} (better: {verdict})."
            )
    lines += _holding(results, config)
    reference = (speeds or {}).get("sinusoidal")
    if reference:
        ratios = [
            f"{name} {value / reference:.2f}x"
            + (
                f" (Press et al. {PRESS_WORDS_PER_SECOND[name] / PRESS_WORDS_PER_SECOND['sinusoidal']:.2f}x)"
                if name in PRESS_WORDS_PER_SECOND
                else ""
            )
            for name, value in speeds.items()
            if value and name != "sinusoidal"
        ]
        if ratios:
            lines.append(
                "Training speed against sinusoidal: " + ", ".join(ratios) + "."
            )
    if entropy_rate is not None:
        lines.append(f"Entropy rate of the source (the floor): {entropy_rate:.3f}.")
    return lines


def _holding(results, config):
    """Lines naming the rows that hold at each hold length, and those that part."""
    lines = []
    table = rises(results, config)
    held = None
    for length, multiple in hold_lengths(config).items():
        holding = [name for name, row in table.items() if row[length] <= HOLD_TOLERANCE]
        line = f"Hold at {length} ({multiple}x)"
        if held is None:
            line += (
                f", within {HOLD_TOLERANCE} nats of their loss at "
                f"{config.lengths[0]}"
            )
        line += ": " + (", ".join(holding) or "none")
        parting = [name for name in held or () if name not in holding]
        if parting:
            line += "; part there: " + ", ".join(
                f"{name} ({table[name][length]:+.3f})" for name in parting
            )
        lines.append(line + ".")
        held = holding
    return lines


def run(config, out_dir, before_timing=None):
    """Train every encoding short, test it long, and write the results.

    Each text of `config.data` in turn, with files of its own.

    Args:
        config: `Config`. What to train and evaluate.
        out_dir: str or path-like. Where the models, the table (`nll.md`,
            `nll.csv`) and the plot (`nll.png`) go, created if needed; for
            the text `"python-source"` the files are `nll_python_source.*`.
        before_timing: callable or None. Called with no arguments before
            each seed's training speeds are timed: `keras-posenc demo` waits
            there for the vision task running alongside. Defaults to `None`.

    Returns:
        The exit status: `0`, or `1` if a reloaded model predicts
        differently from the trained one.
    """
    for text in config.data:
        if len(config.data) > 1:
            print(f"\n== The language task on {text} ==\n", flush=True)
        status = _run_text(config, text, out_dir, before_timing)
        if status:
            return status
    return 0


def _run_text(config, text, out_dir, before_timing):
    """`run` on one text of `DATA`."""
    from keras_posenc import plot

    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    if text == "python-source":
        source = PythonSource()
        prefix, stem = "lm_python_source", "nll_python_source"
    else:
        source = MarkovSource(config.seed)
        prefix, stem = "lm", "nll"
    longest = config.lengths[-1]
    stream = source.evaluation_stream(
        math.ceil(config.evaluation_tokens / longest),
        longest + 1,
        np.random.default_rng([config.seed, EVALUATION_STREAM]),
    )  # (rows, longest + 1), scored at every length
    print(source.describe())
    print(
        f"Model: {config.num_layers} pre-norm causal transformer "
        f"block{'s' if config.num_layers > 1 else ''}, width "
        f"{WIDTH}, {NUM_HEADS} heads, feed-forward {FEED_FORWARD_DIM}. "
        f"Training: {config.steps} steps of {config.batch_size} sequences of "
        f"{config.train_length} tokens."
    )
    print(
        "Evaluation: mean negative log-likelihood per token on the same "
        f"{stream.shape[0] * longest} tokens at lengths "
        f"{', '.join(map(str, config.lengths))}. " + training.seeds_line(config)
    )
    if FULL_ONLY and config.encodings == DEMO_ENCODINGS:
        print(training.left_out_line(FULL_ONLY))
    runs, speed_runs = [], []
    total = len(config.encodings) * config.num_seeds
    number = 0
    for seed in training.seeds(config):
        scores, trained = {}, {}
        for encoding in config.encodings:
            number += 1
            seed_text = f", seed {seed}" if config.num_seeds > 1 else ""
            label = f"[language {number}/{total}{seed_text}]"
            try:
                trained[encoding], model, sequences = _train(
                    encoding, config, source, out_dir, label, seed, prefix
                )
            except RuntimeError as error:
                print(f"Error: {error}", file=sys.stderr)
                return 1
            scores[encoding] = _evaluate(model, encoding, config, stream)
            if encoding == "rope":
                scores.update(
                    _evaluate_rope_scalings(
                        model, scores["rope"], config, stream, source.vocabulary_size
                    )
                )
        runs.append(scores)
        if before_timing is not None:
            before_timing()
        print(
            f"\nTiming training: {config.speed_rounds} "
            f"round{'s' if config.speed_rounds > 1 else ''} of one call per model.",
            flush=True,
        )
        speed_runs.append(
            training_speeds(
                trained,
                sequences[:, :-1],
                sequences[:, 1:],
                config.batch_size,
                config.speed_rounds,
            )
        )
    results = training.combine(runs)
    speeds = {name: [run[name] for run in speed_runs] for name in speed_runs[0]}

    title = (
        "Mean negative log-likelihood per token (nats), trained at length "
        f"{config.train_length}"
    )
    floor = (
        ""
        if source.entropy_rate is None
        else f"; entropy rate {source.entropy_rate:.3f}"
    )
    extra = speed_columns(speeds)
    table = training.format_markdown(results, config.lengths, extra=extra)
    means = {
        name: {length: training.mean(values) for length, values in scores.items()}
        for name, scores in results.items()
    }
    rise_markdown = rise_table(means, config)
    if rise_markdown:
        table += (
            f"\n\nRise from length {config.lengths[0]} (nats), of the means; an "
            f"encoding holds where it is at most {HOLD_TOLERANCE}:\n\n"
            f"{rise_markdown}"
        )
    markdown_path = os.path.join(out_dir, f"{stem}.md")
    with open(markdown_path, "w") as file:
        file.write(f"{title}{floor}. {training.seeds_line(config)}\n\n{table}\n")
    csv_path = os.path.join(out_dir, f"{stem}.csv")
    speed_means = {name: training.mean(values) for name, values in speeds.items()}
    training.write_csv(
        csv_path,
        results,
        config.lengths,
        extra=[("train tokens/s", speed_means)],
    )
    figure = plot.extrapolation_curves(
        list(config.lengths),
        {
            name: [scores[length] for length in config.lengths]
            for name, scores in means.items()
        },
        source.entropy_rate,
        config.train_length,
        spread=_spread(results, config) if config.num_seeds > 1 else None,
    )
    plot_path = os.path.join(out_dir, f"{stem}.png")
    figure.savefig(plot_path, dpi=100)

    print(f"\n{title}{floor}:\n\n{table}\n")
    if config.judged:
        print("\n".join(findings(means, config, source.entropy_rate, speed_means)))
    else:
        print(training.QUICK_NOTE)
    print(
        f"\nWrote {markdown_path}, {csv_path} and {plot_path} in "
        f"{time.perf_counter() - started:.0f} s."
    )
    return 0
