"""Runs in the agent: what each API call does, independent of HTTP."""
