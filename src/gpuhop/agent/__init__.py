"""The agent: a daemon on the GPU host that stores, schedules and supervises jobs."""
