"""Runs in the agent: which blobs something names (job dirs' trees, dataset versions), for
the collections that must leave those on disk (`gpuhop gc`, the object cache's eviction)."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from gpuhop.agent.storage.datasets import DatasetStore


def job_references(jobs: Path, gone: Iterable[str] = ()) -> tuple[set[str], set[str]]:
    """The trees that job dirs under `jobs` (but those named in `gone`) hold copies of, and
    the blobs those name."""
    skip = set(gone)
    trees: set[str] = set()
    blobs: set[str] = set()
    for tree in jobs.glob("*/tree.json"):
        if tree.parent.name in skip:
            continue
        try:
            raw = tree.read_bytes()
            entries = json.loads(raw)["entries"]
        except (OSError, ValueError, KeyError):
            continue
        trees.add(hashlib.sha256(raw).hexdigest())
        blobs.update(e["digest"] for e in entries)
    return trees, blobs


def dataset_chunks(datasets: DatasetStore) -> set[str]:
    """The chunks every version of every dataset names."""
    chunks: set[str] = set()
    for name in datasets.names():
        for version in datasets.versions(name):
            with contextlib.suppress(OSError, ValueError, KeyError):
                for f in datasets.manifest(name, version):
                    chunks.update(f["chunks"])
    return chunks


def blob_users(jobs: Path, datasets: DatasetStore) -> set[str]:
    """The blobs that job dirs' trees and dataset versions name."""
    return job_references(jobs)[1] | dataset_chunks(datasets)
