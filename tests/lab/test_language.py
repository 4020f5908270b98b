import contextlib
import csv
import inspect
import io
import math
import re
import time
import types

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc_lab import encodings
from keras_posenc_lab import language
from keras_posenc_lab import config as demo_config
from keras_posenc_lab import training

VOCAB = language.VOCABULARY_SIZE


@pytest.fixture(scope="module")
def source():
    return language.MarkovSource(seed=3)


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
        windows = language.evaluation_windows(stream, length)
        assert windows.shape == (3 * 64 // length, length + 1)
        np.testing.assert_array_equal(
            np.sort(windows[:, 1:].ravel()), np.sort(stream[:, 1:].ravel())
        )
        # Each window is a contiguous run of the stream.
        np.testing.assert_array_equal(np.diff(windows, axis=1), 1)


def test_the_task_imports_no_tensorflow():
    # The TPU notebook reads it on a JAX runtime, where TensorFlow is absent.
    source = inspect.getsource(language)
    assert not re.search(r"^\s*(import|from) tensorflow\b", source, re.MULTILINE)


def test_mean_nll_is_the_mean_surprise_of_the_targets(source):
    keras.utils.set_random_seed(0)
    model = language.build_model("alibi", 16)
    windows = source.sample(12, 33, np.random.default_rng(1))
    logits = model.predict(windows[:, :-1], verbose=0).astype("float64")
    surprise = []
    for row, targets in zip(logits, windows[:, 1:]):
        for token_logits, target in zip(row, targets):
            log_total = math.log(sum(math.exp(value) for value in token_logits))
            surprise.append(log_total - token_logits[target])
    assert language.mean_nll(model, windows) == pytest.approx(
        np.mean(surprise), rel=1e-6
    )


@pytest.mark.parametrize("encoding", demo_config.ENCODINGS)
def test_model_is_causal_and_uses_its_encoding(encoding):
    keras.utils.set_random_seed(0)
    model = language.build_model(encoding, 16)
    attention = [
        layer
        for layer in model.layers
        if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
    ]
    assert len(attention) == language.NUM_LAYERS
    found = [layer.position for layer in attention] + list(model.layers)
    if encoding == "none":
        assert all(layer.position is None for layer in attention)
    else:
        # The registry's layer for it, as the model builds it.
        position_layer = getattr(keras_posenc, encodings.LANGUAGE[encoding].layer)
        assert any(isinstance(layer, position_layer) for layer in found)
    token_ids = np.random.default_rng(0).integers(0, VOCAB, (2, 16))
    changed = token_ids.copy()
    changed[:, 10:] = (changed[:, 10:] + 1) % VOCAB
    logits = model.predict(token_ids, verbose=0)  # (2, 16, vocab)
    changed_logits = model.predict(changed, verbose=0)
    assert logits.shape == (2, 16, VOCAB)
    np.testing.assert_allclose(logits[:, :10], changed_logits[:, :10], atol=1e-6)
    assert not np.allclose(logits[:, 10:], changed_logits[:, 10:])


def test_rope_scalings_extend_the_trained_length():
    assert language.rope_scaling("linear", 256, 64) == {
        "rope_type": "linear",
        "factor": 4.0,
    }
    assert language.rope_scaling("yarn", 512, 64) == {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 64,
    }
    # Dynamic scales itself from the length it sees.
    assert language.rope_scaling("dynamic", 512, 64) == {
        "rope_type": "dynamic",
        "factor": 1.0,
        "original_max_position_embeddings": 64,
    }


def test_config_changes_are_checked():
    config = demo_config.DEFAULT.replace(
        encodings=["t5", "alibi", "t5"], lengths=[512, 64, 128], steps=None
    )
    assert config.encodings == ("t5", "alibi")
    assert config.lengths == (64, 128, 512)
    assert config.steps == demo_config.DEFAULT.steps
    # One text by its name, or several, each once, in the order given.
    assert demo_config.DEFAULT.replace(data="python-source").data == ("python-source",)
    assert demo_config.DEFAULT.replace(
        data=["python-source", "markov", "python-source"]
    ).data == ("python-source", "markov")
    with pytest.raises(ValueError, match=r"`encodings` must be among .*'yarn'"):
        demo_config.DEFAULT.replace(encodings=["rope", "yarn"])
    with pytest.raises(ValueError, match=r"`lengths` must each be at least .*32"):
        demo_config.DEFAULT.replace(lengths=[32, 128])
    with pytest.raises(ValueError, match=r"`data` must be among .*data=\['wiki'\]"):
        demo_config.DEFAULT.replace(data=["wiki"])
    with pytest.raises(ValueError, match=r"data=\(\)"):
        demo_config.DEFAULT.replace(data=())


def test_the_configurations_are_what_the_command_says():
    default, full, gpu = demo_config.DEFAULT, demo_config.FULL, demo_config.GPU
    # `make demo`: trained at 64, scored up to 16x, on the Markov source.
    assert default.train_length == 64 and default.lengths[0] == 64
    assert default.lengths[-1] == 16 * 64
    assert default.data == ("markov",) and default.num_seeds == 1
    assert default.encodings == demo_config.DEMO_ENCODINGS
    # `--full`: every encoding on both texts, 3 seeds, to 32x, in batches
    # twice the size, scored on four times the tokens (16 windows at 2048).
    assert full == default.replace(
        encodings=demo_config.ENCODINGS,
        data=["markov", "python-source"],
        num_seeds=3,
        lengths=[64, 128, 256, 512, 1024, 2048],
        batch_size=2 * default.batch_size,
        evaluation_tokens=4 * default.evaluation_tokens,
    )
    # `--gpu`: trained at 512, scored at every doubling up to 16,384 (32x).
    assert gpu.train_length == 512
    assert gpu.lengths == (512, 1024, 2048, 4096, 8192, 16384)
    assert gpu.jit_compile and gpu.judged and gpu.num_seeds == 1
    assert gpu.encodings == demo_config.DEMO_ENCODINGS
    # Its batches of evaluation hold several of its longest windows.
    assert gpu.evaluation_batch_tokens >= 2 * gpu.lengths[-1]
    assert demo_config.GPU_FULL == gpu.replace(
        encodings=demo_config.ENCODINGS, data=demo_config.DATA, num_seeds=3
    )
    assert demo_config.language_config() == default
    assert demo_config.language_config(full=True) == full
    assert demo_config.language_config(gpu=True) == gpu
    assert demo_config.language_config(full=True, gpu=True) == demo_config.GPU_FULL
    assert demo_config.language_config(quick=True) == demo_config.QUICK
    assert demo_config.language_config(quick=True, full=True) == (
        demo_config.QUICK.replace(encodings=demo_config.ENCODINGS)
    )
    with pytest.raises(ValueError, match="`--quick` and `--gpu`"):
        demo_config.language_config(quick=True, gpu=True)


@pytest.mark.parametrize(
    "config", [demo_config.FULL, demo_config.GPU_FULL], ids=["full", "gpu-full"]
)
def test_the_held_out_text_holds_the_evaluation_of_the_longest_runs(config):
    # Real text's held-out runs are fixed and must not overlap.
    longest = config.lengths[-1]
    rows = math.ceil(config.evaluation_tokens / longest)
    stream = language.PythonSource().evaluation_stream(rows, longest + 1)
    assert stream.shape == (rows, longest + 1)


def test_the_registry_scales_its_lengths_with_the_trained_length():
    # xPos's scale base is half the trained length, CoPE has a row per
    # trained position, the temperature starts to grow past it.
    for train_length in (64, 512):
        model = language.build_model("xpos", train_length)
        (scale_base,) = {
            layer.position.get_config()["scale_base"]
            for layer in model.layers
            if isinstance(layer, keras_posenc.PositionalMultiHeadAttention)
        }
        assert scale_base == train_length / 2
        cope = encodings.build("language", "cope", train_length=train_length)
        assert cope.get_config()["max_positions"] == train_length
        temperature = encodings.build(
            "language", "nope_temperature", train_length=train_length
        )
        assert temperature.get_config()["floor_scale"] == train_length
    # Without a trained length, the registry's own values: those at 64.
    assert encodings.build("language", "xpos").get_config()["scale_base"] == 32.0


def full_results(values):
    """`{name: {length: nll}}` at FULL's lengths from `{name: [6 values]}`."""
    return {
        name: dict(zip(demo_config.FULL.lengths, row)) for name, row in values.items()
    }


# Trained at 64; the last three columns are 8x, 16x and 32x.
PARTING = full_results(
    {
        "alibi": [2.05, 2.05, 2.05, 2.04, 2.04, 2.03],
        "shaw": [1.93, 1.93, 1.93, 1.95, 1.99, 2.10],
        "xpos": [1.92, 1.92, 1.92, 1.93, 1.96, 2.00],
        "rope": [1.90, 2.00, 2.50, 3.00, 3.40, 3.90],
        "learned": [1.95, None, None, None, None, None],
    }
)


def test_the_rise_table_says_where_the_encodings_part():
    table = language.rise_table(PARTING, demo_config.FULL)
    assert table.splitlines() == [
        "| encoding | 512 (8x) | 1024 (16x) | 2048 (32x) | holds to |",
        "|---|---:|---:|---:|---|",
        "| alibi | -0.010 | -0.010 | -0.020 | 32x |",
        "| shaw | +0.020 | +0.060 | +0.170 | 8x |",
        "| xpos | +0.010 | +0.040 | +0.080 | 16x |",
        "| rope | +1.100 | +1.500 | +2.000 | no |",
    ]
    # A row that holds again further out holds to the first length it does not.
    assert language.holds_to({512: 0.01, 1024: 0.2, 2048: 0.0}) == 512
    assert language.holds_to({512: 0.06}) is None
    # Up to 8x there is one column; short of 8x, no table.
    short = demo_config.FULL.replace(lengths=[64, 128, 256, 512])
    assert language.rise_table(PARTING, short).splitlines()[0] == (
        "| encoding | 512 (8x) | holds to |"
    )
    assert language.rise_table(PARTING, short.replace(lengths=[64, 256])) == ""


def test_findings_say_where_the_encodings_part():
    lines = language.findings(PARTING, demo_config.FULL, entropy_rate=1.85)
    assert (
        "Hold at 512 (8x), within 0.05 nats of their loss at 64: alibi, shaw, xpos."
        in lines
    )
    assert "Hold at 1024 (16x): alibi, xpos; part there: shaw (+0.060)." in lines
    assert "Hold at 2048 (32x): alibi; part there: xpos (+0.080)." in lines
    assert "ALiBi: -0.020 nats from length 64 to 2048 (within 0.05: yes)." in lines


def test_findings_state_the_directions():
    config = demo_config.DEFAULT.replace(lengths=[64, 128, 256, 512])
    results = {
        "alibi": {64: 1.90, 128: 1.90, 256: 1.91, 512: 1.92},
        "learned": {64: 1.9, 128: None, 256: None, 512: None},
        "rope": {64: 1.90, 128: 2.1, 256: 2.5, 512: 3.0},
        "rope + yarn": {64: 1.90, 128: 2.0, 256: 2.1, 512: 2.2},
        "rope + linear": {64: 1.90, 128: 2.2, 256: 2.9, 512: 3.5},
        # Lower, but not at the three decimals printed.
        "rope + dynamic": {64: 1.90, 128: 2.1, 256: 2.4998, 512: 3.0},
    }
    lines = language.findings(results, config, entropy_rate=1.85)
    assert "ALiBi: +0.020 nats from length 64 to 512 (within 0.05: yes)." in lines
    assert "rope: +1.100 nats from length 64 to 512." in lines
    assert "learned: 1.900 at 64; n/a past its 64 positions." in lines
    # The schedules are compared at 4x the trained length.
    assert "rope + yarn: 2.100 at 256 against plain RoPE's 2.500 (better: yes)." in lines
    assert "rope + linear: 2.900 at 256 against plain RoPE's 2.500 (better: no)." in lines
    assert "rope + dynamic: 2.500 at 256 against plain RoPE's 2.500 (better: tie)." in lines
    assert (
        "Hold at 512 (8x), within 0.05 nats of their loss at 64: alibi." in lines
    )
    short_config = config.replace(lengths=[64, 128])
    lines = language.findings(results, short_config, entropy_rate=1.85)
    assert "rope + yarn: 2.000 at 128 against plain RoPE's 2.100 (better: yes)." in lines
    assert lines[-1] == "Entropy rate of the source (the floor): 1.850."


def test_markov_source_describes_itself_and_streams_its_samples(source):
    line = source.describe()
    assert "(seed 3)" in line
    assert f"{source.entropy_rate:.3f} nats per symbol" in line
    stream = source.evaluation_stream(5, 40, np.random.default_rng(7))
    np.testing.assert_array_equal(
        stream, source.sample(5, 40, np.random.default_rng(7))
    )


# Names whose sorted order differs from the order they are written in.
PYTHON_FILE_NAMES = [
    f"{letter}{index}.py" for index, letter in enumerate("qwertyuiopasdfghjklzxcv")
]


@pytest.fixture
def python_directory(tmp_path):
    """23 small `.py` files of random bytes, and things that are not them."""
    rng = np.random.default_rng(0)
    for name in PYTHON_FILE_NAMES:
        size = int(rng.integers(40, 120))
        content = rng.integers(0, 256, size).astype("uint8")
        (tmp_path / name).write_bytes(content.tobytes())
    (tmp_path / "notes.txt").write_bytes(b"not python")
    (tmp_path / "setup.pyc").write_bytes(b"compiled")
    package = tmp_path / "package.py"
    package.mkdir()
    (package / "inner.py").write_bytes(b"print('inside')\n")
    return tmp_path


def read_bytes(directory, names):
    text = b"".join((directory / name).read_bytes() for name in names)
    return np.array(list(text), dtype="int64")


def test_python_source_splits_the_sorted_files(python_directory):
    source = language.PythonSource(str(python_directory))
    names = sorted(PYTHON_FILE_NAMES)
    # Positions 10 and 20 of the sorted list, counting from 1.
    held_out = [name for number, name in enumerate(names, 1) if number % 10 == 0]
    assert source.test_files == held_out
    assert len(held_out) == 2
    assert source.train_files == [name for name in names if name not in held_out]
    assert set(source.train_files).isdisjoint(source.test_files)
    assert sorted(source.train_files + source.test_files) == names
    assert source.vocabulary_size == 256
    assert source.entropy_rate is None
    for split, files in (
        (source.train_bytes, source.train_files),
        (source.test_bytes, source.test_files),
    ):
        assert split.dtype == np.int32
        np.testing.assert_array_equal(split, read_bytes(python_directory, files))
    # Bytes past 127 stay positive: read as unsigned.
    assert source.train_bytes.max() > 127 and source.train_bytes.min() >= 0
    line = source.describe()
    assert "the 23 .py files" in line and "21 files" in line and "2 files" in line


def test_python_source_samples_runs_of_the_training_text(python_directory):
    source = language.PythonSource(str(python_directory))
    text = read_bytes(python_directory, source.train_files)
    length = 17
    rows = source.sample(50, length, np.random.default_rng(4))
    assert rows.shape == (50, length) and rows.dtype == np.int32
    runs = np.lib.stride_tricks.sliding_window_view(text, length)  # (starts, length)
    for row in rows:
        assert np.any(np.all(runs == row, axis=1))
    np.testing.assert_array_equal(
        rows, source.sample(50, length, np.random.default_rng(4))
    )
    assert not np.array_equal(
        rows, source.sample(50, length, np.random.default_rng(5))
    )
    # Every start is possible, up to the last run that fits.
    whole = source.sample(3, len(text), np.random.default_rng(0))
    np.testing.assert_array_equal(whole, np.tile(text, (3, 1)))
    shifted = source.sample(60, len(text) - 1, np.random.default_rng(1))
    assert set(map(tuple, shifted)) == {tuple(text[:-1]), tuple(text[1:])}


def test_python_source_evaluates_evenly_spaced_held_out_runs(python_directory):
    source = language.PythonSource(str(python_directory))
    text = read_bytes(python_directory, source.test_files)
    rows, width = 4, 20
    stream = source.evaluation_stream(rows, width, np.random.default_rng(0))
    assert stream.shape == (rows, width)
    spacing = len(text) // rows
    for row in range(rows):
        np.testing.assert_array_equal(
            stream[row], text[row * spacing : row * spacing + width]
        )
    # The runs are fixed: the generator is not read.
    np.testing.assert_array_equal(stream, source.evaluation_stream(rows, width))
    too_wide = len(text) // rows + 1
    with pytest.raises(
        ValueError, match=rf"rows={rows}, width={too_wide}"
    ):
        source.evaluation_stream(rows, too_wide)


def test_python_source_reads_the_standard_library():
    source = language.PythonSource()
    assert len(source.train_files) + len(source.test_files) >= 100
    assert len(source.train_bytes) + len(source.test_bytes) > 1_000_000
    assert len(source.test_files) == (
        len(source.train_files) + len(source.test_files)
    ) // 10
    for split in (source.train_bytes, source.test_bytes):
        assert split.min() >= 0 and split.max() < 256
    assert "os.py" in source.train_files + source.test_files


def fake_clock(monkeypatch, times):
    """Make the language task's `time.perf_counter` return `times` in turn."""
    ticks = iter(times)
    monkeypatch.setattr(
        language, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks))
    )


