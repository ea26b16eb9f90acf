"""Runs on the user's machine: how the client reaches an agent (see base.py)."""
