"""The backends the contract suite runs against (huey's `StorageTests` idea): each is a real
agent started with `--backend NAME`, for Ray a real two-node Ray cluster on this machine
(tests/ray_backend/cluster.py), for Slurm a real two-node Slurm cluster, each node with its
own address and /tmp (tests/slurm_backend/cluster.py). `local-image` is the local backend
with every job in a container image through real Podman: its agents' default image
(agent.toml's `image`) is the minimal one the session builds (tests/images.py), so the
scenarios' jobs, which name none, all run in it. `local` always runs; `ray` skips where Ray
is not installed, `slurm` where Slurm or network namespaces are not, `local-image` where
Podman is not (or the tests do not run as root).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import Agent, wait_until
from tests.ray_backend.cluster import RayCluster
from tests.slurm_backend.cluster import SlurmCluster

BACKENDS = ["local", "local-image", "ray", "slurm"]


@dataclass
class Target:
    """One backend under test: an agent that runs jobs on it, and how to start more."""

    name: str
    agent: Agent  # shared by the module's scenarios that need no agent of their own
    args: tuple[str, ...]  # `python -m gpuhop.agent` arguments that choose this backend
    cluster: RayCluster | None = None
    slurm: SlurmCluster | None = None
    image: str | None = None  # every job's, as its agents' default (agent.toml)

    def start_agent(self, root: Path) -> Agent:
        """Another agent on this backend, its state under `root`."""
        return _agent(root, self.args, self.image)

    def shared_dir(self, agent: Agent, job_id: str, given: Path) -> Path:
        """Where, on this host, a job finds the dir that the test named `given` (the jobs'
        scripts take it as an argument; see `shared_arg`)."""
        if self.image is None:
            return given
        return agent.paths.job_dir(job_id) / "work" / given.name

    def shared_arg(self, given: Path) -> str:
        """The argument that names `given`, a dir the test and its job share, to the job: the
        path itself, but in an image, whose job sees nothing of the host but its own dirs,
        a dir of that name in its work dir (`shared_dir`)."""
        return given.name if self.image else str(given)

    def settled(self) -> None:
        """Wait until the backend holds nothing for ended jobs (Ray: actors, placement groups;
        Slurm: jobs in squeue)."""
        if self.cluster is not None:
            wait_until(self.cluster.empty, timeout=60)
        if self.slurm is not None:
            slurm = self.slurm
            wait_until(lambda: not slurm.jobs(), timeout=60)


def _agent(root: Path, args: tuple[str, ...], image: str | None = None) -> Agent:
    home = root / "home"
    if image is not None:
        home.mkdir(parents=True)
        (home / "agent.toml").write_text(f'image = "{image}"\n')
    return Agent(home, root / "cache", None, args=args).start()


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[Target]:
    if request.param == "local":
        agent = _agent(tmp_path_factory.mktemp("local-agent"), ())
        try:
            yield Target("local", agent, ())
        finally:
            agent.shutdown()
        return
    if request.param == "local-image":
        image = request.getfixturevalue("minimal_image")
        agent = _agent(tmp_path_factory.mktemp("image-agent"), (), image)
        try:
            yield Target("local-image", agent, (), image=image)
        finally:
            agent.shutdown()
        return
    if request.param == "slurm":
        from tests.slurm_backend.conftest import start_cluster as start_slurm

        for slurm in start_slurm(tmp_path_factory.mktemp("slurm"), nodes=2):
            args = ("--backend", "slurm")
            agent = _agent(tmp_path_factory.mktemp("slurm-agent"), args)
            try:
                yield Target("slurm", agent, args, slurm=slurm)
            finally:
                agent.shutdown()
                wait_until(lambda: not slurm.jobs(), timeout=60)  # noqa: B023
        return
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'gpuhop[ray]')")
    from tests.ray_backend.conftest import TWO_NODES, kept_cluster

    cluster = kept_cluster(tmp_path_factory, True, TWO_NODES)
    args = ("--backend", "ray", "--ray-address", cluster.address)
    args += ("--ray-token-file", str(cluster.token_file))
    agent = _agent(tmp_path_factory.mktemp("ray-agent"), args)
    try:
        yield Target("ray", agent, args, cluster)
    finally:
        agent.shutdown()
        wait_until(cluster.empty, timeout=60)


@pytest.fixture
def own_agent(
    backend: Target, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], Agent]]:
    """Fresh agents on `backend` for one scenario (to kill and start again); all are stopped
    at its end."""
    with contextlib.ExitStack() as stopping:  # every agent stops, whichever one's log fails

        def make() -> Agent:
            agent = backend.start_agent(Path(tmp_path_factory.mktemp("agent")))
            stopping.callback(agent.shutdown)
            return agent

        yield make
    backend.settled()
