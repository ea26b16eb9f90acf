"""Runs in the agent: fetches a queued job's buckets' data (`--data s3://...`) onto this host
while the job waits, and holds the job in the queue until the data is whole.

A fetch starts at submit (or at the scheduler's first look at the job, after an agent
restart: the objects already cached are not fetched again). For each source it lists the
prefix with the job's user's own credentials, downloads in parallel the objects that user's
cache lacks, and makes the view the job will see (see `gpuhop.agent.storage.objectcache`).
Then it adds the views to the job's deps as its datasets' trees are (`deps["data"]`, bound
read-only under $GPUHOP_DATA), and the scheduler may start it. Meanwhile `note` says how
far it is, as the job's `waiting`. A failure ends the job, never started, as `failed` with
class `data-error` and the bucket's own words (the waiting and the failing are
`gpuhop.agent.jobs.preparations`', as for a job's image).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, NamedTuple

from gpuhop.agent.jobs.preparations import Preparations, Unmet
from gpuhop.agent.jobs.records import as_text
from gpuhop.agent.jobs.store import ACTIVE_STATES, JobRecord, JobStore
from gpuhop.agent.storage import bucketreads, buckets
from gpuhop.agent.storage.blobs import QuotaExceeded
from gpuhop.agent.storage.buckets import BucketError, Credentials
from gpuhop.agent.storage.objectcache import CacheFull, Keep, ObjectCache
from gpuhop.agent.storage.objectdownloads import Listed, ObjectId
from gpuhop.api import EndClass, JobState, format_mb
from gpuhop.api.spec import DataSource
from gpuhop.backends import jobdeps
from gpuhop.home import AgentPaths, JobPaths

log = logging.getLogger("gpuhop.agent")

# Objects downloaded at once for one job.
PARALLEL = 16
# How often a fetch looks whether its job is still queued (a cancel stops it).
CHECK_SECONDS = 0.5
# An object whose read the way to the bucket broke mid-body (a server gone, a connection
# cut: botocore tries a request again only before its body comes) is read again from where
# it stopped after each of these waits, then the job fails: a server restarting within
# seconds costs nothing, one that stays away ends the job as data-error within seconds
# (each try also has botocore's own 3 attempts) rather than holding it in the queue, and
# the next job with that data goes on from the bytes already here.
RETRY_SECONDS = (1.0, 2.0)


# A download without a byte for this long is said to be stalled (`Fetch.note`).
STALLED = 10.0


class Fetch:
    """One job's fetch as it goes: what `note` reports. Counters move under `lock`."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.lock = threading.Lock()
        self.phase = "listing"
        self.objects = self.objects_done = 0
        self.bytes = self.bytes_done = 0
        # The objects this fetch downloaded itself, by digest, with their sizes: not those
        # that were cached, nor those another fetch brought meanwhile (a sweep's runs list
        # the same new objects at once, and each is read once).
        self.downloaded: dict[str, int] = {}
        self.started = time.monotonic()
        self.last_byte = self.started  # when the download last moved

    def add(self, n: int) -> None:
        with self.lock:
            self.bytes_done += n
            self.last_byte = time.monotonic()

    def note(self) -> str:
        with self.lock:
            if self.phase == "listing":
                return "fetching data: listing the bucket"
            done, total = self.bytes_done, self.bytes
            text = (
                f"fetching data: {self.objects_done}/{self.objects} objects,"
                f" {_size(done)} of {_size(total)}"
            )
            now = time.monotonic()
            elapsed, still = now - self.started, now - max(self.last_byte, self.started)
        if total > done and still >= STALLED:  # an average rate would hide it
            return (
                f"{text}, no byte for {still:.0f}s: the bucket's server is slow or not"
                " answering (a read is given up after 60s, and tried again twice)"
            )
        if done and elapsed > 0:
            speed = done / elapsed
            text += f", {_size(speed)}/s"
            if total > done:  # as `run`'s status line says a fit's: ETA m:ss
                left = int((total - done) / speed)
                text += f", ETA {left // 60}:{left % 60:02d}"
        return text

    def summary(self) -> str:
        """What the fetch did, once its data is whole: as the agent's log records it."""
        with self.lock:
            return (
                f"{self.objects} objects, {len(self.downloaded)} of them fetched"
                f" ({_size(self.bytes_done)} in {time.monotonic() - self.started:.1f}s)"
            )


def _size(n: float) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else format_mb(n / (1 << 20))


class Room(NamedTuple):
    """What a fetch asks before it downloads: the cache's bound, the storage quota's check
    (raises QuotaExceeded), and the blobs that something besides the cache names (job trees,
    datasets: eviction leaves those on disk)."""

    limit: Callable[[], int | None]
    check_storage: Callable[[int], None]
    blob_users: Callable[[], set[str]]


