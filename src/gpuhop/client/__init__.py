"""The client side of gpuhop: the Python SDK that the CLI is built on."""

from gpuhop.client.client import Client, Job, SyncStats
from gpuhop.client.errors import GpuhopError

__all__ = ["Client", "GpuhopError", "Job", "SyncStats"]
