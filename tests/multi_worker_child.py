"""One worker of `tests/test_multi_worker_tensorflow.py`, in a process of its own.

`python -m tests.multi_worker_child OUT INDEX PORT0 PORT1 [EXIT_AFTER]`
joins a `MultiWorkerMirroredStrategy` of two workers on localhost (from
`TF_CONFIG`), or with `INDEX` -1 trains alone; either way it trains the
model of `tests/distribution_child.py` (every attention scheme) with a
custom step (`strategy.run` in a compiled `tf.function`) on the same
global batches, checkpointing every step with a `tf.train.CheckpointManager`
and resuming from its latest checkpoint. With `EXIT_AFTER`, the process
ends, as a kill would, after that many steps. The final weights go to
`OUT/weights-<INDEX>.npz`.

Keras' `fit` does not run under this strategy (keras-team/keras#20585),
hence the custom step.
"""

import json
import os
import pathlib
import sys

out, index = pathlib.Path(sys.argv[1]), int(sys.argv[2])
ports, exit_after = sys.argv[3:5], (int(sys.argv[5]) if len(sys.argv) > 5 else None)
if index >= 0:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"localhost:{port}" for port in ports]},
            "task": {"type": "worker", "index": index},
        }
    )

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import distribution_child as child  # noqa: E402

STEPS = child.STEPS * child.EPOCHS

if index >= 0:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
else:
    strategy = tf.distribute.get_strategy()
workers = max(1, strategy.num_replicas_in_sync)

with strategy.scope():
    keras.utils.set_random_seed(0)
    model = child.build_model()
    optimizer = keras.optimizers.SGD(0.05)
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype="int64", trainable=False)

ids, adjacency, targets = child.data()


def dataset_fn(context):
    # Worker i reads rows i, i + 2, ...: the two halves of every global
    # batch of `child.BATCH` rows, the one worker alone reads it whole.
    data = tf.data.Dataset.from_tensor_slices(((ids, adjacency), targets))
    data = data.shard(context.num_input_pipelines, context.input_pipeline_id)
    return data.batch(context.get_per_replica_batch_size(child.BATCH)).repeat()


batches = iter(strategy.distribute_datasets_from_function(dataset_fn))


@tf.function
def train_step(inputs, labels):
    def replica_step(inputs, labels):
        with tf.GradientTape() as tape:
            logits = model(list(inputs), training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(
                labels, logits, from_logits=True
            )  # (batch, tokens)
            loss = tf.nn.compute_average_loss(
                tf.reduce_mean(per_example, axis=-1), global_batch_size=child.BATCH
            )
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    losses = strategy.run(replica_step, args=(inputs, labels))
    return strategy.reduce("SUM", losses, axis=None)


# The chief writes the checkpoints; the other worker saves to a folder of
# its own, as MultiWorkerMirroredStrategy needs every worker to save. Both
# resume from the chief's latest: a worker killed after its own save of a
# step the chief had not saved yet redoes that step with it.
chief_folder = out / "checkpoints"
folder = chief_folder if index <= 0 else out / f"checkpoints-worker-{index}"
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
manager = tf.train.CheckpointManager(checkpoint, str(folder), max_to_keep=2)
latest = tf.train.latest_checkpoint(str(chief_folder))
if latest:
    checkpoint.restore(latest)
# The data picks up where the restored step left it.
for _ in range(int(step.numpy())):
    next(batches)
while int(step.numpy()) < STEPS:
    inputs, labels = next(batches)
    train_step(inputs, labels)
    step.assign_add(1)
    manager.save(checkpoint_number=int(step.numpy()))
    if exit_after is not None and int(step.numpy()) == exit_after:
        os._exit(3)
np.savez(
    out / f"weights-{index}.npz",
    **{w.path: keras.ops.convert_to_numpy(w) for w in model.weights},
)
