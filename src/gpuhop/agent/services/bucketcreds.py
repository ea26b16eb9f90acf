"""Runs in the agent: `gpuhop doctor`'s word on which credentials a fetch of a bucket
(`--data s3://...`) would sign with for the user who asks.

Their own secrets first, by name (never a value). On a single-user agent, whose user is the
one asking, what those leave out comes from that user's usual AWS configuration, as the AWS
CLI would find it: the variables of the agent's environment that give credentials
(`SOURCES`) and the files in `~/.aws` (or where `AWS_SHARED_CREDENTIALS_FILE` and
`AWS_CONFIG_FILE` say), named, never read. A team agent never uses its own configuration for
a user's fetch (gpuhop.agent.storage.buckets), so it is not even looked at here. The check is
a warning where no credentials are found: a fetch would end as `data-error`, but a user who
reads no bucket needs none.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from gpuhop.agent.callers import Caller
from gpuhop.agent.context import AgentContext
from gpuhop.agent.services.hostchecks import check as _check
from gpuhop.agent.storage.buckets import CREDENTIAL_NAMES
from gpuhop.api import CheckStatus, DoctorCheck

NAME = "bucket credentials"
# The variables by which the AWS SDK finds credentials (and where to use them): those a
# user's secrets may hold, and those that name a profile, a role or a container's source.
SOURCES = (
    *CREDENTIAL_NAMES,
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)
KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
SET_THEM = (
    "gpuhop secret set AWS_ACCESS_KEY_ID, then AWS_SECRET_ACCESS_KEY (the value from stdin);"
    " AWS_ENDPOINT_URL and AWS_REGION too where the bucket is not on AWS or needs a region"
)


class BucketFacts(NamedTuple):
    """What `check` judges: the caller's secrets a fetch reads, by name; and what their
    usual AWS configuration holds, in words (None on a team agent: never used there)."""

    secrets: tuple[str, ...]
    usual: tuple[str, ...] | None


def gather(rt: AgentContext, caller: Caller, environ: Mapping[str, str]) -> BucketFacts:
    """The facts for `caller` on this agent, whose environment is `environ`."""
    have = {e.name for e in rt.secrets.entries(caller.user)}
    secrets = tuple(n for n in CREDENTIAL_NAMES if n in have)
    return BucketFacts(secrets, None if rt.team() else usual_config(environ, Path.home()))


def usual_config(environ: Mapping[str, str], home: Path) -> tuple[str, ...]:
    """Where the AWS SDK would find this user's credentials: the variables of `SOURCES` set
    in `environ` (their names), and the credentials and config files that exist."""
    found = []
    names = [n for n in SOURCES if environ.get(n)]
    if names:
        found.append(f"the agent's environment ({', '.join(names)})")
    for variable, default in (
        ("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
        ("AWS_CONFIG_FILE", "config"),
    ):
        path = Path(environ.get(variable) or home / ".aws" / default).expanduser()
        if path.is_file():
            found.append(str(path))
    return tuple(found)


def check(b: BucketFacts) -> DoctorCheck:
    mine = f"your secrets {', '.join(b.secrets)}" if b.secrets else ""
    missing = [k for k in KEYS if k not in b.secrets]
    lacking = f"you have no secret named {' or '.join(missing)}"
    if mine:
        lacking += f" (only {', '.join(b.secrets)})"
    if b.usual is None:
        never = "never the agent's own environment or ~/.aws (this agent serves a team)"
        if not missing:
            return _check(NAME, CheckStatus.passed, f"a bucket's fetch signs with {mine}; {never}")
        detail = (
            f"none: {lacking}, and a bucket's fetch here signs with your own secrets only,"
            f" {never}: --data s3://... would end as data-error"
        )
        return _check(NAME, CheckStatus.warning, detail, SET_THEM)
    usual = "; ".join(b.usual)
    if not missing:
        detail = f"a bucket's fetch signs with {mine}"
        if usual:
            detail += f"; what they leave out comes from your usual AWS configuration: {usual}"
        return _check(NAME, CheckStatus.passed, detail)
    if usual:
        also = f"{mine} and, for the rest, " if mine else ""
        detail = (
            f"a bucket's fetch signs with {also}your usual AWS configuration (this agent serves"
            f" you alone): {usual}"
        )
        return _check(NAME, CheckStatus.passed, detail)
    detail = (
        f"none: {lacking}, and there is no usual AWS configuration here (no AWS credentials in"
        " the agent's environment, no ~/.aws/credentials or config); a fetch would try the"
        " host's instance role, if it has one"
    )
    return _check(NAME, CheckStatus.warning, detail, SET_THEM)
