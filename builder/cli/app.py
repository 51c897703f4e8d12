"""The ``envbuild`` command: parse (:mod:`builder.cli.parser`), check the arguments
(:mod:`builder.cli.checks`), run the command (:data:`COMMANDS`, :mod:`builder.cli.commands`).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Callable
from types import FrameType

from builder.cli import output
from builder.cli.checks import check_args
from builder.cli.output import say
from builder.cli.parser import build_parser
from builder.core import retention
from builder.core.errors import EnvbuildError, ExitCode, UsageError
from builder.core.inputs import escape, one_line

#: What each command runs: ``command [sub-command]`` -> (module of :mod:`builder.cli.commands`,
#: function). The module is imported when its command runs, not before.
COMMANDS: dict[str, tuple[str, str]] = {"check": ("recipe", "cmd_check"), "audit": ("recipe", "cmd_audit"),
                                        "render": ("recipe", "cmd_render"), "lock": ("recipe", "cmd_lock"),
                                        "build": ("image", "cmd_build"), "rebuild": ("image", "cmd_rebuild"),
                                        "base bootstrap": ("image", "cmd_base"),
                                        "certify": ("certify", "cmd_certify"), "make": ("certify", "cmd_make"),
                                        "report": ("certify", "cmd_report"),
                                        "k8s render": ("certify", "cmd_k8s_render"),
                                        "k8s gate": ("gate", "cmd_k8s_gate"), "probe": ("nodes", "cmd_probe"),
                                        "verify": ("nodes", "cmd_verify"), "doctor": ("nodes", "cmd_doctor"),
                                        "gate": ("gate", "cmd_gate"), "push": ("publish", "cmd_push"),
                                        "pull": ("publish", "cmd_pull"), "config": ("publish", "cmd_config"),
                                        "completion": ("publish", "cmd_completion")}


def command_of(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    """The ``cmd_*`` function of the parsed ``args`` (:data:`COMMANDS`), its module imported now."""
    sub = getattr(args, "base_command", None) or getattr(args, "k8s_command", None)
    module, function = COMMANDS[f"{args.command} {sub}" if sub else args.command]
    run: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"builder.cli.commands.{module}"), function)
    return run


def _is_service_error(exc: Exception) -> bool:
    """Errors from an HTTP service (requests; the engine's are envbuild's already)."""
    import requests

    return isinstance(exc, requests.RequestException)


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


def _parse(argv: list[str]) -> argparse.Namespace:
    """The command line with the site settings (:mod:`builder.cli.config`) before the user's flags."""
    from builder.cli import config

    full, used = config.with_settings(argv, {c.split()[0] for c in COMMANDS})
    try:
        return build_parser().parse_args(full)
    except UsageError as exc:
        if not used:
            raise
        build_parser().parse_args(argv)  # the user's own error first
        raise UsageError(f"{exc} (a site setting of {', '.join(sorted(set(used)))}; envbuild config)") from None


def _run(argv: list[str] | None) -> int:
    """Parse, check the arguments (:func:`~builder.cli.checks.check_args`), run the command;
    every error becomes escaped ``error:`` lines on stderr and an exit code; a run that printed
    a warning line and failed nothing exits 1 (:func:`builder.cli.output.exit_code`)."""
    output.warned[0] = 0
    argv = sys.argv[1:] if argv is None else list(argv)
    output.set_mode("auto", False, "--json" in argv)  # a command line refused as a whole: its document too
    try:
        try:
            args = _parse(argv)
        except SystemExit as exc:  # --help: argparse printed it and exits by itself
            return exc.code if isinstance(exc.code, int) else ExitCode.OK
        output.set_mode(args.progress, args.verbose, getattr(args, "json", False))
        check_args(args)
        for kind in retention.RETENTION:  # exit 64 before anything starts
            retention.limits(kind)
        return output.exit_code(command_of(args)(args))
    except UsageError as exc:
        if exc.file or exc.field:
            say(f"error: {escape(str(exc), 1000)}")
        else:  # the command line's own message, which names the command, printed as argparse does
            say(escape(str(exc), 600))
        return _failed(ExitCode.USAGE, exc)
    except EnvbuildError as exc:
        for line in str(exc).splitlines():
            say(f"error: {escape(line, 1000)}")
        return _failed(exc.exit_code, exc)
    except KeyboardInterrupt as exc:
        say(f"interrupted ({escape(str(exc) or 'SIGINT', 40)}); everything envbuild started was removed")
        return _failed(ExitCode.INTERRUPTED, exc)
    except OSError as exc:  # a path the user gave cannot be read or written
        say(_os_error_line(exc))
        return _failed(ExitCode.UNREACHABLE, exc)
    except Exception as exc:  # noqa: BLE001 - the engine or a registry answered unexpectedly: exit 3
        if not _is_service_error(exc):
            return _failed(_internal_error(exc), exc)
        say(f"error: {exc.__class__.__name__}: {one_line(str(exc))}")
        return _failed(ExitCode.UNREACHABLE, exc)


def _failed(code: int, exc: BaseException) -> int:
    """``code``; with ``--json``, the ``envbuild.error/1`` document of ``exc`` printed."""
    if output.mode[2] is True:
        from builder.cli.documents import error_document

        output.emit(error_document(code, exc))
    return code


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
