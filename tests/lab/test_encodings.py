import keras
import pytest

import keras_posenc
from keras_posenc_lab import config
from keras_posenc_lab import encodings

ENTRIES = [
    (task, name)
    for task, registry in encodings.TASKS.items()
    for name in registry
]
# What each task's models give `build`.
CONTEXT = {
    "language": {"num_heads": 4, "sequence_length": 16},
    "vision": {"num_heads": 4, "grid_shape": (4, 4)},
    "graph": {"num_heads": 4, "seed": 0},
}


@pytest.mark.parametrize("task, name", ENTRIES, ids=lambda value: str(value))
def test_every_entry_builds_its_public_layer(task, name):
    entry = encodings.TASKS[task][name]
    assert entry.role in encodings.ROLES
    assert set(entry.takes) <= set(encodings.MODEL_VALUES)
    layer = encodings.build(task, name, **CONTEXT[task])
    if entry.layer is None:
        assert layer is None and entry.role == "none"
        return
    assert entry.layer in keras_posenc.layers.__all__
    assert type(layer) is getattr(keras_posenc, entry.layer)
    config_ = layer.get_config()
    for argument, value in entry.arguments.items():
        assert config_[argument] == value
    for argument in entry.takes:
        expected = CONTEXT[task][argument]
        assert config_[argument] == (
            list(expected) if isinstance(config_[argument], list) else expected
        )


def test_build_gives_a_layer_only_for_its_role():
    assert encodings.build("language", "rope", role="embeddings") is None
    assert isinstance(
        encodings.build("language", "rope", role="attention"),
        keras_posenc.RotaryEmbedding,
    )
    assert encodings.build("graph", "laplacian", role="attention", num_heads=4) is None


def test_build_takes_overrides_and_ignores_what_the_encoding_does_not_take():
    # T5's registry entry is causal; the benchmark's attention is not.
    layer = encodings.build("language", "t5", num_heads=2, bidirectional=True)
    assert layer.get_config()["bidirectional"] is True
    assert layer.get_config()["num_heads"] == 2
    # RoPE takes no head count: the model's is not passed on.
    assert isinstance(
        encodings.build("language", "rope", num_heads=2), keras_posenc.RotaryEmbedding
    )


def test_the_tasks_and_their_tables_read_the_registry():
    assert config.ENCODINGS == tuple(encodings.LANGUAGE)
    assert config.VISION_ENCODINGS == tuple(encodings.VISION)
    assert config.GRAPH_ENCODINGS == tuple(encodings.GRAPH)
    assert config.GRAPH_LABELS == encodings.labels("graph")
    for name, label in encodings.labels("vision").items():
        assert config.VISION_LABELS[name] == label
    labels = [entry.label for entry in encodings.VISION.values()]
    assert len(set(labels)) == len(labels)


def test_a_layer_built_by_the_registry_is_fresh():
    first = encodings.build("language", "alibi", num_heads=4)
    second = encodings.build("language", "alibi", num_heads=4)
    assert first is not second
    assert isinstance(first, keras.layers.Layer)
