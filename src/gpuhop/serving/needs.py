"""Runs in the serving job, before anything else of the server (and, for `hint`, in the
agent): what the model server needs of the Python that runs it, and the line it prints
where that Python lacks some of it. Standard library only.

A venv server runs with the agent's own Python, which has all of it but perhaps
TensorFlow; a server in a container image (`gpuhop serve --image`) runs with the image's
`python3`, which has only what the image installed. gpuhop's own code is mounted there
read-only, never the packages of the agent's venv: the image must bring these itself.
`missing` asks without importing any of them (TensorFlow alone takes seconds), so a server
that cannot run says so at once, in one line (`line`) rather than a traceback. The agent
finds that line at the end of the job's log and adds, in its own words, what to install to
the job's failure reason (`hints`, through `gpuhop.agent.jobs.endings`): the job only picks
among `MODULES`, so no text of a job's reaches the reason.
"""

from __future__ import annotations

import importlib.util

# What `gpuhop.serving` imports, each the pip package that installs it (TensorFlow brings
# numpy and protobuf; uvicorn brings click and h11; starlette brings anyio).
MODULES = {
    "tensorflow": "tensorflow",
    "numpy": "numpy",
    "starlette": "starlette",
    "uvicorn": "uvicorn",
}
PREFIX = "gpuhop: the model server's Python lacks "


def missing() -> list[str]:
    """The modules of `MODULES` this Python cannot import, in its order."""
    return [name for name in MODULES if importlib.util.find_spec(name) is None]


def line(names: list[str]) -> str:
    """The line the server prints (on stderr, last) where it lacks `names`."""
    return PREFIX + ", ".join(names)


def hints() -> dict[bytes, str]:
    """What a failed server's reason adds, for each `line` the server may print (those of
    every set of `MODULES` it may lack, in their order): `gpuhop.agent.jobs.endings`'
    `HINTS`, where a log's line is looked up whole."""
    found = {}
    names = list(MODULES)
    for mask in range(1, 1 << len(names)):
        lacking = [n for i, n in enumerate(names) if mask >> i & 1]
        packages = " ".join(MODULES[n] for n in lacking)
        found[line(lacking).encode()] = (
            f"the model server's Python lacks {', '.join(lacking)}: install {packages} where"
            f" it runs (for gpuhop serve --image, in the image: pip install {packages})"
        )
    return found
