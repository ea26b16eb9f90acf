"""gpuhop.runtime.tensorboard_dir(): the job's TensorBoard dir from its environment contract."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from gpuhop import runtime


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for var in ("GPUHOP_TENSORBOARD_DIR", "GPUHOP_ARTIFACTS_DIR", "GPUHOP_WORKER_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GPUHOP_JOB_ID", raising=False)
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_in_a_job_it_is_the_dir_the_agent_names(env, tmp_path):
    env.setenv("GPUHOP_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    env.setenv("GPUHOP_TENSORBOARD_DIR", str(tmp_path / "artifacts" / "tensorboard"))
    assert runtime.tensorboard_dir() == tmp_path / "artifacts" / "tensorboard"
    assert (tmp_path / "artifacts" / "tensorboard").is_dir()


def test_under_an_older_agent_it_follows_the_convention(env, tmp_path):
    env.setenv("GPUHOP_ARTIFACTS_DIR", str(tmp_path / "artifacts"))
    assert runtime.tensorboard_dir() == tmp_path / "artifacts" / "tensorboard"


def test_outside_gpuhop_it_is_beside_the_local_artifacts(env, tmp_path):
    assert runtime.tensorboard_dir() == Path("gpuhop-artifacts/local/tensorboard")
    assert (tmp_path / "gpuhop-artifacts" / "local" / "tensorboard").is_dir()


def test_workers_other_than_the_chief_write_elsewhere(env, tmp_path):
    env.setenv("GPUHOP_JOB_ID", "ab12cd34")
    env.setenv("GPUHOP_TENSORBOARD_DIR", str(tmp_path / "tb"))
    env.setenv("GPUHOP_WORKER_INDEX", "1")
    scratch = runtime.tensorboard_dir()
    assert scratch == Path(tempfile.gettempdir()) / "gpuhop-ab12cd34-tensorboard-worker-1"
    scratch.rmdir()
    assert not (tmp_path / "tb").exists()
    env.setenv("GPUHOP_WORKER_INDEX", "0")
    assert runtime.tensorboard_dir() == tmp_path / "tb"