def test_call_times_time_each_call_alone(monkeypatch):
    fake_clock(monkeypatch, [10.0, 11.0, 13.0, 13.5, 20.0, 24.0])
    timer = language.CallTimes()
    for call in range(3):
        timer.on_train_batch_begin(call)
        timer.on_train_batch_end(call)
    # What happens between the calls (13 to 13.5 s) is not counted.
    assert timer.durations == [1.0, 0.5, 4.0]


def tiny_model(steps_per_execution):
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6)])
    model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    return model


def test_training_speeds_interleave_rounds_and_take_the_median(monkeypatch):
    keras.utils.set_random_seed(0)
    models = {"a": tiny_model(2), "b": tiny_model(2), "c": tiny_model(1)}
    inputs = np.random.default_rng(0).normal(size=(16, 6)).astype("float32")
    for model in models.values():
        model.fit(inputs, inputs, batch_size=2, verbose=0)
    calls, seconds = [], iter([3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 1.0, 2.0, 3.0])
    original_fit = keras.Model.fit

    def timed_fit(self, *args, callbacks=(), **kwargs):
        name = next(name for name, model in models.items() if model is self)
        calls.append((name, bool(callbacks)))
        history = original_fit(self, *args, callbacks=callbacks, **kwargs)
        if callbacks:
            (timer,) = callbacks
            timer.durations = [next(seconds)]  # one call each
        return history

    monkeypatch.setattr(keras.Model, "fit", timed_fit)
    speeds = language.training_speeds(models, inputs, inputs, 2, rounds=3)
    # One untimed call each first (a call that traces is not timed); then
    # the order turns by one model each round.
    assert calls[:3] == [("a", False), ("b", False), ("c", False)]
    assert calls[3:] == [
        (name, True) for name in ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    ]
    # In that order a took 3, 6 and 2 s (median 3) for 2 steps of 2 rows of
    # 6 tokens; b 1, 5 and 3 (median 3); c 2, 4 and 1 (median 2) for its
    # 1 step.
    assert speeds == pytest.approx({"a": 24 / 3.0, "b": 24 / 3.0, "c": 12 / 2.0})


