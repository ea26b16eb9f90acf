"""The wire contract shared by the client and the agent: request/response models and error codes.

Runs on both sides. Imports pydantic only; never agent or client code.
"""

from gpuhop.api.errors import ErrorBody, ErrorCode
from gpuhop.api.models import (
    AgentInfo,
    ArtifactEntry,
    AttemptInfo,
    BlobCheck,
    BlobCheckResult,
    GpuInfo,
    JobInfo,
    JobState,
    ManifestEntry,
    SubmitRequest,
    Tree,
    TreeStored,
    validate_relpath,
)

__all__ = [
    "AgentInfo",
    "ArtifactEntry",
    "AttemptInfo",
    "BlobCheck",
    "BlobCheckResult",
    "ErrorBody",
    "ErrorCode",
    "GpuInfo",
    "JobInfo",
    "JobState",
    "ManifestEntry",
    "SubmitRequest",
    "Tree",
    "TreeStored",
    "validate_relpath",
]
