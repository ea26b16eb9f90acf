"""The wire contract shared by the client and the agent: request/response models and error codes.

Runs on both sides. Imports pydantic only; never agent or client code.
"""

from gpuhop.api.agent import (
    AgentInfo,
    CheckStatus,
    DoctorCheck,
    GpuInfo,
    ListenerInfo,
    TokenCreated,
    TokenInfo,
    TokenRequest,
)
from gpuhop.api.errors import ErrorBody, ErrorCode
from gpuhop.api.fingerprints import fingerprint_of, normalize_fingerprint
from gpuhop.api.models import (
    AttemptInfo,
    BlobCheck,
    BlobCheckResult,
    JobInfo,
    JobState,
    ManifestEntry,
    SubmitRequest,
    Tree,
    TreeStored,
    validate_relpath,
)
from gpuhop.api.outputs import ArtifactEntry, WorkdirEntry
from gpuhop.api.queue import EndClass, RequeueRequest, RetryOn, format_seconds, parse_duration
from gpuhop.api.serving import ServeRequest, ServingInfo
from gpuhop.api.sizes import format_mb, parse_mb
from gpuhop.api.tensorboard import TensorBoardInfo
from gpuhop.api.ui import UiLoginCode

__all__ = [
    "AgentInfo",
    "ArtifactEntry",
    "AttemptInfo",
    "BlobCheck",
    "BlobCheckResult",
    "CheckStatus",
    "DoctorCheck",
    "EndClass",
    "ErrorBody",
    "ErrorCode",
    "GpuInfo",
    "JobInfo",
    "JobState",
    "ListenerInfo",
    "ManifestEntry",
    "RequeueRequest",
    "RetryOn",
    "ServeRequest",
    "ServingInfo",
    "SubmitRequest",
    "TensorBoardInfo",
    "TokenCreated",
    "TokenInfo",
    "TokenRequest",
    "Tree",
    "TreeStored",
    "UiLoginCode",
    "WorkdirEntry",
    "fingerprint_of",
    "format_mb",
    "format_seconds",
    "normalize_fingerprint",
    "parse_duration",
    "parse_mb",
    "validate_relpath",
]