def test_training_speeds_of_real_calls():
    keras.utils.set_random_seed(0)
    models = {"a": tiny_model(2), "b": tiny_model(4)}
    inputs = np.random.default_rng(0).normal(size=(6, 6)).astype("float32")
    for model in models.values():
        model.fit(inputs, inputs, batch_size=2, verbose=0)
    started = time.perf_counter()
    speeds = language.training_speeds(models, inputs, inputs, 2, rounds=2)
    elapsed = time.perf_counter() - started
    assert set(speeds) == {"a", "b"}
    # b's call holds the 3 steps there are, not 4; no call took longer than
    # the whole.
    assert speeds["a"] * elapsed >= 2 * 2 * 6
    assert speeds["b"] * elapsed >= 3 * 2 * 6


SEED_VALUES = {16: [1.2, 1.5, 1.1], 32: [2.0, 2.6, 2.3]}


def sample_std(values):
    centre = sum(values) / len(values)
    return math.sqrt(
        sum((value - centre) ** 2 for value in values) / (len(values) - 1)
    )


def three_seeds():
    return [
        {
            "alibi": {16: SEED_VALUES[16][seed], 32: SEED_VALUES[32][seed]},
            "learned": {16: 0.5 + seed, 32: None},
        }
        for seed in range(3)
    ]


