#!/usr/bin/env bash
# The wheels that `benchmarks/gpu.sh` and `gpu_demo.sh` install on a GPU
# machine that has PyTorch and JAX but no Keras and no network: Keras with
# the two packages it needs beyond those, x-transformers with its own,
# matplotlib with its own (the demo's plot). For Python 3.12 on
# x86-64 Linux; into build/gpu-wheels, or the folder given.
set -euo pipefail
cd "$(dirname "$0")/.."
folder=${1:-build/gpu-wheels}
mkdir -p "$folder"
python3 -m pip download --quiet --no-deps --only-binary=:all: \
	--python-version 3.12 --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	-d "$folder" "keras==3.15.1" namex optree "x-transformers==2.31.10" \
	einx frozendict loguru torch-einops-utils \
	matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing
# The package's wheel, for the metadata the lab reads.
python3 -m pip wheel --quiet --no-deps -w "$folder" .
ls "$folder"
