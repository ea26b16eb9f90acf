"""gpuhop: use a remote GPU machine for TensorFlow as if it were local.

The public surface is what `__all__` lists, plus `gpuhop.tf` inside a job. Importing
`gpuhop` is light: the client (httpx, pydantic) loads on first use of `Client`, so a job
that imports `gpuhop.tf` pays nothing for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhop.version import __version__

__all__ = ["Client", "GpuhopError", "Job", "__version__"]

if TYPE_CHECKING:
    from gpuhop.client import Client, GpuhopError, Job


def __getattr__(name: str) -> Any:
    if name in ("Client", "GpuhopError", "Job"):
        from gpuhop import client

        return getattr(client, name)
    raise AttributeError(f"module 'gpuhop' has no attribute {name!r}")