def test_combine_gathers_the_seeds():
    results = training.combine(three_seeds())
    assert list(results) == ["alibi", "learned"]
    assert results["alibi"] == SEED_VALUES
    assert results["learned"] == {16: [0.5, 1.5, 2.5], 32: None}
    assert training.mean(results["learned"][16]) == pytest.approx(1.5)
    assert training.mean(None) is None


def parse_cell(text):
    centre, spread = text.split(" ± ")
    return float(centre), float(spread)


def test_cells_give_the_mean_and_the_sample_deviation():
    for values in SEED_VALUES.values():
        centre, spread = parse_cell(training.cell(values))
        assert centre == pytest.approx(sum(values) / 3, abs=5e-4)
        assert spread == pytest.approx(sample_std(values), abs=5e-4)
    assert training.cell(None) == "n/a"
    assert training.cell([1.23456]) == "1.235"


def test_markdown_table_of_three_seeds():
    results = training.combine(three_seeds())
    extra = [("speed", {"alibi": "1,000"}), ("note", {"learned": "short"})]
    table = training.format_markdown(results, [16, 32], ["at 16", "at 32"], extra=extra)
    header, rule, alibi, learned = table.splitlines()
    assert header == "| encoding | at 16 | at 32 | speed | note |"
    assert rule == "|---|---:|---:|---:|---:|"
    cells = [text.strip() for text in alibi.strip("|").split("|")]
    assert cells[0] == "alibi"
    for text, length in zip(cells[1:3], (16, 32)):
        centre, spread = parse_cell(text)
        assert centre == pytest.approx(sum(SEED_VALUES[length]) / 3, abs=5e-4)
        assert spread == pytest.approx(sample_std(SEED_VALUES[length]), abs=5e-4)
    assert cells[3:] == ["1,000", ""]
    cells = [text.strip() for text in learned.strip("|").split("|")]
    assert cells[2:] == ["n/a", "", "short"]
    assert parse_cell(cells[1]) == pytest.approx((1.5, 1.0), abs=5e-4)
    # Headers default to the columns' keys; one seed has no spread.
    single = training.combine(three_seeds()[:1])
    table = training.format_markdown(single, [16, 32])
    assert table.splitlines()[0] == "| encoding | 16 | 32 |"
    assert table.splitlines()[2] == "| alibi | 1.200 | 2.000 |"


