"""The backend settings, and the Ray and Slurm backends' pure parts (no Ray or Slurm needed)."""

from __future__ import annotations

import io
import tarfile

import pytest

from gpuhop.backends import BackendSettings, remember, resolve
from gpuhop.backends.base import Ending
from gpuhop.backends.ray import transfer
from gpuhop.backends.ray.backend import _gpus
from gpuhop.backends.ray.leader import Prefixer, how
from gpuhop.backends.slurm.backend import _nodes
from gpuhop.backends.slurm.leader import Follow, sbatch_args
from gpuhop.home import AgentError


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (BackendSettings("lsf"), "unknown backend 'lsf'"),
        (BackendSettings("local", slurm_partition="gpu"), "go with --backend slurm"),
        (BackendSettings("slurm", slurm_qos="x; rm -rf /"), "--qos 'x; rm -rf /' is not a Slurm"),
        (BackendSettings("ray"), "needs --ray-address HOST:PORT"),
        (BackendSettings("ray", "ray://head:10001"), "is not HOST:PORT"),
        (BackendSettings("ray", "http://head:8265"), "is not HOST:PORT"),
        (BackendSettings("local", "head:6379"), "go with --backend ray"),
        (BackendSettings("local", ray_allow_no_auth=True), "go with --backend ray"),
        (BackendSettings("ray", "head:6379", "/nonexistent/token"), "no such file"),
    ],
)
def test_bad_settings_are_named(settings, message):
    with pytest.raises(AgentError) as e:
        settings.check()
    assert message in str(e.value)


def test_good_addresses_pass():
    for address in ("head:6379", "10.0.0.5:6379", "[fe80::1]:6379", "gpu-head.lab:1"):
        BackendSettings("ray", address).check()


def test_the_backend_is_remembered_once_it_worked(tmp_path):
    assert resolve(tmp_path, None) == BackendSettings()
    remember(tmp_path, BackendSettings())
    assert not (tmp_path / "backend.json").exists()  # the default leaves no file
    ray = BackendSettings("ray", "head:6379", ray_allow_no_auth=True)
    remember(tmp_path, ray)
    assert resolve(tmp_path, None) == ray
    assert resolve(tmp_path, BackendSettings()) == BackendSettings()  # given wins
    assert ray.args() == ["--backend", "ray", "--ray-address", "head:6379", "--ray-allow-no-auth"]
    slurm = BackendSettings("slurm", slurm_partition="gpu", slurm_account="lab-7")
    remember(tmp_path, slurm)
    assert resolve(tmp_path, None) == slurm
    assert slurm.args() == ["--backend", "slurm", "--partition", "gpu", "--account", "lab-7"]
    (tmp_path / "backend.json").write_text("{not json")
    with pytest.raises(AgentError, match="start the agent with --backend"):
        resolve(tmp_path, None)


