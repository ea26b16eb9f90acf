"""Time limits on the Slurm backend: `run --timeout` runs from when Slurm started the job
(not while Slurm keeps it pending), gpuhop's own timer ends it on time, and a job that
Slurm's time limit ended (state TIMEOUT) ends as `timeout` too.

Slurm counts time limits in whole minutes and checks them every 30 seconds (slurmctld's
PERIODIC_TIMEOUT), so the test shortens a running job's limit with `scontrol update` as an
admin would, and then waits for Slurm's own check: this is the one slow wait (0-30 s).
"""

from __future__ import annotations

import time

import pytest

from tests.conftest import wait_until
from tests.slurm_backend.conftest import skip_without_slurm
from tests.slurm_backend.test_slurm_backend import HOLD, _script, _show, _submit

skip_without_slurm()

pytestmark = pytest.mark.timeout(180)


def _ended(agent, job_id: str, timeout: float = 60) -> dict:
    return wait_until(
        lambda: (i := _show(agent, job_id))["state"] not in ("queued", "running") and i,
        timeout=timeout,
    )


def test_time_limits_count_from_slurms_start_and_slurms_own_limit_is_a_timeout(
    slurm_agent, slurm_cluster, tmp_path
):
    hold = tmp_path / "hold"
    hold.touch()
    work = _script(tmp_path, "hold.py", HOLD)
    # Another job of the user holds both GPUs (and one of the node's 2 CPUs).
    hog = slurm_cluster.run(
        "sbatch", "--parsable", "--gres=gpu:2", "--output=/dev/null",
        "--wrap", f"while [ -e {hold} ]; do sleep 0.1; done",
    ).strip()  # fmt: skip
    try:
        wait_until(lambda: "RUNNING" in slurm_cluster.run("squeue", "-h", "-j", hog, "-o", "%T"))
        # A: runs at once, under a Slurm limit of 10 minutes (--timeout 600), which the test
        # then takes away: Slurm ends it, TIMEOUT.
        slow = _submit(slurm_agent, work, "--timeout", "600", "hold.py", str(tmp_path))
        wait_until(lambda: (tmp_path / f"pid-{slow}").exists(), timeout=60)
        slurm_id = slurm_cluster.run("squeue", "-h", "-n", f"gpuhop-{slow}", "-o", "%i").strip()
        assert slurm_cluster.run("squeue", "-h", "-j", slurm_id, "-o", "%l").strip() == "10:00"
        slurm_cluster.run("scontrol", "update", f"jobid={slurm_id}", "TimeLimit=-10")
        # B: --timeout 2 while Slurm keeps it pending (the GPUs are the other job's): its
        # limit has not started.
        b_sync = tmp_path / "b"
        b_sync.mkdir()
        (b_sync / "hold").touch()  # B holds on until it is stopped
        args = ("--gpus", "1", "--timeout", "2", "hold.py", str(b_sync))
        quick = _submit(slurm_agent, work, *args)
        wait_until(lambda: (_show(slurm_agent, quick).get("waiting") or "").endswith("Resources"))
        pending_since = time.monotonic()
        info_a = _ended(slurm_agent, slow, timeout=90)  # Slurm's check: every 30 s
        wait_until(lambda: time.monotonic() > pending_since + 3)  # past B's 2 s, pending
        info_b = _show(slurm_agent, quick)
        assert info_b["state"] == "running" and info_b["waiting"].endswith("Resources"), info_b
        hold.unlink()  # the other job ends; Slurm starts B, and B's 2 s begin
        wait_until(lambda: (b_sync / f"pid-{quick}").exists(), timeout=60)
        info_b = _ended(slurm_agent, quick)
    finally:
        hold.unlink(missing_ok=True)
        (tmp_path / "b" / "hold").unlink(missing_ok=True)
    assert (info_a["state"], info_a["end_class"]) == ("failed", "timeout"), info_a
    assert f"Slurm's time limit ended it (Slurm job {slurm_id}, TIMEOUT)" in info_a["reason"]
    assert (info_b["state"], info_b["end_class"]) == ("failed", "timeout"), info_b
    assert "timed out (its time limit is 2s)" in info_b["reason"], info_b
    assert "holding" in slurm_agent.cli("logs", quick).stdout  # it ran before its limit
    wait_until(lambda: not slurm_cluster.jobs(), timeout=60)
