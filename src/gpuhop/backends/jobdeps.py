"""Runs in the agent: what a job needs besides its work dir, its datasets and its Python
environment. The agent writes it into the job's dir at submit (`deps.json`) and reads it when
the job starts, and hands it to the backend, which turns it into what its leader needs (the
local leader's `--sandbox` and `--env` arguments).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuhop.home import JobPaths


def path(jp: JobPaths) -> Path:
    return jp.root / "deps.json"


def write(jp: JobPaths, deps: dict[str, Any]) -> None:
    path(jp).write_text(json.dumps(deps))


def read(jp: JobPaths) -> dict[str, Any]:
    try:
        deps: dict[str, Any] = json.loads(path(jp).read_text())
    except (OSError, ValueError):
        return {}
    return deps


def python(deps: dict[str, Any], default: str) -> str:
    """The interpreter that runs the job's `.py` script."""
    if deps.get("env"):
        return str(Path(deps["env"]["dir"]) / "bin" / "python")
    return str(deps.get("python") or default)