def test_files_travel_as_a_tar_and_replace_when_asked(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("a")
    (src / "run.sh").write_text("#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    dest = tmp_path / "dest"
    (dest / "stale").mkdir(parents=True)
    transfer.unpack(transfer.pack(src), dest, replace=True)
    assert sorted(p.name for p in dest.iterdir()) == ["run.sh", "sub"]
    assert (dest / "sub" / "a.txt").read_text() == "a"
    assert (dest / "run.sh").stat().st_mode & 0o100
    assert transfer.pack(tmp_path / "missing") == transfer.pack(tmp_path / "empty-nothing")


def _tar_of(name: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def test_unpacking_never_writes_outside_the_target(tmp_path):
    dest = tmp_path / "a" / "dest"
    with pytest.raises(tarfile.FilterError):
        transfer.unpack(_tar_of("../escape.txt"), dest)
    assert not (tmp_path / "a" / "escape.txt").exists()
    transfer.unpack(_tar_of(f"{tmp_path}/absolute.txt"), dest)  # made relative, inside
    assert not (tmp_path / "absolute.txt").exists()
    assert (dest / str(tmp_path).lstrip("/") / "absolute.txt").is_file()


def test_a_link_out_of_the_target_is_refused(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(tarfile.FilterError):
        transfer.unpack(buf.getvalue(), tmp_path / "dest")


def test_worker_output_is_prefixed_line_by_line():
    p = Prefixer("[worker 1] ")
    assert p.feed(b"one\ntw") == b"[worker 1] one\n"
    assert p.feed(b"o\n") == b"[worker 1] two\n"
    assert p.feed(b"tail", final=True) == b"[worker 1] tail\n"
    assert p.feed(b"", final=True) == b""


def test_how_a_worker_ended_in_words():
    assert how({"exit_code": 3, "signal": None}) == "exited with code 3"
    assert how({"exit_code": None, "signal": 9}) == "was killed by signal 9 (SIGKILL)"
    assert how({"lost": "was lost: its node died", "signal": None}) == "was lost: its node died"


def test_cluster_gpus_are_numbered_across_nodes_head_first():
    node = {"address": "10.0.0.5", "cpus": 8.0, "accelerator": None}
    nodes = [
        {**node, "node_id": "bb" * 28, "name": "gpu-b", "head": False, "gpus": 2},
        {**node, "node_id": "aa" * 28, "name": "head", "head": True, "gpus": 1},
        {**node, "node_id": "cc" * 28, "name": "gpu-b", "head": False, "gpus": 0},
        {
            **node,
            "node_id": "dd" * 28,
            "name": "gpu-d",
            "head": False,
            "gpus": 1,
            "accelerator": "H100",
        },
    ]
    gpus = _gpus(nodes)
    assert [(g.index, g.node, g.name) for g in gpus] == [
        (0, "head", "GPU"),
        (1, "gpu-b (bbbbbbbb)", "GPU"),  # two nodes share the name: the node id tells them apart
        (2, "gpu-b (bbbbbbbb)", "GPU"),
        (3, "gpu-d", "H100"),
    ]


def test_slurm_nodes_and_their_gpus_from_sinfo():
    sinfo = "a|gpu:4\nb|gpu:a100:2(S:0-1),shard:8\nc|(null)\na|gpu:4\n"
    assert _nodes(sinfo) == [("a", 4), ("b", 2), ("c", 0)]


def test_a_slurm_job_asks_sbatch_for_its_gpus_time_and_account(tmp_path):
    spec = {"job_id": "ab12", "log": "/s/log", "work": "/s/work", "gpus": 2, "timeout": 90.0}
    args = sbatch_args({**spec, "partition": "gpu", "account": "lab-7", "qos": None}, tmp_path)
    assert "--gres=gpu:2" in args and "--time=2" in args  # whole minutes, rounded up
    assert "--partition=gpu" in args and "--account=lab-7" in args
    assert "--no-requeue" in args and not any(a.startswith("--qos") for a in args)
    assert args[-1] == str(tmp_path)
    plain = sbatch_args({**spec, "gpus": 0, "timeout": None}, tmp_path)
    assert not any(a.startswith(("--gres", "--time")) for a in plain)


def test_how_a_slurm_job_ended_maps_onto_gpuhops_classes(tmp_path):
    exit_file = tmp_path / "exit.json"
    follow = Follow({"exit_file": str(exit_file)}, tmp_path)
    follow.id = "17"
    lost = Ending.from_status(follow.ending("NODE_FAIL", ran=True), None)
    assert (lost.recorded, lost.detail) == (
        False,
        "Slurm job 17 was lost: its node failed (NODE_FAIL)",
    )
    exit_file.write_text('{"exit_code": null, "signal": 15}')
    timed_out = Ending.from_status(follow.ending("TIMEOUT", ran=True), None)
    assert (timed_out.signal, timed_out.end_class) == (15, "timeout")
    exit_file.write_text('{"exit_code": 0, "signal": null}')
    done = Ending.from_status(follow.ending("COMPLETED", ran=True), None)
    assert (done.exit_code, done.end_class, done.detail) == (0, None, None)
