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
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuhop.client.errors import GpuhopError
from gpuhop.home import user_dir

LOCAL = "local"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
SCHEMES = ("ssh", "https")


class Remote:
    """One configured remote agent (a plain class, as the other records on a command's
    path: `dataclasses` would load `inspect`, some 8 ms of every command's start)."""

    # Its fields, in the order they are stored.
    FIELDS = (
        "name",
        "url",
        "fingerprint",
        "certificate",
        "token",
        "python",
        "remote_home",
        "remote_gpuhop",
    )
    __slots__ = FIELDS

    def __init__(
        self,
        name: str,
        url: str,
        fingerprint: str | None = None,
        certificate: str | None = None,
        token: str | None = None,
        python: str | None = None,
        remote_home: str | None = None,
        remote_gpuhop: str | None = None,
    ) -> None:
        self.name = name
        self.url = url
        """ssh://[user@]host[:port] or https://host:port."""
        # https: the pinned certificate (PEM) and its SHA-256 fingerprint, and the token.
        self.fingerprint = fingerprint
        self.certificate = certificate
        self.token = token
        # ssh: the interpreter bootstrap installs with, and what it found (set by
        # bootstrap or discovered on first use).
        self.python = python
        self.remote_home = remote_home
        """The remote agent's state dir ($GPUHOP_HOME there)."""
        self.remote_gpuhop = remote_gpuhop
        """The gpuhop executable on the remote host."""

    def _values(self) -> tuple[str | None, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Remote):
            return NotImplemented
        return self._values() == other._values()

    __hash__ = None  # type: ignore[assignment]  # mutable: no hash

    def __repr__(self) -> str:  # never the token
        return f"Remote(name={self.name!r}, url={self.url!r})"

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @classmethod
    def from_json(cls, data: object) -> Remote:
        """A remote as stored; keys it does not know (a newer gpuhop's) are ignored."""
        if not isinstance(data, dict):
            raise ValueError("a remote is not an object")
        known = {name: data[name] for name in cls.FIELDS if name in data}
        for key, value in known.items():
            if not isinstance(value, str) and (value is not None or key in ("name", "url")):
                raise ValueError(f"{key} is not a string")
        return cls(**known)

    def to_json(self) -> dict[str, str]:
        return {k: v for k, v in zip(self.FIELDS, self._values(), strict=True) if v is not None}


class RemotesFile:
    """The configured remotes, and which one is the default."""

    __slots__ = ("default", "remotes")

    def __init__(
        self, default: str | None = None, remotes: dict[str, Remote] | None = None
    ) -> None:
        self.default = default
        self.remotes: dict[str, Remote] = {} if remotes is None else remotes

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemotesFile):
            return NotImplemented
        return (self.default, self.remotes) == (other.default, other.remotes)

    __hash__ = None  # type: ignore[assignment]  # mutable: no hash

    def __repr__(self) -> str:
        return f"RemotesFile(default={self.default!r}, remotes={list(self.remotes)!r})"

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
    if parts.scheme == "ssh" and (url.split("//", 1)[1].startswith("-") or "@-" in url):
        # ssh would read such a destination as an option (`-oProxyCommand=...` runs a
        # command here): refused as git refuses it, rather than ssh failing with its usage.
        raise GpuhopError(
            f"bad remote URL {url!r}: a host or user name cannot start with '-'", "bad_request"
        )
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
