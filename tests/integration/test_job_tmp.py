"""Inside a job: its own /tmp (private, kept with its files), and its own interpreter first on
PATH. A real agent runs the jobs in their namespaces; its state dir is under /tmp (as a
user's may be), which the job's private /tmp must not hide from it."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.client import GpuhopError
from tests.conftest import Agent, wait_until


@pytest.fixture(scope="module")
def agent_in_tmp() -> Iterator[Agent]:
    root = Path(tempfile.mkdtemp(prefix="gpuhop-test-", dir="/tmp"))
    agent = Agent(root / "home", root / "cache", None).start()
    try:
        yield agent
    finally:
        agent.shutdown()
        shutil.rmtree(root, ignore_errors=True)


# Writes its name into /tmp/<dir>/who, waits for the test's go-ahead (a file the test puts
# in the job's artifacts dir), then says whose name it finds there.
HOLDER = """
import os, sys, tempfile, time
name, ckpt = sys.argv[1], os.path.join("/tmp", sys.argv[2])
print("found before:", os.listdir(ckpt) if os.path.exists(ckpt) else None, flush=True)
os.makedirs(ckpt)
with open(os.path.join(ckpt, "who"), "w") as f:
    f.write(name)
print("TMPDIR:", os.environ["TMPDIR"], tempfile.gettempdir(), flush=True)
print("ready", flush=True)
go = os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "go")
while sys.argv[3:] == ["--wait"] and not os.path.exists(go):
    time.sleep(0.05)
with open(os.path.join(ckpt, "who")) as f:
    print("found after:", f.read(), flush=True)
