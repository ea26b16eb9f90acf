"""Runs in the agent: the job lifecycle (store, scheduler, policy, what a job needs)."""
