"""Runs in the agent: the HTTP server (app, listeners, auth, tokens, routers, duties, metrics)."""
