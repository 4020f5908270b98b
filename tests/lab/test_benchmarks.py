import contextlib
import inspect
import io
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_posenc_lab.bench import absolute
from keras_posenc_lab.bench import attention
from keras_posenc_lab.bench import decoding
from keras_posenc_lab.bench import grid
from keras_posenc_lab.bench import grouped
from keras_posenc_lab.bench import rotary_embedding
from keras_posenc_lab.bench import suite
from keras_posenc_lab.bench import timing
from keras_posenc_lab.cli import main

# A tiny shape: these tests check that the benchmark runs, not its speed,
# which only `python -m keras_posenc_lab.bench.rotary_embedding` measures.
TINY_SHAPE = (1, 16, 2, 8)
# A ratio against keras-hub, the ratio of two identical copies, and the
# verdict the tables print for a target of 1.0x.
NOISE_CASES = [
    (0.99, 1.02, "| <= 1.0x | yes |"),
    # 1.01 is past 1.0 by less than two identical copies differ.
    (1.01, 0.98, "| <= 1.0x | within noise |"),
    (1.05, 1.02, "| <= 1.0x | no |"),
]


# The benchmarks in one `keras-posenc bench --tiny` run, whose report a test
# checks; each benchmark's own tests read its results there rather than time
# every candidate again, where the suite ran it at their tiny sizes.
BENCHMARKS = (absolute, rotary_embedding, attention, decoding, grid)


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """`bench --tiny`: its status, report file, output and each benchmark's run.

    The runs are `{module: (arguments, results)}`: the arguments of the
    suite's call of `module.run`, by name, and what it returned.
    """
    out = tmp_path_factory.mktemp("bench") / "results" / "bench.md"
    runs = {}

    def recording(module):
        run = module.run

        def recorded_run(*args, **kwargs):
            arguments = inspect.signature(run).bind(*args, **kwargs).arguments
            runs[module] = (dict(arguments), run(*args, **kwargs))
            return runs[module][1]

        return recorded_run

    with pytest.MonkeyPatch.context() as patch:
        for module in BENCHMARKS:
            patch.setattr(module, "run", recording(module))
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            status = main(["bench", "--tiny", "--out", str(out)])
    return status, out, printed.getvalue(), runs


def suite_results(tiny_bench, module, **arguments):
    """The results of `module.run` in `tiny_bench`, called with `arguments`."""
    called, results = tiny_bench[3][module]
    assert {name: called[name] for name in arguments} == arguments
    return results


def test_rotary_embedding_benchmark_times_every_candidate(tiny_bench):
    results = suite_results(
        tiny_bench, rotary_embedding, shape=TINY_SHAPE, repeats=2, warmup=1
    )
    assert set(results) == {
        "keras_posenc",
        "keras_hub",
        "floor",
        "keras_posenc_again",
        "keras_posenc_runtime_start",
        "keras_hub_runtime_start",
        "vs_keras_hub",
        "vs_floor",
        "vs_itself",
        "runtime_start_vs_keras_hub",
        "runtime_start_vs_floor",
    }
    for value in results.values():
        assert math.isfinite(value) and value > 0


