"""``envbuild audit``: parse each file, extract its stack, judge it, and give each file a verdict. Exit codes
(shared/design.md): clean 0, warnings 1, errors 2, malformed or unreadable 3; the worst of several files."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from builder.core.errors import EnvbuildError, ExitCode
from builder.recipe.spec import Spec

from . import definition, dockerfile, judge, model, rules
from .extract import extract
from .follow import follow
from .parsed import Malformed
from .pins import Pins, pins

_DEF_NAME = re.compile(r"(?i)(?:.*\.def|singularity(?:\..*)?|apptainer(?:\..*)?|.*\.sdef)")
_LEVELS = {"error": 0, "warning": 1, "note": 2}
#: Names of the files a build reads, not a build file itself (a Dockerfile that pip installs one names it).
_NOT_BUILD = re.compile(r"(?i).*\.(?:txt|in|ya?ml|toml|cfg|json|lock|py|sh)|environment|requirements")


@dataclass
class Audited:
    """One file's audit, and when it parsed its ``pins`` and the resolved ``spec`` (for ``--to-recipe``)."""

    result: model.FileAudit
    pins: Pins | None = None
    spec: Spec | None = None


def kind_of(path: str) -> model.FileKind:
    """``definition`` for ``*.def``, ``Singularity``, ``Apptainer`` (and suffixed), else ``dockerfile``."""
    return "definition" if _DEF_NAME.fullmatch(posixpath.basename(str(path))) else "dockerfile"


def _verdict(findings: list[model.Finding]) -> tuple[model.Verdict, int]:
    levels = {f.level for f in findings}
    if any(f.rule == "nothing-judged" for f in findings):
        return "unjudged", int(ExitCode.UNREACHABLE)
    if "error" in levels:
        return "errors", int(ExitCode.CHECK_FAILED)
    if "warning" in levels:
        return "warnings", int(ExitCode.WARNINGS)
    return "clean", int(ExitCode.OK)


def stack_model(p: Pins, spec: Spec | None = None) -> model.Stack:
    """The :class:`~.model.Stack` of ``p`` (what ``--json`` shows); NCCL pinned, else the torch wheel's (``spec``)."""
    st, b, t = p.stack, p.stack.base, p.torch
    base = model.Base(image=model.cut(b.image), line=st.base_item.line, kind=b.kind, cuda=b.cuda, flavour=b.flavour,
                      os_id=b.os_id, os_version=b.os_version, python=b.python, torch=b.torch)
    torch = None
    if t is not None:
        torch = model.Torch(requirement=model.cut(t.item.value), line=t.item.line, installer=t.installer,
                            version=t.version, variant=t.variant, variant_from=model.cut(t.variant_from) or None,
                            index=model.cut(t.index.url.value) if t.index else None)
    packages = [model.Package(manager=tool, spec=model.cut(str(req)), line=item.line) for item, req, tool in p.pip]
    packages += [model.Package(manager="apt", spec=model.cut(a.item.value), line=a.item.line) for a in st.apt]
    packages += [model.Package(manager="conda", spec=model.cut(it.value), line=it.line)
                 for c in st.conda for it, *_rest in c.specs]
    env = [model.EnvVar(name=e.name[:300], value=model.cut(e.value), line=e.line) for e in st.env]
    return model.Stack(base=base, os=" ".join(p.os) if p.os else None, python=p.python.value if p.python else None,
                       python_from=p.python_from, cuda=b.cuda, torch=torch,
                       nccl=p.nccl[1] if p.nccl else spec.nccl if spec and t and t.release and t.installer != "base"
                       else None,
                       cudnn=p.cudnn[1] if p.cudnn else None, packages=tuple(packages), env=tuple(env))


def audit_file(path: str, *, driver: str | None = None, build_args: dict[str, str] | None = None,
               context: str | None = None) -> Audited:
    """The audit of the file at ``path``, build ``context`` by default its folder; never raises (its verdict says)."""
    kind = kind_of(path)
    if _NOT_BUILD.fullmatch(posixpath.basename(str(path))):
        line = model.Finding(level="error", rule="not-a-build-file", file=path, message="not a Dockerfile or Apptainer "
                             "definition by its name: audit the Dockerfile or definition that installs from it")
        return Audited(model.FileAudit(file=path, kind=kind, verdict="unreadable", exit_code=3, findings=(line,)))
    parser = definition if kind == "definition" else dockerfile
    try:
        parsed = parser.parse(path, build_args)
    except Malformed as e:
        line = model.Finding(level="error", rule="malformed", file=path, line=e.line,
                             message=e.message.split(": ", 1)[1])
        return Audited(model.FileAudit(file=path, kind=kind, verdict="malformed", exit_code=3, findings=(line,)))
    except EnvbuildError as e:  # unreadable: missing, a FIFO, a directory, too large
        line = model.Finding(level="error", rule="unreadable", file=path, message=e.message)
        return Audited(model.FileAudit(file=path, kind=kind, verdict="unreadable", exit_code=3, findings=(line,)))
    stack = extract(parsed)
    follow(parsed, stack, context if context is not None else posixpath.dirname(path) or ".")
    p = pins(stack)
    found, spec = judge.judge(p, driver)
    found += rules.audit(p) + rules.base_driver(p, driver)
    found.sort(key=lambda f: (f.line or 0, _LEVELS[f.level]))
    verdict, code = _verdict(found)
    result = model.FileAudit(file=path, kind=kind, verdict=verdict, exit_code=code, findings=tuple(found),
                             stack=stack_model(p, spec))
    return Audited(result, p, spec)


def audit(paths: list[str], *, driver: str | None = None, build_args: dict[str, str] | None = None,
          context: str | None = None) -> tuple[model.Report, list[Audited]]:
    """Audit every file of ``paths``: the :class:`~.model.Report` (exit code the worst)."""
    done = [audit_file(p, driver=driver, build_args=build_args, context=context) for p in paths]
    worst = max((a.result.exit_code for a in done), default=0)
    return model.Report(exit_code=worst, files=tuple(a.result for a in done)), done


def summary(result: model.FileAudit) -> str:
    """One escaped line on what ``result`` found (``FILE: ok: torch 2.8.0+cu128 (pip) on ...``)."""
    from builder.core import inputs

    counts = [(sum(f.level == lv for f in result.findings), lv) for lv in ("error", "warning")]
    said = ", ".join(f"{n} {lv}{'s' if n != 1 else ''}" for n, lv in counts if n) or "ok"
    st = result.stack
    if st is None:
        return f"{inputs.escape(result.file, 200)}: {said}"
    t = st.torch
    what = "" if t is None else f"torch {t.version}+{t.variant}" if t.version and t.variant else \
        f"torch {t.version}" if t.version else t.requirement
    torch = f"{what} ({t.installer})" if t is not None else "no torch"
    facts = [st.os or "OS unknown", f"python {st.python}" if st.python else "Python unknown",
             f"cuda {st.cuda or 'none'}"]
    line = f"{result.file}: {said}: {torch} on {st.base.image or 'a base image it cannot name'} ({', '.join(facts)})"
    return inputs.one_line(line, 600)
