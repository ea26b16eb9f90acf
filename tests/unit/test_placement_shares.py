"""Memory shares: packing by best fit, whole GPUs vs shares, and no starvation across both."""

from __future__ import annotations

import random

import pytest

from gpuhop.agent.jobs.placement import Holding, Pending, Placement, could_ever_fit, plan
from tests.placing import queued

GIB = 1024
TWO_8GIB_GPUS = {0: 8 * GIB, 1: 8 * GIB}


def share(job_id: str, gib: float, created_at: float = 0.0, priority: int = 0) -> Pending:
    return queued(job_id, 1, priority, created_at, gpu_memory_mb=int(gib * GIB))


def whole(job_id: str, gpus: int = 1, created_at: float = 0.0) -> Pending:
    return queued(job_id, gpus, 0, created_at)


def test_three_4gib_shares_on_two_8gib_gpus_two_share_gpu_0_the_third_takes_gpu_1():
    pending = [share("a", 4, 1.0), share("b", 4, 2.0), share("c", 4, 3.0)]

    assert plan(pending, TWO_8GIB_GPUS) == [
        Placement("a", (0,)),
        Placement("b", (0,)),  # best fit: GPU 0 is left with 0 free, GPU 1 would keep 4
        Placement("c", (1,)),
    ]


def test_the_same_holds_when_the_first_two_already_run():
    holdings = [Holding("a", (0,), 4 * GIB), Holding("b", (0,), 4 * GIB)]

    assert plan([share("c", 4)], TWO_8GIB_GPUS, holdings) == [Placement("c", (1,))]


def test_a_share_goes_to_the_gpu_it_fills_best_and_keeps_big_holes_open():
    # GPU 0 has 6 GiB free, GPU 1 has 3 GiB free, GPU 2 is empty (16 GiB).
    gpus = {0: 8 * GIB, 1: 8 * GIB, 2: 16 * GIB}
    holdings = [Holding("x", (0,), 2 * GIB), Holding("y", (1,), 5 * GIB)]

    assert plan([share("small", 3)], gpus, holdings) == [Placement("small", (1,))]
    assert plan([share("mid", 5)], gpus, holdings) == [Placement("mid", (0,))]
    assert plan([share("big", 10)], gpus, holdings) == [Placement("big", (2,))]


def test_shares_fill_a_gpu_exactly_but_never_overcommit_it():
    holdings = [Holding("x", (0,), 5 * GIB), Holding("y", (1,), 5 * GIB)]

    assert plan([share("fits", 3)], TWO_8GIB_GPUS, holdings) == [Placement("fits", (0,))]
    assert plan([share("too-big", 3.5)], TWO_8GIB_GPUS, holdings) == []


def test_a_whole_gpu_job_never_takes_a_gpu_that_holds_a_share():
    holdings = [Holding("s", (0,), 1 * GIB)]

    assert plan([whole("w")], TWO_8GIB_GPUS, holdings) == [Placement("w", (1,))]
    assert plan([whole("w2", gpus=2)], TWO_8GIB_GPUS, holdings) == []


def test_a_share_never_goes_onto_a_gpu_held_whole():
    holdings = [Holding("w", (0,))]

    assert plan([share("s", 1)], TWO_8GIB_GPUS, holdings) == [Placement("s", (1,))]
    both = [Holding("w", (0,)), Holding("v", (1,))]
    assert plan([share("s", 1)], TWO_8GIB_GPUS, both) == []


def test_whole_and_share_jobs_in_one_plan_keep_out_of_each_other():
    pending = [whole("w", created_at=1.0), share("s1", 2, 2.0), share("s2", 2, 3.0)]

    assert plan(pending, TWO_8GIB_GPUS) == [
        Placement("w", (0,)),
        Placement("s1", (1,)),
        Placement("s2", (1,)),
    ]


