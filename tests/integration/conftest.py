"""Fixtures shared by the integration tests beyond those of tests/conftest.py: the private
container registry of the image tests (tests/registry.py)."""

from tests.registry import registry

__all__ = ["registry"]
