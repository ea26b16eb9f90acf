"""The client side of gpuhop: the Python SDK that the CLI is built on."""

from typing import TYPE_CHECKING

from gpuhop.client.client import Client
from gpuhop.client.errors import GpuhopError
from gpuhop.client.job import Job

__all__ = [
    "Client",
    "Forward",
    "GpuhopError",
    "Job",
    "JobSpec",
    "Model",
    "SyncStats",
    "TensorBoard",
]


if TYPE_CHECKING:
    from gpuhop.api.spec import JobSpec
    from gpuhop.client.submitted import SyncStats


def __getattr__(name: str) -> object:
    # Loaded by the commands that make one (`run`, `sweep`), not by `ps` or `logs`.
    if name == "JobSpec":
        from gpuhop.api.spec import JobSpec

        return JobSpec
    # The sync's modules load with a submit, not with every command.
    if name == "SyncStats":
        from gpuhop.client.submitted import SyncStats

        return SyncStats
    # Forward needs websockets and asyncio: loaded only by those who forward ports.
    if name == "Forward":
        from gpuhop.client.forward import Forward

        return Forward
    if name == "Model":
        from gpuhop.client.serving import Model

        return Model
    if name == "TensorBoard":
        from gpuhop.client.tensorboard import TensorBoard

        return TensorBoard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
