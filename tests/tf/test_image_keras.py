"""TensorFlow in a container image (`--image`): a real agent runs an unmodified Keras script,
and a model server, through real Podman, in an image with TensorFlow (and the model
server's starlette and uvicorn) the session builds from the project's own installation of
them (tests/images.py: `tf_image`). The start-up hook, bound read-only into the container,
adds gpuhop's callbacks to its `fit`: its metrics arrive as a venv job's do, and a SIGKILL
mid-training is retried and resumes after the last finished epoch. `gpuhop serve --image`
answers a :predict as the venv server does, with the image's python3, serving the model a
job kept read-only (a process in its container can change none of it); in an image that
lacks what the server imports, it fails at once saying what to install."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from gpuhop.client import GpuhopError
from tests.images import containers_named, job_containers

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
    assert job_containers(shared_agent.paths, info["id"]) == []


# A small SavedModel: softmax(x @ W + b), with W and b known here too.
SAVE = """
import sys
import tensorflow as tf

class Linear(tf.Module):
    def __init__(self):
        self.w = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), (4, 3)) / 7.0)
        self.b = tf.Variable([0.5, -1.0, 2.0])

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
    def serve(self, x):
        return {"scores": tf.nn.softmax(tf.matmul(x, self.w) + self.b)}

m = Linear()
tf.saved_model.save(m, sys.argv[1], signatures={"serving_default": m.serve})
"""


def _scores(x: list[list[float]]) -> np.ndarray:
    logits = np.asarray(x, "float32") @ (np.arange(12, dtype="float32").reshape(4, 3) / 7)
    logits += np.asarray([0.5, -1.0, 2.0], "float32")
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# A job that keeps the SavedModel it was sent in its artifacts, as a training job exports one.
EXPORT = """
import os, shutil
shutil.copytree("linear", os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "linear"))
"""

# Run in the image server's container (`podman exec`): what a job there gets for trying to
# change the model it serves.
TAMPER = """
import os, sys
for what in (lambda: open(sys.argv[1] + "/saved_model.pb", "ab"),
             lambda: open(sys.argv[1] + "/planted.py", "w")):
    try:
        what()
        print("written")
    except OSError as e:
        print(e.strerror)
"""


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_model_server_in_an_image_answers_as_the_venv_one(
    shared_agent, tf_image, minimal_image, tmp_path
):
    exporter = tmp_path / "exporter"
    model_dir = exporter / "linear"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run([sys.executable, "-c", SAVE, str(model_dir)], env=env, check=True, timeout=120)
    (exporter / "export.py").write_text(EXPORT)
    x = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.5, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]]
    with shared_agent.client() as client, contextlib.ExitStack() as stopping:
        exported = client.submit(["export.py"], workdir=exporter, name="linear-export")
        assert exported.wait(60).state.value == "succeeded", b"".join(exported.logs())

        def stop_at_the_end(name: str) -> None:
            def stop() -> None:
                with contextlib.suppress(GpuhopError):
                    job = client.job(name)
                    job.cancel(grace=5)
                    job.wait(timeout=30)

            stopping.callback(stop)

        stop_at_the_end("linear-venv")
        venv = client.serve(model_dir, name="linear-venv", wait=False)
        stop_at_the_end("linear-image")
        # The uploaded model for the venv server, the job's for the one in the image.
        started = shared_agent.cli(
            "serve", exported.id, "--name", "linear-image", "--image", tf_image, timeout=240
        )
        assert started.returncode == 0, started.stderr
        in_image = client.model(started.stdout.strip())
        venv.wait_ready(timeout=120)

        # It runs in a container of the image, with the image's python3, in its own network.
        job = in_image.job
        [container] = containers_named(f"gpuhop-{job.id}-")
        log = b"".join(job.logs()).decode()
        assert "loading the SavedModel in model with /usr/bin/python3" in log, log
        # It sees the job's model at `model` in its work dir, read-only: a process in its
        # container can change none of it.
        mounted = shared_agent.paths.jobs / job.id / "work" / "model"
        tamper = ["podman", "exec", container, "python3", "-c", TAMPER, str(mounted)]
        tried = subprocess.run(tamper, capture_output=True, text=True, timeout=60)
        assert tried.stdout.splitlines() == ["Read-only file system"] * 2, tried
        info = json.loads(shared_agent.cli("show", "--json", job.id).stdout)
        assert (info["image"], info["private_network"]) == (tf_image, True)

        # The same numbers as the venv server's, through the agent and through a forwarded
        # port (TF Serving's REST API as any of its clients speaks it).
        answer = in_image.predict(instances=x)
        assert answer == venv.predict(instances=x)
        assert np.allclose(answer["predictions"], _scores(x), atol=1e-6)
        with in_image.forward() as fwd:
            rest = httpx.post(f"{fwd.url}/v1/models/linear-image:predict", json={"inputs": x})
        assert rest.status_code == 200
        assert rest.json() == venv.predict(inputs=x)

        job.cancel(grace=5)
        assert job.wait(timeout=30).state.value == "cancelled"
        assert containers_named(f"gpuhop-{job.id}-") == []
        # Mounted, neither copied nor linked: the job's model is as it was sent, and the
        # server's work dir holds only the mount point.
        assert _files(shared_agent.paths.jobs / exported.id / "artifacts" / "linear") == (
            _files(model_dir)
        )
        assert list(mounted.iterdir()) == []

        # An image without the server's packages: the job fails at once, saying what to put
        # in the image (the minimal image has no TensorFlow, numpy, starlette nor uvicorn).
        stop_at_the_end("linear-bare")
        bare = shared_agent.cli(
            "serve", str(model_dir), "--name", "linear-bare", "--image", minimal_image
        )
        assert bare.returncode == 1
        said = "the model server's Python lacks tensorflow, numpy, starlette, uvicorn"
        assert said in bare.stderr
        assert "in the image: pip install tensorflow numpy starlette uvicorn" in bare.stderr
        assert "Traceback" not in bare.stderr
        reason = client.job("linear-bare").info.reason or ""
        assert reason.startswith("exited with code 2 after") and said in reason
