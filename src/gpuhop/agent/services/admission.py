"""Runs in the agent: what a caller may ask of a shared agent before a job is queued —
the priority it jumps the queue with, and the disk its files take against `jobs_quota`.

Both are judged from what the agent knows, never from what the client declares: the
priority rule from the caller's token, a job's size from the blobs its tree names.
"""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.api import ErrorCode, SubmitRequest
from gpuhop.api.spec import JobSpec

# The priority a job gets when it asks for none; only an admin queues a job above it.
DEFAULT_PRIORITY: int = SubmitRequest.model_fields["priority"].default


def check_priority(spec: JobSpec, caller: Caller) -> None:
    """A shared queue is served by priority, then age: jumping it is an admin's call. On a
    single-user agent the only caller is the owner, an admin, so this binds only the users
    of a team agent. Asking for the default or less is always allowed."""
    check_priority_value(spec.priority, caller)


def check_priority_value(priority: int, caller: Caller) -> None:
    """The rule of `check_priority`, also for a queued job's new priority (`requeue`)."""
    if priority > DEFAULT_PRIORITY and not caller.admin:
        raise ApiError(
            403,
            ErrorCode.forbidden,
            f"priority {priority} is above the default ({DEFAULT_PRIORITY}): on a team"
            " agent only an admin may raise a job's priority (the default or lower is fine)",
        )


def tree_bytes(rt: AgentContext, tree: str) -> int:
    """The bytes a job's work dir will take: each entry's blob as stored. A tree's own
    `size` fields are the client's word and may say anything (0 for a 5 MiB file), so they
    are never what a quota is held to. A blob gone since the tree arrived counts as
    declared (the job then fails to materialise it, saying so)."""
    total = 0
    for entry in rt.trees.entries(tree):
        try:
            total += rt.blobs.path(entry["digest"]).stat().st_size
        except OSError:
            total += int(entry.get("size", 0))
    return total
