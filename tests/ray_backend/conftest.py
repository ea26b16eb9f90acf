"""Fixtures for the Ray backend's tests: real Ray clusters of several nodes on this machine,
each run by a helper process (tests/ray_backend/cluster.py), and agents started with --backend ray.

Each test module skips itself without Ray (`pip install 'gpuhop[ray]'`). A cluster is
stopped by the pids Ray recorded for its nodes; `RayCluster.stop` then checks that no
process that descended from the helper (GCS, raylets, Ray's workers, the jobs they started)
is left, and kills any survivor by pid.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Agent, missing, wait_until
from tests.ray_backend import cluster as helper
from tests.ray_backend.cluster import RayCluster


def skip_without_ray() -> None:
    """Skip the calling test module where Ray is not installed. find_spec rather than
    importorskip: Ray's runtime (threads, C++ signal handlers) stays out of pytest."""
    if importlib.util.find_spec("ray") is None:
        missing("Ray is not installed (pip install 'gpuhop[ray]')")


def start_cluster(tmp: Path, auth: bool, nodes: list[dict[str, Any]]) -> RayCluster:
    """A cluster of `nodes` run by the helper (tests/ray_backend/cluster.py); fails the
    test, with the end of the helper's log, if it does not start."""
    try:
        return helper.start(tmp, auth, nodes)
    except helper.ClusterError as e:
        pytest.fail(str(e))


# Clusters kept for the modules of this test process that ask for the same kind: a start
# costs tens of seconds of a 2-core machine. Each module's agents leave them empty (no
# actor, no placement group); `stop_kept_clusters` stops them all once the process moves
# on from the Ray tests (tests/conftest.py: `pytest_runtest_teardown`) or ends.
_KEPT: dict[str, RayCluster] = {}
TWO_NODES = [{"num_cpus": 2, "num_gpus": 1}] * 2


def kept_cluster(
    tmp_path_factory: pytest.TempPathFactory, auth: bool, nodes: list[dict[str, Any]]
) -> RayCluster:
    """A running cluster of this kind, started on first use."""
    key = json.dumps([auth, nodes], sort_keys=True)
    if key not in _KEPT:
        _KEPT[key] = start_cluster(tmp_path_factory.mktemp("ray"), auth, nodes)
    return _KEPT[key]


def stop_kept_clusters() -> None:
    while _KEPT:
        _KEPT.popitem()[1].stop()


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> RayCluster:
    """Two Ray nodes with token authentication, 1 (made-up) GPU and 2 CPUs each."""
    return kept_cluster(tmp_path_factory, True, TWO_NODES)


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
