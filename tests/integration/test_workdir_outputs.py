"""What a job writes in its work dir comes back: a real agent, real jobs, the SDK and the CLI.

The job writes where tutorials write (`./my_model.keras`, `training_1/cp.ckpt...`), changes
one synced file, rewrites another with the same bytes, imports a local module (Python's
`__pycache__`), and leaves a link out and a name that is not UTF-8: only the new and changed
files are listed, and a pull puts them where the script would have left them locally,
never over a local edit.
"""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import wait_until

JOB = """
import os, helper
open("my_model.keras", "wb").write(b"k" * 3000)
os.makedirs("training_1", exist_ok=True)
open("training_1/cp.ckpt.index", "wb").write(b"i" * 10)
open("config.txt", "w").write("lr=0.2\\n")        # same size as synced, other content
open("same.txt", "w").write("unchanged\\n")       # rewritten with the synced bytes
open("grown.txt", "a").write("more\\n")
os.symlink("/etc/passwd", "leak")
open(os.fsdecode(b"bad-\\xff"), "w").write("x")
open(os.path.join(os.environ["GPUHOP_ARTIFACTS_DIR"], "report.txt"), "w").write("ok")
"""


def raw(agent) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(agent.paths.socket)), base_url="http://gpuhop"
    )


def _project(project):
    return project(
        {
            "job.py": JOB,
            "helper.py": "X = 1\n",
            "config.txt": "lr=0.1\n",
            "same.txt": "unchanged\n",
            "grown.txt": "a\n",
        }
    )


def test_new_and_changed_files_are_listed_and_pulled_home(shared_agent, project, tmp_path):
    root = _project(project)
    with shared_agent.client() as client:
        job = client.submit(["job.py"], workdir=root)
        assert job.wait(60).state == JobState.succeeded, b"".join(job.logs()).decode()
        listed = {e.path: e for e in job.workdir_outputs()}
        assert sorted(listed) == [
            "config.txt",
            "grown.txt",
            "my_model.keras",
            "training_1/cp.ckpt.index",
        ]
        assert listed["my_model.keras"].base is None and listed["my_model.keras"].size == 3000
        assert listed["config.txt"].base is not None

        (root / "grown.txt").write_text("edited here\n")  # a local edit since the sync
        plan = job.plan_pull(tmp_path / "arts", workdir=root)
        assert plan.kept == [root / "grown.txt"]
        files = job.pull(tmp_path / "arts", workdir=root)
        assert (root / "my_model.keras").read_bytes() == b"k" * 3000
        assert (root / "training_1" / "cp.ckpt.index").read_bytes() == b"i" * 10
        assert (root / "config.txt").read_text() == "lr=0.2\n"  # still as synced: replaced
        assert (root / "grown.txt").read_text() == "edited here\n"  # the local edit is kept
        assert (tmp_path / "arts" / "report.txt").read_text() == "ok"
        assert len(files) == 4
        assert not (root / "leak").exists() and not (root / "same.txt.gpuhop-part").exists()

        again = job.plan_pull(tmp_path / "arts", workdir=root)
        assert again.todo == []  # everything is here already

        job.pull(None, workdir=root, overwrite=True)
        assert (root / "grown.txt").read_text() == "a\nmore\n"

        with raw(shared_agent) as http:
            leak = http.get(f"/v1/jobs/{job.id}/workdir/leak")
            up = http.get(f"/v1/jobs/{job.id}/workdir/..%2Fdeps.json")
            missing = http.get(f"/v1/jobs/{job.id}/workdir/nothing-here")
    assert leak.status_code == 400 and "leads out" in leak.json()["message"]
    assert up.status_code in (400, 404)
    assert missing.status_code == 404 and "nothing-here" in missing.json()["message"]


def said_lines(stderr: str, word: str) -> list[str]:
    """gpuhop's own lines of `stderr` that hold `word`, prefix dropped and rewrapping undone."""
    lines = " ".join(stderr.split()).split("gpuhop: ")
    return [line.strip() for line in lines if word in line]


