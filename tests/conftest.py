"""Fixtures shared by the integration and end-to-end tests: real agents on real sockets.

Every agent a test starts lives in its own temp state dir and is stopped at teardown by
pid, after every job it still runs has been killed by process group.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhop.api import ListenerInfo
from gpuhop.client import Client
from gpuhop.client.embedded import start_background, stop
from gpuhop.home import AgentPaths, read_pid

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

# A job has a /tmp of its own, so the files a test shares with its jobs (gates, pids,
# markers in tmp_path) must lie outside /tmp: pytest's temp dirs go under /var/tmp (pytest
# keeps the last 3 runs' there, as it does under /tmp). Set before pytest first asks.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", "/var/tmp")

# Ctrl-C reaches the commands these tests start as it does on a user's terminal, also where
# the suite itself was started with SIGINT ignored (a shell's `cmd &` without job control
# does that, and every child inherits it: Python then never raises KeyboardInterrupt).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@functools.cache
def has_nvidia_gpu() -> bool:
    """Whether this machine has a real NVIDIA GPU that the driver answers for."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        listed = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the screenshots tests kept (`record_property("screenshot", path)`), so a CI log
    says where to look."""
    shots = [
        (report.nodeid, value)
        for reports in terminalreporter.stats.values()
        for report in reports
        for key, value in getattr(report, "user_properties", ())
        if key == "screenshot" and getattr(report, "when", "call") == "call"
    ]
    if shots:
        terminalreporter.section("screenshots")
        for nodeid, path in shots:
            terminalreporter.write_line(f"{path}  ({nodeid})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` need a real NVIDIA GPU; without one they are skipped, not failed."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not has_nvidia_gpu():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (nvidia-smi lists none here)")
        for item in gpu_tests:
            item.add_marker(skip)


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.02):
    """Poll `predicate` until it returns something truthy; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s: {predicate}")
        time.sleep(interval)


@dataclass
class Agent:
    """A real agent process on a Unix socket in a temp state dir."""

    home: Path
    cache: Path
    fake_gpus: int | None
    pid: int = 0
    args: tuple[str, ...] = ()
    """More `python -m gpuhop.agent` arguments, e.g. ("--listen", "127.0.0.1:0")."""

    @property
    def paths(self) -> AgentPaths:
        return AgentPaths(self.home)

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUHOP_")}
        # Hermetic: no remote the user configured (a default one) applies to the tests.
        env.update(
            GPUHOP_HOME=str(self.home),
            GPUHOP_CACHE_DIR=str(self.cache),
            GPUHOP_CONFIG_DIR=str(self.home.parent / "config"),
        )
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        return env

    def start(self) -> Agent:
        self.pid = start_background(self.paths, fake_gpus=self.fake_gpus, agent_args=self.args)
        return self

    @property
    def listener(self) -> ListenerInfo:
        """The agent's TCP listener as it reported it (started with --listen)."""
        return ListenerInfo.model_validate_json(self.paths.listen_file.read_bytes())

    def client(self) -> Client:
        return Client(self.home, autostart=False, cache_dir=self.cache)

    def cli(
        self,
        *args: str,
        cwd: Path | None = None,
        timeout: float = 120,
        env: dict[str, str] | None = None,
        **kwargs,
    ) -> subprocess.CompletedProcess[str]:
        """Run `gpuhop ARGS...` as a user would, in `cwd`, against this agent (or with `env`)."""
        return subprocess.run(
            [sys.executable, "-m", "gpuhop", *args],
            cwd=cwd,
            env=self.env if env is None else env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )

    def kill_jobs(self) -> None:
        """Kill what is left of every job this agent started (by process group, and by
        its memory cgroup where it has one: that holds a job whose shim has not yet written
        its pid), and remove those cgroups."""
        import json

        jobs = self.paths.jobs
        if not jobs.is_dir():
            return
        for pidfile in jobs.glob("*/shim.pid"):
            with contextlib.suppress(OSError, ValueError, ProcessLookupError, PermissionError):
                os.killpg(int(json.loads(pidfile.read_text())["pid"]), signal.SIGKILL)
        for made in jobs.glob("*/cgroup.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                cgroup = Path(json.loads(made.read_text())["path"])
                deadline = time.monotonic() + 10
                while (procs := (cgroup / "cgroup.procs").read_text().split()) and (
                    time.monotonic() < deadline
                ):
                    for pid in procs:
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.kill(int(pid), signal.SIGKILL)
                    time.sleep(0.02)
                cgroup.rmdir()

    def shutdown(self) -> None:
        self.kill_jobs()
        stop(self.paths, timeout=10)
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        assert read_pid(self.paths) is None


@pytest.fixture(autouse=True, scope="session")
def _hermetic_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    """No remote the user configured (a default one, $GPUHOP_REMOTE) leaks into the tests."""
    os.environ["GPUHOP_CONFIG_DIR"] = str(tmp_path_factory.mktemp("user-config"))
    os.environ.pop("GPUHOP_REMOTE", None)
    os.environ.pop("GPUHOP_TOKEN", None)


@pytest.fixture
def make_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Agent]]:
    """Start fresh agents for one test; all are stopped at its end."""
    started: list[Agent] = []

    def make(fake_gpus: int | None = None, args: tuple[str, ...] = ()) -> Agent:
        root = Path(tmp_path_factory.mktemp("agent"))
        agent = Agent(root / "home", root / "cache", fake_gpus, args=args)
        started.append(agent)
        return agent.start()

    yield make
    for agent in started:
        agent.shutdown()


@pytest.fixture(scope="session")
def shared_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent (no GPUs) for the tests that need nothing special; stopped at the end."""
    root = Path(tmp_path_factory.mktemp("shared-agent"))
    agent = Agent(root / "home", root / "cache", None).start()
    yield agent
    agent.shutdown()


@pytest.fixture
def project(tmp_path: Path) -> Callable[..., Path]:
    """Write a small project: project({"train.py": "print(1)"}) -> its directory."""

    def make(files: dict[str, str]) -> Path:
        root = tmp_path / "project"
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        root.mkdir(exist_ok=True)
        return root

    return make
