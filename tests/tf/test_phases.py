"""A program that fits, then trains on in a custom GradientTape loop that writes tf.summary
scalars (as TensorBoard's get-started tutorial does), unmodified: each phase's metrics are
recorded under its source, the last metrics say which phase they came from, and `show`,
`ps` and the dashboard's API show them. Real Keras 3 and TensorBoard's summaries on the CPU."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.test_ui import code_for, login, with_cookie

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

FIT_THEN_TAPE = """
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)

# Phase 1: a warm-up fit, with Keras's TensorBoard callback writing its own summaries.
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)], name="warmup")
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, epochs=2, batch_size=32, verbose=0,
          callbacks=[tf.keras.callbacks.TensorBoard("logs/fit")])

# Phase 2: a custom loop, logging per epoch as the TensorBoard tutorial does.
optimizer = tf.keras.optimizers.SGD(0.05)
train_loss = tf.keras.metrics.Mean()
writer = tf.summary.create_file_writer("logs/gradient_tape/train")


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    tf.summary.scalar("in_graph", loss, step=optimizer.iterations)  # no value in Python
    return loss


for epoch in range(3):
    for i in range(0, 128, 32):
        train_loss.update_state(train_step(x[i:i + 32], y[i:i + 32]))
    with writer.as_default():
        tf.summary.scalar("loss", train_loss.result(), step=epoch)
        tf.summary.scalar("learning_rate", 0.05, step=epoch)
    print(f"epoch {epoch} loss {float(train_loss.result()):.4f}", flush=True)
    train_loss.reset_state()
print("done")
"""

TAPE = "summary:logs/gradient_tape/train"


def test_fit_then_a_gradient_tape_loop_shows_each_phase(shared_agent, project):
    root = project({"train.py": FIT_THEN_TAPE})
    run = shared_agent.cli("run", "--no-progress", "--name", "phases", "train.py", cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done" in run.stdout
    # The run's end line says which phase its last metrics came from.
    assert f"(from {TAPE})" in run.stderr

    with shared_agent.client() as client:
        records, _ = client.job("phases").metrics()
    fit = [r for r in records if r.get("source") == "fit:warmup"]
    tape = [r for r in records if r.get("source") == TAPE]
    assert [r["epoch"] for r in fit] == [1, 2] and all("loss" in r for r in fit)
    # One record per scalar written in eager code, with the step it was written at.
    assert [(r["step"], sorted(set(r) - {"time", "step", "source"})) for r in tape] == [
        (epoch, [name]) for epoch in range(3) for name in ("loss", "learning_rate")
    ]
    last_loss = float(run.stdout.split("epoch 2 loss ")[1].split()[0])
    assert tape[-2]["loss"] == pytest.approx(last_loss, abs=1e-4)
    # Nothing else was recorded: not the fit's TensorBoard callback's summaries, nor the
    # scalar written inside the tf.function.
    assert {r.get("source") for r in records} <= {"fit:warmup", TAPE, None}
    assert not any("in_graph" in r or "epoch_loss" in r for r in records)

    info = json.loads(shared_agent.cli("show", "--json", "phases").stdout)
    latest = info["latest_metrics"]
    assert latest["source"] == TAPE and latest["step"] == 2  # one step's scalars together
    assert latest["loss"] == pytest.approx(last_loss, abs=1e-4)
    assert latest["learning_rate"] == pytest.approx(0.05)
    assert list(info["metrics_by_source"]) == [TAPE, "fit:warmup"]
    assert info["metrics_by_source"]["fit:warmup"]["epoch"] == 2

    done = shared_agent.cli("show", "phases")
    shown = done.stdout + done.stderr
    lines = shown.splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip().startswith("metrics")), None)
    assert at is not None, shown
    assert lines[at].endswith(f"(from {TAPE})") and "loss=" in lines[at], shown
    assert lines[at + 1].endswith("(from fit:warmup)"), shown
    assert lines[at + 1].split()[0] == "step=8", shown  # its phase's last numbers

    listed = shared_agent.cli("ps").stdout
    row = next((line for line in listed.splitlines() if "phases" in line), None)
    assert row is not None and "(from summary:" in row, listed
    assert "learning_rate=0.05" in row

    # The dashboard's list and job page get the same (they show the source beside them).
    transport = httpx.HTTPTransport(uds=str(shared_agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://gpuhop", timeout=30) as http:
        cookie = with_cookie(login(http, code_for(http)))
        page = http.get(f"/ui/api/jobs/{info['id']}", headers=cookie).json()["job"]
        listed = http.get("/ui/api/jobs", headers=cookie).json()["jobs"]
    assert list(page["metrics_by_source"]) == [TAPE, "fit:warmup"]
    assert next(j for j in listed if j["id"] == info["id"])["latest_metrics"]["source"] == TAPE
