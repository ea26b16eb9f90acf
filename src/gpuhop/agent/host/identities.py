"""Runs in the agent: the unprivileged Unix identity each user's jobs run as on a team agent.

On a team agent run as root, no job runs as root nor as the agent's own user: each gpuhop
user's jobs get a uid and gid of their own, as Slurm runs a job as the user who submitted
it. By default these are drawn from a range no account of the host uses
(`job_uid_base` in agent.toml, 2,000,000,000 on), one per user, in the order users first
run a job, and kept in `identities.json` in the state dir, so a user keeps their uid across
agent restarts (the files their jobs wrote stay theirs). An admin may instead map a gpuhop
user to an existing Unix account (`[job_accounts]` in agent.toml: `alice = "alice"`).

Each identity has a home of its own in the state dir (`users/UID/home`, HOME for its jobs):
where pip's, Keras's, Hugging Face's and PyTorch's caches land, kept across that user's jobs
and seen by no other user's. A single-user agent gives its jobs no other identity: they run
as the agent's user, who is their owner (see README, "Security").
"""

from __future__ import annotations

import json
import os
import pwd
import threading
from dataclasses import dataclass
from pathlib import Path

FILE = "identities.json"
DEFAULT_UID_BASE = 2_000_000_000
# Enough for any team; the range's top stays below 2**31 (some tools read uids as signed).
RANGE = 100_000


class IdentityError(Exception):
    """A user for whom no identity can be had; the message says why and what to do."""


@dataclass(frozen=True)
class Identity:
    user: str  # the gpuhop user whose jobs these are
    uid: int
    gid: int
    home: str  # HOME for the user's jobs: their caches, theirs alone

    def as_spec(self) -> dict[str, object]:
        return {"user": self.user, "uid": self.uid, "gid": self.gid, "home": self.home}


class Identities:
    def __init__(self, home: Path, base: int = DEFAULT_UID_BASE, accounts: dict | None = None):
        """`home`: the agent's state dir; `base`: the first uid of the range; `accounts`:
        gpuhop user -> Unix account name, for users an admin mapped to accounts."""
        self.path = home / FILE
        self.users_dir = home / "users"
        self.base = base
        self.accounts = dict(accounts or {})
        self._lock = threading.Lock()

    def of(self, user: str) -> Identity:
        """The identity of `user`'s jobs, made on first use (with its home). Raises
        IdentityError where none can be had."""
        account = self.accounts.get(user)
        if account is not None:
            try:
                entry = pwd.getpwnam(account)
            except KeyError:
                raise IdentityError(
                    f"agent.toml maps user {user!r} to the Unix account {account!r},"
                    " which this host does not have"
                ) from None
            if entry.pw_uid == 0 or entry.pw_uid == os.geteuid():
                raise IdentityError(
                    f"agent.toml maps user {user!r} to {account!r}, which is root or the"
                    " agent's own account: jobs never run as either on a team agent"
                )
            uid, gid = entry.pw_uid, entry.pw_gid
        else:
            uid = gid = self._drawn(user)
        home = self.users_dir / str(uid) / "home"
        if not home.is_dir():
            home.mkdir(parents=True, exist_ok=True)
            os.chown(home, uid, gid)
            home.chmod(0o700)
        return Identity(user, uid, gid, str(home))

    def _drawn(self, user: str) -> int:
        with self._lock:
            known = self._read()
            if user in known:
                return known[user]
            taken = set(known.values())
            if len(taken) >= RANGE:
                raise IdentityError(f"all {RANGE} uids from {self.base} on are given out")
            uid = next(u for u in range(self.base, self.base + RANGE) if u not in taken)
            known[user] = uid
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
            return uid

    def _read(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise IdentityError(f"{self.path} cannot be read ({e}); fix or remove it") from None
        return {str(k): int(v) for k, v in data.items()}

    def listed(self) -> dict[str, int]:
        """Every user given a drawn uid so far."""
        with self._lock:
            return self._read()
