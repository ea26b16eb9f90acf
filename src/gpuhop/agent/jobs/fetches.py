"""Runs in the agent: fetches a queued job's buckets' data (`--data s3://...`) onto this host
while the job waits, and holds the job in the queue until the data is whole.

A fetch starts at submit (or at the scheduler's first look at the job, after an agent
restart: the objects already cached are not fetched again). For each source it lists the
prefix with the job's user's own credentials, downloads in parallel the objects that user's
cache lacks, and makes the view the job will see (see `gpuhop.agent.storage.objectcache`).
Then it adds the views to the job's deps as its datasets' trees are (`deps["data"]`, bound
read-only under $GPUHOP_DATA), and the scheduler may start it. Meanwhile `note` says how
far it is, as the job's `waiting`. A failure ends the job, never started, as `failed` with
class `data-error` and the bucket's own words.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuhop.agent.jobs.records import as_text
from gpuhop.agent.jobs.store import JobRecord, JobStore
from gpuhop.agent.storage import buckets
from gpuhop.agent.storage.buckets import BucketError, Credentials
from gpuhop.agent.storage.objectcache import Listed, ObjectCache
from gpuhop.api import EndClass, JobState, format_mb
from gpuhop.api.spec import DataSource
from gpuhop.backends import jobdeps
from gpuhop.home import AgentPaths, JobPaths

log = logging.getLogger("gpuhop.agent")

# Objects downloaded at once for one job.
PARALLEL = 16
# How often a fetch looks whether its job is still queued (a cancel stops it).
CHECK_SECONDS = 0.5


class Fetch:
    """One job's fetch as it goes: what `note` reports. Counters move under `lock`."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        self.lock = threading.Lock()
        self.phase = "listing"
        self.objects = self.objects_done = 0
        self.bytes = self.bytes_done = 0
        self.started = time.monotonic()

    def add(self, n: int) -> None:
        with self.lock:
            self.bytes_done += n

    def note(self) -> str:
        with self.lock:
            if self.phase == "listing":
                return "fetching data: listing the bucket"
            done, total = self.bytes_done, self.bytes
            text = (
                f"fetching data: {self.objects_done}/{self.objects} objects,"
                f" {_size(done)} of {_size(total)}"
            )
            elapsed = time.monotonic() - self.started
        if done and elapsed > 0:
            text += f", {_size(done / elapsed)}/s"
        return text


def _size(n: float) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1 << 20 else format_mb(n / (1 << 20))


