"""gpuhop's version, on both sides (the agent reports it; the CLI and Ray's nodes check it).

Its own module, so that no part of gpuhop imports the package's public facade for it.
"""

__version__ = "0.1.0"
