"""A task that only a model that sees positions can learn.

Each sequence holds the symbol `FIRST` once and the symbol `SECOND` once, at
random distinct positions, among random filler ids; the label is 1 when
`FIRST` comes before `SECOND`. Self-attention followed by average pooling is
permutation-invariant: without a position encoding, a sequence and any
shuffle of it get the same prediction, so such a model cannot beat chance
(half the labels). Adding `SinusoidalPositionEncoding` is enough to solve it.
"""

import keras
import numpy as np

import keras_posenc

SEQUENCE_LENGTH = 16
VOCABULARY_SIZE = 16
FIRST = 1
SECOND = 2
EMBEDDING_DIM = 32
NUM_HEADS = 2
HIDDEN_DIM = 64


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
    x = keras.layers.LayerNormalization()(x + keras.layers.Dense(EMBEDDING_DIM)(hidden))
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
