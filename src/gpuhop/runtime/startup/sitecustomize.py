"""Runs at the start of each Python process of a gpuhop job that needs a start-up hook.

The supervisor puts this directory first on the job's PYTHONPATH (see gpuhop.runtime.hook),
so Python's `site` imports this file as `sitecustomize` before the job's script runs. It:

1. installs gpuhop's after-`import tensorflow` hook, in a gpuhop job only (outside one it
   costs a single environment lookup), and without importing TensorFlow;
2. in the job's first Python process, starts writing the job's record of what it ran on
   (gpuhop.runtime.provenance, in a thread; later processes find it written: one stat);
3. then runs the next `sitecustomize` on sys.path, if there is one (the user's own, or the
   Python distribution's), so that one still runs: this file never shadows it.

Standard library only. A failure here prints one `gpuhop: ...` line and the job goes on.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install_hook() -> None:
    if "GPUHOP_JOB_ID" not in os.environ:
        return
    try:
        # Loaded from its file rather than imported: importing the gpuhop package would cost
        # tens of ms in every Python process of the job, and this Python may not have it.
        _load("_gpuhop_hook", "hook.py").install()
    except Exception as e:
        print(
            f"gpuhop: start-up hook not installed ({type(e).__name__}: {e}); the job goes on"
            " without it",
            file=sys.stderr,
        )


def _record_provenance() -> None:
    path = os.environ.get("GPUHOP_PROVENANCE_FILE")
    if not path:
        return
    try:
        if os.stat(path).st_size:
            return  # written by the job's first process
        module = _load("_gpuhop_provenance", "provenance.py")
        module.start(path)
    except Exception:
        pass  # no record is no reason to say anything: `gpuhop show` says it is missing


def _load(name, filename):
    """gpuhop.runtime's `filename`, loaded by its path as the module `name`."""
    ModuleSpec, SourceFileLoader = _machinery()
    path = os.path.join(os.path.dirname(_HERE), filename)
    loader = SourceFileLoader(name, path)
    module = type(os)(name)
    module.__file__ = path
    module.__loader__ = loader
    module.__spec__ = ModuleSpec(name, loader, origin=path)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


def _machinery():
    """ModuleSpec and SourceFileLoader: those that loaded this file, as importing
    importlib.machinery for them costs half a millisecond in every process of the job."""
    spec = globals().get("__spec__")
    if spec is not None and type(spec.loader).__name__ == "SourceFileLoader":
        return type(spec), type(spec.loader)
    from importlib.machinery import ModuleSpec, SourceFileLoader

    return ModuleSpec, SourceFileLoader


def _path_finder():
    """The import system's PathFinder (on sys.meta_path), without importing importlib."""
    for finder in sys.meta_path:
        if getattr(finder, "__name__", None) == "PathFinder":
            return finder
    from importlib.machinery import PathFinder

    return PathFinder


def _chain() -> None:
    """Run the sitecustomize this one shadows, as Python would have run it."""
    PathFinder = _path_finder()
    here = os.path.normcase(_HERE)
    rest = [p for p in sys.path if os.path.normcase(os.path.abspath(p or os.curdir)) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    # Once this file has run, the import system hands out whatever sys.modules holds under
    # our name: the chained module becomes `sitecustomize`, as if Python had found it.
    sys.modules[__name__] = module
    # Its errors are reported by `site`, exactly as they would be without gpuhop.
    spec.loader.exec_module(module)


_install_hook()
_record_provenance()
_chain()
