"""Builds the dataset chunker's C part (src/gpuhop/client/sync/_cdc.c) with the wheel.

A plain shared library, loaded with ctypes (no Python API: one build serves any Python).
Without a C compiler the install goes on with a warning, and pushes chunk with numpy: the
same cut points, about twice the CPU time.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "src/gpuhop/client/sync/_cdc.c"
LIBRARY = "src/gpuhop/client/sync/_cdc_native.so"


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        source, library = Path(self.root, SOURCE), Path(self.root, LIBRARY)
        compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or "gcc"]
        if shutil.which(compiler[0]) is None:
            self.app.display_warning(
                "gpuhop: no C compiler (cc): dataset pushes will chunk with numpy (slower)"
            )
            return
        # Built beside it, then renamed over it: a process that has it loaded keeps its copy.
        built = library.with_name(f".{library.name}.{os.getpid()}")
        command = [*compiler, "-O3", "-shared", "-fPIC", "-o", str(built), str(source)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            os.replace(built, library)
        else:
            built.unlink(missing_ok=True)
            self.app.display_warning(
                f"gpuhop: building {SOURCE} failed, dataset pushes will chunk with numpy"
                f" (slower):\n{done.stderr}"
            )
            return
        if version != "editable":  # an editable install loads it from src/ where it lies
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            build_data["force_include"][str(library)] = "gpuhop/client/sync/_cdc_native.so"
