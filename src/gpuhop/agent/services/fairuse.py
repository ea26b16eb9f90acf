"""Runs in the agent: what a submit is checked against besides the job itself — a user's
queued jobs (`user_max_queued`), the webhooks it names (`notify`), and whether the GPUs it
asks for exist here of one model (`mixed_gpus`).

A user's GPUs held at once (`user_max_gpus`) is checked here only for a job that asks for
more than it by itself; a job over it with the user's other jobs is queued and waits (the
scheduler's `Limits`), and `show` says why.
"""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.jobs.placement import largest_kind
from gpuhop.api import ErrorCode
from gpuhop.api.queue import shown_webhook
from gpuhop.api.spec import JobSpec


def check(rt: AgentContext, spec: JobSpec, caller: Caller) -> None:
    """Raise ApiError naming the problem if a job of `spec` may not be queued for `caller`."""
    gpu_cap = rt.policy.user_max_gpus
    if gpu_cap is not None and not caller.admin and spec.gpus > gpu_cap:
        raise ApiError(
            400,
            ErrorCode.unsatisfiable,
            f"the job asks for {spec.gpus} GPUs; this agent lets a user hold at most {gpu_cap}"
            " at once (user_max_gpus), so it could never start",
        )
    for url in spec.notify:
        refused = rt.notify_rule.refusal(url, resolve=False)
        if refused is not None:
            raise ApiError(400, ErrorCode.bad_request, f"notify {shown_webhook(url)}: {refused}")
    if spec.gpus > 1 and spec.gpu_memory_mb is None and not spec.mixed_gpus:
        kinds = {g.index: g.kind for g in rt.gpus}
        most = largest_kind(kinds, kinds)
        if spec.gpus > most:
            raise ApiError(
                400,
                ErrorCode.unsatisfiable,
                f"the job asks for {spec.gpus} GPUs of one model and group; this host has at"
                f" most {most} alike ({_models(rt)}): ask for fewer, or allow --mixed-gpus",
            )
    # Last: a job refused for good (above) is told so, not 429's "try again later", which
    # would never help it.
    cap = rt.policy.user_max_queued
    if cap is not None and not caller.admin:
        queued = rt.store.queued_of(caller.user)
        if queued >= cap:
            raise ApiError(
                429,
                ErrorCode.too_many,
                f"{caller.user} already has {queued} job(s) queued; this agent allows"
                f" {cap} per user (user_max_queued): submit more once some have started",
                {"queued": queued, "limit": cap},
            )


def _models(rt: AgentContext) -> str:
    counts: dict[str, int] = {}
    for g in rt.gpus:
        label = g.name + (f" in group {g.group}" if g.group else "")
        counts[label] = counts.get(label, 0) + 1
    return ", ".join(f"{n} x {label}" for label, n in counts.items())
