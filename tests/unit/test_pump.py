"""An upload's body handed to a worker thread (`pump`), and its blobs settled in the
background (`settle.Pending`): order, batching, errors on either side, and cleanup only
once the worker has stopped."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future

import pytest

from gpuhop.agent.storage import settle
from gpuhop.agent.storage.pump import pump


async def pieces(data: bytes, size: int, pulled: list[int] | None = None) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        if pulled is not None:
            pulled.append(i)
        yield data[i : i + size]
        await asyncio.sleep(0)  # as a network body: the loop runs between pieces


def test_every_piece_arrives_in_order_in_batches():
    data = bytes(range(256)) * 1000
    batches: list[list[bytes]] = []
    asyncio.run(pump(pieces(data, 1000), batches.append, batch=10_000, ahead=30_000))
    assert b"".join(b"".join(batch) for batch in batches) == data
    assert all(sum(map(len, batch)) >= 10_000 for batch in batches[:-1])
    assert len(batches) < len(data) // 1000  # gathered, not one hop per piece


def test_an_empty_body_calls_nothing():
    batches: list[list[bytes]] = []
    asyncio.run(pump(pieces(b"", 10), batches.append))
    assert batches == []


def test_an_error_of_the_worker_stops_the_reading_and_is_raised():
    pulled: list[int] = []

    def refuse(batch: list[bytes]) -> None:
        raise ValueError("a bad frame")

    with pytest.raises(ValueError, match="a bad frame"):
        body = pieces(bytes(1_000_000), 1000, pulled)
        asyncio.run(pump(body, refuse, batch=10_000, ahead=20_000))
    assert len(pulled) <= 30  # the rest of the body was never read


def test_a_broken_body_is_raised_only_once_the_worker_has_stopped():
    release = threading.Event()
    finished: list[bool] = []

    def slow(batch: list[bytes]) -> None:
        release.wait()
        time.sleep(0.05)  # still writing when the body breaks off
        finished.append(True)

    async def breaks_off() -> AsyncIterator[bytes]:
        yield bytes(100)  # a whole batch: handed to the worker
        release.set()
        raise ConnectionResetError("the client left")

    with pytest.raises(ConnectionResetError):
        asyncio.run(pump(breaks_off(), slow, batch=50))
    assert finished == [True]  # the caller may clean up: nothing is being written


def test_pending_blobs_are_reported_in_order_and_errors_raised():
    named: list[tuple[str, int]] = []
    pending = settle.Pending(lambda digest, size: named.append((digest, size)), limit=4)
    late: Future[int] = Future()
    pending.add(late, "a")
    pending.add(settle.done(5), "b")
    assert named == []  # "a" first, and it is not named yet
    late.set_result(3)
    pending.wait()
    assert named == [("a", 3), ("b", 5)]
    failed: Future[int] = Future()
    failed.set_exception(OSError("disk gone"))
    pending.add(failed, "c")
    pending.add(settle.done(0), "d")
    with pytest.raises(OSError, match="disk gone"):
        pending.wait()
    pending.abandon()  # the rest, errors or not
    assert named[-1] == ("d", 0)


def test_an_upload_waits_for_at_most_its_limit_of_blobs_in_flight():
    named: list[str] = []
    pending = settle.Pending(lambda digest, size: named.append(digest), limit=2)
    for name in "abc":
        pending.add(settle.done(1), name)
    assert named == ["a", "b"]  # past the limit: waited down to half of it
