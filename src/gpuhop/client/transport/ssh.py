"""Runs on the user's machine: reaching a remote agent through the user's own OpenSSH client.

`ssh` itself does the work, so ~/.ssh/config, keys, the ssh-agent and jump hosts all apply.
Per remote there is one multiplexed master connection (ControlMaster; it stays up
CONTROL_PERSIST after the last use) and, through it, a forward from a local Unix socket to
the remote agent's Unix socket: no TCP port is opened on either machine. A command with a
warm connection starts no ssh process at all; it connects to the local socket, which the
master serves.

Host keys are never accepted silently (StrictHostKeyChecking=yes), and ssh never prompts
(BatchMode=yes): an unknown host key or a refused key is a clear error. $GPUHOP_SSH_COMMAND
replaces `ssh` (like GIT_SSH_COMMAND), e.g. `ssh -F ~/work/ssh_config`.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import unquote, urlsplit

from gpuhop.client.embedded import connect, socket_answers
from gpuhop.client.errors import GpuhopError
from gpuhop.client.transport.base import Endpoint
from gpuhop.client.transport.remotes import Remote
from gpuhop.client.transport.remotes import update as update_remote

if TYPE_CHECKING:
    import subprocess

CONTROL_PERSIST = "10m"
CONNECT_TIMEOUT = 15
# How often a client whose tunnel dropped tries to open it again (see ssh_endpoint).
RECONNECT_INTERVAL = 2.0
# The remote agent's state dir when $GPUHOP_HOME is unset there: platformdirs' user data dir.
REMOTE_HOME = "${GPUHOP_HOME:-${XDG_DATA_HOME:-$HOME/.local/share}/gpuhop}"


def ssh_program() -> list[str]:
    return shlex.split(os.environ.get("GPUHOP_SSH_COMMAND") or "ssh")


def runtime_dir() -> Path:
    """A private directory for control and forwarded sockets: short paths (a Unix socket's
    path has at most 107 bytes), owned by this user, mode 0700 (like tmux's /tmp/tmux-UID)."""
    env = os.environ.get("GPUHOP_RUNTIME_DIR")
    if env:
        path = Path(env)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "gpuhop"
    else:
        import tempfile

        path = Path(tempfile.gettempdir()) / f"gpuhop-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise GpuhopError(
            f"{path} is not a directory owned by you; remove it or set GPUHOP_RUNTIME_DIR",
            code="bad_config",
        )
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


