"""``envbuild audit FILE --to-recipe OUT.yaml``: the recipe of the same stack, the envbuild way. An ``nvidia/cuda`` base
becomes its ``base`` flavour (the others ship a second NCCL [compat.md §4]); what a recipe does not carry over is named
in a comment, by line. Refused (exit 2, nothing written) when the file has errors or the stack lacks what a recipe
requires."""

from __future__ import annotations

from pathlib import Path

import yaml
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core import inputs
from builder.core.errors import EnvbuildError
from builder.core.files import write_atomic
from builder.recipe.facts import facts
from builder.recipe.rules.release import RECIPE_FLOOR

from . import judge
from .pins import ENVBUILD_APT, Pins, variant_cuda
from .run import Audited

#: pip packages envbuild's venv brings itself.
ENVBUILD_PIP = frozenset({"pip", "setuptools", "wheel"})
_FROM = {"interpreter": "the pip interpreter", "conda": "conda", "base": "the base image"}
#: Most comment lines of things not carried over; the rest are counted.
MAX_COMMENTS = 200


def _c(line: int | None, what: str, why: str) -> tuple[int, str]:
    where = f"line {line}: " if line else ""
    return line or 0, f"{where}{inputs.one_line(what, 160)}: {inputs.one_line(why, 200)}"


def _base(p: Pins, comments: list[tuple[int, str]]) -> str:
    b, item = p.stack.base, p.stack.base_item
    if b.kind == "nvidia-cuda" and b.flavour and b.flavour != "base" and b.tag and b.repo:
        tag = b.tag.replace(f"-{b.flavour}-", "-base-", 1)
        comments.append(_c(item.line, b.image or "", f"the {b.flavour} flavour is not carried over: the recipe uses "
                           "the base flavour (runtime and devel ship a system libnccl2, a second NCCL; envbuild "
                           "installs what the image needs)"))
        return f"{b.repo}:{tag}"
    if b.kind == "python":
        codename = {"11": "bullseye", "12": "bookworm", "13": "trixie"}.get(b.os_version or "", "bookworm")
        comments.append(_c(item.line, b.image or "", f"the python image becomes debian {codename}-slim: envbuild "
                           f"installs its system Python {b.python} in a venv"))
        return f"debian:{codename}-slim"
    return b.image or ""


