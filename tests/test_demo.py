import math

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import demo

VOCAB = demo.VOCABULARY_SIZE


@pytest.fixture(scope="module")
def source():
    return demo.MarkovSource(seed=3)


def power_iteration_entropy_rate(transitions):
    """The entropy rate by iterating the pair distribution to its fixed point."""
    pairs = np.full((VOCAB, VOCAB), 1.0 / VOCAB**2)
    for _ in range(2000):
        # P(b, c) = sum_a P(a, b) P(c | a, b)
        pairs = np.einsum("ab,abc->bc", pairs, transitions)
    entropy = 0.0
    for a in range(VOCAB):
        for b in range(VOCAB):
            for c in range(VOCAB):
                p = transitions[a, b, c]
                if p > 0:
                    entropy -= pairs[a, b] * p * math.log(p)
    return pairs, entropy


def test_source_is_a_normalised_order_2_chain(source):
    assert source.transitions.shape == (VOCAB, VOCAB, VOCAB)
    np.testing.assert_allclose(source.transitions.sum(axis=-1), 1.0, atol=1e-12)
    pairs, entropy_rate = power_iteration_entropy_rate(source.transitions)
    np.testing.assert_allclose(source.pair_probabilities, pairs, atol=1e-10)
    assert source.entropy_rate == pytest.approx(entropy_rate, abs=1e-9)
    # Below the entropy of the next symbol given only the previous one: the
    # second symbol back carries information.
    previous = pairs.sum(axis=0)  # (b,)
    next_given_previous = np.einsum("ab,abc->bc", pairs, source.transitions)
    next_given_previous /= previous[:, None]
    order_1_entropy = -np.sum(
        previous[:, None] * next_given_previous * np.log(next_given_previous)
    )
    assert source.entropy_rate < order_1_entropy - 0.3


def test_samples_follow_the_chain(source):
    symbols = source.sample(400, 500, np.random.default_rng(0))
    assert symbols.shape == (400, 500)
    assert symbols.dtype == np.int32
    assert symbols.min() >= 0 and symbols.max() < VOCAB
    # The mean surprise of each symbol given its two predecessors converges
    # to the entropy rate (the chain starts stationary).
    surprise = -np.log(
        source.transitions[symbols[:, :-2], symbols[:, 1:-1], symbols[:, 2:]]
    )
    assert surprise.mean() == pytest.approx(source.entropy_rate, abs=0.02)
    # Pair frequencies at any position match the stationary distribution.
    counts = np.zeros((VOCAB, VOCAB))
    np.add.at(counts, (symbols[:, 0], symbols[:, 1]), 1)
    np.add.at(counts, (symbols[:, 250], symbols[:, 251]), 1)
    np.testing.assert_allclose(
        counts / counts.sum(), source.pair_probabilities, atol=0.02
    )
    again = source.sample(400, 500, np.random.default_rng(0))
    np.testing.assert_array_equal(symbols, again)


