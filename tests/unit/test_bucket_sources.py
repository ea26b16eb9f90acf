"""Bucket sources (`--data s3://...`): how one is read and carried (spec, wire), how a fetch's
progress is worded, and the object cache's rules (whole objects only, one view per listing)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from gpuhop.agent.jobs.fetches import Fetch
from gpuhop.agent.storage import buckets
from gpuhop.agent.storage.blobs import BlobStore
from gpuhop.agent.storage.buckets import Credentials
from gpuhop.agent.storage.envs import EnvError, check_python
from gpuhop.agent.storage.objectcache import ObjectCache
from gpuhop.agent.storage.objectdownloads import Listed, ObjectId
from gpuhop.api.models import SubmitRequest
from gpuhop.api.spec import DataSource, JobSpec


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("s3://bkt/train", DataSource("bkt", "train/", "train")),
        ("s3://bkt/data/train/:tr", DataSource("bkt", "data/train/", "tr")),
        ("s3://bkt", DataSource("bkt", "", "bkt")),
        ("s3://bkt/", DataSource("bkt", "", "bkt")),
        ("s3://my.bkt-1/a:b/c", DataSource("my.bkt-1", "a:b/c/", "c")),  # a colon of the prefix
        ("s3://bkt/a b/\u00e9t\u00e9", DataSource("bkt", "a b/\u00e9t\u00e9/", "\u00e9t\u00e9")),
    ],
)
def test_a_source_is_read_as_a_folder_and_named(text, parsed):
    if parsed.name == "\u00e9t\u00e9":  # not a name a mount point takes: give one
        with pytest.raises(ValueError, match="cannot name the data"):
            DataSource.parse(text)
        assert DataSource.parse(text + ":ete") == parsed._replace(name="ete")
        return
    assert DataSource.parse(text) == parsed
    assert DataSource.parse(str(parsed)) == parsed  # shown as it is read back


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("gs://bkt/x", "takes s3://BUCKET/PREFIX[:NAME]"),
        ("s3://UPPER/x", "'UPPER' is not a bucket name"),
        ("s3://ab/x", "'ab' is not a bucket name"),
        ("s3://bkt/a//b", "an empty, '.' or '..' part"),
        ("s3://bkt/../x", "an empty, '.' or '..' part"),
        ("s3://bkt/x:.hidden", "cannot name the data"),
    ],
)
def test_a_malformed_source_says_what_is_wrong(text, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        DataSource.parse(text)


def test_sources_travel_whole_through_the_wire_and_the_store():
    spec = JobSpec(data_sources=(DataSource.parse("s3://bkt/train"), DataSource.parse("s3://b2b")))
    assert JobSpec.from_json(spec.to_json()) == spec
    sent = SubmitRequest.model_validate({"command": ["job.py"], **spec.to_wire()})
    assert sent.spec().data_sources == spec.data_sources
    # Each field of a source on the wire is judged on its own, and named.
    for source, words in [
        ({"prefix": "a"}, "the prefix 'a' must be empty or a folder"),
        ({"prefix": "/abs/"}, "the prefix '/abs/' must be empty or a folder"),
        ({"name": "../x"}, "'../x' cannot name the data"),
        ({"name": "x:y"}, "'x:y' cannot name the data"),
        ({"prefix": "a/../"}, "the prefix has an empty, '.' or '..' part"),
        ({"bucket": "UP"}, "'UP' is not a bucket name"),
    ]:
        wired = {"bucket": "bkt", "prefix": "a/", "name": "a", **source}
        with pytest.raises(ValueError, match=re.escape(words)):
            SubmitRequest.model_validate({"command": ["x"], "data_sources": [wired]})
    twice = JobSpec(data_sources=(DataSource.parse("s3://bkt/a/x"), DataSource.parse("s3://b2b/x")))
    assert twice.problems() == ["data_sources names two buckets' data x; give one :NAME"]


def test_a_fetch_says_how_far_it_is():
    fetch = Fetch("job")
    assert fetch.note() == "fetching data: listing the bucket"
    fetch.phase, fetch.objects, fetch.objects_done, fetch.bytes = "downloading", 9, 3, 3 << 30
    fetch.add(40 << 20)
    assert re.fullmatch(
        r"fetching data: 3/9 objects, 40 MiB of 3 GiB, [\d.]+ [KMG]i?B/s, ETA \d+:\d\d",
        fetch.note(),
    ), fetch.note()
    fetch.started -= 60  # downloading for a minute, nothing for the last 30 s: said so,
    fetch.last_byte -= 30  # not as an average rate that hides it
    assert fetch.note() == (
        "fetching data: 3/9 objects, 40 MiB of 3 GiB, no byte for 30s: the bucket's server is"
        " slow or not answering (a read is given up after 60s, and tried again twice)"
    )
    fetch.add((3 << 30) - (40 << 20))  # all of it: no time left to say
    assert fetch.note().endswith("/s")
    fetch.downloaded = {f"object{i}": 1 << 20 for i in range(6)}
    assert re.fullmatch(r"9 objects, 6 of them fetched \(3 GiB in [\d.]+s\)", fetch.summary())


def _blobs(root: Path) -> BlobStore:
    (root / "blobs").mkdir()
    (root / "tmp").mkdir()
    return BlobStore(root / "blobs", root / "tmp")


def test_the_cache_takes_whole_objects_as_blobs_and_makes_one_view_per_listing(tmp_path: Path):
    blobs = _blobs(tmp_path)
    cache = ObjectCache(tmp_path / "objects", tmp_path / "objects.db", blobs)
    assert cache.user_dir("bob") != cache.user_dir("alice")
    one = ObjectId("aws", "bkt", "train/a.txt", "e1", 5)
    short = cache.downloads.partial("alice", one)
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="3 bytes came, the listing said 5"):
        cache.downloads.commit("alice", one, short)
    assert not short.exists() and not cache.has("alice", one)
    whole = cache.downloads.partial("alice", one)
    whole.write_bytes(b"abcde")
    cache.downloads.commit("alice", one, whole)
    # Named by the flush of its batch: till then its partial waits, and no fetch claims it.
    assert not cache.has("alice", one) and whole.read_bytes() == b"abcde"
    assert cache.lacking("alice", [one.digest()]) == {one.digest()}
    assert cache.downloads.claim("alice", one) is None
    cache.downloads.flush()
    assert cache.has("alice", one) and not whole.exists()
    assert not cache.has("bob", one)  # another user's cache is not theirs
    two = one._replace(key="train/b.txt")
    # One query for many: what the index holds of alice's, not of bob's.
    assert cache.lacking("alice", [one.digest(), two.digest()]) == {two.digest()}
    assert cache.lacking("bob", [one.digest()]) == {one.digest()}
    assert cache.path("alice", one).samefile(blobs.path(hashlib.sha256(b"abcde").hexdigest()))
    listing = [Listed("a.txt", one)]
    name = cache.view_name(listing)
    assert cache.view("alice", name) is None
    view = cache.make_view("alice", listing, name)
    assert (view / "a.txt").read_bytes() == b"abcde"
    assert cache.make_view("alice", listing, name) == view == cache.view("alice", name)
    assert cache.view("bob", name) is None
    changed = [Listed("a.txt", one._replace(etag="e2"))]
    assert cache.view_name(changed) != cache.view_name(listing)  # a new ETag: a new view
    versioned = [Listed("a.txt", one._replace(version="v2"))]
    assert cache.view_name(versioned) != cache.view_name(listing)  # a new version too
    assert list((cache.user_dir("alice") / "tmp").iterdir()) == []
    cache.close()


def test_a_partial_object_of_a_changed_identity_is_dropped(tmp_path: Path):
    cache = ObjectCache(tmp_path / "objects", tmp_path / "objects.db", _blobs(tmp_path))
    old = ObjectId("aws", "bkt", "big.bin", "e1", 10)
    part = cache.downloads.partial("alice", old)
    part.write_bytes(b"12345")
    # the same: kept
    assert cache.downloads.partial_bytes(cache.downloads.partial("alice", old), old) == 5
    new = old._replace(etag="e2")
    assert cache.downloads.partial_bytes(cache.downloads.partial("alice", new), new) == 0
    assert not part.exists()
    # Many at once, from one look at the folder: each one's place and bytes here.
    kept, changed, fresh = old._replace(key="a"), old._replace(key="b"), old._replace(key="c")
    cache.downloads.partial("alice", kept).write_bytes(b"123")
    stale = cache.downloads.partial("alice", changed._replace(etag="e0"))
    stale.write_bytes(b"1234")
    found = cache.downloads.partials("alice", [kept, changed, fresh])
    assert {oid: have for oid, (_, have) in found.items()} == {kept: 3, changed: 0, fresh: 0}
    assert found[kept][0] == cache.downloads.partial("alice", kept) and not stale.exists()
    cache.close()


def test_one_download_at_a_time_writes_an_objects_partial(tmp_path: Path):
    """A second fetch of an object (the same user's) waits for the first's download; another
    user's is theirs; a partial being written is not dropped as another identity's."""
    cache = ObjectCache(tmp_path / "objects", tmp_path / "objects.db", _blobs(tmp_path))
    one = ObjectId("aws", "bkt", "a.bin", "e1", 3)
    first = cache.downloads.claim("alice", one)
    assert first is not None and first.mine
    second = cache.downloads.claim("alice", one)
    assert second is not None and not second.mine and second.done is first.done
    bobs = cache.downloads.claim("bob", one)
    assert bobs is not None and bobs.mine
    part = cache.downloads.partial("alice", one)
    part.write_bytes(b"ab")
    changed = one._replace(etag="e2")  # listed meanwhile by a third fetch: its partial apart
    assert cache.downloads.partial_bytes(cache.downloads.partial("alice", changed), changed) == 0
    assert part.read_bytes() == b"ab"  # still the first download's
    assert cache.downloads.sweep(untouched_since=1e12) == []  # nor swept while written
    cache.downloads.release("alice", one)  # it stopped: the next claim goes on from its bytes
    assert second.done.is_set()
    again = cache.downloads.claim("alice", one)
    assert again is not None and again.mine and not again.done.is_set()
    part.write_bytes(b"abc")
    cache.downloads.commit("alice", one, part)
    cache.downloads.release("alice", one)
    assert cache.downloads.claim("alice", one) is None  # committed: taken, not downloaded again
    cache.downloads.flush()
    assert cache.downloads.claim("alice", one) is None and cache.has("alice", one)
    cache.downloads.release("bob", one)
    cache.close()


def test_nothing_under_the_object_cache_is_taken_as_an_interpreter(tmp_path: Path):
    fake = tmp_path / "objects" / "u" / "views" / "v" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    with pytest.raises(EnvError, match="lies among what users sent to the agent"):
        check_python(str(fake), tmp_path)


def test_a_single_user_agents_client_is_kept_until_the_users_aws_configuration_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Making a client costs a fraction of a second, which an unchanged prefix's re-fetch
    (one listing) would pay each time; the user's own configuration still counts as it is
    at each fetch."""
    config = tmp_path / "config"
    config.write_text("[default]\nregion = eu-west-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    creds = Credentials("me", {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, True)
    first = buckets.client(creds, 4)
    assert buckets.client(creds, 4) is first
    assert first.s3.meta.region_name == "eu-west-1"
    config.write_text("[default]\nregion = eu-north-1\n")
    second = buckets.client(creds, 4)
    assert second is not first and second.s3.meta.region_name == "eu-north-1"
    # Another secret's value: another client, whatever the configuration says.
    assert (
        buckets.client(creds._replace(values={**creds.values, "AWS_SECRET_ACCESS_KEY": "c"}), 4)
        is not second
    )
