"""Runs in the agent: the latest line of a job's metrics file (its answers, notifications)."""

from __future__ import annotations

import json
import os
from pathlib import Path

METRICS_TAIL_BYTES = 16 * 1024


def latest_metrics(path: Path) -> dict[str, object] | None:
    """The last complete JSON line of a job's metrics file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - METRICS_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
