"""Issue 28's renames: old names and values still work, and old files load.

A constructor given an old argument name (or an old value) warns once with
a `DeprecationWarning` naming the new one and builds the same layer; a
config holding the old names loads silently; `get_config` holds the new
names only. `fixtures/before_renames.keras` was saved by the code before
the renames (see `fixtures/generate_before_renames.py`).
"""

import os
import warnings

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc import ops
from keras_posenc import plot
from keras_posenc import rope_scaling

# (layer, arguments besides the renamed one, old arguments, new arguments)
RENAMED = {
    "sinusoidal layout concat": (
        keras_posenc.SinusoidalPositionEncoding,
        {},
        {"layout": "concat"},
        {"pairing": "half"},
    ),
    "sinusoidal layout interleaved": (
        keras_posenc.SinusoidalPositionEncoding,
        {},
        {"layout": "interleaved"},
        {"pairing": "interleaved"},
    ),
    "sinusoidal pairing concat": (
        keras_posenc.SinusoidalPositionEncoding,
        {},
        {"pairing": "concat"},
        {"pairing": "half"},
    ),
    "rotary layout": (
        keras_posenc.RotaryEmbedding,
        {},
        {"layout": "interleaved"},
        {"pairing": "interleaved"},
    ),
    "rotary axis_layout interleaved": (
        keras_posenc.RotaryEmbedding,
        {"num_axes": 3},
        {"axis_layout": "interleaved"},
        {"axis_layout": "cyclic"},
    ),
    "alibi symmetric": (
        keras_posenc.AlibiBias,
        {"num_heads": 2},
        {"symmetric": True},
        {"bidirectional": True},
    ),
    "shaw max_distance": (
        keras_posenc.RelativePositionEmbedding,
        {},
        {"max_distance": 3},
        {"max_relative_position": 3},
    ),
    "graphormer max_distance": (
        keras_posenc.ShortestPathBias,
        {"num_heads": 2},
        {"max_distance": 2},
        {"max_hops": 2},
    ),
    "learned initializer": (
        keras_posenc.PositionEmbedding,
        {"sequence_length": 4},
        {"initializer": "sinusoidal"},
        {"embeddings_initializer": "sinusoidal"},
    ),
    "token and position": (
        keras_posenc.TokenAndPositionEmbedding,
        {"vocabulary_size": 5, "embedding_dim": 4, "sequence_length": 4},
        {"position": "learned"},
        {"position_encoding": "learned"},
    ),
}


def new_config(layer):
    config = layer.get_config()
    config.pop("name")
    return config


@pytest.mark.parametrize("case", list(RENAMED))
def test_old_names_warn_and_build_the_same_layer(case):
    layer_class, common, old, new = RENAMED[case]
    (old_name, old_value), = old.items()
    with pytest.warns(DeprecationWarning) as caught:
        layer = layer_class(**common, **old)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"{old_name}={old_value!r}" in message
    for name, value in new.items():
        assert f"{name}={value!r}" in message
    assert caught[0].filename == __file__  # points at the caller
    config = new_config(layer)
    assert old_name not in config or old_name in new
    assert new_config(layer_class(**common, **new)) == config
    for name, value in new.items():
        assert config[name] == value


