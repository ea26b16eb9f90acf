"""The client side of gpuhop: the Python SDK that the CLI is built on."""

import sys

# httpx's __init__ imports its command-line client (click, rich, pygments: a third of a
# command's start-up) whenever those are installed; an entry of None makes that import fail
# at once, and httpx then leaves its `main` a stub. The SDK never runs httpx's CLI.
if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
    sys.modules["httpx._main"] = None  # type: ignore[assignment]
    try:
        import httpx  # noqa: F401
    finally:
        del sys.modules["httpx._main"]  # a later `import httpx._main` works as ever

from gpuhop.client.client import Client
from gpuhop.client.errors import GpuhopError
from gpuhop.client.job import Job
from gpuhop.client.spec import SyncStats

__all__ = ["Client", "Forward", "GpuhopError", "Job", "Model", "SyncStats", "TensorBoard"]


def __getattr__(name: str) -> object:
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
