"""Runs inside the job, before the user's code: what to do right after a framework is imported.

Some settings must reach a framework after it is imported but before its first op (a GPU
memory cap raises RuntimeError in TensorFlow once an op has run; PyTorch's must come before
its first allocation), and scripts must not have to change for them: neither for gpuhop's
Keras callbacks, which every `Model.fit` gets. So gpuhop does them in the job's interpreter,
at the one moment that works for any script: right after `import tensorflow` (or `keras`,
`tf_keras`, `torch`) has finished, before the script's next line.

How it gets there: when any action in `ACTIONS` applies to a job (its variable is set in the
job's environment, and not to "0", see `wanted`), the backend puts `STARTUP_DIR` first on the
job's PYTHONPATH. Python's `site` then imports `startup/sitecustomize.py` in every Python
process of the job; that calls `install()`, which puts a finder on `sys.meta_path` that wraps
the loader of each module an action waits for and runs its actions on the module once its
import completes. Nothing here imports a framework: a job that never imports one pays one
cheap `find_spec` call per import. `python -I`, `-E` and `-S` skip the hook (they skip
PYTHONPATH or sitecustomize).

The registry is meant to grow. To add an action: write `def _thing(module, value) -> str` that
does it with the imported module and the variable's value and returns what it did, in
words; then add `AfterImport("thing", "ENV_VAR", "do the thing with {value}", _thing,
module="tensorflow")` to `ACTIONS`. The backend installs the hook whenever ENV_VAR is in a
job's environment.

It must load fast, since it loads in every Python process of such a job: it imports `os`
and `sys` only, and nothing from gpuhop. sitecustomize loads this file by its path, as the
module `_gpuhop_hook` (importing the gpuhop package there would cost tens of milliseconds
per process); a script that imports `gpuhop.runtime.hook` sees the same `applied` records.
An action that fails prints one `gpuhop: ...` line to stderr; the script goes on without it.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing itself costs milliseconds to import; mypy knows this name
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType
    from typing import Any

__all__ = ["ACTIONS", "STARTUP_DIR", "AfterImport", "applied", "install", "wanted"]

# The directory the supervisor puts first on a job's PYTHONPATH; it holds sitecustomize.py.
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")
# Set to 1 in a job's environment (`gpuhop run -e GPUHOP_HOOK_VERBOSE=1`) for a line on
# stderr per action run.
VERBOSE_ENV = "GPUHOP_HOOK_VERBOSE"

# The name sitecustomize loads this file under.
EARLY_NAME = "_gpuhop_hook"
_early = sys.modules.get(EARLY_NAME)
# What the hook did in this process: action name -> what it did, in the order they ran.
applied: dict[str, str] = _early.applied if _early is not None and __name__ != EARLY_NAME else {}


class AfterImport:
    """An action to run on the module `module` right after it is imported.

    It applies to a job whose environment sets `env_var` to a value other than "" and "0";
    `apply` gets the module and that value and returns what it did. `what` describes it for
    the error line if it fails ("{value}" is replaced by the variable's value).
    """

    __slots__ = ("apply", "env_var", "module", "name", "what")

    def __init__(
        self,
        name: str,
        env_var: str,
        what: str,
        apply: Callable[[ModuleType, str], str],
        module: str = "tensorflow",
    ):
        self.name = name
        self.env_var = env_var
        self.what = what
        self.apply = apply
        self.module = module

    def __repr__(self) -> str:
        return f"AfterImport({self.name!r}, {self.env_var!r}, module={self.module!r})"


def _cap_gpu_memory(tf: Any, value: str) -> str:
    """Give TensorFlow one logical device per visible GPU, limited to `value` MB.

    This is the cap for a job on a shared GPU: TensorFlow's allocator then never takes more
    than the share (memory growth, TF_FORCE_GPU_ALLOW_GROWTH, still applies inside it). A
    script that sets its own logical device configuration replaces it.
    """
    mb = int(value)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.set_logical_device_configuration(
            gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=mb)]
        )
    if not gpus:
        return f"no GPU visible to TensorFlow; nothing to cap at {mb} MB"
    growth = "; set_memory_growth on them is a no-op" if _tolerate_growth_calls(gpus) else ""
    return f"capped {len(gpus)} GPU(s) at {mb} MB{growth}"


def _tolerate_growth_calls(capped: list[Any]) -> bool:
    """Make `set_memory_growth` on the capped GPUs a no-op instead of a ValueError.

    TensorFlow refuses memory growth on a GPU that has a logical device configuration
    ("Cannot set memory growth on device when virtual devices configured"), and many
    scripts call it first thing; growth is on within the cap anyway. Every public form of
    the call goes through the one eager context, so that is where it is intercepted.
    """
    context_module = sys.modules.get("tensorflow.python.eager.context")
    if context_module is None:
        return False
    ctx = context_module.context()  # creates the Python object only; runs no op
    original = ctx.set_memory_growth

    def set_memory_growth(device: Any, enable: bool) -> None:
        if device not in capped:
            original(device, enable)

    ctx.set_memory_growth = set_memory_growth
    return True


def _bound_worker_wait(tf: Any, value: str) -> str:
    # TensorFlow is loaded by now, so importing this here costs nothing worth counting.
    from gpuhop.runtime.coordination import bound_worker_wait

    bound_worker_wait()
    return f"a worker waits at most {value}s for its peers to join"


def _add_callbacks(keras: Any, value: str) -> str:
    # Keras is loaded by now, so importing this here costs nothing worth counting.
    from gpuhop.runtime.callbacks import patch_fit

    return patch_fit(keras)


def _hint_keras3_errors(keras: Any, value: str) -> str:
    # Keras is loaded by now, so importing this here costs nothing worth counting.
    from gpuhop.runtime.legacykeras import install_excepthook

    return install_excepthook()


def _record_summaries(tf: Any, value: str) -> str:
    # TensorFlow is loaded by now, so importing this here costs nothing worth counting.
    from gpuhop.runtime.summaries import record

    return record(tf)


def _cap_torch(torch: Any, value: str) -> str:
    """Cap PyTorch's caching allocator at `value` (a fraction of each visible GPU) before its
    first allocation: past it, an allocation raises torch's OutOfMemoryError."""
    fraction = float(value)
    if not 0 < fraction <= 1:
        raise ValueError(f"{value!r} is not a fraction of a GPU in (0, 1]")
    if not torch.cuda.is_available():
        return f"no GPU visible to PyTorch; nothing to cap at {fraction:.3f} of one"
    count = torch.cuda.device_count()
    for i in range(count):
        torch.cuda.set_per_process_memory_fraction(fraction, i)
    return f"capped {count} GPU(s) at {fraction:.3f} of their memory"


def _settle_devices(tf: Any, value: str) -> str:
    """In a CPU job, let TensorFlow look for GPUs now, while its start-up lines are being
    filtered (see `_QuietStderr`): a CUDA build logs `failed call to cuInit` at that
    moment, as an error that on a CPU job is none."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        return "a GPU job: TensorFlow finds its GPUs when the script asks"
    tf.config.list_physical_devices("GPU")
    return "CPU job: TensorFlow's search for GPUs done, quietly"


def _wait_for_profile_requests(framework: Any, value: str) -> str:
    # The framework is loaded by now, so importing this here costs nothing worth counting.
    from gpuhop.runtime.profiling import listen

    return listen(framework.__name__)


def _report_memory_at_exit(framework: Any, value: str) -> str:
    # The framework is loaded by now, so importing this here costs nothing worth counting.
    from gpuhop.runtime.memory import report_at_exit

    return report_at_exit()


ACTIONS: list[AfterImport] = [
    AfterImport(
        "gpu_memory_limit",
        "GPUHOP_GPU_MEMORY_MB",
        "cap TensorFlow's GPU memory at {value} MB",
        _cap_gpu_memory,
    ),
    AfterImport(
        "worker_timeout",
        "GPUHOP_WORKER_TIMEOUT",
        "bound the wait for peers at {value}s",
        _bound_worker_wait,
    ),
    # Keras 3 (any backend; `tf.keras` is this module too) and tf-keras.
    AfterImport(
        "keras_callbacks",
        "GPUHOP_AUTO",
        "add gpuhop's callbacks to Keras's Model.fit",
        _add_callbacks,
        module="keras",
    ),
    AfterImport(
        "keras3_hints",
        "GPUHOP_AUTO",
        "hint at tf-keras where a Keras 3 error has that fix",
        _hint_keras3_errors,
        module="keras",
    ),
    AfterImport(
        "tf_keras_callbacks",
        "GPUHOP_AUTO",
        "add gpuhop's callbacks to tf-keras's Model.fit",
        _add_callbacks,
        module="tf_keras",
    ),
    AfterImport(
        "summary_metrics",
        "GPUHOP_AUTO",
        "record tf.summary scalars as metrics",
        _record_summaries,
    ),
    # Quiet start-up (TF_CPP_MIN_LOG_LEVEL 1 or more; `-e TF_CPP_MIN_LOG_LEVEL=0` brings
    # it all back): the import of TensorFlow itself is filtered by `_QuietStderr`.
    AfterImport(
        "quiet_start",
        "TF_CPP_MIN_LOG_LEVEL",
        "settle TensorFlow's devices quietly",
        _settle_devices,
    ),
    *(
        AfterImport(
            f"{name}_memory_at_exit",
            "GPUHOP_AUTO",
            "report device memory at exit",
            _report_memory_at_exit,
            module=name,
        )
        for name in ("tensorflow", "jax", "torch")
    ),
    # `gpuhop profile`: one idle thread on a FIFO, only in a process that imported one.
    *(
        AfterImport(
            f"{name}_profile_requests",
            "GPUHOP_CONTROL_DIR",
            "wait for gpuhop profile requests",
            _wait_for_profile_requests,
            module=name,
        )
        for name in ("tensorflow", "jax")
    ),
    AfterImport(
        "torch_memory_fraction",
        "GPUHOP_GPU_MEMORY_FRACTION",
        "cap PyTorch's GPU memory at {value} of the GPU",
        _cap_torch,
        module="torch",
    ),
]


def wanted(environ: Mapping[str, str] = os.environ) -> list[AfterImport]:
    """The actions that apply to a process with this environment."""
    return [a for a in ACTIONS if environ.get(a.env_var, "0") not in ("", "0")]


def install(environ: Mapping[str, str] = os.environ) -> bool:
    """Arrange for the wanted actions to run right after their modules are imported.

    Returns whether anything was wanted. For a module already imported, they run now.
    """
    actions = wanted(environ)
    if not actions:
        return False
    waiting: dict[str, list[AfterImport]] = {}
    for action in actions:
        waiting.setdefault(action.module, []).append(action)
    for name in list(waiting):
        module = sys.modules.get(name)
        if module is not None:
            _run(module, waiting.pop(name), environ)
    if waiting and not any(getattr(f, "gpuhop_watcher", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _ImportWatcher(waiting, environ))
    return True


def _run(module: ModuleType, actions: list[AfterImport], environ: Mapping[str, str]) -> None:
    verbose = environ.get(VERBOSE_ENV) == "1"
    for action in actions:
        value = environ.get(action.env_var, "")
        try:
            did = action.apply(module, value)
        except Exception as e:  # never crash the user's script over a setting
            what = action.what.format(value=value)
            _say(f"could not {what}: {type(e).__name__}: {e}; the job goes on without it")
            if "'gpuhop' is not a package" in str(e):  # the job's own gpuhop.py came first
                _say(
                    "a file named gpuhop.py (or a gpuhop folder) in the work dir hides gpuhop's"
                    " own: rename it to get metrics and --retries resume back"
                )
            continue
        applied[action.name] = did
        if verbose:
            version = getattr(module, "__version__", "?")
            _say(f"after import {action.module} ({version}): {action.name}: {did}")


def _say(message: str) -> None:
    # Not contextlib.suppress: importing contextlib would cost milliseconds per process.
    try:  # noqa: SIM105
        print(f"gpuhop: {message}", file=sys.stderr, flush=True)
    except Exception:
        pass  # a closed stderr is no reason to fail


class _ImportWatcher:
    """A sys.meta_path finder that only watches: for a module an action waits for, it asks
    the finders after it for the real spec and wraps that spec's loader, so the actions run
    once the module has executed. It finds nothing itself, and removes itself once every
    module it waits for has been imported."""

    gpuhop_watcher = True  # how `install` recognises one, whichever copy of this file made it

    def __init__(self, waiting: dict[str, list[AfterImport]], environ: Mapping[str, str]):
        self.waiting = waiting
        self.environ = environ

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.waiting:
            return None
        try:
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if getattr(finder, "gpuhop_watcher", False) or find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None  # let the import machinery say what is wrong, as without us
            quiet = fullname == "tensorflow" and any(
                a.name == "quiet_start" for a in self.waiting[fullname]
            )
            spec.loader = _RunAfter(spec.loader, self._imported, quiet)
            return spec
        except Exception as e:  # fall back to a plain import, without the actions
            _say(f"start-up hook: cannot watch the {fullname} import: {type(e).__name__}: {e}")
            return None

    def _imported(self, module: ModuleType) -> None:
        actions = self.waiting.pop(module.__name__, [])
        if not self.waiting:
            try:  # noqa: SIM105 - see _say
                sys.meta_path.remove(self)
            except ValueError:
                pass
        _run(module, actions, self.environ)


class _RunAfter:
    """A loader that runs the real one, then `then(module)`: the post-import hook itself;
    with `quiet`, both with TensorFlow's start-up chatter filtered from stderr."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None], quiet: bool = False):
        self._loader = loader
        self._then = then
        self._quiet = quiet

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        # The module keeps its real loader (importlib.resources and friends look at it).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        if not self._quiet:
            self._loader.exec_module(module)
            self._then(module)
            return
        with _QuietStderr():
            self._loader.exec_module(module)
            self._then(module)


# TensorFlow's lines at import that tell a user nothing to act on. Its C++ logging starts
# before TF_CPP_MIN_LOG_LEVEL is read (TensorFlow 2.21), so the variable alone hides them not.
CHATTER = (
    b"All log messages before absl::InitializeLog() is called",
    b"] oneDNN custom operations are on",
    b"] Could not find cuda drivers on your machine",
)
# Chatter in a CPU job only: in a GPU job it is the error it says.
CPU_CHATTER = (b"] failed call to cuInit",)


class _QuietStderr:
    """Sends file descriptor 2 to an in-memory file while it is open, then writes what came
    back to the real stderr, less `CHATTER` lines. (A process that dies meanwhile loses
    those lines: TensorFlow's import is no common place to die.)"""

    def __enter__(self) -> None:
        self._saved = -1
        try:
            self._buffer = os.memfd_create("gpuhop-tf-start")
        except (AttributeError, OSError):
            return  # no memfd here: the chatter stays
        sys.stderr.flush()
        self._saved = os.dup(2)
        os.dup2(self._buffer, 2)

    def __exit__(self, *exc: object) -> None:
        if self._saved < 0:
            return
        try:  # noqa: SIM105 - see _say
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(self._saved, 2)
        os.close(self._saved)
        os.lseek(self._buffer, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self._buffer, 1 << 16):
            chunks.append(chunk)
        os.close(self._buffer)
        chatter = CHATTER + (CPU_CHATTER if os.environ.get("CUDA_VISIBLE_DEVICES") == "" else ())
        kept = [
            line
            for line in b"".join(chunks).splitlines(keepends=True)
            if not any(c in line for c in chatter)
        ]
        if kept:
            os.write(2, b"".join(kept))
