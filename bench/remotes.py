"""Runs on the benchmarking machine: gpuhop remotes on this same machine, set up and torn
down by the benchmarks that compare transports.

- `ssh_remote`: a private sshd on a loopback port (the test suite's), and a remote 'lab'
  bootstrapped through it, whose agent has its own state dir;
- `tls_remote`: an agent with a TLS listener on loopback, a token, and a remote 'team'
  pinned to its certificate.

Both yield the environment a gpuhop client needs to use them (config dir, ssh command).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness import PYTHON, REPO, private_agent, run_checked

from gpuhop.client.embedded import stop
from gpuhop.home import AgentPaths

sys.path.insert(0, str(REPO))
from tests import sshd  # the test suite's loopback sshd


@dataclass
class Remote:
    name: str
    env: dict[str, str]
    server: sshd.Sshd | None = None  # the sshd, for ssh remotes


def ssh_unavailable() -> str | None:
    """None if an SSH remote can be set up here, else why not."""
    why = sshd.available()
    if why is None and shutil.which("rsync") is None:
        why = "rsync is not installed"
    return why


@contextlib.contextmanager
def ssh_remote(root: Path, base_env: dict[str, str]) -> Iterator[Remote]:
    """Remote 'lab' over a loopback sshd, bootstrapped; everything stopped afterwards."""
    remote_home = root / "remote-home"
    remote_env = {"GPUHOP_HOME": str(remote_home), "TF_CPP_MIN_LOG_LEVEL": "2"}
    # A bench of another tree (PYTHONPATH=OTHER/src, as for a before/after pair) runs that
    # tree on the remote side too.
    if os.environ.get("PYTHONPATH"):
        remote_env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    server = sshd.Sshd(root / "sshd", remote_env=remote_env).start()
    env = {**base_env, **server.client_env, "GPUHOP_CONFIG_DIR": str(root / "config")}
    try:
        gpuhop = [PYTHON, "-m", "gpuhop"]
        run_checked([*gpuhop, "remote", "add", "lab", server.url(), "--python", PYTHON], env=env)
        run_checked([*gpuhop, "remote", "bootstrap", "lab"], env=env)
        yield Remote("lab", env, server)
    finally:
        with contextlib.suppress(Exception):
            run_checked([PYTHON, "-m", "gpuhop", "remote", "disconnect", "lab"], env=env)
        stop(AgentPaths(remote_home))
        server.stop()


@contextlib.contextmanager
def tls_remote(root: Path, base_env: dict[str, str]) -> Iterator[Remote]:
    """Remote 'team': an agent with a TLS listener on loopback, a token, a pinned cert."""
    with private_agent(root / "agent", "--listen", "127.0.0.1:0") as agent:
        listen = json.loads((agent.home / "listen.json").read_text())
        env = {**base_env, "GPUHOP_CONFIG_DIR": str(root / "config")}
        token = root / "token"
        with token.open("wb") as out:
            run_checked([PYTHON, "-m", "gpuhop", "agent", "token", "create", "bench"],
                        env=agent.env, stdout=out)  # fmt: skip
        run_checked(
            [PYTHON, "-m", "gpuhop", "remote", "add", "team", listen["url"],
             "--fingerprint", listen["fingerprint"], "--token-file", str(token)],
            env=env,
        )  # fmt: skip
        yield Remote("team", env)


def remote_host(remote: Remote) -> str:
    """The host name ssh connects to for `remote` (an alias in the sshd's ssh_config)."""
    assert remote.server is not None
    return remote.server.url().removeprefix("ssh://")
