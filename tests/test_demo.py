import numpy as np

from keras_posenc import SinusoidalPositionEncoding
from keras_posenc import demo


def test_dataset_holds_each_symbol_once_and_labels_their_order():
    token_ids, labels = demo.make_dataset(2000, np.random.default_rng(0))
    assert token_ids.shape == (2000, demo.SEQUENCE_LENGTH)
    assert token_ids.dtype == np.int32
    assert labels.shape == (2000,)
    assert np.all((token_ids == demo.FIRST).sum(axis=1) == 1)
    assert np.all((token_ids == demo.SECOND).sum(axis=1) == 1)
    assert token_ids.min() >= 1
    assert token_ids.max() < demo.VOCABULARY_SIZE
    first_at = np.argmax(token_ids == demo.FIRST, axis=1)
    second_at = np.argmax(token_ids == demo.SECOND, axis=1)
    np.testing.assert_array_equal(labels, first_at < second_at)
    assert 0.45 < labels.mean() < 0.55
    assert len(set(first_at)) == len(set(second_at)) == demo.SEQUENCE_LENGTH


def test_baseline_is_permutation_invariant_and_the_encoding_breaks_it():
    token_ids, _ = demo.make_dataset(64, np.random.default_rng(1))
    permutation = np.random.default_rng(2).permutation(demo.SEQUENCE_LENGTH)
    shuffled_ids = token_ids[:, permutation]  # (batch, seq)

    baseline = demo.build_model(position_encoding=False)
    np.testing.assert_allclose(
        baseline.predict(token_ids, verbose=0),
        baseline.predict(shuffled_ids, verbose=0),
        atol=1e-6,
    )

    model = demo.build_model(position_encoding=True)
    assert any(
        isinstance(layer, SinusoidalPositionEncoding) for layer in model.layers
    )
    assert not np.allclose(
        model.predict(token_ids, verbose=0),
        model.predict(shuffled_ids, verbose=0),
        atol=1e-6,
    )
