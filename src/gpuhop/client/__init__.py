"""The client side of gpuhop: the Python SDK that the CLI is built on."""

from gpuhop.client.client import Client, Job, SyncStats
from gpuhop.client.errors import GpuhopError
from gpuhop.client.forward import Forward

__all__ = ["Client", "Forward", "GpuhopError", "Job", "SyncStats"]
