"""The command line: arguments, dispatch and printing only; each command imports its stage
when it runs, so a command loads only what it needs (``envbuild check``: the recipe stage).

Modules: app (main, dispatch, signals, errors -> one escaped line and an exit code), parser
(the argparse tree), argtypes (argument types), checks (argument checks before anything is
contacted), output (consoles and printing), commands/ (one module per stage it drives).

May import: every package of builder (only inside command functions, argument types and checks).
"""

from builder.cli.app import main

__all__ = ["main"]
