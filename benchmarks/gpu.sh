#!/usr/bin/env bash
# The attention on a GPU, in one run of under 6 minutes: on PyTorch and on
# JAX, at (4, 4096, 512) and (4, 1024, 512), in float32 and bfloat16,
# forward and training step, each scheme against its peer (x-transformers'
# `Attention(flash=True)` with the same scheme on PyTorch,
# `jax.nn.dot_product_attention` written by hand with the scheme's tables
# or bias precomputed on JAX) with the benchmarks' targets; the kernels
# alone beside them (SDPA, FlexAttention, JAX's XLA and cuDNN attention);
# RoPE with `flash_attention=True` against Keras' flash attention; the
# peak memory of one call at (1, 32768); and every scheme's layer on the
# GPU against the same layer, same weights, on the CPU. The sections run
# in this order of priority: equality, memory, the comparisons (4096
# before 1024), the flash rows, the kernels alone (whose FlexAttention
# compiles are the longest). PyTorch gets half of what is left of the 6
# minutes, JAX the rest: past its budget, the candidates and sections left
# print a line each, and a process still running at its limit is stopped.
# The run exits with status 1 when an equality row fails (or a backend's
# run stops or fails).  The machine needs Python with PyTorch and JAX on
# CUDA; Keras and x-transformers come as wheels from $WHEELS
# (`benchmarks/gpu_wheels.sh` downloads them), the package from this
# checkout. Without a GPU it runs the same on the CPU (`--quick` for a
# short check of every section at tiny sizes, the training step in
# bfloat16 alone, with no time limit).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=${WHEELS:-build/gpu-wheels}
python=${PYTHON:-python3}
# Seconds from the start within which both backends finish: 6 minutes, less
# the 10 s each that `timeout` may wait before it kills.
deadline=$((SECONDS + ${GPU_SECONDS:-340}))
# Past its budget a backend starts no section; a section, and the start
# of the process, take at most this much more.
overrun=45
arguments=(--rounds 10 --length 4096 1024 --dtype float32 bfloat16
	--mode forward training --anchors --flash --equality
	--memory --memory-length 32768)
quick=false
if [[ ${1:-} == --quick ]]; then
	quick=true
	arguments=(--rounds 1 --batch 1 --length 32 --dtype bfloat16
		--mode training --anchors --flash --equality
		--memory --memory-length 256)
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
# One backend's run: `share` of the seconds left (2 for half, 1 for all).
run() {
	local backend=$1 share=$2 limit=() budget=() start=$SECONDS rc=0
	if ! $quick; then
		local seconds=$(((deadline - SECONDS) / share))
		budget=(--budget $((seconds > overrun ? seconds - overrun : 1)))
		limit=(timeout --kill-after=10 $((seconds > 1 ? seconds : 1)))
	fi
	"${limit[@]}" env KERAS_BACKEND="$backend" "$python" -m keras_posenc_lab.bench.backends \
		"${arguments[@]}" "${budget[@]}" || rc=$?
	if ((rc == 124 || rc == 137)); then
		echo "- stopped at its limit, after $((SECONDS - start)) s"
	fi
	echo "- $backend: $((SECONDS - start)) s"
	((rc == 0)) || status=1
}
echo "## PyTorch"
run torch 2
echo
echo "## JAX"
run jax 1
echo
echo "gpu.sh: $SECONDS s in all"
exit $status
