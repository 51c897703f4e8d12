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


class TreeEntry(Model, frozen=True):
    """One side of a differing path: its hashed entry (``<kind> <mode> <uid>:<gid> <sha256 | -> target | ->``), the
    size in bytes and sha256 of a regular file."""

    entry: str
    size: int | None
    sha256: str | None


class FileDifference(Model, frozen=True):
    """``image``/``rebuilt``: None where the path is absent."""

    path: str
    image: TreeEntry | None
    rebuilt: TreeEntry | None


class Tree(Model, frozen=True):
    """An image's installed files: the tree hash, its entries and, per excluded pattern, the entries left out."""

    sha256: str
    entries: int
    excluded: dict[str, int]


class Comparison(Model, frozen=True):
    """The rebuilt image against ``image`` (``source``: --against, the newest certified one, the current build of the
    lock); ``differing``: paths that differ, the first listed; ``layers_equal``: layer diffIDs equal, of ``layers``."""

    image: str
    source: Literal["given", "certified", "current"]
    equal: bool
    method: str
    exclusions: tuple[str, ...]
    image_tree: Tree
    rebuilt_tree: Tree
    differing: int
    differences: tuple[FileDifference, ...]
    layers: int
    layers_equal: int


class Rebuild(Model, frozen=True, tag_field="schema", tag="envbuild.rebuild/1"):
    """``tag``: None once the rebuilt image is removed (compared, no --keep)."""

    recipe: str
    image_id: str
    tag: str | None
    comparison: Comparison | None


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


def rebuild_document(recipe: str, image_id: str, tag: str | None, c: Any, source: Any) -> Rebuild:
    """``c``: the :class:`builder.image.rebuild.Comparison` of the rebuilt image, or None."""
    if c is None:
        return Rebuild(recipe=recipe, image_id=image_id, tag=tag, comparison=None)
    from builder.image import fshash

    def side(entry: str | None, file: tuple[int, str] | None) -> TreeEntry | None:
        return None if entry is None else TreeEntry(entry=entry, size=file and file[0], sha256=file and file[1])

    trees = [Tree(sha256=t.sha256, entries=t.entries, excluded=t.excluded_by) for t in c.trees]
    diffs = tuple(FileDifference(path=d.path, image=side(d.a, d.file_a), rebuilt=side(d.b, d.file_b))
                  for d in c.differences)
    return Rebuild(recipe=recipe, image_id=image_id, tag=tag, comparison=Comparison(
        image=c.image, source=source, equal=c.equal, method=fshash.METHOD, exclusions=fshash.EXCLUDED,
        image_tree=trees[0], rebuilt_tree=trees[1], differing=c.differing, differences=diffs, layers=c.layers,
        layers_equal=c.layers_equal))


def schemas() -> dict[str, tuple[type[Any], str, str]]:
    """``{file stem: (model, $id, title)}`` of these documents and the gate's (``schemas/``)."""
    from builder.nodes.gate import GateResult
    from builder.publish.pull import Pull
    from builder.publish.push import Push

    models = {"error": Error, "check": Check, "render": Render, "build": Build, "certify": Certify, "make": Make,
              "report": Report, "doctor": Doctor, "gate": GateResult, "push": Push, "pull": Pull,
              "rebuild": Rebuild}
    return {stem: (m, f"https://envbuild.dev/schemas/{stem}.schema.json", f"envbuild.{stem}/1: the --json document")
            for stem, m in models.items()}