class Fetches(Preparations[Fetch]):
    """The agent's fetches, one per queued job with buckets' data. Thread-safe."""

    end_class = EndClass.data_error
    failure = "could not fetch its data"
    idle_note = "fetching data"

    def __init__(
        self,
        paths: AgentPaths,
        store: JobStore,
        cache: ObjectCache,
        room: Room,
        credentials: Callable[[JobRecord], Credentials],
        masked: Callable[[JobRecord, str], str],
        on_done: Callable[[str, JobState], None],
    ):
        """`credentials`: the job's user's, read as its fetch starts; `masked`: a text
        with the job's user's secrets' values hidden; `on_done`: a fetch finished (the job
        may start) or failed it (its final state, for its notifications)."""
        super().__init__(store, on_done, "fetch")
        self.paths = paths
        self.cache = cache
        self.room = room
        self.credentials = credentials
        self.masked = masked
        # What each fetch under way has listed: eviction leaves it (see `keep`).
        self._pins: dict[str, Keep] = {}

    def wants(self, job: JobRecord) -> bool:
        return bool(job.spec.data_sources)

    def ready(self, job: JobRecord) -> bool:
        return "data_dir" in jobdeps.read(JobPaths(self.paths.job_dir(job.id)))

    def begin(self, job: JobRecord) -> Fetch:
        return Fetch(job.id)

    def forget(self, job_id: str) -> None:
        self._pins.pop(job_id, None)  # under the lock

    def keep(self) -> Keep:
        """The views and objects that queued or running jobs and fetches under way need."""
        keep = Keep(set(), set())
        with self._lock:
            for pin in self._pins.values():
                keep.views.update(pin.views)
                keep.objects.update(pin.objects)
        for job in self.store.list([JobState.queued, *ACTIVE_STATES], limit=100_000):
            for mount in jobdeps.read(JobPaths(self.paths.job_dir(job.id))).get("data", []):
                if "url" in mount:
                    keep.views.add(Path(mount["source"]).name)
        return keep

    # -- one job's fetch -------------------------------------------------------------------

    def prepare(self, job: JobRecord, fetch: Fetch) -> None:
        try:
            views = self._fetch(job, fetch)
        except BucketError as e:
            raise Unmet(as_text(self.masked(job, str(e)))) from None
        except (CacheFull, QuotaExceeded) as e:
            raise Unmet(str(e)) from None
        jp = JobPaths(self.paths.job_dir(job.id))
        deps = jobdeps.read(jp)
        deps["data"] = [*deps.get("data", []), *views]
        deps["data_dir"] = jobdeps.DATA_DIR
        jobdeps.write(jp, deps)
        log.info("job %s: its data is here: %s", job.id, fetch.summary())

    def _fetch(self, job: JobRecord, fetch: Fetch) -> list[dict[str, Any]]:
        creds = self.credentials(job)
        why = creds.missing()
        if why is not None:
            raise BucketError(why)
        user, cache = creds.owner, self.cache
        # A connection for each read at once: PARALLEL objects, a large one in parts (with
        # fewer, the reads beyond them each opened a connection and threw it away).
        s3 = buckets.client(creds, PARALLEL * buckets.PART_THREADS)
        listings: list[tuple[DataSource, list[Listed]]] = []
        for source in job.spec.data_sources:
            try:
                listed = buckets.listing(s3, source, creds.endpoint)
            except BucketError as e:
                raise BucketError(f"{source.url}: {e}") from None
            if not listed:  # a mistyped prefix, most often: not a job's data
                raise BucketError(
                    f"{source.url}: no object there (keys are case-sensitive; is the prefix right?)"
                )
            listings.append((source, listed))
            self.check(job.id)
        # Pinned before anything is looked at: eviction leaves it from now. A listing whose
        # view is here has all its objects here (an unchanged prefix costs no look at each
        # object); the others' objects are pinned, then asked for in one query.
        names = [ObjectCache.view_name(listed) for _, listed in listings]
        self._pin(job.id, views=names)
        changed = [
            listed
            for (_, listed), name in zip(listings, names, strict=True)
            if cache.view(user, name) is None
        ]
        ids = {e.id.digest(): e.id for listed in changed for e in listed}
        self._pin(job.id, objects=ids)
        lacking = cache.lacking(user, ids)
        wanted = [oid for digest, oid in ids.items() if digest in lacking]
        partials = cache.downloads.partials(user, wanted)
        need = sum(oid.size - have for oid, (_, have) in partials.items())
        with fetch.lock:
            fetch.phase = "downloading"
            fetch.started = time.monotonic()  # the rate is the download's, listing aside
            fetch.objects = sum(len(listed) for _, listed in listings)
            fetch.objects_done = fetch.objects - len(wanted)
            fetch.bytes = need
        if wanted:
            limit = self.room.limit()
            if limit is not None:
                cache.make_room(need, limit, self.keep(), self.room.blob_users)
            self.room.check_storage(need)
            self._download(job.id, s3, user, partials, fetch)
            lost = cache.lacking(user, (oid.digest() for oid in wanted))
            if lost:  # its bytes could not be flushed or named: the agent's log says why
                raise BucketError(
                    f"{len(lost)} of its objects came but could not be stored on this host"
                    " (see the agent's log)"
                )
        views = []
        with fetch.lock:
            brought = dict(fetch.downloaded)
        for (source, listed), name in zip(listings, names, strict=True):
            view = cache.make_view(user, listed, name)
            cache.used(user, source.url, creds.endpoint, listed, name)
            fetched = [brought[e.id.digest()] for e in listed if e.id.digest() in brought]
            views.append(
                {
                    "name": source.name,
                    "url": source.url,
                    "mount": f"{jobdeps.DATA_DIR}/{source.name}",
                    "source": str(view),
                    # What the job saw and what it took (`gpuhop show`, `diff`): the
                    # view's name is the digest of the listing's paths and identities.
                    "objects": len(listed),
                    "bytes": sum(e.id.size for e in listed),
                    "fetched": len(fetched),
                    "fetched_bytes": sum(fetched),
                    "ready_at": time.time(),
                }
            )
        return views

    def _download(
        self,
        job_id: str,
        s3: Any,
        user: str,
        partials: dict[ObjectId, tuple[Path, int]],
        fetch: Fetch,
    ) -> None:
        """Download each of `partials` (an object, its partial and the bytes it holds)
        not downloaded already by another fetch, and commit it; returns once each is
        named in the cache."""
        stop = threading.Event()

        def one(oid: ObjectId, part: Path, have: int) -> None:
            while True:
                claim = self.cache.downloads.claim(user, oid)
                if claim is None:  # another fetch (of this user's) brought it meanwhile
                    fetch.add(oid.size - have)
                    break
                if claim.mine:
                    try:
                        if not fetched(oid, part):
                            return
                    finally:
                        self.cache.downloads.release(user, oid)
                    with fetch.lock:
                        fetch.downloaded[oid.digest()] = oid.size
                    break
                # Another fetch downloads it into the same partial: its end is waited for,
                # then asked about again (its object committed: taken; else this one goes on
                # from its bytes).
                while not claim.done.wait(CHECK_SECONDS):
                    if stop.is_set() or self._stopping.is_set():
                        return
            with fetch.lock:
                fetch.objects_done += 1

        def fetched(oid: ObjectId, part: Path) -> bool:
            """Download `oid` and commit it; False where the fetch stopped first."""
            came = None
            for attempt in range(len(RETRY_SECONDS) + 1):
                if stop.is_set():
                    return False
                try:
                    came = bucketreads.download(s3, oid, part, fetch.add)
                    break
                except BucketError as e:
                    if not e.transient or attempt == len(RETRY_SECONDS):
                        tries = f" (tried {attempt + 1} times)" if e.transient else ""
                        raise BucketError(f"s3://{oid.bucket}/{oid.key}: {e}{tries}") from None
                    log.info(
                        "job %s: reading s3://%s/%s failed (%s); trying again from where it"
                        " stopped",
                        job_id,
                        oid.bucket,
                        oid.key,
                        e,
                    )
                    if stop.wait(RETRY_SECONDS[attempt]) or self._stopping.is_set():
                        return False
            try:
                if came is None:
                    self.cache.downloads.commit(user, oid, part)
                else:
                    self.cache.downloads.commit(user, oid, part, came.sha, came.size)
            except ValueError as e:
                raise BucketError(str(e)) from None
            return True

        # PARALLEL workers, each taking the next object until none is left (or the fetch
        # stops): a future for each object cost a many-object fetch more of the agent's CPU
        # than its own writes (the futures made, then waited for in turn).
        left = iter(list(partials.items()))
        taking = threading.Lock()

        def worker() -> None:
            while not stop.is_set():
                with taking:
                    item = next(left, None)
                if item is None:
                    return
                oid, (part, have) = item
                one(oid, part, have)

        with ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="fetch-get") as pool:
            workers = [pool.submit(worker) for _ in range(min(PARALLEL, len(partials)))]
            try:
                while workers:  # woken by the first error or the last worker's end
                    done, pending = wait(workers, CHECK_SECONDS, FIRST_EXCEPTION)
                    for future in done:
                        future.result()
                    workers = list(pending)
                    if workers:
                        self.check(job_id)
            except BaseException:
                stop.set()
                raise
            finally:
                self.cache.downloads.flush()  # what came is named, for the view and the next fetch
        self.check(job_id)  # a download that stopped for the agent's end is no whole one

    def _pin(self, job_id: str, views: Iterable[str] = (), objects: Iterable[str] = ()) -> None:
        """Keep these views and objects from eviction while the job's fetch runs."""
        with self._lock:
            pin = self._pins.setdefault(job_id, Keep(set(), set()))
            pin.views.update(views)
            pin.objects.update(objects)
