"""`ps` and `logs` are answered before FastAPI's routing (gpuhop.agent.server.routers.fastjobs):
a real agent gives, for each query, the same status, headers and bytes as its FastAPI route.

The route's answer is had by adding a parameter the fast path does not take (`via=route`):
FastAPI ignores a parameter no route declares, and the fast path hands any query it does not
take to the route (tests/unit/test_fastjobs_queries.py shows that it does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpuhop.api import JobState
from tests.conftest import Agent
from tests.integration.test_tls import raw_http
from tests.team import team_agent, team_tokens

ROUTE = ("via", "route")
PRINTS = "for i in range(30):\n    print(f'line {i}')\n"
SHOWN = ("content-type", "content-length", "transfer-encoding", "x-gpuhop-job")


def both(raw: httpx.Client, path: str, params: list[tuple[str, str]]) -> tuple[tuple, tuple]:
    """The fast path's answer and the route's, each as (status, headers shown, body)."""

    def get(query: list[tuple[str, str]]) -> tuple:
        r = raw.get(path, params=query)
        return r.status_code, {k: r.headers.get(k) for k in SHOWN}, r.content

    return get(params), get([*params, ROUTE])


@pytest.fixture
def raw(shared_agent: Agent) -> Iterator[httpx.Client]:
    transport = httpx.HTTPTransport(uds=str(shared_agent.paths.socket))
    with httpx.Client(transport=transport, base_url="http://agent") as client:
        yield client


def test_ps_answers_every_query_as_its_route_does(shared_agent, project, raw):
    root = project({"prints.py": PRINTS})
    with shared_agent.client() as client:
        for _ in range(2):
            assert client.submit(["prints.py"], workdir=root).wait(60).state == "succeeded"
    queries = [
        [],
        [("limit", "50")],
        [("limit", "1")],
        [("limit", "10000")],
        [("state", "succeeded")],
        [("limit", "5"), ("state", "succeeded"), ("state", "queued")],
        [("state", "queued")],
        [("fields", "id,state,command")],
        [("limit", "50"), ("fields", "id")],
        [("fields", "state,id"), ("state", "succeeded")],
    ]
    for query in queries:
        fast, route = both(raw, "/v1/jobs", query)
        assert fast == route, query
        assert fast[0] == 200 and fast[1]["content-type"] == "application/json"
    # The same errors, each naming what is wrong.
    bad = {
        "limit": [[("limit", "0")], [("limit", "10001")], [("limit", "many")], [("limit", "")]],
        "state": [[("state", "asleep")], [("state", "")]],
        "sweep": [[("sweep", "s" * 81)], [("sweep", "no-such-sweep")]],
        "fields": [[("fields", "id,colour")], [("fields", "")], [("fields", "id,")]],
    }
    for name, queries in bad.items():
        for query in queries:
            fast, route = both(raw, "/v1/jobs", query)
            assert fast == route, query
            assert fast[0] in (404, 422), (query, fast)
            assert name in fast[2].decode(), (query, fast)


def test_logs_answer_every_query_as_their_route_does(shared_agent, project, raw):
    root = project({"prints.py": PRINTS})
    with shared_agent.client() as client:
        job = client.submit(["prints.py"], workdir=root)
        assert job.wait(60).state == "succeeded"
    whole = (shared_agent.home / "jobs" / job.id / "output.log").read_bytes()
    assert whole.count(b"\n") == 30
    path = f"/v1/jobs/{job.id}/log"
    for query in (
        [],
        [("offset", "0"), ("follow", "True")],  # as the client sends it
        [("offset", "7"), ("follow", "false")],
        [("follow", "1"), ("offset", "100000")],
        [("follow", "0"), ("worker", "0")],  # 400: a job of one worker has none of its own
    ):
        fast, route = both(raw, path, query)
        assert fast == route, query
    assert both(raw, path, [])[0][2] == whole
    assert both(raw, path, [("offset", "7")])[0][2] == whole[7:]
    assert both(raw, path, [])[0][1]["x-gpuhop-job"] == job.id
    for query in ([("offset", "-1")], [("follow", "maybe")], [("worker", "x")]):
        fast, route = both(raw, path, query)
        assert fast == route and fast[0] == 422, (query, fast)
    fast, route = both(raw, "/v1/jobs/no-such-job/log", [])
    assert fast == route and fast[0] == 404


def test_a_users_ps_and_logs_show_only_their_own_jobs(tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("team"))
    with team_agent(root, 0) as agent:
        tokens = team_tokens(agent)
        with raw_http(agent, tokens["alice"]) as alice, raw_http(agent, tokens["bob"]) as bob:
            r = alice.post("/v1/jobs", json={"command": ["python", "-c", "print('hers')"]})
            assert r.status_code == 201, r.text
            hers = r.json()["id"]
            for who, jobs in ((alice, [hers]), (bob, [])):
                fast, route = both(who, "/v1/jobs", [("limit", "50")])
                assert fast == route
                assert [j["id"] for j in httpx.Response(200, content=fast[2]).json()] == jobs
            fast, route = both(bob, f"/v1/jobs/{hers}/log", [])
            assert fast == route and fast[0] == 404
            fast, route = both(alice, f"/v1/jobs/{hers}/log", [("follow", "True")])
            assert fast == route and fast[0] == 200
            with raw_http(agent, None) as nobody:
                fast, route = both(nobody, "/v1/jobs", [])
                assert fast == route and fast[0] == 401
            with raw_http(agent, tokens["carol"]) as carol:
                states = [j["state"] for j in carol.get("/v1/jobs").json()]
                assert states == [JobState.succeeded.value]
