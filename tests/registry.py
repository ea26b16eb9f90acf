"""A private container registry for the image tests: Debian's docker-registry with htpasswd
auth on plain HTTP, in a network namespace of its own (tests/netns.py), on an address
assigned there; the agent lists it in agent.toml's `insecure_registries`. Images are pushed
to it from the host's store and their names removed locally, so that the agent must pull
them. `registry` is the module-scoped fixture; everything it made is removed at its end: the
registry's process group, the namespace, and every image name it made.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netns
from tests.conftest import Agent, missing, wait_until


def registry_problem() -> str | None:
    """Why this machine cannot run a test registry (a skip's words), or None."""
    if sys.platform != "linux":
        return "Podman and network namespaces are Linux's"
    return netns.unavailable()


def require_tools() -> None:
    """Fail (or skip, as `missing` does) where the registry's tools are not installed."""
    for tool, package in (
        ("podman", "podman"),
        ("docker-registry", "docker-registry"),
        ("htpasswd", "apache2-utils"),
    ):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed (apt-get install {package}; scripts/setup-system)")


USER = "trainer"
PASSWORD = "s3cret-" + secrets.token_hex(8)
TAG = secrets.token_hex(4)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=120, check=check
    )


def on_host(reference: str) -> bool:
    return podman("image", "exists", reference, check=False).returncode == 0


class Registry:
    """A registry in a namespace of its own: `address` is HOST:PORT."""

    def __init__(self, root: Path):
        self.root = root
        self.net = netns.Network.make(1)
        self.address = f"{self.net.addresses[0]}:5000"
        self.proc: subprocess.Popen[bytes] | None = None
        self.made: list[str] = []  # every image name this module made, for the end

    def start(self) -> None:
        (self.root / "data").mkdir(parents=True)
        subprocess.run(
            ["htpasswd", "-B", "-i", "-c", str(self.root / "htpasswd"), USER],
            input=PASSWORD,
            text=True,
            check=True,
            capture_output=True,
        )
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            f"http:\n  addr: {self.address}\n  secret: {secrets.token_hex(16)}\n"
            f"auth:\n  htpasswd:\n    realm: gpuhop-test\n    path: {self.root / 'htpasswd'}\n"
        )
        with (self.root / "registry.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [*self.net.enter(0), "docker-registry", "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self.answers, timeout=30, interval=0.1)

    def answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"the registry ended: {(self.root / 'registry.log').read_text()}")
        host, port = self.address.split(":")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 1):
            return True
        return False

    def push(self, name: str) -> str:
        """Build a tiny image, push it here as `name`, remove it from the host; its
        reference in this registry."""
        tree = self.root / f"tree-{name.replace('/', '-')}"
        (tree / "etc").mkdir(parents=True)
        (tree / "etc" / "os-release").write_text(f"ID=gpuhop-test\nNAME={name}\n")
        (tree / "payload.bin").write_bytes(os.urandom(64 * 1024))
        local = f"localhost/gpuhop-test/{name}:{TAG}"
        remote = f"{self.address}/gpuhop-test/{name}:{TAG}"
        self.made += [local, remote]
        archive = subprocess.run(
            ["tar", "-C", str(tree), "-cf", "-", "."], capture_output=True, check=True
        ).stdout
        subprocess.run(
            ["podman", "import", "-", local], input=archive, capture_output=True, check=True
        )
        podman("push", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}", local, remote)
        podman("rmi", "--force", local)
        assert not on_host(remote)
        return remote

    def push_local(self, local: str, name: str) -> str:
        """Push the host's image `local` here as `name` and remove that name from the host
        (the image stays under `local`: a pull then finds its layers here); its reference in
        this registry."""
        remote = f"{self.address}/gpuhop-test/{name}:{TAG}"
        self.made.append(remote)
        podman("tag", local, remote)
        podman("push", "--tls-verify=false", "--creds", f"{USER}:{PASSWORD}", remote)
        podman("untag", local, remote)
        assert not on_host(remote)
        return remote

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The registry stopped (SIGSTOP) inside: it takes connections and answers none, so
        a pull waits at its first request until the registry goes on."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        with contextlib.ExitStack() as stack:
            stack.callback(self.net.remove)
            for name in self.made:
                stack.callback(podman, "rmi", "--force", name, check=False)
            if self.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGCONT)
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("registry"))
    try:
        reg.start()
        yield reg
    finally:
        reg.stop()


__all__ = [
    "PASSWORD",
    "TAG",
    "USER",
    "Registry",
    "on_host",
    "podman",
    "registry",
    "registry_problem",
    "require_tools",
]


@contextlib.contextmanager
def pulling_agent(root: Path, registry: Registry) -> Iterator[Agent]:
    """An agent that pulls from `registry` over plain HTTP, with the user's secrets REGISTRY
    (its login) and WRONG (a wrong password), and whose gc removes every image it knows
    that nothing needs (no grace, no keep days)."""
    (root / "home").mkdir()
    (root / "home" / "agent.toml").write_text(
        f'insecure_registries = ["{registry.address}"]\n'
        "gc_every_hours = 0\ngc_grace_minutes = 0\nimage_keep_days = 0\n"
    )
    agent = Agent(root / "home", root / "cache", None).start()
    try:
        with agent.client() as client:
            client.set_secret("REGISTRY", f"{USER}:{PASSWORD}")
            client.set_secret("WRONG", f"{USER}:not-the-password")
        yield agent
    finally:
        agent.shutdown()
