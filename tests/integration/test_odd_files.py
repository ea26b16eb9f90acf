"""Files as Linux allows them and jobs write them (issue 19): names that are not UTF-8, a
metrics line longer than a read, a dataset push cut short. Each is carried byte for byte,
refused naming the file, or skipped, and never stops the agent's answers."""

from __future__ import annotations

import os
import time

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
        assert job.wait(60).state == JobState.succeeded
        # A name that is not UTF-8 is listed (shown escaped) and pulled byte for byte.
        listed = job.artifacts()
        assert [(a.path, a.name_bytes()) for a in listed] == [
            ("caf\\xe9.txt", BAD),
            ("good.txt", b"good.txt"),
        ]
        pull = shared_agent.cli("pull", job.id, "-o", str(tmp_path / "out"))
        assert pull.returncode == 0, pull.stderr
        out = os.fsencode(tmp_path / "out")
        assert sorted(os.listdir(out)) == [b".gpuhopignore", BAD, b"good.txt"]  # not synced
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
