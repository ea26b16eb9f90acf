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
"""

import sys
import types


def main() -> None:
    sys.modules["tensorboard.compat.notf"] = types.ModuleType("tensorboard.compat.notf")
    sys.modules["tensorflow"] = None  # type: ignore[assignment]  # `import` raises ImportError
    from tensorboard.main import run_main

    sys.argv[0] = "tensorboard"
    run_main()


if __name__ == "__main__":
    main()
