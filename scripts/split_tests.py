"""Split ``tests/test_*.py`` into ``tests/unit/`` and ``tests/integration/`` (issue 9 item 6).

Usage: ``python scripts/split_tests.py [--dry-run]`` from anywhere; prints one line per file
(``unit``, ``integration`` or ``mixed`` with the first reason) and moves each top-level
``tests/test_*.py`` with ``git mv`` (a file git does not track yet is moved with a rename).
Idempotent: files already under ``tests/unit/`` or ``tests/integration/`` stay; a second run
moves nothing. ``--check`` moves nothing and exits 1 when a file would move or when a file of
``tests/unit/`` now holds a test that is not a unit test (move it, or split it, by hand).

Classification is static (``ast``), per test function: a test is *integration* when it asks
for (directly, through a fixture of its module or of the shared fixture modules, or through a
module-level helper it calls) one of :data:`ENGINE_FIXTURES`, or calls one of
:data:`ENGINE_CALLS`, or runs an ``envbuild`` command of :data:`ENGINE_COMMANDS` (a string
literal argument of ``run_envbuild``/``run_json``/``cli``), or runs a Slurm or Kubernetes
client (:data:`CLUSTER_PROGRAMS` as the first literal of a ``subprocess`` call's argv). A file
whose tests are all unit goes to ``tests/unit``; any other to ``tests/integration`` (``mixed``
files are reported, to be split by hand later). Tests too slow for the unit set (:data:`SLOW_CALLS`)
or that download (``pip download``) count as integration too. ``tests/hostile/`` (a package of
hostile-input tests) is classified as one and moves as a whole (``tests/<kind>/hostile``);
the data folders (``tests/audit``, ``tests/golden``, ``tests/recipes``, ``tests/schemas``) and
the shared modules (``conftest.py``, ``helpers.py``, ``fixtures_*.py``, ``certify_helpers.py``,
``k8s_docker.py``, ``factories.py``, ``bench_profiles_driver.py``) stay in ``tests/``, which
is on pytest's ``pythonpath`` (pyproject.toml), so both folders import them unchanged.

A moved file's paths computed from ``__file__`` gain one level (``Path(__file__).resolve()
.parent.parent`` -> ``.parents[2]``, ``.parents[1]`` -> ``.parents[2]``, ``os.path.dirname``
x2 -> x3), and ``sys.path.insert(0, 'tests')`` of a subprocess names the new folder. Paths
``tests/<file>`` named in tracked text (README.md, Makefile, docstrings) are rewritten to the
file's new folder (:func:`fix_references`).
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
UNIT = TESTS / "unit"
INTEGRATION = TESTS / "integration"

#: Fixtures that need the Docker engine, a registry, Slurm or an ssh server (shared modules).
ENGINE_FIXTURES = frozenset({
    "docker_client", "bootstrap_image", "python_image", "torch_image", "bumped_torch_image",
    "registry_server", "registry", "slurm_node", "sshd", "nodes_factory",
})
#: Calls (last name of the callee) that reach the engine, a registry or a cluster.
ENGINE_CALLS = frozenset({
    "connect", "from_env", "DockerClient", "APIClient", "certify_image", "small_image",
    "recorded_certificate", "bootstrap_debian", "build_image", "ensure_apt",
})
#: envbuild commands that need an engine, a registry or a cluster.
ENGINE_COMMANDS = frozenset({"build", "certify", "make", "push", "pull", "doctor", "gather", "bootstrap", "publish"})
#: Helpers that run the envbuild command line; their string literals name the command.
ENVBUILD_RUNNERS = frozenset({"run_envbuild", "run_json", "cli", "envbuild"})
#: Cluster clients: a subprocess whose argv starts with one of these is integration.
CLUSTER_PROGRAMS = frozenset({"sbatch", "srun", "scontrol", "squeue", "sinfo", "kubectl", "kind", "ssh", "docker",
                              "nvidia-smi"})
#: Helpers too slow for the unit set (< 60 s in all): the hostile-input harness runs every
#: case in a bounded worker process (about 90 s for tests/hostile on 2 cores).
SLOW_CALLS = frozenset({"run_cases"})
#: Shared modules and data folders that stay in tests/.
SHARED = ("conftest.py", "helpers.py", "certify_helpers.py", "k8s_docker.py", "factories.py",
          "bench_profiles_driver.py")


@dataclass
class Verdict:
    """The classification of one test file: ``kind`` is unit, integration or mixed."""

    path: Path
    unit: list[str] = field(default_factory=list)
    integration: dict[str, str] = field(default_factory=dict)  # test name -> first reason

    @property
    def kind(self) -> str:
        if not self.integration:
            return "unit"
        return "mixed" if self.unit else "integration"

    def line(self) -> str:
        why = next(iter(self.integration.items()), None)
        counts = f"{len(self.unit)} unit, {len(self.integration)} integration"
        reason = f" ({counts}; e.g. {why[0]}: {why[1]})" if why else ""
        return f"{self.kind:<12}{self.path.relative_to(ROOT)}{reason}"


def _callee(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr
    return f.id if isinstance(f, ast.Name) else ""


def _literals(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _argv_head(call: ast.Call) -> str | None:
    """The first string of a subprocess call's argv list (``subprocess.run(["sbatch", ...])``)."""
    if not call.args or not isinstance(call.args[0], (ast.List, ast.Tuple)) or not call.args[0].elts:
        return None
    first = call.args[0].elts[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _fake_first(call: ast.Call) -> bool:
    """``certify_image(FakeClient(...), ...)``: the first argument is a stand-in, not an engine."""
    first = call.args[0] if call.args else None
    return isinstance(first, ast.Call) and _callee(first).startswith("Fake")


def _body_reason(fn: ast.AST) -> str | None:
    """Why the body of ``fn`` needs an engine or a cluster on its own, or None. ``connect()``
    after ``setenv("DOCKER_HOST", ...)`` reaches the socket the test chose (a dead one)."""
    own_host = any(isinstance(n, ast.Call) and _callee(n) == "setenv" and "DOCKER_HOST" in _literals(n)
                   for n in ast.walk(fn))
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name in ENGINE_CALLS and not _fake_first(node) and not (own_host and name == "connect"):
            return f"calls {name}()"
        if name in SLOW_CALLS:
            return f"calls {name}() (slow: bounded worker processes)"
        if name in ("run", "Popen", "check_output", "check_call") and {"pip", "download"} <= set(_literals(node)):
            return "runs pip download (package index)"
        if name in ENVBUILD_RUNNERS:
            hit = ENGINE_COMMANDS.intersection(_literals(node))
            if hit:
                return f"runs `envbuild {sorted(hit)[0]}`"
        if name in ("run", "Popen", "check_output", "check_call", "call"):
            head = _argv_head(node)
            if head and Path(head).name in CLUSTER_PROGRAMS:
                return f"runs {head}"
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The fixture names ``fn`` asks for: its parameters less those ``parametrize`` fills."""
    filled: set[str] = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and _callee(d) == "parametrize" and d.args:
            first = d.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            names = [first.value] if literal else _literals(first)
            filled.update(n.strip() for name in names for n in name.split(","))
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs if a.arg not in filled]


def _marked_gpu(node: ast.AST) -> bool:
    """``@pytest.mark.gpu`` (or ``pytestmark = pytest.mark.gpu``) in ``node``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "gpu" and isinstance(n.value, ast.Attribute)
               and n.value.attr == "mark" for n in ast.walk(node))


