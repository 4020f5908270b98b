"""One training run of `tests/test_distribution_jax.py`, in a process of its own.

`python -m tests.distribution_child MODE OUT [PROCESS_ID PORT]` trains the
same model on the same global batches and saves its final weights to
`OUT/weights.npz` (`OUT/weights-<process>.npz` for two processes). MODE:

- `one`: one device, no distribution;
- `data`: `keras.distribution.DataParallel` over every device;
- `model`: `keras.distribution.ModelParallel` on a 2 x 4 mesh whose
  `LayoutMap` shards the position tables;
- `killed`: `DataParallel` with `BackupAndRestore`, the process exiting in
  the middle of the third epoch; `resumed`: the same run started again;
- `process`: one of two processes joined by `keras.distribution.initialize`,
  each feeding its half of every global batch.

The devices (8 forced host CPUs) come from `XLA_FLAGS`, set by the parent.
"""

import os
import pathlib
import sys

import keras
import numpy as np

import keras_posenc

TOKENS = 8
GRID = (2, 4)
WIDTH = 16
HEADS = 4
VOCABULARY = 12
BATCH = 16
STEPS = 4
EPOCHS = 4


def build_model():
    """Every attention scheme and position table of the package in one model.

    Learned positions (TokenAndPositionEmbedding), RoPE, ALiBi, and the
    tables `ModelParallel` shards: T5's buckets, Shaw's relative
    embeddings, Swin's grid bias and Graphormer's shortest-path bias.
    """
    ids = keras.Input(shape=(TOKENS,), dtype="int32")
    adjacency = keras.Input(shape=(TOKENS, TOKENS))
    x = keras_posenc.TokenAndPositionEmbedding(
        VOCABULARY, WIDTH, sequence_length=TOKENS, position_encoding="learned"
    )(ids)
    schemes = [
        keras_posenc.RotaryEmbedding(),
        keras_posenc.AlibiBias(num_heads=HEADS),
        keras_posenc.RelativePositionBias(num_heads=HEADS, num_buckets=8, max_distance=16),
        keras_posenc.RelativePositionEmbedding(max_relative_position=3),
        keras_posenc.GridRelativePositionBias(num_heads=HEADS, grid_shape=GRID),
    ]
    # The grid's positions, a constant of the model (a NumPy array, which
    # the functional model's config holds).
    grid = np.stack(np.meshgrid(*map(np.arange, GRID), indexing="ij"), -1)
    grid = grid.reshape(-1, len(GRID)).astype("int32")  # (tokens, 2)
    for scheme in schemes:
        attention = keras_posenc.PositionalMultiHeadAttention(
            num_heads=HEADS, key_dim=WIDTH // HEADS, position=scheme
        )
        positions = {}
        if scheme.num_axes > 1:
            positions = {"query_positions": grid, "key_positions": grid}
        x = keras.layers.LayerNormalization()(x + attention(x, x, **positions))
    graph = keras_posenc.PositionalMultiHeadAttention(
        num_heads=HEADS,
        key_dim=WIDTH // HEADS,
        position=keras_posenc.ShortestPathBias(num_heads=HEADS, max_hops=2),
    )
    x = keras.layers.LayerNormalization()(x + graph(x, x, adjacency=adjacency))
    logits = keras.layers.Dense(VOCABULARY)(x)
    return keras.Model([ids, adjacency], logits)


def data():
    """`STEPS * BATCH` examples: ids, a path-with-chords adjacency, targets."""
    rng = np.random.default_rng(0)
    count = STEPS * BATCH
    ids = rng.integers(0, VOCABULARY, size=(count, TOKENS)).astype("int32")
    adjacency = (rng.uniform(size=(count, TOKENS, TOKENS)) < 0.3).astype("float32")
    adjacency = np.triu(adjacency, 1) + np.eye(TOKENS, k=1, dtype="float32")
    adjacency = adjacency + np.swapaxes(adjacency, 1, 2)
    targets = np.roll(ids, 1, axis=1)
    return ids, adjacency, targets


def layout_map(mesh):
    """The position tables sharded on the mesh's `model` axis."""
    layouts = keras.distribution.LayoutMap(mesh)
    # Rows of positions, buckets, clipped distances, offsets, hops: each
    # table is sharded on an axis of a size the 4 devices divide.
    # Paths are matched whole (`re.fullmatch`), each by one pattern.
    layer = "(.*/)?{}(_[0-9]+)?/embeddings"
    layouts[layer.format("position_embedding")] = ("model", None)  # (8, 16)
    layouts[layer.format("relative_position_bias")] = ("model", None)  # (8, 4)
    # Shaw's key and value tables, (2k + 1, key_dim): by feature.
    shaw = "(.*/)?relative_position_embedding(_[0-9]+)?/(key|value)_embeddings"
    layouts[shaw] = (None, "model")  # (7, 4)
    layouts[layer.format("grid_relative_position_bias")] = (None, "model")  # (15, 4)
    layouts[layer.format("shortest_path_bias")] = ("model", None)  # (4, 4)
    return layouts


def weights(path):
    """The weights a run saved to `path` (`.npz`), by variable path."""
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


def assert_same_weights(found, expected, **tolerance):
    """The same variables, each equal within `tolerance`."""
    assert found.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(found[name], expected[name], err_msg=name, **tolerance)


class ExitInEpoch(keras.callbacks.Callback):
    """Ends the process, as a kill would, in the middle of epoch `epoch`."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch
        self.current = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == self.epoch and batch == STEPS // 2:
            os._exit(3)


def main():
    mode, out = sys.argv[1], pathlib.Path(sys.argv[2])
    process_id = 0
    if mode == "process":
        import jax

        process_id, port = int(sys.argv[3]), int(sys.argv[4])
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        keras.distribution.initialize(
            job_addresses=f"localhost:{port}", num_processes=2, process_id=process_id
        )
    devices = keras.distribution.list_devices()
    if mode in ("data", "killed", "resumed", "process"):
        distribution = keras.distribution.DataParallel(devices=devices)
        distribution.auto_shard_dataset = False
        keras.distribution.set_distribution(distribution)
    elif mode == "model":
        mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        keras.distribution.set_distribution(
            keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")
        )
    keras.utils.set_random_seed(0)
    model = build_model()
    # Plain SGD: Adam divides by the root of tiny second moments, which
    # turns float32 rounding of near-zero gradients into whole steps.
    model.compile(
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    ids, adjacency, targets = data()
    batch = BATCH
    if mode == "process":
        # Each process feeds its half of every global batch, in order.
        def half(array):
            steps = array.reshape((STEPS, 2, BATCH // 2) + array.shape[1:])
            return steps[:, process_id].reshape((-1,) + array.shape[1:])

        ids, adjacency, targets = half(ids), half(adjacency), half(targets)
        batch = BATCH // 2
    callbacks = []
    if mode in ("killed", "resumed"):
        callbacks.append(keras.callbacks.BackupAndRestore(str(out / "backup")))
    if mode == "killed":
        callbacks.append(ExitInEpoch(2))
    model.fit(
        [ids, adjacency],
        targets,
        batch_size=batch,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    weights = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    name = f"weights-{process_id}.npz" if mode == "process" else "weights.npz"
    np.savez(out / name, **weights)
    if mode == "model":
        # Where the tables live: the sharding of each, as JAX reports it.
        shards = {
            w.path: str(w.value.sharding.spec)
            for w in model.weights
            if w.path.endswith("embeddings")
        }
        (out / "shardings.txt").write_text(repr(shards))


if __name__ == "__main__":
    main()