def test_rotary_embedding_benchmark_prints_a_table(capsys):
    status = rotary_embedding.main(
        ["--shape", "1", "16", "2", "8", "--repeats", "2"]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "(1, 16, 2, 8)" in printed
    assert "| keras_posenc against | its median (ms) |" in printed
    for row in ("| keras_hub |", "| floor |", "| a second copy of itself"):
        assert row in printed
    assert "start index read at run time" in printed
    assert "<= 1.0x" in printed and "<= 1.2x" in printed


def test_compare_times_each_candidate_on_the_same_arguments():
    inputs = tf.ones((4, 8))
    medians = timing.compare(
        {"double": lambda x: 2.0 * x, "square": tf.square},
        (inputs,),
        repeats=3,
        warmup=1,
    )
    assert set(medians) == {"double", "square"}
    assert all(math.isfinite(value) and value > 0 for value in medians.values())
    assert timing.median_time(tf.square, inputs, repeats=1, warmup=0) > 0


def test_compare_needs_a_timed_call():
    with pytest.raises(ValueError, match="Received: repeats=0"):
        timing.compare({"square": tf.square}, (tf.ones(2),), repeats=0)


def test_rounds_pair_the_calls_and_paired_ratio_takes_their_median():
    seconds = timing.rounds(
        {"double": lambda x: 2.0 * x, "square": tf.square},
        (tf.ones((4, 8)),),
        repeats=4,
        warmup=1,
    )
    assert [len(times) for times in seconds.values()] == [4, 4]
    made_up = {"a": [1.0, 2.0, 9.0], "b": [2.0, 2.0, 3.0]}
    # Round ratios 0.5, 1.0 and 3.0: the median is the middle one.
    assert timing.paired_ratio(made_up, "a", "b") == 1.0


def rotary_results(vs_keras_hub, vs_itself):
    """Made-up results of `rotary_embedding.run`, to format."""
    return {
        "keras_posenc": 0.010,
        "keras_hub": 0.010,
        "floor": 0.009,
        "keras_posenc_again": 0.010,
        "keras_posenc_runtime_start": 0.02,
        "keras_hub_runtime_start": 0.02,
        "vs_keras_hub": vs_keras_hub,
        "vs_floor": 1.1,
        "vs_itself": vs_itself,
        "runtime_start_vs_keras_hub": 1.0,
        "runtime_start_vs_floor": 2.0,
    }


@pytest.mark.parametrize("vs_keras_hub, vs_itself, met", NOISE_CASES)
def test_table_tells_a_miss_from_noise(vs_keras_hub, vs_itself, met):
    table = rotary_embedding.format_table(rotary_results(vs_keras_hub, vs_itself))
    assert f"| keras_hub | 10.00 | {vs_keras_hub:.3f}x {met}" in table


def test_rotary_table_judges_a_start_index_read_at_run_time():
    results = rotary_results(1.0, 1.0)
    # Past both targets in the made-up results: 1.0x keras-hub, 2.0x floor.
    table = rotary_embedding.format_table(results)
    assert "| keras_hub | 20.00 | 1.000x | <= 0.5x | no |" in table
    assert "| floor | 9.00 | 2.000x | <= 1.2x | no |" in table
    results.update(runtime_start_vs_keras_hub=0.45, runtime_start_vs_floor=1.05)
    table = rotary_embedding.format_table(results)
    assert "| keras_hub | 20.00 | 0.450x | <= 0.5x | yes |" in table
    assert "| floor | 9.00 | 1.050x | <= 1.2x | yes |" in table


# A tiny attention: these tests check that the benchmark runs, not the
# numbers, which only `python -m keras_posenc_lab.bench.attention` measures.
TINY_ATTENTION = {"batch": 1, "length": 8, "heads": 2, "key_dim": 4}


@pytest.fixture(scope="module")
def attention_results(tiny_bench):
    return suite_results(
        tiny_bench,
        attention,
        **TINY_ATTENTION,
        repeats=2,
        warmup=1,
        memory_length=16,
        long_memory_length=32,
    )


def test_attention_benchmark_times_and_measures_every_candidate(
    attention_results,
):
    timed = ("plain", "plain_einsum_path", attention.CAUSAL_BASELINE) + attention.SCHEMES
    assert set(attention_results) == {
        *timed,
        "plain_einsum_path_again",
        *(
            f"{name}_{ratio}"
            for name in attention.SCHEMES + (attention.CAUSAL_BASELINE,)
            for ratio in ("vs_plain", "vs_plain_einsum_path")
        ),
        "plain_vs_plain_einsum_path",
        "vs_itself",
        *(f"{name}_peak_mib" for name in attention.MEMORY_CANDIDATES),
        *(
            f"{name}_memory_vs_plain_einsum_path"
            for name in attention.MEMORY_CANDIDATES
        ),
        *(f"{name}_long_peak_mib" for name in attention.MEMORY_CANDIDATES),
        "long_logits_mib",
        *(f"{name}_logits_writes" for name in attention.MEMORY_CANDIDATES),
    }
    for value in attention_results.values():
        assert math.isfinite(value) and value > 0
    # The long row at batch 1: 2 heads of 32 x 32 float32 logits.
    assert attention_results["long_logits_mib"] == 2 * 32 * 32 * 4 / 2**20
    assert attention_results["plain_einsum_path_long_peak_mib"] >= (
        attention_results["long_logits_mib"]
    )


def test_attention_peak_holds_the_logits_and_grows_as_length_squared():
    sizes = {"batch": 1, "heads": 2, "key_dim": 4}
    peaks = {
        length: attention.measure_peak("plain", length=length, **sizes)
        for length in (64, 128)
    }
    for length, peak in peaks.items():
        # Bytes of the float32 logits, (batch, heads, query, key).
        logits = sizes["batch"] * sizes["heads"] * length * length * 4
        assert peak >= logits
    # Twice the length, four times the logits; the projections grow twice.
    assert 3.5 < peaks[128] / peaks[64] <= 4


def _logits(inputs):
    return tf.einsum("bqd,bkd->bqk", inputs, inputs)  # (batch, query, key)


def _logits_and_their_exponentials(inputs):
    logits = _logits(inputs)
    return logits, tf.exp(logits)


def test_compiled_bytes_count_each_tensor_the_call_keeps():
    inputs = tf.ones((2, 64, 8))
    logits_bytes = 2 * 64 * 64 * 4
    alone, with_exponentials = (
        attention.compiled_bytes(tf.function(fn, jit_compile=True), inputs)
        for fn in (_logits, _logits_and_their_exponentials)
    )
    assert alone >= logits_bytes
    # A second (batch, query, key) tensor, and a few bytes for the tuple.
    assert logits_bytes <= with_exponentials - alone < logits_bytes + 64


def test_attention_benchmark_table_has_every_scheme_and_target(
    attention_results,
):
    table = attention.format_table(attention_results)
    assert (
        "| scheme | median (ms) | / einsum path | target | met | / plain |"
    ) in table
    assert "| peak (MiB) | / einsum path | target | met |" in table
    for name in attention.MEMORY_CANDIDATES:
        # Once in the timed table and once in the long row's.
        assert table.count(f"| {attention.LABELS[name]} |") == 2
    assert "| a second copy of the einsum path (noise) |" in table
    for target in ("1.05", "1.10", "1.25", "1.00", "1.15"):
        assert f"<= {target}x" in table
    assert "beyond one logits tensor (0 MiB)" in table


def test_attention_benchmark_prints_a_table(capsys):
    status = attention.main(
        [
            "--batch", "1", "--length", "8", "--heads", "2", "--key-dim", "4",
            "--repeats", "2", "--no-memory",
        ]
    )  # fmt: skip
    assert status == 0
    printed = capsys.readouterr().out
    assert "(1, 8, 8) float32 input, 2 heads of key_dim 4" in printed
    assert "| scheme | median (ms) | / einsum path | target | met |" in printed
    assert "peak (MiB)" not in printed
    for name in ("plain",) + attention.SCHEMES:
        assert f"| {attention.LABELS[name]} |" in printed


def test_attention_table_tells_a_miss_from_noise():
    results = {
        name: 0.1
        for name in (
            "plain",
            "plain_einsum_path",
            "plain_einsum_path_again",
            attention.CAUSAL_BASELINE,
        )
        + attention.SCHEMES
    }
    # Each scheme at its target, unless set below.
    results.update(
        {f"{name}_vs_plain_einsum_path": attention.TARGETS[name] for name in attention.SCHEMES}
    )
    results.update(
        {f"{name}_vs_plain": 1.0 for name in attention.SCHEMES},
        **{f"{name}_logits_writes": 3 for name in attention.MEMORY_CANDIDATES},
        plain_vs_plain_einsum_path=1.2,
        plain_einsum_path_causal_vs_plain_einsum_path=1.25,
        vs_itself=1.02,
        rope_vs_plain_einsum_path=1.04,  # under 1.05
        alibi_vs_plain_einsum_path=1.06,  # past 1.05 by less than the noise
        t5_vs_plain_einsum_path=1.30,
        shaw_vs_plain_einsum_path=1.20,  # under 1.25
        transformer_xl_vs_plain_einsum_path=1.70,  # past 1.6
        deberta_vs_plain_einsum_path=1.38,  # under 1.4
        xpos_vs_plain_einsum_path=1.049,  # under 1.05
        cope_vs_plain_einsum_path=1.65,  # past 1.6 by more than the noise
    )
    table = attention.format_table(results)
    assert "| 1.040x | <= 1.05x | yes |" in table
    assert "| 1.060x | <= 1.05x | within noise |" in table
    assert "| 1.300x | <= 1.10x | no |" in table
    assert "| 1.200x | <= 1.25x | yes |" in table
    assert "| 1.700x | <= 1.60x | no |" in table
    assert "| 1.380x | <= 1.40x | yes |" in table
    assert "| 1.049x | <= 1.05x | yes |" in table
    assert "| 1.650x | <= 1.60x | no |" in table
    assert "| plain, `dot_product_attention` path | 100.0 | 1.200x |" in table
    causal = attention.LABELS[attention.CAUSAL_BASELINE]
    assert f"| {causal} | 100.0 | 1.250x |  |  |  | 3 |" in table


def test_attention_table_judges_memory_in_whole_mib():
    timed = (
        "plain",
        "plain_einsum_path",
        "plain_einsum_path_again",
        attention.CAUSAL_BASELINE,
    )
    results = {name: 0.1 for name in timed + attention.SCHEMES}
    results.update(
        {f"{name}_vs_plain": 1.0 for name in attention.SCHEMES},
        **{
            f"{name}_vs_plain_einsum_path": 1.0
            for name in attention.SCHEMES + (attention.CAUSAL_BASELINE,)
        },
        **{f"{name}_logits_writes": 2 for name in attention.MEMORY_CANDIDATES},
        plain_vs_plain_einsum_path=1.0,
        vs_itself=1.0,
    )
    peaks = {
        "plain_einsum_path": 560 + 56 / 2**20,  # 56 bytes of constants
        "plain": 1056.0,
        # The causal rows' baseline: xPos and CoPE are judged against it.
        attention.CAUSAL_BASELINE: 1056.0,
        "alibi": 560 + 120 / 2**20,  # 64 bytes more: under 1 MiB
        "rope": 561 + 56 / 2**20,  # 1 MiB more
        "t5": 616.4,  # 1.1007x, 616 MiB in whole MiB: 1.1x
        "shaw": 644.6,  # 1.1511x, 645 MiB: 1.152x
        "transformer_xl": 671.6,  # 1.1993x, 672 MiB: 1.2x
        "deberta": 672.4,  # 1.2007x, 672 MiB: 1.2x
        "xpos": 1162.0,  # 1.1004x the causal baseline's: 1.10x, a miss
        "cope": 900.0,  # no memory target
    }
    # The other schemes at the baseline's peak.
    peaks.update(
        {
            name: peaks["plain_einsum_path"]
            for name in attention.SCHEMES
            if name not in peaks
        }
    )
    for name, peak in peaks.items():
        results[f"{name}_peak_mib"] = peak
        results[f"{name}_memory_vs_plain_einsum_path"] = peak / peaks[
            "plain_einsum_path"
            if name == attention.CAUSAL_BASELINE
            else attention.baseline_of(name)
        ]
    lines = attention.format_table(results).splitlines()

    def memory_cells(name):
        (line,) = [
            line for line in lines if line.startswith(f"| {attention.LABELS[name]} |")
        ]
        return line.split(" | ")[-4:]

    assert memory_cells("alibi") == ["560", "1.00x", "<= 1.00x", "yes |"]
    assert memory_cells("rope") == ["561", "1.00x", "<= 1.00x", "no |"]
    assert memory_cells("t5") == ["616", "1.10x", "<= 1.10x", "yes |"]
    assert memory_cells("shaw") == ["645", "1.15x", "<= 1.15x", "no |"]
    assert memory_cells("transformer_xl") == ["672", "1.20x", "<= 1.20x", "yes |"]
    assert memory_cells("deberta") == ["672", "1.20x", "<= 1.20x", "yes |"]
    assert memory_cells("xpos") == ["1162", "1.10x", "<= 1.10x", "no |"]
    # Reported, not judged.
    assert memory_cells("cope")[:2] == ["900", "0.85x"]
    assert "yes" not in memory_cells("cope")[-1] and "no" not in memory_cells("cope")[-1]


def test_logits_writes_counts_the_passes_that_write_the_logits():
    # Plain attention on Keras' einsum path writes the logits (the first
    # product), their exponentials and the weights divided by their sums;
    # on its `dot_product_attention` path also the logits scaled; the
    # layer's softmax, normalized after the product with the values, one
    # fewer than the einsum path. ALiBi's bias (2 heads, slopes 1/16 and
    # 1/256) is added inside the exponentials: no pass of its own.
    sizes = {"batch": 2, "length": 64, "heads": 2, "key_dim": 8}
    assert attention.logits_writes("plain", **sizes) == 4
    assert attention.logits_writes("plain_einsum_path", **sizes) == 3
    assert attention.logits_writes("rope", **sizes) == 2
    assert attention.logits_writes("alibi", **sizes) == 2


# Tiny sizes: these tests check that the benchmark runs and that its
# candidates agree, not their speed, which `python -m keras_posenc_lab.bench.absolute`
# measures.
TINY_ABSOLUTE = {"shape": (1, 16, 8), "vocabulary_size": 50}


def test_absolute_benchmark_times_every_candidate(tiny_bench):
    results = suite_results(
        tiny_bench, absolute, **TINY_ABSOLUTE, repeats=2, warmup=1
    )
    expected = set()
    for encoding in absolute.ENCODINGS:
        others = ["floor", "itself"]
        names = ["keras_posenc", "keras_posenc_again", "floor"]
        if encoding in absolute.WITH_KERAS_HUB:
            others.append("keras_hub")
            names.append("keras_hub")
        expected |= {f"{encoding}_{name}" for name in names}
        expected |= {f"{encoding}_vs_{other}" for other in others}
    assert set(results) == expected
    assert "token_sinusoidal_keras_hub" not in results
    for value in results.values():
        assert math.isfinite(value) and value > 0


def test_absolute_benchmark_prints_a_table(capsys):
    status = absolute.main(
        ["--shape", "1", "16", "8", "--vocabulary-size", "50", "--repeats", "1"]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "(1, 16, 8) float32 tensor" in printed
    header = "| encoding | keras_posenc (ms) | keras-hub (ms) | floor (ms) |"
    assert header in printed
    for encoding in absolute.ENCODINGS:
        assert f"| {absolute.LABELS[encoding]} |" in printed
    assert "<= 1.0x" in printed and "<= 1.1x" in printed
    assert "keras-hub has no token embedding with a sinusoidal" in printed


def absolute_results(vs_keras_hub, vs_itself):
    """Made-up results of `absolute.run`, to format."""
    results = {}
    for encoding in absolute.ENCODINGS:
        results.update(
            {
                f"{encoding}_keras_posenc": 0.003,
                f"{encoding}_keras_posenc_again": 0.003,
                f"{encoding}_floor": 0.003,
                f"{encoding}_vs_floor": 1.05,
                f"{encoding}_vs_itself": vs_itself,
            }
        )
        if encoding in absolute.WITH_KERAS_HUB:
            results[f"{encoding}_keras_hub"] = 0.003
            results[f"{encoding}_vs_keras_hub"] = vs_keras_hub
    return results


@pytest.mark.parametrize("vs_keras_hub, vs_itself, met", NOISE_CASES)
def test_absolute_table_tells_a_miss_from_noise(vs_keras_hub, vs_itself, met):
    table = absolute.format_table(absolute_results(vs_keras_hub, vs_itself))
    row = (
        "| `PositionEmbedding` | 3.00 | 3.00 | 3.00 "
        f"| {vs_keras_hub:.3f}x {met} 1.050x | <= 1.1x | yes |"
    )
    assert row in table
    # No keras-hub layer: no keras-hub ratio, the floor's alone.
    assert (
        "| `TokenAndPositionEmbedding`, sinusoidal | 3.00 | (none) | 3.00 "
        "|  |  |  | 1.050x | <= 1.1x | yes |"
    ) in table


def test_absolute_benchmark_checks_that_candidates_agree():
    candidates = {"floor": tf.identity, "off_by_one": lambda x: x + 1.0}
    with pytest.raises(AssertionError, match="off_by_one and the floor"):
        absolute._check_agreement("learned", candidates, tf.zeros((1, 4, 2)), 4)


def test_bench_writes_the_machine_and_every_table(tiny_bench):
    status, out, printed, _ = tiny_bench
    assert status == 0
    assert "Timing additive encodings" in printed
    assert printed.rstrip().endswith(str(out))
    written = out.read_text()
    assert written in printed
    assert f"TensorFlow {tf.__version__}" in written
    assert f"{os.cpu_count()} logical cores" in written
    assert "GPUs seen by TensorFlow:" in written
    assert "buffer assignment" in written
    for header in (
        "| encoding | keras_posenc (ms) |",
        "| keras_posenc against | its median (ms) |",
        "| scheme | median (ms) | / einsum path | target | met | / plain |",
        "| peak (MiB) | / einsum path | target | met |",
        "| scheme | peak (MiB) | beyond one logits tensor",
        "| layer | median (ms) | against | ratio | target | met | / its 1-D path | noise |",
        "| attention | tokens/s | ms per token | / plain | target | met |",
    ):
        assert header in written
    # Tiny sizes time nothing worth judging: no verdict, and a note says so.
    assert suite.TINY_NOTE in written
    assert "| tiny run |" in written
    for verdict in ("| yes |", "| no |", "| within noise |"):
        assert verdict not in written


def test_verdicts_are_given_only_when_judged():
    assert timing.verdict(1.5, 1.0) == "no"
    assert timing.verdict(1.05, 1.0, noise=1.1) == "within noise"
    assert timing.verdict(0.9, 1.0) == "yes"
    assert timing.verdict(0.9, 1.0, judged=False) == "tiny run"


def test_machine_description_reads_proc_files(tmp_path):
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: A CPU: 2 GHz\nflags\t: fpu\n")
    assert suite._proc_field(str(fake), "model name") == "A CPU: 2 GHz"
    assert suite._proc_field(str(fake), "model") is None
    assert suite._proc_field(str(tmp_path / "missing"), "model name") is None
    if os.path.exists("/proc/meminfo"):
        # MemTotal and the physical pages both count the kernel's usable RAM.
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert suite._memory() == f"{total / 2**30:.1f} GiB"


def test_grid_benchmark_times_every_layer_against_its_baseline(tiny_bench):
    results = suite_results(tiny_bench, grid, **suite.TINY_GRID, repeats=2, warmup=1)
    assert set(results) == set(grid.TARGETS)
    for name, result in results.items():
        baseline = "vs_plain" if name.startswith("attention") else "vs_floor"
        assert math.isfinite(result[baseline]) and result[baseline] > 0
        if baseline == "vs_floor":
            assert math.isfinite(result["vs_line"]) and result["vs_line"] > 0
    table = grid.format_table(results, judged=False)
    assert table.count("| tiny run |") == len(grid.TARGETS)


def test_grid_benchmark_checks_that_the_layer_and_its_floor_agree():
    candidates = {"grid": tf.identity, "floor": lambda x: x + 1.0}
    with pytest.raises(AssertionError, match="the grid layer and its floor"):
        grid._check_agreement("sinusoidal", candidates, tf.zeros((1, 4, 2)), "floor")


def test_decoding_benchmark_times_every_candidate(tiny_bench):
    sizes = suite.TINY_DECODING
    results = suite_results(tiny_bench, decoding, **sizes, repeats=2, warmup=1)
    others = [name for name in decoding.CANDIDATES if name != decoding.BASELINE]
    assert set(results) == {
        *decoding.CANDIDATES,
        *(f"{name}_per_token" for name in decoding.CANDIDATES),
        *(f"{name}_tokens_per_second" for name in decoding.CANDIDATES),
        *(f"{name}_prefill" for name in decoding.CANDIDATES),
        *(f"{name}_vs_plain" for name in others if name != "plain_again"),
        *(f"{name}_prefill_vs_plain" for name in others),
        "vs_itself",
    }
    for value in results.values():
        assert math.isfinite(value) and value > 0
    assert results["plain_tokens_per_second"] == pytest.approx(
        sizes["batch"] * sizes["new_tokens"] / results["plain"]
    )
    table = decoding.format_table(results, judged=False)
    for name in ("rope", "alibi", "t5"):
        assert f"| {decoding.LABELS[name]} |" in table
    assert table.count("| <= 1.10x | tiny run |") == 3
    assert "| keras-hub `CachedMultiHeadAttention` |" in table


def test_decoding_benchmark_feeds_each_output_back():
    # Decoding is one token per step, each the last step's output: the loop
    # equals the layer called step by step.
    layer = decoding._layer("alibi", 2, 4)
    prompt = tf.random.stateless_normal((1, 5, 8), seed=[0, 0])
    _, cache = decoding._prefill(layer, False, 8, prompt)
    looped = tf.function(decoding._decode, jit_compile=True)(
        layer, False, 3, cache, prompt[:, -1:]
    )
    tokens = prompt[:, -1:]
    for step in range(3):
        tokens, cache = layer(
            tokens, tokens, cache=cache, cache_update_index=5 + step,
            use_causal_mask=True,
        )
        np.testing.assert_allclose(looped[:, step], tokens[:, 0], atol=1e-5)


def test_decoding_benchmark_checks_keras_hub_agrees(monkeypatch):
    # A keras-hub layer with other weights than plain's decodes otherwise.
    weights = decoding._layer
    monkeypatch.setattr(
        decoding,
        "_layer",
        lambda name, heads, key_dim: weights(
            "alibi" if name == "keras_hub" else name, heads, key_dim
        ),
    )
    with pytest.raises(AssertionError, match="decode differently"):
        decoding.run(batch=1, prompt=4, new_tokens=2, heads=2, key_dim=4, repeats=1)


def test_decoding_benchmark_prints_a_table(tiny_bench, monkeypatch, capsys):
    # The tiny bench's call at its sizes: its results, not a second run.
    calls = []

    def run(**arguments):
        calls.append(arguments)
        return suite_results(tiny_bench, decoding, **arguments)

    monkeypatch.setattr(decoding, "run", run)
    status = decoding.main(
        ["--prompt", "8", "--new-tokens", "4", "--heads", "2", "--key-dim", "4",
         "--repeats", "2"]
    )
    assert status == 0
    assert calls == [dict(suite.TINY_DECODING, repeats=2)]
    printed = capsys.readouterr().out
    assert "a 8-token prompt of batch 1" in printed
    assert "4 tokens decoded one at a time" in printed
    assert "| a second copy of plain (noise) |" in printed


GROUPED_TINY = dict(batch=2, length=6, heads=4, key_value_heads=2, key_dim=4, slots=5)


def test_grouped_benchmark_times_the_call_and_the_decoding_step():
    results = grouped.run(**GROUPED_TINY, repeats=2, warmup=1)
    for name in grouped.CANDIDATES + grouped.STEP_CANDIDATES:
        assert math.isfinite(results[name]) and results[name] > 0
    for name in ("plain", "rope", "keras_again", "rope_step"):
        assert math.isfinite(results[f"{name}_vs_baseline"])
    # The cache holds the key/value heads: half the multi-head cache here.
    assert results["cache_shape"] == (2, 2, 5, 2, 4)
    assert results["multi_head_cache_shape"] == (2, 2, 5, 4, 4)
    table = grouped.format_table(results, judged=False)
    assert "0.50 of the multi-head cache" in table
    assert table.count("| tiny run |") == 2
    assert f"| {grouped.LABELS['rope']} |" in table


def test_grouped_benchmark_checks_keras_agrees(monkeypatch):
    # The plain layer given other weights than Keras': the run must refuse.
    monkeypatch.setattr(grouped, "_copy_weights", lambda source, target: None)
    with pytest.raises(AssertionError, match="disagree"):
        grouped.run(**GROUPED_TINY, repeats=1, warmup=1)


def test_grouped_benchmark_prints_a_table(capsys):
    status = grouped.main(
        ["--batch", "1", "--length", "6", "--heads", "4", "--key-value-heads", "2",
         "--key-dim", "4", "--slots", "5", "--repeats", "1"]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "4 query heads and 2 key/value heads of 4" in printed
    assert "| a second copy of Keras' layer (noise) |" in printed
