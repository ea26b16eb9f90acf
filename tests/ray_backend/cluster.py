"""A Ray cluster of several nodes on this machine, for the Ray backend's tests and for
bench/ray_backend.py. No pytest here: the benchmark imports it too.

`start(...)` runs `python -m tests.ray_backend.cluster SPEC` as a helper process, so Ray's
threads, warnings and C++ runtime never enter the caller's process, and returns a
`RayCluster` that talks to it. SPEC is JSON: {"auth": true|false, "dashboard": true|false,
"nodes": [{"num_cpus": 1, "num_gpus": 1}, ...]}, the first node being the head. The helper
starts the cluster with `ray.cluster_utils.Cluster` (with token authentication when "auth":
a fresh random token; with Ray's dashboard, and so its job API, on a loopback port when
"dashboard") in a private temp dir that is also Ray's default one (`RAY_TMPDIR`), so that
nothing is written to, or needed in, `/tmp/ray`. Without the dashboard the cluster runs lean
(`LEAN_NODE`, `LEAN_CONFIG`: only what gpuhop and the tests use), and none of its Python
processes imports `rfc3987_syntax` (`_without_rfc3987_syntax`). It prints one JSON line
{"address", "token", "dashboard", "pids", "temp_dir"}, and then answers lines on stdin:

- `state`: one JSON line with the cluster's live actors and placement groups not removed;
- `stop` (or end of input): shuts the cluster down (by the pids Ray recorded for each node)
  and prints `stopped`.

If the cluster does not come up, the helper kills every process Ray had started (by the pids
Ray recorded, and every process descended from the helper) before it prints one JSON line
{"error", "pids", "temp_dir"} and exits; `start` raises ClusterError with those pids.

The helper is a child subreaper, so Ray's processes stay its descendants even where one of
them double-forks, and `RayCluster.stop` can check by pid that none survives (`ray stop`
would kill every Ray process on the machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]


# How long a cluster may take to come up (a loaded 2-core machine takes up to a minute).
START_TIMEOUT = 240.0


class ClusterError(RuntimeError):
    """The helper could not start the cluster; the message has the end of its log. `pids`
    are the processes Ray had started, all ended by the time this is raised; `temp_dir` is
    the cluster's temp dir (removed)."""

    def __init__(self, message: str, pids: list[int] | None = None, temp_dir: str = "") -> None:
        super().__init__(message)
        self.pids = pids or []
        self.temp_dir = temp_dir


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
    temp_dir: str = ""  # the cluster's own temp dir (Ray's default one in the helper)

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
        assert not self.temp_dir or not Path(self.temp_dir).exists(), (
            f"the cluster's temp dir {self.temp_dir} outlived it"
        )


# Ray waits a fixed 30 s for a new node's raylet to register with the GCS (ray/_private/
# node.py: `raylet_start_wait_time_s`, not configurable), which a 2-core machine running
# other tests beside can exceed; a start that fails so is tried again, from nothing.
RAY_STARTUP_TIMED_OUT = "timed out during startup"
START_TRIES = 3


def start(
    tmp: Path, auth: bool, nodes: list[dict[str, Any]], dashboard: bool = False
) -> RayCluster:
    """Start a cluster of `nodes` (the first is the head) through the helper; its log and
    token file go in `tmp`. Raises ClusterError if it does not come up."""
    for tries_left in reversed(range(START_TRIES)):
        try:
            return _start(tmp, auth, nodes, dashboard)
        except ClusterError as e:
            if RAY_STARTUP_TIMED_OUT not in str(e).split("\n", 1)[0] or not tries_left:
                raise
    raise AssertionError("unreachable")


def _start(tmp: Path, auth: bool, nodes: list[dict[str, Any]], dashboard: bool) -> RayCluster:
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
    line = _first_line(proc, START_TIMEOUT)
    info: dict[str, Any] = json.loads(line) if line.startswith("{") else {}
    if "address" not in info:
        _end_helper(proc, log)
        tail = (tmp / "cluster.log").read_text(errors="replace")[-3000:]
        said = info.get("error") or (
            f"no answer in {START_TIMEOUT:.0f} s" if not line else f"it said {line!r}"
        )
        raise ClusterError(
            f"the Ray cluster did not start: {said}\n{tail}",
            info.get("pids", []),
            info.get("temp_dir", ""),
        )
    token_file = None
    if info["token"]:
        token_file = tmp / "ray-token"
        token_file.write_text(info["token"])
    return RayCluster(
        proc,
        info["address"],
        info["token"],
        token_file,
        log,
        info["dashboard"],
        info["pids"],
        info["temp_dir"],
    )


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    """The helper's first line, or "" if it says nothing within `timeout` (or exits)."""
    stdout = proc.stdout
    assert stdout is not None
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0] if out else ""


