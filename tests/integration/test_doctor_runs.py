"""`doctor`'s TensorFlow probe on a real agent: one at a time, reused, fresh for admins only."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from gpuhop.client.transport.tls import fetch_certificate, pinned_context
from tests.conftest import Agent

pytestmark = pytest.mark.timeout(300)
T = TypeVar("T")


def probes_of(pid: int) -> set[int]:
    """The agent's child processes that run the probe now."""
    found = set()
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():  # each thread's own children
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"probe.py" in cmdline:
            found.add(int(child))
    return found


def while_watching(agent: Agent, work: Callable[[], T]) -> tuple[T, set[int], int]:
    """Run `work` while looking at the agent's probes: its result, every probe process
    seen, and the most seen at once."""
    done = threading.Event()
    seen: set[int] = set()
    most = 0

    def watch() -> None:
        nonlocal most
        while not done.wait(0.02):
            now = probes_of(agent.pid)
            seen.update(now)
            most = max(most, len(now))

    with ThreadPoolExecutor(1) as watcher:
        watching = watcher.submit(watch)
        try:
            result = work()
        finally:
            done.set()
        watching.result()
    return result, seen, most


def test_concurrent_doctor_calls_run_one_probe_and_only_an_admin_forces_one(make_agent):
    agent = make_agent(args=("--listen", "127.0.0.1:0"))
    with agent.client() as owner:
        alice = owner.create_token("alice").token
        carol = owner.create_token("carol", admin=True).token

    def call(_: int) -> list:
        with agent.client() as client:
            return client.doctor()

    def six_at_once() -> list:
        with ThreadPoolExecutor(6) as pool:
            return list(pool.map(call, range(6)))

    answers, seen, most = while_watching(agent, six_at_once)
    assert all(a == answers[0] for a in answers)
    assert most == 1 and len(seen) == 1, seen

    pem, _ = fetch_certificate(agent.listener.url)

    def doctor(token: str, fresh: bool) -> httpx.Response:
        with httpx.Client(
            base_url=agent.listener.url,
            verify=pinned_context(pem),
            headers={"Authorization": f"Bearer {token}"},
            timeout=240,
        ) as http:
            return http.get("/v1/agent/doctor", params={"fresh": "true"} if fresh else None)

    # A user gets the report just made, and may not force a new probe.
    cached, seen, _ = while_watching(agent, lambda: doctor(alice, fresh=False))
    assert cached.status_code == 200 and not seen
    refused, seen, _ = while_watching(agent, lambda: doctor(alice, fresh=True))
    assert refused.status_code == 403 and not seen
    assert "only an admin" in refused.json()["message"]
    # An admin may, and so may the owner on the socket.
    fresh, seen, _ = while_watching(agent, lambda: doctor(carol, fresh=True))
    assert fresh.status_code == 200 and len(seen) == 1
    with agent.client() as owner:
        assert owner.doctor(fresh=True)
