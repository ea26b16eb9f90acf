"""Runs in the agent: what a job needs besides its work dir, its datasets and its Python
environment. The agent writes it into the job's dir at submit (`deps.json`) and reads it when
the job starts, and hands it to the backend, which turns it into what its leader needs (the
local leader's `--sandbox` and `--env` arguments).
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


def python(deps: dict[str, Any], default: str) -> str:
    """The interpreter that runs the job's `.py` script."""
    if deps.get("env"):
        return str(Path(deps["env"]["dir"]) / "bin" / "python")
    return str(deps.get("python") or default)
