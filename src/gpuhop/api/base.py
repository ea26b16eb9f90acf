"""The base of every wire model."""

from pydantic import BaseModel, ConfigDict


class WireModel(BaseModel):
    # Schemas are built on first use, not at import: a CLI command touches two or three
    # models, and building all of them up front costs a large share of its start-up.
    model_config = ConfigDict(defer_build=True)


class StrictModel(WireModel):
    """A request body: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(defer_build=True, extra="forbid")
