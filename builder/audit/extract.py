"""The stack of a parsed file: base, Python, torch, packages and environment, each with its line. Read in the stages the
final image depends on: pip (and uv pip) installs with their indexes, conda installs with their channels, apt and dpkg
installs (a ``.deb`` by its file name), and the image's environment; :mod:`.follow` reads the files they name."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from builder.recipe.fields import VARIANT
from builder.recipe.rules.release import PYPI_HOSTS

from . import bases
from .model import PipTool
from .parsed import EnvSet, Note, Parsed, Stage
from .shell import Command, Var, Word

#: Most requirements read from one install command (a recipe holds at most 1000 packages).
MAX_REQUIREMENTS = 1000
_PIP = re.compile(r"pip(?:3(?:\.[0-9]{1,2})?)?")
_PYTHON = re.compile(r"python(?:3(?:\.(?P<minor>[0-9]{1,2}))?)?")
_CONDA = frozenset({"conda", "mamba", "micromamba"})
_APT = frozenset({"apt-get", "apt", "aptitude"})
_WRAPPERS = frozenset({"sudo", "env", "time", "nice", "nohup", "exec", "command", "stdbuf", "eatmydata"})
#: pip install options that take a value (the value is not a requirement).
_PIP_VALUE = frozenset({"-t", "--target", "--prefix", "--root", "--src", "--upgrade-strategy", "--cache-dir",
                        "--trusted-host", "--platform", "--python-version", "--implementation", "--abi",
                        "--progress-bar", "--log", "--proxy", "--retries", "--timeout", "--exists-action", "--cert",
                        "--client-cert", "--only-binary", "--no-binary", "--global-option", "--config-settings", "-C",
                        "--report", "--root-user-action", "--keyring-provider", "--python", "-p", "--index-strategy",
                        "--default-index", "--index", "--install-option", "--build-option"})
_PIP_ROLE = {"-i": "index", "--index-url": "index", "--extra-index-url": "extra", "-f": "find", "--find-links": "find",
             "-r": "file", "--requirement": "file", "-c": "constraint", "--constraint": "constraint", "-e": "editable",
             "--editable": "editable"}
#: The pip option that names an index of each role (how a finding names where torch comes from).
OPTION = {"index": "--index-url", "extra": "--extra-index-url", "find": "--find-links"}
_CONDA_VALUE = frozenset({"-n", "--name", "-p", "--prefix", "--solver", "--repodata-fn", "--file", "--platform",
                          "--subdir", "--channel-alias"})
_CONDA_SPEC = re.compile(r"(?:(?P<channel>[A-Za-z0-9_.-]+)::)?(?P<name>[A-Za-z0-9_.-]+)"
                         r"(?:(?P<op>==|>=|<=|!=|~=|=|<|>)(?P<version>[^=\s]+)(?:=(?P<build>\S+))?)?")
#: A Debian package file: ``name_version_arch.deb`` (Debian policy §4.1; ``*`` stands for any version).
_DEB = re.compile(r"(?P<name>[a-z0-9][a-z0-9+.-]+)_(?P<version>[A-Za-z0-9.+~:%*-]+?)(?:_[a-z0-9*]+)?\.deb")
_WHEEL_URL = re.compile(r"(?:\A|/)torch-(?P<version>[0-9][0-9a-z.]*)(?:%2B|\+)(?P<local>[a-z0-9]+)-cp")


@dataclass
class Item:
    """A value found in the file, its line and, when variables gave it, ``via`` (``TORCH: ARG at line 3``)."""

    value: str
    line: int
    via: str | None = None

    @classmethod
    def of(cls, word: Word, text: str | None = None) -> Item:
        """``text``, else the word's expanded text, else (it cannot be expanded) the word as written."""
        value = text if text is not None else word.text if word.text is not None else word.raw
        return cls(value, word.line, _via(word.uses, word.line))


def _via(uses: tuple[Var, ...], line: int) -> str | None:
    parts = []
    for var in uses:
        if var.line == line and var.kind == "shell":
            continue
        text = f"{var.name}: {var.kind} at line {var.line}" if var.line else f"{var.name}: {var.kind}"
        if text not in parts:
            parts.append(text)
    return ", ".join(parts[:3]) or None


@dataclass
class Index:
    """A package index of one install (``index``, ``extra`` or ``find``); ``variant``: a PyTorch index's."""

    role: str
    url: Item
    variant: str | None = None
    pytorch: bool = False
    pypi: bool = False
    known: bool = True


