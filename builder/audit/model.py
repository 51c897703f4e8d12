"""The audit's typed result (``envbuild audit --json``), schema ``schemas/audit.schema.json``."""

from __future__ import annotations

from typing import Annotated, Final, Literal, overload

from msgspec import Meta

from builder.core import inputs
from builder.core.model import Model, json_schema

SCHEMA: Final = "envbuild.audit/1"
SCHEMA_ID = "https://envbuild.dev/schemas/audit.schema.json"
Level = Literal["error", "warning", "note"]
Verdict = Literal["clean", "warnings", "errors", "malformed", "unreadable", "unjudged"]
FileKind = Literal["dockerfile", "definition"]
PipTool = Literal["pip", "uv"]
Installer = Literal["pip", "uv", "conda", "base"]
Manager = Literal["pip", "uv", "conda", "apt"]
#: Longest value kept in a finding (characters); the text line shows at most ~200.
MAX_VALUE = 1000
Text = Annotated[str, Meta(max_length=2000)]
Value = Annotated[str, Meta(max_length=MAX_VALUE)]
Line = Annotated[int, Meta(ge=1, le=10_000_000)]
Name = Annotated[str, Meta(max_length=300)]


class Finding(Model, kw_only=True, frozen=True):
    """One finding: a recipe or audit ``rule`` id, the ``value`` as the file has it (expanded), its ``source``."""

    level: Level
    rule: Name
    file: Text
    line: Line | None = None
    value: Value | None = None
    via: Text | None = None
    message: Text
    source: Text = ""
    fields: tuple[Name, ...] = ()

    def text(self) -> str:
        """``FILE: line N: 'value' (via): message [source]``: one escaped line."""
        where = f"{inputs.escape(self.file, 200)}: " + (f"line {self.line}: " if self.line else "")
        value = f"{inputs.show(self.value, 120)}" if self.value is not None else ""
        via = f" ({inputs.one_line(self.via, 120)})" if self.via else ""
        head = f"{value}{via}: " if value or via else ""
        source = f" [{inputs.one_line(self.source, 120)}]" if self.source else ""
        return f"{where}{head}{inputs.one_line(self.message, 600)}{source}"


class Base(Model, kw_only=True, frozen=True):
    """The base image of the final image and what its name says (None: not said)."""

    image: Value | None
    line: Line
    kind: Name
    cuda: Name | None = None
    flavour: Name | None = None
    os_id: Name | None = None
    os_version: Name | None = None
    python: Name | None = None
    torch: Name | None = None


class Torch(Model, kw_only=True, frozen=True):
    """The torch the image gets: ``version`` None when not pinned to one release."""

    requirement: Value
    line: Line
    installer: Installer
    version: Name | None = None
    variant: Name | None = None
    variant_from: Text | None = None
    index: Value | None = None


class Package(Model, kw_only=True, frozen=True):
    """An installed package beside torch: its ``manager`` and ``spec`` (``numpy==2.1.0``)."""

    manager: Manager
    spec: Value
    line: Line


class EnvVar(Model, kw_only=True, frozen=True):
    """An environment variable of the image; value None when it cannot be expanded."""

    name: Name
    value: Value | None
    line: Line


class Stack(Model, kw_only=True, frozen=True):
    """What the file builds."""

    base: Base
    os: Name | None = None
    python: Name | None = None
    python_from: Name | None = None
    cuda: Name | None = None
    torch: Torch | None = None
    nccl: Name | None = None
    cudnn: Name | None = None
    packages: tuple[Package, ...] = ()
    env: tuple[EnvVar, ...] = ()


class FileAudit(Model, kw_only=True, frozen=True):
    """The audit of one file; ``exit_code`` 0 clean, 1 warnings, 2 errors, 3 malformed, unreadable or unjudged (a torch
    outside the facts and nothing else of the stack known)."""

    file: Text
    kind: FileKind
    verdict: Verdict
    exit_code: Annotated[int, Meta(ge=0, le=3)]
    findings: tuple[Finding, ...] = ()
    stack: Stack | None = None


class Report(Model, kw_only=True, frozen=True):
    """``envbuild audit --json``: every file's audit; ``exit_code`` the worst of them."""

    schema: Literal["envbuild.audit/1"] = SCHEMA
    exit_code: Annotated[int, Meta(ge=0, le=3)]
    files: tuple[FileAudit, ...]


def schema() -> dict:
    """The JSON Schema of :class:`Report` (``schemas/audit.schema.json``)."""
    return json_schema(Report, SCHEMA_ID, "envbuild audit report")


@overload
def cut(value: str) -> str: ...
@overload
def cut(value: None) -> None: ...


def cut(value: str | None) -> str | None:
    """``value`` cut to :data:`MAX_VALUE` characters (None stays None)."""
    return value if value is None or len(value) <= MAX_VALUE else value[: MAX_VALUE - 3] + "..."
