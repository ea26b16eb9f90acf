"""The Ray test clusters themselves (tests/ray_backend/cluster.py, also used by bench/): a
cluster that fails to start leaves no process behind, and none needs /tmp/ray."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from tests.ray_backend import cluster as helper
from tests.ray_backend.conftest import kept_cluster, skip_without_ray

skip_without_ray()


def _processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line mentions `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and helper._alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_a_cluster_that_fails_to_start_leaves_no_process_behind(tmp_path: Path) -> None:
    # The head comes up (GCS, raylet, the node's agents); the second node's options are wrong,
    # so the start fails with the head's processes running.
    nodes = [{"num_cpus": 1}, {"num_cpus": 1, "no_such_ray_option": 1}]
    with pytest.raises(helper.ClusterError) as failed:
        helper.start(tmp_path, auth=False, nodes=nodes)
    error = failed.value
    assert "no_such_ray_option" in str(error)
    assert error.pids, "the head's processes had started"
    assert [p for p in error.pids if helper._alive(p)] == []
    assert error.temp_dir and not Path(error.temp_dir).exists()
    assert _processes_naming(error.temp_dir) == []
    gc.collect()  # the helper's pipes are closed: nothing for the collector to warn about


def test_a_cluster_keeps_its_address_file_in_its_own_temp_dir(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The one-node cluster this process's Ray modules share (test_ray_auth's): its stop, when
    # the process leaves the Ray tests, checks that no process and no temp dir outlive it.
    cluster = kept_cluster(tmp_path_factory, False, [{"num_cpus": 1}])
    address_file = Path(cluster.temp_dir) / "ray" / "ray_current_cluster"
    assert address_file.read_text() == cluster.address
    assert cluster.pids and all(helper._alive(p) for p in cluster.pids)
    assert _processes_naming(cluster.temp_dir), "its processes run from its own temp dir"
