"""Files as Linux allows them and jobs write them (issue 19): names that are not UTF-8, a
metrics line longer than a read, a dataset push cut short. Each is carried byte for byte,
refused naming the file, or skipped, and never stops the agent's answers."""

from __future__ import annotations

import os
import time

import httpx

from gpuhop.api import JobState
from tests.conftest import wait_until
from tests.integration.test_gc import EAGER

BAD = b"caf\xe9.txt"  # Latin-1, not UTF-8


def test_a_file_name_that_is_not_utf8_is_refused_naming_it(shared_agent, project):
    root = project({"t.py": "print(1)"})
    (root / "data").mkdir()
    with open(os.path.join(os.fsencode(root / "data"), BAD), "w") as f:
        f.write("x")
    run = shared_agent.cli("run", "t.py", cwd=root)
    assert run.returncode != 0
    assert "data/caf\\xe9.txt" in run.stderr and "not valid UTF-8" in run.stderr, run.stderr
    push = shared_agent.cli("data", "push", str(root / "data"), "--name", "odd")
    assert push.returncode != 0
    assert "caf\\xe9.txt" in push.stderr and "not valid UTF-8" in push.stderr, push.stderr


ARTIFACTS = """
import os
d = os.fsencode(os.environ["GPUHOP_ARTIFACTS_DIR"])
open(os.path.join(d, b"caf\\xe9.txt"), "w").write("x")
open(os.path.join(d, b"good.txt"), "w").write("y")
open(os.path.join(d, b"two\\nlines.txt"), "w").write("z")
"""

METRICS = """
import json, os
with open(os.environ["GPUHOP_METRICS_FILE"], "w") as f:
    f.write(json.dumps({"step": 1, "blob": "x" * (5 << 20)}) + "\\n")
    f.write(json.dumps({"step": 2, "loss": 0.5}) + "\\n")
"""


def test_artifacts_and_metrics_that_once_broke_their_answers(shared_agent, project, tmp_path):
    with shared_agent.client() as client:
        job = client.submit(["a.py"], workdir=project({"a.py": ARTIFACTS + METRICS}))
        assert job.wait(60).state == JobState.succeeded, b"".join(job.logs())
        # A name that is not UTF-8 is listed (shown escaped) and pulled byte for byte.
        listed = job.artifacts()
        assert [(a.path, a.name_bytes()) for a in listed] == [
            ("caf\\xe9.txt", BAD),
            ("good.txt", b"good.txt"),
            ("two\nlines.txt", b"two\nlines.txt"),
        ]
        # A newline in a name too (its route matched no line break: "no such route").
        pull = shared_agent.cli("pull", job.id, "-o", str(tmp_path / "out"))
        assert pull.returncode == 0, pull.stderr
        out = os.fsencode(tmp_path / "out")
        assert sorted(os.listdir(out)) == [b".gpuhopignore", BAD, b"good.txt", b"two\nlines.txt"]
        with open(os.path.join(out, b"two\nlines.txt"), "rb") as f:
            assert f.read() == b"z"
        with open(os.path.join(out, BAD), "rb") as f:
            assert f.read() == b"x"
        records: list[dict] = []
        offset = 0
        for _ in range(5):  # a follower reads on from where it stopped
            got, offset = job.metrics(offset)
            records += got
        assert records == [{"step": 2, "loss": 0.5}]


def test_gc_removes_what_an_interrupted_dataset_push_left(make_agent, tmp_path):
    agent = make_agent(args=EAGER)
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("a")
    with agent.client() as client:
        client.data.push(data, name="ds")
        # What an agent killed mid-push leaves: a half-assembled version and a temp record.
        folder = agent.home / "datasets" / "ds"
        half = folder / ".v2-abc123"
        half.mkdir()
        (half / "big").write_bytes(b"x" * 1000)
        (folder / ".tmp-xyz").write_bytes(b"{")
        old = time.time() - 3600
        for p in (half / "big", half, folder / ".tmp-xyz"):
            os.utime(p, (old, old))
        report = client.gc()
        assert report.freed["temp"].bytes >= 1001
        wait_until(lambda: not half.exists() and not (folder / ".tmp-xyz").exists(), timeout=5)
        assert (folder / "v1").is_dir() and [d.version for d in client.data.versions("ds")] == [1]


# Lines nested past the interpreter's recursion limit (json.loads raises RecursionError, not
# ValueError), and one that parses but is nested hundreds deep, each holding the job's secret
# (so the agent's masking walks them at the attempt's end): the last two lines of the file,
# where `ps` and `show` read the latest metrics.
NESTED = """
import json, os
secret = os.environ["ODD_TOKEN"]
with open(os.environ["GPUHOP_METRICS_FILE"], "w") as f:
    f.write(json.dumps({"step": 1, "loss": 0.25}) + "\\n")
    f.write('{"step": 2, "deep": ' + "[" * 5000 + json.dumps(secret) + "]" * 5000 + "}\\n")
    f.write('{"step": 3, "deep": ' + "[" * 400 + json.dumps(secret) + "]" * 400 + "}\\n")
"""


def test_metrics_nested_past_the_recursion_limit_are_skipped_and_ps_answers(shared_agent, project):
    with shared_agent.client() as client:
        client.set_secret("ODD_TOKEN", "odd-token-value")
        try:
            job = client.submit(["n.py"], workdir=project({"n.py": NESTED}), secrets=["ODD_TOKEN"])
            assert job.wait(60).state == JobState.succeeded
            ps = shared_agent.cli("ps")
            assert ps.returncode == 0, ps.stderr
            assert client.job(job.id).info.latest_metrics == {"step": 1, "loss": 0.25}
            assert job.metrics(0)[0] == [{"step": 1, "loss": 0.25}]
            # The masked file keeps no value of the secret, the deep lines included.
            kept = (shared_agent.paths.jobs / job.id / "metrics.jsonl").read_bytes()
            assert b"odd-token-value" not in kept and kept.count(b"\n") == 3
        finally:
            client.remove_secret("ODD_TOKEN")


def test_a_log_or_metrics_offset_past_any_file_is_refused_naming_it(shared_agent, project):
    with shared_agent.client() as client:
        job = client.submit(["t.py"], workdir=project({"t.py": "print(1)"}))
        assert job.wait(60).state == JobState.succeeded
    transport = httpx.HTTPTransport(uds=str(shared_agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://agent") as http:
        for offset in (10**18 - 1, 2**63 - 1, 10**22):
            for route in ("log", "metrics"):
                got = http.get(f"/v1/jobs/{job.id}/{route}", params={"offset": offset})
                assert got.status_code == 422, (route, offset, got.text)
                assert "offset" in got.json()["message"]
        assert http.get(f"/v1/jobs/{job.id}/log", params={"offset": 2**40}).content == b""
