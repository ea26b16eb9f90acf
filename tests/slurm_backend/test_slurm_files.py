"""A Slurm job's files live in the agent's state dir, on the filesystem the compute nodes
share: the agent checks at start that a node sees them (and refuses to start where none
does), `doctor` says where they are, and `pull` brings back what a job wrote in its work dir.

The test cluster's node does not see `SlurmCluster.hidden`, a dir of this host (see
tests/slurm_backend/cluster.py): an agent whose state dir is there is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhop.backends.slurm import shared
from gpuhop.home import AgentError
from tests.conftest import wait_until
from tests.slurm_backend.conftest import skip_without_slurm
from tests.slurm_backend.test_slurm_backend import _info, _script, _submit

skip_without_slurm()

pytestmark = pytest.mark.timeout(180)

WRITE = """
import os
os.makedirs("out", exist_ok=True)
open("out/model.txt", "w").write("trained on " + os.environ["SLURMD_NODENAME"])
open("notes.txt", "w").write("changed by the job")
print("wrote", flush=True)
"""


def _agent_cmd(home: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
    env["GPUHOP_CONFIG_DIR"] = str(config)
    return subprocess.run(
        [sys.executable, "-m", "gpuhop", "agent", *args, "--home", str(home)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_agent_whose_state_dir_the_nodes_do_not_see_is_refused(slurm_cluster, tmp_path):
    home = slurm_cluster.hidden / "home"  # on this host only: the node sees an empty dir
    out = _agent_cmd(home, tmp_path / "config", "start", "--backend", "slurm")
    if out.returncode == 0:
        _agent_cmd(home, tmp_path / "config", "stop")
    said = " ".join((out.stdout + out.stderr).split())
    assert out.returncode != 0, said
    assert "the agent's state dir is not on a filesystem Slurm's compute nodes see" in said
    assert f"node {slurm_cluster.node} does not see the agent's file in {home / 'jobs'}" in said
    assert "No such file or directory" in said  # what the node said, in its words
    assert "--home on the cluster's shared filesystem" in said
    assert not list((home / "jobs").glob(".slurm-probe-*"))  # the probe's files are gone
    assert not (home / shared.CHECK_NAME).exists()
    # The probe's Slurm job ended; squeue lists it until Slurm has finished with it (its
    # COMPLETING state), which a busy machine makes seconds.
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)


def test_a_node_without_the_agents_python_is_refused(slurm_cluster, tmp_path):
    python = slurm_cluster.hidden / "python-here-only"  # the node sees an empty dir there
    python.symlink_to(sys.executable)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    with pytest.raises(AgentError) as refused:
        shared.probe(jobs, [], str(python))
    assert f"the agent's Python {python} does not exist on node {slurm_cluster.node}" in str(
        refused.value
    )
    assert shared.probe(jobs, [], sys.executable).ok  # the same check with a Python it has
    assert not list(jobs.iterdir())


@pytest.mark.tf  # doctor's own probe imports TensorFlow
def test_the_check_is_kept_and_doctor_says_where_the_files_are(slurm_agent, slurm_cluster):
    kept = json.loads((slurm_agent.home / shared.CHECK_NAME).read_text())
    jobs = slurm_agent.home / "jobs"
    assert kept["dir"] == str(jobs)
    assert kept["detail"] == f"jobs' files are under {jobs}, which node {slurm_cluster.node} sees"
    out = slurm_agent.cli("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert checks["shared filesystem"]["status"] == "passed"
    assert checks["shared filesystem"]["detail"] == kept["detail"]
    # TensorFlow is checked on a node, through Slurm, against the one GPU Slurm gave the
    # check there (the test node's are made up: TensorFlow sees none of it), and the advice
    # fits Slurm: no overlayfs, no driver or CUDA of the login host, no reinstall.
    node = slurm_cluster.node
    assert checks["TensorFlow"]["detail"].endswith(f" on node {node}"), checks["TensorFlow"]
    gpus = checks["TensorFlow sees the GPUs"]
    assert (gpus["status"], gpus["detail"]) == (
        "failed",
        f"TensorFlow sees 0 of the 1 GPU(s) Slurm gave it on node {node}",
    ), gpus
    assert "reinstall" not in gpus["fix"]
    assert checks["NVIDIA driver"]["status"] == "skipped"
    assert checks["CUDA version"]["status"] == "skipped"
    assert checks["job work dirs"]["status"] == "passed"
    assert not [c for c in checks.values() if "overlayfs" in (c["fix"] or "")]
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)  # the check's job goes


def test_a_restarted_agent_reuses_the_check(slurm_cluster, tmp_path):
    home, config = tmp_path / "home", tmp_path / "config"
    assert _agent_cmd(home, config, "start", "--backend", "slurm").returncode == 0
    try:
        first = json.loads((home / shared.CHECK_NAME).read_text())
    finally:
        assert _agent_cmd(home, config, "stop").returncode == 0
    assert _agent_cmd(home, config, "start").returncode == 0  # the backend is kept
    try:
        again = json.loads((home / shared.CHECK_NAME).read_text())
    finally:
        assert _agent_cmd(home, config, "stop").returncode == 0
    assert again["at"] == first["at"]  # no second probe


def test_pull_brings_back_the_files_a_slurm_job_wrote_in_its_work_dir(
    slurm_agent, slurm_cluster, tmp_path
):
    work = _script(tmp_path, "write.py", WRITE)
    (work / "notes.txt").write_text("as synced")
    job_id = _submit(slurm_agent, work, "write.py")
    info = wait_until(
        lambda: (
            (i := _info(slurm_agent, job_id))["state"] not in ("queued", "starting", "running")
            and i
        ),
        timeout=60,
    )
    assert info["state"] == "succeeded", info
    back = tmp_path / "back"
    out = slurm_agent.cli("pull", job_id, "--only", "workdir", "--workdir", str(back))
    assert out.returncode == 0, out.stdout + out.stderr
    assert (back / "out" / "model.txt").read_text() == f"trained on {slurm_cluster.node}"
    assert (back / "notes.txt").read_text() == "changed by the job"
    assert not (back / "write.py").exists()  # synced, unchanged: not an output
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)
