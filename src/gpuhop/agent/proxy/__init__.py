"""Runs in the agent: the proxies, which carry a caller's bytes to a server inside a job and
back: `jobports` connects to a job's port (on the host's loopback, or in its private
network through its relay), `bridge` carries one such connection over a WebSocket
(`gpuhop forward`), `upstream` is the HTTP client to a job's server, and `modelserver` the
HTTP proxy to a model server job over it. Which job a caller may reach is the request
handlers' to decide (`gpuhop.agent.services`: ports, serving), before a proxy is used."""
