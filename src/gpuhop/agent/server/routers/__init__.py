"""Runs in the agent: thin HTTP routes; each parses, calls one service, returns."""
