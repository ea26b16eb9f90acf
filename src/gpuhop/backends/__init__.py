"""Runs in the agent: where a job's processes run, chosen when the agent starts.

- `local` (the default): on the agent's own host, each job under a shim
  (gpuhop.agent.supervisor and gpuhop.agent.shim).
- `ray`: on the nodes of an existing Ray cluster (gpuhop.backends.ray), each job under a
  launcher on the agent's host that drives Ray actors on the nodes.

The store, the scheduler, logs, metrics, artifacts and the API are the same for both; a
scale-out backend only supplies the program that leads each job's process group, the
GPUs the scheduler hands out (the cluster's), and the kinds of job it cannot run. The
agent remembers its backend in its state dir (`backend.json`), so an agent that is
started again without `--backend` (as the CLI does on demand) keeps using the cluster.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gpuhop.home import AgentError

if TYPE_CHECKING:
    from gpuhop.agent.host.gpus import GpuHost
    from gpuhop.agent.jobs.store import JobRecord
    from gpuhop.api import SubmitRequest
    from gpuhop.home import JobPaths

BACKENDS = ("local", "ray")
SETTINGS_FILE = "backend.json"
_ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


@dataclass(frozen=True)
class BackendSettings:
    name: str = "local"
    ray_address: str | None = None
    ray_token_file: str | None = None
    ray_allow_no_auth: bool = False

    def check(self) -> None:
        """Raise AgentError naming what is wrong with these settings."""
        if self.name not in BACKENDS:
            raise AgentError(f"unknown backend {self.name!r}: use one of {', '.join(BACKENDS)}")
        ray_options = self.ray_address or self.ray_token_file or self.ray_allow_no_auth
        if self.name != "ray" and ray_options:
            raise AgentError(
                "--ray-address, --ray-token-file and --ray-allow-no-auth go with --backend ray"
            )
        if self.name == "ray":
            if not self.ray_address:
                raise AgentError(
                    "--backend ray needs --ray-address HOST:PORT, the Ray cluster's GCS address"
                    " (what `ray start --head` prints; port 6379 by default)"
                )
            if not _ADDRESS_RE.match(self.ray_address):
                raise AgentError(
                    f"--ray-address {self.ray_address!r} is not HOST:PORT; give the GCS address"
                    " (e.g. 10.0.0.5:6379), not a ray:// client address or a dashboard URL"
                )
            if self.ray_token_file and not Path(self.ray_token_file).is_file():
                raise AgentError(f"--ray-token-file {self.ray_token_file}: no such file")

    def args(self) -> list[str]:
        """These settings as `python -m gpuhop.agent` options."""
        out = ["--backend", self.name]
        if self.ray_address:
            out += ["--ray-address", self.ray_address]
        if self.ray_token_file:
            out += ["--ray-token-file", self.ray_token_file]
        if self.ray_allow_no_auth:
            out.append("--ray-allow-no-auth")
        return out


def resolve(home: Path, given: BackendSettings | None) -> BackendSettings:
    """The settings to use: those given, else those this state dir's agent last started
    with (see `remember`), else the local backend."""
    path = home / SETTINGS_FILE
    if given is not None:
        given.check()
        return given
    try:
        saved: dict[str, Any] = json.loads(path.read_text())
        settings = BackendSettings(**saved)
    except FileNotFoundError:
        return BackendSettings()
    except (OSError, ValueError, TypeError) as e:
        raise AgentError(f"{path} cannot be read ({e}); start the agent with --backend") from None
    settings.check()
    return settings


def remember(home: Path, settings: BackendSettings) -> None:
    """Keep `settings` for the next start without --backend (once they have worked)."""
    path = home / SETTINGS_FILE
    if settings == BackendSettings() and not path.exists():
        return  # the default: nothing to remember
    path.write_text(json.dumps(dataclasses.asdict(settings)))


class ScaleOut(Protocol):
    """A backend that runs jobs somewhere else than on the agent's host."""

    name: str
    address: str
    gpu_host: GpuHost

    def leader(
        self, job: JobRecord, jp: JobPaths, deps: dict[str, Any]
    ) -> tuple[list[str], dict[str, str]]:
        """The argv and environment of the process that leads the job's process group on
        the agent's host (in place of the shim). Raises StartError."""
        ...

    def runs_here(self, jp: JobPaths) -> bool:
        """Whether this job was started by this backend (not on the agent's host)."""
        ...

    def before_stop(self, jp: JobPaths, grace: float) -> float:
        """Called before SIGTERM to the job's leader, with the grace its workers get;
        returns how long to wait before SIGKILL to the leader."""
        ...

    def check_submit(self, req: SubmitRequest) -> None:
        """Raise ApiError if this backend cannot run the job."""
        ...

    def describe(self) -> str:
        """One line for the agent's log."""
        ...


def open_scale_out(settings: BackendSettings, python: str) -> ScaleOut | None:
    """The scale-out backend of these settings, connected; None for the local backend.
    Raises AgentError saying why the backend cannot be used."""
    if settings.name == "local":
        return None
    from gpuhop.backends.ray.backend import RayBackend

    return RayBackend.connect(settings, python)
