"""Runs on the user's machine: which agent a `Client` talks to, and the endpoint that
reaches it: a configured remote's (through SSH or TLS) or the local agent's socket.

The remotes file (`remotes`) and the two ways to a remote (`ssh`, `tls`) know nothing of
each other; this module is the one place that picks between them.
"""

from __future__ import annotations

from gpuhop.client.errors import GpuhopError
from gpuhop.client.transport.base import Endpoint, local_endpoint
from gpuhop.client.transport.remotes import Remote, selected
from gpuhop.home import AgentError, AgentPaths


def choose(paths: AgentPaths, remote: str | None, home_given: bool, autostart: bool) -> Endpoint:
    """The endpoint of the agent a client should talk to.

    An explicit remote wins; an explicit home means that local agent; otherwise
    $GPUHOP_REMOTE or the default remote, if any, else the local agent of `paths`.
    """
    target = selected(remote) if remote is not None or not home_given else None
    if target is not None:
        return endpoint_for(target)
    try:
        return local_endpoint(paths, autostart=autostart)
    except AgentError as e:
        raise GpuhopError(str(e), code="unreachable") from None


def endpoint_for(remote: Remote) -> Endpoint:
    """Connect to a remote: set up its channel and return the endpoint to talk through."""
    # Each way's module only when a remote takes it: not on every command to the local agent.
    if remote.scheme == "ssh":
        from gpuhop.client.transport.ssh import ssh_endpoint

        return ssh_endpoint(remote)
    from gpuhop.client.transport.tls import https_endpoint

    return https_endpoint(remote)