class Fetches:
    """The agent's fetches, one per queued job with buckets' data. Thread-safe."""

    def __init__(
        self,
        paths: AgentPaths,
        store: JobStore,
        credentials: Callable[[JobRecord], Credentials],
        masked: Callable[[JobRecord, str], str],
        on_done: Callable[[str, JobState], None],
    ):
        """`credentials`: the job's user's, read as its fetch starts; `masked`: a text
        with the job's user's secrets' values hidden; `on_done`: a fetch finished (the job
        may start) or failed it (its final state, for its notifications)."""
        self.paths = paths
        self.store = store
        self.credentials = credentials
        self.masked = masked
        self.on_done = on_done
        self._lock = threading.Lock()
        self._fetches: dict[str, Fetch] = {}
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch")
        self._closed = False

    def note(self, job: JobRecord) -> str | None:
        """None when `job` may start as far as its data goes (it has none, or all of it is
        here); else how far its fetch is. Starts the fetch where none runs and none
        finished (an agent restarted meanwhile)."""
        if not job.spec.data_sources:
            return None
        with self._lock:
            fetch = self._fetches.get(job.id)
            if fetch is None:
                if "data_dir" in jobdeps.read(JobPaths(self.paths.job_dir(job.id))):
                    return None
                if self._closed:
                    return "fetching data"
                fetch = self._fetches[job.id] = Fetch(job.id)
                self._pool.submit(self._run, job, fetch)
        return fetch.note()

    def start(self, job: JobRecord) -> None:
        """Start `job`'s fetch now (at submit)."""
        self.note(job)

    def close(self) -> None:
        """Stop taking fetches; those under way stop at their next check."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- one job's fetch -------------------------------------------------------------------

    def _run(self, job: JobRecord, fetch: Fetch) -> None:
        try:
            views = self._fetch(job, fetch)
        except _Stopped:
            self._forget(job.id)
            return
        except BucketError as e:
            self._fail(job, fetch, as_text(self.masked(job, str(e))))
            return
        except Exception as e:  # a bug here must not take the agent down, nor leave the job
            log.exception("fetching job %s's data failed", job.id)
            self._fail(job, fetch, f"{type(e).__name__}: {e}")
            return
        jp = JobPaths(self.paths.job_dir(job.id))
        deps = jobdeps.read(jp)
        deps["data"] = [*deps.get("data", []), *views]
        deps["data_dir"] = jobdeps.DATA_DIR
        jobdeps.write(jp, deps)
        log.info("job %s: its data is here (%s)", job.id, fetch.note().removeprefix("fetching "))
        self._forget(job.id)
        self.on_done(job.id, JobState.queued)

    def _fetch(self, job: JobRecord, fetch: Fetch) -> list[dict[str, Any]]:
        creds = self.credentials(job)
        why = creds.missing()
        if why is not None:
            raise BucketError(why)
        cache = ObjectCache.for_user(self.paths.home, creds.owner)
        s3 = buckets.client(creds, PARALLEL)
        listings: list[tuple[DataSource, list[Listed]]] = []
        for source in job.spec.data_sources:
            try:
                listings.append((source, buckets.listing(s3, source, creds.endpoint)))
            except BucketError as e:
                raise BucketError(f"{source.url}: {e}") from None
            self._check(job.id)
        wanted = {e.id: e for _, listed in listings for e in listed if not cache.has(e.id)}
        with fetch.lock:
            fetch.phase = "downloading"
            fetch.objects = sum(len(listed) for _, listed in listings)
            fetch.objects_done = fetch.objects - len(wanted)
            fetch.bytes = sum(e.id.size for e in wanted.values())
        if wanted:
            self._download(job.id, s3, cache, list(wanted.values()), fetch)
        views = []
        for source, listed in listings:
            view = cache.make_view(listed)
            views.append(
                {
                    "name": source.name,
                    "url": source.url,
                    "mount": f"{jobdeps.DATA_DIR}/{source.name}",
                    "source": str(view),
                }
            )
        return views

    def _download(
        self, job_id: str, s3: Any, cache: ObjectCache, wanted: list[Listed], fetch: Fetch
    ) -> None:
        stop = threading.Event()

        def one(entry: Listed) -> None:
            if stop.is_set():
                return
            part = cache.temp()
            try:
                buckets.download(s3, entry.id, part, fetch.add)
                cache.commit(entry.id, part)
            except BucketError as e:
                raise BucketError(f"s3://{entry.id.bucket}/{entry.id.key}: {e}") from None
            except ValueError as e:
                raise BucketError(str(e)) from None
            finally:
                part.unlink(missing_ok=True)
            with fetch.lock:
                fetch.objects_done += 1

        with ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="fetch-get") as pool:
            futures = [pool.submit(one, entry) for entry in wanted]
            try:
                for future in futures:
                    while True:
                        try:
                            future.result(timeout=CHECK_SECONDS)
                            break
                        except TimeoutError:
                            self._check(job_id)
            except BaseException:
                stop.set()
                for future in futures:
                    future.cancel()
                raise

    def _check(self, job_id: str) -> None:
        """Raise _Stopped where the job is no longer queued (cancelled) or the agent stops."""
        if self._closed or self.store.get(job_id).state is not JobState.queued:
            raise _Stopped

    def _fail(self, job: JobRecord, fetch: Fetch, why: str) -> None:
        self._forget(job.id)
        reason = f"could not fetch its data: {why}"
        if self.store.fail_queued(job.id, reason, EndClass.data_error):
            log.warning("job %s %s", job.id, reason)
            self.on_done(job.id, JobState.failed)

    def _forget(self, job_id: str) -> None:
        with self._lock:
            self._fetches.pop(job_id, None)


class _Stopped(Exception):
    """The job left the queue (or the agent stops): its fetch ends, leaving the cache whole."""
