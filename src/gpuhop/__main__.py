"""`python -m gpuhop` is the `gpuhop` command."""

from gpuhop.cli.main import main

main()
