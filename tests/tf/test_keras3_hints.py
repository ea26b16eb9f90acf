"""Tutorials written for tf-keras fail under Keras 3 (TensorFlow 2.16+) on renamed or removed
APIs; where tf-keras is installed for the job (it is in the test venv), the failure line says
`-e TF_USE_LEGACY_KERAS=1`, and that rerun works. Real Keras 3 and tf-keras on the CPU."""

from __future__ import annotations

import json

import pytest

from gpuhop.runtime.legacykeras import LINE, hint_for

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

FIX = "rerun with -e TF_USE_LEGACY_KERAS=1"

# The TensorFlow "custom training loop" tutorial's metrics, as written for Keras 2.
RESET_STATES = """
import tensorflow as tf

train_loss = tf.keras.metrics.Mean(name="train_loss")
for epoch in range(2):
    for value in (1.0, 2.0, 3.0):
        train_loss.update_state(value)
    print(f"epoch {epoch + 1} loss {float(train_loss.result()):.1f}", flush=True)
    train_loss.reset_states()
print("trained")
"""

# Keras 2's SavedModel export, and a plain mistake in a Keras program for contrast.
SAVE = """
import sys
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
if sys.argv[1] == "save":
    tf.keras.models.save_model(model, "exported", save_format="tf")
    print("saved")
else:
    model.predict(tf.zeros((2, 3)), verbose=0)  # the wrong input shape: no Keras 3 matter
"""


def _said(run) -> str:
    return run.stdout + run.stderr


def test_reset_states_under_keras_3_says_to_rerun_with_tf_keras(shared_agent, project):
    root = project({"train.py": RESET_STATES})
    run = shared_agent.cli("run", "--no-progress", "--name", "k3-reset", "train.py", cwd=root)
    assert run.returncode == 1, _said(run)
    assert "'Mean' object has no attribute 'reset_states'" in run.stdout
    summary = next(line for line in run.stderr.splitlines() if "job " in line and "failed" in line)
    assert FIX in summary  # the failure line itself
    assert LINE in run.stdout.splitlines()  # and the log, right after the traceback
    info = json.loads(shared_agent.cli("show", "--json", "k3-reset").stdout)
    assert info["reason"].startswith("exited with code 1 after ")
    assert FIX in info["reason"] and info["end_class"] == "app-error"

    # The hint is right: the same program runs under tf-keras.
    again = shared_agent.cli(
        "run", "--no-progress", "-e", "TF_USE_LEGACY_KERAS=1", "train.py", cwd=root
    )
    assert again.returncode == 0, _said(again)
    assert "epoch 2 loss 2.0" in again.stdout and "trained" in again.stdout


def test_save_format_gets_the_hint_and_an_ordinary_error_does_not(shared_agent, project):
    root = project({"export.py": SAVE})
    saved = shared_agent.cli("run", "--no-progress", "export.py", "save", cwd=root)
    assert saved.returncode == 1, _said(saved)
    assert "The `save_format` argument is deprecated in Keras 3" in saved.stdout
    assert FIX in saved.stderr

    wrong = shared_agent.cli("run", "--no-progress", "export.py", "predict", cwd=root)
    assert wrong.returncode == 1, _said(wrong)
    assert "Traceback" in wrong.stdout
    assert "TF_USE_LEGACY_KERAS" not in _said(wrong)


def test_the_hint_needs_tf_keras_and_a_job_not_already_on_it():
    error = "AttributeError: 'Mean' object has no attribute 'reset_states'"
    assert hint_for(error, {}, lambda: True) is not None
    assert hint_for(error, {}, lambda: False) is None  # nothing to switch to
    assert hint_for(error, {"TF_USE_LEGACY_KERAS": "1"}, lambda: True) is None
    assert hint_for("AttributeError: 'Foo' object has no attribute 'bar'", {}, lambda: True) is None
