"""`gpuhop agent start --backend ray`: its options are checked, and a Ray cluster that does
not enforce token authentication is refused unless --ray-allow-no-auth says otherwise."""

from __future__ import annotations

import pytest

from gpuhop.client.embedded import stop
from gpuhop.home import AgentPaths, read_pid
from tests.ray_backend.conftest import RayCluster, agent_cli, kept_cluster, skip_without_ray

skip_without_ray()

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory: pytest.TempPathFactory) -> RayCluster:
    """One Ray node without authentication."""
    return kept_cluster(tmp_path_factory, False, [{"num_cpus": 1}])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "ray"], "--backend ray needs --ray-address HOST:PORT"),
        (["--ray-address", "10.0.0.5:6379"], "go with --backend ray"),
        (["--backend", "ray", "--ray-address", "ray://head:10001"], "is not HOST:PORT"),
        (["--backend", "kubernetes"], "unknown backend 'kubernetes'"),
    ],
)
def test_the_backend_options_are_checked(tmp_path, args, message):
    start = agent_cli("start", tmp_path / "home", *args)
    assert start.returncode == 2 and message in start.stderr, start.stderr
    assert read_pid(AgentPaths(tmp_path / "home")) is None


def test_a_cluster_without_authentication_is_refused(open_cluster, tmp_path):
    start = agent_cli(
        "start", tmp_path / "home", "--backend", "ray", "--ray-address", open_cluster.address
    )
    assert start.returncode == 2
    assert "does not enforce token authentication" in start.stderr
    assert "RAY_AUTH_MODE=token" in start.stderr and "--ray-allow-no-auth" in start.stderr
    assert read_pid(AgentPaths(tmp_path / "home")) is None


def test_allow_no_auth_is_explicit_and_remembered(open_cluster, tmp_path):
    paths = AgentPaths(tmp_path / "home")
    try:
        first = agent_cli(
            "start",
            paths.home,
            *("--backend", "ray", "--ray-address", open_cluster.address, "--ray-allow-no-auth"),
        )
        assert first.returncode == 0, first.stderr
        assert "does not enforce token authentication" in paths.logfile.read_text()
        stop(paths)
        # Started again without options (as the CLI does on demand): still on the cluster.
        again = agent_cli("start", paths.home)
        assert again.returncode == 0, again.stderr
        status = agent_cli("status", paths.home)
        assert f"backend: ray, jobs run on the cluster at {open_cluster.address}" in status.stdout
    finally:
        stop(paths)
