"""A Ray cluster of several nodes on this machine, for the Ray backend's tests and for
bench/ray_backend.py. No pytest here: the benchmark imports it too.

`start(...)` runs `python -m tests.ray_backend.cluster SPEC` as a helper process, so Ray's
threads, warnings and C++ runtime never enter the caller's process, and returns a
`RayCluster` that talks to it. SPEC is JSON: {"auth": true|false, "dashboard": true|false,
"nodes": [{"num_cpus": 1, "num_gpus": 1}, ...]}, the first node being the head. The helper
starts the cluster with `ray.cluster_utils.Cluster` (with token authentication when "auth":
a fresh random token; with Ray's dashboard, and so its job API, on a loopback port when
"dashboard"), prints one JSON line {"address", "token", "dashboard", "pids"}, and then
answers lines on stdin:

- `state`: one JSON line with the cluster's live actors and placement groups not removed;
- `stop` (or end of input): shuts the cluster down (by the pids Ray recorded for each node)
  and prints `stopped`.

Ray's processes are all descendants of the helper, so `RayCluster.stop` can check by pid
that none survives (`ray stop` would kill every Ray process on the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


class ClusterError(RuntimeError):
    """The helper could not start the cluster; the message has the end of its log."""


# -- the caller's side --------------------------------------------------------------------------


@dataclass
class RayCluster:
    proc: subprocess.Popen[str]
    address: str
    token: str | None
    token_file: Path | None
    log: IO[str]
    dashboard: str | None = None  # "127.0.0.1:PORT", with "dashboard" in the spec
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


def start(
    tmp: Path, auth: bool, nodes: list[dict[str, Any]], dashboard: bool = False
) -> RayCluster:
    """Start a cluster of `nodes` (the first is the head) through the helper; its log and
    token file go in `tmp`. Raises ClusterError if it does not come up."""
    spec = json.dumps({"auth": auth, "dashboard": dashboard, "nodes": nodes})
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
        raise ClusterError(
            f"the Ray cluster did not start:\n{(tmp / 'cluster.log').read_text()[-3000:]}"
        )
    info = json.loads(line)
    token_file = None
    if info["token"]:
        token_file = tmp / "ray-token"
        token_file.write_text(info["token"])
    return RayCluster(
        proc, info["address"], info["token"], token_file, log, info["dashboard"], info["pids"]
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


# -- the helper process -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    spec = json.loads(sys.argv[1])
    token = secrets.token_hex(16) if spec["auth"] else None
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    if token is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    else:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.pop("RAY_AUTH_TOKEN", None)
    # A short private dir: Ray's socket paths must fit in 107 bytes.
    temp_dir = tempfile.mkdtemp(prefix="gh-ray-", dir="/tmp")
    from ray.cluster_utils import Cluster

    head, *others = spec["nodes"]
    dashboard = bool(spec.get("dashboard"))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **head,
            "include_dashboard": dashboard,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": _free_port(),
            # Not Ray's fixed default (52365): another cluster on this machine may hold it.
            "dashboard_agent_listen_port": _free_port(),
            "temp_dir": temp_dir,
        },
        shutdown_at_exit=False,
    )
    try:
        for node in others:
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        pids = [
            p.process.pid
            for n in cluster.list_all_nodes()
            for ps in n.all_processes.values()
            for p in ps
        ]
        webui = cluster.head_node.address_info.get("webui_url") if dashboard else None
        info = {"address": cluster.address, "token": token, "dashboard": webui, "pids": pids}
        print(json.dumps(info), flush=True)
        for line in sys.stdin:
            if line.strip() == "state":
                print(json.dumps(_state(cluster)), flush=True)
            elif line.strip() == "stop":
                break
    finally:
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    print("stopped", flush=True)
    return 0


def _state(cluster: Any) -> dict[str, Any]:
    actors = [
        {"name": a.get("Name"), "state": a.get("State"), "pid": a.get("Pid")}
        for a in cluster.global_state.actor_table(None).values()
        if a.get("State") != "DEAD"
    ]
    groups = [
        {"name": g.get("name"), "state": g.get("state"), "strategy": g.get("strategy")}
        for g in cluster.global_state.placement_group_table().values()
        if g.get("state") != "REMOVED"
    ]
    return {"actors": actors, "placement_groups": groups}


if __name__ == "__main__":
    sys.exit(main())
