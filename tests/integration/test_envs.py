"""Python environments for jobs' requirements on a real agent, installed by real pip from a
wheel built here (no package index is reached: PIP_NO_INDEX and PIP_FIND_LINKS go through
the job's environment)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import wait_until

SCRIPT = """
import sys, tinypkg, pydantic
print("tinypkg", tinypkg.VALUE)
print("host package from", pydantic.__file__)
print("prefix", sys.prefix)
"""


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding tinypkg-1.0, a one-module package built with pip wheel."""
    root = tmp_path_factory.mktemp("wheels")
    src = root / "src"
    (src / "tinypkg").mkdir(parents=True)
    (src / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tinypkg', version='1.0', packages=['tinypkg'])\n"
    )
    (src / "tinypkg" / "__init__.py").write_text("VALUE = 42\n")
    out = root / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
    )
    return out


def pip_env(wheels: Path) -> dict[str, str]:
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}


def run(client, root: Path, wheels: Path, **kwargs):
    job = client.submit(["job.py"], workdir=root, env=pip_env(wheels), **kwargs)
    info = job.wait(timeout=180)
    return job, info, b"".join(job.logs()).decode()


def test_an_environment_is_built_once_and_reused(shared_agent, project, wheels, tmp_path):
    root = project({"job.py": SCRIPT, "requirements.txt": "tinypkg==1.0\n"})
    with shared_agent.client() as client:
        _, info, out = run(client, root, wheels)
        assert info.state == JobState.succeeded, out
        assert "building environment" in out and "tinypkg 42" in out
        assert "Successfully installed tinypkg-1.0" in out
        # The host's packages (here pydantic, on a GPU host TensorFlow) come from the host.
        host_site = Path(pydantic_file()).parent.parent
        assert f"host package from {host_site}" in out
        assert info.python_env is not None
        assert f"prefix {shared_agent.home / 'envs' / info.python_env}" in out

        other = tmp_path / "other"
        other.mkdir()
        (other / "job.py").write_text(SCRIPT)
        (other / "reqs.txt").write_text("tinypkg==1.0\n")
        _, info2, out2 = run(client, other, wheels, requirements=other / "reqs.txt")
        assert info2.state == JobState.succeeded, out2
        assert "building" not in out2 and "reused, not built again" in out2
        assert info2.python_env == info.python_env
        envs = {e.id: e for e in client.envs.list()}
        assert envs[info.python_env].ready and "tinypkg==1.0" in envs[info.python_env].requirements

        _, info3, out3 = run(client, root, wheels, requirements=False)
        assert info3.state == JobState.failed and "No module named 'tinypkg'" in out3


def pydantic_file() -> str:
    import pydantic

    return pydantic.__file__


def test_jobs_asking_at_once_build_it_once(shared_agent, project, wheels):
    root = project({"job.py": SCRIPT, "requirements.txt": "# at once\ntinypkg==1.0\n"})
    with shared_agent.client() as client:
        jobs = [client.submit(["job.py"], workdir=root, env=pip_env(wheels)) for _ in range(2)]
        logs = []
        for job in jobs:
            assert job.wait(timeout=180).state == JobState.succeeded
            logs.append(b"".join(job.logs()).decode())
    assert sum("gpuhop: building environment" in log for log in logs) == 1, logs
    assert sum("reused, not built again" in log for log in logs) == 1, logs


def test_a_bad_requirements_file_fails_the_job_with_pips_error(shared_agent, project, wheels):
    root = project({"job.py": SCRIPT, "requirements.txt": "nosuchpkg==9.9\n"})
    with shared_agent.client() as client:
        _, info, out = run(client, root, wheels)
    assert info.state == JobState.failed
    assert info.reason is not None
    assert "could not build the job's Python environment: pip install exited with 1" in info.reason
    assert "No matching distribution found for nosuchpkg==9.9" in out
    # What to do, for a requirements.txt that was sent unasked.
    assert (
        "gpuhop: pip could not install the job's requirements (its error is above): fix them"
        " (the work dir's requirements.txt, or the file -r names), or run without them"
        " (--no-requirements, or no -r)\n"
    ) in out
    assert "tinypkg" not in out.split("could not build")[-1]  # the script never ran
    with shared_agent.client() as client:
        assert info.python_env not in {e.id for e in client.envs.list()}


