"""A model a job exports to its temp dir, as TF Serving's `rest_simple` tutorial does
(`tempfile.gettempdir()`), is not lost: the job's private /tmp is kept with its files, `pull`
brings it back in a part of its own, and `serve` finds the SavedModel there and says so.
A real agent, a real Keras job, a real model server job."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import Agent

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

EXPORT = """
import json, os, tempfile
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x.sum(axis=1), epochs=1, verbose=0)
export_path = os.path.join(tempfile.gettempdir(), "rest_simple", "1")
model.export(export_path)
print("exported to", export_path)
print("predicts", json.dumps(model.predict(np.eye(4, dtype="float32"), verbose=0).tolist()))
"""


def test_a_model_exported_to_the_temp_dir_is_pulled_and_served(
    shared_agent: Agent, project, tmp_path
):
    root = project({"export.py": EXPORT})
    run = shared_agent.cli("run", "--name", "tmp-exporter", "export.py", cwd=root, timeout=240)
    assert run.returncode == 0, run.stderr
    assert "exported to /tmp/rest_simple/1" in run.stdout
    expected = json.loads(run.stdout.split("predicts ")[1])
    job_id = json.loads(shared_agent.cli("show", "--json", "tmp-exporter").stdout)["id"]
    kept = shared_agent.paths.jobs / job_id / "tmp" / "rest_simple" / "1"

    here = tmp_path / "here"
    here.mkdir()
    pulled = shared_agent.cli("pull", "tmp-exporter", cwd=here)
    assert pulled.returncode == 0, pulled.stderr
    part = here / "gpuhop-artifacts" / "tmp-exporter" / "job-tmp"  # the job's name
    said = " ".join(pulled.stderr.split())
    assert "file(s) the job left in its /tmp," in said and str(part.relative_to(here)) in said
    got = part / "rest_simple" / "1" / "saved_model.pb"
    assert got.read_bytes() == (kept / "saved_model.pb").read_bytes()

    served = shared_agent.cli("serve", "tmp-exporter", "--name", "tmp-model", timeout=240)
    assert served.returncode == 0, served.stderr
    said = " ".join(served.stderr.split())
    assert (
        f"loading job {job_id}:/tmp/rest_simple/1 (found a SavedModel the job saved in its /tmp)"
        in said
    )
    with shared_agent.client() as client:
        model = client.model(served.stdout.strip())
        try:
            # The job's kept /tmp, mounted (read-only) in the server's view, not sent anywhere:
            # through its first process's root, `model` is the very files kept.
            server = shared_agent.paths.jobs / model.info.job
            init = json.loads((server / "shim.pid").read_text())["init"]
            seen = Path(f"/proc/{init}/root") / str(server / "work" / "model").lstrip("/")
            assert (
                os.stat(seen / "saved_model.pb").st_ino == os.stat(kept / "saved_model.pb").st_ino
            )
            answer = model.predict(instances=np.eye(4).tolist())
            assert np.allclose(answer["predictions"], expected, atol=1e-5)
        finally:
            model.job.cancel(grace=5)
            model.job.wait(timeout=30)
