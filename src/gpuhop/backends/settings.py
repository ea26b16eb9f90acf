"""Runs in the agent (and in `gpuhop agent start`): which backend the agent uses, chosen
when it starts, and kept in its state dir (`backend.json`), so an agent that is started
again without `--backend` (as the CLI does on demand) keeps using the cluster."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhop.home import AgentError

BACKENDS = ("local", "ray", "slurm")
_SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
SETTINGS_FILE = "backend.json"
_ADDRESS_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


@dataclass(frozen=True)
class BackendSettings:
    name: str = "local"
    ray_address: str | None = None
    ray_token_file: str | None = None
    ray_allow_no_auth: bool = False
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_qos: str | None = None

    def check(self) -> None:
        """Raise AgentError naming what is wrong with these settings."""
        if self.name not in BACKENDS:
            raise AgentError(f"unknown backend {self.name!r}: use one of {', '.join(BACKENDS)}")
        ray_options = self.ray_address or self.ray_token_file or self.ray_allow_no_auth
        if self.name != "ray" and ray_options:
            raise AgentError(
                "--ray-address, --ray-token-file and --ray-allow-no-auth go with --backend ray"
            )
        slurm_options = {
            "--partition": self.slurm_partition,
            "--account": self.slurm_account,
            "--qos": self.slurm_qos,
        }
        if self.name != "slurm" and any(slurm_options.values()):
            raise AgentError("--partition, --account and --qos go with --backend slurm")
        for option, value in slurm_options.items():
            if value is not None and not _SLURM_NAME_RE.match(value):
                raise AgentError(
                    f"{option} {value!r} is not a Slurm name (letters, digits, '.', '_', '-')"
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
        for option, value in (
            ("--partition", self.slurm_partition),
            ("--account", self.slurm_account),
            ("--qos", self.slurm_qos),
        ):
            if value:
                out += [option, value]
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
