"""A dataset's owner check and the change it allows happen under the name's lock, for a
removal as for a push (issue 19): the real stores, the service's own functions."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from gpuhop.agent.callers import Caller
from gpuhop.agent.services import datasets as service
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.datasets import DatasetStore
from gpuhop.agent.storage.uses import UseLock


class WatchedStore(DatasetStore):
    """Records, at each owner check, whether the name's lock was held (by the caller: a
    probe from another thread cannot take it)."""

    def __init__(self, root: Path, blobs: BlobStore):
        super().__init__(root, blobs)
        self.checks: list[bool] = []

    def readable_by(self, name: str, user: str) -> bool:
        lock = self.locked(name)
        taken: list[bool] = []
        probe = threading.Thread(target=lambda: taken.append(lock.acquire(blocking=False)))
        probe.start()
        probe.join()
        if taken[0]:
            lock.release()
        self.checks.append(not taken[0])
        return super().readable_by(name, user)


def test_data_rm_checks_the_owner_under_the_names_lock(tmp_path):
    (tmp_path / "blobs").mkdir()
    (tmp_path / "tmp").mkdir()
    store = WatchedStore(tmp_path / "datasets", BlobStore(tmp_path / "blobs", tmp_path / "tmp"))
    rt = SimpleNamespace(
        datasets=store,
        store=SimpleNamespace(list=lambda *args, **kwargs: []),  # no job uses it
        uses=UseLock(),
    )
    alice = Caller("alice", admin=False)
    # Pushed as an admin would (no claims to check), under alice's name.
    service.push(rt, "ds", b'{"files": []}', Caller("alice", admin=True))  # type: ignore[arg-type]
    store.checks.clear()
    assert service.remove(rt, "ds", None, alice) == [1]  # type: ignore[arg-type]
    assert store.checks and all(store.checks), store.checks
