"""Every library gpuhop's code imports comes with what pyproject.toml names: a plain `pip
install gpuhop` must not lean on what TensorFlow happens to bring along (numpy did, unnamed,
until `data push` in a Python with gpuhop's named dependencies alone failed for want of it).

A library counts as named when it is named, or a requirement of one named (read from the
installed distributions' metadata). The parts that run only with an extra installed
(TensorFlow's, Ray's, the notebook's) may use that extra's libraries too.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import gpuhop

SRC = Path(gpuhop.__file__).parent
PYPROJECT = SRC.parent.parent / "pyproject.toml"
# Parts that run only where an extra is installed: the job's TensorFlow and Keras (and
# their workers' coordination), model serving (a TensorFlow job), the notebook and
# TensorBoard servers, the Ray backend; and doctor's probe, which tries TensorFlow in the
# jobs' Python.
WITH_EXTRAS = (
    "tf/",
    "keras.py",
    "tfserver",
    "runtime/coordination.py",
    "runtime/summaries.py",  # runs in a job once it has imported TensorFlow (tf.summary)
    "serving/",
    "runtime/notebook/",
    "runtime/tbserver.py",  # a TensorBoard server job's program (the tf extra's tensorboard)
    "backends/ray/",
    "agent/host/probe.py",
)


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(names: set[str]) -> set[str]:
    """`names` and, for those installed here, everything they require, transitively."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


def _declared() -> tuple[set[str], set[str]]:
    """What a plain install brings, and what it brings with every extra but dev's."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    extras = {
        _name(r)
        for extra, requirements in project["optional-dependencies"].items()
        if extra != "dev"
        for r in requirements
    }
    return _closure(core), _closure(core | extras)


def _imported() -> dict[str, set[str]]:
    """Top-level module name -> the files that import it, for modules outside the standard
    library and gpuhop (a module beside its importer, loaded by path, counts as gpuhop's)."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names}:
                ours = top in ("gpuhop", "_gpuhop_hook") or (path.parent / f"{top}.py").exists()
                if not ours and top not in sys.stdlib_module_names:
                    found.setdefault(top, set()).add(path.relative_to(SRC).as_posix())
    return found


def test_every_library_gpuhop_imports_is_declared():
    core, everything = _declared()
    providers = metadata.packages_distributions()
    undeclared = {}
    for module, files in _imported().items():
        dists = {_name(d) for d in providers.get(module, [module])}
        for file in files:
            allowed = everything if file.startswith(WITH_EXTRAS) else core
            if not dists & allowed:
                undeclared.setdefault(module, []).append(file)
    assert {module: sorted(files) for module, files in undeclared.items()} == {}
