"""The Slurm backend: each job one `sbatch` job of the agent's user, led from the agent's
host by a leader process (`leader`) and run on its compute node by `task`; `backend` is
what the agent calls."""
