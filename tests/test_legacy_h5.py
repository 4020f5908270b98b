"""Models holding each public layer round-trip through the legacy `.h5` format.

Keras' legacy loader turns a string at the top of a layer's config that names
a function of `keras.layers` (`merge_mode="add"`) into that function before
the layer's `from_config` runs; every layer must still load with its config,
weights and outputs unchanged.
"""

import keras
import numpy as np
import pytest

import keras_posenc
from keras_posenc.layers import (
    AlibiBias,
    AttentionTemperature,
    ContextualPosition,
    DisentangledPosition,
    FireBias,
    GridRelativePositionBias,
    KerpleBias,
    LaplacianPositionEncoding,
    PositionalMultiHeadAttention,
    PositionEmbedding,
    RandomWalkPositionEncoding,
    RelativePositionBias,
    RelativePositionEmbedding,
    RotaryEmbedding,
    ShortestPathBias,
    SinusoidalPositionEncoding,
    TokenAndPositionEmbedding,
    TransformerXLPosition,
    XPosEmbedding,
)
from tests.backend import numpy

PUBLIC_LAYERS = tuple(
    getattr(keras_posenc.layers, name)
    for name in keras_posenc.layers.__all__
    if name not in ("AttentionPosition", "AttentionContext")
)
NUM_HEADS, KEY_DIM, VALUE_DIM = 2, 4, 3
BATCH, LENGTH, FEATURES = 2, 6, 8
LINEAR_SCALING = {"rope_type": "linear", "factor": 2.0}


def random_floats(shape):
    return np.random.default_rng(0).normal(size=shape).astype("float32")


def position_pairs():
    """Query and key positions of shape `(batch, LENGTH)`, not `0 .. LENGTH - 1`."""
    query_positions = np.array([[3, 4, 5, 6, 7, 8], [0, 1, 2, 3, 4, 5]], "int32")
    key_positions = np.array([[0, 2, 4, 6, 8, 10], [0, 0, 1, 2, 3, 9]], "int32")
    return [query_positions, key_positions]


def on_embeddings(layer, features=2):
    """The layer alone in a Sequential, on float embeddings."""
    model = keras.Sequential([keras.Input((None, features)), layer])
    return model, random_floats((BATCH, LENGTH, features))


def on_tokens(layer):
    """The layer alone in a Sequential, on token ids."""
    model = keras.Sequential([keras.Input((None,), dtype="int32"), layer])
    return model, np.array([[5, 9, 2, 7, 0, 0], [1, 2, 3, 4, 5, 6]], "int32")


def on_positions(layer):
    """A head bias called on its own, on query and key positions."""
    query_positions = keras.Input((None,), dtype="int32")
    key_positions = keras.Input((None,), dtype="int32")
    bias = layer(query_positions, key_positions)  # (batch, heads, query, key)
    return keras.Model([query_positions, key_positions], bias), position_pairs()


