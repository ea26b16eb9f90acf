"""Runs in the agent (and, for `probe`, beside it): the host's GPUs, their history and
health, those quarantined for a fault, the identities jobs run as, and what TensorFlow sees
there."""
