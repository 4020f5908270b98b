# `make demo` and `make test` each set up .venv on first use, then run;
# `make test-oldest` sets up .venv-oldest, at the floor of every version
# range in setup.cfg's install_requires, and runs every public layer, the
# ops and the files there.
# `make test-jax` runs the kernel, the attention compiled, RoPE, the ops,
# every public layer and files across backends on Keras' JAX backend at the
# ceiling of the jax extra's range (on Python 3.12, which jax 0.11 and
# later need), `make test-jax-oldest` every public layer and the ops at its
# floor (on Python 3.11), and `make test-torch` the attention, its
# schemes, the ops and the docs' examples on PyTorch; each in a venv of its
# own, with the extra of its backend (the layers themselves need Keras
# alone).
# `make test-colab` runs the TPU notebook as on Colab's TPU runtime: in a
# venv of JAX and Keras alone, where its first cell installs the package.
PYTHON ?= python3
# The newest Python that setup.cfg declares, for the newest JAX and for
# Colab's runtime: pyenv's 3.12 where it is there (its shim answers only
# for the version selected), else python3.12 on the PATH.
PYTHON_NEWEST ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
OLDEST := .venv-oldest
OLDEST_STAMP := $(OLDEST)/.installed
JAX := .venv-jax
JAX_OLDEST := .venv-jax-oldest
TORCH := .venv-torch
COLAB := .venv-colab
# The floors of install_requires and of the extra named by $(1), as
# `name==floor` lines.
FLOORS = sed -n '/^install_requires =/,/^[^ ]/s/^ *\([A-Za-z0-9_.-]*\)>=\([^,; ]*\).*/\1==\2/p; /^$(1) =/,/^[^ ]/s/^ *\([A-Za-z0-9_.-]*\)>=\([^,; ]*\).*/\1==\2/p' setup.cfg

.PHONY: demo test test-oldest test-jax test-jax-oldest test-colab test-torch test-site docs clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[tensorflow,test,plot,demo,bench,docs]"
	touch $(STAMP)

# Each `name>=floor,...` line of install_requires and of the tensorflow
# extra becomes `name==floor`.
$(OLDEST_STAMP): setup.cfg pyproject.toml
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(call FLOORS,tensorflow) > $(OLDEST)/constraints.txt
	$(OLDEST)/bin/python -m pip install --quiet -e ".[tensorflow,test]" -c $(OLDEST)/constraints.txt
	touch $(OLDEST_STAMP)

$(JAX)/.installed: setup.cfg pyproject.toml
	test -x $(JAX)/bin/python || $(PYTHON_NEWEST) -m venv $(JAX)
	$(JAX)/bin/python -m pip install --quiet --upgrade pip
	$(JAX)/bin/python -m pip install --quiet -e ".[jax,tensorflow,test]"
	touch $@

$(JAX_OLDEST)/.installed: setup.cfg pyproject.toml
	test -x $(JAX_OLDEST)/bin/python || $(PYTHON) -m venv $(JAX_OLDEST)
	$(JAX_OLDEST)/bin/python -m pip install --quiet --upgrade pip
	$(call FLOORS,jax) > $(JAX_OLDEST)/constraints.txt
	$(JAX_OLDEST)/bin/python -m pip install --quiet -e ".[jax,test]" -c $(JAX_OLDEST)/constraints.txt
	touch $@

# TensorFlow beside JAX and beside PyTorch: `.keras` files cross between
# them (tests/test_cross_backend.py); x-transformers beside PyTorch, for the
# backends' benchmark (`bench-torch`).
# PyTorch's CPU build first, then the torch extra, which it satisfies. On
# PyPI, torch for Linux is a CUDA build of several GB: the CPU build comes
# from PyTorch's own index, `make test-torch TORCH_INDEX="--index-url
# https://download.pytorch.org/whl/cpu"`. On a machine whose pip finds a
# CPU wheel of the pinned torch on its own disk (pip's find-links),
# the pin alone takes that wheel.
TORCH_INDEX :=
$(TORCH)/.installed: setup.cfg pyproject.toml
	test -x $(TORCH)/bin/python || $(PYTHON) -m venv $(TORCH)
	$(TORCH)/bin/python -m pip install --quiet --upgrade pip
	$(TORCH)/bin/python -m pip install --quiet $(TORCH_INDEX) "torch==$(TORCH_VERSION)"
	$(TORCH)/bin/python -m pip install --quiet -e ".[torch,tensorflow,test,bench-torch]"
	touch $@

demo: $(STAMP)
	$(BIN)/keras-posenc demo

