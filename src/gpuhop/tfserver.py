"""Runs on the GPU host, as a gpuhop job: `gpuhop.tf.server` by its old path, for old scripts.

A TensorFlow server job's work dir is an entry script written by the client that started
it, and run by the host's gpuhop. Scripts written before `gpuhop.tf` became a package say
`from gpuhop.tfserver import main`: a server job queued before the host's gpuhop was
upgraded, or one started by a client not yet upgraded, still runs them. Nothing in gpuhop
imports this module; new code uses `gpuhop.tf.server`.
"""

from __future__ import annotations

from gpuhop.tf.server import DEFAULT_PORT, main

__all__ = ["DEFAULT_PORT", "main"]
