"""The local backend: each job runs on the agent's own host under a leader.

- `backend` runs in the agent: the environment contract, and the leader's arguments.
- `leader` leads each job's process group on the host; `sandbox`, `relay` and `envbuild` run
  in it. These four import the standard library only: the leader runs with `python -I -S`.
- `commands` turns a job's command into an argv, here and on Ray's nodes.

This package imports nothing, so the leader's helpers load only what they need.
"""
