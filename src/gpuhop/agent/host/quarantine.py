"""Runs in the agent: the GPUs taken out of service for a hardware fault, kept across restarts.

A quarantined GPU gets no new job until an admin releases it (`gpuhop gpus --release N`).
Releasing acknowledges the fault that was seen: the same reading (the same words) does not
quarantine the GPU again, a new or worse one does (more ECC errors, another XID).

One small JSON file in the state dir (`AgentPaths.quarantine`), replaced whole on each
change, so a crash never leaves half of it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("gpuhop.agent")


@dataclass(frozen=True)
class Quarantine:
    kind: str  # "xid", "ecc", "retired-pages", "lost" (see gpuhop.agent.host.health)
    detail: str
    since: float


class QuarantineStore:
    """Which GPUs are quarantined and why. Safe to use from several threads."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._held: dict[int, Quarantine] = {}
        self._released: dict[int, str] = {}  # index -> the detail an admin acknowledged
        self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
            self._held = {int(k): Quarantine(**v) for k, v in data.get("held", {}).items()}
            self._released = {int(k): str(v) for k, v in data.get("released", {}).items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError, AttributeError) as e:
            # Failing safe would mean guessing which GPUs are bad; say so loudly instead.
            log.error("cannot read %s (%s): no GPU is quarantined until it is fixed", self.path, e)

    def _save(self) -> None:
        data = {
            "held": {str(k): asdict(v) for k, v in self._held.items()},
            "released": {str(k): v for k, v in self._released.items()},
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, self.path)

    def all(self) -> dict[int, Quarantine]:
        with self._lock:
            return dict(self._held)

    def get(self, index: int) -> Quarantine | None:
        with self._lock:
            return self._held.get(index)

    def add(self, index: int, kind: str, detail: str, now: float | None = None) -> bool:
        """Quarantine GPU `index` for this fault. False if it already is, or if an admin
        released it after this very fault."""
        with self._lock:
            if index in self._held or self._released.get(index) == detail:
                return False
            self._held[index] = Quarantine(kind, detail, time.time() if now is None else now)
            self._save()
            return True

    def release(self, index: int) -> Quarantine | None:
        """Put GPU `index` back in service; its quarantine, or None if it had none."""
        with self._lock:
            held = self._held.pop(index, None)
            if held is not None:
                self._released[index] = held.detail
                self._save()
            return held

    def settle(self, seen: dict[int, str]) -> None:
        """Forget an acknowledged fault once it is no longer seen (`seen`: index -> detail
        now), so that the same fault coming back quarantines the GPU again."""
        with self._lock:
            gone = [i for i, detail in self._released.items() if seen.get(i) != detail]
            for index in gone:
                del self._released[index]
            if gone:
                self._save()
