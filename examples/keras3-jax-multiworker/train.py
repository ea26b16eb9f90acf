"""Train a small classifier with Keras 3 on JAX across several processes.

    gpuhop run --workers 2 -e KERAS_BACKEND=jax examples/keras3-jax-multiworker/train.py
    gpuhop run --workers 2 --gpus-per-worker 1 -e KERAS_BACKEND=jax examples/...  # GPUs

`KERAS_BACKEND=jax` in the job's environment makes gpuhop start Keras 3's own
multi-process mode (a host with Keras and JAX but no TensorFlow gets it anyway): each
worker gets KERAS_DISTRIBUTION_JOB_ADDRESSES (the coordinator, on the job's private
network), KERAS_DISTRIBUTION_NUM_PROCESSES and KERAS_DISTRIBUTION_PROCESS_ID, which
`keras.distribution.initialize()` reads. A `DataParallel` distribution over every device
of every process then replicates the weights and splits each global batch: each process
feeds its own shard of the data, and all of them end with the same weights. Run alone (one
process), it trains on this process's devices. The data is made here (10 classes of 64
features, labelled by a fixed random linear map): the same in every process, no download.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax
import keras
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--global-batch-size", type=int, default=64)
    args = parser.parse_args()

    if os.environ.get("GPUHOP_NUM_WORKERS", "1") != "1" and "TF_CONFIG" in os.environ:
        sys.exit("gpuhop started TensorFlow workers: run with -e KERAS_BACKEND=jax")
    if "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
        keras.distribution.initialize()  # the coordinator, process count and id from gpuhop
    processes, me = jax.process_count(), jax.process_index()
    devices = keras.distribution.list_devices()
    # The data is sharded here, by process (below), not by Keras from a tf.data pipeline.
    distribution = keras.distribution.DataParallel(devices=devices, auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    print(f"process {me} of {processes}: {len(devices)} devices in the mesh", flush=True)

    rng = np.random.default_rng(0)  # the same data in every process
    x = rng.normal(size=(1792, 64)).astype("float32")
    y = (x @ rng.normal(size=(64, 10))).argmax(axis=1)
    usable = len(x) - len(x) % args.global_batch_size
    # Each process feeds its own slice of every global batch.
    x, y = x[:usable][me::processes], y[:usable][me::processes]

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    history = model.fit(
        x, y, batch_size=args.global_batch_size // processes, epochs=args.epochs, verbose=2
    )
    checksum = float(np.sum([np.sum(np.asarray(w)) for w in model.get_weights()]))
    print(f"final loss: {history.history['loss'][-1]:.6f} weights checksum: {checksum:.6f}")
    # Saving makes variables across the processes, so every process saves (a collective
    # that process 0 alone would wait on forever); only process 0's file is kept.
    keep = os.environ.get("GPUHOP_ARTIFACTS_DIR", ".") if me == 0 else tempfile.mkdtemp()
    model.save(os.path.join(keep, "classifier.keras"))


if __name__ == "__main__":
    main()
