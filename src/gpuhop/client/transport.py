"""Runs on the user's machine: how the client reaches an agent (the transport seam).

Every way in ends as an httpx transport: a Unix socket for the local agent today; the SSH
tunnel and TLS transports plug in here. Tests may pass any httpx transport, including an
in-process ASGI app.
"""

from __future__ import annotations

import httpx

from gpuhop.client.embedded import ensure_agent
from gpuhop.home import AgentPaths


def local_transport(paths: AgentPaths, autostart: bool = True) -> httpx.BaseTransport:
    """A transport to the agent of `paths`, starting that agent first if asked to."""
    if autostart:
        ensure_agent(paths)
    return httpx.HTTPTransport(uds=str(paths.socket))
