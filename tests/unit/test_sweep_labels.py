"""A sweep's runs labelled by the values that differ between them (`lr=0.1 batch=32`), read
back from the names `client.sweeps.run_name` gives them."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuhop.api import JobInfo, JobState
from gpuhop.cli.sweep import labels
from gpuhop.client.sweeps import run_name, run_values


def _run(name: str | None) -> JobInfo:
    return JobInfo.model_validate(
        {
            "id": "ab12cd34", "name": name, "state": JobState.queued, "command": ["x.py"],
            "gpus": 0, "gpu_ids": [], "env": {}, "priority": 0, "attempt": 1,
            "created_at": datetime.now(UTC), "started_at": None, "ended_at": None,
            "exit_code": None, "signal": None, "reason": None,
        }
    )  # fmt: skip


def test_a_run_name_parses_back_to_its_values():
    values = {"lr": "0.1", "batch": "32", "opt": "adam_w"}
    assert run_values(run_name("grid", values)) == values
    assert run_values("plain-name") == {} and run_values(None) == {}
    assert run_values("odd[no-equals]") == {}


def test_runs_are_labelled_by_the_values_that_differ():
    grid = [{"lr": lr, "batch": "32", "seed": s} for lr in ("0.1", "0.01") for s in ("1", "2")]
    runs = [_run(run_name("g", v)) for v in grid]
    assert labels(runs) == [
        "lr=0.1 seed=1",
        "lr=0.1 seed=2",
        "lr=0.01 seed=1",
        "lr=0.01 seed=2",
    ]
    # One run: every value; a job not named as a run keeps its name.
    assert labels([runs[0]]) == ["lr=0.1 batch=32 seed=1"]
    assert labels([runs[0], _run("other")]) == ["lr=0.1 batch=32 seed=1", "other"]
