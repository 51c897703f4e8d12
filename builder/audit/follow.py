"""The files a build installs from (pip ``-r``/``-c``, conda environment and package-list files), read from the build
context where a COPY/ADD or ``%files`` brings them: inside it, no symlink, bounded; each pin keeps its ``via``."""

from __future__ import annotations

import os
import posixpath
import re

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.core import inputs
from builder.core.errors import EnvbuildError, Unreachable

from .extract import _CONDA_SPEC, CondaInstall, Item, PipInstall, Stack, pip_install
from .parsed import Note, Parsed, Stage
from .shell import Command, Word

#: Largest file followed (bytes) and most files followed for one audited file, nested ``-r`` included.
MAX_BYTES, MAX_FILES = 256 * 1024, 32
_EXPLICIT = re.compile(r"\S*/(?P<name>[a-z0-9_.-]+)-(?P<version>[^-/]+)-(?P<build>[^-/]+)\.(?:tar\.bz2|conda)\S*")


class Follower:
    """Reads the files of one audited file's installs from ``root`` (the build context)."""

    def __init__(self, parsed: Parsed, stack: Stack, root: str) -> None:
        self.parsed, self.stack, self.root, self.count = parsed, stack, os.path.abspath(root), 0

    def locate(self, stage: Stage, path: str) -> str | None:
        """The context path of the image path ``path``, from the last COPY/ADD/%files bringing it; None: none does."""
        for st in reversed(self.parsed.chain(stage)):
            for into, src, many in reversed(st.files):
                src = posixpath.normpath(src.lstrip("/") or ".")
                dest = into if not many or os.path.isdir(os.path.join(self.root, src)) else \
                    posixpath.join(into, posixpath.basename(src))
                if path == dest or path.startswith(dest.rstrip("/") + "/"):
                    return posixpath.normpath(posixpath.join(src, path[len(dest):].lstrip("/")))
        return None

    def open(self, stage: Stage, cwd: str, item: Item) -> tuple[str, str, list[str]] | None:
        """``(image path, context path, lines)`` of ``item``'s file (no lines: a warning says why); None: no COPY
        brings it."""
        path = posixpath.normpath(posixpath.join(cwd, item.value))
        rel = self.locate(stage, path)
        if rel is None:
            return None
        try:
            if rel == ".." or rel.startswith("../") or self.count >= MAX_FILES:
                raise Unreachable("outside the build context" if self.count < MAX_FILES else
                                  f"past the {MAX_FILES} files audit follows for one file")
            parts = rel.split("/")
            if any(os.path.islink(os.path.join(self.root, *parts[:k])) for k in range(1, len(parts) + 1)):
                raise Unreachable("a symbolic link (audit follows none)")
            data = inputs.read_regular(os.path.join(self.root, rel), MAX_BYTES, "file the build installs from")
            self.count += 1
            return path, rel, data.decode("utf-8").replace("\r\n", "\n").split("\n")
        except (EnvbuildError, UnicodeDecodeError) as e:
            why = e.message.split(": ", 1)[-1] if isinstance(e, EnvbuildError) else "not UTF-8 text"
            self.stack.notes.append(Note("warning", "not-read", item.line, item.value,
                                         f"{rel} from the build context is not read ({why}); its packages are not "
                                         "audited"))
            return path, rel, []

    def pip(self, pip: PipInstall, stage: Stage, cwd: str) -> None:
        """Read ``pip``'s requirement and constraint files into it; the unread stay in ``pip.files``."""
        todo = [(f, False) for f in pip.files] + [(c, True) for c in pip.constraints]
        pip.files, pip.constraints = [], []
        for item, constraint in todo:
            got = self.open(stage, cwd, item)
            sub = pip_install(Command(_words(got[2]), item.line), pip.stage, self.stack.notes) if got else None
            if got is None or sub is None:
                pip.files += [item] if got is None else []
                continue
            self.nested(sub, stage, item.line, got[1], posixpath.dirname(got[0]))
            if constraint:
                _constrain(pip, sub.requirements)
            else:
                pip.requirements.extend(sub.requirements)
            pip.files.extend(sub.files)
            roles = {i.role for i in pip.indexes}
            pip.indexes += [i for i in sub.indexes if i.role not in roles or i.role == "extra"]

    def nested(self, sub: PipInstall, stage: Stage, line: int, rel: str, cwd: str) -> None:
        """``sub`` (read from the file ``rel``) moved to the install's ``line``, its own files read."""
        sub.files = [Item(f.value, line, f"{rel}: line {f.line}") for f in sub.files]
        sub.constraints = [Item(f.value, line, f"{rel}: line {f.line}") for f in sub.constraints]
        sub.requirements = [(Item(it.value, line, f"{rel}: line {it.line}"), r) for it, r in sub.requirements]
        for i in sub.indexes:
            i.url = Item(i.url.value, line, f"{rel}: line {i.url.line}")
        self.pip(sub, stage, cwd)

    def conda(self, conda: CondaInstall, stage: Stage, cwd: str) -> None:
        """Read ``conda``'s environment or package-list files into it (an environment's ``pip:`` as a pip install)."""
        files, conda.files = conda.files, []
        for item in files:
            got = self.open(stage, cwd, item)
            if got is None:
                conda.files.append(item)
            elif item.value.endswith((".yml", ".yaml")):
                self.environment(conda, stage, item, got)
            else:
                for n, line in enumerate(got[2], 1):
                    m = _EXPLICIT.fullmatch(line.strip())
                    _spec(conda, f"{m['name']}={m['version']}={m['build']}" if m else line.split("#")[0].strip(),
                          Item("", item.line, f"{got[1]}: line {n}"))

    def environment(self, conda: CondaInstall, stage: Stage, item: Item, got: tuple[str, str, list[str]]) -> None:
        try:
            root = yaml.compose("\n".join(got[2]), Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            root = None
            self.stack.notes.append(Note("warning", "not-read", item.line, item.value,
                                         f"{got[1]} is not YAML: its packages are not audited"))
        top = {k.value: v for k, v in root.value} if isinstance(root, yaml.MappingNode) else {}
        conda.channels += [n.value for n in _scalars(top.get("channels"))]
        for node in top["dependencies"].value if isinstance(top.get("dependencies"), yaml.SequenceNode) else []:
            if isinstance(node, yaml.ScalarNode):
                _spec(conda, node.value, Item("", item.line, f"{got[1]}: line {node.start_mark.line + 1}"))
            for key, value in node.value if isinstance(node, yaml.MappingNode) else []:
                pieces = [(n.start_mark.line + 1, n.value) for n in _scalars(value)]
                sub = pip_install(Command(_words([], pieces), item.line), conda.stage, self.stack.notes)
                if key.value == "pip" and sub is not None:
                    self.nested(sub, stage, item.line, got[1], posixpath.dirname(got[0]))
                    self.stack.pip.append(sub)


def _spec(conda: CondaInstall, text: str, at: Item) -> None:
    if (m := _CONDA_SPEC.fullmatch(text.replace(" ", ""))) is not None:
        conda.specs.append((Item(text, at.line, at.via), m["name"].lower(), m["op"], m["version"], m["build"]))


def _scalars(node: yaml.Node | None) -> list[yaml.ScalarNode]:
    return [n for n in node.value if isinstance(n, yaml.ScalarNode)] if isinstance(node, yaml.SequenceNode) else []


def _words(lines: list[str], pieces: list[tuple[int, str]] | None = None) -> list[Word]:
    """``pip install`` and a requirements file's words (pip's format: ``\\`` continues, `` #`` comments, an option
    line splits on blanks, a requirement line is one word before its ``--hash`` options)."""
    if pieces is None:
        pieces, cont = [], ""
        for n, line in enumerate(lines, 1):
            text = re.sub(r"(?:\A|[ \t])#.*", "", cont + line)
            cont = text[:-1] if text.endswith("\\") else ""
            pieces += [] if cont else [(n, text.strip())]
    out = [Word("pip", "pip", 1), Word("install", "install", 1)]
    for n, text in pieces:
        words = text.split() if text.startswith("-") else [text.split(" --", 1)[0].strip()] if text else []
        out += [Word(t, t, n) for t in words]
    return out


def _constrain(pip: PipInstall, constraints: list[tuple[Item, Requirement | None]]) -> None:
    """``-c`` pins on the requirements of the same name (a constraint alone installs nothing)."""
    by_name = {canonicalize_name(r.name): (it, r) for it, r in constraints if r is not None}
    for k, (_it, req) in enumerate(pip.requirements):
        if req is not None and (got := by_name.get(canonicalize_name(req.name))) is not None:
            try:
                merged = Requirement(f"{req.name}{req.specifier & got[1].specifier}")
                pip.requirements[k] = (Item(str(merged), got[0].line, got[0].via), merged)
            except InvalidRequirement:
                continue


def follow(parsed: Parsed, stack: Stack, context: str) -> None:
    """Read into ``stack`` what its installs name, from the build context ``context``."""
    f = Follower(parsed, stack, context)
    cwd = {(st.index, c.line): c.cwd for st in stack.stages for c in st.commands}
    for pip in list(stack.pip):
        f.pip(pip, parsed.stages[pip.stage], cwd.get((pip.stage, pip.line), "/"))
    for conda in stack.conda:
        f.conda(conda, parsed.stages[conda.stage], cwd.get((conda.stage, conda.line), "/"))
