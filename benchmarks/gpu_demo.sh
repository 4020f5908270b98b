#!/usr/bin/env bash
# The language task's GPU setting on one GPU, in under 6 minutes:
# `keras-posenc demo --task language --gpu`, trained at 512 tokens and
# scored at every doubling up to 16,384 (32x), on JAX by default
# (KERAS_BACKEND=torch for PyTorch). A run still going at its limit is
# stopped, and the script says so.
#
# The machine needs Python with JAX or PyTorch on CUDA; Keras and
# matplotlib come as wheels from $WHEELS (`benchmarks/gpu_wheels.sh`), the
# package from this checkout. The tables and the plot go to $OUT, or
# demo-gpu. Without a GPU it runs the same on the CPU, slowly: the tests
# run its setting small (tests/lab/test_language.py).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${WHEELS:-build/gpu-wheels}
python=${PYTHON:-python3}
out=${OUT:-demo-gpu}
if ! "$python" -c "import keras, matplotlib" 2>/dev/null; then
	"$python" -m pip install --quiet --no-index --find-links "$wheels" keras matplotlib
	# The package's own wheel for its metadata, without its dependencies
	# (TensorFlow among them); the code is this checkout's.
	"$python" -m pip install --quiet --no-index --no-deps --find-links "$wheels" \
		keras-posenc
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false
rc=0
KERAS_BACKEND=${KERAS_BACKEND:-jax} timeout --kill-after=10 "${GPU_DEMO_SECONDS:-350}" \
	"$python" -m keras_posenc_lab demo --task language --gpu --out "$out" || rc=$?
if ((rc == 124 || rc == 137)); then
	echo "gpu_demo.sh: stopped at its limit, after $SECONDS s"
fi
echo "gpu_demo.sh: $SECONDS s in all"
exit $rc
