"""What `ps` and `logs` take before FastAPI's routing (gpuhop.agent.server.routers.fastjobs):
only a query in the client's own form (anything else goes on to the route, which validates
it), and a followed log whose client hangs up ends its stream and its watch at once."""

from __future__ import annotations

import asyncio

import pytest

from gpuhop.agent.jobs.store import JobStore
from gpuhop.agent.server.routers.fastjobs import Refer, list_query, log_query, stream
from gpuhop.agent.services.logwatch import LogWatch
from gpuhop.agent.services.outputs import follow_log
from gpuhop.api import JobState
from gpuhop.api.spec import JobSpec
from gpuhop.client.transport.unixhttp import query


def test_the_clients_own_queries_are_taken():
    # As the SDK writes them (gpuhop.client.jobs.list_json, Job.logs).
    q = query([("limit", 50), ("sweep", "lr sweep/1"), ("state", "queued"), ("state", "running")])
    got = ([JobState.queued, JobState.running], 50, "lr sweep/1", None)
    assert list_query(q[1:].encode()) == got
    assert list_query(b"") == (None, 200, None, None)
    q = query([("limit", 50), ("fields", "id,state,command")])
    assert list_query(q[1:].encode()) == (None, 50, None, frozenset({"id", "state", "command"}))
    assert log_query(query({"offset": 12, "follow": True, "worker": 1})[1:].encode()) == (
        12,
        True,
        1,
    )
    assert log_query(b"offset=0&follow=false") == (0, False, None)
    assert log_query(b"") == (0, False, None)


@pytest.mark.parametrize(
    "bad",
    [
        "limit=0",
        "limit=10001",
        "limit=050",
        "limit=+5",
        "limit=",
        "limit=1&limit=2",
        "state=",
        "state=QUEUED",
        "sweep=" + "s" * 81,
        "sweep=a&sweep=b",
        "via=route",
        "limit",
        "fields=",
        "fields=id,colour",
        "fields=id,",
        "fields=id&fields=state",
    ],
)
def test_any_other_list_query_goes_to_the_route(bad):
    with pytest.raises(Refer):
        list_query(bad.encode())


@pytest.mark.parametrize(
    "bad",
    [
        "offset=-1",
        "offset=",
        "offset=01",
        "follow=yes",
        "follow=",
        "worker=-1",
        "worker=",
        "offset=1&offset=2",
        "via=route",
    ],
)
def test_any_other_log_query_goes_to_the_route(bad):
    with pytest.raises(Refer):
        log_query(bad.encode())


def test_a_follower_that_hangs_up_ends_its_stream_and_the_watch(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    try:
        job = store.create(["job.py"], JobSpec())
        assert store.transition(job.id, [JobState.queued], JobState.running)
        path = tmp_path / "output.log"
        path.write_bytes(b"first\n")

        async def scenario() -> list[dict]:
            watch = LogWatch(store)
            sent: list[dict] = []
            hung_up = asyncio.Event()

            async def send(message: dict) -> None:
                sent.append(message)
                if message.get("body"):
                    hung_up.set()  # the client reads the first chunk, then goes

            async def receive() -> dict:
                await hung_up.wait()
                return {"type": "http.disconnect"}

            chunks = follow_log(watch, job.id, path, 0, follow=True)
            # The job runs on: only the hang-up ends this stream.
            await asyncio.wait_for(stream(chunks, [], receive, send), timeout=30)
            assert watch.watched == 0
            await watch.aclose()
            return sent

        sent = asyncio.run(scenario())
    finally:
        store.close()
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1]["body"] == b"first\n"
