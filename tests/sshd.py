"""A real OpenSSH server on a loopback port, for the SSH transport's tests.

It runs as the current user with its own host key, its own authorized key and its own
config; logins get the environment the test gives (a private GPUHOP_HOME for the "remote"
side). The client side uses an ssh_config of its own through $GPUHOP_SSH_COMMAND, so the
user's ~/.ssh is never read or written. Stopped at teardown: client masters first, then
sshd and every session it started.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

SSHD = Path("/usr/sbin/sshd")
ALIAS = "gpuhop-test"


def available() -> str | None:
    """None if a test sshd can run here, else why not."""
    if not SSHD.exists():
        return f"{SSHD} is missing (scripts/setup-system installs openssh-server)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "OpenSSH's client is missing"
    return None


def _free_port() -> int:
    return free_port()


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuhop-test", "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class Sshd:
    root: Path
    remote_env: dict[str, str]
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    runtime: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ghs-")))

    @property
    def ssh_config(self) -> Path:
        return self.root / "ssh_config"

    @property
    def client_env(self) -> dict[str, str]:
        """What a client needs in its environment to use this server (and only it)."""
        return {
            "GPUHOP_SSH_COMMAND": f"ssh -F {self.ssh_config}",
            "GPUHOP_RUNTIME_DIR": str(self.runtime),
        }

    def url(self, alias: str = ALIAS) -> str:
        return f"ssh://{alias}"

    def start(self) -> Sshd:
        self.root.mkdir(parents=True, exist_ok=True)
        host_pub = _keygen(self.root / "host_key")
        user_pub = _keygen(self.root / "id_user")
        stranger_pub = _keygen(self.root / "id_stranger")  # a key the server does not know
        (self.root / "authorized_keys").write_text(user_pub + "\n")
        (self.root / "known_hosts").write_text(f"{ALIAS} {host_pub}\n")
        (self.root / "empty_known_hosts").write_text("")
        # As if the host's key had changed since it was last seen.
        (self.root / "wrong_known_hosts").write_text(f"{ALIAS} {stranger_pub}\n")
        self.port = _free_port()
        user = getpass.getuser()
        setenv = " ".join(f'"{k}={v}"' for k, v in self.remote_env.items())
        (self.root / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\n"
            f"HostKey {self.root / 'host_key'}\nPidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            f"PermitRootLogin prohibit-password\nAllowUsers {user}\n"
            "AllowStreamLocalForwarding yes\nLogLevel INFO\nSubsystem sftp internal-sftp\n"
            + (f"SetEnv {setenv}\n" if setenv else "")
        )
        common = (
            f"  HostName 127.0.0.1\n  Port {self.port}\n  User {user}\n  IdentitiesOnly yes\n"
            f"  HostKeyAlias {ALIAS}\n  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        )
        key = f"  IdentityFile {self.root / 'id_user'}\n"
        known = f"  UserKnownHostsFile {self.root / 'known_hosts'}\n"
        self.ssh_config.write_text(
            f"Host {ALIAS}\n{common}{key}{known}"
            f"Host {ALIAS}-unknown-key\n{common}{key}"
            f"  UserKnownHostsFile {self.root / 'empty_known_hosts'}\n"
            f"Host {ALIAS}-changed-key\n{common}{key}"
            f"  UserKnownHostsFile {self.root / 'wrong_known_hosts'}\n"
            f"Host {ALIAS}-stranger\n{common}  IdentityFile {self.root / 'id_stranger'}\n{known}"
            f"Host {ALIAS}-closed\n  HostName 127.0.0.1\n  Port {_free_port()}\n"
            f"  User {user}\n{key}{known}  ConnectTimeout 5\n"
        )
        if os.geteuid() == 0:
            # sshd as root wants its privilege separation dir (made by the package's service
            # normally, which never ran here).
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        with open(self.root / "sshd.log", "wb") as log:
            self.proc = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(self.root / "sshd_config")],
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 20 s")

    def stop(self) -> None:
        # The client's master connections (each holds a session of this sshd).
        for control in self.runtime.glob("cm-*"):
            subprocess.run(
                ["ssh", "-F", str(self.ssh_config), "-o", f"ControlPath={control}", "-O", "exit",
                 ALIAS],
                capture_output=True,
                timeout=10,
            )  # fmt: skip
        if self.proc is not None:
            sessions = _children(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        shutil.rmtree(self.runtime, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (sshd's per-connection processes start their own sessions)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                text = (task / "children").read_text().split()
                kids = [int(k) for k in text]
                found += kids
                todo += kids
    return found