@dataclass
class PipInstall:
    """One ``pip install``; a requirement None is a path, URL or file pip reads."""

    line: int
    stage: int
    tool: PipTool
    indexes: list[Index]
    requirements: list[tuple[Item, Requirement | None]] = field(default_factory=list)
    files: list[Item] = field(default_factory=list)
    constraints: list[Item] = field(default_factory=list)
    python: Item | None = None
    no_index: bool = False
    strategy: str | None = None

    @property
    def main(self) -> Index | None:
        return next((i for i in self.indexes if i.role == "index"), None)


@dataclass
class CondaInstall:
    """One ``conda install``/``create``: ``specs`` ``[(item, name, op, version, build)]``."""

    line: int
    stage: int
    tool: str
    specs: list[tuple[Item, str, str | None, str | None, str | None]] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)
    files: list[Item] = field(default_factory=list)


@dataclass
class AptPackage:
    """``name[=version]`` of an apt install at ``item.line``."""

    item: Item
    name: str
    version: str | None


@dataclass
class Stack:
    """The stack of the final image: installs of every used stage in file order, ``notes``: what was not read."""

    file: str
    kind: str
    base: bases.BaseInfo
    base_item: Item
    stages: list[Stage]
    pip: list[PipInstall] = field(default_factory=list)
    conda: list[CondaInstall] = field(default_factory=list)
    apt: list[AptPackage] = field(default_factory=list)
    env: list[EnvSet] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    #: commands of the used stages that install nothing audit reads and are not
    #: housekeeping (apt-get update, rm, mkdir...): what --to-recipe cannot carry over
    skipped: list[Item] = field(default_factory=list)
    others: list[tuple[int, str]] = field(default_factory=list)

    def torch_requirements(self) -> list[tuple[PipInstall, Item, Requirement]]:
        """Every pip requirement of torch, in file order."""
        return [(p, it, r) for p in self.pip for it, r in p.requirements
                if r is not None and canonicalize_name(r.name) == "torch"]


def index_of(role: str, item: Item) -> Index:
    """An :class:`Index` for the URL ``item``: PyPI or not, and PyTorch's variant (``cpu``/``cuXYZ``)."""
    url = item.value.strip()
    host = url.split("/")[2].lower() if url.count("/") >= 2 else ""
    path = url.rstrip("/")
    if path.endswith(".html"):
        path = path.rsplit("/", 1)[0]
    last = path.rsplit("/", 1)[-1]
    variant = last if VARIANT.fullmatch(last) else None
    pytorch = host == "download.pytorch.org" or variant is not None
    return Index(role, item, variant, pytorch, host.split(":")[0] in PYPI_HOSTS)


# ----------------------------------------------------------------------- commands
def _command(words: list[Word]) -> tuple[str, int] | None:
    """``(program, index of its first argument)`` past wrappers (``sudo``, ``env``, ``conda run``), or None."""
    k = 0
    while k < len(words):
        text = words[k].text
        if text is None:
            return None
        name = posixpath.basename(text)
        if name in _WRAPPERS or "=" in text and k > 0 and words[0].text == "env":
            k += 1
            while k < len(words) and (words[k].text or "").startswith("-"):
                k += 2 if words[k].text in ("-u", "-g", "-n", "-o") else 1
            continue
        if name in _CONDA and k + 1 < len(words) and words[k + 1].text == "run":
            k += 2
            while k < len(words) and (words[k].text or "").startswith("-"):
                k += 2 if words[k].text in ("-n", "--name", "-p", "--prefix") else 1
            continue
        return name, k + 1
    return None


def _pip_start(words: list[Word]) -> tuple[PipTool, int, Item | None] | None:
    """``(tool, index of the first install argument, interpreter item)`` of a pip install."""
    found = _command(words)
    if found is None:
        return None
    name, k = found
    python = None
    tool: PipTool
    py = _PYTHON.fullmatch(name)
    if py and k < len(words):
        if words[k].text == "-m" and k + 1 < len(words) and words[k + 1].text in ("pip", "pip3"):
            k += 2
        elif words[k].text in ("-mpip", "-mpip3"):
            k += 1
        else:
            return None
        python = Item(f"3.{py.group('minor')}", words[0].line) if py.group("minor") else None
        tool = "pip"
    elif name == "uv" and k + 1 < len(words) and words[k].text == "pip":
        k += 1
        tool = "uv"
    elif _PIP.fullmatch(name):
        tool = "pip"
        minor = re.fullmatch(r"pip3\.([0-9]{1,2})", name)
        python = Item(f"3.{minor.group(1)}", words[0].line) if minor else None
    else:
        return None
    while k < len(words) and (words[k].text or "").startswith("-"):
        k += 1  # global options before the subcommand: pip -q install
    if k < len(words) and words[k].text == "install":
        return tool, k + 1, python
    return None


