"""Runs in the agent: reads an S3-compatible bucket with a user's own credentials, for
`--data s3://...`: lists a prefix (boto3), and downloads each object into the user's object
cache (obstore: Rust's object_store, about a quarter of boto3's CPU a GET).

The credentials are the user's secrets named as the AWS SDK names its variables
(`CREDENTIAL_NAMES`). On a team agent they are all there is: the session built here reads no
variable of the agent's environment, no `~/.aws` file and no endpoint configured there, so
one user's fetch never runs as the operator. A single-user agent (the embedded one, or one
reached over SSH) serves the user whose machine it is: what their secrets leave unsaid comes
from their usual AWS configuration (environment, `~/.aws`, instance role).

boto3 resolves the credentials, endpoint, region and addressing style, and obstore is given
all of them explicitly (`Reader.store`): obstore reads every AWS_* variable of the process
itself, with no way to turn that off, so each setting of those a GET would heed is given a
value of ours, which wins (and the HTTP client's options whole, which replace the variables').

Errors come back as `BucketError` in the bucket's own words ("NoSuchBucket: The specified
bucket does not exist"). boto3 and obstore are imported on first use: only a fetch loads them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from gpuhop.agent.storage.objectdownloads import Listed, ObjectId
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
# A fetch's connections: larger objects are read in this many ranged parts at once (see
# bucketreads).
PART_THREADS = 8
# A bucket's versioning status, as a reader was told it, is asked again after this long
# (an unchanged prefix's re-fetch is then its listing alone). A bucket whose versioning
# changed meanwhile is still read right: every read names the ETag listed (If-Match), and a
# key's VersionId comes only from its versions' listing.
VERSIONING_SECONDS = 300.0
# The statuses of a bucket that has, or had, versioning.
VERSIONED = ("Enabled", "Suspended")


class BucketError(Exception):
    """What the bucket (or the way to it) said, worded to end a job with; `transient` where
    it was the way (a connection refused or cut, a timeout, a server error), which a fetch
    tries again."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


class Credentials(NamedTuple):
    """A user's AWS_* secrets (`values`), and whether the agent's own AWS configuration may
    fill in what they leave out (`own_config`: a single-user agent's)."""

    owner: str  # whose they are (and whose object cache the fetch fills)
    values: Mapping[str, str]
    own_config: bool

    @property
    def endpoint(self) -> str:
        """The endpoint the fetch reaches, as the cache tells objects apart: the secrets',
        else the default (AWS, or what the user's own configuration says). A trailing '/' is
        not part of it: `http://minio:9000/` is the same server as `http://minio:9000`, and
        its objects are the same objects."""
        given = self.values.get("AWS_ENDPOINT_URL_S3") or self.values.get("AWS_ENDPOINT_URL")
        return (given or "").rstrip("/") or "aws"

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