def test_python_picks_the_interpreter_and_is_checked(shared_agent, project):
    root = project({"job.py": "import sys\nprint('python', sys.executable)\n"})
    with shared_agent.client() as client:
        for bad, words in (("/no/such/python", "no executable file"), ("python3", "absolute")):
            with pytest.raises(GpuhopError, match=words) as e:
                client.submit(["job.py"], workdir=root, python=bad)
            assert e.value.status == 400
        job = client.submit(["job.py"], workdir=root, python=sys.executable)
        assert job.wait(timeout=60).state == JobState.succeeded
        assert f"python {sys.executable}" in b"".join(job.logs()).decode()
        assert job.info.python == sys.executable


def test_env_rm_keeps_what_jobs_use(make_agent, project, wheels, tmp_path):
    agent = make_agent()
    # In the job's artifacts dir: the host's /tmp is not the job's.
    waiting = (
        "import os, time\ngate = os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'go')\n"
        "while not os.path.exists(gate):\n    time.sleep(0.02)\n"
    )
    used = project({"job.py": waiting, "requirements.txt": "tinypkg==1.0\n"})
    idle = tmp_path / "idle"
    idle.mkdir()
    (idle / "job.py").write_text("print('done')\n")
    (idle / "requirements.txt").write_text("# idle\ntinypkg==1.0\n")
    with agent.client() as client:
        _, done, _ = run(client, idle, wheels)
        busy = client.submit(["job.py"], workdir=used, env=pip_env(wheels))
        # The job runs once its environment is built; it then waits for the gate.
        wait_until(lambda: "gpuhop: built environment" in b"".join(busy.logs()).decode(), 120)
        busy_env = busy.refresh().python_env
        assert busy_env is not None and done.python_env is not None
        with pytest.raises(GpuhopError, match="in use by job") as e:
            client.envs.remove(busy_env)
        assert e.value.status == 409
        assert client.envs.remove(unused=True, older_than=86400) == []
        assert client.envs.remove(unused=True) == [done.python_env]
        assert {e.id for e in client.envs.list()} == {busy_env}
        (agent.paths.jobs / busy.id / "artifacts" / "go").touch()
        assert busy.wait(timeout=60).state == JobState.succeeded
        assert client.envs.remove(busy_env[:10]) == [busy_env]
        assert client.envs.list() == []
    assert not any((agent.home / "envs").glob("*/"))


def test_the_jobs_pip_variables_are_part_of_the_environments_id(
    shared_agent, project, wheels, tmp_path
):
    root = project({"job.py": SCRIPT, "requirements.txt": "# pip variables\ntinypkg==1.0\n"})
    with shared_agent.client() as client:
        _, built, out = run(client, root, wheels)
        assert built.state == JobState.succeeded, out
        # Another variable is no part of the build: the same environment.
        job = client.submit(["job.py"], workdir=root, env={**pip_env(wheels), "SEED": "7"})
        assert job.wait(timeout=180).state == JobState.succeeded
        assert job.info.python_env == built.python_env
        # Other wheels to install from are another build: here none, so it fails.
        empty = tmp_path / "no-wheels"
        empty.mkdir()
        other = client.submit(["job.py"], workdir=root, env=pip_env(empty))
        info = other.wait(timeout=180)
        out = b"".join(other.logs()).decode()
    assert info.python_env != built.python_env
    assert info.state == JobState.failed, out
    assert "building environment" in out and "No matching distribution found for tinypkg" in out


def test_a_single_user_agent_takes_any_requirements_line(shared_agent, project, wheels, tmp_path):
    # The user's own host: -r, -f and the rest are pip's to read, as they were.
    more = tmp_path / "more.txt"
    more.write_text("tinypkg==1.0\n")
    root = project({"job.py": SCRIPT, "requirements.txt": f"-f {wheels}\n-r {more}\n"})
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root, env={"PIP_NO_INDEX": "1"})
        info = job.wait(timeout=180)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.succeeded, out
    assert "tinypkg 42" in out


