"""Runs in the agent: what a job needs besides its work dir, its datasets and its Python
environment. The agent writes it into the job's dir at submit (`deps.json`) and reads it when
the job starts, and hands it to the backend, which turns it into what its leader needs (the
local leader's `--sandbox` and `--env` arguments).

Dirs of the host a job sees read-only in its work dir are its `data` (its datasets, and its
buckets' data once fetched) and its `mounts` (a model server's SavedModel, from the job that
wrote it: gpuhop.agent.services.serving), each `{"source": DIR, "mount": PATH IN THE WORK
DIR}`; `mounts(deps)` gives both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpuhop.home import JobPaths

# Where a job sees its buckets' data (`--data s3://...:NAME`), relative to its work dir:
# $GPUHOP_DATA is this dir, and each source is mounted at NAME in it.
DATA_DIR = ".gpuhop/data"


def path(jp: JobPaths) -> Path:
    return jp.root / "deps.json"


def write(jp: JobPaths, deps: dict[str, Any]) -> None:
    """Write the job's deps whole (a fetch adds its data while the job is listed)."""
    part = path(jp).with_name("deps.json.part")
    part.write_text(json.dumps(deps))
    os.replace(part, path(jp))


def read(jp: JobPaths) -> dict[str, Any]:
    try:
        deps: dict[str, Any] = json.loads(path(jp).read_text())
    except (OSError, ValueError):
        return {}
    return deps


def mounts(deps: dict[str, Any]) -> list[dict[str, Any]]:
    """Every dir bound read-only in the job's work dir: its data, then its other mounts."""
    return [*deps.get("data", []), *deps.get("mounts", [])]


def python(deps: dict[str, Any], default: str) -> str:
    """The interpreter that runs the job's `.py` script."""
    if deps.get("env"):
        return str(Path(deps["env"]["dir"]) / "bin" / "python")
    return str(deps.get("python") or default)