def _is_fixture(fn: ast.AST) -> bool:
    for d in getattr(fn, "decorator_list", []):
        target = d.func if isinstance(d, ast.Call) else d
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                isinstance(target, ast.Name) and target.id == "fixture"):
            return True
    return False


def _is_autouse(fn: ast.AST) -> bool:
    return any(isinstance(d, ast.Call)
               and any(k.arg == "autouse" and getattr(k.value, "value", False) for k in d.keywords)
               for d in getattr(fn, "decorator_list", []))


def _usefixtures(node: ast.AST) -> list[str]:
    """Fixture names of ``pytest.mark.usefixtures("a", ...)`` decorators or ``pytestmark``."""
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call) and _callee(n) == "usefixtures":
            out += [a.value for a in n.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return out


class Module:
    """The functions, fixtures and tests of one parsed file, with reasons resolved transitively."""

    def __init__(self, tree: ast.Module, known: dict[str, str]):
        self.known = known  # fixture or helper name -> reason (shared modules)
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.tests: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, list[str]]] = []
        marks = ast.Module(body=[s for s in tree.body if isinstance(s, ast.Assign)
                                 and any(getattr(t, "id", "") == "pytestmark" for t in s.targets)], type_ignores=[])
        self.module_fixtures = _usefixtures(marks)
        self.module_gpu = _marked_gpu(marks)
        for stmt in tree.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[stmt.name] = stmt
                if stmt.name.startswith("test") and not _is_fixture(stmt):
                    self.tests.append((stmt.name, stmt, _usefixtures(stmt)))
            elif isinstance(stmt, ast.ClassDef) and stmt.name.startswith("Test"):
                marks = ast.Module(body=[ast.Expr(d) for d in stmt.decorator_list], type_ignores=[])
                extra = _usefixtures(marks)
                for sub in stmt.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        if sub.name.startswith("test"):
                            self.tests.append((f"{stmt.name}.{sub.name}", sub, extra + _usefixtures(sub)))
                        elif _is_fixture(sub):
                            self.functions[sub.name] = sub
        self.autouse = [n for n, f in self.functions.items() if _is_fixture(f) and _is_autouse(f)]
        self._memo: dict[str, str | None] = {}

    def reason(self, name: str, seen: frozenset[str] = frozenset()) -> str | None:
        """Why the fixture or helper ``name`` needs an engine or a cluster, or None."""
        if name in ENGINE_FIXTURES:
            return f"uses {name}"
        if name in self._memo:
            return self._memo[name]
        fn = self.functions.get(name)
        if fn is None or name in seen:
            return self.known.get(name)
        why = self.function_reason(fn, seen | {name})
        self._memo[name] = why
        return why

    def function_reason(self, fn: ast.AST, seen: frozenset[str], extra: list[str] = ()) -> str | None:
        names = [*(_params(fn) if _is_fixture(fn) or fn.name.startswith("test") else []), *extra]  # type: ignore[attr-defined]
        for p in names:
            why = self.reason(p, seen)
            if why:
                return why
        why = _body_reason(fn)
        if why:
            return why
        for node in ast.walk(fn):  # module-level helpers it calls
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            callee = node.func.id
            if callee in self.functions and callee not in seen and callee != getattr(fn, "name", ""):
                why = self.reason(callee, seen)
                if why:
                    return f"{callee}: {why}"
            elif callee in self.known and callee not in self.functions:
                return f"{callee}: {self.known[callee]}"
        return None


