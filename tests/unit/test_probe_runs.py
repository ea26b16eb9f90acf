"""`doctor`'s probe runs: one at a time, reused for a while, fresh on request."""

from __future__ import annotations

import asyncio
import threading

from gpuhop.agent.services.doctor import ProbeRuns


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_probe_runs_run_one_at_a_time_and_reuse_the_report():
    clock = Clock()
    runs = ProbeRuns(ttl=60, clock=clock)
    started = []
    running = 0
    most = 0
    lock = threading.Lock()
    gate = threading.Event()

    def probe() -> dict:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            started.append(clock.now)
        gate.wait(5)
        with lock:
            running -= 1
        return {"run": len(started)}

    async def scenario() -> None:
        calls = [asyncio.create_task(runs.report(probe)) for _ in range(8)]
        await asyncio.sleep(0.05)
        gate.set()
        assert [await c for c in calls] == [{"run": 1}] * 8
        clock.now += 30
        assert await runs.report(probe) == {"run": 1}  # still fresh enough
        assert await runs.report(probe, fresh=True) == {"run": 2}  # an admin's fresh run
        clock.now += 61
        assert await runs.report(probe) == {"run": 3}

    asyncio.run(scenario())
    assert most == 1


def test_concurrent_fresh_requests_share_a_run_that_started_after_them():
    runs = ProbeRuns(ttl=60, clock=Clock())
    count = 0

    def probe() -> dict:
        nonlocal count
        count += 1
        return {"run": count}

    async def scenario() -> list[dict]:
        return list(await asyncio.gather(*(runs.report(probe, fresh=True) for _ in range(5))))

    # The clock stands still: every caller asked no later than the first run started.
    assert asyncio.run(scenario()) == [{"run": 1}] * 5
