"""Fixtures for the Slurm backend's tests: a real one-node Slurm cluster on this machine
(tests/slurm_backend/cluster.py) and agents started with --backend slurm against it.

The tests skip, saying why, where Slurm or munge is not installed (scripts/setup-system
installs them), or where this process cannot run them (slurmd runs jobs as their
submitter: here the daemons run as root, as in CI).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def start_cluster(root: Path) -> Iterator[SlurmCluster]:
    """A started cluster, with SLURM_CONF pointing at it for this process and the agents it
    starts; stopped, and SLURM_CONF restored, afterwards."""
    skip_without_slurm()
    try:
        cluster = helper.start(root)
    except helper.ClusterError as e:
        pytest.fail(str(e))
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.stop()


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from start_cluster(tmp_path_factory.mktemp("slurm"))


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