def test_run_pull_puts_everything_in_its_folder_says_so_once_and_never_syncs_it(
    shared_agent, project
):
    root = _project(project)
    (root / "look.py").write_text("import os\nprint('sees out:', os.path.exists('out'))\n")
    run = shared_agent.cli("run", "--no-progress", "--pull", "out", "job.py", cwd=root)
    assert run.returncode == 0, run.stderr
    # One summary, naming where each part went; nothing said twice, nothing contradicted.
    assert said_lines(run.stderr, "pull") == [
        "pulled 1 artifact file(s), 2 B, into out; and 4 file(s) the job wrote in its work"
        " dir, 3.0 KiB, into out/workdir"
    ]
    assert (root / "out" / "report.txt").read_text() == "ok"
    assert (root / "out" / "workdir" / "my_model.keras").stat().st_size == 3000
    assert (root / "out" / "workdir" / "training_1" / "cp.ckpt.index").is_file()
    assert not (root / "my_model.keras").exists()  # nothing landed beside the sources
    assert (root / "grown.txt").read_text() == "a\n"
    ignore = (root / "out" / ".gpuhopignore").read_text().splitlines()
    assert ignore[-1] == "*" and any(line.endswith(" job " + _job_id(run)) for line in ignore)

    # The next run from the same tree does not send the pulled folder back up.
    again = shared_agent.cli("run", "--no-progress", "look.py", cwd=root)
    assert again.returncode == 0, again.stderr
    assert "sees out: False" in again.stdout
    assert "synced 6 files" in again.stderr  # the five sources and look.py
    assert "training outputs" not in again.stderr


def _job_id(run) -> str:
    return re.search(r"job (\w+) succeeded", run.stderr).group(1)