def _env_indexes(cmd: Command) -> list[Index]:
    out = []
    for var_name, role in (("PIP_INDEX_URL", "index"), ("PIP_EXTRA_INDEX_URL", "extra"), ("PIP_FIND_LINKS", "find")):
        var = cmd.lookup(var_name)
        if var is not None and var.value:
            for url in var.value.split():
                out.append(index_of(role, Item(url, var.line or cmd.line, f"{var_name}: {var.kind}")))
    return out


def pip_install(cmd: Command, stage: int, notes: list[Note]) -> PipInstall | None:
    """The pip install ``cmd`` runs, or None when it runs none."""
    start = _pip_start(cmd.words)
    if start is None:
        return None
    tool, k, python = start
    words = cmd.words
    got = PipInstall(cmd.line, stage, tool, [], python=python)
    own: list[Index] = []
    while k < len(words):
        w = words[k]
        k += 1
        if w.text is None:
            notes.append(Note("warning", "unexpanded", w.line, w.raw,
                              f"a {tool} install argument cannot be expanded: {w.why}; audited without it"))
            continue
        text = w.text
        opt, eq, value = text.partition("=") if text.startswith("--") else (text, "", "")
        if not eq and len(text) > 2 and text[:2] in ("-i", "-f", "-r", "-c", "-e") and not text.startswith("--"):
            opt, eq, value = text[:2], "=", text[2:]
        role = _PIP_ROLE.get(opt)
        if role or opt in _PIP_VALUE:
            if not eq and k < len(words):
                vw = words[k]
                k += 1
                if vw.text is None:
                    notes.append(Note("warning", "unexpanded", vw.line, vw.raw,
                                      f"the value of {opt} cannot be expanded: {vw.why}; audited without it"))
                    if role in ("index", "extra", "find"):
                        own.append(Index(role, Item(vw.raw, vw.line), known=False))
                    continue
                value, w = vw.text, vw
            if role in ("index", "extra", "find"):
                own.append(index_of(role, Item.of(w, value)))
            elif role in ("file", "constraint"):
                (got.files if role == "file" else got.constraints).append(Item.of(w, value))
            elif role == "editable":
                got.requirements.append((Item.of(w, value), None))
            elif opt == "--index-strategy":
                got.strategy = value
            continue
        if text == "--no-index":
            got.no_index = True
        if text.startswith("-"):
            continue
        if len(got.requirements) >= MAX_REQUIREMENTS:
            notes.append(Note("warning", "not-read", w.line, text, f"more than {MAX_REQUIREMENTS} requirements in one "
                              "install: the rest are not read"))
            break
        got.requirements.append((Item.of(w), _requirement(text)))
    env = _env_indexes(cmd)
    roles = {i.role for i in own}
    got.indexes = own + [i for i in env if i.role not in roles or i.role == "extra"]
    return got


def _requirement(text: str) -> Requirement | None:
    m = _WHEEL_URL.search(text)
    if m:
        try:
            return Requirement(f"torch=={m.group('version')}+{m.group('local')}")
        except InvalidRequirement:
            return None
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    return None if req.url else req


def conda_install(cmd: Command, stage: int) -> CondaInstall | None:
    """The conda install ``cmd`` runs, or None."""
    found = _command(cmd.words)
    if found is None or found[0] not in _CONDA:
        return None
    name, k = found
    words = cmd.words
    env = k + 1 < len(words) and words[k].text == "env" and words[k + 1].text in ("create", "update")
    if not env and (k >= len(words) or words[k].text not in ("install", "create", "update")):
        return None
    got = CondaInstall(cmd.line, stage, name)
    k += 2 if env else 1
    while k < len(words):
        w = words[k]
        k += 1
        text = w.text
        if text is None:
            continue
        if text in ("-c", "--channel") and k < len(words):
            got.channels.append(words[k].text or "")
            k += 1
        elif text.startswith("--channel="):
            got.channels.append(text.split("=", 1)[1])
        elif text.startswith("--file="):
            got.files.append(Item.of(w, text.split("=", 1)[1]))
        elif (text in _CONDA_VALUE or text == "-f" and (env or name == "micromamba")) and k < len(words):
            if text in ("--file", "-f"):
                got.files.append(Item.of(words[k]))
            k += 1
        elif text.startswith("-"):
            continue
        else:
            m = _CONDA_SPEC.fullmatch(text.replace(" ", ""))
            if m:
                if m.group("channel"):
                    got.channels.append(m.group("channel"))
                got.specs.append((Item.of(w), m.group("name").lower(), m.group("op"), m.group("version"),
                                  m.group("build")))
    return got


