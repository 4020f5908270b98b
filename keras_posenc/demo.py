"""A task that only a model that sees positions can learn.

Each sequence holds the symbol `FIRST` once and the symbol `SECOND` once, at
random distinct positions, among random filler ids; the label is 1 when
`FIRST` comes before `SECOND`. Self-attention followed by average pooling is
permutation-invariant: without a position encoding, a sequence and any
shuffle of it get the same prediction, so such a model cannot beat chance
(half the labels). Adding `SinusoidalPositionEncoding` is enough to solve it.
"""

import os
import sys

import keras
import numpy as np

import keras_posenc
from keras_posenc import plot

SEQUENCE_LENGTH = 16
VOCABULARY_SIZE = 16
FIRST = 1
SECOND = 2
EMBEDDING_DIM = 32
NUM_HEADS = 2
HIDDEN_DIM = 64
BATCH_SIZE = 64
TEST_SAMPLES = 2000


def make_dataset(num_samples, rng):
    """Token ids and order labels for `num_samples` random sequences.

    Args:
        num_samples: int. The number of sequences.
        rng: `numpy.random.Generator`. The source of randomness.

    Returns:
        A tuple `(token_ids, labels)`: int32 of shape
        `(num_samples, SEQUENCE_LENGTH)` with ids in `1 .. VOCABULARY_SIZE - 1`
        (0 is unused), and float32 of shape `(num_samples,)`, 1 where `FIRST`
        comes before `SECOND`.
    """
    token_ids = rng.integers(
        SECOND + 1, VOCABULARY_SIZE, size=(num_samples, SEQUENCE_LENGTH)
    )  # (samples, seq) filler
    first_at = rng.integers(0, SEQUENCE_LENGTH, size=num_samples)
    # A nonzero offset modulo the length: `SECOND` lands uniformly on one of
    # the other positions.
    second_at = (
        first_at + rng.integers(1, SEQUENCE_LENGTH, size=num_samples)
    ) % SEQUENCE_LENGTH
    rows = np.arange(num_samples)
    token_ids[rows, first_at] = FIRST
    token_ids[rows, second_at] = SECOND
    labels = (first_at < second_at).astype("float32")
    return token_ids.astype("int32"), labels


def build_model(position_encoding=True):
    """A one-block transformer classifier over token ids.

    Args:
        position_encoding: bool. Whether to add a `SinusoidalPositionEncoding`
            to the token embeddings. Defaults to `True`.

    Returns:
        A compiled functional `keras.Model` from int32 token ids of shape
        `(batch, sequence)` to probabilities of shape `(batch, 1)`.
    """
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(VOCABULARY_SIZE, EMBEDDING_DIM)(
        token_ids
    )  # (batch, seq, embedding_dim)
    if position_encoding:
        x = keras_posenc.SinusoidalPositionEncoding()(x)
    attended = keras.layers.MultiHeadAttention(
        NUM_HEADS, EMBEDDING_DIM // NUM_HEADS
    )(x, x)  # (batch, seq, embedding_dim)
    x = keras.layers.LayerNormalization()(x + attended)
    hidden = keras.layers.Dense(HIDDEN_DIM, activation="relu")(
        x
    )  # (batch, seq, hidden_dim)
    x = keras.layers.LayerNormalization()(
        x + keras.layers.Dense(EMBEDDING_DIM)(hidden)
    )  # (batch, seq, embedding_dim)
    pooled = keras.layers.GlobalAveragePooling1D()(
        x
    )  # (batch, embedding_dim)
    probabilities = keras.layers.Dense(1, activation="sigmoid")(pooled)
    model = keras.Model(token_ids, probabilities)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    return model


def train_and_evaluate(position_encoding, train_data, test_data, epochs, seed):
    """Build and train `build_model(position_encoding)`, from `seed`.

    Args:
        position_encoding: bool. Whether the model adds a position encoding.
        train_data: tuple `(token_ids, labels)` to train on.
        test_data: tuple `(token_ids, labels)` to measure accuracy on.
        epochs: int. The number of passes over `train_data`.
        seed: int. The seed of the weights and of the shuffling.

    Returns:
        A tuple `(model, accuracy)`: the trained model and its accuracy on
        `test_data`, a float in `[0, 1]`.
    """
    keras.utils.set_random_seed(seed)
    model = build_model(position_encoding)
    model.fit(*train_data, batch_size=BATCH_SIZE, epochs=epochs, verbose=1)
    _, accuracy = model.evaluate(*test_data, verbose=0)
    return model, accuracy


def run(out_dir, epochs, seed, samples):
    """Train with and without the encoding, report, save, reload, plot.

    Args:
        out_dir: str or path-like. Where the model and the plots go; created
            if needed.
        epochs: int. The number of training epochs of each model.
        seed: int. The seed of the data, the weights and the shuffling.
        samples: int. The number of training sequences.

    Returns:
        The exit status: `0`, or `1` if the reloaded model's predictions
        differ from the trained model's.
    """
    rng = np.random.default_rng(seed)
    train_data = make_dataset(samples, rng)
    test_data = make_dataset(TEST_SAMPLES, rng)
    print(
        f"Task: {samples} training sequences of {SEQUENCE_LENGTH} tokens, each "
        f"holding token {FIRST} (A) once and token {SECOND} (B) once among "
        "random fillers. Label: 1 if A comes before B."
    )
    print("\nTraining with SinusoidalPositionEncoding:")
    model, accuracy = train_and_evaluate(
        True, train_data, test_data, epochs, seed
    )
    print("\nTraining without a position encoding (the baseline):")
    _, baseline_accuracy = train_and_evaluate(
        False, train_data, test_data, epochs, seed
    )
    print(
        f"\nTest accuracy on {TEST_SAMPLES} new sequences:\n"
        f"  with SinusoidalPositionEncoding: {accuracy:7.1%}\n"
        f"  without a position encoding:     {baseline_accuracy:7.1%}\n"
        "Without positions the model is permutation-invariant: self-attention "
        "and average\npooling give a sequence and every shuffle of it the same "
        "output, so it cannot\ntell whether A comes before B and stays at "
        "chance (about 50%)."
    )

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "demo_model.keras")
    model.save(path)
    reloaded = keras.models.load_model(path, safe_mode=True)
    test_ids, _ = test_data
    predictions = model.predict(test_ids, verbose=0)  # (test_samples, 1)
    reloaded_predictions = reloaded.predict(test_ids, verbose=0)
    if not np.array_equal(predictions, reloaded_predictions):
        print(
            f"\nError: the model reloaded from {path} predicts differently "
            "from the trained model.",
            file=sys.stderr,
        )
        return 1
    print(
        f"\nSaved the model with the encoding to {path}, reloaded it with "
        f"safe_mode=True:\npredictions on the {TEST_SAMPLES} test sequences "
        "are bit-identical."
    )
    for plot_path in plot.save_plots(out_dir):
        print(f"Wrote {plot_path}")
    return 0
