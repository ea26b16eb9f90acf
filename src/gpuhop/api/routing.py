"""Shared by the agent's routes and `gpuhop ui`'s proxy: a route's `{path:anypath}`, a path
that may hold any bytes a file name may. Starlette's `path` matches no line break (its
pattern is ".*"), and a job's artifact named "a\\nb.txt" answered "no such route" (the
agent) or "Not Found" (the proxy). Importing this module registers it."""

from __future__ import annotations

from starlette.convertors import PathConvertor, register_url_convertor


class AnyPath(PathConvertor):
    regex = r"[\s\S]*"


register_url_convertor("anypath", AnyPath())
