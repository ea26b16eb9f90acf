"""`Client.submit`'s keywords as a Python user passes them, against a real agent: what the
SDK takes in more than one form takes each, and what it cannot take is a GpuhopError that
names the keyword, before anything is synced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError

HELLO = {"hello.py": "print('hello')\n"}


def test_counts_given_as_text_are_read_as_the_agent_reads_them(shared_agent, project):
    root = project(HELLO)
    with shared_agent.client() as client:
        job = client.submit(["hello.py"], workdir=root, priority="-5", retries="1")
        info = job.wait(60)
        assert (info.state, info.priority, info.retries) == (JobState.succeeded, -5, 1)
        # Compared with numbers before the request: this was a bare TypeError
        # ("'>' not supported between instances of 'str' and 'int'").
        with pytest.raises(GpuhopError, match="it cannot be combined with gpus 2"):
            client.submit(["hello.py"], workdir=root, gpus="2", gpu_memory="1G")
        with pytest.raises(GpuhopError, match="2 GPUs"):
            client.submit(["hello.py"], workdir=root, workers="2", gpus_per_worker="1")
        with pytest.raises(GpuhopError, match=r"^workers: takes a whole number, got 'two'$"):
            client.submit(["hello.py"], workdir=root, workers="two")
        with pytest.raises(GpuhopError, match=r"^gpus: takes a whole number, got 1.5$"):
            client.submit(["hello.py"], workdir=root, gpus=1.5)


def test_paths_stand_for_strings_in_the_command_and_the_python(shared_agent, project):
    root = project({"args.py": "import sys; print(sys.argv[1:], sys.executable)\n"})
    with shared_agent.client() as client:
        # As subprocess.run takes them: a script's Path, or Paths among the arguments.
        whole = client.submit(root / "args.py", workdir=root)
        parts = client.submit(
            [root / "args.py", Path("data/x.csv"), "--n", "1"],
            workdir=root,
            python=Path(sys.executable),
        )
        assert whole.wait(60).state == parts.wait(60).state == JobState.succeeded
        assert b"".join(whole.logs()).decode().startswith("[] ")
        assert b"".join(parts.logs()).decode() == f"['data/x.csv', '--n', '1'] {sys.executable}\n"
        with pytest.raises(GpuhopError, match=r"^python: takes a path, got 3$"):
            client.submit(["args.py"], workdir=root, python=3)


def test_an_environment_that_is_no_dict_is_refused_in_words(shared_agent, project):
    root = project(HELLO)
    with shared_agent.client() as client:
        # As `gpuhop run -e` takes it: this was "dictionary update sequence element #0 has
        # length 3; 2 is required".
        with pytest.raises(GpuhopError, match=r"^env: takes a dict of variable names to val"):
            client.submit(["hello.py"], workdir=root, env=["A=1"])
        # A value that is no str is named before the work dir is scanned and sent (it came
        # back from the agent after the upload).
        hashed: list[object] = []
        with pytest.raises(GpuhopError, match=r"^env: 'A': 1: an environment's names and val"):
            client.submit(["hello.py"], workdir=root, env={"A": 1}, on_hash=hashed.append)
        assert hashed == []


def test_a_command_that_is_none_or_holds_a_number_is_named(shared_agent, project):
    root = project(HELLO)
    with shared_agent.client() as client:
        with pytest.raises(GpuhopError, match=r"^the command is a str, a path or a list"):
            client.submit(None, workdir=root)  # type: ignore[arg-type]
        with pytest.raises(GpuhopError, match=r"arguments are str \(or paths\): 3 is not"):
            client.submit(["hello.py", "--n", 3], workdir=root)  # type: ignore[list-item]


def test_a_dataset_name_with_a_slash_is_named_before_the_push(shared_agent, tmp_path):
    # It was "no such route: POST /v1/datasets/a/b", once every file had been read.
    (tmp_path / "x.bin").write_bytes(b"x")
    with shared_agent.client() as client:
        for call in (
            lambda: client.data.push(tmp_path, "a/b"),
            lambda: client.data.versions("a/b"),
            lambda: client.data.remove(""),
        ):
            with pytest.raises(GpuhopError, match="a dataset name is 1-64 characters"):
                call()


def test_one_state_or_field_given_alone_is_one(shared_agent, project):
    root = project({"hello.py": "print('hello')\n", "bad.py": "raise SystemExit(1)\n"})
    with shared_agent.client() as client:
        ok = client.submit(["hello.py"], workdir=root)
        bad = client.submit(["bad.py"], workdir=root)
        assert (ok.wait(60).state, bad.wait(60).state) == (JobState.succeeded, JobState.failed)
        # A str was read as its letters: "failed" as the states f, a, i, ... (a ValueError).
        failed = client.jobs("failed", limit=10_000)
        assert bad.id in {j.id for j in failed} and ok.id not in {j.id for j in failed}
        assert {j.state for j in failed} == {JobState.failed}
        assert bad.id in {j.id for j in client.jobs(JobState.failed, limit=10_000)}
        assert all(set(j) == {"id"} for j in client.jobs_json(fields="id"))
        with pytest.raises(GpuhopError, match=r"^no job state 'done'; the states are queued, "):
            client.jobs(["succeeded", "done"])


def test_an_empty_name_is_a_gpuhop_error_not_a_silent_nothing(shared_agent):
    with shared_agent.client() as client:
        # The agent redirects a path ending in '/' (DELETE /v1/secrets/): the SDK took the
        # empty answer for a removal done, or failed reading it (a JSONDecodeError).
        with pytest.raises(GpuhopError, match=r"^no such route: DELETE /v1/secrets/ \(is a"):
            client.remove_secret("")
        with pytest.raises(GpuhopError, match=r"^no such route: PUT /v1/secrets/ "):
            client.set_secret("", "a value")
        with pytest.raises(GpuhopError, match=r"^'': a dataset name is 1-64 characters"):
            client.data.versions("")
