"""Keras in a container image (`--image`): a real agent runs an unmodified Keras script
through real Podman, in an image with TensorFlow the session builds from the project's own
installation of it (tests/images.py: `tf_image`). The start-up hook, bound read-only into
the container, adds gpuhop's callbacks to its `fit`: its metrics arrive as a venv job's do,
and a SIGKILL mid-training is retried and resumes after the last finished epoch."""

from __future__ import annotations

import json
import sys

import pytest

from tests.images import containers_named

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

# No gpuhop in sight. It says where its TensorFlow comes from, whether the venv the tests
# run in is visible, and which epoch each attempt begins with; attempt 1 dies (as the OOM
# killer would kill it) in epoch 3, after its first batch.
UNMODIFIED = """
import os, signal, sys
import numpy as np
import keras
import tensorflow as tf

attempt = os.environ["GPUHOP_ATTEMPT"]
print("tensorflow", tf.__version__, "from", os.path.dirname(tf.__file__), flush=True)
print("host venv visible:", os.path.exists(sys.argv[1]), flush=True)


class Die(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch + 1
        print(f"attempt {attempt} begins epoch {self.epoch}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if attempt == "1" and self.epoch == 3 and batch == 0:
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[Die()])
print("trained up to epoch", history.epoch[-1] + 1, "on attempt", attempt)
"""


def test_keras_fit_in_an_image_streams_metrics_and_resumes_after_sigkill(
    shared_agent, tf_image, project
):
    root = project({"train.py": UNMODIFIED})
    run = shared_agent.cli(
        "run", "--name", "image-keras", "--image", tf_image, "--retries", "1",
        "train.py", sys.prefix, cwd=root, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr + run.stdout
    log = run.stdout
    # The image's own TensorFlow, and nothing of the venv the tests (and the agent) run in.
    assert "tensorflow 2.21.0 from /usr/lib/python3/dist-packages/tensorflow" in log
    assert "host venv visible: False" in log
    assert "gpuhop: attempt 1 failed: killed by signal 9 (SIGKILL" in log
    assert "retrying (attempt 2 of 2)" in log
    # BackupAndRestore (the hook's, with retries) resumed after the last finished epoch.
    begun = [line for line in log.splitlines() if " begins epoch " in line]
    assert begun == [
        "attempt 1 begins epoch 1",
        "attempt 1 begins epoch 2",
        "attempt 1 begins epoch 3",
        "attempt 2 begins epoch 3",
        "attempt 2 begins epoch 4",
    ]
    assert log.rstrip().endswith("trained up to epoch 4 on attempt 2")

    info = json.loads(shared_agent.cli("show", "--json", "image-keras").stdout)
    assert (info["state"], info["attempt"]) == ("succeeded", 2)
    assert info["latest_metrics"]["epoch"] == 4 and "loss" in info["latest_metrics"]
    [first] = info["attempts"]
    assert (first["signal"], first["metrics"]["epoch"]) == (9, 2)
    with shared_agent.client() as client:
        records, _ = client.job("image-keras").metrics()
    assert [r["epoch"] for r in records if "epoch" in r] == [1, 2, 3, 4]
    assert containers_named(f"gpuhop-{info['id']}") == []
