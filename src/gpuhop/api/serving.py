"""Wire models of model serving: starting a model server job, and what the agent knows of it."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from gpuhop.api.base import StrictModel, WireModel
from gpuhop.api.models import (
    MAX_GPU_MEMORY_MB,
    NAME_RE,
    SHA256_RE,
    ImageRef,
    ImageSecretName,
    JobState,
    check_env,
    validate_relpath,
)
from gpuhop.api.spec import JobSpec

MODEL_NAME_RULE = (
    "a model name is 1-64 characters of letters, digits, '.', '_' or '-', starting with a"
    " letter or digit"
)


class ServeRequest(StrictModel):
    """`gpuhop serve`: a SavedModel from a job's artifacts (`source_job`, `path` inside
    them, default: the only SavedModel there) or a synced directory (`tree`, whose root is
    the SavedModel), served under `name`, which is also the serving job's name."""

    name: str
    source_job: str | None = Field(default=None, min_length=1, max_length=200)
    path: str | None = None
    tree: str | None = None
    gpus: int = Field(default=0, ge=0, le=1024)
    # Instead of whole GPUs, a share of one (MB), as a job's `gpu_memory_mb`; and the
    # server job's priority in the queue. An agent that predates them refuses them.
    gpu_memory_mb: int | None = Field(default=None, ge=1, le=MAX_GPU_MEMORY_MB)
    priority: int = Field(default=0, ge=-100, le=100)
    # Rows per model call; 1 turns batching off.
    max_batch_size: int = Field(default=32, ge=1, le=65_536)
    # How long the oldest waiting request waits for others to fill its batch.
    batch_timeout_ms: float = Field(default=2.0, ge=0, le=60_000)
    # The server job's environment variables, as a job's (an older agent refuses them).
    env: dict[str, str] = Field(default_factory=dict)
    # A container image to run the server in (as a job's `image`), with the image's own
    # python3, which must have TensorFlow, starlette and uvicorn; the agent's default image
    # (agent.toml `image`) where none is given. And the user's secret the host pulls it with
    # (as a job's `image_secret`). An agent that predates them refuses them.
    image: ImageRef | None = None
    image_secret: ImageSecretName | None = None
    # No image, not even the agent's default: the host's Python, as a job's `no_image`. An
    # agent that predates it refuses it.
    no_image: bool = False

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return check_env(v)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(MODEL_NAME_RULE)
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else validate_relpath(v.strip("/"))

    @field_validator("tree")
    @classmethod
    def _tree(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_RE.match(v):
            raise ValueError("tree must be a sha256 hex digest")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ServeRequest:
        if (self.source_job is None) == (self.tree is None):
            raise ValueError("give the SavedModel as exactly one of source_job or tree")
        if self.path is not None and self.source_job is None:
            raise ValueError("path names a SavedModel in source_job's artifacts")
        return self

    @model_validator(mode="after")
    def _resources(self) -> ServeRequest:
        if problems := self.spec().problems():
            raise ValueError("; ".join(problems))
        return self

    def spec(self) -> JobSpec:
        """The server job's spec: named for the model, in a private network of its own."""
        asked = JobSpec(
            name=self.name,
            gpus=self.gpus,
            gpu_memory_mb=self.gpu_memory_mb,
            priority=self.priority,
            env=self.env,
            image=self.image,
            image_secret=self.image_secret,
            no_image=self.no_image,
            private_network=True,
        )
        return asked if asked.problems() else asked.settled()


class ServingInfo(WireModel):
    """A model server job as the agent sees it. `port` (on the GPU host's loopback) is
    known once the server is ready, and forgotten when the job ends."""

    job: str
    name: str
    state: JobState
    ready: bool
    port: int | None = None
    source: str
    max_batch_size: int
    batch_timeout_ms: float
    reason: str | None = None
