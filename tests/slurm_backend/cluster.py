"""A real one-node Slurm cluster on this machine for the Slurm backend's tests: its own
munged (with a key made here, on a socket of its own), slurmctld and slurmd, each started
in the foreground by pid with a slurm.conf written into a temp dir (state, spool and logs
there too, ports picked free), and stopped by those pids, leaving nothing behind.

The node is this host, under a Slurm node name that is not a host name (NODE, which does not
resolve) and reached at NodeAddr 127.0.0.1, as on clusters whose node names differ from
their hosts' names: whatever addresses the node by its name fails here. It has 2 CPUs and
2 made-up GPUs (GRES `gpu:2`,
backed by links named gpu0 and gpu1 to /dev/null and /dev/zero: slurmd wants a character
device that exists, and sets CUDA_VISIBLE_DEVICES from the number in the name).
slurmd runs in a mount namespace of its own with an empty tmpfs over `hidden`: a dir of this
host (the login node) that the compute node does not see, as a login node's local disk is
unseen by a real cluster's nodes; everything else is the same filesystem on both sides.
Job ids start at a random number (FirstJobId): clusters started one after another (one per
test module) would otherwise give their jobs the same ids, and so a gang's workers the same
ports (drawn from the job id), while the last cluster's may still be in use.
Accounting storage is off: `sacct` has nothing, so the backend reads states from `squeue`
and exit codes from its batch script.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_ports

BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "squeue",
    "sinfo",
    "scancel",
    "unshare",
)
START_TIMEOUT = 60.0
NODE = "gpuhop-n1"


class ClusterError(Exception):
    """The cluster did not start; the message holds the ends of its logs."""


def missing() -> list[str]:
    """The programs this needs that are not installed (scripts/setup-system installs them)."""
    return [b for b in BINARIES if shutil.which(b, path=f"/usr/sbin:{os.environ['PATH']}") is None]


def _free_ports(n: int) -> list[int]:
    return free_ports(n)


@dataclass
class SlurmCluster:
    root: Path
    node: str
    conf: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def hidden(self) -> Path:
        """A dir the agent's host sees and the compute node does not (an empty tmpfs there)."""
        return self.root / "login-only"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", self.node, "-o", "%T").strip()

    def jobs(self) -> list[str]:
        """The ids of the jobs Slurm still holds (any state squeue shows)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def logs(self) -> str:
        out = []
        for name in ("munged.log", "slurmctld.log", "slurmd.log"):
            with contextlib.suppress(OSError):
                out.append(f"--- {name}\n{(self.root / name).read_text()[-3000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel every job, then end the daemons by pid (TERM, then KILL)."""
        with contextlib.suppress(ClusterError, OSError, subprocess.SubprocessError):
            if any(p.poll() is None for p in self.procs):
                subprocess.run(
                    ["scancel", "--full", "-u", str(os.getuid())],
                    env=self.env,
                    capture_output=True,
                    timeout=30,
                )
                deadline = time.monotonic() + 30
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.2)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _write_conf(root: Path, node: str, host: str) -> Path:
    ctld_port, slurmd_port = _free_ports(2)
    gres_files = [root / "dev" / f"gpu{i}" for i in range(2)]
    (root / "dev").mkdir()
    for f, dev in zip(gres_files, ("/dev/null", "/dev/zero"), strict=True):
        f.symlink_to(dev)  # slurmd wants a character device; the name gives the index
    for d in ("state", "spool"):
        (root / d).mkdir()
    socket_path = root / "munge" / "munge.socket"
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=gpuhoptest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
FirstJobId={random.randint(1000, 9_000_000)}
SchedulerParameters=sched_interval=1
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=2
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
    )
    (root / "gres.conf").write_text(f"NodeName={node} Name=gpu File={root / 'dev'}/gpu[0-1]\n")
    return conf


def start(root: Path) -> SlurmCluster:
    """Start munged, slurmctld and slurmd under `root`; wait for the node to be idle."""
    node = NODE
    conf = _write_conf(root, node, socket.gethostname().split(".")[0])
    cluster = SlurmCluster(root, node, conf)
    munge = root / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    env = cluster.env
    try:

        def spawn(argv: list[str], log: str) -> None:
            out = open(root / log, "ab")  # noqa: SIM115
            with out:
                cluster.procs.append(
                    subprocess.Popen(
                        argv,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )

        spawn(
            [
                "/usr/sbin/munged",
                "-F",
                "--force",
                f"--socket={munge / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={munge / 'munged.pid'}",
                f"--seed-file={munge / 'seed'}",
                f"--log-file={root / 'munged.log'}",
            ],
            "munged.out",
        )
        _wait(lambda: (munge / "munge.socket").exists(), cluster, "munged's socket")
        spawn(["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)], "slurmctld.out")
        cluster.hidden.mkdir()
        # `unshare` and `sh` exec slurmd: its pid is the one started here.
        hide = f'mount -t tmpfs gpuhop-test-node {cluster.hidden} && exec "$@"'
        slurmd = ["/usr/sbin/slurmd", "-D", "-f", str(conf), "-N", node]
        spawn(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", hide, "sh", *slurmd],
            "slurmd.out",
        )
        _wait(lambda: _idle(cluster), cluster, f"node {node} idle in sinfo")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _idle(cluster: SlurmCluster) -> bool:
    for p in cluster.procs:
        if p.poll() is not None:
            raise ClusterError(f"{p.args[0]} exited with {p.returncode}\n{cluster.logs()}")
    try:
        return cluster.node_state() == "idle"
    except ClusterError:
        return False


def _wait(pred, cluster: SlurmCluster, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + START_TIMEOUT
    while not pred():
        if time.monotonic() > deadline:
            raise ClusterError(f"no {what} within {START_TIMEOUT:.0f}s\n{cluster.logs()}")
        time.sleep(0.2)
