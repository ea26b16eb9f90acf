"""Runs on the user's machine: a work dir's and a dataset's sync to the agent."""