def apt_install(cmd: Command) -> list[AptPackage]:
    """The packages an apt install or ``dpkg -i`` of ``cmd`` installs (none for any other command)."""
    found = _command(cmd.words)
    if found is None or found[0] not in _APT and found[0] != "dpkg":
        return []
    prog, k = found
    words = cmd.words
    if prog == "dpkg":
        return [d for w in words[k:] if (d := _deb(w))] if {"-i", "--install"} & {w.text for w in words[k:]} else []
    while k < len(words) and (words[k].text or "").startswith("-"):
        k += 2 if words[k].text in ("-o", "-t", "-c", "--target-release") else 1
    if k >= len(words) or words[k].text != "install":
        return []
    out = []
    k += 1
    while k < len(words):
        w = words[k]
        k += 1
        text = w.text
        if text is not None and (deb := _deb(w)) is not None:
            out.append(deb)
            continue
        if text is None or text.startswith("-") or "/" in text.split("=", 1)[0] or text.endswith(".deb"):
            if text in ("-o", "-t", "-c", "--target-release"):
                k += 1
            continue
        name, _eq, version = text.partition("=")
        out.append(AptPackage(Item.of(w), name, version or None))
    return out


def _deb(w: Word) -> AptPackage | None:
    """The package of a ``.deb`` file argument (``./libnccl2_2.6.4-1+cuda9.1_amd64.deb``), by its file name."""
    if (m := _DEB.fullmatch(posixpath.basename(w.text or ""))) is None:
        return None
    return AptPackage(Item.of(w), m["name"], None if "*" in m["version"] else m["version"].replace("%3a", ":"))


#: Programs whose commands are housekeeping of an image build (no trace in a recipe).
HOUSEKEEPING = frozenset({"apt-get", "apt", "rm", "mkdir", "ln", "echo", "true", "cd", "set", ":", "test", "[",
                          "[[", "chmod", "chown", "export", "unset", "printf", "ldconfig", "apt-key",
                          "update-ca-certificates", "dpkg-reconfigure", "locale-gen", "useradd", "groupadd", "exit",
                          "sleep", "touch", "cp", "mv", "dpkg"})


def _housekeeping(cmd: Command) -> bool:
    found = _command(cmd.words)
    if found is None:
        return False
    name, k = found
    if name in HOUSEKEEPING or name in _CONDA:
        return True
    args = [w.text for w in cmd.words[k:]]
    return bool(_PYTHON.fullmatch(name) and args[:2] == ["-m", "venv"]
                or (_PIP.fullmatch(name) or name == "uv") and args[:1] in (["install"], ["cache"], ["config"]))


# ----------------------------------------------------------------------- the stack
def extract(parsed: Parsed) -> Stack:
    """The :class:`Stack` of the final image of ``parsed``."""
    used = parsed.used()
    final = parsed.final
    root = parsed.chain(final)[0]
    bw = root.base.word
    info = bases.read(bw.text, root.base.bootstrap, root.base.header)
    shown = bw.text if bw.text else info.image if info.image else bw.raw  # debootstrap: no From, the OS it names
    base_item = Item(shown or "", root.base.line, _via(bw.uses, root.base.line))
    stack = Stack(parsed.file, parsed.kind, info, base_item, used, notes=list(parsed.notes))
    for st in used:
        for cmd in st.commands:
            if cmd.alternative is not None:
                if _pip_start(cmd.words) or conda_install(cmd, 0) or apt_install(cmd):
                    text = " ".join(w.text if w.text is not None else w.raw for w in cmd.words)
                    stack.notes.append(Note("warning", "cannot-tell", cmd.line, text[:300], f"runs depending on "
                                            f"{cmd.alternative}: audit cannot tell whether it does; audited "
                                            "without it"))
                continue
            pip = pip_install(cmd, st.index, stack.notes)
            if pip is not None:
                stack.pip.append(pip)
                continue
            conda = conda_install(cmd, st.index)
            if conda is not None:
                stack.conda.append(conda)
                continue
            apt = apt_install(cmd)
            stack.apt.extend(apt)
            if not apt and not _housekeeping(cmd):
                text = " ".join(w.text if w.text is not None else w.raw for w in cmd.words)
                stack.skipped.append(Item(text, cmd.line))
    stack.others = list(parsed.others)
    for st in parsed.chain(final):
        stack.env.extend(st.env)
    unused = [s for s in parsed.stages if s not in used]
    for s in unused:
        if s.commands:
            stack.notes.append(Note(
                "note", "stage-unused", s.line, s.name or str(s.index),
                f"stage {s.name or s.index} is not used by the final image; its installs are not audited"))
    return stack
