"""Runs where a job's processes start: the agent's host, or a Ray node (gpuhop.backends.ray).

Turns a submitted command into an argv that exec can run. Imports nothing of the agent's,
so a Ray worker imports it on the nodes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gpuhop.backends.base import StartError


def resolve_command(
    command: list[str], work: Path, path_env: str, python: str, where: str = "the GPU host"
) -> list[str]:
    """The argv for `command` run from the work dir: a `.py` script in it runs with `python`,
    and so does `-m MODULE` (as `python -m MODULE`: gpuhop's own in-job programs, such as
    the notebook runner, run in the job's Python); a path must be an executable file, and a
    bare name is looked up on `path_env`."""
    head, rest = command[0], command[1:]
    if head == "-m":
        if not rest or not rest[0]:
            raise StartError("-m needs a module name to run")
        return [python, "-m", *rest]
    if head.endswith(".py"):
        if not (work / head).is_file():
            raise StartError(f"script {head} is not in the job's work dir")
        return [python, head, *rest]
    if "/" in head:
        target = Path(head) if head.startswith("/") else work / head
        if not target.is_file() or not os.access(target, os.X_OK):
            raise StartError(f"{head} is not an executable file on {where}")
        return [str(target), *rest]
    found = shutil.which(head, path=path_env)
    if found is None:
        raise StartError(f"command {head!r} was not found on {where} (PATH={path_env})")
    return [found, *rest]