def test_csv_of_three_seeds(tmp_path):
    results = training.combine(three_seeds())
    path = tmp_path / "table.csv"
    training.write_csv(
        path,
        results,
        [16, 32],
        extra=[("tokens/s", {"alibi": 1234.56, "learned": None})],
    )
    with open(path, newline="") as file:
        header, alibi, learned = list(csv.reader(file))
    assert header == ["encoding", "16", "16 std", "32", "32 std", "tokens/s"]
    assert alibi[0] == "alibi"
    for column, length in ((1, 16), (3, 32)):
        values = SEED_VALUES[length]
        assert float(alibi[column]) == pytest.approx(sum(values) / 3, abs=5e-5)
        assert float(alibi[column + 1]) == pytest.approx(sample_std(values), abs=5e-5)
    assert float(alibi[5]) == pytest.approx(1234.6)
    assert learned[0] == "learned"
    assert [float(text) for text in learned[1:3]] == pytest.approx([1.5, 1.0])
    assert learned[3:] == ["n/a", "n/a", ""]
    # One seed: no std columns.
    training.write_csv(path, training.combine(three_seeds()[:1]), [16, 32], ["a", "b"])
    with open(path, newline="") as file:
        assert list(csv.reader(file)) == [
            ["encoding", "a", "b"],
            ["alibi", "1.2000", "2.0000"],
            ["learned", "0.5000", "n/a"],
        ]


