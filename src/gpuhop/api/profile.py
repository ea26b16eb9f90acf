"""Wire models of `gpuhop profile`: a few seconds' profile of a running job, by its
framework's own profiler (TensorFlow, JAX) or, for plain Python, py-spy's samples. Runs on
both sides."""

from __future__ import annotations

from pydantic import Field

from gpuhop.api.base import WireModel

# The longest capture one request may ask for, in seconds.
MAX_PROFILE_SECONDS = 300.0


class ProcessProfile(WireModel):
    """One process of the job: its host pid, the worker it belongs to (None: a job of one
    worker), its command line, the profiler that ran on it (`tensorflow`, `jax` or
    `py-spy`), and why it gave nothing (`error`), if it did not."""

    pid: int
    worker: int | None = None
    command: str
    profiler: str
    error: str | None = None


class JobProfile(WireModel):
    """What `gpuhop profile` captured: `profiler` (`tensorflow`, `jax`, `py-spy`), for how
    long, and the files it made, as paths under the job's artifacts dir (so `gpuhop pull`
    brings them back): TensorBoard's `tensorboard/plugins/profile/RUN` dirs (its Profile tab
    shows them), or py-spy's flame graphs (`profiles/*.svg`, open them in a browser)."""

    job: str
    profiler: str
    seconds: float
    files: list[str] = Field(default_factory=list)
    processes: list[ProcessProfile] = Field(default_factory=list)
