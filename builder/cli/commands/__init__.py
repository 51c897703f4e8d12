"""The ``envbuild`` commands, one module per command (or group of commands)."""
