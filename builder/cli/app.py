"""The ``envbuild`` command: parse (:mod:`builder.cli.parser`), check the arguments
(:mod:`builder.cli.checks`), run the command (:data:`COMMANDS`, :mod:`builder.cli.commands`).

Commands: ``check``, ``audit``, ``render``, ``build``, ``certify``, ``make`` (check -> render -> build
-> certify), ``report`` (a certificate's HTML report), ``probe``, ``verify``, ``doctor``, ``base``,
``lock``, ``push``, ``pull``, ``k8s render``.
Errors from any stage are :class:`EnvbuildError` values printed as one line each (no traceback)
with the exit code of the shared table (``builder/core/errors.py``); usage errors exit 64, found
before anything is contacted (:func:`builder.cli.checks.check_args`); SIGINT/SIGTERM exit 130
after cleanup; an unexpected exception (a bug) exits 70 with its traceback, every line escaped.
``certify`` and ``make`` run the ranks where ``--launcher`` says: local Docker containers
(default), one Slurm batch job (:mod:`builder.launchers.slurm`) or a Kubernetes Indexed Job.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Callable
from types import FrameType

from builder.cli.checks import UsageError, check_args
from builder.cli.output import say
from builder.cli.parser import build_parser
from builder.core.errors import EnvbuildError, ExitCode
from builder.core.inputs import escape, one_line

#: What each command runs: ``command [sub-command]`` -> (module of :mod:`builder.cli.commands`,
#: function). The module is imported when its command runs, not before.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("recipe", "cmd_check"),
    "audit": ("recipe", "cmd_audit"),
    "render": ("recipe", "cmd_render"),
    "lock": ("recipe", "cmd_lock"),
    "build": ("image", "cmd_build"),
    "base bootstrap": ("image", "cmd_base"),
    "certify": ("certify", "cmd_certify"),
    "make": ("certify", "cmd_make"),
    "report": ("certify", "cmd_report"),
    "k8s render": ("certify", "cmd_k8s_render"),
    "probe": ("nodes", "cmd_probe"),
    "verify": ("nodes", "cmd_verify"),
    "doctor": ("nodes", "cmd_doctor"),
    "push": ("publish", "cmd_push"),
    "pull": ("publish", "cmd_pull"),
}


def command_of(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The ``cmd_*`` function of the parsed ``args`` (:data:`COMMANDS`), its module imported now."""
    sub = getattr(args, "base_command", None) or getattr(args, "k8s_command", None)
    module, function = COMMANDS[f"{args.command} {sub}" if sub else args.command]
    run: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"builder.cli.commands.{module}"), function)
    return run


def _is_service_error(exc: Exception) -> bool:
    """Errors from the Docker engine (docker SDK) or an HTTP service (requests)."""
    import docker.errors
    import requests

    return isinstance(exc, (docker.errors.DockerException, requests.RequestException))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _os_error_line(exc: OSError) -> str:
    """``error: FILE: reason`` of an OSError, the file names escaped."""
    names = [escape(n, 300) for n in (getattr(exc, "filename", None), getattr(exc, "filename2", None)) if n]
    where = "".join(f"{n}: " for n in names)
    return f"error: {where}{one_line(exc.strerror or exc, 300)}"


def _internal_error(exc: Exception) -> int:
    """An exception no stage expected (a bug): its traceback with every line escaped, then
    one ``error:`` line; exit :attr:`ExitCode.INTERNAL_ERROR` (70)."""
    import traceback

    for line in traceback.format_exception(type(exc), exc, exc.__traceback__):
        for part in line.rstrip("\n").split("\n"):
            say(escape(part, 1000))
    say(f"error: internal error (a bug in envbuild; please report it with the lines above): "
        f"{exc.__class__.__name__}: {one_line(str(exc))}")
    return ExitCode.INTERNAL_ERROR


def _run(argv: list[str] | None) -> int:
    """Parse, check the arguments (:func:`~builder.cli.checks.check_args`), run the command;
    every error becomes escaped ``error:`` lines on stderr and an exit code."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help: argparse printed it and exits by itself
            return exc.code if isinstance(exc.code, int) else ExitCode.OK
        check_args(args)
        return command_of(args)(args)
    except UsageError as exc:
        say(escape(str(exc), 600))
        return ExitCode.USAGE
    except EnvbuildError as exc:
        for line in str(exc).splitlines():
            say(f"error: {escape(line, 1000)}")
        return exc.exit_code
    except KeyboardInterrupt as exc:
        say(f"interrupted ({escape(str(exc) or 'SIGINT', 40)}); everything envbuild started was removed")
        return ExitCode.INTERRUPTED
    except OSError as exc:  # a path the user gave cannot be read or written
        say(_os_error_line(exc))
        return ExitCode.UNREACHABLE
    except Exception as exc:  # noqa: BLE001 - the engine or a registry answered unexpectedly: exit 3
        if not _is_service_error(exc):
            return _internal_error(exc)
        say(f"error: {exc.__class__.__name__}: {one_line(str(exc))}")
        return ExitCode.UNREACHABLE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``envbuild`` console script. Returns (and, without ``argv``,
    exits with) the exit code: the table of ``builder/core/errors.py``; 130 interrupted
    (SIGINT/SIGTERM); 70 for an unexpected exception (:class:`~builder.core.errors.ExitCode`)."""
    signal.signal(signal.SIGTERM, _raise_interrupt)
    code = _run(argv)
    if argv is None:
        sys.exit(int(code))
    return int(code)


if __name__ == "__main__":  # pragma: no cover
    main()
