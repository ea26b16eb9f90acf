"""Runs on the first node of a multi-worker job's Slurm allocation, as its batch step: works
out where each worker runs and on which port, launches them all together with `srun` (one
task per worker, gpuhop.backends.slurm.task), and writes how the gang ended to the exit file
that the leader (gpuhop.backends.slurm.leader) reads.

`python -m gpuhop.backends.slurm.gang SPEC`. Worker I is Slurm task I (SLURM_PROCID), put on
the allocation's nodes in order (`--distribution=block`), as many on each as
SLURM_TASKS_PER_NODE says. Its peers reach it at its node's NodeAddr (Slurm's own address
for the node, which need not be its name), on a port free on every node of the allocation
(gpuhop.backends.slurm.rendezvous: one short step on each node checks the ports and that
every peer's address resolves there); each worker checks its own again as it starts. Each
worker but worker 0 runs in a copy of the job's files made here before any starts
(gpuhop.backends.slurm.workerdirs); only worker 0's come back. One worker failing ends the
others (`srun --kill-on-bad-exit=1`), and the job ends as that worker did.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuhop.backends.local.leader import how, peers_hint
from gpuhop.backends.slurm import rendezvous, workerdirs
from gpuhop.backends.slurm.task import PEERS_VAR, worker_exit_file, write_exit

_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def hostnames(nodelist: str) -> list[str]:
    """The allocation's nodes, in Slurm's order (`scontrol show hostnames`)."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.split()


def task_hosts(hosts: list[str], tasks_per_node: str) -> list[str]:
    """Each task's node under block distribution: SLURM_TASKS_PER_NODE ("2,1(x3)") gives
    how many tasks each node of `hosts` runs, in order."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = _COUNT.match(part.strip())
        if m is None:
            raise ValueError(f"cannot read SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    if len(counts) != len(hosts):
        raise ValueError(f"SLURM_TASKS_PER_NODE={tasks_per_node!r} does not match {hosts}")
    return [host for host, n in zip(hosts, counts, strict=True) for _ in range(n)]


def ending(spec: dict[str, Any], srun_code: int) -> dict[str, Any]:
    """How the gang ended, from each worker's exit file: the first worker to fail (by the
    time it ended) and how many others were stopped."""
    outcomes: dict[int, dict[str, Any]] = {}
    for i in range(spec["workers"]):
        with contextlib.suppress(OSError, ValueError):
            outcomes[i] = json.loads(worker_exit_file(spec, i).read_text())
    failed = [
        (o.get("ended_at", 0.0), i)
        for i, o in outcomes.items()
        if o["signal"] is not None or o["exit_code"] != 0
    ]
    if not failed:
        if srun_code == 0 and len(outcomes) == spec["workers"]:
            return {"exit_code": 0, "signal": None}
        if srun_code < 0:
            return {"exit_code": None, "signal": -srun_code}
        return {
            "exit_code": srun_code or 1,
            "signal": None,
            "detail": f"srun ended with code {srun_code}; see the job's log",
        }
    _, index = min(failed)
    outcome = {k: outcomes[index][k] for k in ("exit_code", "signal")}
    if "detail" in outcomes[index]:
        outcome["detail"] = f"worker {index}: {outcomes[index]['detail']}"
        return outcome
    ok = sum(
        1 for i, o in outcomes.items() if i != index and (o["exit_code"], o["signal"]) == (0, None)
    )
    stopped = spec["workers"] - 1 - ok
    detail = f"worker {index} {how(outcome)} first"
    if stopped:
        detail += f"; {stopped} other worker{'s were' if stopped > 1 else ' was'} stopped"
    detail += peers_hint(spec["worker_logs"][index], spec.get("worker_timeout"), index)
    return {**outcome, "detail": detail}


def run(spec: dict[str, Any], spec_path: str) -> dict[str, Any]:
    workers = spec["workers"]
    for i in range(workers):
        worker_exit_file(spec, i).unlink(missing_ok=True)
    slurm_id = os.environ.get("SLURM_JOB_ID", "0")
    try:
        names = hostnames(os.environ["SLURM_JOB_NODELIST"])
        hosts = task_hosts(names, os.environ["SLURM_TASKS_PER_NODE"])[:workers]
        addresses = rendezvous.node_addresses(names)
    except (
        OSError,
        KeyError,
        ValueError,
        subprocess.SubprocessError,
        rendezvous.RendezvousError,
    ) as e:
        print(f"gpuhop: could not start: cannot place the workers: {e}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": f"could not place the workers: {e}"}
    peers_at = [addresses[h] for h in hosts]
    low, high = spec.get("ports") or rendezvous.DEFAULT_PORTS
    probe = rendezvous.srun_probe(spec["python"], len(names))
    try:
        ports, avoided = rendezvous.choose(slurm_id, workers, peers_at, (low, high), probe)
    except rendezvous.RendezvousError as e:
        print(f"gpuhop: could not start: {e}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": f"could not start: {e}"}
    if avoided:
        print(f"gpuhop: in use, so not chosen: port {'; port '.join(avoided)}", flush=True)
    try:
        workerdirs.prepare(spec)
    except OSError as e:
        workerdirs.remove(spec)
        why = f"cannot copy the job's files for the workers but worker 0: {e}"
        print(f"gpuhop: could not start: {why}", flush=True)
        return {"exit_code": 1, "signal": None, "detail": f"could not start: {why}"}
    try:
        return _launch(spec, spec_path, hosts, {"hosts": peers_at, "ports": ports})
    finally:
        workerdirs.remove(spec)


def _launch(
    spec: dict[str, Any], spec_path: str, hosts: list[str], peers: dict[str, Any]
) -> dict[str, Any]:
    """srun the workers, each told of its peers; how the gang ended."""
    workers, ports = spec["workers"], peers["ports"]
    argv = ["srun", "--kill-on-bad-exit=1", "--distribution=block", f"--ntasks={workers}"]
    argv += ["--export=ALL", spec["python"], "-m", "gpuhop.backends.slurm.task", spec_path]
    env = dict(os.environ, **{PEERS_VAR: json.dumps(peers)})
    where = ", ".join(sorted(set(hosts)))
    print(f"gpuhop: {workers} workers on {where}, ports {', '.join(map(str, ports))}", flush=True)
    print(
        "gpuhop: each worker has its own copy of the work dir and checkpoints; worker 0's"
        " files come back",
        flush=True,
    )
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)

    def forward(sig: int, _frame: object) -> None:
        proc.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    return ending(spec, proc.wait())


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpuhop.backends.slurm.gang SPEC", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    write_exit(Path(spec["exit_file"]), run(spec, argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
