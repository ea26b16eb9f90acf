"""Runs in the agent (and, for `probe`, beside it): the host's GPUs, their history, and what
TensorFlow sees there."""
