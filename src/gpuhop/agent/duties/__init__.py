"""Runs in the agent: its periodic duties, each a small object with an interval and one
`run()` (garbage collection, the log cap, time limits, GPU sampling, GPU health, idle GPUs),
and the loop that runs them (`runner`)."""
