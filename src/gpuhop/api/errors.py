"""Error codes and the error body every 4xx/5xx answer carries. Shared by client and agent."""

from enum import StrEnum

from gpuhop.api.base import WireModel


class ErrorCode(StrEnum):
    bad_request = "bad_request"
    bad_path = "bad_path"
    bad_blob = "bad_blob"
    missing_blobs = "missing_blobs"
    missing_tree = "missing_tree"
    not_found = "not_found"
    ambiguous = "ambiguous"
    conflict = "conflict"
    # A job port that nothing listens on (port forwarding).
    not_listening = "not_listening"
    unsatisfiable = "unsatisfiable"
    # Something this agent's backend cannot do (the reason is in the message).
    unsupported = "unsupported"
    too_large = "too_large"
    # A disk quota (or the disk itself) has no room for it: 507, with the figures.
    insufficient_storage = "insufficient_storage"
    # A finished job's files were removed by retention; its record stays (410).
    pruned = "pruned"
    unauthorized = "unauthorized"  # TCP listener: no token, or one that is wrong or revoked
    forbidden = "forbidden"  # a valid token that may not do this (admin-only routes)
    # A per-user limit of a team agent (queued jobs): 429, try again when some have run.
    too_many = "too_many"
    # A container registry refused or failed a pull (502): its own words are the message.
    registry = "registry"
    internal = "internal"


class ErrorBody(WireModel):
    code: ErrorCode
    message: str
    # Extra machine-readable detail, e.g. the digests that are missing.
    detail: dict[str, object] | None = None
