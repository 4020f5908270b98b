#!/usr/bin/env bash
# The attention on a GPU, in one run of under 8 minutes: on PyTorch each
# scheme against x-transformers' `Attention(flash=True)` with the same
# scheme, on JAX against Keras' own `MultiHeadAttention`, both with the
# peak memory of one call at (1, 8192) and the flash rows (RoPE with
# `flash_attention=True` against Keras' flash attention, bfloat16).
#
# The machine needs Python with PyTorch and JAX on CUDA; Keras and
# x-transformers come as wheels from $WHEELS (`benchmarks/gpu_wheels.sh`
# downloads them), the package from this checkout. Without a GPU it runs
# the same on the CPU (`--quick` for a short check of that path).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${WHEELS:-build/gpu-wheels}
python=${PYTHON:-python3}
arguments=(--rounds 10 --memory --flash)
if [[ ${1:-} == --quick ]]; then
	arguments=(--rounds 1 --batch 1 --length 256 --memory --memory-length 512)
fi
if ! "$python" -c "import keras, x_transformers" 2>/dev/null; then
	"$python" -m pip install --quiet --no-index --find-links "$wheels" \
		keras x-transformers
	# The package's own wheel for its metadata, without its dependencies
	# (TensorFlow among them); the code is this checkout's.
	"$python" -m pip install --quiet --no-index --no-deps --find-links "$wheels" \
		keras-posenc
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=2
status=0
echo "## PyTorch"
KERAS_BACKEND=torch "$python" -m keras_posenc_lab.bench.backends "${arguments[@]}" || status=1
echo
echo "## JAX"
KERAS_BACKEND=jax "$python" -m keras_posenc_lab.bench.backends "${arguments[@]}" || status=1
exit $status
