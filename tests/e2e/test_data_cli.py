"""`gpuhop data` and `gpuhop env` as a user runs them, against a real agent."""

from __future__ import annotations

import json

import pytest

from gpuhop import GpuhopError


def test_push_list_show_run_and_remove(make_agent, project, tmp_path):
    agent = make_agent()
    data = tmp_path / "mnist"
    (data / "train").mkdir(parents=True)
    (data / "train" / "x.csv").write_text("1,2,3\n" * 1000)
    (data / "README").write_text("digits\n")

    push = agent.cli("data", "push", str(data), "--name", "mnist")
    assert push.returncode == 0, push.stderr
    assert "mnist v1: 2 files" in push.stderr and "sent 2 chunks" in push.stderr
    assert push.stderr.count("\n") == 1, push.stderr  # to a pipe: no progress bars' frames
    again = agent.cli("data", "push", str(data), "--name", "mnist")
    assert "mnist v1 (unchanged: no new version)" in again.stderr
    assert "sent 0 chunks" in again.stderr
    (data / "README").write_text("digits, v2\n")
    assert "mnist v2" in agent.cli("data", "push", str(data), "--name", "mnist", "-q").stderr

    listed = json.loads(agent.cli("data", "ls", "--json").stdout)
    assert [(d["name"], d["version"], d["files"]) for d in listed] == [
        ("mnist", 1, 2),
        ("mnist", 2, 2),
    ]
    shown = agent.cli("data", "show", "mnist:1")
    assert "train/x.csv" in shown.stdout and "mnist v2: 2 files" in shown.stderr

    root = project({"job.py": "print(open('in/README').read().strip())\n"})
    run = agent.cli("run", "--data", "mnist:v1=in", "job.py", cwd=root)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "digits"
    latest = agent.cli("run", "--data", "mnist=in", "job.py", cwd=root)
    assert latest.stdout.strip() == "digits, v2"

    bad = agent.cli("run", "--data", "mnist=../up", "job.py", cwd=root)
    assert bad.returncode == 2 and "inside the work dir" in bad.stderr
    missing = agent.cli("run", "--data", "nope=in", "job.py", cwd=root)
    assert missing.returncode == 2 and "no dataset named 'nope'" in missing.stderr

    removed = agent.cli("data", "rm", "mnist:1")
    assert removed.returncode == 0 and "removed mnist v1" in removed.stderr
    gone = agent.cli("data", "show", "mnist:1")
    assert gone.returncode == 2 and "has no version 1 (it has v2)" in gone.stderr
    assert "chunks" in agent.cli("data", "rm", "--help").stdout
    # Version 0 is no version: `rm mnist:0` removed every version, as `rm mnist` does.
    for command in (("show", "mnist:0"), ("rm", "mnist:0"), ("rm", "mnist:v0")):
        zero = agent.cli("data", *command)
        assert zero.returncode == 2, zero.stderr
        assert "a dataset's versions count from 1; give NAME for all of them" in zero.stderr
    mounted = agent.cli("run", "--data", "mnist:0=in", "job.py", cwd=root)
    assert mounted.returncode == 2, mounted.stderr
    assert "the version must be a number like 3 or v3, from 1" in mounted.stderr
    with agent.client() as client:
        with pytest.raises(GpuhopError, match="no version 0; versions count from 1"):
            client.data.remove("mnist", 0)
        assert [d.version for d in client.data.versions("mnist")] == [2]

    envs = agent.cli("env", "ls")
    assert envs.returncode == 0 and "no environments yet" in envs.stderr
    assert agent.cli("env", "rm").returncode == 2

    # One of each is said as one: "1 files ... in 1 chunks; sent 1 chunks" before.
    (tmp_path / "labels.txt").write_text("0 1 2\n")
    one = agent.cli("data", "push", str(tmp_path / "labels.txt"), "--name", "labels")
    assert one.returncode == 0, one.stderr
    assert "labels v1: 1 file, " in one.stderr and " in 1 chunk; sent 1 chunk, " in one.stderr
    assert "labels v1: 1 file, " in agent.cli("data", "show", "labels").stderr
