"""Fixtures for the Ray backend's tests: real Ray clusters of several nodes on this machine,
each run by a helper process (tests/ray_backend/cluster.py), and agents started with --backend ray.

Each test module skips itself without Ray (`pip install 'gpuhop[ray]'`). A cluster is
stopped by the pids Ray recorded for its nodes; the fixture then checks that no process
that descended from the helper (GCS, raylets, Ray's workers, the jobs they started) is
left, and kills any survivor by pid.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Agent, wait_until


def skip_without_ray() -> None:
    """Skip the calling test module where Ray is not installed. find_spec rather than
    importorskip: Ray's runtime (threads, C++ signal handlers) stays out of pytest."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'gpuhop[ray]')", allow_module_level=True)


@dataclass
class RayCluster:
    proc: subprocess.Popen[str]
    address: str
    token: str | None
    token_file: Path | None
    log: Any
    pids: list[int] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The cluster's live actors and its placement groups that are not removed."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("state\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def empty(self) -> bool:
        state = self.state()
        return not state["actors"] and not state["placement_groups"]

    def stop(self) -> None:
        family = _descendants(self.proc.pid) | set(self.pids)
        with contextlib.suppress(BrokenPipeError, OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in family):
            time.sleep(0.1)
        self.log.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        survivors = [p for p in family if _alive(p)]
        for pid in survivors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not survivors, f"Ray processes survived the cluster's shutdown: {survivors}"


def start_cluster(tmp: Path, auth: bool, nodes: list[dict[str, Any]]) -> RayCluster:
    spec = json.dumps({"auth": auth, "nodes": nodes})
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "src"), str(REPO), env.get("PYTHONPATH")) if p
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    log = open(tmp / "cluster.log", "w")  # noqa: SIM115 (closed by RayCluster.stop)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_backend.cluster", spec],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        log.close()
        proc.stdout.close()
        pytest.fail(f"the Ray cluster did not start:\n{(tmp / 'cluster.log').read_text()[-3000:]}")
    info = json.loads(line)
    token_file = None
    if info["token"]:
        token_file = tmp / "ray-token"
        token_file.write_text(info["token"])
    return RayCluster(proc, info["address"], info["token"], token_file, log, info["pids"])


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """Two Ray nodes with token authentication, 1 (made-up) GPU and 2 CPUs each."""
    cluster = start_cluster(
        tmp_path_factory.mktemp("ray"), True, [{"num_cpus": 2, "num_gpus": 1}] * 2
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def ray_agent(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    root = tmp_path_factory.mktemp("ray-agent")
    args = ("--backend", "ray", "--ray-address", ray_cluster.address)
    args += ("--ray-token-file", str(ray_cluster.token_file))
    agent = Agent(root / "home", root / "cache", None, args=args).start()
    try:
        yield agent
    finally:
        agent.shutdown()
        wait_until(ray_cluster.empty, timeout=60)


def agent_cli(command: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuhop agent COMMAND --home HOME ARGS...`, as a user runs it (no Ray variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHOP_", "RAY_"))}
    return subprocess.run(
        [sys.executable, "-m", "gpuhop", "agent", command, "--home", str(home), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