def test_seeds_follow_the_first():
    config = demo_config.DEFAULT.replace(seed=5, num_seeds=3)
    assert list(training.seeds(config)) == [5, 6, 7]
    assert "3 seeds (5, 6, 7)" in training.seeds_line(config)
    assert list(training.seeds(demo_config.DEFAULT.replace(seed=5))) == [5]
    assert training.seeds_line(demo_config.DEFAULT.replace(seed=5)).startswith("One seed (5)")


def test_speed_columns_compare_with_sinusoidal_and_press():
    speeds = {
        "sinusoidal": [1000.0, 1200.0],
        "rope": [770.0],  # 0.7 of sinusoidal's mean, 1100
        "t5": [550.0],
        "none": [],  # never timed
    }
    (count_header, counts), (ratio_header, ratios), (press_header, press) = (
        language.speed_columns(speeds)
    )
    assert count_header == "train tokens/s"
    assert counts == {"sinusoidal": "1,100", "rope": "770", "t5": "550"}
    assert ratio_header == "÷ sinusoidal"
    assert ratios == {"sinusoidal": "1.00x", "rope": "0.70x", "t5": "0.50x"}
    assert press_header == "Press et al. ÷ sinusoidal"
    assert press == {
        "sinusoidal": "1.00x",
        "rope": f"{20.0 / 28.5:.2f}x",
        "t5": f"{14.4 / 28.5:.2f}x",
    }
    assert press["rope"] == "0.70x" and press["t5"] == "0.51x"
    # Without sinusoidal there is nothing to divide by.
    (_, counts), (_, ratios), (_, press) = language.speed_columns({"alibi": [500.0]})
    assert counts == {"alibi": "500"} and ratios == {}
    assert press == {"alibi": f"{28.3 / 28.5:.2f}x"}