def on_grid_positions(layer):
    """A head bias called on its own, on grid positions `(batch, 6, 2)`."""
    query_positions = keras.Input((None, 2), dtype="int32")
    key_positions = keras.Input((None, 2), dtype="int32")
    bias = layer(query_positions, key_positions)  # (batch, heads, query, key)
    grid = np.stack([np.arange(LENGTH) // 3, np.arange(LENGTH) % 3], axis=-1)
    positions = np.stack([grid, grid[::-1]]).astype("int32")  # (batch, 6, 2)
    return keras.Model([query_positions, key_positions], bias), [positions, positions]


def in_grid_attention(position):
    """Attention with `position` on a class token and a 2 x 3 grid, then a Dense."""
    tokens = keras.Input((None, FEATURES))
    positions = keras.Input((None, 2), dtype="int32")
    attended = PositionalMultiHeadAttention(
        num_heads=NUM_HEADS, key_dim=KEY_DIM, position=position
    )(tokens, tokens, query_positions=positions, key_positions=positions)
    model = keras.Model([tokens, positions], keras.layers.Dense(2)(attended))
    _, [grid, _] = on_grid_positions(GridRelativePositionBias(1, (1, 1)))
    return model, [random_floats((BATCH, 1 + LENGTH, FEATURES)), grid]


def in_attention(position):
    """Causal attention with `position` at given positions, then a Dense."""
    tokens = keras.Input((None, FEATURES))
    positions = keras.Input((None,), dtype="int32")
    attended = PositionalMultiHeadAttention(
        num_heads=NUM_HEADS, key_dim=KEY_DIM, position=position
    )(
        tokens,
        tokens,
        use_causal_mask=True,
        query_positions=positions,
        key_positions=positions,
    )
    model = keras.Model([tokens, positions], keras.layers.Dense(2)(attended))
    return model, [random_floats((BATCH, LENGTH, FEATURES)), position_pairs()[0]]


def graph_batch():
    """Two graphs padded to LENGTH nodes: a path of 6 and a triangle."""
    adjacency = np.zeros((BATCH, LENGTH, LENGTH), "float32")
    for i in range(LENGTH - 1):
        adjacency[0, i, i + 1] = adjacency[0, i + 1, i] = 1.0
    adjacency[1, :3, :3] = 1.0 - np.eye(3)
    node_mask = np.zeros((BATCH, LENGTH), bool)
    node_mask[0], node_mask[1, :3] = True, True
    return adjacency, node_mask


def on_graphs(layer):
    """A graph encoding on node features, the adjacency and the node mask."""
    nodes = keras.Input((None, FEATURES))
    adjacency = keras.Input((None, None))
    node_mask = keras.Input((None,), dtype="bool")
    encoded = layer(nodes, adjacency, mask=node_mask)
    model = keras.Model([nodes, adjacency, node_mask], encoded)
    return model, [random_floats((BATCH, LENGTH, FEATURES)), *graph_batch()]


def on_graph_adjacency(layer):
    """A bias on graphs called on its own, on the adjacency."""
    adjacency = keras.Input((None, None))
    model = keras.Model(adjacency, layer(adjacency))
    return model, graph_batch()[0]


def in_graph_attention(position):
    """Attention over the nodes of padded graphs with `position`, then a Dense."""
    nodes = keras.Input((None, FEATURES))
    adjacency = keras.Input((None, None))
    node_mask = keras.Input((None,), dtype="bool")
    attended = PositionalMultiHeadAttention(
        num_heads=NUM_HEADS, key_dim=KEY_DIM, position=position
    )(nodes, nodes, adjacency=adjacency, query_mask=node_mask, value_mask=node_mask)
    model = keras.Model(
        [nodes, adjacency, node_mask], keras.layers.Dense(2)(attended)
    )
    return model, [random_floats((BATCH, LENGTH, FEATURES)), *graph_batch()]


# Each returns (model, inputs). Every string a config can hold at its top
# level is among them: merge modes, layouts, positions, "sinusoidal".
CASES = {
    "sinusoidal_add": lambda: on_embeddings(SinusoidalPositionEncoding()),
    "sinusoidal_concat": lambda: on_embeddings(
        SinusoidalPositionEncoding(pairing="half", merge_mode="concat", output_dim=4)
    ),
    "sinusoidal_alone": lambda: on_embeddings(
        SinusoidalPositionEncoding(max_wavelength=100.0, merge_mode=None)
    ),
    "learned_add": lambda: on_embeddings(
        PositionEmbedding(sequence_length=LENGTH), features=4
    ),
    "learned_sinusoidal_concat": lambda: on_embeddings(
        PositionEmbedding(
            sequence_length=8,
            embeddings_initializer="sinusoidal",
            merge_mode="concat",
            output_dim=4,
        )
    ),
    "token_sinusoidal": lambda: on_tokens(
        TokenAndPositionEmbedding(vocabulary_size=10, embedding_dim=4, mask_zero=True)
    ),
    "token_learned": lambda: on_tokens(
        TokenAndPositionEmbedding(
            vocabulary_size=10, embedding_dim=4, sequence_length=8, position_encoding="learned"
        )
    ),
    "rotary_half": lambda: on_embeddings(RotaryEmbedding(), features=8),
    "rotary_interleaved_linear": lambda: on_embeddings(
        RotaryEmbedding(pairing="interleaved", rotary_dim=4, scaling=LINEAR_SCALING),
        features=8,
    ),
    "alibi": lambda: on_positions(AlibiBias(num_heads=3)),
    "alibi_bidirectional_slopes": lambda: on_positions(
        AlibiBias(num_heads=3, bidirectional=True, slopes=[0.3, 0.2, 0.1])
    ),
    "t5": lambda: on_positions(
        RelativePositionBias(num_heads=NUM_HEADS, num_buckets=8, max_distance=16)
    ),
    "t5_causal": lambda: on_positions(
        RelativePositionBias(
            num_heads=NUM_HEADS, num_buckets=8, max_distance=16, bidirectional=False
        )
    ),
    "attention_none": lambda: in_attention(None),
    "attention_rotary_linear": lambda: in_attention(
        RotaryEmbedding(scaling=LINEAR_SCALING)
    ),
    "attention_alibi": lambda: in_attention(AlibiBias(num_heads=NUM_HEADS)),
    "attention_t5": lambda: in_attention(
        RelativePositionBias(num_heads=NUM_HEADS, num_buckets=8, max_distance=16)
    ),
    "grid_bias": lambda: on_grid_positions(
        GridRelativePositionBias(num_heads=NUM_HEADS, grid_shape=(2, 2))
    ),
    "attention_grid_bias_prefix": lambda: in_grid_attention(
        GridRelativePositionBias(
            num_heads=NUM_HEADS, grid_shape=(2, 2), num_prefix_tokens=1
        )
    ),
    # RelativePositionEmbedding loads from `.h5` inside attention only: see
    # test_h5_cannot_rebuild_a_relative_position_embedding_called_alone.
    "attention_shaw": lambda: in_attention(RelativePositionEmbedding(max_relative_position=3)),
    "attention_transformer_xl": lambda: in_attention(
        TransformerXLPosition(pairing="half", clamp_len=3)
    ),
    "attention_deberta": lambda: in_attention(
        DisentangledPosition(max_relative_positions=8, position_buckets=4)
    ),
    "attention_kerple": lambda: in_attention(KerpleBias(2, form="power")),
    "attention_fire": lambda: in_attention(FireBias(2, mlp_width=8)),
    "attention_deberta_own_projections": lambda: in_attention(
        DisentangledPosition(
            max_relative_positions=3,
            position_buckets=0,
            share_att_key=False,
            pos_att_type="p2c|c2p",
            layer_norm=False,
        )
    ),
    "attention_temperature": lambda: in_attention(
        AttentionTemperature(floor_scale=3, attn_scale=0.5)
    ),
    "attention_xpos": lambda: in_attention(
        XPosEmbedding(scale_base=8.0, pairing="interleaved")
    ),
    "attention_cope": lambda: in_attention(ContextualPosition(max_positions=4)),
    "laplacian_add": lambda: on_graphs(LaplacianPositionEncoding(k=3)),
    "laplacian_concat_combinatorial": lambda: on_graphs(
        LaplacianPositionEncoding(
            k=2, normalization=None, merge_mode="concat", output_dim=3, seed=1
        )
    ),
    "random_walk_add": lambda: on_graphs(RandomWalkPositionEncoding(steps=3)),
    "random_walk_directed_alone": lambda: on_graphs(
        RandomWalkPositionEncoding(steps=4, symmetric=False, merge_mode=None)
    ),
    "shortest_path_bias": lambda: on_graph_adjacency(
        ShortestPathBias(num_heads=NUM_HEADS, max_hops=2)
    ),
    "attention_shortest_path": lambda: in_graph_attention(
        ShortestPathBias(num_heads=NUM_HEADS, max_hops=2)
    ),
}


def package_layers(model):
    """The model's layers of this package, and the attentions' positions."""
    layers = []
    for layer in model.layers:
        if isinstance(layer, PUBLIC_LAYERS):
            layers.append(layer)
        if isinstance(getattr(layer, "position", None), PUBLIC_LAYERS):
            layers.append(layer.position)
    return layers


def randomize_weights(model):
    """Weights off their initial values, so that a load that re-initialises shows."""
    rng = np.random.default_rng(1)
    for weight in model.weights:
        weight.assign(rng.normal(size=weight.shape).astype(weight.dtype))


def save_h5(model, tmp_path):
    # Keras logs (through absl, not `warnings`) that `.h5` is legacy.
    path = tmp_path / "model.h5"
    model.save(path)
    return path


def test_cases_cover_every_public_layer():
    covered = {
        type(layer).__name__
        for make_model in CASES.values()
        for layer in package_layers(make_model()[0])
    }
    # The protocol's base and context are no layer of a model.
    assert covered == set(keras_posenc.layers.__all__) - {
        "AttentionPosition",
        "AttentionContext",
    }


@pytest.mark.parametrize(
    "custom_objects",
    [None, {layer.__name__: layer for layer in PUBLIC_LAYERS}],
    ids=["registered", "custom_objects"],
)
@pytest.mark.parametrize("case", CASES)
def test_h5_round_trip_is_bit_identical(case, custom_objects, tmp_path):
    keras.utils.set_random_seed(0)
    model, inputs = CASES[case]()
    randomize_weights(model)
    path = save_h5(model, tmp_path)
    loaded = keras.models.load_model(path, custom_objects=custom_objects)
    assert [layer.get_config() for layer in package_layers(loaded)] == [
        layer.get_config() for layer in package_layers(model)
    ]
    assert len(loaded.weights) == len(model.weights)
    for loaded_weight, weight in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(numpy(loaded_weight.value), numpy(weight.value))
    # Both called as they are: `predict` would trace each model anew.
    np.testing.assert_array_equal(numpy(loaded(inputs)), numpy(model(inputs)))
    # Named as before too: a position built apart from its attention would
    # lose the attention's prefix.
    assert [weight.path for weight in loaded.weights] == [
        weight.path for weight in model.weights
    ]


def test_h5_cannot_rebuild_a_relative_position_embedding_called_alone(tmp_path):
    # Its tables' sizes come from `build_for_attention`, which `.keras` files
    # replay from the build config; `.h5` files keep no build config, and a
    # call's shapes do not give `value_dim`.
    layer = RelativePositionEmbedding(max_relative_position=3)
    layer.build_for_attention(NUM_HEADS, KEY_DIM, VALUE_DIM)
    query = keras.Input((LENGTH, NUM_HEADS, KEY_DIM))
    query_positions = keras.Input((LENGTH,), dtype="int32")
    key_positions = keras.Input((LENGTH,), dtype="int32")
    term = layer(query, query_positions, key_positions)  # (batch, heads, query, key)
    model = keras.Model([query, query_positions, key_positions], term)
    path = save_h5(model, tmp_path)
    with pytest.raises(ValueError, match="build_for_attention"):
        keras.models.load_model(path)


@pytest.mark.parametrize("layer", [SinusoidalPositionEncoding, PositionEmbedding])
@pytest.mark.parametrize("function", [keras.layers.add, keras.layers.concatenate])
def test_merge_mode_refuses_functions_from_users(layer, function):
    kwargs = {"sequence_length": 4} if layer is PositionEmbedding else {}
    with pytest.raises(ValueError, match="`merge_mode` must be one of"):
        layer(merge_mode=function, **kwargs)


def test_from_config_reads_back_only_the_legacy_loaders_add():
    config = SinusoidalPositionEncoding().get_config()
    legacy = SinusoidalPositionEncoding.from_config(
        {**config, "merge_mode": keras.layers.add}
    )
    assert legacy.get_config() == config
    # Keras' `from_config` wraps the constructor's ValueError in a TypeError.
    with pytest.raises(TypeError, match="`merge_mode` must be one of"):
        SinusoidalPositionEncoding.from_config(
            {**config, "merge_mode": keras.layers.concatenate}
        )
