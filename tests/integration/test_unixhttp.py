"""The SDK's standard-library HTTP over the agent's Unix socket
(client/transport/unixhttp.py), against a real agent: one kept-alive connection, a streamed
answer with a request beside it, the agent's error answers in its own words, and query
parameters as the agent reads them."""

from __future__ import annotations

import pytest

from gpuhop.client import Client, GpuhopError
from gpuhop.client.transport.unixhttp import UnixClient, query


def test_requests_share_one_kept_alive_connection(shared_agent):
    with shared_agent.client() as client:
        http = client.session.http
        assert isinstance(http, UnixClient)
        client.jobs()
        first = list(http._idle)
        client.jobs()
        client.info()
        assert len(first) == 1 and http._idle == first


def test_a_request_while_a_stream_is_open_gets_its_own_connection(shared_agent, project):
    root = project({"hello.py": "print('hello')\n"})
    with shared_agent.client() as client:
        job = client.submit(["hello.py"], workdir=root)
        job.wait(timeout=60)
        with client.session.stream("GET", f"/v1/jobs/{job.id}/log") as response:
            assert client.jobs()  # meanwhile, on a second connection
            assert b"".join(response.iter_raw()) == b"hello\n"
        assert b"".join(job.logs()) == b"hello\n"  # and the kept one is usable after


def test_an_error_answer_is_the_agents_own_words(shared_agent):
    with shared_agent.client() as client, pytest.raises(GpuhopError) as caught:
        client.job("nosuchjob")
    assert caught.value.status == 404
    assert "nosuchjob" in caught.value.message


def test_query_parameters_read_as_httpx_wrote_them():
    assert query(None) == ""
    assert query({"follow": True, "offset": 0}) == "?follow=true&offset=0"
    assert query([("state", "queued"), ("state", "running")]) == "?state=queued&state=running"
    assert query({"state": ["a b", "c"]}) == "?state=a+b&state=c"


def test_a_timeout_in_seconds_as_httpx_takes_it(shared_agent):
    with shared_agent.client() as client:
        http = client.session.http
        assert isinstance(http, UnixClient)
        assert http.get("/v1/agent", timeout=30.0).status_code == 200
        assert http.get("/v1/agent", timeout=None).status_code == 200
        with pytest.raises(TypeError, match="timeout takes seconds"):
            http.get("/v1/agent", timeout="soon")


def test_the_connection_that_found_the_agent_carries_the_first_request(shared_agent):
    # Found as a command finds it: the agent's socket is tried (and the agent started if
    # none answers); that connection is kept for the first request.
    with Client(shared_agent.home, cache_dir=shared_agent.cache) as client:
        http = client.session.http
        assert isinstance(http, UnixClient)
        found = list(http._idle)
        assert len(found) == 1  # kept from finding the agent, not closed for a new one
        client.jobs()
        assert http._idle == found
