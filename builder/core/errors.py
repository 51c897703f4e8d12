"""The one exception type of envbuild and the exit-code table shared by every command."""

from __future__ import annotations

from enum import IntEnum, StrEnum


class ExitCode(IntEnum):
    """Exit codes of every ``envbuild`` command."""

    OK = 0
    WARNINGS = 1
    CHECK_FAILED = 2
    UNREACHABLE = 3
    USAGE = 64
    #: An unexpected exception (a bug in envbuild): ``EX_SOFTWARE`` of sysexits.h, as 64 is its
    #: ``EX_USAGE``; never 1, which means "done with warnings only".
    INTERNAL_ERROR = 70
    #: SIGINT/SIGTERM: 128 + SIGINT, as a shell reports a command it interrupted.
    INTERRUPTED = 130


class FailureClass(StrEnum):
    """What kind of failure a failing check is (NVIDIA Health Validation's verdict classes): the GPU or board,
    a value past a tunable threshold, the job that ran, the fabric, or the software of the image or node."""

    HARDWARE = "hardware"
    THRESHOLD = "threshold"
    WORKLOAD = "workload"
    NETWORK = "network"
    IMAGE = "image"


#: The one table of what an operator does next about a failing check, by step name; a class's value names the
#: step of a failing check of that class that names none of its own.
NEXT_STEPS = {
    "reset": "drain the node and reset the GPU (nvidia-smi -r -i INDEX with no process on it)",
    "reboot": "drain the node and reboot it",
    "reseat": "drain the node; reseat or replace the GPU, cable or riser",
    "hardware": "drain the node and open a vendor case (attach nvidia-bug-report.sh output)",
    "image": "fix the image (or the node image) and run again",
    "persistence": "fix the node image: enable nvidia-persistenced",
    "fabric": "fix the node image: start nvidia-fabricmanager (its version must match the driver), then reset the GPUs",
    "cooling": "drain the node and check its cooling (fans, airflow, inlet temperature)",
    "power": "drain the node and check its power supplies",
    "workload": "look at the job that ran (an application fault); the GPU stays usable",
    "lookup": "look the XID up in NVIDIA's catalogue (docs.nvidia.com/deploy/xid-errors)",
    "cable": "drain the node; check the port's cable, transceiver and switch port",
    "network": "fix the network config (the interface NCCL/gloo use, its MTU, the firewall between the nodes)",
    "threshold": "raise the threshold if the value is expected (--gpu-thresholds, the recipe's certify floors)",
}


def next_step(cls: FailureClass, step: str | None = None) -> str:
    """The text of ``step`` (a :data:`NEXT_STEPS` key), or of ``cls``'s default step."""
    return NEXT_STEPS[step or str(cls)]


def with_step(line: str, cls: FailureClass | None, step: str | None) -> str:
    """``line`` ending in its class and next step, once (a line that names its step already stays)."""
    if cls is None or step is None or f"next: {step}" in line:
        return line
    return f"{line} [{cls}] next: {step}"


_UNSET = object()


class EnvbuildError(Exception):
    """An error the CLI turns into one line and an exit code (no traceback)."""

    CODE = ExitCode.CHECK_FAILED

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None, value: object = _UNSET,
                 exit_code: ExitCode | None = None) -> None:
        self.message = message
        self.file = file
        self.field = field
        self.value = value
        self.exit_code = ExitCode(self.CODE if exit_code is None else exit_code)
        super().__init__(str(self))

    def __str__(self) -> str:
        from .inputs import escape, one_line, show

        parts = []
        if self.file:
            parts.append(f"{escape(self.file, 200)}: ")
        if self.field:
            parts.append(f"{escape(self.field, 200)}: ")
        if self.value is not _UNSET:
            parts.append(f"{show(self.value)} ")
        parts.append(one_line(self.message, limit=400))
        return "".join(parts)


class CheckFailed(EnvbuildError):
    """A check failed (exit 2)."""


class Unreachable(EnvbuildError):
    """Something needed could not be reached or timed out (exit 3)."""

    CODE = ExitCode.UNREACHABLE


class UsageError(EnvbuildError):
    """A usage error: an option or value of the command line (exit 64)."""

    CODE = ExitCode.USAGE


class NoSuchImage(Unreachable):
    """The image ``ref`` is not on the engine: could not check (exit 3), as a missing recipe."""

    def __init__(self, ref: str) -> None:
        super().__init__("no such image", field="image", value=ref)


class ManyErrors(EnvbuildError):
    """Several errors found at once (every invalid field of a recipe): one line each, the highest exit code."""

    def __init__(self, errors: list[EnvbuildError]) -> None:
        self.errors = list(errors)
        code = max((e.exit_code for e in self.errors), default=ExitCode.CHECK_FAILED)
        super().__init__("several errors", exit_code=code)

    #: Errors shown at most; the rest are counted in one last line.
    SHOWN = 50

    def __str__(self) -> str:
        lines = [str(e) for e in self.errors[: self.SHOWN]]
        if len(self.errors) > self.SHOWN:
            lines.append(f"... and {len(self.errors) - self.SHOWN} more errors")
        return "\n".join(lines)