def test_every_length_scores_the_same_targets():
    stream = np.arange(3 * 65).reshape(3, 65)  # (rows, longest + 1)
    for length in (16, 32, 64):
        windows = demo.evaluation_windows(stream, length)
        assert windows.shape == (3 * 64 // length, length + 1)
        np.testing.assert_array_equal(
            np.sort(windows[:, 1:].ravel()), np.sort(stream[:, 1:].ravel())
        )
        # Each window is a contiguous run of the stream.
        np.testing.assert_array_equal(np.diff(windows, axis=1), 1)


def test_mean_nll_is_the_mean_surprise_of_the_targets(source):
    keras.utils.set_random_seed(0)
    model = demo.build_model("alibi", 16)
    windows = source.sample(12, 33, np.random.default_rng(1))
    logits = model.predict(windows[:, :-1], verbose=0).astype("float64")
    surprise = []
    for row, targets in zip(logits, windows[:, 1:]):
        for token_logits, target in zip(row, targets):
            log_total = math.log(sum(math.exp(value) for value in token_logits))
            surprise.append(log_total - token_logits[target])
    assert demo.mean_nll(model, windows) == pytest.approx(
        np.mean(surprise), rel=1e-6
    )


POSITION_LAYERS = {
    "sinusoidal": keras_posenc.SinusoidalPositionEncoding,
    "learned": keras_posenc.PositionEmbedding,
    "rope": keras_posenc.RotaryEmbedding,
    "alibi": keras_posenc.AlibiBias,
    "shaw": keras_posenc.RelativePositionEmbedding,
    "t5": keras_posenc.RelativePositionBias,
}


@pytest.mark.parametrize("encoding", demo.ENCODINGS)
def test_model_is_causal_and_uses_its_encoding(encoding):
    keras.utils.set_random_seed(0)
    model = demo.build_model(encoding, 16)
    attention = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
    ]
    assert len(attention) == demo.NUM_LAYERS
    found = [layer.position for layer in attention] + list(model.layers)
    if encoding == "none":
        assert all(layer.position is None for layer in attention)
    else:
        assert any(isinstance(layer, POSITION_LAYERS[encoding]) for layer in found)
    token_ids = np.random.default_rng(0).integers(0, VOCAB, (2, 16))
    changed = token_ids.copy()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB
    logits = model.predict(token_ids, verbose=0)  # (2, 16, vocab)
    changed_logits = model.predict(changed, verbose=0)
    assert logits.shape == (2, 16, VOCAB)
    np.testing.assert_allclose(logits[:, :10], changed_logits[:, :10], atol=1e-6)
    assert not np.allclose(logits[:, 10:], changed_logits[:, 10:])


def test_rope_scalings_extend_the_trained_length():
    assert demo.rope_scaling("linear", 256, 64) == {
        "rope_type": "linear",
        "factor": 4.0,
    }
    assert demo.rope_scaling("yarn", 512, 64) == {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
    }
    # Dynamic scales itself from the length it sees.
    assert demo.rope_scaling("dynamic", 512, 64) == {
        "rope_type": "dynamic",
        "factor": 1.0,
        "original_max_position_embeddings": 64,
    }


def test_config_changes_are_checked():
    config = demo.DEFAULT.replace(
        encodings=["t5", "alibi", "t5"], lengths=[512, 64, 128], steps=None
    )
    assert config.encodings == ("t5", "alibi")
    assert config.lengths == (64, 128, 512)
    assert config.steps == demo.DEFAULT.steps
    with pytest.raises(ValueError, match=r"`encodings` must be among .*'xpos'"):
        demo.DEFAULT.replace(encodings=["rope", "xpos"])
    with pytest.raises(ValueError, match=r"`lengths` must each be at least .*32"):
        demo.DEFAULT.replace(lengths=[32, 128])


def test_findings_state_the_directions():
    config = demo.DEFAULT
    results = {
        "alibi": {64: 1.90, 128: 1.90, 256: 1.91, 512: 1.92},
        "learned": {64: 1.9, 128: None, 256: None, 512: None},
        "rope": {64: 1.90, 128: 2.1, 256: 2.5, 512: 3.0},
        "rope + yarn": {64: 1.90, 128: 2.0, 256: 2.1, 512: 2.2},
        "rope + linear": {64: 1.90, 128: 2.2, 256: 2.9, 512: 3.5},
        # Lower, but not at the three decimals printed.
        "rope + dynamic": {64: 1.90, 128: 2.1, 256: 2.4998, 512: 3.0},
    }
    lines = demo.findings(results, config, entropy_rate=1.85)
    assert "ALiBi: +0.020 nats from length 64 to 512 (within 0.05: yes)." in lines
    assert "rope: +1.100 nats from length 64 to 512." in lines
    assert "learned: 1.900 at 64; n/a past its 64 positions." in lines
    # The schedules are compared at 4x the trained length.
    assert "rope + yarn: 2.100 at 256 against plain RoPE's 2.500 (better: yes)." in lines
    assert "rope + linear: 2.900 at 256 against plain RoPE's 2.500 (better: no)." in lines
    assert "rope + dynamic: 2.500 at 256 against plain RoPE's 2.500 (better: tie)." in lines
    short_config = config.replace(lengths=[64, 128])
    lines = demo.findings(results, short_config, entropy_rate=1.85)
    assert "rope + yarn: 2.000 at 128 against plain RoPE's 2.100 (better: yes)." in lines
    assert lines[-1] == "Entropy rate of the source (the floor): 1.850."