def test_findings_of_real_text_and_speeds():
    config = demo_config.QUICK
    results = {
        "sinusoidal": {16: 2.0, 32: 2.5, 64: 3.0},
        "rope": {16: 1.9, 32: 2.2, 64: 2.6},
    }
    lines = language.findings(results, config, entropy_rate=None)
    assert not any("Entropy rate" in line for line in lines)
    assert not any("Training speed" in line for line in lines)
    assert "rope: +0.700 nats from length 16 to 64." in lines
    speeds = {"sinusoidal": 1000.0, "rope": 700.0, "none": None}
    lines = language.findings(results, config, entropy_rate=None, speeds=speeds)
    assert lines[-1] == (
        "Training speed against sinusoidal: rope 0.70x (Press et al. 0.70x)."
    )
    lines = language.findings(results, config, entropy_rate=1.5, speeds=speeds)
    assert lines[-2].startswith("Training speed against sinusoidal:")
    assert lines[-1] == "Entropy rate of the source (the floor): 1.500."


def test_model_over_bytes_has_a_logit_per_byte():
    keras.utils.set_random_seed(0)
    model = language.build_model("alibi", 16, vocabulary_size=256)
    (embedding,) = [
        layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)
    ]
    assert embedding.input_dim == 256
    token_ids = np.array([[0, 255, 128, 7, 200]], "int32")
    logits = model.predict(token_ids, verbose=0)
    assert logits.shape == (1, 5, 256)
    assert np.all(np.isfinite(logits))


def test_save_and_reload_checks_the_predictions(tmp_path, capsys):
    keras.utils.set_random_seed(0)
    model = language.build_model("rope", 8)
    probe = np.arange(16, dtype="int32").reshape(2, 8) % VOCAB
    # Trained a step, as the demo's models are: its optimizer has state,
    # built before `fit` as `training.fit` builds it (one trace, not two).
    model.optimizer.build(model.trainable_variables)
    model.fit(probe, probe, verbose=0)
    reloaded = training.save_and_reload(model, str(tmp_path / "lm.keras"), [probe])
    assert reloaded is not model
    np.testing.assert_array_equal(
        model.predict(probe, verbose=0), reloaded.predict(probe, verbose=0)
    )
    assert "predictions identical" in capsys.readouterr().out


