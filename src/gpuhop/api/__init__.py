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
    CheckStatus,
    DoctorCheck,
    GpuInfo,
    JobInfo,
    JobState,
    ManifestEntry,
    SubmitRequest,
    Tree,
    TreeStored,
    validate_relpath,
)
from gpuhop.api.sizes import format_mb, parse_mb

__all__ = [
    "AgentInfo",
    "ArtifactEntry",
    "AttemptInfo",
    "BlobCheck",
    "BlobCheckResult",
    "CheckStatus",
    "DoctorCheck",
    "ErrorBody",
    "ErrorCode",
    "GpuInfo",
    "JobInfo",
    "JobState",
    "ManifestEntry",
    "SubmitRequest",
    "Tree",
    "TreeStored",
    "format_mb",
    "parse_mb",
    "validate_relpath",
]