# Two workers (pytest-xdist), each file's tests on one of them: the suite's
# module-scoped fixtures (trained models, built sites) are made once.
PYTEST_WORKERS := -n 2 --dist loadfile
# XLA's CPU code unoptimized by LLVM: most of a compile's time on a CPU is
# LLVM's, and the tests check values, not speed (the benchmarks do).
XLA_TEST_FLAGS := --xla_backend_optimization_level=0

# The TPU notebook runs in `make test-colab`, on JAX as on Colab. The
# docs are built with `mkdocs build --strict` by tests/test_site.py.
test: $(STAMP)
	XLA_FLAGS=$(XLA_TEST_FLAGS) $(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not browser" \
		--ignore=notebooks/03_tpu_training.ipynb

# At the floor of every version range, on TensorFlow, less those marked
# `newest`: every public layer's forward pass, training step and round
# trip, the ops and the cache, as at JAX's floor (`JAX_FLOOR_TESTS`,
# below), grouped heads, qk-norm, and the files: `.keras` across the package's
# versions, legacy `.h5`, SavedModel, TFLite and renamed arguments. The
# kernel's and the attention's own tests, each scheme's, the lab's and the
# notebooks are the newest versions' (CI's 45 minutes).
FLOOR_TESTS = $(JAX_FLOOR_TESTS) tests/test_grouped_query_attention.py tests/test_qk_norm.py \
	tests/test_attention_files.py tests/test_legacy_h5.py tests/test_tflite.py \
	tests/test_models.py tests/test_renamed_arguments.py
test-oldest: $(OLDEST_STAMP)
	XLA_FLAGS=$(XLA_TEST_FLAGS) $(OLDEST)/bin/python -m pytest $(PYTEST_WORKERS) -m "not newest" \
		$(FLOOR_TESTS)

# On JAX at its newest, on Python 3.12: the kernel (every scheme through
# every path), the attention compiled, RoPE, the ops, every public layer,
# files across backends, the demo's tasks, tiny, and JAX's distribution
# (`JAX_TESTS`, below). The other schemes' own tests run on TensorFlow and
# PyTorch, Hugging Face's weights and the docs' examples too, the TPU
# notebook on JAX in `make test-colab` (CI's 45 minutes).
test-jax: $(JAX)/.installed
	KERAS_BACKEND=jax XLA_FLAGS=$(XLA_TEST_FLAGS) $(JAX)/bin/python -m pytest $(PYTEST_WORKERS) $(JAX_TESTS)

# At the floor, every public layer's forward pass, training step and round
# trip, the ops and the cache (`JAX_FLOOR_TESTS`, below): the kernel's, the
# attention's, grouped heads', qk-norm's and the schemes' own tests are the
# ceiling's (CI's 45 minutes).
test-jax-oldest: $(JAX_OLDEST)/.installed
	KERAS_BACKEND=jax XLA_FLAGS=$(XLA_TEST_FLAGS) $(JAX_OLDEST)/bin/python -m pytest $(PYTEST_WORKERS) -m "not newest" \
		$(JAX_FLOOR_TESTS)

# Colab's TPU runtime less the TPU: Python 3.12, JAX on the CPU, within the
# jax extra's range, and Keras, within install_requires' range; no
# TensorFlow. Then
# pytest and nbmake, which run the notebook, within the test extra's.
# The range of $(1) in install_requires or those extras, as `>=floor,<ceiling`.
RANGE = sed -n '/^\(install_requires\|jax\|test\) =/,/^[^ ]/s/^ *$(1)\(>=[^; ]*\).*/\1/p' setup.cfg
$(COLAB)/.installed: setup.cfg
	test -x $(COLAB)/bin/python || $(PYTHON_NEWEST) -m venv $(COLAB)
	$(COLAB)/bin/python -m pip install --quiet --upgrade pip
	$(COLAB)/bin/python -m pip install --quiet "jax[cpu]$$($(call RANGE,jax))" \
		"keras$$($(call RANGE,keras))" "pytest$$($(call RANGE,pytest))" \
		"nbmake$$($(call RANGE,nbmake))"
	touch $@

# The TPU notebook as on Colab: its first cell pip-installs this checkout
# (KERAS_POSENC_SPEC) and nothing else, as pip's log shows, and no
# TensorFlow is there after; it trains over 8 host devices (about a minute).
test-colab: $(COLAB)/.installed
	$(COLAB)/bin/python -m pip uninstall --quiet --yes keras-posenc
	rm -f $(COLAB)/install-cell.log
	KERAS_POSENC_SPEC="$(CURDIR)" PIP_LOG="$(CURDIR)/$(COLAB)/install-cell.log" \
		KERAS_BACKEND=jax XLA_FLAGS="--xla_force_host_platform_device_count=8 $(XLA_TEST_FLAGS)" \
		$(COLAB)/bin/python -m pytest notebooks/03_tpu_training.ipynb
	grep -E "(Installing collected packages|Successfully installed).*keras-posenc" \
		$(COLAB)/install-cell.log
	! grep -iE "(Installing collected packages|Successfully installed).*tensorflow" \
		$(COLAB)/install-cell.log
	cd $(COLAB) && KERAS_BACKEND=jax bin/python -c 'import importlib.util, keras_posenc; \
		assert importlib.util.find_spec("tensorflow") is None, "TensorFlow was installed"; \
		print("keras-posenc", keras_posenc.__version__, "in", keras_posenc.__file__, "and no TensorFlow")'

# Every public layer's forward pass, training step and `.keras` round trip,
# the backend module's answers, files across PyTorch and TensorFlow, the
# attention and its kernel's paths (PyTorch's SDPA), the backends'
# benchmark, the token embedding's and the graph encodings' checks of
# their inputs, the examples of README and the docs pages, and the demo's
# three tasks, tiny, with TensorFlow hidden (tests/lab/test_backends.py).
TORCH_VERSION := 2.13.0
# The attention, its schemes, the ops, the docs' examples and the demo's
# tasks, tiny: PyTorch's run. JAX's: the kernel, the attention compiled,
# RoPE, the ops, every public layer, the files and the demo's tasks, with
# JAX's distribution. The floors': every public layer, the ops and the
# cache, and on TensorFlow grouped heads, qk-norm and the files.
BACKEND_TESTS := tests/test_every_backend.py tests/test_cross_backend.py tests/test_backend_dispatch.py \
	tests/test_positional_multi_head_attention.py tests/test_attention_kernel.py \
	tests/test_grouped_query_attention.py tests/test_qk_norm.py tests/test_hf_attention.py \
	tests/test_bench_backends.py tests/test_attention_position.py \
	tests/test_rotary_embedding.py tests/test_rotary_grid.py tests/test_xpos_embedding.py \
	tests/test_attention_temperature.py tests/test_alibi_bias.py \
	tests/test_relative_position_bias.py tests/test_relative_position_embedding.py \
	tests/test_kerple_bias.py tests/test_fire_bias.py tests/test_contextual_position.py \
	tests/test_disentangled_position.py tests/test_transformer_xl_position.py \
	tests/test_grid_attention.py tests/test_shortest_path_bias.py tests/test_hf_config.py \
	tests/test_token_and_position_embedding.py tests/test_graph_encoding_contract.py \
	tests/test_ops.py tests/test_doc_pages.py tests/test_flex_attention.py \
	tests/test_torch_compile.py tests/test_attention_cache.py tests/test_attention_files.py \
	tests/lab/test_backends.py
JAX_FLOOR_TESTS := tests/test_every_backend.py tests/test_backend_dispatch.py tests/test_ops.py \
	tests/test_attention_cache.py
# Of the attention's own tests, JAX runs those that compile it or read what
# compiled code writes, and JAX's own: the rest check, per scheme, what the
# kernel's tests check on JAX per scheme and path, against the same
# float64 reference, and run on TensorFlow and PyTorch.
JAX_ATTENTION_TESTS := $(addprefix tests/test_positional_multi_head_attention.py::,\
	test_xla_training_step test_attention_over_blocks_of_queries_equals_float64_reference \
	test_cache_index_past_the_slots_gives_nan_under_compiled_code \
	test_cache_decoding_under_xla_in_a_loop \
	test_alibi_at_default_positions_under_xla_gradients_equal_float64 test_mixed_bfloat16 \
	test_mixed_bfloat16_adds_alibi_bias_inside_the_float32_softmax \
	test_on_jax_attention_writes_no_more_logits_than_keras)
JAX_TESTS := $(JAX_FLOOR_TESTS) tests/test_grouped_query_attention.py tests/test_qk_norm.py \
	tests/test_cross_backend.py $(JAX_ATTENTION_TESTS) \
	tests/test_attention_kernel.py tests/test_rotary_embedding.py tests/test_bench_backends.py \
	tests/test_attention_files.py tests/lab/test_backends.py tests/test_distribution_jax.py

test-torch: $(TORCH)/.installed
	KERAS_BACKEND=torch $(TORCH)/bin/python -m pytest $(PYTEST_WORKERS) $(BACKEND_TESTS)

# Every page of the built site in headless Chromium, offline; needs
# Debian's chromium (apt-get install chromium).
test-site: $(STAMP)
	$(BIN)/python -m pytest tests/test_site.py -m browser

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) $(OLDEST) $(JAX) $(JAX_OLDEST) $(TORCH) $(COLAB) build dist *.egg-info demo-output site .pytest_cache .hypothesis
