"""The queue policy's limits that are not about busy GPUs (issue 22): GPUs of one model for
a multi-GPU job, a user's GPUs at once, a sweep's runs at once. Each makes a job wait without
holding back the jobs behind it that the limit does not bind."""

from __future__ import annotations

from gpuhop.agent.jobs.placement import (
    Holding,
    Limits,
    Pending,
    Placement,
    could_ever_fit,
    plan,
)
from tests.placing import queued

GIB = 1024
FOUR = dict.fromkeys(range(4), 8 * GIB)
# GPUs 0 and 2 are one model, 1 and 3 another: the lowest free indices are never alike.
MIXED = {0: "A100@", 1: "V100@", 2: "A100@", 3: "V100@"}


def job(job_id: str, gpus: int = 1, created_at: float = 0.0, **more: object) -> Pending:
    return queued(job_id, gpus, 0, created_at, **more)  # type: ignore[arg-type]


def test_a_multi_gpu_job_gets_gpus_of_one_model_not_the_lowest_indices():
    assert plan([job("a", 2)], FOUR, kinds=MIXED) == [Placement("a", (0, 2))]


def test_it_waits_rather_than_mixing_models_and_says_why():
    held = [Holding("x", (0,)), Holding("y", (1,))]
    waiting: dict[str, str] = {}
    in_line: dict[str, str] = {}
    pending = [job("a", 2), job("share", 1, created_at=1.0, gpu_memory_mb=GIB)]

    assert plan(pending, FOUR, held, kinds=MIXED, waiting=waiting, in_line=in_line) == []
    # Not a limit: it keeps its place in line, and the share behind it waits for it.
    assert waiting == {}
    assert "of one model" in in_line["a"]


def test_mixed_gpus_takes_any_free_gpus():
    held = [Holding("x", (0,)), Holding("y", (1,))]

    assert plan([job("a", 2, mixed_gpus=True)], FOUR, held, kinds=MIXED) == [Placement("a", (2, 3))]


def test_a_topology_group_counts_as_part_of_the_kind():
    kinds = {0: "A100@0", 1: "A100@1", 2: "A100@0", 3: "A100@1"}

    assert plan([job("a", 2)], FOUR, kinds=kinds) == [Placement("a", (0, 2))]


def test_more_gpus_of_one_model_than_the_host_has_can_never_fit_unless_mixed():
    assert not could_ever_fit(job("a", 3), FOUR, MIXED)
    assert could_ever_fit(job("a", 3, mixed_gpus=True), FOUR, MIXED)
    assert could_ever_fit(job("a", 3), FOUR, {})


def test_a_user_over_the_gpu_limit_waits_and_others_go_past():
    held = [Holding("mine", (0,), owner="alice")]
    pending = [job("alice-2", owner="alice", created_at=1), job("bob-1", owner="bob", created_at=2)]
    waiting: dict[str, str] = {}

    placed = plan(pending, FOUR, held, limits=Limits(user_gpus=1), waiting=waiting)

    assert placed == [Placement("bob-1", (1,))]
    assert "limit is 1 per user" in waiting["alice-2"]


def test_admins_are_exempt_from_the_gpu_limit():
    held = [Holding("mine", (0,), owner="carol")]
    limits = Limits(user_gpus=1, exempt=frozenset({"carol"}))

    assert plan([job("c", owner="carol")], FOUR, held, limits=limits) == [Placement("c", (1,))]


def test_a_sweep_runs_at_most_max_parallel_at_once_counting_its_running_runs():
    held = [Holding("r1", (), owner="alice", sweep="s")]
    pending = [
        job(f"r{i}", gpus=0, owner="alice", sweep="s", max_parallel=2, created_at=i)
        for i in range(2, 6)
    ]
    waiting: dict[str, str] = {}

    placed = plan(pending, FOUR, held, waiting=waiting)

    assert placed == [Placement("r2", ())]
    assert set(waiting) == {"r3", "r4", "r5"}


def test_one_users_sweep_does_not_count_against_anothers_of_the_same_id():
    held = [
        Holding("a1", (0,), owner="alice", sweep="s"),
        Holding("a2", (1,), owner="alice", sweep="s"),
    ]
    pending = [job("b1", owner="bob", sweep="s", max_parallel=2)]

    assert plan(pending, FOUR, held) == [Placement("b1", (2,))]
