"""Runs on the user's machine: the remotes a user has configured, and choosing one.

`gpuhop remote add lab ssh://me@gpu-box` writes `remotes.json` in the user's config dir
($GPUHOP_CONFIG_DIR, else the platform's), mode 0600 in a 0700 dir: it may hold tokens.
A command talks to the remote named by `--on`, else $GPUHOP_REMOTE, else the default
remote, else the local agent. The name `local` always means the local agent.

Every command reads this file first, so it is plain dataclasses and `json`: no pydantic
before the first byte of a command's output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuhop.client.errors import GpuhopError
from gpuhop.home import user_dir

LOCAL = "local"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SCHEMES = ("ssh", "https")


@dataclass
class Remote:
    """One configured remote agent."""

    name: str
    url: str
    """ssh://[user@]host[:port] or https://host:port."""
    # https: the pinned certificate (PEM) and its SHA-256 fingerprint, and the bearer token.
    fingerprint: str | None = None
    certificate: str | None = None
    token: str | None = None
    # ssh: the interpreter bootstrap installs with, and what it found (set by bootstrap or
    # discovered on first use).
    python: str | None = None
    remote_home: str | None = None
    """The remote agent's state dir ($GPUHOP_HOME there)."""
    remote_gpuhop: str | None = None
    """The gpuhop executable on the remote host."""

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @classmethod
    def from_json(cls, data: object) -> Remote:
        """A remote as stored; keys it does not know (a newer gpuhop's) are ignored."""
        if not isinstance(data, dict):
            raise ValueError("a remote is not an object")
        known = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        for key, value in known.items():
            if not isinstance(value, str) and (value is not None or key in ("name", "url")):
                raise ValueError(f"{key} is not a string")
        return cls(**known)

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class RemotesFile:
    default: str | None = None
    remotes: dict[str, Remote] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: object) -> RemotesFile:
        if not isinstance(data, dict):
            raise ValueError("not an object")
        default, remotes = data.get("default"), data.get("remotes", {})
        if not (default is None or isinstance(default, str)) or not isinstance(remotes, dict):
            raise ValueError("default or remotes of the wrong type")
        return cls(default, {name: Remote.from_json(r) for name, r in remotes.items()})

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"default": self.default} if self.default is not None else {}
        return data | {"remotes": {name: r.to_json() for name, r in self.remotes.items()}}


def config_dir() -> Path:
    env = os.environ.get("GPUHOP_CONFIG_DIR")
    if env:
        return Path(env).expanduser().absolute()
    return user_dir("config")


def config_path() -> Path:
    return config_dir() / "remotes.json"


def load() -> RemotesFile:
    path = config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return RemotesFile()
    except OSError as e:
        raise GpuhopError(f"cannot read {path}: {e.strerror}", code="bad_config") from None
    try:
        return RemotesFile.from_json(json.loads(raw))
    except (ValueError, TypeError) as e:
        raise GpuhopError(
            f"{path} is not a valid gpuhop remotes file ({e.__class__.__name__}); fix or remove it",
            code="bad_config",
        ) from None


def save(config: RemotesFile) -> None:
    """Write the file atomically, readable by its owner only."""
    import tempfile

    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".remotes-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(config.to_json(), indent=2))
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def check_name(name: str) -> str:
    if name == LOCAL:
        raise GpuhopError(
            f"'{LOCAL}' always means the local agent; pick another name", "bad_request"
        )
    if not NAME_RE.match(name):
        raise GpuhopError(
            f"bad remote name {name!r}: use letters, digits, '.', '_' and '-' (at most 63)",
            code="bad_request",
        )
    return name


def check_url(url: str) -> str:
    """Validate a remote URL; returns it normalised."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise GpuhopError(
            f"bad remote URL {url!r}: use ssh://[user@]host[:port] or https://host:port",
            code="bad_request",
        )
    try:
        port = parts.port
    except ValueError:
        raise GpuhopError(f"bad port in remote URL {url!r}", code="bad_request") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise GpuhopError(
            f"bad remote URL {url!r}: expected {parts.scheme}://"
            f"{'[user@]host[:port]' if parts.scheme == 'ssh' else 'host:port'} and nothing more",
            code="bad_request",
        )
    if parts.scheme == "https" and (parts.username or parts.password):
        raise GpuhopError(
            f"bad remote URL {url!r}: an https remote takes a token, not a user in the URL",
            code="bad_request",
        )
    if parts.password:
        raise GpuhopError(
            f"bad remote URL {url!r}: no passwords in URLs; SSH uses your keys", "bad_request"
        )
    if parts.scheme == "https" and port is None:
        raise GpuhopError(f"bad remote URL {url!r}: give the agent's port", "bad_request")
    return url.rstrip("/")


def selected(name: str | None) -> Remote | None:
    """The remote a command should talk to (None: the local agent)."""
    if name is None:
        name = os.environ.get("GPUHOP_REMOTE") or None
    config: RemotesFile | None = None
    if name is None:
        if not config_path().exists():
            return None  # the common case costs no parsing
        config = load()
        name = config.default
    if name is None or name == LOCAL:
        return None
    config = config or load()
    try:
        return config.remotes[name]
    except KeyError:
        known = ", ".join(sorted(config.remotes)) or "none yet"
        raise GpuhopError(
            f"no remote named {name!r} (configured: {known}); add it with"
            f" `gpuhop remote add {name} ssh://user@host`",
            code="not_found",
        ) from None


def update(remote: Remote) -> None:
    """Store what was learnt about a remote (e.g. its agent's state dir)."""
    config = load()
    if remote.name in config.remotes:
        config.remotes[remote.name] = remote
        save(config)
