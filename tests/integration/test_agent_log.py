"""What a real agent logs: nothing alarming for what clients ordinarily do (read after every
test by `Agent.check_log`), and how that check reads a log."""

from __future__ import annotations

import socket

import httpx

from tests.conftest import unexpected_log_entries, wait_until

TRACEBACK = """\
2026-01-01 10:00:01,000 ERROR gpuhop.agent: GET /v1/x failed
Traceback (most recent call last):
  File "x.py", line 1, in f
KeyError: 'x'
"""


def test_a_traceback_is_one_entry_and_an_expected_one_passes():
    text = "2026-01-01 10:00:00,000 INFO gpuhop.agent: started\n" + TRACEBACK
    text += "2026-01-01 10:00:02,000 WARNING gpuhop.agent: a job's GPU is busy\n"
    assert unexpected_log_entries(text) == [TRACEBACK.rstrip()]
    assert unexpected_log_entries(text, (r"KeyError: 'x'",)) == []


def test_warnings_and_errors_escaping_to_asyncio_or_uvicorn_alarm():
    lines = [
        "/x/y.py:3: DeprecationWarning: old",
        "2026-01-01 10:00:00,000 ERROR asyncio: Task exception was never retrieved",
        "2026-01-01 10:00:00,000 ERROR uvicorn.error: ASGI callable returned without completing"
        " handshake.",
        "Exception ignored in: <socket.socket fd=3>",
    ]
    for line in lines:
        assert unexpected_log_entries(line) == [line]


def test_the_openapi_schema_is_made_without_a_warning(shared_agent):
    # The agent turns warnings into errors: a duplicate operation id would answer 500.
    http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(shared_agent.paths.socket)), base_url="http://a"
    )
    with http:
        schema = http.get("/openapi.json")
    assert schema.status_code == 200, schema.text
    ids = [op["operationId"] for item in schema.json()["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_a_client_that_leaves_mid_upload_is_no_error(make_agent):
    agent = make_agent()
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(agent.paths.socket))
        s.sendall(b"POST /v1/trees HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n")
        s.sendall(b"x" * 1000)
    # The agent notes it (and `check_log` finds no traceback after it).
    wait_until(lambda: "went away before its body ended" in agent.paths.logfile.read_text(), 10)
