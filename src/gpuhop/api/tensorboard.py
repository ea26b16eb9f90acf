"""Wire models of `gpuhop tensorboard`: a TensorBoard server job for another job's logs.
Runs on both sides."""

from __future__ import annotations

from pydantic import Field

from gpuhop.api.base import WireModel
from gpuhop.api.models import JobState


class TensorBoardInfo(WireModel):
    """A TensorBoard server job and the job whose TensorBoard dir it serves.

    `port` is where TensorBoard listens inside its job's private network: forward it (the
    agent's `/v1/jobs/{job}/ports/{port}`) to reach it. `reused` says the agent handed back
    a server that was already running for `source_job` rather than starting one.
    `logdirs` are the dirs it reads: the job's $GPUHOP_TENSORBOARD_DIR (`logdir`, alone
    before the work dir was read too) and its work dir; `has_events`: whether any event
    file is in them yet.
    """

    job: str
    name: str | None = None
    state: JobState
    port: int
    source_job: str
    source_state: JobState
    logdir: str
    logdirs: list[str] = Field(default_factory=list)
    has_events: bool
    reused: bool = False
    reason: str | None = None