class Reader:
    """One user's way to their buckets, thread-safe: boto3's client (`s3`) lists, and
    resolves what every request needs (credentials, endpoint, region, addressing style);
    obstore's stores, one a bucket made from those, read the objects' bytes."""

    def __init__(self, s3: Any, credentials: Any, connections: int):
        self.s3 = s3
        self.credentials = credentials  # botocore's (they may renew themselves), or None
        self.connections = connections
        self.regions: dict[str, str] = {}  # a bucket's region, where its listing said it
        self._stores: dict[str, Any] = {}
        self._versioning: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def versioning(self, bucket: str) -> tuple[str | None] | None:
        """The bucket's versioning status (in a tuple) as these credentials were told it in
        the last VERSIONING_SECONDS; None: ask."""
        with self._lock:
            asked = self._versioning.get(bucket)
        if asked is None or time.monotonic() - asked[0] > VERSIONING_SECONDS:
            return None
        return (asked[1],)

    def note_versioning(self, bucket: str, status: str | None) -> None:
        with self._lock:
            self._versioning[bucket] = (time.monotonic(), status)

    def store(self, bucket: str) -> Any:
        """obstore's S3Store for `bucket`, made once (it keeps its connections)."""
        with self._lock:
            made = self._stores.get(bucket)
        if made is None:
            made = self._new_store(bucket)
            with self._lock:
                made = self._stores.setdefault(bucket, made)
        return made

    def _new_store(self, bucket: str) -> Any:
        from datetime import UTC, datetime, timedelta
        from urllib.parse import urlsplit

        from obstore.store import S3Store

        if self.credentials is None:
            raise BucketError("NoCredentialsError: Unable to locate credentials")
        renews = hasattr(self.credentials, "refresh_needed")  # an instance role's, SSO's

        def credential() -> dict[str, Any]:
            now = self.credentials.get_frozen_credentials()
            return {
                "access_key_id": now.access_key,
                "secret_access_key": now.secret_key,
                "token": now.token,
                # Asked again after this: botocore renews them ahead of their expiry.
                "expires_at": datetime.now(UTC) + timedelta(minutes=5) if renews else None,
            }

        # Where boto3 would send a GET of this bucket (its endpoint, and path or virtual-host
        # addressing as the endpoint and the user's configuration say): signed here, not sent.
        try:
            url = urlsplit(
                self.s3.generate_presigned_url(
                    "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=60
                )
            )
        except Exception as e:
            raise BucketError(f"{type(e).__name__}: {e}") from None
        region = self.s3.meta.region_name or "us-east-1"
        virtual = not url.path.startswith(f"/{bucket}/")
        base = url.path.removesuffix("/k") if virtual else url.path.removesuffix(f"/{bucket}/k")
        endpoint = f"{url.scheme}://{url.netloc}{base}"
        listed = self.regions.get(bucket)
        if listed and listed != region and url.netloc.endswith(".amazonaws.com"):
            # AWS itself, the bucket in another region than the client's (boto3's listing
            # followed the redirect): its own region's endpoint.
            region = listed
            host = f"{bucket}.s3.{region}" if virtual else f"s3.{region}"
            endpoint = f"https://{host}.amazonaws.com"
        explicit = {
            "bucket": bucket,
            "region": region,
            "endpoint": endpoint,
            "aws_endpoint_url_s3": endpoint,  # else the process's AWS_ENDPOINT_URL_S3 wins
            "virtual_hosted_style_request": virtual,
            "s3_express": False,
            "skip_signature": False,
            "unsigned_payload": False,
            "request_payer": False,
            # Not SSE-C: a customer key (AWS_SSE_CUSTOMER_KEY_BASE64) goes with no GET.
            "server_side_encryption": "AES256",
        }
        try:
            return S3Store(
                config=explicit,  # type: ignore[arg-type]
                client_options={
                    "allow_http": url.scheme == "http",
                    "connect_timeout": timedelta(seconds=10),
                    # As boto3's read_timeout: a read that waits this long fails; a large
                    # object's whole stream may take as long as it takes.
                    "read_timeout": timedelta(seconds=60),
                    "timeout": timedelta(days=1),
                    "pool_max_idle_per_host": str(max(10, self.connections)),
                },
                # botocore's 3 attempts (standard mode) for a request that fails before its
                # body (a server error, a connection refused).
                retry_config={"max_retries": 2, "retry_timeout": timedelta(seconds=60)},
                credential_provider=credential,  # type: ignore[arg-type]
            )
        except Exception as e:  # a malformed endpoint, ...
            raise BucketError(f"{type(e).__name__}: {e}") from None

    def close(self) -> None:
        self.s3.close()


# Readers kept for the credentials they sign with: making boto3's client costs 0.2-0.5 s of
# the agent's CPU (boto3 loads and checks the service's model), which an unchanged prefix's
# re-fetch, one listing, would otherwise pay each time. A reader is thread-safe; new secrets (a
# rotated key, a new session token) make a new one, and so does a change of the user's own
# configuration where a single-user agent reads it (`_own_config`): its files are looked at
# (a stat each) at every fetch. Credentials that expire (an instance role's, SSO's) are
# renewed by the client itself.
KEPT_CLIENTS = 16
_clients: dict[tuple[object, ...], Reader] = {}
_clients_lock = threading.Lock()
# Where boto3 reads the user's own configuration from: the variable naming each file, and
# its default.
_CONFIG_FILES = (
    ("AWS_CONFIG_FILE", "~/.aws/config"),
    ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
)


def client(creds: Credentials, connections: int) -> Reader:
    """A reader signing with `creds`, for `connections` threads at once. Raises BucketError
    for an endpoint a team agent's user may not have it reach (`refused_endpoint`)."""
    if not creds.own_config:
        why = refused_endpoint(creds.values)
        if why is not None:
            raise BucketError(why)
    own = _own_config() if creds.own_config else None
    key = (tuple(sorted(creds.values.items())), connections, own)
    with _clients_lock:
        kept = _clients.pop(key, None)
        if kept is not None:
            _clients[key] = kept  # the most recently used last
            return kept
    made = _new_client(creds, connections)
    with _clients_lock:
        _clients[key] = made
        while len(_clients) > KEPT_CLIENTS:
            del _clients[next(iter(_clients))]
    return made