def shared_reasons() -> dict[str, str]:
    """Reasons of the fixtures and helpers of the shared modules in tests/ (conftest and friends)."""
    known: dict[str, str] = {}
    paths = sorted(TESTS.glob("fixtures_*.py")) + [TESTS / n for n in SHARED if (TESTS / n).exists()]
    for _ in range(3):  # shared modules use each other's fixtures: resolve to a fixed point
        for path in paths:
            mod = Module(ast.parse(path.read_text()), known)
            for name in mod.functions:
                why = mod.reason(name)
                if why and name not in known:
                    known[name] = why
    return known


def classify(path: Path, known: dict[str, str]) -> Verdict:
    """The :class:`Verdict` of the test file ``path``."""
    mod = Module(ast.parse(path.read_text()), known)
    verdict = Verdict(path)
    for name, fn, extra in mod.tests:
        if mod.module_gpu or _marked_gpu(ast.Module(body=list(fn.decorator_list), type_ignores=[])):
            verdict.integration[name] = "needs a GPU (marked gpu)"
            continue
        why = mod.function_reason(fn, frozenset(), [*mod.module_fixtures, *mod.autouse, *extra])
        if why:
            verdict.integration[name] = why
        else:
            verdict.unit.append(name)
    return verdict


def classify_package(folder: Path, known: dict[str, str]) -> Verdict:
    """One verdict for a test package (``tests/hostile``): the union of its files'."""
    verdict = Verdict(folder)
    for path in sorted(folder.glob("test_*.py")):
        one = classify(path, known)
        verdict.unit += [f"{path.name}::{n}" for n in one.unit]
        verdict.integration.update({f"{path.name}::{n}": w for n, w in one.integration.items()})
    return verdict


