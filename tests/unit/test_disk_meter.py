"""The agent's disk meter (gpuhop.agent.storage.usage.DiskMeter) on a real blob store in a
temporary state dir: what it says is stored, and when it refuses."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpuhop.agent.config import Policy
from gpuhop.agent.storage.blobs import BlobStore, New, QuotaExceeded
from gpuhop.agent.storage.usage import DiskMeter
from gpuhop.home import AgentPaths

MIB = 1 << 20


def _meter(tmp_path: Path, quota: int) -> tuple[DiskMeter, BlobStore]:
    paths = AgentPaths(tmp_path / "home")
    for folder in (paths.blobs, paths.tmp):
        folder.mkdir(parents=True)
    blobs = BlobStore(paths.blobs, paths.tmp)
    return DiskMeter(paths, blobs, Policy(storage_quota=quota)), blobs


def _put(blobs: BlobStore, size: int) -> New:
    """Store `size` new bytes; what was stored, as an upload notes it (`unstore` takes it)."""
    data = os.urandom(size)
    stored: New = {}
    blobs.put(hashlib.sha256(data).hexdigest(), data, stored)
    return stored


def test_bytes_gone_since_they_were_counted_do_not_refuse_what_fits(tmp_path: Path):
    # Between walks the meter adds what the blob store stores, and takes nothing off: what
    # a refused upload stored and took back again kept a push that fits refused (507) for
    # the walk's 5 s. A refusal now walks the stores first.
    meter, blobs = _meter(tmp_path, 3 * MIB)
    assert meter.storage() == 0  # walked
    refused = _put(blobs, 2 * MIB)
    assert meter.storage() == 2 * MIB  # counted, not walked
    blobs.unstore(refused)  # taken back, as a refused upload's are
    meter.check_storage(2 * MIB)  # fits: 0 of 3 MiB in use
    # And what is there is still counted: a real 2.5 MiB refuses 1 MiB more.
    _put(blobs, 2 * MIB + MIB // 2)
    with pytest.raises(QuotaExceeded, match="would pass the agent's storage quota"):
        meter.check_storage(MIB)
