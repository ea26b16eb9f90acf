"""Runs on the user's machine: httpx, for the parts of the SDK that speak it (TLS remotes, the
dashboard's proxy), imported on first use only: a command to an agent on a Unix socket
never loads it."""

from __future__ import annotations

import sys
import types


def httpx_module() -> types.ModuleType:
    """httpx, imported without its command-line client.

    httpx's __init__ imports its CLI (click, rich, pygments: a third of a command's
    start-up) whenever those are installed; an entry of None makes that import fail at
    once, and httpx then leaves its `main` a stub. The SDK never runs httpx's CLI.
    """
    if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]
        try:
            import httpx
        finally:
            del sys.modules["httpx._main"]  # a later `import httpx._main` works as ever
    import httpx

    return httpx
