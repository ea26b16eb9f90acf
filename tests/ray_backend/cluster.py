"""Runs in tests, in a process of its own: a Ray cluster of several nodes on this machine.

`python -m tests.ray_backend.cluster SPEC` runs as a subprocess of the tests, so Ray's
threads, warnings and C++ runtime never enter pytest's process. SPEC is JSON:
{"auth": true|false, "nodes": [{"num_cpus": 1, "num_gpus": 1}, ...]}, the first node
being the head. It starts the cluster with `ray.cluster_utils.Cluster` (with token
authentication when "auth": a fresh random token), prints one JSON line {"address",
"token", "pids"}, and then answers lines on stdin:

- `state`: one JSON line with the cluster's live actors and placement groups not removed;
- `stop` (or end of input): shuts the cluster down (by the pids Ray recorded for each node)
  and prints `stopped`.

Ray's processes are all descendants of this one, so the fixture that runs it can check by
pid that none survives (`ray stop` would kill every Ray process on the machine).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from typing import Any


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
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **head,
            "include_dashboard": False,
            "dashboard_port": _free_port(),
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
        print(json.dumps({"address": cluster.address, "token": token, "pids": pids}), flush=True)
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