# An interpreter for `--python` whose venv creation never ends (it says it has started): a
# job cancelled while its environment is built.
STUCK_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    : > "{started}"
    exec sleep 600
fi
exec "{python}" "$@"
"""


def test_a_job_cancelled_while_its_environment_is_built_says_so(shared_agent, project, tmp_path):
    """A cancel kills the build's program with the job: the job's reason and log say the job
    was stopped, not the killed program's error ("could not create a venv ... SIGTERM")."""
    started = tmp_path / "started"
    python = tmp_path / "python"
    python.write_text(STUCK_PYTHON.format(started=started, python=sys.executable))
    python.chmod(0o755)
    root = project({"job.py": "print('never')\n", "requirements.txt": "tinypkg==1.0\n"})
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root, python=str(python))
        wait_until(started.exists, timeout=60)
        job.cancel(grace=5)
        info = job.wait(timeout=60)
        out = b"".join(job.logs()).decode()
    assert info.state == JobState.cancelled, (info.state, info.reason)
    assert "stopped by SIGTERM before the job started" in out, out
    assert "could not create a venv" not in out + (info.reason or ""), (out, info.reason)
    assert "never" not in out


# `--python` may name any program on the host. One that prints without end when asked its
# version, and one that never answers (it says it has started, with its pid).
FLOODING_PYTHON = "#!/bin/sh\nexec yes gpuhop\n"
SILENT_PYTHON = (
    '#!/bin/sh\necho $$ > "{started}.tmp" && mv "{started}.tmp" "{started}"\nexec sleep 600\n'
)


@pytest.mark.agent_log(r"asking \S+/flooding for its packages failed: it printed more than 64 KiB")
def test_an_interpreter_that_floods_or_never_answers_holds_up_no_one(make_agent, project, tmp_path):
    """Asked its version, a flood is cut off and refused (never read into the agent's
    memory), and a program that never answers holds up only its own submission: a gc and
    another job's submission go on meanwhile, and its submission ends, refused, when it is
    killed (or after envs.VERSION_SECONDS)."""
    agent = make_agent()
    flooding, silent, started = tmp_path / "flooding", tmp_path / "silent", tmp_path / "pid"
    flooding.write_text(FLOODING_PYTHON)
    silent.write_text(SILENT_PYTHON.format(started=started))
    for program in (flooding, silent):
        program.chmod(0o755)
    root = project({"job.py": "print('ran')\n", "requirements.txt": "tinypkg==1.0\n"})
    with agent.client() as client, pytest.raises(GpuhopError) as flood:
        client.submit(["job.py"], workdir=root, python=str(flooding))
    assert flood.value.status == 400
    assert "is not a working Python: asked its version, it printed more than 64 KiB" in str(
        flood.value
    )
    # A multi-worker job's interpreter is asked which Keras it has, bounded the same way.
    with agent.client() as client, pytest.raises(GpuhopError) as keras:
        client.submit(["job.py"], workdir=root, python=str(flooding), workers=2, requirements=False)
    assert keras.value.status == 400 and "tf-keras is not installed" in str(keras.value)

    refused: list[GpuhopError] = []

    def submit_silent() -> None:
        with agent.client() as client, pytest.raises(GpuhopError) as e:
            client.submit(["job.py"], workdir=root, python=str(silent))
        refused.append(e.value)

    waiting = threading.Thread(target=submit_silent)
    waiting.start()
    try:
        wait_until(started.exists, timeout=60)
        with agent.client() as client:
            # gc takes the lock that submissions share (gpuhop.agent.storage.uses): it is
            # free, and a submission behind it goes through, while the silent one waits.
            client.gc()
            plain = client.submit(["job.py"], workdir=root, requirements=False)
            assert waiting.is_alive()
            assert plain.wait(60).state == JobState.succeeded
    finally:
        if started.exists():
            with contextlib.suppress(ProcessLookupError):  # gone after VERSION_SECONDS
                os.kill(int(started.read_text()), signal.SIGKILL)
        waiting.join()
    assert refused and refused[0].status == 400
    assert "asked its version, it was killed by signal 9 (SIGKILL)" in str(refused[0])