def test_pull_defaults_and_only_pick_the_parts_and_their_places(shared_agent, project, tmp_path):
    root = _project(project)
    run = shared_agent.cli("run", "--no-progress", "job.py", cwd=root)
    assert run.returncode == 0, run.stderr
    job_id = _job_id(run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    only = shared_agent.cli("pull", job_id, "--only", "workdir", cwd=elsewhere)
    assert only.returncode == 0, only.stderr
    # Without -o, the work dir's files come here, where the script would have left them.
    assert sorted(os.listdir(elsewhere)) == [
        "config.txt",
        "grown.txt",
        "my_model.keras",
        "training_1",
    ]
    assert said_lines(only.stderr, "pull") == [
        "pulled 4 file(s) the job wrote in its work dir, 3.0 KiB, into ."
    ]
    arts = shared_agent.cli("pull", job_id, "--only", "artifacts", "-o", "a", cwd=elsewhere)
    assert arts.returncode == 0, arts.stderr
    assert (elsewhere / "a" / "report.txt").read_text() == "ok"
    assert said_lines(arts.stderr, "pull") == ["pulled 1 artifact file(s), 2 B, into a"]
    # Again, unchanged: said to be up to date, and not fetched (the file is the same one).
    before = (elsewhere / "a" / "report.txt").stat()
    again = shared_agent.cli("pull", job_id, "--only", "artifacts", "-o", "a", cwd=elsewhere)
    assert said_lines(again.stderr, "up to date") == ["already up to date: 1 artifact file(s) in a"]
    after = (elsewhere / "a" / "report.txt").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    both = shared_agent.cli("pull", job_id, "-o", "b", "-C", "c", cwd=elsewhere)
    assert both.returncode == 0, both.stderr
    assert (elsewhere / "b" / "report.txt").is_file() and not (elsewhere / "b" / "workdir").exists()
    assert (elsewhere / "c" / "my_model.keras").is_file()
    assert not (elsewhere / "c" / ".gpuhopignore").exists()  # -C DIR is the user's own tree


def test_a_job_that_wrote_nothing_says_so_in_one_line(shared_agent, project, tmp_path):
    root = project({"quiet.py": "print('nothing written')\n"})
    run = shared_agent.cli(
        "run", "--no-progress", "--pull", str(tmp_path / "out"), "quiet.py", cwd=root
    )
    assert run.returncode == 0, run.stderr
    assert said_lines(run.stderr, "pull") == [
        f"job {_job_id(run)} left nothing to pull: nothing in its $GPUHOP_ARTIFACTS_DIR, no"
        " new or changed file in its work dir and nothing kept from its /tmp"
    ]
    assert not (tmp_path / "out").exists()


def test_a_file_of_one_part_where_the_other_goes_is_refused_before_anything_lands(
    shared_agent, project, tmp_path
):
    job = (
        "import os\n"
        "d = os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'workdir')\n"
        "os.makedirs(d)\n"
        "open(os.path.join(d, 'model.keras'), 'w').write('artifact')\n"
        "open('model.keras', 'w').write('work dir')\n"
    )
    run = shared_agent.cli("run", "--no-progress", "job.py", cwd=project({"job.py": job}))
    assert run.returncode == 0, run.stderr
    out = tmp_path / "out"
    pull = shared_agent.cli("pull", _job_id(run), "-o", str(out), cwd=tmp_path)
    assert pull.returncode == 2
    landing = out / "workdir" / "model.keras"
    assert said_lines(pull.stderr, "error") == [
        f"error: pulling the outputs of job {_job_id(run)}: the job's artifacts and its"
        f" workdir each have a file that would land at {landing}; pull them into separate"
        " folders (--only, -C)"
    ]
    assert not out.exists()


def test_a_named_jobs_artifacts_land_under_its_name_and_a_rerun_beside_it(
    shared_agent, project, tmp_path
):
    root = project({"train.py": ARTIFACT_OF_THE_RUN})
    first = shared_agent.cli("run", "--no-progress", "--name", "digits", "train.py", cwd=root)
    second = shared_agent.cli("run", "--no-progress", "--name", "digits", "train.py", cwd=root)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    one, two = _job_id(first), _job_id(second)
    here = tmp_path / "here"
    here.mkdir()
    base = here / "gpuhop-artifacts"

    pulls = [shared_agent.cli("pull", ref, cwd=here) for ref in (one, "digits", one)]
    assert [p.returncode for p in pulls] == [0, 0, 0], [p.stderr for p in pulls]
    assert (base / "digits" / "run.txt").read_text() == one
    # The name now means the newest job of that name: its pull goes beside, named by id too.
    assert (base / f"digits-{two}" / "run.txt").read_text() == two
    assert said_lines(pulls[1].stderr, "pull") == [
        f"pulled 1 artifact file(s), 8 B, into gpuhop-artifacts/digits-{two}"
    ]
    assert sorted(os.listdir(base)) == ["digits", f"digits-{two}"]  # the same job, same place
    unnamed = shared_agent.cli("run", "--no-progress", "train.py", cwd=root)
    three = _job_id(unnamed)
    assert shared_agent.cli("pull", three, cwd=here).returncode == 0
    assert (base / three / "run.txt").read_text() == three


ARTIFACT_OF_THE_RUN = (
    "import os\n"
    "open(os.path.join(os.environ['GPUHOP_ARTIFACTS_DIR'], 'run.txt'), 'w')"
    ".write(os.environ['GPUHOP_JOB_ID'])\n"
)


def test_run_warns_once_about_training_outputs_in_the_synced_tree(shared_agent, project):
    root = project(
        {
            "job.py": "print('hi')\n",
            "my_model.keras": "k" * (1 << 20),
            "export/v1/saved_model.pb": "pb",
            "export/v1/variables/variables.index": "ix",
            "logs/events.out.tfevents.1.host": "e",
            "notes.txt": "small and not an output",
        }
    )
    # Said with --detach too: it is the sync's, not the run's.
    first = shared_agent.cli("run", "--detach", "job.py", cwd=root)
    assert first.returncode == 0, first.stderr
    assert len(first.stdout.strip()) == 8  # the job's id, alone on stdout
    said = " ".join(first.stderr.split())
    assert "holds 1.0 MiB of what look like training outputs" in said
    assert "export/v1/, logs/events.out.tfevents.1.host, my_model.keras" in said
    lines = first.stderr.split(".gpuhopignore:")[1].split("gpuhop:")[0].split()
    assert lines == ["*.keras", "/export/v1/", "events.out.tfevents.*"]
    again = shared_agent.cli("run", "--no-progress", "job.py", cwd=root)
    assert again.returncode == 0 and "training outputs" not in again.stderr  # said once

    (root / ".gpuhopignore").write_text("\n".join(lines) + "\n")
    skipped = shared_agent.cli("run", "--no-progress", "job.py", cwd=root)
    assert (
        "training outputs" not in skipped.stderr and "synced 3 files" in skipped.stderr
    )  # job.py, notes.txt, .gpuhopignore
    # A sync that sends a MiB or more says how fast it went: over its whole time.
    (root / "data.bin").write_bytes(os.urandom(3 << 19))
    sent = shared_agent.cli("run", "--no-progress", "job.py", cwd=root)
    rate = r"synced 4 files \(1 new, 1\.5 MiB at [0-9.]+ [KMG]iB/s\) in ([0-9.]+)s;"
    assert re.search(rate, sent.stderr), sent.stderr


# Saved beside a "SavedModel" by the job that made it, and put first on the model server's
# path (PYTHONPATH=model), this `gpuhop.serving` runs in the server job in place of gpuhop's
# own: a hostile server, which tries to change the model it is given.
HOSTILE_SERVER = """
import json, os

def attempt(what):
    try:
        what()
    except OSError as e:
        return e.strerror
    return "written"

print(json.dumps({
    "model": open("model/saved_model.pb", "rb").read().decode(),
    "overwrite": attempt(lambda: open("model/saved_model.pb", "wb").write(b"changed")),
    "create": attempt(lambda: open("model/planted.py", "w").write("x")),
    "remove": attempt(lambda: os.remove("model/saved_model.pb")),
    "read_only": bool(os.statvfs("model").f_flag & os.ST_RDONLY),
}), flush=True)
"""


def test_serve_finds_a_savedmodel_the_job_wrote_in_its_work_dir(shared_agent, project):
    root = project(
        {
            "job.py": "import os, sys\n"
            "for d in ('export/a', 'export/b'):\n"
            "    os.makedirs(d + '/gpuhop/serving')\n"
            "    open(d + '/saved_model.pb', 'wb').write(b'pb ' + d.encode())\n"
            "    open(d + '/gpuhop/__init__.py', 'w').close()\n"
            "    open(d + '/gpuhop/serving/__init__.py', 'w').close()\n"
            "    open(d + '/gpuhop/serving/__main__.py', 'w').write(open(sys.argv[1]).read())\n",
            "hostile.py": HOSTILE_SERVER,
            "synced/saved_model.pb": "sent with the job: not one the job made",
        }
    )
    with shared_agent.client() as client:
        job = client.submit(["job.py", "hostile.py"], workdir=root)
        assert job.wait(60).state == JobState.succeeded
        with pytest.raises(GpuhopError) as two:
            client.serve(job, name="m", wait=False)
        assert "2 SavedModels (export/a (work dir), export/b (work dir))" in two.value.message
        exported = shared_agent.paths.jobs / job.id / "work" / "export" / "a"
        before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in exported.rglob("*.p[yb]")}
        model = client.serve(
            f"{job.id}:export/a", name="m", env={"PYTHONPATH": "model"}, wait=False
        )
        try:
            assert model.info.source == f"job {job.id}:export/a (work dir)"
            ended = model.job.wait(60)
            log = b"".join(model.job.logs()).decode()
            assert ended.state == JobState.succeeded, log
        finally:
            if not model.job.refresh().state.finished:
                model.job.cancel(grace=1)
                model.job.wait(timeout=30)
    # The server saw the job's model at `model` in its work dir, and could change none of it.
    seen = json.loads(next(line for line in log.splitlines() if line.startswith("{")))
    assert seen == {
        "model": "pb export/a",
        "overwrite": "Read-only file system",
        "create": "Read-only file system",
        "remove": "Read-only file system",
        "read_only": True,
    }
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in exported.rglob("*.p[yb]")} == before
    assert not (exported / "planted.py").exists()
    # Mounted, not copied nor linked: in the server's own work dir there is only the mount
    # point, empty.
    assert list((shared_agent.paths.jobs / model.info.job / "work" / "model").iterdir()) == []


