"""Where a multi-worker job's workers meet on Slurm: each node by the address Slurm reaches
it at (its NodeAddr, which need not be its name), and one port per worker that is free on
every node of the allocation.

Runs in the gang's batch step (gpuhop.backends.slurm.gang), which asks every node at once,
with one short `srun` step of one task per node, before any worker starts:
`python -m gpuhop.backends.slurm.rendezvous CHECK` runs there (CHECK: JSON of the candidate
ports and the peers' addresses) and prints, as one JSON line, its node's name, which of the
candidates it can bind, and which peer addresses it cannot resolve. The gang takes the
first ports free everywhere; a window of candidates with too few is followed by the next,
so a port in use somewhere changes the choice, not the job's fate.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import zlib
from collections.abc import Callable
from typing import Any

# Below Linux's default ephemeral range (32768-60999), from which every client socket on a
# node takes its port: a gang's port drawn from there could be taken by any connection.
# A site sets its own ([slurm] ports in agent.toml): its firewalls must let the nodes reach
# each other on them.
DEFAULT_PORTS = (20000, 32000)
WINDOW = 32  # candidates asked about at once (more for a larger gang)
ROUNDS = 4  # windows tried before the gang gives up
COMMAND_TIMEOUT = 60.0
ProbeNodes = Callable[[dict[str, Any]], list[dict[str, Any]]]


class RendezvousError(Exception):
    """The workers cannot meet; the message says why, in words a user can act on."""


def base_port(slurm_id: str, ports: tuple[int, int] = DEFAULT_PORTS) -> int:
    """Where the first choice starts: the Slurm job id hashed into the range, so that two
    jobs starting together on one node are unlikely to ask for the same ports."""
    low, high = ports
    return low + zlib.crc32(slurm_id.encode()) % (high - low + 1)


def candidates(start: int, count: int, ports: tuple[int, int]) -> list[int]:
    """`count` ports from `start` on, wrapping round within the (inclusive) range."""
    low, high = ports
    size = high - low + 1
    return [low + (start - low + i) % size for i in range(min(count, size))]


def node_addresses(names: list[str]) -> dict[str, str]:
    """Each node's NodeAddr (what Slurm itself connects to), by node name, from `sinfo`."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%o"],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=True,
    )
    addresses = {}
    for line in out.stdout.splitlines():
        name, _, addr = line.strip().partition("|")
        if name:
            addresses[name] = addr or name
    missing = [n for n in names if n not in addresses]
    if missing:
        raise RendezvousError(f"sinfo gives no address for node(s) {', '.join(missing)}")
    return addresses


def choose(
    slurm_id: str,
    workers: int,
    peers: list[str],
    ports: tuple[int, int],
    probe: ProbeNodes,
) -> tuple[list[int], list[str]]:
    """One port per worker, free on every node, and what the choice had to avoid (for the
    job's log). `probe` asks each node (see `srun_probe`). Raises RendezvousError."""
    size = ports[1] - ports[0] + 1
    if workers > size:
        raise RendezvousError(
            f"{workers} workers need {workers} ports; the range {ports[0]}-{ports[1]} has {size}"
        )
    window = max(WINDOW, 4 * workers)
    start = base_port(slurm_id, ports)
    avoided: list[str] = []
    asked: set[int] = set()
    for _ in range(ROUNDS):
        wanted = [p for p in candidates(start, window, ports) if p not in asked]
        if not wanted:
            break
        asked.update(wanted)
        answers = probe({"ports": wanted, "peers": sorted(set(peers))})
        _check_resolved(answers)
        free = [p for p in wanted if all(p in a["free"] for a in answers)]
        first = wanted[:workers]
        if free[:workers] != first and not avoided:
            busy = {p: [a["node"] for a in answers if p not in a["free"]] for p in first}
            avoided = [f"{p} on {', '.join(n)}" for p, n in busy.items() if n]
        if len(free) >= workers:
            return free[:workers], avoided
        start = wanted[-1] + 1
    raise RendezvousError(
        f"no {workers} ports of {ports[0]}-{ports[1]} are free on every node of the"
        f" allocation (asked about {len(asked)}); run the job again, or widen the range"
        " ([slurm] ports in the agent's agent.toml)"
    )


def _check_resolved(answers: list[dict[str, Any]]) -> None:
    for answer in answers:
        if answer["unresolved"]:
            addr, why = sorted(answer["unresolved"].items())[0]
            raise RendezvousError(
                f"node {answer['node']} cannot resolve its peer's address {addr} ({why}):"
                " the workers could not reach each other. Slurm's NodeAddr for each node"
                " must be an address the other nodes resolve"
            )


def srun_probe(python: str, nodes: int) -> ProbeNodes:
    """A `probe` for `choose`: one task on each of the allocation's `nodes`, as a step of
    the job (the gang's batch step runs inside the allocation)."""

    def probe(check: dict[str, Any]) -> list[dict[str, Any]]:
        argv = ["srun", "--quiet", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1"]
        # --overlap: the check holds none of the allocation's CPUs for the workers' step that
        # follows. Without it, a busy node's slurmd still tearing the check's step down kept
        # the workers' step waiting ("Requested nodes are busy") for as long as that took.
        argv += ["--overlap", "--kill-on-bad-exit=1", "--export=ALL", python, "-m", __name__]
        argv.append(json.dumps(check))
        try:
            out = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as e:
            raise RendezvousError(f"could not ask the nodes for free ports: {e}") from None
        answers = []
        for line in out.stdout.splitlines():
            try:
                answers.append(json.loads(line))
            except ValueError:
                continue
        if out.returncode != 0 or len(answers) != nodes:
            said = " | ".join(out.stderr.strip().splitlines()[-3:]) or f"code {out.returncode}"
            raise RendezvousError(f"the check on the allocation's nodes failed: {said}")
        return answers

    return probe


def bindable(port: int) -> bool:
    """Whether a server could listen on `port` on every interface of this node now. With
    SO_REUSEADDR, as TensorFlow's gRPC server binds: a port that only has connections in
    TIME_WAIT (a gang that just ended) is free to it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def answer(check: dict[str, Any]) -> dict[str, Any]:
    """This node's answer to the gang's question (runs on each node)."""
    unresolved = {}
    for addr in check["peers"]:
        try:
            socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
        except OSError as e:
            unresolved[addr] = str(e)
    return {
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "free": [p for p in check["ports"] if bindable(p)],
        "unresolved": unresolved,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m gpuhop.backends.slurm.rendezvous CHECK", file=sys.stderr)
        return 2
    print(json.dumps(answer(json.loads(argv[0]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
