"""The command line: arguments, dispatch and printing only; each command imports its stage
when it runs, so a command loads only what it needs (``envbuild check``: the recipe stage).
"""

from builder.cli.app import main

__all__ = ["main"]
