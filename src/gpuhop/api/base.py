"""The base of every wire model."""

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def check_text(value: str, what: str) -> str:
    """Return `value` if it is valid text (encodable as UTF-8), else raise ValueError.

    JSON may carry a lone UTF-16 surrogate ("\\ud800"), which Python decodes to a str that
    no file name, argument, environment or answer can hold: refuse it at the door, naming
    where it was.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ascii(value[e.start : e.end])
        raise ValueError(f"{what} is not valid text: it holds a lone surrogate {bad}") from None
    return value


def _check_texts(value: Any, what: str) -> None:
    """Every str in `value` (lists, dicts, their keys) is valid text."""
    if isinstance(value, str):
        check_text(value, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                check_text(key, f"{what} (a key)")
            _check_texts(item, f"{what}[{key!r}]" if isinstance(key, str) else what)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_texts(item, f"{what}[{i}]")


class WireModel(BaseModel):
    # Schemas are built on first use, not at import: a CLI command touches two or three
    # models, and building all of them up front costs a large share of its start-up.
    model_config = ConfigDict(defer_build=True)


class StrictModel(WireModel):
    """A request body: unknown fields are an error, not silently dropped, and every string
    in it must be valid text (see `check_text`)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, v: Any, info: ValidationInfo) -> Any:
        # Before the field's own checks, so that none of them sees (or echoes) such a
        # string. Nested models run this for their own fields.
        _check_texts(v, info.field_name or "a value")
        return v
