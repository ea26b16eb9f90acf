"""What a cluster job's leader records of its attempt (gpuhop.backends.clusterjob)."""

from __future__ import annotations

import json
from pathlib import Path

from gpuhop.backends import clusterjob


def test_a_slurm_leader_from_before_the_shared_names_is_still_read(tmp_path: Path):
    # An agent upgraded while a Slurm job waited: its leader (which outlives the agent)
    # writes slurm-waiting and slurm-running.json; the job must still leave `starting`.
    (tmp_path / "slurm-waiting").write_text("Priority")
    assert clusterjob.waiting(tmp_path) == "Priority"
    assert clusterjob.running_since(tmp_path) is None
    (tmp_path / "slurm-waiting").unlink()
    (tmp_path / "slurm-running.json").write_text(json.dumps({"since": 1700000000.5}))
    assert clusterjob.waiting(tmp_path) is None
    assert clusterjob.running_since(tmp_path) == 1700000000.5
    clusterjob.forget(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_first_run_counts_and_a_hold_is_released(tmp_path: Path):
    clusterjob.hold(tmp_path, "the Ray cluster has not placed its 2 worker(s)")
    assert clusterjob.waiting(tmp_path) == "the Ray cluster has not placed its 2 worker(s)"
    clusterjob.runs(tmp_path)
    first = clusterjob.running_since(tmp_path)
    assert first is not None and clusterjob.waiting(tmp_path) is None
    clusterjob.runs(tmp_path)
    assert clusterjob.running_since(tmp_path) == first
