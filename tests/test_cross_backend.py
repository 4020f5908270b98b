"""`.keras` files cross backends: saved under one, loaded under another.

For every public layer, a small model whose weights are moved off their
initial values is saved under the backend this suite runs on, loaded in a
fresh interpreter under each other backend installed beside it, and
predicts the same there; and the reverse: saved there, loaded here. The
graph encodings are among them: an eigenvector's sign must come out the
same on both.

The backends a file can cross to are those this environment has:
TensorFlow is always installed (the package needs it), so `make test-jax`
crosses JAX and TensorFlow, `make test-torch` PyTorch and TensorFlow, and
`make test` (TensorFlow alone) has no other backend to cross to: there the
crossing tests are deselected (`tests/conftest.py`), not skipped.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_posenc

BACKEND = keras.backend.backend()
OTHERS = [
    name
    for name, module in (("tensorflow", "tensorflow"), ("jax", "jax"), ("torch", "torch"))
    if name != BACKEND and importlib.util.find_spec(module) is not None
]
WIDTH = 8
HEADS = 2
SEQUENCE = 6
GRID = (2, 3)
NODES = 5


def _attention(position, causal=True, **kwargs):
    embeddings = keras.Input(shape=(None, WIDTH))
    positions = {}
    if position.num_axes > 1:
        # The grid's positions, row-major: a constant the model's config holds.
        grid = np.stack(np.meshgrid(*map(np.arange, GRID), indexing="ij"), -1)
        grid = grid.reshape(-1, len(GRID)).astype("int32")  # (tokens, 2)
        positions = {"query_positions": grid, "key_positions": grid}
    attended = keras_posenc.PositionalMultiHeadAttention(
        num_heads=HEADS, key_dim=4, position=position, **kwargs
    )(embeddings, embeddings, use_causal_mask=causal, **positions)
    return keras.Model(embeddings, keras.layers.Dense(4)(attended))


def _graph_model(encoding):
    nodes = keras.Input(shape=(NODES, WIDTH))
    adjacency = keras.Input(shape=(NODES, NODES))
    encoded = encoding(nodes, adjacency)
    return keras.Model([nodes, adjacency], keras.layers.Dense(4)(encoded))


def _graph_attention():
    nodes = keras.Input(shape=(NODES, WIDTH))
    adjacency = keras.Input(shape=(NODES, NODES))
    attended = keras_posenc.PositionalMultiHeadAttention(
        num_heads=HEADS,
        key_dim=4,
        position=keras_posenc.ShortestPathBias(num_heads=HEADS, max_hops=3),
    )(nodes, nodes, adjacency=adjacency)
    return keras.Model([nodes, adjacency], keras.layers.Dense(4)(attended))


def _rotary():
    return keras.Sequential(
        [
            keras.Input(shape=(None, WIDTH)),
            keras.layers.Dense(WIDTH),
            keras.layers.Reshape((-1, HEADS, WIDTH // HEADS)),
            keras_posenc.RotaryEmbedding(),
            keras.layers.Reshape((-1, WIDTH)),
            keras.layers.Dense(4),
        ]
    )


def _adjacency(rng):
    """Weighted graphs whose Laplacian eigenvalues are at least 0.1 apart.

    A float32 `eigh` moves an eigenvector by about float32's epsilon times
    the Laplacian's norm (at most 2) over the gap to the next eigenvalue:
    below 2e-6 for gaps of 0.1, where a gap of 0.01 (two backends' float32
    `eigh` then differ by 3e-5 after the model's layers) would not hold the
    tolerance below. Graphs are drawn until every gap is that wide.
    """
    graphs = []
    while len(graphs) < 2:
        weights = rng.uniform(0.5, 2.0, size=(NODES, NODES))
        edges = rng.uniform(size=(NODES, NODES)) < 0.6
        adjacency = np.triu(weights * edges, 1)
        # A path through every node keeps the graph connected.
        adjacency += np.eye(NODES, k=1)
        adjacency += adjacency.T
        degrees = adjacency.sum(axis=1)
        laplacian = np.eye(NODES) - adjacency / np.sqrt(np.outer(degrees, degrees))
        if np.diff(np.linalg.eigvalsh(laplacian)).min() >= 0.1:
            graphs.append(adjacency)
    return np.stack(graphs).astype("float32")  # (2, nodes, nodes)


# Every public layer, in a model, by name: (model builder, inputs builder).
MODELS = {
    "sinusoidal": (
        lambda: keras.Sequential(
            [
                keras.Input(shape=(None, WIDTH)),
                keras_posenc.SinusoidalPositionEncoding(),
                keras.layers.Dense(4),
            ]
        ),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "learned": (
        lambda: keras.Sequential(
            [
                keras.Input(shape=(None, WIDTH)),
                keras_posenc.PositionEmbedding(8),
                keras.layers.Dense(4),
            ]
        ),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "learned-grid": (
        lambda: keras.Sequential(
            [
                keras.Input(shape=(GRID[0] * GRID[1], WIDTH)),
                keras_posenc.PositionEmbedding(grid_shape=GRID),
                keras.layers.Dense(4),
            ]
        ),
        lambda rng: rng.normal(size=(2, GRID[0] * GRID[1], WIDTH)),
    ),
    "token-and-position": (
        lambda: keras.Sequential(
            [
                keras.Input(shape=(None,), dtype="int32"),
                keras_posenc.TokenAndPositionEmbedding(20, WIDTH, sequence_length=8),
                keras.layers.Dense(4),
            ]
        ),
        lambda rng: rng.integers(0, 20, size=(2, SEQUENCE)),
    ),
    "rotary": (_rotary, lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH))),
    "attention-rope": (
        lambda: _attention(keras_posenc.RotaryEmbedding()),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-rope-one-key-value-head": (
        lambda: _attention(keras_posenc.RotaryEmbedding(), num_key_value_heads=1),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-alibi": (
        lambda: _attention(keras_posenc.AlibiBias(num_heads=HEADS)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-shaw": (
        lambda: _attention(keras_posenc.RelativePositionEmbedding(max_relative_position=3)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-transformer-xl": (
        lambda: _attention(keras_posenc.TransformerXLPosition()),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-deberta": (
        lambda: _attention(
            keras_posenc.DisentangledPosition(max_relative_positions=8, position_buckets=4)
        ),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-deberta-one-key-value-head": (
        lambda: _attention(
            keras_posenc.DisentangledPosition(max_relative_positions=8, position_buckets=4),
            num_key_value_heads=1,
        ),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-temperature": (
        lambda: _attention(keras_posenc.AttentionTemperature(floor_scale=3, attn_scale=0.5)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-kerple": (
        lambda: _attention(keras_posenc.KerpleBias(num_heads=HEADS)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-fire": (
        lambda: _attention(keras_posenc.FireBias(num_heads=HEADS)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-xpos": (
        lambda: _attention(keras_posenc.XPosEmbedding(scale_base=8.0)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-cope": (
        lambda: _attention(
            keras_posenc.ContextualPosition(4, embeddings_initializer="normal")
        ),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-t5": (
        lambda: _attention(keras_posenc.RelativePositionBias(num_heads=HEADS)),
        lambda rng: rng.normal(size=(2, SEQUENCE, WIDTH)),
    ),
    "attention-swin": (
        lambda: _attention(
            keras_posenc.GridRelativePositionBias(num_heads=HEADS, grid_shape=GRID),
            causal=False,
        ),
        lambda rng: rng.normal(size=(2, GRID[0] * GRID[1], WIDTH)),
    ),
    "laplacian": (
        lambda: _graph_model(keras_posenc.LaplacianPositionEncoding(k=3)),
        lambda rng: [rng.normal(size=(2, NODES, WIDTH)), _adjacency(rng)],
    ),
    "random-walk": (
        lambda: _graph_model(keras_posenc.RandomWalkPositionEncoding(steps=3)),
        lambda rng: [rng.normal(size=(2, NODES, WIDTH)), _adjacency(rng)],
    ),
    "attention-shortest-path": (
        _graph_attention,
        lambda rng: [rng.normal(size=(2, NODES, WIDTH)), _adjacency(rng)],
    ),
}


def _as_float32(inputs):
    if isinstance(inputs, list):
        return [_as_float32(part) for part in inputs]
    return inputs if inputs.dtype.kind == "i" else inputs.astype("float32")


def save(name, folder):
    """Build model `name` with moved weights, save it and its inputs; predict."""
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    build, make_inputs = MODELS[name]
    model = build()
    inputs = _as_float32(make_inputs(rng))
    for weight in model.weights:
        # Read through the backend's tensor (a variable's own `__array__`
        # lacks NumPy 2's `copy` keyword on JAX and PyTorch).
        value = keras.ops.convert_to_numpy(weight.value)
        weight.assign(value + rng.normal(scale=0.5, size=value.shape).astype(value.dtype))
    model.save(folder / f"{name}.keras")
    parts = inputs if isinstance(inputs, list) else [inputs]
    np.savez(folder / f"{name}.npz", *parts)
    return model.predict(inputs, verbose=0)


def load_and_predict(name, folder):
    """Load `name`'s file from `folder` and predict on its saved inputs."""
    model = keras.saving.load_model(folder / f"{name}.keras", safe_mode=True)
    with np.load(folder / f"{name}.npz") as archive:
        parts = [archive[key] for key in sorted(archive.files, key=lambda k: int(k.split("_")[1]))]
    return model.predict(parts if len(parts) > 1 else parts[0], verbose=0)


# The child: `save` or `load` each named model under its own backend.
CHILD = """
import pathlib
import sys

import numpy as np

sys.path.insert(0, {root!r})
from tests import test_cross_backend as cross

action, folder, names = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
for name in names:
    if action == "save":
        np.save(folder / f"{{name}}.expected.npy", cross.save(name, folder))
    else:
        np.save(folder / f"{{name}}.pred.npy", cross.load_and_predict(name, folder))
"""


def run_under(backend, action, folder, names):
    """Run the child under `backend` in a fresh interpreter."""
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="2",
        CUDA_VISIBLE_DEVICES="",
    )
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD.format(root=root)), action, str(folder), *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]


