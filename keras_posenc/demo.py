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

Every trained model is saved to `.keras`, reloaded with `safe_mode=True` and
checked to predict bit-identically before the reloaded model is evaluated.
"""

import csv
import math
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import keras_posenc
# The configurations are this module's too: `demo.QUICK`, `demo.Config`.
from keras_posenc.demo_config import DEFAULT  # noqa: F401
from keras_posenc.demo_config import ENCODINGS
from keras_posenc.demo_config import QUICK  # noqa: F401
from keras_posenc.demo_config import ROPE_SCALINGS
from keras_posenc.demo_config import Config  # noqa: F401

VOCABULARY_SIZE = 16
# The Dirichlet concentration of each row of the transition table: small
# values make peaked rows, so the two previous symbols matter.
CONCENTRATION = 0.3
WIDTH = 64
NUM_HEADS = 4
FEED_FORWARD_DIM = 256
NUM_LAYERS = 2
LEARNING_RATE = 2e-3
STEPS_PER_EXECUTION = 20
# Shaw et al.'s clipping distance, and T5's bucketing (its defaults,
# unidirectional for a causal model).
SHAW_MAX_DISTANCE = 16
T5_NUM_BUCKETS = 32
T5_MAX_DISTANCE = 128
# Tokens scored per batch of evaluation: the batch holds this many over the
# evaluation length sequences.
EVALUATION_BATCH_TOKENS = 8192
# The most ALiBi's negative log-likelihood may rise from the trained length
# to the longest, and what Press et al. found: it extrapolates.
ALIBI_TOLERANCE = 0.05


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

    def __init__(self, seed):
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


def _attention_position(encoding, scaling=None):
    """A fresh position layer for one attention block, or `None`."""
    if encoding == "rope":
        return keras_posenc.RotaryEmbedding(scaling=scaling)
    if encoding == "alibi":
        return keras_posenc.AlibiBias(NUM_HEADS)
    if encoding == "shaw":
        return keras_posenc.RelativePositionEmbedding(SHAW_MAX_DISTANCE)
    if encoding == "t5":
        return keras_posenc.RelativePositionBias(
            NUM_HEADS,
            num_buckets=T5_NUM_BUCKETS,
            max_distance=T5_MAX_DISTANCE,
            bidirectional=False,
        )
    return None


def build_model(encoding, train_length, scaling=None, jit_compile=False):
    """The pre-norm causal transformer language model with one encoding.

    Args:
        encoding: str. One of `ENCODINGS`: `"sinusoidal"` and `"learned"`
            add to the token embeddings; `"rope"`, `"alibi"`, `"shaw"` and
            `"t5"` act in every attention layer; `"none"` adds nothing.
        train_length: int. The learned table's length.
        scaling: dict or None. The RoPE scaling of `"rope"`. Defaults to
            `None`.
        jit_compile: bool. Whether `fit` runs under XLA, with
            `STEPS_PER_EXECUTION` training steps per call. Defaults to
            `False`.

    Returns:
        A compiled functional `keras.Model` from int32 token ids
        `(batch, seq)` to next-token logits `(batch, seq, vocab)`.
    """
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(VOCABULARY_SIZE, WIDTH)(token_ids)  # (b, seq, width)
    if encoding == "sinusoidal":
        x = keras_posenc.SinusoidalPositionEncoding()(x)
    elif encoding == "learned":
        x = keras_posenc.PositionEmbedding(train_length)(x)
    for _ in range(NUM_LAYERS):
        normed = keras.layers.LayerNormalization()(x)
        attention = keras_posenc.PositionalMultiHeadAttention(
            NUM_HEADS,
            WIDTH // NUM_HEADS,
            position=_attention_position(encoding, scaling),
        )
        x = x + attention(normed, normed, use_causal_mask=True)
        normed = keras.layers.LayerNormalization()(x)
        hidden = keras.layers.Dense(FEED_FORWARD_DIM, activation="gelu")(
            normed
        )  # (b, seq, feed_forward)
        x = x + keras.layers.Dense(WIDTH)(hidden)  # (b, seq, width)
    x = keras.layers.LayerNormalization()(x)
    logits = keras.layers.Dense(VOCABULARY_SIZE)(x)  # (b, seq, vocab)
    model = keras.Model(token_ids, logits, name=f"lm_{encoding}")
    model.compile(
        optimizer=keras.optimizers.Adam(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # Tiny steps: running several per compiled call saves Python's
        # overhead, at the cost of compiling a loop.
        steps_per_execution=STEPS_PER_EXECUTION if jit_compile else 1,
        jit_compile=jit_compile,
    )
    return model


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


def mean_nll(model, windows):
    """Mean negative log-likelihood per token, in nats.

    Args:
        model: `keras.Model` from token ids to next-token logits.
        windows: int32 array `(n, length + 1)`: the model reads the first
            `length` symbols of each and is scored on the last `length`.

    Returns:
        A float.
    """
    batch_size = max(1, EVALUATION_BATCH_TOKENS // (windows.shape[1] - 1))
    losses = []
    for start in range(0, len(windows), batch_size):
        batch = windows[start : start + batch_size]  # (batch, length + 1)
        logits = model(batch[:, :-1], training=False)  # (batch, length, vocab)
        losses.append(
            tf.nn.sparse_softmax_cross_entropy_with_logits(
                batch[:, 1:], tf.cast(logits, "float64")
            )
        )  # (batch, length)
    return float(tf.reduce_mean(tf.concat(losses, axis=0)))


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


def _train(encoding, config, source, out_dir, label):
    """Train, save, reload and check one model; return the reloaded one."""
    rng = np.random.default_rng([config.seed, ENCODINGS.index(encoding)])
    sequences = source.sample(
        config.steps * config.batch_size, config.train_length + 1, rng
    )  # (steps * batch, train_length + 1)
    keras.utils.set_random_seed(config.seed)
    model = build_model(encoding, config.train_length, jit_compile=config.jit_compile)
    # Keras' progress bar redraws one line; in a file or a CI log it is
    # thousands of characters of ANSI codes, so there one line says it.
    interactive = sys.stdout.isatty()
    print(f"\n{label} Training with {encoding}:", flush=True)
    started = time.perf_counter()
    history = model.fit(
        sequences[:, :-1],
        sequences[:, 1:],
        batch_size=config.batch_size,
        epochs=1,
        shuffle=False,
        verbose=1 if interactive else 0,
    )
    if not interactive:
        print(
            f"Trained {config.steps} steps in "
            f"{time.perf_counter() - started:.0f} s; final loss "
            f"{history.history['loss'][-1]:.3f}."
        )
    path = os.path.join(out_dir, f"lm_{encoding}.keras")
    model.save(path)
    reloaded = keras.models.load_model(path, safe_mode=True)
    probe = sequences[: config.batch_size, :-1]
    if not np.array_equal(
        model(probe, training=False), reloaded(probe, training=False)
    ):
        raise RuntimeError(
            f"the model reloaded from {path} predicts differently from the "
            "trained model."
        )
    print(f"Saved to {path}; reloaded with safe_mode=True, predictions identical.")
    return reloaded


def _evaluate(model, encoding, config, stream):
    """`{length: nll or None}` of `model`, `None` where undefined."""
    scores = {}
    for length in config.lengths:
        if encoding == "learned" and length > config.train_length:
            scores[length] = None  # The table has no rows past its length.
        else:
            scores[length] = mean_nll(model, evaluation_windows(stream, length))
        print(f"NLL per token at length {length}: {_cell(scores[length])}")
    return scores


def _evaluate_rope_scalings(model, plain_scores, config, stream):
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
                )
                scaled.set_weights(model.get_weights())
            scores[length] = mean_nll(scaled, evaluation_windows(stream, length))
            print(
                f"NLL per token with {schedule} scaling at length {length}: "
                f"{_cell(scores[length])}"
            )
        results[f"rope + {schedule}"] = scores
    return results


def format_markdown(results, lengths):
    """A Markdown table of NLL by encoding (rows) and length (columns)."""
    lines = [
        "| encoding | " + " | ".join(str(length) for length in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for name, scores in results.items():
        cells = [_cell(scores[length]) for length in lengths]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value):
    return "n/a" if value is None else f"{value:.3f}"


def write_csv(path, results, lengths):
    """Write the table as CSV: one row per encoding, `n/a` where undefined."""
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["encoding"] + [str(length) for length in lengths])
        for name, scores in results.items():
            writer.writerow([name] + [_cell(scores[length]) for length in lengths])


def findings(results, config, entropy_rate):
    """Lines that say whether the table shows the paper's direction.

    Args:
        results: dict of encoding name to `{length: nll or None}`.
        config: `Config`.
        entropy_rate: float. The source's floor.

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
            f"(within {ALIBI_TOLERANCE}: "
            f"{'yes' if rise('alibi') <= ALIBI_TOLERANCE else 'no'})."
        )
    for name in ("sinusoidal", "rope", "t5", "shaw", "none"):
        if name in results:
            lines.append(
                f"{name}: {rise(name):+.3f} nats from length {short} to {long}."
            )
    if "learned" in results:
        lines.append(
            f"learned: {_cell(results['learned'][short])} at {short}; n/a past "
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
    lines.append(f"Entropy rate of the source (the floor): {entropy_rate:.3f}.")
    return lines


def run(config, out_dir):
    """Train every encoding short, test it long, and write the results.

    Args:
        config: `Config`. What to train and evaluate.
        out_dir: str or path-like. Where the models, the table (`nll.md`,
            `nll.csv`) and the plot (`nll.png`) go; created if needed.

    Returns:
        The exit status: `0`, or `1` if a reloaded model predicts
        differently from the trained one.
    """
    from keras_posenc import plot

    started = time.perf_counter()
    os.makedirs(out_dir, exist_ok=True)
    source = MarkovSource(config.seed)
    longest = config.lengths[-1]
    stream = source.sample(
        math.ceil(config.evaluation_tokens / longest),
        longest + 1,
        np.random.default_rng([config.seed, len(ENCODINGS)]),
    )  # (rows, longest + 1), scored at every length
    print(
        f"Source: an order-2 Markov chain over {VOCABULARY_SIZE} symbols "
        f"(seed {config.seed}); its entropy rate, the floor of any model's "
        f"loss, is {source.entropy_rate:.3f} nats per symbol."
    )
    print(
        f"Model: {NUM_LAYERS} pre-norm causal transformer blocks, width "
        f"{WIDTH}, {NUM_HEADS} heads, feed-forward {FEED_FORWARD_DIM}. "
        f"Training: {config.steps} steps of {config.batch_size} sequences of "
        f"{config.train_length} tokens. Evaluation: mean negative "
        f"log-likelihood per token on the same {stream.shape[0] * longest} "
        f"tokens at lengths {', '.join(map(str, config.lengths))}."
    )
    results = {}
    for number, encoding in enumerate(config.encodings, start=1):
        label = f"[{number}/{len(config.encodings)}]"
        try:
            model = _train(encoding, config, source, out_dir, label)
        except RuntimeError as error:
            print(f"Error: {error}", file=sys.stderr)
            return 1
        results[encoding] = _evaluate(model, encoding, config, stream)
        if encoding == "rope":
            results.update(
                _evaluate_rope_scalings(model, results["rope"], config, stream)
            )

    title = (
        "Mean negative log-likelihood per token (nats), trained at length "
        f"{config.train_length}"
    )
    table = format_markdown(results, config.lengths)
    markdown_path = os.path.join(out_dir, "nll.md")
    with open(markdown_path, "w") as file:
        file.write(
            f"{title}; entropy rate {source.entropy_rate:.3f}.\n\n{table}\n"
        )
    csv_path = os.path.join(out_dir, "nll.csv")
    write_csv(csv_path, results, config.lengths)
    figure = plot.extrapolation_curves(
        list(config.lengths),
        {
            name: [scores[length] for length in config.lengths]
            for name, scores in results.items()
        },
        source.entropy_rate,
        config.train_length,
    )
    plot_path = os.path.join(out_dir, "nll.png")
    figure.savefig(plot_path, dpi=100)

    print(f"\n{title}:\n\n{table}\n")
    print("\n".join(findings(results, config, source.entropy_rate)))
    print(
        f"\nWrote {markdown_path}, {csv_path} and {plot_path} in "
        f"{time.perf_counter() - started:.0f} s."
    )
    return 0
