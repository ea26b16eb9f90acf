"""Build a Keras model here, train a few steps on the GPU host's TensorFlow server, and get
the trained weights back: notebook-style, one cell after another.

    gpuhop tf-server start [--on lab] [--gpus 1]     # once; it holds its GPUs until stopped
    python examples/remote_ops/try_remote.py [REMOTE]
    gpuhop tf-server stop

Each step below is one `tf.function` call, so it costs one round trip to the server rather
than one per op (batch remote work into tf.functions).
"""

from __future__ import annotations

import sys
import time

import numpy as np
import tensorflow as tf

import gpuhop.tf

remote_name = sys.argv[1] if len(sys.argv) > 1 else None

# -- cell 1: data and model, made locally --------------------------------------------------
rng = np.random.default_rng(0)
x = rng.standard_normal((512, 8)).astype("float32")
y = (x @ rng.standard_normal((8, 1)) + 0.1).astype("float32")


# -- cell 2: connect, and train on the remote device ----------------------------------------
def train_remotely(device: str, steps: int = 20) -> list[np.ndarray]:
    """Train a fresh model on `device`; return its weights, fetched here. Everything made in
    here lives on the server and is released when this returns, while still connected."""
    with tf.device(device):
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.05)
        xs, ys = tf.constant(x), tf.constant(y)  # sent once, kept on the server

        @tf.function
        def train_step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(xs) - ys) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        start = time.perf_counter()
        for step in range(1, steps + 1):
            loss = float(train_step())  # one round trip per step
            if step % 5 == 0:
                print(f"step {step:2d}  loss {loss:.4f}")
        print(f"{steps} steps in {time.perf_counter() - start:.2f}s")
        print(f"variables live on {model.weights[0].value.device}")
        return model.get_weights()


with gpuhop.tf.connect(remote_name) as remote:
    device = gpuhop.tf.remote_device()  # its GPU if it has one, else its CPU
    print(f"connected: {remote}; training on {device}")
    weights = train_remotely(device)  # fetched before the connection closes

# -- cell 3: the trained weights, here -----------------------------------------------------
local = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
local.set_weights(weights)
print(f"local model, remote-trained weights: loss {float(tf.reduce_mean((local(x) - y) ** 2)):.4f}")
