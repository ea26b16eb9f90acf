"""Model serving with real TensorFlow: the digits demo, trained by a real job, served by a
real model server job, queried through the agent's proxy, the CLI and `gpuhop forward`.

Answers are checked against the same SavedModel's signature called locally (in a plain
Python process, as a user would on their laptop), on the demo's digits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from gpuhop.api import JobState, fingerprint_of
from gpuhop.client import Client, GpuhopError, Job, Model
from gpuhop.client.transport.remotes import Remote, RemotesFile, save
from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from tests.conftest import EXAMPLES, Agent, wait_until

pytestmark = [pytest.mark.tf, pytest.mark.timeout(300)]

DRAWN_DIGITS = EXAMPLES / "digits" / "drawn_digits.py"

LOCAL_PREDICT = """
import json, sys
import numpy as np
import tensorflow as tf
x = np.asarray(json.load(sys.stdin), dtype="float32")
fn = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
print(json.dumps(fn(pixels=tf.constant(x))["output_0"].numpy().tolist()))
"""


def digits(n: int, start: int = 0) -> np.ndarray:
    """The demo's 8x8 digits (examples/digits/drawn_digits.py), scaled as it trains on them."""
    spec = importlib.util.spec_from_file_location("drawn_digits", DRAWN_DIGITS)
    assert spec and spec.loader
    drawn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(drawn)
    images = drawn.draw(1797)[0]
    n = min(n, len(images) - start)
    return images[start : start + n].reshape(n, -1) / 16.0


