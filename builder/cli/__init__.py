"""The command line: arguments and printing only.
"""

from builder.cli.app import main

__all__ = ["main"]
