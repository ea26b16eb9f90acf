"""The wire models of a user's secrets (version 1): setting one, and listing them. No model
carries a secret's value back: there is no answer that holds one."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, field_validator

from gpuhop.api.base import StrictModel, WireModel

# A secret's value: an API key, a token, a key file's text. Bounded: no one's credentials
# need more, and a value is held in every job's environment that names it.
MAX_SECRET_BYTES = 64 * 1024
# Shorter values are refused: masked, they would blank those characters in every output.
MIN_SECRET_CHARS = 4


class SecretValue(StrictModel):
    """`gpuhop secret set NAME`'s body: the value, and nothing else."""

    value: str = Field(min_length=1)

    @field_validator("value")
    @classmethod
    def _value(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError(
                "a secret's value cannot contain a NUL byte (it goes in an environment)"
            )
        if len(v) < MIN_SECRET_CHARS:
            raise ValueError(
                f"a secret's value must be at least {MIN_SECRET_CHARS} characters: gpuhop"
                " writes *** wherever a value appears in what it shows of your jobs, and a"
                " shorter one would blank those characters everywhere (and so tell them)"
            )
        if len(v.encode("utf-8", "surrogateescape")) > MAX_SECRET_BYTES:
            raise ValueError(f"a secret's value may be at most {MAX_SECRET_BYTES // 1024} KiB")
        return v


class SecretInfo(WireModel):
    """One of the caller's secrets: its name and when it was last set, never its value."""

    name: str
    set_at: datetime
