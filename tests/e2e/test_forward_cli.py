"""`gpuhop forward` as a user runs it: against a real job's HTTP server, stopped by Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhop.client import Job
from tests.conftest import Agent, wait_until
from tests.integration.test_forward import PAGE, SERVERS, start_servers
from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)


class Running:
    """`gpuhop ARGS...` in the background, its stderr collected line by line."""

    def __init__(self, agent: Agent, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuhop", *args],
            env=agent.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def url(self) -> str:
        """Wait for the "forwarding" line; the local URL it names."""

        def found() -> re.Match[str] | None:
            if self.proc.poll() is not None:
                pytest.fail(f"gpuhop forward exited {self.proc.returncode}: {self.stderr}")
            return re.search(r"forwarding (http://127\.0\.0\.1:\d+) -> job", self.stderr)

        return wait_until(found, timeout=60).group(1)

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        self._reader.join()
        assert self.proc.stderr is not None
        self.proc.stderr.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()


@pytest.fixture
def web(shared_agent: Agent, tmp_path: Path) -> Iterator[tuple[Job, int]]:
    """A job serving a page over HTTP on the host's loopback; cancelled at the end."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text(PAGE)
    (tmp_path / "servers.py").write_text(SERVERS)
    with shared_agent.client() as client:
        job, http_port, _ = start_servers(client, tmp_path)
        yield job, http_port
        if not job.refresh().state.finished:
            job.cancel(grace=0)
            job.wait(timeout=30)


def test_forward_serves_the_jobs_page_until_ctrl_c(shared_agent, web):
    job, http_port = web
    running = Running(shared_agent, "forward", job.id, str(http_port), "--local-port", "0")
    try:
        url = running.url()
        for _ in range(2):
            with urllib.request.urlopen(f"{url}/index.html", timeout=30) as response:
                assert response.read().decode() == PAGE
        running.proc.send_signal(signal.SIGINT)
        assert running.finish() == 0, running.stderr
    finally:
        running.kill()
    assert "stopped forwarding" in running.stderr
    assert "Traceback" not in running.stderr
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/index.html", timeout=5)


def test_forward_exits_when_the_job_ends(shared_agent, web):
    job, http_port = web
    local = free_port()
    running = Running(shared_agent, "forward", job.id, str(http_port), "--local-port", str(local))
    try:
        assert running.url() == f"http://127.0.0.1:{local}"
        job.cancel(grace=0)
        assert running.finish() == 0, running.stderr
    finally:
        running.kill()
    assert f"job {job.id} cancelled; stopped forwarding" in running.stderr


def test_forward_errors_a_user_can_act_on(shared_agent, web):
    job, http_port = web
    nothing = free_port()
    no_job = shared_agent.cli("forward", "nosuchjob", "8080")
    assert no_job.returncode == 2
    assert "no job matches 'nosuchjob'" in no_job.stderr
    closed = shared_agent.cli("forward", job.id, str(nothing))
    assert closed.returncode == 2
    assert f"job {job.id} has nothing listening on port {nothing}" in closed.stderr
    # The default local port is the remote one, which the job itself holds on this host.
    taken = shared_agent.cli("forward", job.id, str(http_port))
    assert taken.returncode == 2
    assert f"cannot listen on 127.0.0.1:{http_port}" in taken.stderr
    assert "pick another local port" in taken.stderr
    # No port: only a model server's is known.
    no_port = shared_agent.cli("forward", job.id)
    assert no_port.returncode == 2
    assert f"give the port it listens on: gpuhop forward {job.id} PORT" in no_port.stderr
    assert "Traceback" not in no_job.stderr + closed.stderr + taken.stderr + no_port.stderr