"""


def test_two_jobs_writing_the_same_tmp_path_see_only_their_own(agent_in_tmp, project, tmp_path):
    ckpt = f"ckpt-{uuid.uuid4().hex[:8]}"  # unique on this machine's shared /tmp
    root = project({"hold.py": HOLDER})
    with agent_in_tmp.client() as client:
        first = client.submit(["hold.py", "first", ckpt, "--wait"], workdir=root)
        try:
            wait_until(lambda: b"ready" in b"".join(first.logs()), timeout=60)
            second = client.submit(["hold.py", "second", ckpt], workdir=root)
            assert second.wait(timeout=60).state.value == "succeeded"
            (agent_in_tmp.paths.jobs / first.id / "artifacts" / "go").touch()
            assert first.wait(timeout=60).state.value == "succeeded"
        finally:
            with contextlib.suppress(GpuhopError):  # already ended, as it should have
                first.cancel(grace=0)
        logs = [b"".join(job.logs()).decode() for job in (first, second)]

    for log, name in zip(logs, ("first", "second"), strict=True):
        assert "found before: None" in log  # neither saw the other's /tmp/ckpt
        assert f"found after: {name}" in log
        assert "TMPDIR: /tmp /tmp" in log
    # Nothing of theirs is left in the host's /tmp; each one's /tmp is kept with its files,
    # and a pull of it brings back what the job wrote there: not the dirs on the way to the
    # agent's state dir (under /tmp here), which its sandbox bound back inside it.
    assert not (Path("/tmp") / ckpt).exists()
    with agent_in_tmp.client() as client:
        for job, name in ((first, "first"), (second, "second")):
            into = tmp_path / name
            client.job(job.id).pull(None, tmp=into)
            assert [p.relative_to(into) for p in into.rglob("*") if p.is_file()] == [
                Path(ckpt, "who")
            ]
            assert (into / ckpt / "who").read_text() == name


def test_a_tmpdir_the_user_sets_is_the_jobs(agent_in_tmp, tmp_path):
    run = agent_in_tmp.cli(
        "run", "-e", "TMPDIR=/var/tmp/mine", "sh", "-c", "echo TMPDIR=$TMPDIR", cwd=tmp_path
    )
    assert (run.returncode, run.stdout) == (0, "TMPDIR=/var/tmp/mine\n"), run.stderr


def test_serve_says_whether_the_jobs_tmp_held_a_savedmodel(agent_in_tmp, project):
    root = project({"nothing.py": "open('/tmp/notes.txt', 'w').write('no model here')\n"})
    with agent_in_tmp.client() as client:
        job = client.submit(["nothing.py"], workdir=root)
        assert job.wait(timeout=60).state.value == "succeeded"
        with pytest.raises(GpuhopError) as none:
            client.serve(job, name="none", wait=False)
        assert "in its artifacts or work dir, nor did its /tmp hold one" in none.value.message
        shutil.rmtree(agent_in_tmp.paths.jobs / job.id / "tmp")  # as an older agent did
        with pytest.raises(GpuhopError) as gone:
            client.serve(job, name="none", wait=False)
        assert "its /tmp, where it may have saved one, was not kept" in gone.value.message


def test_python_in_a_jobs_shell_is_the_jobs_interpreter(agent_in_tmp, tmp_path):
    run = agent_in_tmp.cli(
        "run", "sh", "-c", "python -c 'import sys; print(sys.executable)'; pip --version",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    # The agent's interpreter (the one the tests run with), and its pip.
    lines = run.stdout.splitlines()
    assert lines[0] == sys.executable
    assert str(Path(sys.executable).parent.parent) in lines[1]


def test_serve_names_savedmodels_in_the_jobs_tmp_as_the_job_saw_them(agent_in_tmp, project):
    root = project(
        {
            "two.py": "import os\n"
            "for d in ('/tmp/export/a', '/tmp/export/b'):\n"
            "    os.makedirs(d + '/gpuhop/serving')\n"
            "    open(d + '/saved_model.pb', 'wb').write(b'pb ' + d.encode())\n"
            "    open(d + '/gpuhop/__init__.py', 'w').close()\n"
            "    open(d + '/gpuhop/serving/__init__.py', 'w').close()\n"
            # The server's program (first on its path: PYTHONPATH=model) says what it got.
            "    open(d + '/gpuhop/serving/__main__.py', 'w').write(\n"
            "        'print(open(\"model/saved_model.pb\").read())')\n"
        }
    )
    with agent_in_tmp.client() as client:
        job = client.submit(["two.py"], workdir=root)
        assert job.wait(timeout=60).state.value == "succeeded"
        with pytest.raises(GpuhopError) as two:
            client.serve(job, name="m", wait=False)
        assert "2 SavedModels (/tmp/export/a (its /tmp), /tmp/export/b (its /tmp))" in (
            two.value.message
        )
        model = client.serve(
            f"{job.id}:/tmp/export/b", name="m", env={"PYTHONPATH": "model"}, wait=False
        )
        try:
            said = "found a SavedModel the job saved in its /tmp"
            assert model.info.source == f"job {job.id}:/tmp/export/b ({said})"
            assert model.job.wait(timeout=60).state.value == "succeeded"
            assert b"".join(model.job.logs()) == b"pb /tmp/export/b\n"
        finally:
            if not model.job.refresh().state.finished:
                model.job.cancel(grace=1)
                model.job.wait(timeout=30)


def test_a_jobs_pwd_is_its_work_dir_not_the_dir_the_agent_was_started_in(
    monkeypatch, tmp_path, project
):
    # The agent inherits the environment of the first command that started it, in a
    # project dir of the user's: a job's Python reading $PWD must not get that dir.
    elsewhere = tmp_path / "other-project"
    elsewhere.mkdir()
    monkeypatch.setenv("PWD", str(elsewhere))
    monkeypatch.setenv("OLDPWD", str(tmp_path))
    agent = Agent(tmp_path / "home", tmp_path / "cache", None).start()
    try:
        root = project({"where.py": "import os\nprint(os.getcwd(), os.environ.get('PWD'))\n"
                        "print('OLDPWD' in os.environ)\n"})  # fmt: skip
        with agent.client() as client:
            job = client.submit(["where.py"], workdir=root)
            assert job.wait(timeout=60).state.value == "succeeded"
            cwd, pwd, oldpwd = b"".join(job.logs()).decode().split()
    finally:
        agent.shutdown()
    assert pwd == cwd == str(agent.paths.jobs / job.id / "work")
    assert oldpwd == "False"
