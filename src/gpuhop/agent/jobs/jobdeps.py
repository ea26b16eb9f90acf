"""Runs in the agent: what a job needs besides its work dir, its datasets and its Python
environment. Written into the job's dir at submit (`deps.json`), read when it starts, and
turned into the shim's `--sandbox` and `--env` arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuhop.home import AgentPaths, JobPaths


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


def shim_args(deps: dict[str, Any], jp: JobPaths, paths: AgentPaths) -> list[str]:
    """The shim's arguments for these deps; makes the datasets' mount points."""
    args: list[str] = []
    if deps.get("env"):
        spec = dict(deps["env"], requirements=str(jp.root / "requirements.txt"))
        (jp.root / "env.json").write_text(json.dumps(spec))
        args += ["--env", str(jp.root / "env.json")]
    if deps.get("data"):
        binds = []
        for mount in deps["data"]:
            target = jp.work / mount["mount"]
            target.mkdir(parents=True, exist_ok=True)
            binds.append({"source": mount["source"], "target": str(target)})
        spec = {
            "work": str(jp.work),
            "binds": binds,
            "protect": [str(paths.blobs), str(paths.home / "datasets"), str(paths.home / "envs")],
        }
        (jp.root / "sandbox.json").write_text(json.dumps(spec))
        args += ["--sandbox", str(jp.root / "sandbox.json")]
    return args
