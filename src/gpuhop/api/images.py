"""Wire models of the GPU host's container images (`gpuhop images`): listing them and pulling
one. Runs on both sides; pydantic only."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpuhop.api.base import StrictModel, WireModel


class ImageInfo(WireModel):
    """One image the host holds: its id, the references it goes by, its size, when it was
    built, when a gpuhop job or pull last used it (None: never), and the queued or running
    jobs that need it."""

    id: str
    references: list[str] = Field(default_factory=list)
    size: int = Field(ge=0)
    created: datetime | None = None
    last_used: datetime | None = None
    jobs: list[str] = Field(default_factory=list)


class ImagePull(StrictModel):
    """`gpuhop images pull REF`: the reference, and the name of the caller's secret holding
    the registry's `user:password` where the image is private."""

    reference: str = Field(min_length=1, max_length=512)
    secret: str | None = None
