"""Sweeps and arrays (issue 22): one job per combination, one synced tree, the agent holding
a sweep to --max-parallel runs at once, and `sweep show`'s table sorted by a metric."""

from __future__ import annotations

import json

import pytest

from gpuhop.api import JobState
from gpuhop.client import GpuhopError
from tests.conftest import wait_until

TRAIN = """
import json, os, sys, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
lr, batch = float(args["--lr"]), int(args["--batch"])
time.sleep(0.3)
with open(os.environ["GPUHOP_METRICS_FILE"], "a") as f:
    f.write(json.dumps({"epoch": 1, "val_loss": lr * batch, "val_acc": 1 / (1 + lr * batch)})
            + "\\n")
"""


def most_at_once(runs) -> int:
    """The most runs whose [start, end] intervals overlap at one moment (from the records)."""
    edges = sorted(
        [(r.started_at, 1) for r in runs] + [(r.ended_at, -1) for r in runs],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_a_sweep_of_six_runs_at_most_two_at_once_and_shows_one_table(make_agent, project):
    agent = make_agent(fake_gpus=2)
    root = project({"train.py": TRAIN})

    done = agent.cli(
        "sweep", "-p", "lr=0.1,0.01,0.001", "-p", "batch=32,64", "--max-parallel", "2",
        "--name", "grid", "train.py", "--lr", "{lr}", "--batch", "{batch}",
        cwd=root,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "6 runs queued" in done.stderr and "6 succeeded" in done.stderr
    with agent.client() as client:
        runs = client.sweep_runs("grid")
        assert len(runs) == 6 and {r.state for r in runs} == {JobState.succeeded}
        assert {r.name for r in runs} == {
            f"grid[lr={lr},batch={b}]" for lr in ("0.1", "0.01", "0.001") for b in (32, 64)
        }
        assert {r.max_parallel for r in runs} == {2} and len({r.sweep for r in runs}) == 1
        assert most_at_once(runs) <= 2
        # The runs shared one tree: the agent holds one tree, and one copy of train.py.
        assert len(list(agent.paths.trees.iterdir())) == 1
    table = agent.cli("sweep", "show", "grid", "--metric", "val_loss", cwd=root)
    assert table.returncode == 0, table.stderr
    # Each run is labelled by its values (both parameters differ between the runs).
    rows = [line for line in table.stdout.splitlines() if line.startswith("lr=")]
    assert len(rows) == 6
    # Sorted by val_loss, lowest first: lr=0.001 with batch 32 is the best run.
    assert rows[0].startswith("lr=0.001 batch=32 ") and "0.032" in rows[0]
    assert rows[-1].startswith("lr=0.1 batch=64 ") and "6.4" in rows[-1]
    # A score is best highest, so first by default: the same best run; --asc turns it round.
    for order, best in (((), "lr=0.001 batch=32 "), (("--asc",), "lr=0.1 batch=64 ")):
        shown = agent.cli("sweep", "show", "grid", "-m", "val_acc", *order, cwd=root).stdout
        assert next(r for r in shown.splitlines() if r.startswith("lr=")).startswith(best), shown
    as_json = json.loads(agent.cli("sweep", "show", "grid", "--json", cwd=root).stdout)
    assert len(as_json) == 6


def test_an_array_sets_its_index_and_a_bad_sweep_is_refused(make_agent, project):
    agent = make_agent()
    root = project(
        {"echo.py": "import os, sys; print('index', os.environ['GPUHOP_ARRAY_INDEX'], sys.argv[1])"}
    )

    done = agent.cli(
        "sweep", "--array", "3", "-n", "arr", "-d", "--priority", "-3", "--timeout", "1h",
        "--retries", "1", "--retry-on", "any", "echo.py", "i{index}",
        cwd=root,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    sweep_id = done.stdout.strip()
    with agent.client() as client:

        def finished():
            runs = client.sweep_runs(sweep_id)
            return runs if len(runs) == 3 and all(r.state.finished for r in runs) else None

        runs = wait_until(finished)
        logs = sorted(b"".join(client.job(r.id).logs()).decode().strip() for r in runs)
    assert logs == ["index 0 i0", "index 1 i1", "index 2 i2"]
    # The queue options, as for run: each run's.
    assert {(r.priority, r.timeout, r.retries, r.retry_on) for r in runs} == {(-3, 3600, 1, "any")}
    clash = agent.cli(
        "sweep", "--array", "2", "--gpus", "2", "--gpu-memory", "1G", "x.py", cwd=root
    )
    assert clash.returncode == 2 and "it cannot be combined with --gpus 2" in clash.stderr
    typo = agent.cli("sweep", "-d", "-p", "lr=1,2", "echo.py", "{lr}{batch}{index}", cwd=root)
    assert typo.returncode == 0, typo.stderr
    assert "{batch} in the command is no -p parameter's: every run gets it as written" in (
        typo.stderr
    )
    assert "{index} in the command" in typo.stderr  # {index} is --array's only
    assert "{lr} in the command" not in typo.stderr
    unused = agent.cli("sweep", "-p", "lr=1,2", "echo.py", "x", cwd=root)
    assert unused.returncode != 0 and "parameter lr is not used in the command" in unused.stderr
    unknown = agent.cli("sweep", "show", "no-such-sweep", cwd=root)
    assert unknown.returncode != 0 and "no sweep matches 'no-such-sweep'" in unknown.stderr
    # A sweep of one run says so ("1 runs queued" before).
    one = agent.cli("sweep", "--array", "1", "echo.py", "i{index}", cwd=root)
    assert one.returncode == 0, one.stderr
    assert ": 1 run queued (one synced tree)" in one.stderr


def test_sweep_cancel_stops_every_run_that_has_not_ended_and_keeps_the_others(
    make_agent, project, tmp_path
):
    agent = make_agent()
    gate = tmp_path / "never"
    root = project(
        {
            "hold.py": "import os, sys, time\n"
            "if sys.argv[1] != '0':\n"
            f"    while not os.path.exists({str(gate)!r}):\n"
            "        time.sleep(0.05)\n"
        }
    )
    done = agent.cli(
        "sweep", "--array", "3", "--max-parallel", "1", "-n", "held", "-d", "hold.py", "{index}",
        cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with agent.client() as client:

        def settled():
            runs = client.sweep_runs("held")
            states = sorted(r.state.value for r in runs)
            return runs if states == ["queued", "running", "succeeded"] else None

        wait_until(settled)  # index 0 ended; one run holds on, the third waits its turn
    cancelled = agent.cli("sweep", "cancel", "held", "--grace", "1", cwd=root)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled 2 run(s) of sweep held; now " in cancelled.stderr
    with agent.client() as client:
        runs = client.sweep_runs("held")
    assert sorted(r.state.value for r in runs) == ["cancelled", "cancelled", "succeeded"]
    again = agent.cli("sweep", "cancel", "held", cwd=root)
    assert again.returncode == 0 and "every run of sweep held had ended already" in again.stderr
    unknown = agent.cli("sweep", "cancel", "no-such-sweep", cwd=root)
    assert unknown.returncode == 2 and "no sweep matches 'no-such-sweep'" in unknown.stderr


def test_the_sdk_takes_numbers_and_a_lone_value_as_a_parameters_values(shared_agent, project):
    root = project({"echo.py": "import sys; print(sys.argv[1:])"})
    with shared_agent.client() as client:
        # As a notebook writes a grid: numbers, and one value given alone (not its characters:
        # "adam" was four runs, with opt a, d, a and m).
        sweep = client.sweep(
            "echo.py --lr {lr} --opt {opt}", {"lr": [0.1, 1e-05], "opt": "adam"}, workdir=root
        )
        outs = sorted(b"".join(run.logs(follow=True)).decode().strip() for run in sweep.runs)
        assert outs == [
            "['--lr', '0.1', '--opt', 'adam']",
            "['--lr', '1e-05', '--opt', 'adam']",
        ]
        assert {r.name for r in client.sweep_runs(sweep.id)} == {
            "sweep[lr=0.1,opt=adam]",
            "sweep[lr=1e-05,opt=adam]",
        }
        with pytest.raises(GpuhopError, match=r"lr=None: a parameter's values are text or num"):
            client.sweep("echo.py {lr}", {"lr": [None]}, workdir=root)
