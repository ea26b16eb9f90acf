"""The Ray backend: jobs run on the nodes of an existing Ray cluster.

- `backend` runs in the agent (no Ray import): probes the cluster at start, gives the
  scheduler the cluster's GPUs, and starts each job's leader.
- `probe` asks the cluster's GCS over gRPC about authentication and nodes.
- `leader` runs on the agent's host, one per running job: the job's Ray driver.
- `worker` runs on the nodes, one Ray actor per worker of a job.
- `transfer` packs and unpacks the files that travel between them.

This package imports nothing, so the modules that run on the nodes load only what they need.
"""