class Reference:
    """The SavedModel's serving signature called in a local Python process, as a user
    would on their laptop: once, on every digit, so the tests compare without each
    importing TensorFlow again."""

    def __init__(self, model_dir: Path) -> None:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        done = subprocess.run(
            [sys.executable, "-c", LOCAL_PREDICT, str(model_dir)],
            input=json.dumps(digits(10_000).tolist()),
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        self.answers = np.asarray(json.loads(done.stdout.splitlines()[-1]))

    def predict(self, n: int, start: int = 0) -> np.ndarray:
        """What the model answers locally for `digits(n, start)`."""
        return self.answers[start : start + n]


@pytest.fixture(scope="module")
def trained(shared_agent: Agent, tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, Path]:
    """The demo trained for two epochs in a real job; its SavedModel pulled here too."""
    out = tmp_path_factory.mktemp("pulled")
    with shared_agent.client() as client:
        job = client.submit(
            ["train.py", "--epochs", "2"], workdir=EXAMPLES / "digits", name="trainer"
        )
        assert job.wait(timeout=240).state.value == "succeeded", b"".join(job.logs()).decode()
        job.pull(out)
    return job, out / "digits_savedmodel"


@pytest.fixture(scope="module")
def reference(trained: tuple[Job, Path]) -> Reference:
    return Reference(trained[1])


@pytest.fixture(scope="module")
def served(shared_agent: Agent, trained: tuple[Job, Path]) -> Iterator[Model]:
    """`gpuhop serve TRAINER --name digits`: the SavedModel found in the job's artifacts."""
    job, _ = trained
    started = shared_agent.cli("serve", job.id, "--name", "digits", timeout=240)
    assert started.returncode == 0, started.stderr
    assert "model digits ready in job" in started.stderr
    with shared_agent.client() as client:
        model = client.model(started.stdout.strip())
        yield model
        model.job.cancel(grace=5)
        model.job.wait(timeout=30)


@pytest.fixture(scope="module")
def batched(shared_agent: Agent, trained: tuple[Job, Path]) -> Iterator[Model]:
    """The pulled SavedModel uploaded and served with batches of 4 that wait for company
    for a minute: a batch is run when it is full, never because the clock ran out."""
    _, local_dir = trained
    with shared_agent.client() as client:
        model = client.serve(
            local_dir, name="digits-batched", max_batch_size=4, batch_timeout_ms=60_000
        )
        yield model
        model.job.cancel(grace=5)
        model.job.wait(timeout=30)


def test_the_model_in_a_jobs_artifacts_is_mounted_read_only_not_sent(shared_agent, trained, served):
    job, pulled = trained
    assert served.info.source == f"job {job.id}:digits_savedmodel"
    jobs = shared_agent.paths.jobs
    server = jobs / served.info.job
    # In the server's own view of the host (the mount namespace of its first process), the
    # model is a read-only mount at `model` in its work dir...
    init = json.loads((server / "shim.pid").read_text())["init"]
    model = os.path.realpath(server / "work" / "model")
    mounts = [line.split() for line in Path(f"/proc/{init}/mountinfo").read_text().splitlines()]
    options = [fields[5].split(",") for fields in mounts if fields[4] == model]
    assert options and all("ro" in o for o in options), options
    # ...neither copied nor linked there: on the host, that is an empty mount point.
    assert list((server / "work" / "model").iterdir()) == []
    # And the trainer's SavedModel is as it was pulled before the server started.
    source = jobs / job.id / "artifacts" / "digits_savedmodel"
    files = sorted(p.relative_to(source) for p in source.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(pulled) for p in pulled.rglob("*") if p.is_file())
    assert all((source / f).read_bytes() == (pulled / f).read_bytes() for f in files)


def test_status_and_metadata_in_tf_servings_shape(served):
    assert served.status() == {
        "model_version_status": [
            {
                "version": "1",
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }
    meta = served.metadata()
    assert meta["model_spec"] == {"name": "digits", "signature_name": "", "version": "1"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    [(name, pixels)] = sig["inputs"].items()
    assert (name, pixels["dtype"]) == ("pixels", "DT_FLOAT")
    assert [d["size"] for d in pixels["tensor_shape"]["dim"]] == ["-1", "64"]
    output = sig["outputs"]["output_0"]
    assert (output["dtype"], [d["size"] for d in output["tensor_shape"]["dim"]]) == (
        "DT_FLOAT",
        ["-1", "10"],
    )


def test_predict_in_both_formats_through_the_agent(served, reference):
    x = digits(5)
    expected = reference.predict(5)
    rows = served.predict(instances=x)
    assert np.allclose(rows["predictions"], expected, atol=1e-6)
    columns = served.predict(inputs={"pixels": x.tolist()})
    assert np.allclose(columns["outputs"], expected, atol=1e-6)
    named = served.predict({"instances": [{"pixels": r} for r in x.tolist()]}, signature="serve")
    assert np.allclose(named["predictions"], expected, atol=1e-6)


def test_gpuhop_predict_prints_the_answer(shared_agent, served, reference, tmp_path):
    x = digits(3, start=100)
    (tmp_path / "input.json").write_text(json.dumps({"instances": x.tolist()}))
    done = shared_agent.cli("predict", "digits", "input.json", "--signature", "serve", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    expected = reference.predict(3, start=100)
    assert np.allclose(json.loads(done.stdout)["predictions"], expected, atol=1e-6)
    piped = shared_agent.cli("predict", "digits", "-", input=json.dumps({"inputs": x.tolist()}))
    assert np.allclose(json.loads(piped.stdout)["outputs"], expected, atol=1e-6)


def test_a_forwarded_port_speaks_tf_serving_rest(served, reference):
    x = digits(4, start=7)
    with served.forward() as fwd:
        base = f"{fwd.url}/v1/models/digits"
        assert httpx.get(base).json()["model_version_status"][0]["state"] == "AVAILABLE"
        answer = httpx.post(f"{base}:predict", json={"instances": x.tolist()})
    assert answer.status_code == 200
    assert np.allclose(answer.json()["predictions"], reference.predict(4, start=7), atol=1e-6)


def test_bad_requests_get_tf_serving_errors(served, shared_agent, trained):
    x = digits(1).tolist()
    path = "/v1/models/digits:predict"
    cases = {
        "malformed JSON": (400, "POST", path, {"content": b'{"instances": [1,'}),
        "wrong shape": (400, "POST", path, {"json": {"instances": [[0.0] * 63]}}),
        "both formats": (400, "POST", path, {"json": {"instances": x, "inputs": x}}),
        "unknown signature": (
            400,
            "POST",
            path,
            {"json": {"signature_name": "nope", "instances": x}},
        ),
        "unknown model": (404, "POST", "/v1/models/other:predict", {"json": {"instances": x}}),
        "unknown version": (404, "GET", "/v1/models/digits/versions/7", {}),
    }
    for what, (status, method, url, kwargs) in cases.items():
        answer = served.request(method, url, **kwargs)
        assert answer.status_code == status, what
        assert isinstance(answer.json()["error"], str), what
    assert served.request("POST", path, json={"signature_name": "nope", "instances": x}).json() == {
        "error": 'Serving signature name: "nope" not found in signature def'
    }
    with shared_agent.client() as client:
        # A job that does not exist, and one that is not a model server: 404s, same shape.
        for ref, words in (("nope", "no job matches 'nope'"), (trained[0].id, "not a model")):
            raw = client.session.http.post(f"/v1/serve/{ref}{path}", json={"instances": x})
            assert raw.status_code == 404 and words in raw.json()["error"]
            with pytest.raises(GpuhopError, match=words):
                client.model(ref)
    done = shared_agent.cli("predict", "digits", "-", input='{"instances": [[1]]}')
    assert done.returncode == 2
    assert "input 'pixels' has shape (1, 1); the signature expects (-1, 64)" in done.stderr


def test_serve_refuses_what_is_not_a_savedmodel(shared_agent, trained, tmp_path):
    job, _ = trained
    missing = shared_agent.cli("serve", f"{job.id}:nope", "--name", "x")
    assert missing.returncode == 2
    assert f"job {job.id} has no SavedModel at nope" in missing.stderr
    (tmp_path / "notes.txt").write_text("not a model")
    plain = shared_agent.cli("serve", str(tmp_path), "--name", "x")
    assert plain.returncode == 2 and "is not a SavedModel directory" in plain.stderr
    # A name or path the request refuses is said in one line naming the field, not as
    # pydantic's multi-line report with its URL.
    bad_name = shared_agent.cli("serve", job.id, "--name", "my model")
    assert bad_name.returncode == 2
    assert bad_name.stderr.startswith(
        "gpuhop: error: the model server was not started: name: a model name is 1-64"
    )
    bad_path = shared_agent.cli("serve", f"{job.id}:../x", "--name", "x")
    assert bad_path.returncode == 2
    assert "the model server was not started: path: path '../x': '..'" in bad_path.stderr
    for said in (bad_name.stderr, bad_path.stderr):
        assert "pydantic" not in said and "validation error" not in said, said


def test_serving_under_a_name_a_live_job_has_is_warned_of(shared_agent, trained, project):
    job, _ = trained
    root = project({"hold.py": "import time\ntime.sleep(600)\n"})
    with shared_agent.client() as client:
        namesake = client.submit(["hold.py"], workdir=root, name="namesake")
        try:
            # The warning comes first; this server is then refused (no SavedModel at nope).
            said = shared_agent.cli("serve", f"{job.id}:nope", "--name", "namesake").stderr
        finally:
            namesake.cancel(grace=0)
            namesake.wait(timeout=60)
    assert f"job {namesake.id} is named namesake too and has not ended" in said
    assert said.index("named namesake too") < said.index("has no SavedModel at nope")
    alone = shared_agent.cli("serve", f"{job.id}:nope", "--name", "namesake").stderr
    assert "named namesake too" not in alone


def test_a_model_served_again_is_answered_by_the_one_before_until_the_new_one_answers(
    shared_agent, served, trained, reference, tmp_path
):
    """`serve ... --name digits` again while `digits` answers: requests by the name (the
    SDK's and CLI's `model("digits")`, a TF Serving client's URL) go to the server before,
    as long as the new one has not loaded its model (here: held before it starts) or once it
    failed to; by the new job's id they get its 503. (TF Serving, too, answers with the
    version it has until the next one is ready.)"""
    _, local = trained
    x = digits(2, start=50)
    expected = reference.predict(2, start=50)
    for hold, ends in (("import time\ntime.sleep(600)\n", False), ("raise SystemExit(3)\n", True)):
        model_dir = tmp_path / f"again-{int(ends)}"
        shutil.copytree(local, model_dir)
        (model_dir / "sitecustomize.py").write_text(hold)  # runs before the server does
        with shared_agent.client() as client:
            new = client.serve(model_dir, name="digits", env={"PYTHONPATH": "."}, wait=False)
            try:
                if ends:
                    assert new.job.wait(timeout=120).state == JobState.failed
                else:
                    wait_until(lambda m=new: m.refresh().state == JobState.running, timeout=120)
                assert not new.refresh().ready
                by_name = client.model("digits")
                assert (by_name.info.job, by_name.info.ready) == (served.info.job, True)
                answer = by_name.predict(instances=x)
                assert np.allclose(answer["predictions"], expected, atol=1e-6)
                raw = by_name.session.send(
                    "POST",
                    "/v1/serve/digits/v1/models/digits:predict",
                    json={"instances": x.tolist()},
                )
                assert raw.status_code == 200, raw.text
                assert np.allclose(raw.json()["predictions"], expected, atol=1e-6)
                with pytest.raises(GpuhopError) as not_yet:
                    new.predict(instances=x)
                assert not_yet.value.status == 503
            finally:
                if not new.job.refresh().state.finished:
                    new.job.cancel(grace=0)
                new.job.wait(timeout=60)


def test_serve_replace_cancels_the_version_before_once_the_new_one_answers(
    shared_agent, trained, reference, project
):
    """`gpuhop serve JOB --name NAME --replace`: once the new server answers, the model
    server before it under that name is cancelled (the name then reaches the new one), and
    a job of that name that is no model server is left alone; the SDK refuses `replace`
    without waiting for the new server."""
    job, local = trained
    root = project({"hold.py": "import time\ntime.sleep(600)\n"})
    with shared_agent.client() as client:
        old = client.serve(local, name="rollout")
        other = client.submit(["hold.py"], workdir=root, name="rollout")
        started = [old.info.job, other.id]
        try:
            with pytest.raises(GpuhopError, match="replace cancels the servers before"):
                client.serve(local, name="rollout", replace=True, wait=False)
            said = shared_agent.cli("serve", job.id, "--name", "rollout", "--replace", timeout=240)
            assert said.returncode == 0, said.stderr
            new = said.stdout.strip()
            started.append(new)
            assert f"cancelled job {old.info.job}, the model server before this one" in said.stderr
            assert "then --replace cancels it" in said.stderr
            assert old.job.wait(timeout=60).state == JobState.cancelled
            assert other.refresh().state == JobState.running
            by_name = client.model("rollout")
            assert by_name.info.job == new
            answer = by_name.predict(instances=digits(2, start=70))
            assert np.allclose(answer["predictions"], reference.predict(2, start=70), atol=1e-6)
            refused = shared_agent.cli("serve", job.id, "--name", "x", "--replace", "-d")
            assert refused.returncode != 0 and "leave out --detach" in refused.stderr
        finally:
            for ref in started:
                leftover = client.job(ref)
                if not leftover.refresh().state.finished:
                    leftover.cancel(grace=0)
                leftover.wait(timeout=60)


def test_concurrent_requests_are_batched(shared_agent, batched, reference):
    x = digits(4, start=40)
    expected = reference.predict(4, start=40)

    def one(i: int) -> list[list[float]]:
        # A client of its own per thread, as separate programs would be.
        with Client(shared_agent.home, autostart=False, cache_dir=shared_agent.cache) as c:
            return c.model("digits-batched").predict(instances=x[i : i + 1])["predictions"]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(4)))
    for i, answer in enumerate(answers):
        assert np.allclose(answer, expected[i : i + 1], atol=1e-6)
    # Four rows fill a batch at once, and never wait: it runs alone.
    alone = batched.predict(inputs=x)
    assert np.allclose(alone["outputs"], expected, atol=1e-6)
    stats = batched.stats()
    assert (stats["max_batch_size"], stats["requests"]) == (4, 5)
    assert stats["requests_per_call"] == {"1": 1, "4": 1}


def test_over_tls_only_the_owner_reaches_a_model(
    make_agent, trained, reference, monkeypatch, tmp_path
):
    """A team agent: alice serves an uploaded SavedModel and predicts over HTTPS with her
    token; bob's token finds no such model, and no token gets no further than the agent."""
    agent = make_agent(args=("--listen", "127.0.0.1:0"))
    with agent.client() as owner:
        tokens = {user: owner.create_token(user).token for user in ("alice", "bob")}
    monkeypatch.setenv("GPUHOP_CONFIG_DIR", str(tmp_path / "config"))
    url = agent.listener.url
    pem, _ = fetch_certificate(url)
    remotes = RemotesFile()
    for user, token in tokens.items():
        remote = Remote(name=user, url=url, certificate=pem, fingerprint=fingerprint_of(pem))
        remote.token = token
        remotes.remotes[user] = remote
    save(remotes)
    x = digits(2, start=300)
    with Client(remote="alice", cache_dir=agent.cache) as alice:
        model = alice.serve(trained[1], name="digits", max_batch_size=1)
        try:
            answer = model.predict(instances=x)
            assert np.allclose(answer["predictions"], reference.predict(2, start=300), atol=1e-6)
            with Client(remote="bob", cache_dir=agent.cache) as bob:
                for ref in ("digits", model.info.job):
                    with pytest.raises(GpuhopError, match="no job matches") as refused:
                        bob.model(ref).predict(instances=x)
                    assert refused.value.status == 404
            with httpx.Client(verify=pinned_context(pem)) as anonymous:
                path = f"{url}/v1/serve/{model.info.job}/v1/models/digits:predict"
                assert anonymous.post(path, json={"instances": x.tolist()}).status_code == 401
        finally:
            model.job.cancel(grace=5)
            model.job.wait(timeout=30)
