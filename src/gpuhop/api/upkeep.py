"""Wire models of the agent's upkeep: garbage collection and disk quotas. Runs on both sides."""

from __future__ import annotations

from pydantic import Field

from gpuhop.api.base import WireModel


class Freed(WireModel):
    """What one kind of thing collection removed (or would remove, in a dry run)."""

    count: int = Field(default=0, ge=0)
    bytes: int = Field(default=0, ge=0)


class DiskUsage(WireModel):
    """Bytes in use and the quotas on them (None: no quota)."""

    storage_bytes: int = Field(ge=0, description="blobs, trees, datasets, cached objects")
    storage_quota: int | None = None
    jobs_bytes: int = Field(ge=0, description="job dirs: work, logs, metrics, artifacts")
    jobs_quota: int | None = None
    log_cap: int | None = None


class GcReport(WireModel):
    dry_run: bool
    # By kind: "blobs", "trees", "jobs" (finished jobs' files past retention, and job dirs
    # that no job owns), "envs" (cached environments unused for long), "temp" (leftovers
    # of uploads that a crash interrupted, partial bucket objects), "objects" (cached bucket
    # prefixes unused for long), "images" (container images gpuhop pulled, unused for
    # long or past image_quota).
    freed: dict[str, Freed]
    pruned_jobs: list[str] = Field(default_factory=list)
    usage: DiskUsage

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.freed.values())
