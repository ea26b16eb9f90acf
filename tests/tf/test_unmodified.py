"""Scripts that know nothing of gpuhop: the start-up hook adds gpuhop's callbacks to every
Keras `fit`, so they stream epochs and metrics, and with `--retries` resume where they were
killed. Real Keras 3 on TensorFlow (and on JAX where JAX is installed) on the CPU."""

from __future__ import annotations

import json

import pytest

from tests.conftest import jax_env

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

# A keras-io style script: no gpuhop, no callbacks. It dies (as the OOM killer would kill
# it) after epoch 2 of its first attempt, which it tells by a file of its own.
UNMODIFIED = """
import os, signal, sys
import numpy as np
import keras


class Die(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if sys.argv[1:] == ["--die"] and epoch + 1 == 2 and os.environ["GPUHOP_ATTEMPT"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
history = model.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[Die()])
print("trained", len(history.epoch), "epochs on", keras.backend.backend())
"""


def _epochs(agent, name: str) -> list[int]:
    with agent.client() as client:
        records, _ = client.job(name).metrics()
    return [r["epoch"] for r in records if "epoch" in r]


def test_an_unmodified_script_shows_its_epochs(shared_agent, project):
    root = project({"train.py": UNMODIFIED})
    run = shared_agent.cli("run", "--name", "plain-keras", "train.py", cwd=root, timeout=280)
    assert run.returncode == 0, run.stderr
    assert "trained 4 epochs on tensorflow" in run.stdout
    # TensorFlow's C++ start-up chatter is quieted (the oneDNN notice is an INFO line).
    assert "oneDNN" not in run.stdout

    assert _epochs(shared_agent, "plain-keras") == [1, 2, 3, 4]
    info = json.loads(shared_agent.cli("show", "--json", "plain-keras").stdout)
    assert info["latest_metrics"]["epochs"] == 4
    assert "loss" in info["latest_metrics"]


def test_an_unmodified_script_killed_after_epoch_2_resumes_at_epoch_3(shared_agent, project):
    root = project({"train.py": UNMODIFIED})
    run = shared_agent.cli(
        "run", "--name", "plain-resume", "--retries", "1", "train.py", "--die",
        cwd=root, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "retrying (attempt 2 of 2)" in run.stdout
    # Epochs 1-2 from the first attempt, then 3-4 from the second: BackupAndRestore resumed.
    assert _epochs(shared_agent, "plain-resume") == [1, 2, 3, 4]


def test_a_gpuhop_py_of_the_work_dir_is_named_as_what_hides_the_hook(shared_agent, project):
    # The job's own gpuhop.py shadowed gpuhop's package: the log said only "could not add
    # gpuhop's callbacks ...: 'gpuhop' is not a package", and no epoch was recorded.
    root = project({"train.py": UNMODIFIED, "gpuhop.py": "VERSION = 'mine'\n"})
    # From outside the project: `python -m gpuhop` there would import that gpuhop.py too.
    run = shared_agent.cli("run", "-C", str(root), "train.py", cwd=root.parent, timeout=280)
    assert run.returncode == 0, run.stderr
    assert "trained 4 epochs" in run.stdout
    said = " ".join(run.stdout.split())
    assert "a file named gpuhop.py (or a gpuhop folder) in the work dir hides gpuhop's own" in said


def test_no_auto_leaves_fit_alone(shared_agent, project):
    root = project({"train.py": UNMODIFIED})
    run = shared_agent.cli(
        "run", "--name", "manual", "--no-auto", "train.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stderr
    assert "trained 4 epochs" in run.stdout
    assert _epochs(shared_agent, "manual") == []


def test_keras_on_jax_shows_its_epochs_too(shared_agent, project):
    root = project({"train.py": UNMODIFIED})
    run = shared_agent.cli(
        "run",
        "--name",
        "on-jax",
        *jax_env(),
        "-e",
        "KERAS_BACKEND=jax",
        "train.py",
        cwd=root,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr
    assert "trained 4 epochs on jax" in run.stdout
    assert _epochs(shared_agent, "on-jax") == [1, 2, 3, 4]
