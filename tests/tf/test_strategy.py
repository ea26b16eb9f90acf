"""gpuhop.tf.strategy() with real TensorFlow on the CPU, in a job run by a real agent."""

from __future__ import annotations

import json

import pytest

from gpuhop.api import JobState

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

MIRRORED = """
import json
import tensorflow as tf
import gpuhop.tf

strategy = gpuhop.tf.strategy(cpu_replicas=2)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = tf.random.stateless_normal((64, 4), seed=(1, 2))
y = tf.reduce_sum(x, axis=1, keepdims=True)
history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
try:
    gpuhop.tf.strategy(cpu_replicas=3)
    error = None
except RuntimeError as e:
    error = str(e)
print(json.dumps({
    "type": type(strategy).__name__,
    "replicas": strategy.num_replicas_in_sync,
    "devices": list(strategy.extended.worker_devices),
    "loss_fell": history.history["loss"][-1] < history.history["loss"][0],
    "late_error": error,
}))
"""


def test_two_logical_cpu_replicas_train_under_mirrored_strategy(shared_agent, project):
    root = project({"mirrored.py": MIRRORED})
    with shared_agent.client() as client:
        job = client.submit(["mirrored.py"], workdir=root)
        info = job.wait(timeout=240)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["type"] == "MirroredStrategy"
    assert result["replicas"] == 2
    assert [d.split("/")[-1] for d in result["devices"]] == ["device:CPU:0", "device:CPU:1"]
    assert result["loss_fell"] is True
    assert "before TensorFlow runs its first op" in result["late_error"]


def test_single_device_job_gets_one_device_strategy(shared_agent, project):
    root = project(
        {
            "one.py": "import gpuhop.tf\n"
            "s = gpuhop.tf.strategy()\n"
            "print(type(s).__name__, s.num_replicas_in_sync)\n"
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["one.py"], workdir=root)
        info = job.wait(timeout=240)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, out
    assert out.strip().splitlines()[-1] == "OneDeviceStrategy 1"