def _packages(p: Pins, comments: list[tuple[int, str]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The apt and pip packages with their lines (what envbuild installs itself left out)."""
    apt: list[tuple[str, int]] = []
    for a in p.stack.apt:
        spec = f"{a.name}={a.version}" if a.version else a.name
        if a.name in ENVBUILD_APT:
            comments.append(_c(a.item.line, spec, "installed by envbuild itself"))
        elif spec not in [x for x, _l in apt]:
            apt.append((spec, a.item.line))
    pip: list[tuple[str, int]] = []
    for item, req, _tool in p.pip:
        if canonicalize_name(req.name) in ENVBUILD_PIP:
            comments.append(_c(item.line, str(req), "envbuild's venv brings it"))
        else:
            pip.append((str(req), item.line))
    return apt, pip


def _fit(data: dict, where: dict[str, tuple[str, int]], comments: list[tuple[int, str]]) -> dict:
    """``data`` without what the recipe schema refuses, each named in a comment with the schema's reason."""
    spec = judge.check_data(data, "recipe")
    drop = {e.field: e.message for e in spec.schema_errors if e.field in where}
    comments += [_c(where[f][1], where[f][0], f"not carried over: {why}") for f, why in drop.items()]
    apt = [x for i, x in enumerate(data.get("packages", {}).get("apt", [])) if f"packages.apt[{i}]" not in drop]
    pip = [x for i, x in enumerate(data.get("packages", {}).get("pip", [])) if f"packages.pip[{i}]" not in drop]
    env = {k: v for k, v in data.get("env", {}).items() if f"env.{k}" not in drop}
    data = {k: v for k, v in data.items() if k not in ("packages", "env")}
    if apt or pip:
        data["packages"] = {k: v for k, v in (("apt", apt), ("pip", pip)) if v}
    if env:
        data["env"] = env
    return data


def _leftovers(p: Pins, comments: list[tuple[int, str]]) -> None:
    t = p.torch
    if t and t.installer == "conda":
        comments.append(_c(t.item.line, t.item.value,
                           f"conda's pytorch becomes the wheel torch {t.version}+{t.variant}"))
    if t and t.index is not None:
        comments.append(_c(t.index.url.line, t.index.url.value,
                           "the recipe reads torch from the variant's PyTorch index (derived)"))
    comments += [_c(pin[0].line, pin[0].value, f"the {key} torch pins is resolved by envbuild from the facts")
                 for key, pin in (("NCCL", p.nccl), ("cuDNN", p.cudnn)) if pin]
    root = p.stack.stages[-1]
    comments += [_c(st.line, st.base.word.text or st.base.word.raw,
                    "the base of a build stage: envbuild builds every stage on the recipe's base")
                 for st in p.stack.stages
                 if st.parent is None and st is not root and st.base.word.text != p.stack.base.image]
    comments += [_c(f.line, f"-r {f.value}", "a requirements file: not followed") for pip in p.stack.pip
                 for f in pip.files]
    comments += [_c(it.line, it.value, "a conda package: not carried over") for conda in p.stack.conda
                 for it, name, *_r in conda.specs if name != "pytorch"]
    comments += [_c(item.line, item.value, "not a requirement a recipe holds") for item in p.others]
    comments += [_c(item.line, item.value, "a command: not carried over") for item in p.stack.skipped]
    comments += [_c(line, what, "not carried over") for line, what in p.stack.others]


def recipe_text(p: Pins, out: str, driver: str | None) -> tuple[str, dict]:
    """The recipe YAML (comments first) of ``p`` and its data; EnvbuildError (exit 2)."""
    t, os_ = p.torch, p.os
    if t and t.release and Version(t.release) < RECIPE_FLOOR:
        raise EnvbuildError(f"cannot write a recipe: recipes start at torch {RECIPE_FLOOR} and "
                            f"{inputs.escape(p.stack.file, 200)} installs torch {t.release} (audit judges it)",
                            file=out)
    missing = [what for what, ok in (("the OS of the base image", os_), ("a torch release", t and t.release),
                                     ("the torch build (its variant)", t and t.variant)) if not ok]
    if missing or t is None or os_ is None:  # (t and os_ are set when nothing is missing: for mypy)
        raise EnvbuildError(f"cannot write a recipe: {inputs.escape(p.stack.file, 200)} does not say "
                            f"{' and '.join(missing)}", file=out)
    python = facts().os[os_[0]][os_[1]].python
    if p.python and p.python.value != python:
        raise EnvbuildError(f"cannot write a recipe: {inputs.escape(p.stack.file, 200)} runs Python {p.python.value} "
                            f"(from {_FROM.get(p.python_from or '', 'the install')}) and a recipe on {' '.join(os_)} "
                            f"gets its system Python {python}", file=out)
    comments: list[tuple[int, str]] = []
    base = _base(p, comments)
    apt, pip = _packages(p, comments)
    _leftovers(p, comments)
    vcuda = variant_cuda(t.variant)
    data: dict = {"description": f"from {inputs.escape(Path(p.stack.file).name, 60)} by envbuild audit",
                  "base": {"image": base}, "os": {"id": os_[0], "version": os_[1]}, "python": python,
                  "cuda": ({"version": vcuda, **({"driver": driver} if driver else {})} if vcuda else None),
                  "torch": {"version": t.release, "variant": t.variant},
                  "packages": {"apt": [x for x, _l in apt], "pip": [x for x, _l in pip]}, "env": {}}
    where = {f"packages.{key}[{i}]": (text, line) for key, items in (("apt", apt), ("pip", pip))
             for i, (text, line) in enumerate(items)}
    for e in p.stack.env:
        where[f"env.{e.name}"] = (f"{e.name}={e.value}", e.line)
        if e.value is None:
            comments.append(_c(e.line, e.name, "its value cannot be expanded: not carried over"))
        else:
            data["env"][e.name] = e.value
    data = _fit(data, where, comments)
    head = [f"# Recipe {inputs.escape(Path(out).stem, 80)}: written by "
            f"`envbuild audit {inputs.escape(p.stack.file, 200)} --to-recipe`.",
            "# Not carried over (by line of the audited file):"]
    comments.sort(key=lambda c: c[0])
    shown = [text for _line, text in comments[:MAX_COMMENTS]] or ["(nothing)"]
    head += [f"#   {c}" for c in shown]
    if len(comments) > MAX_COMMENTS:
        head.append(f"#   ... and {len(comments) - MAX_COMMENTS} more")
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=False, width=1000)
    return "\n".join(head) + "\n" + body, data


def write(audited: Audited, out: str, driver: str | None = None) -> Path:
    """Write the recipe of ``audited`` to ``out`` atomically. Raises EnvbuildError (exit 2) when it cannot or may not be
    written, Unreachable (exit 3)."""
    if audited.pins is None or audited.result.exit_code >= 2:
        raise EnvbuildError(f"not written: {inputs.escape(audited.result.file, 200)} has errors (fix them first)",
                            file=out)
    text, _data = recipe_text(audited.pins, out, driver)
    spec = judge.check_data(inputs.load_yaml(text, out), out)
    if spec.failed:
        lines = [str(e) for e in spec.schema_errors] + [f"{', '.join(f.fields)}: {f.message}" for f in spec.errors]
        raise EnvbuildError(f"not written: the recipe would fail envbuild check: {'; '.join(lines)[:600]}", file=out)
    return write_atomic(out, text.encode("utf-8"), parents=False)
