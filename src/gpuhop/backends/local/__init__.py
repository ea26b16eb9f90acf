"""The local backend: each job runs on the agent's own host under a shim.

- `backend` runs in the agent: the environment contract, and the shim's arguments.
- `shim` leads each job's process group on the host; `sandbox`, `relay` and `envbuild` run
  in it. These four import the standard library only: the shim runs with `python -I -S`.
- `commands` turns a job's command into an argv, here and on Ray's nodes.

This package imports nothing, so the shim's helpers load only what they need.
"""
