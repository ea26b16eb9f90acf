"""Runs in the agent: content storage (blobs, trees, chunks, claims, datasets, environments,
garbage collection, disk usage)."""