def _end_helper(proc: subprocess.Popen[str], log: IO[str]) -> None:
    """After a failed start: the helper has torn the cluster down and exits by itself; one
    that hangs is killed with every process under it."""
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
    log.close()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


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
    return free_port()


# How long a new node may take to register with the GCS here, where Ray allows 30 s. A
# two-node start takes about 50 s on this 2-core machine beside a whole run; in two whole runs
# made beside other test runs too (load average 10-14), a node did not register in 60 s.
# Two nodes' worst case stays within START_TIMEOUT and a test's time limit.
REGISTER_PATIENCE = 100.0


def _patient_node_lookup() -> None:
    """Give a new node's raylet `REGISTER_PATIENCE` to register with the GCS. Ray's
    `Node.__init__` asks the GCS for the node (`services.get_node`, which raises
    RuntimeError until it is there, or when the GCS's answer is late: 'Deadline Exceeded')
    for a fixed 30 s, not configurable, and then gives the cluster up: on a 2-core machine
    running other tests beside it, a raylet and a busy GCS can take longer, and three
    starts from nothing in a row failed so. Here, in the helper process only, each lookup
    waits out the raylet itself (a test cluster on a loaded machine, not a Ray under test)."""
    import ray._private.services as services

    lookup = services.get_node

    def patient(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + REGISTER_PATIENCE
        while True:
            try:
                return lookup(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    services.get_node = patient


def main() -> int:
    spec = json.loads(sys.argv[1])
    _become_subreaper()
    token = secrets.token_hex(16) if spec["auth"] else None
    os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
    if token is not None:
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token
    else:
        os.environ["RAY_AUTH_MODE"] = "disabled"
        os.environ.pop("RAY_AUTH_TOKEN", None)
    # A short private dir: Ray's socket paths must fit in 107 bytes. Ray's default temp dir
    # ($RAY_TMPDIR/ray) is made the cluster's own: `Cluster` writes its address file
    # (ray_current_cluster) there whatever temp_dir it is given, and that must not need, or
    # touch, a /tmp/ray that may not exist or may belong to another cluster.
    # No idle workers started ahead of need: each is a Python process that imports Ray (seconds of
    # CPU on a 2-core machine), and the tests' actors start their own.
    os.environ.update(  # Ray's config names are case-sensitive
        {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
    )
    root = tempfile.mkdtemp(prefix="gh-ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = root
    temp_dir = os.path.join(root, "ray")
    os.mkdir(temp_dir)
    _without_rfc3987_syntax(root)
    head, *others = spec["nodes"]
    dashboard = bool(spec.get("dashboard"))
    if not dashboard:
        os.environ.update(LEAN_CONFIG)
    lean = {} if dashboard else LEAN_NODE
    # Ray's processes (the GCS, raylets, workers: all this process's children) go before the
    # tests that run beside them on a busy machine, as a real cluster's nodes have their
    # cores to themselves: Ray gives a new raylet a fixed 30 s to register (`start`). Where
    # this process may not raise its priority (not root), it runs as it is.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    cluster: Any = None
    try:
        from ray.cluster_utils import Cluster

        _patient_node_lookup()
        cluster = Cluster(shutdown_at_exit=False)
        cluster.add_node(
            **head,
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            dashboard_port=_free_port(),
            # Not Ray's fixed default (52365): another cluster on this machine may hold it.
            dashboard_agent_listen_port=_free_port(),
            temp_dir=temp_dir,
            **lean,
        )
        for node in others:
            # Every node's agent on a port of its own: Ray gives a node other than the head
            # its fixed default (52365), which another cluster's node may hold, and a node
            # whose agent cannot listen never registers.
            cluster.add_node(**node, **lean, dashboard_agent_listen_port=_free_port())
        cluster.wait_for_nodes()
    except BaseException as e:
        traceback.print_exc()
        killed = _tear_down(cluster)
        shutil.rmtree(root, ignore_errors=True)
        error = f"{type(e).__name__}: {e}"
        print(json.dumps({"error": error, "pids": killed, "temp_dir": root}), flush=True)
        return 1
    try:
        webui = cluster.head_node.address_info.get("webui_url") if dashboard else None
        info = {
            "address": cluster.address,
            "token": token,
            "dashboard": webui,
            "pids": _recorded_pids(cluster),
            "temp_dir": root,
        }
        print(json.dumps(info), flush=True)
        for line in sys.stdin:
            if line.strip() == "state":
                print(json.dumps(_state(cluster)), flush=True)
            elif line.strip() == "stop":
                break
    finally:
        cluster.shutdown()
        _tear_down(cluster)  # whatever Ray's own shutdown left (none, normally)
        shutil.rmtree(root, ignore_errors=True)
    print("stopped", flush=True)
    return 0


# A cluster without the dashboard (the tests' clusters) runs no Python process that nothing
# uses: no autoscaler monitor (the nodes are fixed) and no log monitor (it streams workers'
# output to drivers, and gpuhop's drivers ask for none: `log_to_driver=False`). Each is a
# process that imports Ray and then polls. The bench's cluster, with the dashboard, keeps
# everything `ray start --head` starts.
LEAN_NODE = {"no_monitor": True, "include_log_monitor": False}
# Nor does it do what no test looks at: no usage stats (the dashboard's process would try to
# send them out), no metrics (every node's agent and every Ray process would collect and
# export them every few seconds), no memory monitor (each raylet reads every worker's memory
# four times a second, to kill one before the machine runs out).
LEAN_CONFIG = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_enable_metrics_collection": "0",
    "RAY_memory_monitor_refresh_ms": "0",
}


def _without_rfc3987_syntax(root: str) -> None:
    """Every Python process of the cluster (this one, Ray's daemons, its workers) imports Ray
    without `rfc3987_syntax`. Ray imports jsonschema, which imports that package where it is
    installed (JupyterLab's jupyter-events brings it into the dev venv: a Ray node would not
    have it) and which compiles an Earley grammar at import: 1.5 of the 2 CPU-s that
    `import ray` takes here, paid by every Ray process and every actor's worker. Nothing in
    Ray checks the IRI formats it is for. A module of that name that raises ImportError,
    first on the cluster's PYTHONPATH, is what jsonschema takes for its absence."""
    sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]
    shadow = os.path.join(root, "pythonpath")
    os.mkdir(shadow)
    Path(shadow, "rfc3987_syntax.py").write_text(
        'raise ImportError("not on the Ray test clusters (tests/ray_backend/cluster.py)")\n'
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (shadow, os.environ.get("PYTHONPATH")) if p
    )


def _become_subreaper() -> None:
    """Orphans of Ray's processes are re-parented to this process, not to init, so that
    every process the cluster started stays a descendant of the helper."""
    pr_set_child_subreaper = 36
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _recorded_pids(cluster: Any) -> list[int]:
    """The pids Ray recorded for the cluster's nodes (those it had started so far)."""
    if cluster is None:
        return []
    nodes = [cluster.head_node, *cluster.worker_nodes]
    return [
        p.process.pid for n in nodes if n is not None for ps in n.all_processes.values() for p in ps
    ]


def _tear_down(cluster: Any) -> list[int]:
    """Kill every process the cluster started (the pids Ray recorded and every descendant
    of this process: Ray's daemons ignore SIGTERM), reap them, and return their pids."""
    pids = set(_recorded_pids(cluster)) | _descendants(os.getpid())
    deadline = time.monotonic() + 30
    while True:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap()
        alive = [p for p in pids if _alive(p)]
        late = _descendants(os.getpid()) - pids  # started while we were killing
        if (not alive and not late) or time.monotonic() > deadline:
            break
        pids |= late
        time.sleep(0.05)
    return sorted(pids)


def _reap() -> None:
    """Collect the exit status of every child (re-parented orphans included) that ended."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


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
