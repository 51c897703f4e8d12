"""Apptainer/Singularity definition files: header, sections, stages, build arguments. Not spython's parser: it keeps no
line numbers, drops a command in the header, merges duplicate sections and takes a merge-conflict marker for a
``%post`` command; here each is malformed (exit 3). Grammar: Apptainer user guide, "Definition Files"."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from .parsed import Base, EnvSet, Malformed, Parsed, Stage, read_lines
from .shell import Scanner, Source, Var, Word

SECTIONS = frozenset({"setup", "files", "post", "environment", "runscript", "startscript", "test", "labels",
                      "help", "arguments", "appinstall", "apprun", "appenv", "applabels", "appfiles", "apphelp",
                      "appsetup", "apptest", "appstart"})
#: Bootstrap agents of Apptainer/SingularityCE; those that need a ``From:``.
AGENTS = frozenset({"docker", "docker-daemon", "docker-archive", "library", "oras", "shub", "localimage", "oci",
                    "oci-archive", "debootstrap", "yum", "zypper", "busybox", "scratch", "arch"})
NEEDS_FROM = frozenset({"docker", "docker-daemon", "docker-archive", "library", "oras", "shub", "localimage", "oci",
                        "oci-archive"})
_SECTION = re.compile(r"\A[ \t]*%([A-Za-z]+)(?:[ \t]+(.*?))?[ \t]*\Z")
_KEY = re.compile(r"\A([A-Za-z][A-Za-z0-9_]*)[ \t]*:[ \t]*(.*?)[ \t]*\Z")
_ARGUMENT = re.compile(r"\A[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(.*?)[ \t]*\Z")


@dataclass
class _Block:
    """One stage as written: header keys (lower case) with their lines, sections by name."""

    line: int
    header: dict[str, tuple[int, str]] = field(default_factory=dict)
    sections: dict[str, tuple[int, str, list[tuple[int, str]]]] = field(default_factory=dict)


def _blocks(file: str, lines: list[str]) -> list[_Block]:
    blocks: list[_Block] = []
    body: list[tuple[int, str]] | None = None  # the open section's lines; None: in a header
    for n, line in enumerate(lines, 1):
        sec = _SECTION.match(line)
        key = _KEY.match(line) if body is None or not line[:1].isspace() else None
        if sec and (sec.group(1).lower() in SECTIONS or not line[:1].isspace()):
            name = sec.group(1).lower()
            if name not in SECTIONS:
                raise Malformed(file, n, f"unknown section %{sec.group(1)[:40]}")
            if not blocks:
                raise Malformed(file, n, f"section %{name} before the header; a definition starts with Bootstrap:")
            args = (sec.group(2) or "").strip()
            ident = f"{name} {args.split()[0]}" if name.startswith("app") and args else name
            if name == "files":  # Apptainer takes any number of %files sections, each maybe "from STAGE"
                ident = f"files {n}"
            if ident in blocks[-1].sections:
                first = blocks[-1].sections[ident][0]
                raise Malformed(file, n, f"duplicate section %{ident} (first at line {first})")
            body = []
            blocks[-1].sections[ident] = (n, args, body)
            continue
        if key and key.group(1).lower() == "bootstrap" and (
                body is not None or not blocks or "bootstrap" in blocks[-1].header):
            blocks.append(_Block(n))
            body = None
        if body is not None:
            body.append((n, line))
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not key:
            raise Malformed(file, n, f"a command in the header ({stripped[:60]!r}) outside any section; "
                            "commands belong in %post")
        if not blocks:
            raise Malformed(file, n,
                            f"header key {key.group(1)[:40]} before Bootstrap:; a definition starts with Bootstrap:")
        blocks[-1].header.setdefault(key.group(1).lower(), (n, key.group(2)))
    if not blocks:
        raise Malformed(file, 1, "no Bootstrap: header; a definition starts with Bootstrap: (and From:)")
    return blocks


def _arguments(blocks: list[_Block], build_args: dict[str, str]) -> dict[str, Var]:
    out: dict[str, Var] = {}
    for b in blocks:
        sec = b.sections.get("arguments")
        for n, line in sec[2] if sec else []:
            m = _ARGUMENT.match(line)
            if m:
                out[m.group(1)] = Var(m.group(2).strip("\"'"), n, "%arguments", None, m.group(1))
    for name, value in build_args.items():
        out[name] = Var(value, None, "--build-arg", None, name)
    return out


def _stage(file: str, b: _Block, index: int, names: dict[str, int], templates) -> Stage:
    boot_line, agent = b.header["bootstrap"]
    agent = agent.strip().lower()
    if agent not in AGENTS:
        raise Malformed(file, boot_line, f"Bootstrap: {agent[:40]!r} is not a bootstrap agent of Apptainer")
    line, ref = b.header.get("from", (boot_line, ""))
    if agent in NEEDS_FROM and not ref:
        raise Malformed(file, boot_line, f"Bootstrap: {agent} needs a From: line naming the image")
    scanner = Scanner(Source([(line, ref)]), lambda _n: None, shell=False, templates=templates)
    word = (scanner.words() or [Word("", ref, line)])[0]
    header = {k: v for k, (_n, v) in b.header.items() if k not in ("bootstrap", "from")}
    name = header.get("stage", "").lower() or None
    stage = Stage(index, name, b.line, Base(word, line, agent, None, header))
    for n, args, body in (v for k, v in b.sections.items() if k.startswith("files ")):
        m = re.fullmatch(r"from[ \t]+(\S+)", args, re.I)
        if m and m.group(1).lower() not in names:
            raise Malformed(file, n, f"%files from {m.group(1)[:60]}: no earlier stage has Stage: {m.group(1)[:60]}")
        if m:
            stage.copies.append((names[m.group(1).lower()], n))
            continue
        for _n, text in body:  # "SRC [DEST]": DEST defaults to SRC (Apptainer docs, "%files")
            parts = text.split()
            if parts and not parts[0].startswith("#"):
                stage.files.append((posixpath.normpath(posixpath.join("/", parts[-1])), parts[0], False))
    if "post" in b.sections:
        n, _args, body = b.sections["post"]
        stage.commands = Scanner(Source(body), lambda _n: None, shell=True, templates=templates).commands()
    if "environment" in b.sections:
        n, _args, body = b.sections["environment"]
        sc = Scanner(Source(body), lambda _n: None, shell=True, templates=templates)
        sc.commands()
        stage.env = [EnvSet(v.name, v.value, v.line or n, v.why, f"{v.name}={v.value}") for v in sc.local.values()]
    return stage


def parse(file: str, build_args: dict[str, str] | None = None) -> Parsed:
    """The :class:`~.parsed.Parsed` stages of the definition at ``file`` (one per ``Bootstrap:``). Raises Unreachable
    (exit 3) when unreadable, Malformed (exit 3) naming the line."""
    lines = read_lines(file)
    blocks = _blocks(file, lines)
    args = _arguments(blocks, dict(build_args or {}))
    stages: list[Stage] = []
    names: dict[str, int] = {}
    others: list[tuple[int, str]] = []
    for k, b in enumerate(blocks):
        st = _stage(file, b, k, names, args.get)
        if st.name:
            names[st.name] = k
        stages.append(st)
        for ident, (n, sec_args, body) in b.sections.items():
            if ident not in ("post", "environment", "arguments") and any(t.strip() for _l, t in body):
                others.append((n, f"%{ident.split()[0] if ident.startswith('files') else ident} {sec_args}".strip()))
    return Parsed(file, "definition", stages, others=others)
