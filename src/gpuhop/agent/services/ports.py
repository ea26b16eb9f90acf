"""Runs in the agent: port forwarding's requests (`gpuhop forward`, and every command that
forwards a job's port: notebook, tensorboard, tf-server): which job and port, and whether
the caller may reach them now. The connection itself is the proxy's: `gpuhop.agent.proxy`
(`jobports` reaches the port, `bridge` carries it over a WebSocket). A client on this host
skips the WebSocket: the agent hands it the connected socket (`gpuhop.agent.server.handoff`),
so no byte of a forward on this host passes through the agent.
"""

from __future__ import annotations

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.errors import ApiError
from gpuhop.agent.jobs.store import JobRecord
from gpuhop.agent.proxy.jobports import open_socket
from gpuhop.agent.services import jobs
from gpuhop.api import ErrorCode


def parse_port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ApiError(400, ErrorCode.bad_request, f"a port is a number 1-65535, not {text!r}")
    return int(text)


def forwardable(rt: AgentContext, ref: str, caller: Caller) -> JobRecord:
    """The job `ref` names, if `caller` may see it (only its owner, or an admin) and it runs
    now in a way whose ports can be reached."""
    job = jobs.find(rt, ref, caller)
    if rt.backend.elsewhere(rt.supervisor.job_paths(job.id)):
        raise ApiError(
            409,
            ErrorCode.conflict,
            f"job {job.id} runs on {rt.backend.where}, not on the agent's host; gpuhop forward"
            " reaches ports on the agent's host only",
        )
    jobs.check_running(job, "no ports to forward")
    return job


async def check(rt: AgentContext, ref: str, port_text: str, caller: Caller) -> JobRecord:
    """Refuse as a forward's WebSocket would, without keeping a connection: its first check."""
    port = parse_port(port_text)
    job = forwardable(rt, ref, caller)
    (await open_socket(rt, job, port)).close()
    return job
