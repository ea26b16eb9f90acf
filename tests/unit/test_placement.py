"""The queue policy: priority then age, CPU jobs always start, no starvation, low GPUs first.

Memory shares have their own tests in test_scheduler_shares.py.
"""

from __future__ import annotations

import random

import pytest

from gpuhop.agent.jobs.placement import Holding, Pending, Placement, plan
from tests.placing import queued

GIB = 1024


def job(job_id: str, gpus: int = 1, priority: int = 0, created_at: float = 0.0) -> Pending:
    return queued(job_id=job_id, gpus=gpus, priority=priority, created_at=created_at)


def free(*indices: int, busy: tuple[int, ...] = ()) -> dict:
    """Arguments for `plan`: a host of 8 GiB GPUs, those in `busy` held by a whole-GPU job."""
    gpus = dict.fromkeys(sorted({*indices, *busy}), 8 * GIB)
    return {"gpus": gpus, "holdings": [Holding("running", busy)] if busy else []}


def started(placements: list[Placement]) -> list[str]:
    return [p.job_id for p in placements]


def test_nothing_pending_starts_nothing():
    assert plan([], **free(0, 1)) == []


def test_of_two_one_gpu_jobs_on_one_free_gpu_only_the_older_starts():
    # Listed newest first and with ids that sort the other way, so neither list order nor
    # id order can be what picks the winner.
    pending = [job("a-new", created_at=20.0), job("z-old", created_at=10.0)]

    assert plan(pending, **free(0)) == [Placement("z-old", (0,))]


def test_higher_priority_starts_before_an_older_job():
    pending = [job("old", created_at=1.0), job("urgent", priority=5, created_at=99.0)]

    assert plan(pending, **free(0)) == [Placement("urgent", (0,))]


def test_negative_priority_waits_behind_default_priority():
    pending = [job("low", priority=-1, created_at=1.0), job("normal", created_at=2.0)]

    assert started(plan(pending, **free(0))) == ["normal"]


def test_cpu_jobs_start_with_no_free_gpus():
    pending = [job("cpu-1", gpus=0, created_at=1.0), job("cpu-2", gpus=0, created_at=2.0)]

    assert plan(pending, **free(busy=(0,))) == [Placement("cpu-1", ()), Placement("cpu-2", ())]
    assert plan(pending, {}) == [Placement("cpu-1", ()), Placement("cpu-2", ())]


def test_cpu_jobs_start_even_behind_a_blocked_gpu_job():
    pending = [
        job("big", gpus=4, created_at=1.0),
        job("cpu", gpus=0, created_at=2.0),
        job("small", gpus=1, created_at=3.0),
    ]

    assert plan(pending, **free(0, 1, busy=(2, 3))) == [Placement("cpu", ())]


def test_first_gpu_job_that_does_not_fit_blocks_later_smaller_ones():
    # "small" would fit on the free GPU, but starting it could starve "big" forever.
    pending = [job("big", gpus=2, created_at=1.0), job("small", gpus=1, created_at=2.0)]

    assert plan(pending, **free(0, busy=(1,))) == []


def test_a_job_that_could_never_fit_is_passed_over_not_a_blocker():
    # 3 GPUs asked of a 2-GPU host: submit refuses that, but after a restart with fewer
    # GPUs such a job may be queued; it must not hold the queue up for good.
    pending = [job("huge", gpus=3, created_at=1.0), job("small", gpus=1, created_at=2.0)]

    assert plan(pending, **free(0, 1)) == [Placement("small", (0,))]


def test_jobs_ahead_of_the_blocker_still_start():
    pending = [
        job("first", gpus=1, priority=1, created_at=5.0),
        job("big", gpus=3, created_at=1.0),
        job("later", gpus=1, created_at=2.0),
    ]

    # "first" takes GPU 0; "big" then needs 3 of the 2 left and blocks "later".
    assert plan(pending, **free(0, 1, 2)) == [Placement("first", (0,))]


def test_gpus_are_handed_out_lowest_index_first():
    pending = [job("a", gpus=2, created_at=1.0), job("b", gpus=1, created_at=2.0)]

    assert plan(pending, **free(5, 3, 1, 2, busy=(0, 4))) == [
        Placement("a", (1, 2)),
        Placement("b", (3,)),
    ]


def test_equal_priority_and_age_fall_back_to_id_order():
    pending = [job("b", created_at=1.0), job("a", created_at=1.0)]

    assert started(plan(pending, **free(0))) == ["a"]


@pytest.mark.parametrize("seed", range(100))
def test_random_queues_keep_the_policy_invariants(seed: int):
    rng = random.Random(seed)
    idle = rng.sample(range(8), rng.randint(0, 8))
    pending = [
        job(
            f"j{i}",
            gpus=rng.choice([0, 0, 1, 1, 2, 3, 5]),
            priority=rng.choice([-1, 0, 0, 1]),
            created_at=float(rng.randint(0, 5)),
        )
        for i in range(rng.randint(0, 10))
    ]

    placements = plan(pending, **free(*idle, busy=tuple(set(range(8)) - set(idle))))

    by_id = {p.job_id: p for p in pending}
    handed_out = [g for p in placements for g in p.gpu_ids]
    assert len(handed_out) == len(set(handed_out)), "a GPU was given to two jobs"
    assert set(handed_out) <= set(idle)
    for p in placements:
        assert len(p.gpu_ids) == by_id[p.job_id].spec.gpus
    # Every CPU job starts.
    assert {j.job_id for j in pending if j.spec.gpus == 0} <= set(started(placements))
    # The GPU jobs that start are exactly a prefix of the GPU queue in policy order, and the
    # GPUs go out in ascending order along that prefix.
    gpu_queue = sorted(
        (j for j in pending if j.spec.gpus > 0),
        key=lambda j: (-j.spec.priority, j.created_at, j.job_id),
    )
    gpu_started = [p.job_id for p in placements if p.gpu_ids]
    assert gpu_started == [j.job_id for j in gpu_queue[: len(gpu_started)]]
    assert handed_out == sorted(idle)[: len(handed_out)]
    if len(gpu_started) < len(gpu_queue):
        blocker = gpu_queue[len(gpu_started)]
        assert blocker.spec.gpus > len(idle) - len(handed_out), "a job that fits was held back"
