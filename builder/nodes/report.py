"""Reading node reports: ``verify`` and ``doctor`` read them only through :func:`validate`, so a
report cut short, hand-edited or from an unknown probe is refused in one line (exit 3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from builder.core import inputs
from builder.core.documents import SUPPORTED_SCHEMAS, NodeReport, report_problem
from builder.core.errors import EnvbuildError, ExitCode, ManyErrors
from builder.core.model import convert

if TYPE_CHECKING:
    from .sources.base import Target

#: Largest node report read, in bytes (a file or a process's output).
MAX_REPORT_BYTES = inputs.MAX_REPORT_BYTES


class InvalidReport(EnvbuildError):
    """A node report that cannot be read or does not follow its schema (exit 3)."""

    def __init__(self, message: str, **kw: Any) -> None:
        kw.setdefault("exit_code", ExitCode.UNREACHABLE)
        super().__init__(message, **kw)

    @classmethod
    def first(cls, e: ManyErrors) -> InvalidReport:
        """The first violation of ``e`` (from :func:`builder.core.model.convert`)."""
        first = e.errors[0]
        return cls(first.message, file=first.file, field=first.field, value=first.value)


# --------------------------------------------------------------------------- reading


def validate(doc: Any, source: str | None = None) -> NodeReport:
    """``doc`` as a :class:`NodeReport`, ``source`` first in errors; InvalidReport (exit 3), one line."""
    if not isinstance(doc, dict):
        raise InvalidReport("is not a JSON object (a node report)", file=source, value=type(doc).__name__)
    schema = doc.get("schema")
    if schema not in SUPPORTED_SCHEMAS:
        raise InvalidReport(f"is not a node-report schema this envbuild reads ({', '.join(SUPPORTED_SCHEMAS)})",
                            file=source, field="schema", value=schema)
    try:
        report = convert(doc, NodeReport, file=source, exit_code=ExitCode.UNREACHABLE)
    except ManyErrors as e:
        raise InvalidReport.first(e) from None
    problem = report_problem(report)
    if problem is not None:
        field, value, message = problem
        raise InvalidReport(message, file=source, field=field, value=value)
    return report


def parse(text: str | bytes, source: str | None = None) -> NodeReport:
    """``text`` as a :class:`NodeReport` (msgspec; a refused text read again for the words); InvalidReport (exit 3)."""
    size = len(text) if isinstance(text, (bytes, bytearray)) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_REPORT_BYTES:
        raise InvalidReport(f"is {size} bytes, over the {MAX_REPORT_BYTES}-byte limit of a node report", file=source)
    try:
        report = msgspec.json.decode(text, type=NodeReport)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    else:
        if report_problem(report) is None:
            return report
    try:
        doc = inputs.load_json(text, source or "node report", exit_code=ExitCode.UNREACHABLE)
    except EnvbuildError as e:
        raise InvalidReport(e.message, file=source) from None
    return validate(doc, source)


def load_file(path: str | Path) -> NodeReport:
    """Read and validate the report in ``path`` (FIFO, device, folder refused at once); InvalidReport (3)."""
    try:
        data = inputs.read_regular(path, MAX_REPORT_BYTES, "node report")
    except EnvbuildError as e:
        raise InvalidReport(e.message, file=str(path)) from None
    return parse(data, str(path))


# --------------------------------------------------------------------------- nodes


@dataclass
class Node:
    """One node as ``verify``/``doctor`` see it."""

    name: str
    source: str
    report: NodeReport | None = None
    error: EnvbuildError | None = None
    address: str | None = None
    target: Target | None = None

    @property
    def ok(self) -> bool:
        return self.report is not None and self.error is None
