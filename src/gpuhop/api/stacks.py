"""Wire models of `gpuhop stacks`: every Python thread's stack in a running job's processes,
as py-spy dumps them on the agent's host. Runs on both sides."""

from __future__ import annotations

from pydantic import Field

from gpuhop.api.base import WireModel


class ProcessStacks(WireModel):
    """One process of the job: its host pid, the worker it belongs to (None: a job of one
    worker), its command line, and py-spy's dump of its threads (`stacks`, as py-spy prints
    it) or why there is none (`error`: not a Python process, gone meanwhile, ...)."""

    pid: int
    worker: int | None = None
    command: str
    stacks: str | None = None
    error: str | None = None


class JobStacks(WireModel):
    job: str
    native: bool = False
    processes: list[ProcessStacks] = Field(default_factory=list)
