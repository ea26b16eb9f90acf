"""The import graph, read from the code: no cycles, and each part imports only the parts
below it (the map in docs/ARCHITECTURE.md).

Every import statement counts, wherever it is: at the top, under TYPE_CHECKING, or inside a
function (a lazy import hides a cycle; it does not remove it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import gpuhop

SRC = Path(gpuhop.__file__).parent.parent

# The parts, each a package or a module. A module belongs to the longest part that names it.
# Which parts each may import: the agent's own, then the parts shared by both sides, then
# what runs in the job. The agent's top-level modules each are a part: `errors`, `callers`,
# `config` (agent.toml) and `tokens` (the TCP listener's credentials) sit below everything
# in the agent; `context` (every store of a running agent)
# above storage, jobs and host; `__main__` above all.
MAY_IMPORT: dict[str, set[str]] = {
    "gpuhop": {"gpuhop.version", "gpuhop.client"},  # the public facade; the client lazily
    "gpuhop.__main__": {"gpuhop.cli"},
    "gpuhop.version": set(),
    "gpuhop.api": set(),
    "gpuhop.home": {"gpuhop.api"},
    # In the job.
    "gpuhop.runtime": set(),
    "gpuhop.serving": set(),
    "gpuhop.keras": {"gpuhop.runtime"},
    "gpuhop.tf": {"gpuhop.runtime", "gpuhop.client"},  # remote ops reach the agent by the SDK
    "gpuhop.tfserver": {"gpuhop.tf"},  # the entry-script path of servers queued before 0.1
    # On the user's machine. The SDK's errors and the local agent's daemon (embedded) at the
    # bottom, then the ways to reach an agent (transport), then the SDK: the session, the
    # sync (which sends through the session) and the features.
    "gpuhop.client.errors": set(),
    "gpuhop.client.embedded": {"gpuhop.home"},
    "gpuhop.client.transport": {
        "gpuhop.client.errors",
        "gpuhop.client.embedded",  # the local agent's socket, started when none answers
        "gpuhop.api",
        "gpuhop.home",
    },
    "gpuhop.client": {
        "gpuhop.client.errors",
        "gpuhop.client.embedded",
        "gpuhop.client.transport",
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.version",
    },
    "gpuhop.cli": {
        "gpuhop.client",
        "gpuhop.client.embedded",  # `agent start` and `agent stop`
        "gpuhop.client.transport",  # `remote`: the remotes file, SSH, a TLS pin
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.version",
        "gpuhop.backends",  # `agent start --backend`: the settings, checked before starting
        "gpuhop.agent.server",  # `agent start` runs the daemon
    },
    # Where jobs run: never the agent.
    "gpuhop.backends": {"gpuhop.api", "gpuhop.home"},
    "gpuhop.backends.local": {"gpuhop.backends", "gpuhop.api", "gpuhop.home", "gpuhop.runtime"},
    "gpuhop.backends.ray": {
        "gpuhop.backends",
        "gpuhop.backends.local",  # each worker runs under the local leader on its node
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.runtime",
        "gpuhop.version",
    },
    "gpuhop.backends.slurm": {
        "gpuhop.backends",
        "gpuhop.backends.local",  # how a job's command is found, and its leader's words
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.runtime",
    },
    # The agent, bottom to top.
    "gpuhop.agent.errors": {"gpuhop.api"},
    "gpuhop.agent.callers": set(),
    "gpuhop.agent.config": {"gpuhop.api"},
    "gpuhop.agent.tokens": set(),
    "gpuhop.agent.storage": {
        "gpuhop.agent.errors",
        "gpuhop.agent.config",  # the quotas
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.backends.local",  # environments are built by the local backend's builder
        "gpuhop.backends",  # procs.ask: a job's interpreter asked its version, bounded
    },
    "gpuhop.agent.host": {"gpuhop.backends", "gpuhop.api"},
    "gpuhop.agent.jobs": {
        "gpuhop.agent.storage",
        "gpuhop.agent.host",  # whose processes a shared GPU's are: its energy split by load
        "gpuhop.backends",
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.runtime",  # the hint lines a job's gpuhop code prints, found in its log
        "gpuhop.serving",  # and the model server's (what its Python lacks: serving.needs)
        "gpuhop.version",  # in the record of what each job ran on
    },
    "gpuhop.agent.context": {
        "gpuhop.agent.callers",  # the owner's login: exempt from per-user limits
        "gpuhop.agent.config",
        "gpuhop.agent.tokens",
        "gpuhop.agent.storage",
        "gpuhop.agent.jobs",
        "gpuhop.agent.host",
        "gpuhop.backends",
        "gpuhop.api",
        "gpuhop.home",
    },
    # The bytes to and from a job's servers (port forwards, the model-server proxy), below
    # the request handlers that decide who may reach which job.
    "gpuhop.agent.proxy": {
        "gpuhop.agent.context",
        "gpuhop.agent.errors",
        "gpuhop.agent.jobs",
        "gpuhop.backends",
        "gpuhop.api",
    },
    "gpuhop.agent.services": {
        "gpuhop.agent.proxy",
        "gpuhop.agent.context",
        "gpuhop.agent.config",
        "gpuhop.agent.errors",
        "gpuhop.agent.callers",
        "gpuhop.agent.storage",
        "gpuhop.agent.jobs",
        "gpuhop.agent.host",
        "gpuhop.backends",
        "gpuhop.api",
        "gpuhop.home",
    },
    "gpuhop.agent.duties": {
        "gpuhop.agent.services",  # garbage collection: `gpuhop gc` and a duty alike
        "gpuhop.agent.context",
        "gpuhop.agent.jobs",
        "gpuhop.agent.storage",
        "gpuhop.api",
    },
    "gpuhop.agent.ui": {
        "gpuhop.agent.context",
        "gpuhop.agent.errors",
        "gpuhop.agent.callers",
        "gpuhop.agent.services",
        "gpuhop.api",
        "gpuhop.version",
    },
    "gpuhop.agent.server": {
        "gpuhop.agent.ui",
        "gpuhop.agent.duties",
        "gpuhop.agent.services",
        "gpuhop.agent.proxy",
        "gpuhop.agent.context",
        "gpuhop.agent.errors",
        "gpuhop.agent.callers",
        "gpuhop.agent.config",
        "gpuhop.agent.tokens",
        "gpuhop.agent.storage",
        "gpuhop.agent.jobs",
        "gpuhop.agent.host",
        "gpuhop.backends",
        "gpuhop.backends.local",  # the daemon opens the backend it was started with
        "gpuhop.backends.ray",
        "gpuhop.backends.slurm",
        "gpuhop.api",
        "gpuhop.home",
        "gpuhop.version",
    },
    "gpuhop.agent": set(),  # the package itself: nothing but its docstring
    "gpuhop.agent.__main__": {
        "gpuhop.agent.server",
        "gpuhop.agent.storage",
        "gpuhop.backends",
        "gpuhop.home",
    },
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "gpuhop").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The gpuhop modules that `name` (at `path`) imports, by any statement anywhere."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(c for c in candidates if c in known and c != name)
    return found


def part_of(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in MAY_IMPORT:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} belongs to no part: add it to MAY_IMPORT")


GRAPH = {name: imports(name, path, set(modules())) for name, path in modules().items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_each_part_imports_only_the_parts_below_it() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if part_of(target) != part_of(module) and part_of(target) not in MAY_IMPORT[part_of(module)]
    )
    assert wrong == []


def test_the_parts_form_no_cycle() -> None:
    parts = {part: set(allowed) for part, allowed in MAY_IMPORT.items()}
    assert cycles(parts) == []


def test_no_backend_imports_the_agent() -> None:
    assert (
        sorted(
            f"{module} imports {target}"
            for module, targets in GRAPH.items()
            if module.startswith("gpuhop.backends")
            for target in targets
            if target.startswith("gpuhop.agent")
        )
        == []
    )


def test_the_graph_is_read_from_the_code() -> None:
    # A guard on the reader itself: known edges, a lazy one and a relative one among them.
    assert "gpuhop.client" in GRAPH["gpuhop"]  # inside __getattr__
    assert "gpuhop.backends.ray.backend" in GRAPH["gpuhop.agent.server.daemon"]  # in a function
    assert "gpuhop.agent.jobs.store" in GRAPH["gpuhop.agent.context"]
