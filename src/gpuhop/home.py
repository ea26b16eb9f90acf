"""Runs in the agent and in the client that starts a local agent: the layout of GPUHOP_HOME."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import NamedTuple

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107

# The XDG base directories (the XDG Base Directory Specification): each kind's variable,
# and where it defaults to under the home directory.
XDG_DIRS = {
    "data": ("XDG_DATA_HOME", ".local/share"),
    "config": ("XDG_CONFIG_HOME", ".config"),
    "cache": ("XDG_CACHE_HOME", ".cache"),
}


def user_dir(kind: str) -> Path:
    """gpuhop's per-user "data", "config" or "cache" dir, where platformdirs puts it.

    On Linux that is the XDG base dir, read here: its variable where that is an absolute
    path (unset, empty or relative counts as unset), else its default under $HOME, and
    "gpuhop" in it; importing platformdirs (with tempfile, shutil and random) would cost
    every command about 15 ms of its start. Elsewhere (macOS), and where $HOME is not an
    absolute path, platformdirs says. tests/unit/test_home.py checks the two agree."""
    if kind not in XDG_DIRS:
        raise ValueError(f"no per-user dir of kind {kind!r} (one of: {', '.join(XDG_DIRS)})")
    variable, default = XDG_DIRS[kind]
    home = os.environ.get("HOME")
    if sys.platform.startswith("linux") and home is not None and os.path.isabs(home):
        base = os.environ.get(variable, "")
        return Path(base if os.path.isabs(base) else os.path.join(home, default), "gpuhop")
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_dir")("gpuhop"))


def default_home() -> Path:
    env = os.environ.get("GPUHOP_HOME")
    if env:
        return Path(env).expanduser().absolute()
    return user_dir("data").absolute()


class AgentPaths(NamedTuple):
    """The layout of an agent's state directory. Everything the agent writes lives here.

    (A NamedTuple, as the other records on a command's path: `dataclasses` would load
    `inspect`, some 8 ms of every command's start.)"""

    home: Path

    @property
    def socket(self) -> Path:
        return self.home / "agent.sock"

    @property
    def handoff(self) -> Path:
        """Where a client on this host is handed a job's connected port (0600; see
        gpuhop.agent.server.handoff). No longer a name than the socket's."""
        return self.home / "fwd.sock"

    @property
    def pidfile(self) -> Path:
        return self.home / "agent.pid"

    @property
    def lockfile(self) -> Path:
        return self.home / "agent.lock"

    @property
    def logfile(self) -> Path:
        return self.home / "agent.log"

    @property
    def db(self) -> Path:
        return self.home / "jobs.db"

    @property
    def claims_db(self) -> Path:
        """Which user has uploaded which blob and tree (see gpuhop.agent.storage.claims)."""
        return self.home / "claims.db"

    @property
    def tokens_db(self) -> Path:
        """Hashes of the bearer tokens of the TCP listener, and whose they are."""
        return self.home / "tokens.db"

    @property
    def images_db(self) -> Path:
        """Which container images gpuhop pulled or ran jobs in, for whom, and when last
        (see gpuhop.agent.storage.imageuses)."""
        return self.home / "images.db"

    @property
    def secrets_db(self) -> Path:
        """Users' secrets, by user and name (0600, in a 0700 dir that no job's view shows;
        see gpuhop.agent.storage.secrets)."""
        return self.home / "secrets" / "secrets.db"

    @property
    def tls(self) -> Path:
        """The TLS listener's own certificate and key (0700 dir, key 0600)."""
        return self.home / "tls"

    @property
    def listen_file(self) -> Path:
        """Written while a TCP listener is open: its address and certificate fingerprint."""
        return self.home / "listen.json"

    @property
    def quarantine(self) -> Path:
        """The GPUs taken out of service for a hardware fault (see agent.host.quarantine)."""
        return self.home / "quarantine.json"

    @property
    def fake_gpus_seam(self) -> Path:
        """Read by an agent with --fake-gpus: each fake GPU's load and faults, for tests."""
        return self.home / "fake-gpus.json"

    @property
    def blobs(self) -> Path:
        return self.home / "blobs"

    @property
    def tmp(self) -> Path:
        return self.home / "tmp"

    @property
    def trees(self) -> Path:
        return self.home / "trees"

    @property
    def jobs(self) -> Path:
        return self.home / "jobs"

    @property
    def ready(self) -> Path:
        """The dirs of containers started ahead of their image jobs (each a mount point the
        job's own dirs are bound in: gpuhop.backends.local.ready)."""
        return self.home / "ready"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs / job_id

    def user_home(self, uid: int) -> Path:
        """HOME of the jobs that run as `uid` in a home of the agent's making (pip's, Keras's
        and Hugging Face's caches, kept across its jobs): a team agent's identity's (where
        gpuhop.agent.host.identities makes it), and a single-user agent's own for its jobs in
        a container image (which must not see the host's home, the state dir in it)."""
        return self.home / "users" / str(uid) / "home"

    def ensure(self) -> None:
        """Create the state dir (0700) and its subdirectories."""
        self.home.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        for sub in (self.blobs, self.trees, self.tmp, self.jobs):
            sub.mkdir(exist_ok=True)
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise ValueError(
                f"the agent's socket path {self.socket} is longer than {MAX_SOCKET_PATH} bytes;"
                " set GPUHOP_HOME to a shorter directory"
            )


class JobPaths(NamedTuple):
    """The files of one job, under `<home>/jobs/<id>/`."""

    root: Path

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def log(self) -> Path:
        return self.root / "output.log"

    def worker_log(self, index: int) -> Path:
        """A multi-worker job's own log of one worker (the job log has them all, prefixed)."""
        return self.root / f"worker-{index}.log"

    @property
    def gang(self) -> Path:
        """A multi-worker job's worker list, read by the leader."""
        return self.root / "gang.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def tensorboard(self) -> Path:
        """Where the job writes TensorBoard event files (`$GPUHOP_TENSORBOARD_DIR`): part of
        its artifacts, so they come back with `gpuhop pull`."""
        return self.artifacts / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tmp(self) -> Path:
        """The job's private temporary dir: its `/tmp` (and `$TMPDIR`, unless the job sets
        its own) while it runs. Its attempts share it, and it is kept after the job ends, with
        the rest of the job's files, for `pull` and `serve`."""
        return self.root / "tmp"

    @property
    def control(self) -> Path:
        """Requests to the job's processes and their answers (`gpuhop profile`: a FIFO per
        TensorFlow or JAX process, see gpuhop.runtime.profiling). The job's own: the agent
        opens nothing there but a FIFO or a regular file, and follows no link."""
        return self.root / "control"

    @property
    def tree(self) -> Path:
        """The job's own copy of its work-dir tree."""
        return self.root / "tree.json"

    @property
    def provenance(self) -> Path:
        """What the job ran on, as its first Python process saw it (written by the job:
        gpuhop.runtime.provenance); the agent's half is `host_record`."""
        return self.root / "ran-on.txt"

    @property
    def host_record(self) -> Path:
        """What the job ran on, as the agent saw it at the job's first start: gpuhop's
        version, the tree, the GPUs and their driver."""
        return self.root / "ran-on-host.json"

    @property
    def energy(self) -> Path:
        """The GPU energy and GPU time of each of the job's attempts, kept by the agent
        while they run (gpuhop.agent.jobs.energy); the job never sees it."""
        return self.root / "energy.json"

    @property
    def materialised(self) -> Path:
        """Touched once the work dir is made from its tree: a synced file whose mtime is
        older is as it was synced (see `gpuhop.agent.services.workdir`)."""
        return self.root / "work.materialised"

    @property
    def status(self) -> Path:
        """Written by the leader when the job's process ends: its exit status."""
        return self.root / "status.json"

    @property
    def leader_pid(self) -> Path:
        """Written by the attempt's leader first: its pid (and, sandboxed, its job's init)."""
        # The file keeps the name it had when the local leader was called the shim: an agent
        # upgraded while jobs run finds the leaders an older one started by this file.
        return self.root / "shim.pid"

    @property
    def relay(self) -> Path:
        """A job with a private network: the Unix socket its leader relays ports from."""
        return self.root / "ports.sock"


# The agent's last line in agent.log when it exits; a starting client watches for it.
EXIT_MARK = b"gpuhop agent exited"


class AgentError(RuntimeError):
    """The agent could not be started or reached; the message says why."""


def read_pid(paths: AgentPaths) -> int | None:
    """The pid of the running agent of this state dir, or None."""
    try:
        fd = os.open(paths.lockfile, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int(paths.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # nobody holds the lock: no agent runs
    finally:
        os.close(fd)
