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

`start(root, nodes=2)` makes a cluster of two nodes, NODES, as a site's are: each slurmd in a
network namespace of its own with its own address on a private test subnet
(tests/netns.py: a bridge on this host, a veth pair per node); a host name of
its own (a UTS namespace), which is its NodeAddr: Slurm reaches it by that name, which its
Slurm name is not (nor does that resolve at all); and a node-local `/tmp` (an empty tmpfs
in its mount namespace), while the cluster's dir (under /var/tmp, where the agents' state
dirs are too) stays the filesystem every node shares. slurmctld listens on this host's end
of the bridge.

The host names resolve from hosts files, as at a site without DNS for its nodes: each node
has its own (`hosts-NODE` in the cluster's dir, bound over its /etc/hosts, which a test may
change: `SlurmCluster.unresolved`) and no DNS server (an empty resolv.conf: a name its hosts
file lacks fails at once, not after DNS timeouts on a network with no way out); the login
node (this host) has its own too (`hosts`: this host's /etc/hosts and the nodes' names),
which slurmctld sees (a mount namespace of its own with it bound over /etc/hosts) and so
does every `srun` started here (Slurm's srun reaches the nodes by their NodeAddr): a
wrapper first on PATH (`SlurmCluster.settings`) runs the real one the same way. This host's
own /etc/hosts is never touched.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.netns import Network
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
NODES = ("gpuhop-n1", "gpuhop-n2")
# On each node of the two-node cluster (in its own /tmp), and not on this host: node-local
# disk, as a site's [slurm] scratch names it.
NODE_SCRATCH = "/tmp/node-scratch"


class ClusterError(Exception):
    """The cluster did not start; the message holds the ends of its logs."""


def missing() -> list[str]:
    """The programs this needs that are not installed (scripts/setup-system installs them)."""
    return [b for b in BINARIES if shutil.which(b, path=f"/usr/sbin:{os.environ['PATH']}") is None]


def _free_ports(n: int) -> list[int]:
    return free_ports(n)


@dataclass
class Node:
    """A compute node: its Slurm name, the address Slurm reaches it at (NodeAddr: on two
    nodes its host name, `ip` what that resolves to), and the argv prefix that runs a
    command there (its namespaces; empty for the one-node cluster)."""

    name: str
    addr: str
    enter: list[str] = field(default_factory=list)
    pid: int = 0  # its slurmd's
    ip: str = ""


def _hostname(name: str) -> str:
    """A node's host name (two-node cluster), which is not its Slurm name."""
    return f"{name.replace('gpuhop-n', 'gpuhop-host')}.test"


def _with_hosts(hosts: Path) -> list[str]:
    """The argv prefix that runs a command in a mount namespace of its own with `hosts`
    bound over /etc/hosts."""
    bind = f'mount --bind {hosts} /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", bind, "sh"]


@dataclass
class SlurmCluster:
    root: Path
    nodes: list[Node]
    conf: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    network: Network | None = None

    @property
    def node(self) -> str:
        """The first node's name (the one-node cluster's only one)."""
        return self.nodes[0].name

    @property
    def hidden(self) -> Path:
        """A dir the agent's host sees and the compute node does not (an empty tmpfs there)."""
        return self.root / "login-only"

    @property
    def settings(self) -> dict[str, str]:
        """What a process on the login node (this host) has in its environment to use the
        cluster: SLURM_CONF, and (two nodes) PATH with the login node's srun first."""
        if self.network is None:
            return {"SLURM_CONF": str(self.conf)}
        path = os.environ.get("PATH", "")
        login = str(self.root / "login-bin")
        if path.split(os.pathsep)[0] != login:
            path = f"{login}{os.pathsep}{path}"
        return {"SLURM_CONF": str(self.conf), "PATH": path}

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.settings}

    @contextlib.contextmanager
    def used_here(self) -> Iterator[None]:
        """`settings` in this process's environment, and so in the agents it starts, until
        the block ends."""
        before = {k: os.environ.get(k) for k in self.settings}
        os.environ.update(self.settings)
        try:
            yield
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def run(self, *argv: str) -> str:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def on(self, index: int, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run `argv` on node `index` (in its slurmd's network and mount namespaces)."""
        ns = ["nsenter", "-t", str(self.nodes[index].pid), "-m", "-n"] if self.network else []
        return subprocess.run([*ns, *argv], capture_output=True, text=True, timeout=30)

    @contextlib.contextmanager
    def ports_held(self, index: int, ports: Iterable[int]) -> Iterator[None]:
        """Servers listening on `ports` on node `index` (a port something there already
        holds is as busy) until the block ends."""
        hold = (
            "import socket, sys\nheld = []\n"
            f"for port in {list(ports)}:\n"
            "    s = socket.socket()\n"
            "    try:\n        s.bind(('', port)); s.listen()\n    except OSError:\n        pass\n"
            "    held.append(s)\n"
            "print('held', flush=True)\nsys.stdin.read()\n"
        )
        ns = ["nsenter", "-t", str(self.nodes[index].pid), "-n"] if self.network else []
        holder = subprocess.Popen(
            [*ns, sys.executable, "-c", hold],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdin is not None and holder.stdout is not None
        with holder:  # its stdin closed at the end: it lets go and exits
            if holder.stdout.readline() != "held\n":
                raise ClusterError(f"could not hold ports on {self.nodes[index].name}")
            yield

    @contextlib.contextmanager
    def unresolved(self, index: int, on: int) -> Iterator[None]:
        """Node `on` (two-node cluster) cannot resolve node `index`'s NodeAddr until the
        block ends: its hosts file lacks the name, which slurmctld, this host and the other
        node still resolve."""
        hosts = self.root / f"hosts-{self.nodes[on].name}"
        kept = hosts.read_text()
        lines = kept.splitlines(keepends=True)
        # Written in place: the file is bound over the node's /etc/hosts by its inode.
        hosts.write_text("".join(x for x in lines if x.split()[1:] != [self.nodes[index].addr]))
        try:
            yield
        finally:
            hosts.write_text(kept)

    def node_state(self) -> str:
        return self.run("sinfo", "-h", "-n", self.node, "-o", "%T").strip()

    def jobs(self) -> list[str]:
        """The ids of the jobs Slurm still holds (any state squeue shows)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def logs(self) -> str:
        out = []
        slurmd = [f"slurmd-{n.name}.log" for n in self.nodes]
        for name in ("munged.log", "slurmctld.log", *slurmd):
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
        if self.network is not None:
            self.network.remove()


def _write_conf(root: Path, nodes: list[Node], host: str, host_addr: str) -> Path:
    ctld_port, slurmd_port = _free_ports(2)
    gres_files = [root / "dev" / f"gpu{i}" for i in range(2)]
    (root / "dev").mkdir()
    for f, dev in zip(gres_files, ("/dev/null", "/dev/zero"), strict=True):
        f.symlink_to(dev)  # slurmd wants a character device; the name gives the index
    for d in ("state", "spool"):
        (root / d).mkdir()
    socket_path = root / "munge" / "munge.socket"
    node_lines = "\n".join(
        f"NodeName={n.name} NodeAddr={n.addr} CPUs=2 Gres=gpu:2 State=UNKNOWN" for n in nodes
    )
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=gpuhoptest
SlurmctldHost={host}({host_addr})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}/%n
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root}/slurmd-%n.log
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
{node_lines}
PartitionName=debug Nodes={",".join(n.name for n in nodes)} Default=YES MaxTime=INFINITE State=UP
"""
    )
    (root / "gres.conf").write_text(
        "".join(f"NodeName={n.name} Name=gpu File={root / 'dev'}/gpu[0-1]\n" for n in nodes)
    )
    return conf


def start(root: Path, nodes: int = 1) -> SlurmCluster:
    """Start munged, slurmctld and `nodes` slurmd's (1 or 2) under `root`; wait for every
    node to be idle. Two nodes need network namespaces (netns.unavailable() says whether
    this machine has them) and a `root` outside /tmp, which is each node's own."""
    if nodes == 1:
        network = None
        members = [Node(NODE, "127.0.0.1")]
        host_addr = "127.0.0.1"
    else:
        if root.resolve().is_relative_to("/tmp"):
            raise ClusterError(f"{root} is under /tmp, which each node has its own of")
        network = Network.make(nodes)
        members = [
            Node(name, _hostname(name), network.enter(i), ip=ip)
            for i, (name, ip) in enumerate(zip(NODES, network.addresses, strict=False))
        ]
        host_addr = network.gateway
    conf = _write_conf(root, members, socket.gethostname().split(".")[0], host_addr)
    cluster = SlurmCluster(root, members, conf, network=network)
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
        login = _login_node(root, members) if network is not None else []
        spawn([*login, "/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf)], "slurmctld.out")
        cluster.hidden.mkdir()
        # A node's own mount namespace: the login-only dir hidden, and (on two nodes) a
        # /tmp of its own. `ip netns exec`, `unshare` and `sh` exec slurmd: its pid is the
        # one started here.
        for node in members:
            (root / "spool" / node.name).mkdir()
            slurmd = ["/usr/sbin/slurmd", "-D", "-f", str(conf), "-N", node.name]
            own = ["unshare", "--mount", "--propagation", "private"]
            setup = [f"mount -t tmpfs gpuhop-test-node {cluster.hidden}"]
            if network is not None:
                own.append("--uts")
                setup += _node_setup(root, members, node)
            own += ["sh", "-c", " && ".join([*setup, 'exec "$@"']), "sh", *slurmd]
            spawn([*node.enter, *own], f"slurmd-{node.name}.out")
            node.pid = cluster.procs[-1].pid
        names = ", ".join(n.name for n in members)
        _wait(lambda: _idle(cluster), cluster, f"node(s) {names} idle in sinfo")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _login_node(root: Path, nodes: list[Node]) -> list[str]:
    """The login node's hosts file (this host's and the nodes' names) and its srun, which
    runs the real one with it (`login-bin/srun`, first on PATH in `settings`); the argv
    prefix that runs slurmctld with it. A job's steps on the nodes have that PATH too
    (sbatch carries the agent's environment): there the wrapper runs srun as it is."""
    hosts = root / "hosts"
    hosts.write_text(Path("/etc/hosts").read_text() + _hosts_lines(nodes))
    here = os.readlink("/proc/self/ns/net")
    srun = shutil.which("srun") or "srun"
    wrapper = root / "login-bin" / "srun"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        f'if [ "$(readlink /proc/self/ns/net)" = {shlex.quote(here)} ]; then\n'
        f'  exec {shlex.join([*_with_hosts(hosts), srun])} "$@"\n'
        "fi\n"
        f'exec {shlex.quote(srun)} "$@"\n'
    )
    wrapper.chmod(0o755)
    return _with_hosts(hosts)


def _shared_under_tmp() -> list[Path]:
    """What the nodes must see that lies under /tmp on this host: the checkout and the
    Python the agent and its jobs run (a fresh clone there, as CI's may be), which a site
    keeps on its shared filesystem. Outermost dirs only."""
    here = Path(__file__).resolve().parents[2]
    found = {p for p in (here, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())}
    under = sorted(p for p in found if p.is_relative_to("/tmp") and p != Path("/tmp"))
    return [p for p in under if not any(p != q and p.is_relative_to(q) for q in under)]


def _node_setup(root: Path, nodes: list[Node], node: Node) -> list[str]:
    """Shell commands that make a node of the two-node cluster in its own mount and UTS
    namespaces: its own /tmp (with NODE_SCRATCH in it, and what it must share with this host
    bound back in at the same paths: `_shared_under_tmp`), and a host name of its own that
    every node resolves to its address from its own hosts file, as a site's hosts files or
    DNS say (Slurm reaches it by that name, its NodeAddr; programs that advertise their
    host's name, as Gloo's collectives under JAX do, then reach it too), and no DNS."""
    hosts = root / f"hosts-{node.name}"
    hosts.write_text("127.0.0.1 localhost\n" + _hosts_lines(nodes))
    no_dns = root / "resolv.conf"
    no_dns.write_text("# no DNS server on the test network: names come from /etc/hosts\n")
    shared = _shared_under_tmp()
    held = [root / "held" / node.name / str(i) for i in range(len(shared))]
    return [
        *(f"mkdir -p {h} && mount --bind {p} {h}" for p, h in zip(shared, held, strict=True)),
        "mount -t tmpfs gpuhop-test-node /tmp",
        *(f"mkdir -p {p} && mount --move {h} {p}" for p, h in zip(shared, held, strict=True)),
        f"mkdir {NODE_SCRATCH}",
        f"mount --bind {hosts} /etc/hosts",
        f"mount --bind {no_dns} /etc/resolv.conf",
        f"hostname {node.addr}",
    ]


def _hosts_lines(nodes: list[Node]) -> str:
    return "".join(f"{n.ip} {n.addr}\n" for n in nodes)


def _idle(cluster: SlurmCluster) -> bool:
    for p in cluster.procs:
        if p.poll() is not None:
            raise ClusterError(f"{p.args[0]} exited with {p.returncode}\n{cluster.logs()}")
    try:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T").split()
    except ClusterError:
        return False
    return states[1::2] == ["idle"] * len(cluster.nodes)


def _wait(pred, cluster: SlurmCluster, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + START_TIMEOUT
    while not pred():
        if time.monotonic() > deadline:
            raise ClusterError(f"no {what} within {START_TIMEOUT:.0f}s\n{cluster.logs()}")
        time.sleep(0.2)
