"""Wire models of what a job ran on (`gpuhop show`) and of `gpuhop diff`: what changed
between two jobs. Runs on both sides."""

from __future__ import annotations

from pydantic import Field

from gpuhop.api.base import WireModel


class Change(WireModel):
    """One thing that differs between two jobs: its name (a package, an option, `python`),
    and its value in each, as text (None: the job has none)."""

    what: str
    a: str | None
    b: str | None


class JobDiff(WireModel):
    """What changed from job `a` to job `b`: the files of their trees (paths added, removed,
    or with other contents or mode), the distributions whose versions differ, the options
    (the job's spec and its command) that differ, and what they ran on (interpreter,
    platform, GPUs, driver, gpuhop). `unknown` says what could not be compared, and why."""

    a: str
    b: str
    files_added: list[str] = Field(default_factory=list)
    files_removed: list[str] = Field(default_factory=list)
    files_changed: list[str] = Field(default_factory=list)
    packages: list[Change] = Field(default_factory=list)
    options: list[Change] = Field(default_factory=list)
    ran_on: list[Change] = Field(default_factory=list)
    unknown: list[str] = Field(default_factory=list)
