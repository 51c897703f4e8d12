"""The ``--json`` documents of the commands whose stage has no document of its own (audit, lock,
verify and gate print theirs); every finding is the audit's :class:`~builder.audit.model.Finding`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from builder.audit.model import Finding
from builder.core.certificate import Certificate
from builder.core.errors import FailureClass, ManyErrors
from builder.core.model import Model
from builder.nodes.verify.result import NodeSummary

if TYPE_CHECKING:
    from builder.image.build import BuildResult
    from builder.recipe.spec import Spec


class Error(Model, frozen=True, tag_field="schema", tag="envbuild.error/1"):
    """The error that ended a run (its ``error:`` lines on stderr), ``exit_code`` the process's."""

    exit_code: int
    errors: tuple[Finding, ...]


class Stack(Model, frozen=True):
    torch: str
    python: str
    cuda: str | None
    nccl: str | None


class Check(Model, frozen=True, tag_field="schema", tag="envbuild.check/1"):
    """``ok``: no error (schema or rule); warnings and notes are findings too."""

    recipe: str
    file: str
    ok: bool
    findings: tuple[Finding, ...]
    stack: Stack | None


class Render(Model, frozen=True, tag_field="schema", tag="envbuild.render/1"):
    files: dict[str, Literal["written", "unchanged", "stale"]]


class Build(Model, frozen=True, tag_field="schema", tag="envbuild.build/1"):
    """``reused``: the tag existed and was checked again; ``probe_cached``: no container ran."""

    recipe: str
    tag: str
    image_id: str
    lock_hash: str
    base: str
    base_image_id: str
    reused: bool
    probe_cached: bool
    notes: tuple[str, ...]


class Certify(Model, frozen=True, tag_field="schema", tag="envbuild.certify/1"):
    """The run's certificate and the files beside it (``report``/``bisection``: None when not written)."""

    certificate_path: str
    report: str | None
    certificate: Certificate
    bisection: str | None = None


class Make(Model, frozen=True, tag_field="schema", tag="envbuild.make/1"):
    """``make``'s stages, each None when an earlier one failed."""

    check: Check
    render: Render | None = None
    build: Build | None = None
    certify: Certify | None = None


class Report(Model, frozen=True, tag_field="schema", tag="envbuild.report/1"):
    certificate: str
    report: str
    passed: bool


class DoctorCheck(Model, frozen=True):
    name: str
    status: Literal["pass", "skip", "warn", "fail", "unknown"]
    message: str
    fix: str | None
    details: tuple[str, ...]
    data: dict[str, Any]
    checked: bool
    cls: FailureClass | None
    next_step: str | None


class Doctor(Model, frozen=True, tag_field="schema", tag="envbuild.doctor/1"):
    exit_code: int
    nodes: tuple[NodeSummary, ...]
    checks: tuple[DoctorCheck, ...]


def _finding(e: BaseException, rule: str = "") -> Finding:
    """An error as a finding: its file, field, value and message (bounded as the schema says)."""
    from builder.core import errors
    from builder.core.inputs import show

    raw = getattr(e, "value", errors._UNSET)
    value = None if raw is errors._UNSET else raw if isinstance(raw, str) else show(raw)
    return Finding(level="error", rule=rule or type(e).__name__, file=(getattr(e, "file", None) or "")[:2000],
                   fields=(e.field[:300],) if getattr(e, "field", None) else (),  # type: ignore[attr-defined]
                   value=None if value is None else value[:1000],
                   message=str(getattr(e, "message", None) or e)[:2000])


def error_document(code: int, exc: BaseException) -> Error:
    return Error(exit_code=int(code),
                 errors=tuple(_finding(e) for e in (exc.errors if isinstance(exc, ManyErrors) else [exc])))


def check_document(spec: Spec) -> Check:
    errors = tuple(_finding(e, "schema") for e in spec.schema_errors)
    found = tuple(Finding(level=f.level, rule=f.rule, file=spec.path, message=f.message, source=f.source,  # type: ignore[arg-type]
                          fields=f.fields) for f in spec.findings)
    stack = None if spec.failed else Stack(torch=spec.torch_local, python=spec.recipe.python, cuda=spec.cuda,
                                           nccl=spec.nccl)
    return Check(recipe=spec.name, file=spec.path, ok=not spec.failed, findings=errors + found, stack=stack)


def build_document(recipe: str, r: BuildResult) -> Build:
    return Build(recipe=recipe, tag=r.tag, image_id=r.image_id, lock_hash=r.lock_hash, base=r.base_used,
                 base_image_id=r.base_image_id, reused=r.reused, probe_cached=r.probe_cached, notes=tuple(r.notes))


def schemas() -> dict[str, tuple[type[Any], str, str]]:
    """``{file stem: (model, $id, title)}`` of these documents and the gate's (``schemas/``)."""
    from builder.nodes.gate import GateResult
    from builder.publish.pull import Pull
    from builder.publish.push import Push

    models = {"error": Error, "check": Check, "render": Render, "build": Build, "certify": Certify, "make": Make,
              "report": Report, "doctor": Doctor, "gate": GateResult, "push": Push, "pull": Pull}
    return {stem: (m, f"https://envbuild.dev/schemas/{stem}.schema.json", f"envbuild.{stem}/1: the --json document")
            for stem, m in models.items()}
