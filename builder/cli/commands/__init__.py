"""The commands, one module per stage they drive. Each ``cmd_*(args) -> exit code`` imports its
stage when it runs, so a command loads only what it needs (``envbuild check``: no docker, rich...)."""
