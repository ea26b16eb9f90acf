"""A job killed mid-training is retried and resumes from its last finished epoch."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

RESUMABLE = """
import os, signal
import numpy as np
import tensorflow as tf
import gpuhop.runtime
import gpuhop.tf


class DieOnFirstAttempt(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if gpuhop.runtime.attempt() == 1 and epoch + 1 == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(
    x, y, epochs=6, batch_size=32, verbose=2,
    callbacks=[*gpuhop.tf.callbacks(), DieOnFirstAttempt()],
)
print("finished on attempt", gpuhop.runtime.attempt())
"""


def test_sigkilled_job_resumes_from_its_last_epoch(shared_agent, project):
    root = project({"resume.py": RESUMABLE})
    run = shared_agent.cli(
        "run", "--name", "resumer", "--retries", "1", "resume.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stderr
    assert "gpuhop: attempt 1 failed: killed by signal 9 (SIGKILL" in run.stdout
    assert "retrying (attempt 2 of 2)" in run.stdout
    assert run.stdout.strip().endswith("finished on attempt 2")

    info = json.loads(shared_agent.cli("show", "--json", "resumer").stdout)
    assert (info["state"], info["attempt"], info["retries"]) == ("succeeded", 2, 1)
    [first] = info["attempts"]
    assert (first["attempt"], first["state"], first["signal"]) == (1, "failed", 9)

    with shared_agent.client() as client:
        records, _ = client.job("resumer").metrics()
    # Epochs 1-3 from the first attempt, then 4-6 from the second: nothing was re-trained.
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5, 6]


def test_retries_run_out_and_the_job_fails(shared_agent, project):
    root = project(
        {
            "fail.py": "import gpuhop.runtime, sys\n"
            "print('attempt', gpuhop.runtime.attempt()); sys.exit(3)\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["fail.py"], workdir=root, retries=2, retry_on="any")
        info = job.wait(timeout=60)
        log = b"".join(job.logs()).decode()
    assert (info.state.value, info.exit_code, info.attempt) == ("failed", 3, 3)
    assert [a.attempt for a in info.attempts] == [1, 2]
    assert [line for line in log.splitlines() if line.startswith("attempt")] == [
        "attempt 1",
        "attempt 2",
        "attempt 3",
    ]


def test_a_cancelled_job_is_not_retried(shared_agent, project):
    root = project({"slow.py": "import time\nprint('up', flush=True)\ntime.sleep(300)\n"})
    with shared_agent.client() as client:
        job = client.submit(["slow.py"], workdir=root, retries=3)
        wait_until(lambda: b"up" in b"".join(job.logs()), timeout=60)
        info = job.cancel(grace=1)
        info = job.wait(timeout=30)
    assert (info.state.value, info.attempt, info.attempts) == ("cancelled", 1, [])


# Tutorial-shaped (keras-io's weather forecasting): a CSVLogger that appends and the best
# model so far, no gpuhop in sight. It crashes once, mid-epoch 3, with its progress line
# half written (as a SIGKILL from the OOM killer finds it); the crash leaves a mark in the
# work dir, so a retry that did not continue there would crash again.
CONTINUED = """
import os, signal, sys
import numpy as np
import tensorflow as tf

print("best model there at start:", os.path.exists("best.keras"), flush=True)


class CrashOnce(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 2 and batch == 3 and not os.path.exists("crashed-once"):
            open("crashed-once", "w").close()
            sys.stdout.write("4/8 - loss: 0.0181")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(
    x, y, epochs=6, batch_size=32, verbose=2,
    callbacks=[
        tf.keras.callbacks.CSVLogger("training.csv", append=True),
        tf.keras.callbacks.ModelCheckpoint("best.keras", monitor="loss", save_best_only=True),
        CrashOnce(),
    ],
)
"""


def test_a_retry_continues_where_the_killed_attempt_left_off(shared_agent, project):
    root = project({"weather.py": CONTINUED})
    run = shared_agent.cli(
        "run", "--name", "csv-resumer", "--retries", "1", "weather.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stderr
    log = run.stdout
    # gpuhop's notice starts a line of its own, after the killed epoch's half-written one.
    assert "4/8 - loss: 0.0181\ngpuhop: attempt 1 failed: killed by signal 9" in log
    assert all(line.startswith("gpuhop:") for line in log.splitlines() if "gpuhop:" in line)
    # The second attempt started in the work dir the first left: its best model is there.
    starts = [line for line in log.splitlines() if line.startswith("best model there")]
    assert starts == ["best model there at start: False", "best model there at start: True"]

    info = json.loads(shared_agent.cli("show", "--json", "csv-resumer").stdout)
    assert (info["state"], info["attempt"]) == ("succeeded", 2)
    work = shared_agent.paths.jobs / info["id"] / "work"
    # Every epoch once: two from the first attempt, the rest (from the killed epoch on)
    # appended by the second.
    rows = (work / "training.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,")
    assert [row.split(",")[0] for row in rows[1:]] == ["0", "1", "2", "3", "4", "5"]
    assert (work / "best.keras").is_file()

    with shared_agent.client() as client:
        records, _ = client.job("csv-resumer").metrics()
    # 8 steps an epoch: the count goes on across the attempts, as one run's would.
    assert [(r["epoch"], r["step"]) for r in records] == [(e, 8 * e) for e in range(1, 7)]
    # `show` keeps each attempt's last metrics.
    [first] = info["attempts"]
    assert (first["metrics"]["epoch"], first["metrics"]["step"]) == (2, 16)
    assert (info["latest_metrics"]["epoch"], info["latest_metrics"]["step"]) == (6, 48)
    shown = shared_agent.cli("show", "csv-resumer").stdout
    assert re.search(
        r"attempt 1 +failed: killed by signal 9.*\n +last metrics: step=16 epoch=2", shown
    )


# keras-io's shape: a Sequential without an Input, which Keras 3 on TensorFlow builds only
# in the first step. Keras 3's BackupAndRestore refuses a model unbuilt at `fit`'s start, so
# the one the hook adds under --retries failed every such script at once, with nothing to
# restore. Killed as the 4th epoch begins, it must resume there with the weights it had.
UNBUILT = """
import os, signal
import numpy as np
import keras


class Die(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        if os.environ["GPUHOP_ATTEMPT"] == "1" and epoch == 3:
            np.save("at-kill.npy", np.concatenate([w.ravel() for w in self.model.get_weights()]))
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_begin(self, batch, logs=None):
        if os.environ["GPUHOP_ATTEMPT"] == "2" and batch == 1:
            now = np.concatenate([w.ravel() for w in self.model.get_weights()])
            print("epoch", self.epoch + 1, "restored:", np.allclose(now, np.load("at-kill.npy")))


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1)
model = keras.Sequential([keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
model.fit(x, y, epochs=6, batch_size=32, verbose=2, callbacks=[Die()])
print("finished on attempt", os.environ["GPUHOP_ATTEMPT"])
"""


def test_an_unbuilt_keras3_model_resumes_under_retries(shared_agent, project):
    root = project({"unbuilt.py": UNBUILT})
    run = shared_agent.cli(
        "run", "--name", "unbuilt", "--retries", "1", "unbuilt.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpuhop: attempt 1 failed: killed by signal 9 (SIGKILL" in run.stdout
    assert "epoch 4 restored: True" in run.stdout
    assert run.stdout.strip().endswith("finished on attempt 2")
    with shared_agent.client() as client:
        records, _ = client.job("unbuilt").metrics()
    assert [(r["epoch"], r["step"]) for r in records] == [(e, 8 * e) for e in range(1, 7)]


# keras-io's transfer learning shape: fit the head with the base frozen, then unfreeze and
# fit again. Killed as the second fit's 3rd epoch begins, the retry must not train the head
# again (it used to take the second fit's backup for its own, train on from there, then
# delete it), and the second fit must resume at its 3rd epoch with the weights it had.
FINE_TUNING = """
import os, signal
import numpy as np
import keras

ATTEMPT = os.environ["GPUHOP_ATTEMPT"]


def weights(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


class Die(keras.callbacks.Callback):
    def __init__(self, stage):
        super().__init__()
        self.stage = stage

    def on_epoch_begin(self, epoch, logs=None):
        print(f"attempt {ATTEMPT}: fit {self.stage} epoch {epoch + 1}", flush=True)
        if self.stage == 2 and epoch == 2:
            if ATTEMPT == "1":
                np.save("at-kill.npy", weights(self.model))
                os.kill(os.getpid(), signal.SIGKILL)
            print("restored:", np.allclose(weights(self.model), np.load("at-kill.npy")))


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu")])
inputs = keras.Input((8,))
model = keras.Model(inputs, keras.layers.Dense(1)(base(inputs, training=False)))
base.trainable = False
model.compile(optimizer="adam", loss="mse")
head = model.fit(x, y, epochs=3, batch_size=32, verbose=0, callbacks=[Die(1)])
base.trainable = True
model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
whole = model.fit(x, y, epochs=5, batch_size=32, verbose=0, callbacks=[Die(2)])
print("head epochs:", head.epoch, "losses:", len(head.history["loss"]))
print("whole epochs:", whole.epoch, "losses:", len(whole.history["loss"]))
print("finished on attempt", ATTEMPT)
"""


def test_a_fine_tuning_killed_in_its_second_fit_resumes_there(shared_agent, project):
    root = project({"finetune.py": FINE_TUNING})
    run = shared_agent.cli(
        "run", "--name", "finetune", "--retries", "1", "finetune.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "retrying (attempt 2 of 2)" in run.stdout
    began = [line for line in run.stdout.splitlines() if line.startswith("attempt ")]
    assert began == [
        *(f"attempt 1: fit 1 epoch {e}" for e in (1, 2, 3)),
        *(f"attempt 1: fit 2 epoch {e}" for e in (1, 2, 3)),
        *(f"attempt 2: fit 2 epoch {e}" for e in (3, 4, 5)),
    ]
    assert "restored: True" in run.stdout
    assert "Skipping variable loading" not in run.stdout + run.stderr
    # Each fit's History holds all its epochs, as one uninterrupted run's would: the one the
    # retry skipped, and the one it resumed.
    assert "head epochs: [0, 1, 2] losses: 3" in run.stdout
    assert "whole epochs: [0, 1, 2, 3, 4] losses: 5" in run.stdout
    assert run.stdout.strip().endswith("finished on attempt 2")


# The CSVLogger of keras-io's examples (append=False, Keras's default) and one that appends,
# killed at the end of fit 2's 3rd epoch after both wrote its row, before its backup: the
# retry resumes that fit at its 3rd epoch. It used to empty log.csv (rows 0-1 lost) and to
# write appended.csv's row 2 again; and the replay of fit 1, which had ended and runs
# no epoch again, emptied first.csv.
CSV_LOGGED = """
import os, signal
import numpy as np
KERAS

ATTEMPT = os.environ["GPUHOP_ATTEMPT"]


class Die(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"attempt {ATTEMPT}: epoch {epoch + 1}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if ATTEMPT == "1" and epoch == 2:
            os.kill(os.getpid(), signal.SIGKILL)


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, epochs=2, verbose=0, callbacks=[keras.callbacks.CSVLogger("first.csv")])
model.fit(
    x, y, epochs=6, batch_size=32, verbose=0,
    callbacks=[
        keras.callbacks.CSVLogger("log.csv"),
        keras.callbacks.CSVLogger("appended.csv", append=True),
        Die(),
    ],
)
"""


@pytest.mark.parametrize(
    ("name", "keras"),
    [
        ("csvlog-tf-keras", "import tensorflow as tf\nkeras = tf.keras"),  # the job's default
        ("csvlog-keras3", "import keras"),
    ],
    ids=["tf-keras", "keras3"],
)
def test_csv_logs_hold_each_epoch_once_after_a_retry(shared_agent, project, tmp_path, name, keras):
    root = project({"csvlogged.py": CSV_LOGGED.replace("KERAS", keras)})
    run = shared_agent.cli(
        "run", "--name", name, "--retries", "1", "csvlogged.py", cwd=root, timeout=280
    )
    assert run.returncode == 0, run.stdout + run.stderr
    began = [line for line in run.stdout.splitlines() if line.startswith("attempt ")]
    assert began == [
        *(f"attempt 1: epoch {e}" for e in (1, 2, 3)),
        *(f"attempt 2: epoch {e}" for e in (3, 4, 5, 6)),
    ]
    pulled = shared_agent.cli("pull", name, "--only", "workdir", "-o", "out", cwd=tmp_path)
    assert pulled.returncode == 0, pulled.stderr
    # The first column: one header, then each epoch's row once, in order.
    pulled_dir = tmp_path / "out" / "workdir"
    columns = {
        csv: [row.split(",")[0] for row in (pulled_dir / csv).read_text().splitlines()]
        for csv in ("log.csv", "appended.csv", "first.csv")
    }
    whole = ["epoch", *(str(e) for e in range(6))]
    assert columns == {"log.csv": whole, "appended.csv": whole, "first.csv": whole[:3]}