def test_a_whole_gpu_job_that_waits_blocks_later_shares_that_would_fit():
    # GPU 1 has room for the share, but the older whole-GPU job is waiting for a GPU to
    # empty; letting shares in could keep every GPU partly busy forever.
    holdings = [Holding("a", (0,), 4 * GIB), Holding("b", (1,), 4 * GIB)]
    pending = [whole("w", created_at=1.0), share("s", 4, 2.0), queued("cpu", 0, 0, 3.0)]

    assert plan(pending, TWO_8GIB_GPUS, holdings) == [Placement("cpu", ())]


def test_a_share_that_waits_blocks_later_whole_gpu_jobs():
    holdings = [Holding("a", (0,), 6 * GIB)]
    gpus = {0: 8 * GIB}
    pending = [share("big", 4, 1.0), whole("w", created_at=2.0)]

    assert plan(pending, gpus, holdings) == []


def test_a_share_larger_than_every_gpu_is_passed_over():
    pending = [share("huge", 12, 1.0), share("ok", 4, 2.0)]

    assert not could_ever_fit(pending[0], TWO_8GIB_GPUS)
    assert plan(pending, TWO_8GIB_GPUS) == [Placement("ok", (0,))]


def test_holdings_on_a_gpu_that_is_gone_are_ignored():
    # The agent came back with fewer GPUs; a job still holds GPU 5.
    assert plan([share("s", 8)], {0: 8 * GIB}, [Holding("old", (5,), 4 * GIB)]) == [
        Placement("s", (0,))
    ]


@pytest.mark.parametrize("seed", range(200))
def test_random_mixes_never_overcommit_and_never_starve(seed: int):
    rng = random.Random(seed)
    gpus = {i: rng.choice([4, 8, 16]) * GIB for i in range(rng.randint(1, 4))}
    holdings: list[Holding] = []
    for i in gpus:
        kind = rng.choice(["free", "free", "whole", "shares"])
        if kind == "whole":
            holdings.append(Holding(f"w{i}", (i,)))
        elif kind == "shares":
            holdings.append(Holding(f"s{i}", (i,), rng.randint(1, gpus[i])))
    pending = [
        rng.choice(
            [
                queued(f"j{k}", 0, 0, float(k)),
                queued(f"j{k}", rng.randint(1, 3), 0, float(k)),
                queued(f"j{k}", 1, 0, float(k), gpu_memory_mb=rng.randint(1, 10) * GIB),
            ]
        )
        for k in range(rng.randint(0, 8))
    ]

    placements = plan(pending, gpus, holdings)

    by_id = {p.job_id: p for p in pending}
    started_now = [
        Holding(p.job_id, p.gpu_ids, by_id[p.job_id].spec.gpu_memory_mb) for p in placements
    ]
    for g, memory in gpus.items():
        on_it = [h for h in [*holdings, *started_now] if g in h.gpu_ids]
        # A whole-GPU job counts for all of the memory, so this also catches it sharing.
        assert sum(memory if h.gpu_memory_mb is None else h.gpu_memory_mb for h in on_it) <= memory
        if any(h.gpu_memory_mb is None for h in on_it):
            assert len(on_it) == 1, f"GPU {g} is held whole and shared: {on_it}"
    for p in placements:
        job = by_id[p.job_id]
        wants = 1 if job.spec.gpu_memory_mb is not None else job.spec.gpus
        assert len(p.gpu_ids) == wants
    # The GPU jobs that start are a prefix of the GPU queue (jobs that could never fit aside).
    queue = [
        j
        for j in sorted(pending, key=lambda j: (j.created_at, j.job_id))
        if (j.spec.gpus or j.spec.gpu_memory_mb) and could_ever_fit(j, gpus)
    ]
    started = [p.job_id for p in placements if p.gpu_ids]
    assert started == [j.job_id for j in queue[: len(started)]]
    if len(started) < len(queue):
        # ...and the job that stopped the prefix really does not fit next to what runs.
        blocker = queue[len(started)]
        assert plan([blocker], gpus, [*holdings, *started_now]) == []