def test_a_running_jobs_work_dir_files_wait_until_it_has_ended(shared_agent, project, tmp_path):
    root = project(
        {
            "job.py": "import os, sys, time\n"
            "open('out.txt', 'w').write('x')\n"
            "while not os.path.exists(sys.argv[1]):\n"
            "    time.sleep(0.05)\n"
        }
    )
    release = tmp_path / "release"
    with shared_agent.client() as client, raw(shared_agent) as http:
        job = client.submit(["job.py", str(release)], workdir=root)
        try:
            wait_until(lambda: (shared_agent.paths.job_dir(job.id) / "work/out.txt").exists())
            plan = job.plan_pull(None, workdir=tmp_path / "here")
            early = http.get(f"/v1/jobs/{job.id}/workdir/out.txt")
            pulled = shared_agent.cli("pull", job.id, "-o", str(tmp_path / "out"))
        finally:
            release.touch()
        assert job.wait(60).state == JobState.succeeded
        later = job.plan_pull(None, workdir=tmp_path / "here")
    assert plan.todo == [] and "come back once it has ended" in (plan.workdir_note or "")
    assert early.status_code == 409 and "running" in early.json()["message"]
    # What was not looked at is not said to be empty: the work dir and /tmp, read at its end.
    assert said_lines(pulled.stderr, "left nothing") == [
        f"job {job.id} left nothing to pull: nothing in its $GPUHOP_ARTIFACTS_DIR"
    ]
    assert f"no work-dir files: job {job.id} is running" in pulled.stderr
    assert [e.path for _, e, _ in later.todo] == ["out.txt"]
