"""Runs in the agent: reads an S3-compatible bucket with a user's own credentials (boto3), for
`--data s3://...`: lists a prefix, and downloads each object into the user's object cache.

The credentials are the user's secrets named as the AWS SDK names its variables
(`CREDENTIAL_NAMES`). On a team agent they are all there is: the session built here reads no
variable of the agent's environment, no `~/.aws` file and no endpoint configured there, so
one user's fetch never runs as the operator. A single-user agent (the embedded one, or one
reached over SSH) serves the user whose machine it is: what their secrets leave unsaid comes
from their usual AWS configuration (environment, `~/.aws`, instance role).

Errors come back as `BucketError` in the bucket's own words ("NoSuchBucket: The specified
bucket does not exist"). boto3 is imported on first use: only a fetch loads it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from gpuhop.agent.storage.objectcache import Listed, ObjectId
from gpuhop.api import validate_relpath
from gpuhop.api.spec import DataSource

# The user's secrets a fetch reads, as the AWS SDK calls them.
CREDENTIAL_NAMES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)
# Objects up to this size are read in one GET (checked against their listed ETag); larger
# ones by boto3's transfer manager, in ranged parts read in parallel.
ONE_GET_BYTES = 16 << 20
CHUNK = 1 << 20


class BucketError(Exception):
    """What the bucket (or the way to it) said, worded to end a job with."""


class Credentials(NamedTuple):
    """A user's AWS_* secrets (`values`), and whether the agent's own AWS configuration may
    fill in what they leave out (`own_config`: a single-user agent's)."""

    owner: str  # whose they are (and whose object cache the fetch fills)
    values: Mapping[str, str]
    own_config: bool

    @property
    def endpoint(self) -> str:
        """The endpoint the fetch reaches, as the cache tells objects apart: the secrets',
        else the default (AWS, or what the user's own configuration says)."""
        return (
            self.values.get("AWS_ENDPOINT_URL_S3") or self.values.get("AWS_ENDPOINT_URL") or "aws"
        )

    def missing(self) -> str | None:
        """Why these cannot sign a request on a team agent, or None."""
        if self.own_config:
            return None
        lacking = [
            n for n in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if n not in self.values
        ]
        if not lacking:
            return None
        return (
            f"a bucket is read with your own credentials, and you have no secret named"
            f" {' or '.join(lacking)}: set them with `gpuhop secret set {lacking[0]}` (and"
            " AWS_ENDPOINT_URL, AWS_REGION where the bucket needs them)"
        )


def client(creds: Credentials, connections: int) -> Any:
    """An S3 client signing with `creds`, for `connections` threads at once."""
    import boto3
    import botocore.session
    from botocore.config import Config

    values = creds.values
    if creds.own_config:
        session = boto3.session.Session()
    else:
        # Every setting's environment variable dropped, and no file or configured endpoint
        # read: nothing of the agent's own configuration reaches a user's fetch.
        names = botocore.session.Session().session_var_map
        clean = {
            name: (
                key,
                None,
                os.devnull if name in ("config_file", "credentials_file") else default,
                convert,
            )
            for name, (key, _env, default, convert) in names.items()
        }
        core = botocore.session.Session(session_vars=clean)
        core.set_config_variable("ignore_configured_endpoint_urls", True)
        session = boto3.session.Session(botocore_session=core)
    region = values.get("AWS_REGION") or values.get("AWS_DEFAULT_REGION")
    if region is None and not creds.own_config:
        region = "us-east-1"
    keys: dict[str, Any] = {}
    if "AWS_ACCESS_KEY_ID" in values and "AWS_SECRET_ACCESS_KEY" in values:
        keys = {
            "aws_access_key_id": values["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": values["AWS_SECRET_ACCESS_KEY"],
            "aws_session_token": values.get("AWS_SESSION_TOKEN"),
        }
    endpoint = values.get("AWS_ENDPOINT_URL_S3") or values.get("AWS_ENDPOINT_URL")
    config = Config(
        max_pool_connections=max(10, connections),
        retries={"max_attempts": 3, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
    )
    try:
        return session.client(
            "s3", region_name=region, endpoint_url=endpoint, config=config, **keys
        )
    except Exception as e:  # a malformed endpoint, an unknown profile, ...
        raise BucketError(f"{type(e).__name__}: {e}") from None


def listing(s3: Any, source: DataSource, endpoint: str) -> list[Listed]:
    """Every object under the source's prefix, as its view will show it: its path below the
    prefix, and its identity. Folder markers (keys ending in '/') are left out; a key that
    cannot be a file's path there fails, naming it."""
    found: list[Listed] = []
    files: set[str] = set()
    for item in _pages(s3, source):
        key = item["Key"]
        path = key[len(source.prefix) :]
        if key.endswith("/"):
            continue
        try:
            validate_relpath(path)
        except ValueError as e:
            raise BucketError(f"the object {key!r} cannot be a file in the job's view: {e}") from (
                None
            )
        etag = str(item.get("ETag", "")).strip('"')
        found.append(Listed(path, ObjectId(endpoint, source.bucket, key, etag, int(item["Size"]))))
        files.add(path)
    for entry in found:
        parent = entry.path.rpartition("/")[0]
        while parent:
            if parent in files:
                raise BucketError(
                    f"the objects {source.prefix}{parent} and {source.prefix}{entry.path} cannot"
                    " both be in the job's view: one would be a file and a folder"
                )
            parent = parent.rpartition("/")[0]
    return found


def _pages(s3: Any, source: DataSource) -> Iterator[dict[str, Any]]:
    with translated():
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=source.bucket, Prefix=source.prefix
        )
        for page in pages:
            yield from page.get("Contents", [])


def download(s3: Any, oid: ObjectId, to: Path, progress: Callable[[int], None]) -> None:
    """Write the object `oid` names to the file `to` (new), calling `progress` with each
    number of bytes that came; a small one in one GET that must match its listed ETag."""
    with translated():
        if oid.size <= ONE_GET_BYTES:
            answer = s3.get_object(Bucket=oid.bucket, Key=oid.key, IfMatch=f'"{oid.etag}"')
            body = answer["Body"]
            try:
                with open(to, "xb") as out:
                    for chunk in body.iter_chunks(CHUNK):
                        out.write(chunk)
                        progress(len(chunk))
            finally:
                body.close()
            return
        from boto3.s3.transfer import TransferConfig

        s3.download_file(
            oid.bucket,
            oid.key,
            str(to),
            Callback=progress,
            Config=TransferConfig(multipart_threshold=ONE_GET_BYTES, max_concurrency=8),
        )


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turns boto3's exceptions into `BucketError`s in the service's own words."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as e:
        error = e.response.get("Error", {})
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = error.get("Code") or f"HTTP {status}"
        raise BucketError(f"{code}: {error.get('Message') or ''}".rstrip(": ")) from None
    except (BotoCoreError, OSError) as e:
        raise BucketError(f"{type(e).__name__}: {e}") from None