# Float32 kernels differ between backends (summation order, fused
# multiply-adds): equal predictions to a few float32 ulps of the values.
TOLERANCE = dict(rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("other_backend", OTHERS or [None])
def test_files_saved_here_load_under_the_other_backend(other_backend, tmp_path):
    expected = {name: save(name, tmp_path) for name in MODELS}
    run_under(other_backend, "load", tmp_path, list(MODELS))
    for name, predictions in expected.items():
        np.testing.assert_allclose(
            np.load(tmp_path / f"{name}.pred.npy"), predictions, err_msg=name, **TOLERANCE
        )


@pytest.mark.parametrize("other_backend", OTHERS or [None])
def test_files_saved_under_the_other_backend_load_here(other_backend, tmp_path):
    run_under(other_backend, "save", tmp_path, list(MODELS))
    for name in MODELS:
        np.testing.assert_allclose(
            load_and_predict(name, tmp_path),
            np.load(tmp_path / f"{name}.expected.npy"),
            err_msg=name,
            **TOLERANCE,
        )


def test_every_public_layer_crosses_backends():
    """A public layer that no model above holds would cross untested."""
    held = set()
    for build, _ in MODELS.values():
        keras.utils.set_random_seed(0)
        for layer in build()._flatten_layers():
            held.add(type(layer).__name__)
            position = getattr(layer, "position", None)
            if isinstance(position, keras.layers.Layer):
                held.add(type(position).__name__)
    # The protocol's base and context are in no model.
    public = {
        name
        for name in keras_posenc.__all__
        if isinstance(getattr(keras_posenc, name), type)
    } - {"AttentionPosition", "AttentionContext"}
    assert public <= held, public - held
