"""The Slurm backend end to end: a real agent (--backend slurm) on a real one-node Slurm
cluster (slurmctld, slurmd and munged of this machine, 2 made-up GPUs), driven through the
CLI as a user would."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from gpuhop.api import JobState
from gpuhop.client.embedded import start_background
from gpuhop.home import read_pid
from tests.conftest import wait_until
from tests.slurm_backend.conftest import skip_without_slurm

skip_without_slurm()

pytestmark = pytest.mark.timeout(180)

SHOW_GPUS = """
import os
print("visible:", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["GPUHOP_JOB_ID"], flush=True)
"""

# Holds on until the test removes its go file; writes its pid first.
HOLD = """
import os, sys, time
sync = sys.argv[1]
open(f"{sync}/pid-{os.environ['GPUHOP_JOB_ID']}", "w").write(str(os.getpid()))
print("holding", flush=True)
while os.path.exists(f"{sync}/hold"):
    time.sleep(0.05)
print("released", flush=True)
"""


def _script(tmp_path: Path, name: str, text: str) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / name).write_text(text)
    return work


def _show(agent, job_id: str) -> dict:
    out = agent.cli("show", "--json", "--", job_id)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _submit(agent, work: Path, *args: str) -> str:
    out = agent.cli("run", "--detach", "--no-requirements", *args, cwd=work)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().split()[-1]


def test_a_job_with_one_gpu_sees_the_gpu_slurm_gave_it(slurm_agent, slurm_cluster, tmp_path):
    work = _script(tmp_path, "gpus.py", SHOW_GPUS)
    run = slurm_agent.cli("run", "--no-requirements", "--gpus", "1", "gpus.py", cwd=work)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "gpuhop: submitted as Slurm job" in run.stdout
    assert "visible: 0 " in run.stdout  # Slurm's GRES index, not the scheduler's
    assert f"as Slurm job" in run.stdout and slurm_cluster.node in run.stdout
    assert not slurm_cluster.jobs() or wait_until(lambda: not slurm_cluster.jobs())