_PATH_FIXES = [
    (re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parent\.parent\b"), r"\1.parents[2]"),
    (re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parents\[1\]"), r"\1.parents[2]"),
    (re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parent(?![.\w\[])"), r"\1.parents[1]"),
    (re.compile(r"os\.path\.dirname\(os\.path\.dirname\(os\.path\.abspath\(__file__\)\)\)"),
     "os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))"),
]


def fix_paths(text: str, folder: str) -> str:
    """``text`` of a file moved one level down into ``tests/<folder>``: paths from ``__file__``
    reach the same places, a subprocess's ``sys.path.insert(0, 'tests')`` names the new folder."""
    for pattern, repl in _PATH_FIXES:
        text = pattern.sub(repl, text)
    return text.replace("sys.path.insert(0, 'tests')", f"sys.path[:0] = ['tests/{folder}', 'tests']")


def git_mv(src: Path, dst: Path, dry_run: bool) -> None:
    """Move ``src`` to ``dst`` (``git mv`` when tracked), then fix its paths."""
    if dry_run:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    tracked = subprocess.run(["git", "ls-files", "--error-unmatch", str(src)], cwd=ROOT,
                             capture_output=True).returncode == 0
    if tracked:
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)
    else:
        src.rename(dst)
    folder = dst.relative_to(TESTS).parts[0]
    for py in [dst] if dst.is_file() else sorted(dst.rglob("*.py")):
        if py.suffix == ".py" and py.name != "__init__.py":
            if py.is_file():
                text = py.read_text()
                fixed = fix_paths(text, folder) if dst.is_file() else _fix_package_paths(text)
                if fixed != text:
                    py.write_text(fixed)


def _fix_package_paths(text: str) -> str:
    """A file of a moved package (tests/hostile -> tests/unit/hostile): one more parent."""
    return re.sub(r"(Path\(__file__\)(?:\.resolve\(\))?)\.parents\[(\d)\]",
                  lambda m: f"{m.group(1)}.parents[{int(m.group(2)) + 1}]", text)


#: Tracked files whose text may name a test file by its path (README, Makefile, docstrings...).
REFERENCE_SUFFIXES = (".md", ".py", ".yaml", ".yml", ".sh", ".toml", ".cfg", ".txt")
REFERENCE_SKIP = ("tests/golden/", "tests/audit/", "tests/recipes/", "tests/schemas/", "schemas/")


def fix_references(dry_run: bool) -> list[str]:
    """Rewrite ``tests/<name>`` to ``tests/unit/<name>`` or ``tests/integration/<name>`` in the
    tracked text files, for every test file and package now in those folders (idempotent: a
    path already split is not matched). Returns the files changed."""
    where = {p.name: p.relative_to(ROOT).as_posix() for d in (UNIT, INTEGRATION) if d.is_dir()
             for p in d.iterdir() if p.name.startswith("test_") or (p.is_dir() and (p / "__init__.py").exists())}
    if not where:
        return []
    names = "|".join(re.escape(n) for n in sorted(where, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w/.])tests/({names})(?![\w.])")
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    changed = []
    for rel in listed.splitlines():
        path = ROOT / rel
        if rel.startswith(REFERENCE_SKIP) or not (rel.endswith(REFERENCE_SUFFIXES) or path.name in ("Makefile", "run")):
            continue
        if not path.is_file() or path == Path(__file__).resolve():
            continue
        text = path.read_text(errors="surrogateescape")
        fixed = pattern.sub(lambda m: where[m.group(1)], text)
        if fixed != text:
            changed.append(rel)
            if not dry_run:
                path.write_text(fixed, errors="surrogateescape")
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the classification, move nothing")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when a file would move or tests/unit holds a non-unit test")
    args = ap.parse_args(argv)
    known = shared_reasons()
    moves: list[tuple[Path, Path]] = []
    for path in sorted(TESTS.glob("test_*.py")):
        v = classify(path, known)
        print(v.line())
        moves.append((path, (UNIT if v.kind == "unit" else INTEGRATION) / path.name))
    hostile = TESTS / "hostile"
    if hostile.is_dir():
        v = classify_package(hostile, known)
        print(v.line())
        placed = [d / "hostile" for d in (UNIT, INTEGRATION) if (d / "hostile").is_dir()]
        dst = placed[0] if placed else (UNIT if v.kind == "unit" else INTEGRATION) / "hostile"
        if dst.is_dir():  # moved before; a merge brought files back to tests/hostile: join them there
            moves += [(p, dst / p.name) for p in sorted(hostile.iterdir()) if p.name != "__pycache__"]
        else:
            moves.append((hostile, dst))
    for src, dst in moves:
        if dst.exists():
            print(f"error: {dst.relative_to(ROOT)} exists; {src.relative_to(ROOT)} not moved", file=sys.stderr)
            return 70
    if args.check:
        misplaced = [v for v in (classify(p, known) for p in sorted(UNIT.glob("test_*.py"))) if v.kind != "unit"]
        for v in misplaced:
            print(f"error: tests/unit holds a test that is not a unit test: {v.line()}", file=sys.stderr)
        for src, dst in moves:
            print(f"error: {src.relative_to(ROOT)} is not split yet (-> {dst.relative_to(ROOT)})", file=sys.stderr)
        return 1 if moves or misplaced else 0
    for src, dst in moves:
        git_mv(src, dst, args.dry_run)
        print(f"{'would move' if args.dry_run else 'moved'} {src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
    if hostile.is_dir() and not any(p.name != "__pycache__" for p in hostile.iterdir()) and not args.dry_run:
        for cache in hostile.glob("__pycache__"):
            for f in cache.iterdir():
                f.unlink()
            cache.rmdir()
        hostile.rmdir()
    if not moves:
        print("nothing to move: tests/ holds no test_*.py")
    for rel in fix_references(args.dry_run):
        print(f"{'would fix' if args.dry_run else 'fixed'} the test paths named in {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
