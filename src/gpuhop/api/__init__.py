"""The wire contract shared by the client and the agent: request/response models and error codes.

Runs on both sides. Imports pydantic only; never agent or client code. Names load on first
use (PEP 562), each from its own module: `from gpuhop.api import JobState, parse_mb` loads
neither pydantic nor a model class, so a CLI command that reads the agent's JSON starts
without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from gpuhop.api.energy import EnergyUse, JobEnergy
    from gpuhop.api.errors import ErrorBody, ErrorCode
    from gpuhop.api.fingerprints import fingerprint_of, normalize_fingerprint
    from gpuhop.api.models import (
        AttemptInfo,
        BlobCheck,
        BlobCheckResult,
        JobInfo,
        ManifestEntry,
        RequeueRequest,
        SubmitRequest,
        Tree,
        TreeDelta,
        TreeStored,
        validate_relpath,
    )
    from gpuhop.api.outputs import ArtifactEntry, WorkdirEntry
    from gpuhop.api.profile import JobProfile, ProcessProfile
    from gpuhop.api.provenance import Change, JobDiff
    from gpuhop.api.queue import format_seconds, parse_duration
    from gpuhop.api.secrets import SecretInfo, SecretValue
    from gpuhop.api.serving import ServeRequest, ServingInfo
    from gpuhop.api.sizes import format_mb, parse_mb
    from gpuhop.api.stacks import JobStacks, ProcessStacks
    from gpuhop.api.states import EndClass, JobState, RetryOn
    from gpuhop.api.tensorboard import TensorBoardInfo
    from gpuhop.api.ui import UiLoginCode

# Each public name and the module under gpuhop.api that defines it.
_WHERE: dict[str, str] = {
    "AgentInfo": "agent",
    "ArtifactEntry": "outputs",
    "AttemptInfo": "models",
    "BlobCheck": "models",
    "BlobCheckResult": "models",
    "Change": "provenance",
    "CheckStatus": "agent",
    "DoctorCheck": "agent",
    "EnergyUse": "energy",
    "EndClass": "states",
    "ErrorBody": "errors",
    "ErrorCode": "errors",
    "GpuInfo": "agent",
    "JobDiff": "provenance",
    "JobEnergy": "energy",
    "JobInfo": "models",
    "JobProfile": "profile",
    "JobStacks": "stacks",
    "JobState": "states",
    "ListenerInfo": "agent",
    "ManifestEntry": "models",
    "ProcessProfile": "profile",
    "ProcessStacks": "stacks",
    "RequeueRequest": "models",
    "RetryOn": "states",
    "SecretInfo": "secrets",
    "SecretValue": "secrets",
    "ServeRequest": "serving",
    "ServingInfo": "serving",
    "SubmitRequest": "models",
    "TensorBoardInfo": "tensorboard",
    "TokenCreated": "agent",
    "TokenInfo": "agent",
    "TokenRequest": "agent",
    "Tree": "models",
    "TreeDelta": "models",
    "TreeStored": "models",
    "UiLoginCode": "ui",
    "WorkdirEntry": "outputs",
    "fingerprint_of": "fingerprints",
    "format_mb": "sizes",
    "format_seconds": "queue",
    "normalize_fingerprint": "fingerprints",
    "parse_duration": "queue",
    "parse_mb": "sizes",
    "validate_relpath": "models",
}

__all__ = [
    "AgentInfo",
    "ArtifactEntry",
    "AttemptInfo",
    "BlobCheck",
    "BlobCheckResult",
    "Change",
    "CheckStatus",
    "DoctorCheck",
    "EndClass",
    "EnergyUse",
    "ErrorBody",
    "ErrorCode",
    "GpuInfo",
    "JobDiff",
    "JobEnergy",
    "JobInfo",
    "JobProfile",
    "JobStacks",
    "JobState",
    "ListenerInfo",
    "ManifestEntry",
    "ProcessProfile",
    "ProcessStacks",
    "RequeueRequest",
    "RetryOn",
    "SecretInfo",
    "SecretValue",
    "ServeRequest",
    "ServingInfo",
    "SubmitRequest",
    "TensorBoardInfo",
    "TokenCreated",
    "TokenInfo",
    "TokenRequest",
    "Tree",
    "TreeDelta",
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


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"gpuhop.api.{module}"), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value
