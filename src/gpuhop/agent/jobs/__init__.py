"""Runs in the agent: the job lifecycle (store, placement policy, scheduler, supervisor,
what a job needs)."""