class SshTarget(NamedTuple):
    """Where `ssh` connects: ssh://[user@]host[:port] (host may be an alias in ssh_config)."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def from_url(cls, url: str) -> SshTarget:
        parts = urlsplit(url)
        if parts.scheme != "ssh" or not parts.hostname:
            raise GpuhopError(f"not an ssh:// URL: {url!r}", code="bad_request")
        user = unquote(parts.username) if parts.username else None
        return cls(parts.hostname, user, parts.port)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        port = f" port {self.port}" if self.port else ""
        return f"{self.destination}{port}"


class SshConnection:
    """The master connection to one remote host, and commands run through it."""

    def __init__(self, remote: Remote):
        self.remote = remote
        self.target = SshTarget.from_url(remote.url)
        # One master per remote (not per host: two names may reach one host differently).
        self.control_path = runtime_dir() / f"cm-{_key(remote.url)}"

    def argv(self, *options: str) -> list[str]:
        """An ssh command line through the master (started by the first one if none runs)."""
        port = ["-p", str(self.target.port)] if self.target.port else []
        return [
            *ssh_program(),
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            "-o", "ServerAliveInterval=15",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self.control_path}",
            "-o", f"ControlPersist={CONTROL_PERSIST}",
            "-o", "StreamLocalBindUnlink=yes",
            "-o", "ExitOnForwardFailure=yes",
            *port,
            *options,
        ]  # fmt: skip

    def run(
        self,
        script: str,
        *args: str,
        stdin: bytes | None = None,
        timeout: float = 600,
        check: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a POSIX sh `script` with `args` ($1...) on the host; ssh errors are raised."""
        import subprocess  # here and below: a command with a warm connection spawns no ssh

        self.ensure_master()
        remote_cmd = " ".join(shlex.quote(a) for a in ("sh", "-c", script, "sh", *args))
        try:
            result = subprocess.run(
                [*self.argv(), self.target.destination, remote_cmd],
                input=stdin if stdin is not None else b"",
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise GpuhopError(
                f"a command on {self.target} did not finish within {timeout:.0f}s",
                code="unreachable",
            ) from None
        except FileNotFoundError:
            raise _no_ssh() from None
        if result.returncode == 255:
            raise self.error(result.stderr.decode(errors="replace"))
        if check and result.returncode != 0:
            raise GpuhopError(
                f"a command on {self.target} failed (exit {result.returncode}):\n"
                + _tail(result.stderr.decode(errors="replace")),
                code="remote_failed",
            )
        return result

    def master_alive(self) -> bool:
        import subprocess

        try:
            result = subprocess.run(
                [*self.argv("-O", "check"), self.target.destination],
                capture_output=True,
                timeout=30,
            )
        except FileNotFoundError:
            raise _no_ssh() from None
        return result.returncode == 0

    def ensure_master(self) -> None:
        """Open the master connection unless it is up; ssh errors become clear ones."""
        if self.master_alive():
            return
        import subprocess
        import tempfile

        from gpuhop.client.transport.sshcipher import cipher_options  # spawns ssh -G: only here

        # The master carries every byte of the tunnel: AES-GCM first where that is faster.
        ciphers = cipher_options(self.argv(), self.target.destination)
        # -f: ssh goes to the background once authenticated, so this returns then. Its
        # stderr goes to a file: a pipe would be held open by the backgrounded master.
        with tempfile.TemporaryFile() as errors:
            try:
                code = subprocess.run(
                    [
                        *self.argv("-f", "-N", "-o", "ControlMaster=yes", *ciphers),
                        self.target.destination,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    timeout=CONNECT_TIMEOUT * 4,
                ).returncode
            except subprocess.TimeoutExpired:
                raise GpuhopError(
                    f"ssh to {self.target} did not finish connecting", code="unreachable"
                ) from None
            except FileNotFoundError:
                raise _no_ssh() from None
            errors.seek(0)
            text = errors.read().decode(errors="replace")
        if code != 0:
            raise self.error(text)

    def forward(self, local: Path, remote_socket: str) -> None:
        """Serve `remote_socket` (on the host) at `local` (here), through the master."""
        import subprocess

        self.ensure_master()
        result = subprocess.run(
            [
                *self.argv("-O", "forward", "-L", f"{local}:{remote_socket}"),
                self.target.destination,
            ],
            capture_output=True,
            timeout=30,
        )
        if result.returncode != 0:
            raise self.error(result.stderr.decode(errors="replace"))

    def disconnect(self) -> bool:
        """Close the master connection (and with it every forward). False if none was up."""
        import subprocess

        if not self.master_alive():
            return False
        subprocess.run(
            [*self.argv("-O", "exit"), self.target.destination], capture_output=True, timeout=30
        )
        return True

    def error(self, stderr: str) -> GpuhopError:
        """ssh's own failure, named: unreachable, unknown host key, refused key, ..."""
        return GpuhopError(describe_ssh_error(stderr, self.remote.name, self.target), "ssh_failed")


def describe_ssh_error(stderr: str, name: str, target: SshTarget) -> str:
    text = stderr.lower()
    # As the user's ssh is configured ($GPUHOP_SSH_COMMAND): the command works when pasted.
    port = ["-p", str(target.port)] if target.port else []
    login = shlex.join([*ssh_program(), *port, target.destination])
    if "remote host identification has changed" in text:
        return (
            f"the host key of {target} has CHANGED since you last connected: someone may be"
            " intercepting the connection, or the host was reinstalled. gpuhop will not"
            f" connect. Check with the host's admin, then fix ~/.ssh/known_hosts.\n{_tail(stderr)}"
        )
    if "host key verification failed" in text or "host key is known" in text:
        return (
            f"the host key of {target} is not known, and gpuhop never accepts one silently."
            f" Check it and add it by connecting once yourself: {login}"
        )
    if "permission denied" in text or "too many authentication failures" in text:
        return (
            f"{target} refused the login (permission denied). gpuhop uses your ssh keys and"
            f" ssh-agent and never prompts: check that `{login}` works without a password"
            " (load your key with ssh-add)."
        )
    if "could not resolve hostname" in text:
        return (
            f"cannot resolve the host name of remote '{name}' ({target.host}): check the name"
            f" (`{login}` must connect; a host alias goes in ~/.ssh/config), or give the"
            f" remote another with `gpuhop remote add {name} ssh://USER@HOST --replace`"
        )
    unreachable = (
        "connection refused",
        "connection timed out",
        "operation timed out",
        "no route to host",
        "network is unreachable",
        "connection closed by",
        "connection reset",
    )
    if any(marker in text for marker in unreachable):
        return f"cannot reach remote '{name}' ({target}) over ssh:\n{_tail(stderr)}"
    return f"ssh to remote '{name}' ({target}) failed:\n{_tail(stderr) or '(no message)'}"


def remote_home(conn: SshConnection) -> str:
    """The remote agent's state dir, as its own gpuhop would compute it; cached in the config."""
    remote = conn.remote
    if remote.remote_home:
        return remote.remote_home
    home = conn.run(f'printf "%s" "{REMOTE_HOME}"').stdout.decode().strip()
    if not home.startswith("/"):
        raise GpuhopError(
            f"could not find the gpuhop state dir on remote '{remote.name}' (got {home!r})",
            code="remote_failed",
        )
    remote.remote_home = home
    update_remote(remote)
    return home


def local_socket(remote: Remote) -> Path:
    """Where the forward of `remote`'s agent socket lives on this machine."""
    return runtime_dir() / f"{_key(remote.url, remote.remote_home or '')}.sock"


def ssh_endpoint(remote: Remote) -> Endpoint:
    """An endpoint for an ssh:// remote, connecting (or reusing the connection) first."""
    sock = local_socket(remote) if remote.remote_home else None
    # The connection that finds the forward up is the first request's (see connect_agent).
    connected = connect(sock) if sock is not None else None
    if sock is None or connected is None:
        conn = SshConnection(remote)
        home = remote_home(conn)
        sock = local_socket(remote)
        conn.forward(sock, f"{home}/agent.sock")
    target = SshTarget.from_url(remote.url)
    bound = sock
    reopening = threading.Lock()
    failed: list[GpuhopError] = []  # the last reopen's error, while it stands
    last_failure = [0.0]

    def reachable() -> bool:
        # The forward lives in the master connection: when that dropped (a network blip,
        # a laptop's sleep), open it again, as the next command would, so that a request
        # (the session's), `logs -f` and `forward` go on instead of failing on a socket
        # nothing serves any more. One thread reopens; the others wait for it and find
        # the socket answering. After a failure, not again for RECONNECT_INTERVAL.
        if socket_answers(bound):
            return True
        with reopening:
            if socket_answers(bound):
                return True
            if failed and time.monotonic() - last_failure[0] < RECONNECT_INTERVAL:
                return False
            conn = SshConnection(remote)
            try:
                conn.forward(bound, f"{remote_home(conn)}/agent.sock")
            except GpuhopError as e:
                failed[:] = [e]
                last_failure[0] = time.monotonic()
                return False
            failed.clear()
            return socket_answers(bound)

    def explain(exc: BaseException) -> str | None:
        return _explain(remote, bound, exc, failed[0] if failed else None)

    return Endpoint(
        description=f"the gpuhop agent on remote '{remote.name}' ({target}, over ssh)",
        uds=str(sock),
        reachable=reachable,
        explain=explain,
        connected=connected,
    )


def _explain(
    remote: Remote, sock: Path, exc: BaseException, reopen: GpuhopError | None = None
) -> str | None:
    """Why a request through the tunnel failed: the connection (and why it could not be
    opened again: `reopen`), or the agent on the host."""
    conn = SshConnection(remote)
    try:
        if not socket_answers(sock) and not conn.master_alive():
            lost = f"lost the ssh connection to remote '{remote.name}' ({conn.target}): {exc}"
            if reopen is not None:
                return f"{lost}; opening it again failed: {reopen.message}"
            return lost
        home = remote_home(conn)
        probe = conn.run('test -S "$1"', f"{home}/agent.sock", check=False)
    except GpuhopError as e:
        return e.message
    if probe.returncode != 0:
        return (
            f"the gpuhop agent on remote '{remote.name}' is not running (no socket at"
            f" {home}/agent.sock); start it with: gpuhop remote bootstrap {remote.name}"
        )
    return None


def _key(*parts: str) -> str:
    """A short name for files of one remote reached one way (a socket path is at most 107
    bytes, and ssh adds 17 characters to a control path while it binds)."""
    text = "\0".join((*parts, " ".join(ssh_program())))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _no_ssh() -> GpuhopError:
    return GpuhopError(
        "no `ssh` program found: install OpenSSH's client (or set GPUHOP_SSH_COMMAND)",
        code="ssh_failed",
    )


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])
