"""The `gpuhop` command line: one module per command group, each calling the SDK only."""
