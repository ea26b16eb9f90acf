"""Runs on the GPU host as a TensorBoard server job's program: TensorBoard, without
TensorFlow. The agent (`gpuhop.agent.services.tensorboard`) copies this file into the job's
work dir, so it needs nothing but the standard library and `tensorboard`, whichever
interpreter runs it.

TensorBoard imports TensorFlow when it can, only to read files through `tf.io.gfile`. Here
that cost about 5 s of start-up and 700 MB of memory, and buys nothing for a
local log dir. The presence of `tensorboard.compat.notf` (the module that TensorBoard's own
TensorFlow-free build ships) tells it to use its built-in reader instead. What Keras's
callback writes shows the same either way (scalars, graphs, histograms, distributions).
The profile plugin (xprof) imports TensorFlow too where it can, only for capturing from a
remote profiler server, which gpuhop never runs: TensorFlow is made unimportable here, and
the plugin reads the traces (`gpuhop profile`'s) with its own converter.

The profile plugin reads one log dir, TensorBoard's `--logdir`; given `--logdir_spec` (the
agent's two dirs: the job's TensorBoard dir and its work dir) it has none and lists no run.
So this program adds a flag of its own, `--profile_logdir DIR`: the dir whose
`[RUN/]plugins/profile/SESSION/*.xplane.pb` the plugin lists (the job's TensorBoard dir, where
`gpuhop profile` writes), whatever the other plugins read. And the plugin writes beside each
trace what it derives from it (the list of its tools, the programs in it), which it cannot do
in the job's dirs (this server sees them read-only): without those files it offers no tool.
So it reads a mirror of DIR's profile sessions in this server's own /tmp instead
(`ProfileMirror`: a link to each trace, refreshed whenever the plugin lists its runs),
where it may write; the job's dirs stay as the job left them.
"""

import copy
import os
import sys
import tempfile
import types
from typing import Any

PROFILE_LOGDIR_FLAG = "profile_logdir"
# The tensorboard_plugins entry points of the profile plugin: xprof's, and its older name's.
PROFILE_PLUGIN_MODULES = ("xprof.", "tensorboard_plugin_profile.")
# The profile plugin's route that lists its runs (under /data/plugin/profile).
RUNS_ROUTE = "/runs"


class ProfileMirror:
    """`mirror` made to hold, for each profile session under `source`
    (`[RUN/]plugins/profile/SESSION/`), the same dirs with a link to each of its files.
    Links in `source` are not followed."""

    def __init__(self, source: str, mirror: str):
        self.source = source
        self.mirror = mirror

    def sync(self) -> None:
        try:
            self._sync()
        except OSError as e:  # the plugin lists what is there; the server goes on
            print(f"gpuhop: cannot mirror the profiles in {self.source}: {e}", file=sys.stderr)

    def _sync(self) -> None:
        for dirpath, dirs, names in os.walk(self.source):
            rel = os.path.relpath(dirpath, self.source)
            if rel.split(os.sep)[-3:-1] != ["plugins", "profile"]:
                continue
            dirs[:] = []  # a session is its files
            target = os.path.join(self.mirror, rel)
            os.makedirs(target, exist_ok=True)
            for name in names:
                link, file = os.path.join(target, name), os.path.join(dirpath, name)
                if not os.path.lexists(link) and not os.path.islink(file):
                    os.symlink(file, link)


class MirroredProfiles:
    """The profile plugin, its mirror synced each time it lists runs (its `/runs` route and
    `is_active`, which TensorBoard asks to enable the tab): a capture made while TensorBoard
    runs shows at the next listing. Everything else is the plugin's own."""

    def __init__(self, plugin: Any, mirror: ProfileMirror):
        self._plugin = plugin
        self._mirror = mirror

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plugin, name)

    def is_active(self) -> bool:
        self._mirror.sync()
        return bool(self._plugin.is_active())

    def get_plugin_apps(self) -> dict[str, Any]:
        routes = dict(self._plugin.get_plugin_apps())
        runs = routes.get(RUNS_ROUTE)
        if runs is not None:

            def synced_runs(environ: Any, start_response: Any) -> Any:
                self._mirror.sync()
                return runs(environ, start_response)

            routes[RUNS_ROUTE] = synced_runs
        return routes


def main() -> None:
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    sys.modules["tensorflow"] = None  # type: ignore[assignment]  # `import` raises ImportError
    from absl import app
    from tensorboard import default, main_lib, program
    from tensorboard.plugins import base_plugin

    class ProfileLogdirFlag(base_plugin.TBLoader):
        """Declares --profile_logdir, whether the profile plugin is installed or not."""

        def define_flags(self, parser: Any) -> None:
            parser.add_argument(
                f"--{PROFILE_LOGDIR_FLAG}",
                metavar="PATH",
                default="",
                help="the log dir the profile plugin reads (default: --logdir)",
            )

        def load(self, context: Any) -> None:
            return None

    class ProfilePluginIn(base_plugin.TBLoader):
        """The profile plugin's loader, given --profile_logdir as its log dir."""

        def __init__(self, plugin: Any):
            from tensorboard.backend.application import make_plugin_loader

            self.loader = make_plugin_loader(plugin)

        def define_flags(self, parser: Any) -> None:
            self.loader.define_flags(parser)

        def fix_flags(self, flags: Any) -> None:
            self.loader.fix_flags(flags)

        def load(self, context: Any) -> Any:
            source = getattr(context.flags, PROFILE_LOGDIR_FLAG, "") or context.logdir
            if not source:
                return self.loader.load(context)
            mirror = ProfileMirror(source, tempfile.mkdtemp(prefix="profiles-"))
            context = copy.copy(context)  # the other plugins' context stays as it was
            context.logdir = mirror.mirror
            plugin = self.loader.load(context)
            return None if plugin is None else MirroredProfiles(plugin, mirror)

    plugins = [
        ProfilePluginIn(p) if getattr(p, "__module__", "").startswith(PROFILE_PLUGIN_MODULES) else p
        for p in default.get_plugins()
    ]
    sys.argv[0] = "tensorboard"
    # What tensorboard.main.run_main does, with these plugins.
    main_lib.global_init()
    tensorboard = program.TensorBoard(plugins=[*plugins, ProfileLogdirFlag()])
    try:
        app.run(tensorboard.main, flags_parser=tensorboard.configure)
    except base_plugin.FlagsError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
