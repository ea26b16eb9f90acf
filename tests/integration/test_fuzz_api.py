"""The agent's HTTP API fuzzed from its own OpenAPI schema (schemathesis), on a real agent
over its Unix socket: every answer is a 2xx or a 4xx with an error body, never a 5xx; the
agent stays up; it writes nothing outside its state dir.

Bounded: twenty examples per operation (the examples are derandomized, the same each run; the
one bug the fuzzer has found, a 500 on GET /v1/datasets/<bad name>, it finds by the third).
Each example is a request the agent answers, so the count is most of the test's CPU: 60 cost
26 CPU-s, 20 cost 10.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from gpuhop.home import read_pid

# Routes left out: the preflight runs TensorFlow probes (seconds each), port forwarding
# is a WebSocket, which the schema does not describe, and an image pull asks the registry a
# fuzzed reference names (Docker Hub's, for most): no test sends traffic outside the machine.
SKIPPED = ("/v1/agent/doctor", "/v1/jobs/{ref}/ports", "/v1/images/pull")
BASE = "http://agent"
EXAMPLES = 20


# What tools write where they run (Python's byte code, the test tools' caches): never the agent's
# doing.
OURS = {".hypothesis", ".pytest_cache", "__pycache__", ".mypy_cache", ".ruff_cache"}


def snapshot(root: Path, skip: Path) -> set[str]:
    """Every path under `root` but those under `skip` and this test run's own caches."""
    found = set()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if Path(dirpath, d) != skip and d not in OURS]
        found.update(os.path.join(dirpath, n) for n in (*dirs, *files))
    return found


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):
    from tests.conftest import Agent

    root = Path(tmp_path_factory.mktemp("fuzz"))
    # The agent starts in a dir of this test's own (it keeps the cwd it was started in), so
    # that what appears there is the agent's doing: in the repo, where this process stands,
    # the other test processes write too.
    cwd = root / "cwd"
    cwd.mkdir()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        agent = Agent(root / "home", root / "cache", None, args=("--gc-every-hours", "0")).start()
    finally:
        os.chdir(here)
    assert Path(os.readlink(f"/proc/{agent.pid}/cwd")) == cwd
    before = snapshot(root, agent.home)
    http = httpx.Client(
        transport=httpx.HTTPTransport(uds=str(agent.paths.socket)), base_url=BASE, timeout=30
    )
    try:
        yield agent, http
        assert read_pid(agent.paths) == agent.pid, "the agent died under the fuzzer"
        assert http.get("/v1/agent").status_code == 200
        assert snapshot(root, agent.home) == before  # its cwd (under root) included
    finally:
        http.close()
        agent.shutdown()


def send(http: httpx.Client, case) -> httpx.Response:
    kwargs = case.as_transport_kwargs(base_url=BASE)
    request = http.build_request(
        kwargs.pop("method"),
        kwargs.pop("url"),
        params=kwargs.pop("params", None),
        headers=kwargs.pop("headers", None),
        json=kwargs.pop("json", None),
        content=kwargs.pop("data", None),
        cookies=kwargs.pop("cookies", None),
    )
    return http.send(request)


def test_no_answer_is_a_server_error(fuzzed):
    _agent, http = fuzzed
    schema = schemathesis.openapi.from_dict(http.get("/openapi.json").json())
    failures: dict[str, str] = {}
    tried = 0
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in SKIPPED:
            continue
        tried += 1

        @given(case=op.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(case) -> None:
            response = send(http, case)
            case.validate_response(response, checks=[not_a_server_error])
            if response.status_code >= 400:
                body = response.json()
                assert set(body) >= {"code", "message"}, body

        try:
            check()
        except Exception as e:  # one operation's failure must not hide the others'
            failures[op.label] = f"{type(e).__name__}: {e}"[:2000]
    assert tried > 20
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
