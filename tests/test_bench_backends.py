"""The backends' benchmark runs, tiny, on the backend the tests run on.

What `benchmarks/gpu.sh` runs on a GPU, here on the CPU: every scheme's
row, its baseline and its ratio; nothing is judged (the times of a tiny
run mean nothing). TensorFlow has no fused kernel to compare: there the
benchmark says which one to run instead.
"""

import re

import pytest

from keras_posenc_lab.bench import backends
from tests.backend import BACKEND


# x-transformers scripts a function with `torch.jit.script`, which torch
# 2.13 deprecates: its warning, not the package's.
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_backends_benchmark_prints_every_scheme(capsys):
    arguments = ["--rounds", "1", "--batch", "1", "--length", "32"]
    if BACKEND == "tensorflow":
        with pytest.raises(SystemExit, match="KERAS_BACKEND=torch or KERAS_BACKEND=jax"):
            backends.main(arguments)
        return
    if BACKEND == "torch":
        # On the CPU each peak is a fresh process's: one of them here.
        peak = backends._cpu_peak_in_a_fresh_process("keras-posenc alibi", 1, 64)
        assert peak >= 0.0
    else:
        arguments += ["--memory", "--memory-length", "64"]
    backends.main(arguments)
    printed = capsys.readouterr().out
    schemes = backends.TORCH_TARGETS if BACKEND == "torch" else backends.SCHEMES
    for name in schemes:
        row = re.search(rf"^\| {name}\b.*$", printed, re.MULTILINE)
        assert row, f"no row for {name} in:\n{printed}"
        # A ratio and a memory peak that are numbers.
        assert re.search(r"\d+\.\d\dx", row.group(0)), row.group(0)
        assert "nan" not in row.group(0), row.group(0)
        if BACKEND == "jax":
            assert re.search(r"\| \d+ \|$", row.group(0)), row.group(0)