@pytest.mark.parametrize("case", list(RENAMED))
def test_configs_with_old_names_load_silently(case):
    layer_class, common, old, new = RENAMED[case]
    expected = new_config(layer_class(**common, **new))
    saved = {**expected, **old}
    for name in new:
        if name not in old:
            saved.pop(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = layer_class.from_config(saved)
    assert new_config(loaded) == expected


def test_old_and_new_name_together_is_an_error():
    with pytest.raises(TypeError, match="`layout` and `pairing`"):
        keras_posenc.RotaryEmbedding(layout="half", pairing="half")


DYNAMIC = {
    "rope_type": "dynamic",
    "factor": 2.0,
    "original_max_position_embeddings": 16,
}
OPS_CALLS = {
    "sinusoidal layout": (
        lambda: ops.sinusoidal(np.arange(3), 4, layout="concat"),
        lambda: ops.sinusoidal(np.arange(3), 4, pairing="half"),
        "pairing",
    ),
    "rotate layout": (
        lambda: ops.rotate(np.ones((1, 4), "float32"), np.ones((1, 2), "float32"), layout="interleaved"),
        lambda: ops.rotate(np.ones((1, 4), "float32"), np.ones((1, 2), "float32"), pairing="interleaved"),
        "pairing",
    ),
    "rotate phases": (
        lambda: ops.rotate(np.ones((1, 4), "float32"), phases=np.ones((1, 2), "float32")),
        lambda: ops.rotate(np.ones((1, 4), "float32"), angles=np.ones((1, 2), "float32")),
        "angles",
    ),
    "rotate_by_tables layout": (
        lambda: ops.rotate_by_tables(
            np.ones((1, 4), "float32"),
            np.full((1, 2), 0.5, "float32"),
            np.full((1, 2), 0.8, "float32"),
            layout="interleaved",
        ),
        lambda: ops.rotate_by_tables(
            np.ones((1, 4), "float32"),
            np.full((1, 2), 0.5, "float32"),
            np.full((1, 2), 0.8, "float32"),
            pairing="interleaved",
        ),
        "pairing",
    ),
    "rope_frequency_matrix interleaved": (
        lambda: ops.rope_frequency_matrix(12, 3, "interleaved"),
        lambda: ops.rope_frequency_matrix(12, 3, "cyclic"),
        "axis_layout='cyclic'",
    ),
    "rope_pair_axes interleaved": (
        lambda: ops.rope_pair_axes(6, 3, axis_layout="interleaved"),
        lambda: ops.rope_pair_axes(6, 3, axis_layout="cyclic"),
        "axis_layout='cyclic'",
    ),
    "read_positions sequence_length": (
        lambda: ops.read_positions(np.arange(4), sequence_length=4),
        lambda: ops.read_positions(np.arange(4), length=4),
        "length",
    ),
    "position_ids sequence_length": (
        lambda: ops.position_ids(sequence_length=4, start_index=2),
        lambda: ops.position_ids(length=4, start_index=2),
        "length",
    ),
    "rope_parameters sequence_length": (
        lambda: rope_scaling.rope_parameters(
            DYNAMIC, 8, 10000.0, sequence_length=64
        )[0],
        lambda: rope_scaling.rope_parameters(DYNAMIC, 8, 10000.0, length=64)[0],
        "length",
    ),
    "dynamic sequence_length": (
        lambda: rope_scaling.dynamic(8, 10000.0, 2.0, 16, sequence_length=64)[0],
        lambda: rope_scaling.dynamic(8, 10000.0, 2.0, 16, length=64)[0],
        "length",
    ),
    "hop_counts max_distance": (
        lambda: ops.hop_counts(np.eye(3, k=1)[None] + np.eye(3, k=-1)[None], max_distance=1),
        lambda: ops.hop_counts(np.eye(3, k=1)[None] + np.eye(3, k=-1)[None], max_hops=1),
        "max_hops",
    ),
}


@pytest.mark.parametrize("case", list(OPS_CALLS))
def test_functions_take_old_names_with_a_warning(case):
    old_call, new_call, new_name = OPS_CALLS[case]
    with pytest.warns(DeprecationWarning, match=new_name):
        old = old_call()
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(old), keras.ops.convert_to_numpy(new_call())
    )


def test_plot_takes_the_old_position_with_a_warning():
    with pytest.warns(DeprecationWarning, match="reference_position=3"):
        figure = plot.similarity_curve(length=8, dim=4, position=3)
    assert list(figure.axes[0].lines[1].get_xdata()) == [3, 3]


def test_plot_takes_the_old_layout_with_a_warning():
    with pytest.warns(DeprecationWarning, match="pairing='half'"):
        figure = plot.encoding_heatmap(length=4, dim=4, layout="concat")
    assert "half" in figure.axes[0].get_title()


def test_relative_distance_is_an_alias_that_warns():
    query, key = np.arange(3), np.array([[0, 2]])
    with pytest.warns(DeprecationWarning, match="use `relative_position`"):
        old = ops.relative_distance(query, key)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(old),
        keras.ops.convert_to_numpy(ops.relative_position(query, key)),
    )
    with pytest.warns(DeprecationWarning, match="use `relative_position_shape`"):
        shape = ops.relative_distance_shape((3,), (1, 2))
    assert shape == ops.relative_position_shape((3,), (1, 2)) == (1, 3, 2)
