"""Runs on the GPU host, as a gpuhop job: the old path of `gpuhop.tf.server`, for launchers.

A TensorFlow server job's work dir is a launcher script written by the client that started
it, and run by the host's gpuhop. Launchers written before `gpuhop.tf` became a package say
`from gpuhop.tfserver import main`: a server job queued before the host's gpuhop was
upgraded, or one started by a client not yet upgraded, still runs them. Nothing in gpuhop
imports this module; new code uses `gpuhop.tf.server`.
"""

from __future__ import annotations

from gpuhop.tf.server import DEFAULT_PORT, main

__all__ = ["DEFAULT_PORT", "main"]
