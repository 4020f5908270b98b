"""The backends' benchmark runs, tiny, on the backend the tests run on.

What `benchmarks/gpu.sh` runs on a GPU, here on the CPU: every scheme's
row, its baseline and its ratio, every section (the training step in
bfloat16, the kernels alone, the flash rows, memory, equality); nothing is
judged (the times of a tiny run mean nothing). TensorFlow has no fused
kernel to compare: there the benchmark says which one to run instead.
"""

import re

import numpy as np
import pytest

from keras_posenc_lab import encodings
from keras_posenc_lab.bench import backends
from tests.backend import BACKEND

# x-transformers scripts a function with `torch.jit.script`, which torch
# 2.13 deprecates: its warning, not the package's.
x_transformers_warning = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning"
)
# The benchmark compares PyTorch's and JAX's kernels: deselected on TensorFlow.
fused_backends_only = pytest.mark.fused_backends_only

TINY = ["--rounds", "1", "--batch", "1", "--length", "32"]


def sections(printed):
    """`{title: text}` of each `### title` of a run."""
    parts = re.split(r"^### (.*)$", printed, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


@x_transformers_warning
def test_the_backends_benchmark_prints_every_scheme(capsys):
    arguments = TINY + ["--memory", "--memory-length", "64"]
    if BACKEND == "tensorflow":
        with pytest.raises(SystemExit, match="KERAS_BACKEND=torch or KERAS_BACKEND=jax"):
            backends.main(arguments)
        return
    if BACKEND == "torch":
        # Where Linux cannot reset the high-water mark, each peak is a
        # fresh process's: one of them here.
        peak = backends._cpu_peak_in_a_fresh_process("keras-posenc alibi", 1, 64)
        assert peak >= 0.0
    assert backends.main(arguments) == 0
    printed = capsys.readouterr().out
    targets = backends.TORCH_TARGETS if BACKEND == "torch" else backends.JAX_TARGETS
    assert set(targets) == set(backends.SCHEMES)
    parts = sections(printed)
    (comparison,) = [text for title, text in parts.items() if "float32, forward" in title]
    (memory,) = [text for title, text in parts.items() if title.startswith("Memory")]
    for name in targets:
        row = re.search(rf"^\| {name} \|.*$", comparison, re.MULTILINE)
        assert row, f"no row for {name} in:\n{printed}"
        # A ratio and both first calls' times that are numbers.
        assert re.search(r"\| \d+\.\d\dx \|", row.group(0)), row.group(0)
        assert re.search(r"\| \d+\.\d\d / \d+\.\d\d \|$", row.group(0)), row.group(0)
        assert "nan" not in row.group(0), row.group(0)
        peak = re.search(rf"^\| keras-posenc {name} \| (\d+) \|", memory, re.MULTILINE)
        assert peak, f"no peak for {name} in:\n{memory}"
    assert "- failed" not in printed and "not measured" not in printed, printed


@fused_backends_only
@x_transformers_warning
def test_every_section_runs_tiny(capsys):
    # The bfloat16 training step, the kernels alone and the flash rows: what
    # the CPU lacks (cuDNN, a compiled FlexAttention, a flash kernel) is a
    # line, never a crash.
    arguments = TINY + ["--dtype", "bfloat16", "--mode", "training", "--anchors", "--flash"]
    assert backends.main(arguments) == 0
    printed = capsys.readouterr().out
    parts = sections(printed)
    assert len(parts) == 3, printed
    assert "- failed" not in printed, printed
    comparison, flash, anchors = parts.values()
    for name in backends.SCHEMES:
        assert re.search(rf"^\| {name} \|.*\| \d+\.\d\dx \|", comparison, re.MULTILINE), comparison
    plain = "SDPA, plain" if BACKEND == "torch" else "dot_product_attention, XLA, plain"
    assert re.search(rf"^\| {plain} \| \d+\.\d\d \| 1\.00x \|", anchors, re.MULTILINE), anchors
    assert "ALiBi" in anchors
    assert "| candidate | ms | first call s |" in flash


def test_the_equality_rows_cover_every_attention_scheme_of_the_registry():
    labels = [label for label, *_ in backends.equality_cases()]
    assert len(labels) == len(set(labels))
    for task, registry in encodings.TASKS.items():
        for name, encoding in registry.items():
            if encoding.role != "attention":
                continue
            assert any(
                label.split(",")[0] in (name, f"{task} {name}") for label in labels
            ), f"no equality row for {task}'s {name}"
    assert "plain" in labels and "plain, causal" in labels


@fused_backends_only
def test_an_equality_row_past_its_tolerance_fails_the_run(monkeypatch, capsys):
    cases = [
        case
        for case in backends.equality_cases()
        if case[0] in ("alibi, causal", "vision swin_bias", "graph shortest_path")
    ]
    monkeypatch.setattr(backends, "equality_cases", lambda: cases)
    section = [("equality", backends.equality_section)]
    assert not backends.run_sections(section, budget=None)
    printed = capsys.readouterr().out
    assert printed.count("| OK |") == 3, printed
    monkeypatch.setitem(backends.TOLERANCE, BACKEND, -1.0)
    assert backends.run_sections(section, budget=None)
    assert capsys.readouterr().out.count("| FAIL |") == 3


def test_a_failing_section_prints_a_line_and_the_others_run(capsys):
    def failing():
        raise RuntimeError("No valid triton configs\nout of resource")

    failed = backends.run_sections(
        [("first", failing), ("second", lambda: (["| row |"], ["a note"]))], budget=None
    )
    assert not failed
    printed = capsys.readouterr().out
    assert "- failed: RuntimeError: No valid triton configs\n" in printed
    assert "| row |\n- a note\n" in printed


@fused_backends_only
def test_past_the_budget_each_section_left_prints_a_line(capsys):
    arguments = TINY + ["--anchors", "--flash", "--equality", "--memory", "--budget", "0"]
    assert backends.main(arguments) == 0
    parts = sections(capsys.readouterr().out)
    assert len(parts) == 5
    for text in parts.values():
        assert text.strip().startswith("- skipped: the budget of 0 s is spent")


@pytest.mark.jax_only  # JAX's references are written with JAX
@pytest.mark.parametrize(
    "name, kind",
    [("rope", "rotary"), ("xpos", "rotary, causal"), ("alibi", "bias"), ("plain", "plain")],
)
def test_the_jax_references_compute_the_schemes(name, kind):
    # The hand-written attention, given the layer's weights, computes what
    # the layer computes: its tables and bias are the scheme's.
    import jax

    import keras_posenc

    length = 32
    layer = backends.keras_layer(name)
    if name == "alibi":
        # x-transformers' ALiBi without a causal mask: the same penalty both ways.
        layer = keras_posenc.PositionalMultiHeadAttention(
            backends.HEADS,
            backends.HEAD_DIM,
            position=keras_posenc.AlibiBias(backends.HEADS, bidirectional=True),
        )
        layer.build((1, None, backends.WIDTH), (1, None, backends.WIDTH))
    function, weights, constants = backends.jax_reference(kind, length, "float32", "xla")
    for part, dense in (
        ("query", layer.query_dense),
        ("key", layer.key_dense),
        ("value", layer.value_dense),
        ("output", layer.output_dense),
    ):
        weights[part] = dense.kernel.value
        weights[f"{part}_bias"] = dense.bias.value
    x = np.random.default_rng(0).normal(size=(2, length, backends.WIDTH)).astype("float32")
    expected = layer(x, x, use_causal_mask=backends.SCHEMES[name])
    actual = jax.jit(function)(weights, constants, x)
    np.testing.assert_allclose(actual, expected, atol=2e-5)
