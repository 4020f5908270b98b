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


def renamed(caught):
    """The warnings of renamed arguments among `caught`: Keras warns too."""
    return [w for w in caught if "is deprecated: use" in str(w.message)]


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
    caught = renamed(caught)
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
        warnings.filterwarnings(
            "error", message=".* is deprecated: use ", category=DeprecationWarning
        )
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


# plot draws with TensorFlow.
@pytest.mark.tensorflow_only
def test_plot_takes_the_old_position_with_a_warning():
    with pytest.warns(DeprecationWarning, match="reference_position=3"):
        figure = plot.similarity_curve(length=8, dim=4, position=3)
    assert list(figure.axes[0].lines[1].get_xdata()) == [3, 3]


# plot draws with TensorFlow.
@pytest.mark.tensorflow_only
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


FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "before_renames")

# Each layer of the fixture: its arguments under their new names, as saved.
SAVED_ARGUMENTS = {
    "sinusoidal": {"pairing": "half"},
    "learned": {"embeddings_initializer": "RandomNormal"},
    "rotary_grid": {"pairing": "interleaved", "axis_layout": "cyclic"},
    "attention_rotary/position": {"pairing": "interleaved"},
    "attention_alibi/position": {"bidirectional": True},
    "attention_shaw/position": {"max_relative_position": 3},
    "attention_graphormer/position": {"max_hops": 2},
    "token_and_position": {"position_encoding": "learned"},
}
OLD_NAMES = {
    "layout", "initializer", "symmetric", "max_distance", "position",
}


def model_with_the_new_names():
    """The fixture's model, as `generate_before_renames.py` builds it, renamed."""
    embeddings = keras.Input((6, 8), name="embeddings")
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    adjacency = keras.Input((6, 6), name="adjacency")
    sinusoidal = keras_posenc.SinusoidalPositionEncoding(
        pairing="half", name="sinusoidal"
    )(embeddings)
    learned = keras_posenc.PositionEmbedding(
        sequence_length=8, embeddings_initializer="random_normal", name="learned"
    )(embeddings)
    heads = keras.layers.Reshape((6, 2, 4), name="heads")(embeddings)
    rotary_grid = keras_posenc.RotaryEmbedding(
        max_wavelength=100.0,
        pairing="interleaved",
        num_axes=2,
        axis_layout="cyclic",
        name="rotary_grid",
    )(heads, grid_shape=(2, 3))
    attention_outputs = [
        keras_posenc.PositionalMultiHeadAttention(
            num_heads=2, key_dim=4, position=position, name=f"attention_{name}"
        )(embeddings, embeddings, **call_arguments)
        for name, position, call_arguments in (
            ("rotary", keras_posenc.RotaryEmbedding(pairing="interleaved"), {}),
            ("alibi", keras_posenc.AlibiBias(num_heads=2, bidirectional=True), {}),
            (
                "shaw",
                keras_posenc.RelativePositionEmbedding(max_relative_position=3),
                {},
            ),
            (
                "graphormer",
                keras_posenc.ShortestPathBias(num_heads=2, max_hops=2),
                {"adjacency": adjacency},
            ),
        )
    ]
    token_and_position = keras_posenc.TokenAndPositionEmbedding(
        vocabulary_size=11,
        embedding_dim=8,
        sequence_length=8,
        position_encoding="learned",
        name="token_and_position",
    )(tokens)
    return keras.Model(
        [embeddings, tokens, adjacency],
        [sinusoidal, learned, rotary_grid, *attention_outputs, token_and_position],
    )


# The file was saved by Keras 3.15, whose MultiHeadAttention config holds
# keys (`use_gate`, `sliding_window`) that older Keras does not take.
@pytest.mark.newest
def test_a_file_saved_before_the_renames_loads_under_the_new_names():
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "error", message=".* is deprecated: use ", category=DeprecationWarning
        )
        loaded = keras.models.load_model(f"{FIXTURE}.keras", safe_mode=True)
    for name, expected in SAVED_ARGUMENTS.items():
        layer_name, _, part = name.partition("/")
        layer = loaded.get_layer(layer_name)
        config = layer.position.get_config() if part else layer.get_config()
        assert not OLD_NAMES & set(config) - {"position"}, name
        for argument, value in expected.items():
            saved = config[argument]
            if isinstance(saved, dict):
                saved = saved["class_name"]
            assert saved == value, (name, argument)
    assert "position" not in loaded.get_layer("token_and_position").get_config()

    rebuilt = model_with_the_new_names()
    rebuilt.set_weights(loaded.get_weights())
    inputs = np.load(f"{FIXTURE}.npz")
    inputs = [inputs["embeddings"], inputs["tokens"], inputs["adjacency"]]
    for expected, output in zip(
        rebuilt.predict(inputs, verbose=0), loaded.predict(inputs, verbose=0)
    ):
        assert np.isfinite(output).all()
        np.testing.assert_array_equal(output, expected)
