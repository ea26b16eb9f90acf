"""`logs -f` streams of one log share one watch of it (gpuhop.agent.services.logwatch), with a
real job store and real files: every stream gets the whole log, and all of them end when
the job does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gpuhop.agent.jobs.store import JobStore
from gpuhop.agent.services.logwatch import LogWatch
from gpuhop.agent.services.outputs import follow_log
from gpuhop.api import JobState
from gpuhop.api.spec import JobSpec

LINES = 40


async def collect(watch: LogWatch, job_id: str, path: Path, offset: int = 0) -> bytes:
    return b"".join([c async for c in follow_log(watch, job_id, path, offset, follow=True)])


async def write_then_end(store: JobStore, job_id: str, path: Path) -> None:
    """Write the log a line at a time, as a job does, then record the job's end."""
    with open(path, "ab") as f:
        for i in range(LINES):
            f.write(f"line {i}\n".encode())
            f.flush()
            await asyncio.sleep(0.002)
    assert store.transition(job_id, [JobState.running], JobState.succeeded, exit_code=0)


def running_job(store: JobStore) -> str:
    job = store.create(["job.py"], JobSpec())
    assert store.transition(job.id, [JobState.queued], JobState.running)
    return job.id


def test_many_followers_of_one_log_share_one_watch_and_all_get_it_whole(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    try:
        job_id = running_job(store)
        path = tmp_path / "output.log"  # not there yet: the job has not written

        async def scenario() -> list[bytes]:
            watch = LogWatch(store)
            streams = [asyncio.create_task(collect(watch, job_id, path)) for _ in range(12)]
            await asyncio.sleep(0.01)
            assert watch.watched == 1  # twelve streams, one watch
            writer = asyncio.create_task(write_then_end(store, job_id, path))
            await asyncio.sleep(0.03)
            # A stream that joins half-way, from the start of the file, misses nothing either.
            late = asyncio.create_task(collect(watch, job_id, path))
            got = await asyncio.wait_for(asyncio.gather(*streams, late), timeout=30)
            await writer
            assert watch.watched == 0  # the last stream out ended the watch
            await watch.aclose()
            return got

        got = asyncio.run(scenario())
    finally:
        store.close()
    whole = path.read_bytes()
    assert whole.decode().splitlines()[-1] == f"line {LINES - 1}"
    assert got == [whole] * 13


def test_a_stream_that_goes_away_leaves_the_others_following(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    try:
        job_id = running_job(store)
        path = tmp_path / "output.log"
        path.write_bytes(b"before\n")

        async def scenario() -> bytes:
            watch = LogWatch(store)
            leaving = asyncio.create_task(collect(watch, job_id, path))
            staying = asyncio.create_task(collect(watch, job_id, path, offset=3))
            await asyncio.sleep(0.02)
            leaving.cancel()  # its client hung up
            await asyncio.gather(leaving, return_exceptions=True)
            await write_then_end(store, job_id, path)
            got = await asyncio.wait_for(staying, timeout=30)
            await watch.aclose()
            return got

        got = asyncio.run(scenario())
    finally:
        store.close()
    assert got == path.read_bytes()[3:]


def test_a_job_gone_from_the_store_ends_its_streams(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    try:
        path = tmp_path / "output.log"
        path.write_bytes(b"all there is\n")

        async def scenario() -> bytes:
            watch = LogWatch(store)
            return await asyncio.wait_for(collect(watch, "0badc0de", path), timeout=30)

        assert asyncio.run(scenario()) == b"all there is\n"
    finally:
        store.close()
