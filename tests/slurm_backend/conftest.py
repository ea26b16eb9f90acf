"""Fixtures for the Slurm backend's tests: a real one-node Slurm cluster on this machine, and
one of two nodes, each in network and mount namespaces of its own
(tests/slurm_backend/cluster.py), and agents started with --backend slurm against them.

The tests skip, saying why, where Slurm or munge is not installed (scripts/setup-system
installs them), or where this process cannot run them (slurmd runs jobs as their
submitter: here the daemons run as root, as in CI), and the two-node cluster's where the
machine gives no network namespaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.conftest import Agent, missing, wait_until
from tests.slurm_backend import cluster as helper
from tests.slurm_backend.cluster import SlurmCluster


def skip_without_slurm() -> None:
    gone = helper.missing()
    if gone:
        missing(f"Slurm is not installed ({', '.join(gone)}; scripts/setup-system)")
    if os.getuid() != 0:
        pytest.skip(
            "the test Slurm cluster's daemons run as root (SlurmUser=root)", allow_module_level=True
        )


def start_cluster(root: Path, nodes: int = 1) -> Iterator[SlurmCluster]:
    """A started cluster of `nodes` nodes, used by this process and the agents it starts
    (`SlurmCluster.used_here`: SLURM_CONF, and the login node's srun); stopped (its network
    removed), and the environment restored, afterwards."""
    skip_without_slurm()
    if nodes > 1 and (why := netns.unavailable()) is not None:
        pytest.skip(f"no two-node Slurm cluster here: {why}")
    try:
        cluster = helper.start(root, nodes)
    except (helper.ClusterError, netns.NetworkError) as e:
        pytest.fail(str(e))
    try:
        with cluster.used_here():
            yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from start_cluster(tmp_path_factory.mktemp("slurm"))


@pytest.fixture(scope="module")
def two_node_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Two nodes, each with its own address (NodeAddr, which its name is not) and /tmp."""
    yield from start_cluster(tmp_path_factory.mktemp("slurm2"), nodes=2)


def start_agent(cluster: SlurmCluster, root: Path, toml: str = "") -> Iterator[Agent]:
    """An agent (--backend slurm) on `cluster`, with `toml` as its agent.toml; stopped, and
    its jobs gone from Slurm, afterwards."""
    if toml:
        (root / "home").mkdir(parents=True)
        (root / "home" / "agent.toml").write_text(toml)
    agent = Agent(root / "home", root / "cache", None, args=("--backend", "slurm")).start()
    try:
        yield agent
    finally:
        agent.shutdown()
        wait_until(lambda: not cluster.jobs(), timeout=60)


@pytest.fixture(scope="module")
def slurm_agent(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agent]:
    yield from start_agent(slurm_cluster, tmp_path_factory.mktemp("slurm-agent"))
