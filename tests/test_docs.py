"""Docstrings: their examples run, and their `Args:` match the signatures."""

import doctest
import importlib
import inspect
import pkgutil
import re

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import plot
from keras_posenc_lab import config as demo_config
from keras_posenc_lab import language

# Every public layer's module, every public module of `ops`, and the
# schedules and config readers: derived, so that a new one is doctested.
MODULES = sorted(
    {getattr(keras_posenc, name).__module__ for name in keras_posenc.layers.__all__}
    | {
        f"keras_posenc.ops.{module.name}"
        for module in pkgutil.iter_modules(keras_posenc.ops.__path__)
        if not module.name.startswith("_")
    }
    | {"keras_posenc.rope_scaling", "keras_posenc.hf_config", "keras_posenc.hf_attention"}
)
# The scheme protocol (its base and context) has no constructor arguments
# of its own: its hooks' docstrings are checked instead.
PROTOCOL = {"AttentionPosition", "AttentionContext"}
PUBLIC_LAYERS = [
    getattr(keras_posenc, name)
    for name in keras_posenc.layers.__all__
    if name not in PROTOCOL
]
PUBLIC_FUNCTIONS = [
    keras_posenc.AttentionPosition.check_attention,
    keras_posenc.AttentionPosition.build_for_attention,
    keras_posenc.AttentionPosition.build_weights,
    keras_posenc.AttentionPosition.logits_scale,
    keras_posenc.AttentionPosition.transform_query_key,
    keras_posenc.AttentionPosition.logits_bias,
    keras_posenc.AttentionPosition.value_term,
    plot.encoding_heatmap,
    plot.similarity_curve,
    plot.save_plots,
    plot.rope_wavelengths,
    plot.extrapolation_curves,
    plot.grid_similarity,
    plot.rope_axis_assignment,
    demo_config.Config.replace,
    language.MarkovSource.sample,
    language.build_model,
    language.rope_scaling,
    language.mean_nll,
    language.evaluation_windows,
    language.findings,
    language.run,
    keras_posenc.ops.sinusoidal,
    keras_posenc.ops.translation_matrix,
    keras_posenc.ops.inverse_frequencies,
    keras_posenc.ops.angles,
    keras_posenc.ops.position_ids,
    keras_posenc.ops.rotate,
    keras_posenc.ops.alibi_slopes,
    keras_posenc.ops.relative_position,
    keras_posenc.ops.relative_position_bucket,
    keras_posenc.ops.make_log_bucket_position,
    keras_posenc.ops.build_relative_position,
    keras_posenc.ops.grid_relative_position_index,
    keras_posenc.GridRelativePositionBias.resized_embeddings,
    keras_posenc.ops.read_positions,
    keras_posenc.ops.grid_positions,
    keras_posenc.ops.check_grid_shape,
    keras_posenc.ops.resize_matrix,
    keras_posenc.ops.resize_grid,
    keras_posenc.ops.check_axis_layout,
    keras_posenc.ops.rope_pair_axes,
    keras_posenc.ops.rope_frequency_matrix,
    keras_posenc.ops.grid_angles,
    keras_posenc.ops.multimodal_positions,
    keras_posenc.ops.relative_position_shape,
    keras_posenc.PositionEmbedding.resized_embeddings,
    keras_posenc.RotaryEmbedding.from_hf_config,
    keras_posenc.rope_scaling.default,
    keras_posenc.rope_scaling.linear,
    keras_posenc.rope_scaling.dynamic,
    keras_posenc.rope_scaling.yarn,
    keras_posenc.rope_scaling.llama3,
    keras_posenc.rope_scaling.longrope,
    keras_posenc.rope_scaling.proportional,
    keras_posenc.rope_scaling.check_scaling,
    keras_posenc.rope_scaling.rope_parameters,
]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    results = doctest.testmod(
        module,
        extraglobs={"np": np, "keras": keras},
        optionflags=doctest.NORMALIZE_WHITESPACE,
        raise_on_error=False,
    )
    assert results.failed == 0
    assert results.attempted > 0


def documented_args(docstring):
    """The argument names listed under `Args:` in a Keras-style docstring."""
    section = re.search(r"\n\s*Args:\n(.*?)(\n\s*\n|\Z)", docstring, re.S)
    assert section, "no Args: section"
    lines = section.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return [
        re.match(r"\s*(\*{0,2}\w+):", line).group(1)
        for line in lines
        if line.strip() and len(line) - len(line.lstrip()) == indent
    ]


@pytest.mark.parametrize(
    "function",
    [layer.__init__ for layer in PUBLIC_LAYERS] + PUBLIC_FUNCTIONS,
    ids=lambda function: function.__qualname__,
)
def test_args_section_agrees_with_the_signature(function):
    owner_doc = (
        inspect.getdoc(getattr(keras_posenc, function.__qualname__.split(".")[0]))
        if function.__name__ == "__init__"
        else inspect.getdoc(function)
    )
    parameters = [
        ("**" if p.kind is p.VAR_KEYWORD else "") + name
        for name, p in inspect.signature(function).parameters.items()
        if name != "self"
    ]
    assert documented_args(owner_doc) == parameters


@pytest.mark.parametrize("layer", PUBLIC_LAYERS, ids=lambda layer: layer.__name__)
def test_layer_docstrings_have_the_keras_sections(layer):
    docstring = inspect.getdoc(layer)
    for heading in ("Args:", "Call arguments:", "Returns:", "Example:", "References:"):
        assert heading in docstring
    assert "https://arxiv.org/abs/" in docstring
