"""Runs on the user's machine: how the client reaches an agent (the transport seam).

Every way in ends as an httpx transport: a Unix socket for the local agent today; the SSH
tunnel and TLS transports plug in here. Tests may pass any httpx transport, including an
in-process ASGI app.
"""

from __future__ import annotations

import ssl

import httpx

from gpuhop.client.embedded import ensure_agent
from gpuhop.home import AgentPaths


def local_transport(paths: AgentPaths, autostart: bool = True) -> httpx.BaseTransport:
    """A transport to the agent of `paths`, starting that agent first if asked to."""
    if autostart:
        ensure_agent(paths)
    # No TLS on a Unix socket. An empty client context (verification on, no CAs) saves
    # loading the CA bundle, about 75 ms of every command.
    return httpx.HTTPTransport(uds=str(paths.socket), verify=_NO_TLS)


_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
