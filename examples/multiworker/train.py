"""Train a small classifier on several workers with MultiWorkerMirroredStrategy.

    gpuhop run --workers 2 examples/multiworker/train.py            # CPU, or
    gpuhop run --workers 2 --gpus-per-worker 1 examples/multiworker/train.py

gpuhop starts one process per worker with its own TF_CONFIG (ports on a private
network), and makes tf-keras the Keras of multi-worker jobs, because Keras 3's `fit`
does not work under this strategy. Every worker trains on its shard of each batch and
ends with the same weights; worker 0 (the chief) writes the metrics and the SavedModel.
The data is made here (10 classes of 64 features, labelled by a fixed random linear map):
the same on every worker, nothing to download.
"""

import argparse

import numpy as np
import tensorflow as tf

import gpuhop.runtime
import gpuhop.tf


def make_data(n: int = 1792, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` points of 64 features in 10 classes, the same for every worker (same seed)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 64)).astype("float32")
    return x, (x @ rng.normal(size=(64, 10))).argmax(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch-size", type=int, default=64)
    args = parser.parse_args()

    strategy = gpuhop.tf.strategy()  # MultiWorkerMirroredStrategy under --workers N
    print(f"worker {gpuhop.runtime.worker_index()}: {strategy.num_replicas_in_sync} replicas")

    x, y = make_data()
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .shuffle(len(x), seed=0)
        .repeat()
        .batch(args.global_batch_size)
    )
    steps = len(x) // args.global_batch_size

    tf.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input(shape=(64,)),
                tf.keras.layers.Dense(64, activation="relu"),
                tf.keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(1e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    history = model.fit(
        dataset,
        epochs=args.epochs,
        steps_per_epoch=steps,
        callbacks=gpuhop.tf.callbacks(backup=False),
        verbose=2,
    )
    checksum = float(np.sum([np.sum(w) for w in model.get_weights()]))
    print(f"final loss: {history.history['loss'][-1]:.6f} weights checksum: {checksum:.6f}")
    if gpuhop.runtime.is_chief():
        model.export(str(gpuhop.tf.artifacts_dir() / "savedmodel"))


if __name__ == "__main__":
    main()