# `--gpu`'s configuration with its lengths 32 times shorter, trained at 16
# and scored at 16 to 512 (32x), on 512 tokens read in one call per length.
SCALE = 32
SMALL_GPU = demo_config.GPU.replace(
    train_length=demo_config.GPU.train_length // SCALE,
    lengths=[length // SCALE for length in demo_config.GPU.lengths],
    evaluation_tokens=demo_config.GPU.lengths[-1] // SCALE,
    evaluation_batch_tokens=demo_config.GPU.lengths[-1] // SCALE,
)


@pytest.fixture(scope="module")
def two_seed_run(tmp_path_factory):
    """`SMALL_GPU` without positions over two seeds, one step each, with a hook.

    The hook prints a line before each timing. Not judged and not compiled,
    and with no position scheme, whose eager calls at 512 take seconds, to
    be quick.

    Returns:
        Its status, the lines it printed, its output folder, and the
        `batch_tokens` of every call of `mean_nll`.
    """
    config = SMALL_GPU.replace(
        encodings=("none",), steps=1, num_seeds=2, jit_compile=False, judged=False
    )
    out_dir = tmp_path_factory.mktemp("language")
    batch_tokens = []
    mean_nll = language.mean_nll

    def recording_mean_nll(model, windows, tokens):
        batch_tokens.append(tokens)
        return mean_nll(model, windows, tokens)

    def before_timing():
        print("BEFORE TIMING")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(language, "mean_nll", recording_mean_nll)
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            status = language.run(config, out_dir, before_timing=before_timing)
    return status, printed.getvalue().splitlines(), out_dir, batch_tokens


def test_a_small_gpu_run_scores_to_32x_and_says_where_its_encodings_part(
    two_seed_run,
):
    status, lines, out_dir, batch_tokens = two_seed_run
    assert status == 0
    # Every evaluation read batches of the configuration's size.
    assert batch_tokens and set(batch_tokens) == {SMALL_GPU.evaluation_batch_tokens}
    assert sorted(path.name for path in out_dir.glob("*.keras")) == [
        "lm_none_seed0.keras",
        "lm_none_seed1.keras",
    ]
    with open(out_dir / "nll.csv", newline="") as file:
        header, none = list(csv.reader(file))
    assert header[1::2][:6] == [str(length) for length in SMALL_GPU.lengths]
    means = dict(zip(SMALL_GPU.lengths, map(float, none[1::2][:6])))
    markdown = (out_dir / "nll.md").read_text()
    assert "| 16 | 32 | 64 | 128 | 256 | 512 |" in markdown
    rise_header = "| encoding | 128 (8x) | 256 (16x) | 512 (32x) | holds to |"
    row = markdown.split(rise_header)[1].splitlines()[2]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[0] == "none"
    # The rises of the CSV's means (four decimals), to the table's three.
    for cell, length in zip(cells[1:4], (128, 256, 512)):
        assert float(cell) == pytest.approx(means[length] - means[16], abs=6e-4)
    assert cells[4] in ("no", "8x", "16x", "32x")
    assert (out_dir / "nll.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_judged_run_prints_its_findings_and_a_quick_one_a_note(
    two_seed_run, tmp_path, capsys
):
    status, lines, _, _ = two_seed_run
    assert status == 0
    printed = "\n".join(lines)
    assert training.QUICK_NOTE in printed
    assert "ALiBi: " not in printed and "(the floor)" not in printed
    config = demo_config.QUICK.replace(encodings=("alibi",), steps=1)
    assert language.run(config.replace(judged=True), tmp_path) == 0
    printed = capsys.readouterr().out
    assert training.QUICK_NOTE not in printed
    assert "ALiBi: " in printed and "nats from length 16 to 64" in printed


def test_run_calls_before_timing_before_each_seeds_timing(two_seed_run):
    status, lines, _, _ = two_seed_run
    assert status == 0
    marks = [index for index, line in enumerate(lines) if line == "BEFORE TIMING"]
    timings = [
        index
        for index, line in enumerate(lines)
        if line.startswith("Timing training:")
    ]
    # Each seed: its model trained and evaluated, the hook, a blank line,
    # then the timing.
    assert len(marks) == 2
    assert timings == [mark + 2 for mark in marks]
    seed_one = lines.index("[language 2/2, seed 1] Training with none:")
    assert marks[0] < seed_one < marks[1]


def test_each_training_stream_is_its_own_and_not_the_evaluations():
    # An encoding added to the registry changes no other row: the streams
    # of the others and the evaluation's stay as they were.
    streams = [language._training_stream(encoding) for encoding in language.ENCODINGS]
    assert len(set(streams)) == len(streams)
    assert language.EVALUATION_STREAM not in streams
    assert streams[: language.EVALUATION_STREAM] == list(range(language.EVALUATION_STREAM))