# The cloud's instance metadata service (AWS, GCP, Azure, ...: 169.254.169.254; AWS's IPv6
# one), which serves the GPU host's own credentials, and the rest of the link-local ranges.
_METADATA_NETWORKS = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)


def refused_endpoint(values: Mapping[str, str]) -> str | None:
    """Why a team agent's user's fetch may not reach the endpoint their secrets name, or
    None: the agent fetches from the GPU host's network, and a link-local address there is
    the cloud's metadata service, whose answers (the host's own credentials among them) a
    failed listing's error words would hand the user. An endpoint on the host's LAN or
    loopback (a MinIO beside it) is theirs to name. Its name is resolved here and again by
    the client, so a name that resolves elsewhere the second time is not caught."""
    name = "AWS_ENDPOINT_URL_S3" if values.get("AWS_ENDPOINT_URL_S3") else "AWS_ENDPOINT_URL"
    given = values.get(name)
    if not given:
        return None
    host = urllib.parse.urlsplit(given).hostname
    if not host:
        return None  # malformed: the client says so
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return None  # not resolvable: the client says so
    for address in found:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in _METADATA_NETWORKS if net.version == ip.version):
            return (
                f"the endpoint your secret {name} names is a link-local address ({address}),"
                " where the cloud's instance metadata service answers with the GPU host's own"
                " credentials: a fetch on this agent may not reach it; name the bucket's own"
                " endpoint"
            )
    return None


def _own_config() -> tuple[object, ...]:
    """The user's usual AWS configuration as it stands: the agent's AWS_* variables, and
    each configuration file's identity (inode, size, time written) or its absence."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    files: list[object] = []
    for variable, default in _CONFIG_FILES:
        path = os.path.expanduser(os.environ.get(variable) or default)
        try:
            st = os.stat(path)
        except OSError:
            files.append(path)
            continue
        files.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
    return (env, tuple(files))


def _new_client(creds: Credentials, connections: int) -> Reader:
    import boto3
    import botocore.credentials
    import botocore.session
    from botocore.config import Config
    from botocore.parsers import ResponseParserFactory

    values = creds.values
    if creds.own_config:
        core = botocore.session.Session()
        session = boto3.session.Session(botocore_session=core)
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
    # The listing's dates left as the text that came: a fetch reads none of them, and
    # botocore's parse of each object's LastModified was half of a listing's CPU. Only this
    # client parses so: the session's other clients (an assume-role's STS, made when its
    # credentials are first needed) parse theirs as usual.
    parsing = ResponseParserFactory()
    parsing.set_parser_defaults(timestamp_parser=str)
    try:
        if keys:
            credentials: Any = botocore.credentials.Credentials(
                keys["aws_access_key_id"],
                keys["aws_secret_access_key"],
                keys["aws_session_token"],
            )
        else:  # a single-user agent's own configuration (a team agent's have keys)
            credentials = session.get_credentials()
        usual = core.get_component("response_parser_factory")
        core.register_component("response_parser_factory", parsing)
        try:
            s3 = session.client(
                "s3", region_name=region, endpoint_url=endpoint, config=config, **keys
            )
        finally:
            core.register_component("response_parser_factory", usual)
    except Exception as e:  # a malformed endpoint, an unknown profile, ...
        raise BucketError(f"{type(e).__name__}: {e}") from None
    return Reader(s3, credentials, connections)


def listing(reader: Reader, source: DataSource, endpoint: str) -> list[Listed]:
    """Every object under the source's prefix, as its view will show it: its path below the
    prefix, and its identity (with its VersionId where the bucket has versioning). Folder
    markers (keys ending in '/') are left out; a key that cannot be a file's path there
    fails, naming it."""
    found: list[Listed] = []
    files: set[str] = set()
    for item in _pages(reader, source):
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
        version = str(item.get("VersionId") or "")
        oid = ObjectId(endpoint, source.bucket, key, etag, int(item["Size"]), version)
        found.append(Listed(path, oid))
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


def _pages(reader: Reader, source: DataSource) -> Iterator[dict[str, Any]]:
    """The prefix's objects: from ListObjectsV2, or, where the bucket has (or had)
    versioning, the latest version of each key from ListObjectVersions (a key whose latest
    version is a delete marker is gone). A bucket that will not say whether it has
    versioning (the user may not ask) is listed as unversioned: the ETag still tells the
    bytes apart. Whether it has is asked while the first page of ListObjectsV2 comes, and
    the reader keeps the answer for VERSIONING_SECONDS: an unchanged prefix's re-fetch
    costs its listing alone."""
    s3 = reader.s3
    with translated():
        pages: Iterator[dict[str, Any]] = iter(
            s3.get_paginator("list_objects_v2").paginate(Bucket=source.bucket, Prefix=source.prefix)
        )
        first: dict[str, Any] | BaseException
        known = reader.versioning(source.bucket)
        if known is None:
            first, status = _first_page_and_versioning(pages, s3, source.bucket)
            reader.note_versioning(source.bucket, status)
        else:
            status = known[0]
            first = {} if status in VERSIONED else next(pages, {})
        if isinstance(first, dict):  # the bucket's region, where its objects are read
            region = first.get("ResponseMetadata", {}).get("HTTPHeaders", {})
            if region.get("x-amz-bucket-region"):
                reader.regions[source.bucket] = region["x-amz-bucket-region"]
        if status in VERSIONED:
            versions = s3.get_paginator("list_object_versions").paginate(
                Bucket=source.bucket, Prefix=source.prefix
            )
            for page in versions:
                for item in page.get("Versions", []):
                    if item.get("IsLatest"):
                        yield {**item, "VersionId": item.get("VersionId") or "null"}
            return
        if isinstance(first, BaseException):
            raise first
        yield from first.get("Contents", [])
        for page in pages:
            yield from page.get("Contents", [])


def _first_page_and_versioning(
    pages: Iterator[dict[str, Any]], s3: Any, bucket: str
) -> tuple[dict[str, Any] | BaseException, str | None]:
    """The listing's first page (or why it failed), and the bucket's versioning status,
    asked at the same time."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="fetch-list") as pool:
        asked = pool.submit(_versioning, s3, bucket)
        try:
            first: dict[str, Any] | BaseException = next(pages, {})
        except Exception as e:  # the versioning's answer first, as when asked in turn
            first = e
        return first, asked.result()


def _versioning(s3: Any, bucket: str) -> str | None:
    """The bucket's versioning status ("Enabled", "Suspended"; None: never had it, or it
    will not say)."""
    try:
        status = s3.get_bucket_versioning(Bucket=bucket).get("Status")
    except Exception as e:
        if _code(e) not in ("AccessDenied", "NotImplemented", "MethodNotAllowed"):
            raise
        return None
    return str(status) if status else None


def _code(e: BaseException) -> str | None:
    response = getattr(e, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Turns boto3's and obstore's exceptions into `BucketError`s in the service's own
    words."""
    from botocore.exceptions import BotoCoreError, ClientError
    from obstore.exceptions import BaseError
    from urllib3.exceptions import HTTPError

    try:
        yield
    except (BaseError, FileNotFoundError) as e:  # obstore's (its NotFound is Python's)
        if not isinstance(e, BaseError) and "Error performing" not in str(e):
            raise BucketError(f"{type(e).__name__}: {e}", transient=True) from None
        raise _in_words(e) from None
    except ClientError as e:
        error = e.response.get("Error", {})
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = error.get("Code") or f"HTTP {status}"
        words = f"{code}: {error.get('Message') or ''}".rstrip(": ")
        raise BucketError(words, transient=isinstance(status, int) and status >= 500) from None
    except (BotoCoreError, OSError, HTTPError) as e:
        raise BucketError(f"{type(e).__name__}: {e}", transient=True) from None


# In obstore's message of a failed request: the status, and the S3 error's code and message
# (the XML of its body).
_STATUS = re.compile(r"Server returned non-2xx status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]*)</Code>")
_MESSAGE = re.compile(r"<Message>([^<]*)</Message>")


def _in_words(e: BaseException) -> BucketError:
    """obstore's error as boto3's would have worded it: the S3 error's code and message
    ("NoSuchBucket: The specified bucket does not exist"), else the HTTP status; transient
    where the way failed (a server error, a connection refused or cut, a timeout)."""
    from html import unescape

    text = str(e)
    status = _STATUS.search(text)
    if status is None:  # no answer: the way to the bucket (its first line says which)
        first = text.split("\n", 1)[0].strip()
        return BucketError(f"{type(e).__name__}: {first}", transient=True)
    code, message = _CODE.search(text), _MESSAGE.search(text)
    words = f"{unescape(code.group(1)) if code else f'HTTP {status.group(1)}'}"
    if message and message.group(1):
        words += f": {unescape(message.group(1))}"
    return BucketError(words, transient=int(status.group(1)) >= 500)
