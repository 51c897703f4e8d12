"""Size limits of ``builder/``: no module over 600 lines, no function or method over 80 lines,
at most :data:`MAX_TOTAL_LINES` lines in all, docstrings under :data:`MAX_DOCSTRING_SHARE` of them. A module's length is its number of lines; a function's runs from its ``def`` line to
its last line (decorators not counted; a nested function or a method is measured on its own
and also counts in the function around it). Every offender is named in one failure message,
as ``path:line: name is N lines``. The twin plants offenders (and ones exactly at the limits)
in a copy of the tree, which must report exactly those over the limits."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
#: The budget of builder/ (``wc -l`` of its .py files) with every feature of this round.
MAX_TOTAL_LINES = 30_000
#: Module, class and function docstrings (by ``ast``) as a share of those lines.
MAX_DOCSTRING_SHARE = 0.15


class _Functions(ast.NodeVisitor):
    """``(line, qualified name, length in lines)`` of every function and method of a module:
    ``name``, ``Class.method``, ``outer.<locals>.inner``."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, int]] = []
        self._scope: list[str] = []

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        name = ".".join([*self._scope, node.name])
        assert node.end_lineno is not None
        self.found.append((node.lineno, name, node.end_lineno - node.lineno + 1))
        self._scope += [node.name, "<locals>"]
        self.generic_visit(node)
        del self._scope[-2:]

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()


def offenders(package: Path) -> list[str]:
    """Every module of ``package`` over :data:`MAX_MODULE_LINES` and every function over
    :data:`MAX_FUNCTION_LINES`, one line each, sorted by path and line; paths relative to the
    folder that holds ``package``."""
    out: list[tuple[str, int, str]] = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append((rel, 0, f"{rel}: {lines} lines (at most {MAX_MODULE_LINES})"))
        visitor = _Functions()
        visitor.visit(ast.parse(text, filename=rel))
        out += [(rel, line, f"{rel}:{line}: {name} is {length} lines (at most {MAX_FUNCTION_LINES})")
                for line, name, length in visitor.found if length > MAX_FUNCTION_LINES]
    return [message for _rel, _line, message in sorted(out)]


def test_no_module_or_function_of_builder_is_over_the_limits():
    found = offenders(ROOT / "builder")
    assert not found, f"{len(found)} over the size limits:\n" + "\n".join(found)


def _function(name: str, lines: int, indent: str = "") -> str:
    """Source of a function of exactly ``lines`` lines (def line included)."""
    body = [f"{indent}    x{i} = {i}" for i in range(lines - 2)]
    return "\n".join([f"{indent}def {name}():", *body, f"{indent}    return 0"]) + "\n"


def test_planted_offenders_in_a_copy_are_all_reported(tmp_path):
    package = tmp_path / "builder"  # one package of the tree is enough (the whole: the test above)
    shutil.copytree(ROOT / "builder" / "core", package / "core", ignore=shutil.ignore_patterns("__pycache__"))
    assert offenders(package) == []
    planted = package / "core" / "planted.py"
    planted.write_text(
        '"""Planted by tests/test_limits.py."""\n\n\n'  # lines 1-3
        + _function("at_the_limit", 80)  # lines 4-83
        + "\n\n" + _function("too_long", 81)  # lines 86-166
        + "\n\nclass Holder:\n"  # line 169
        + _function("method", 81, "    ")  # lines 170-250
        + "\n" + "    @staticmethod\n" + _function("short", 3, "    ")  # decorator 252, def 253
        + "\n\n" + "def outer():\n" + _function("inner", 81, "    ") + "    return inner\n"  # 258, 259
    )
    (package / "core" / "planted_long.py").write_text("x = 1\n" * 601)
    (package / "core" / "planted_at_limit.py").write_text("x = 1\n" * 600)
    assert offenders(package) == [
        "builder/core/planted.py:86: too_long is 81 lines (at most 80)",
        "builder/core/planted.py:170: Holder.method is 81 lines (at most 80)",
        "builder/core/planted.py:258: outer is 83 lines (at most 80)",
        "builder/core/planted.py:259: outer.<locals>.inner is 81 lines (at most 80)",
        "builder/core/planted_long.py: 601 lines (at most 600)",
    ]


def size(package: Path) -> tuple[int, int]:
    """``(lines, docstring lines)`` of the .py files under ``package``."""
    lines = docs = 0
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        lines += text.count("\n")
        for node in ast.walk(ast.parse(text)):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                docs += (body[0].end_lineno or body[0].lineno) - body[0].lineno + 1
    return lines, docs


def test_builder_holds_its_line_budget_and_docstring_share():
    lines, docs = size(ROOT / "builder")
    assert lines <= MAX_TOTAL_LINES, f"builder/ is {lines} lines (budget {MAX_TOTAL_LINES})"
    assert docs < MAX_DOCSTRING_SHARE * lines, f"docstrings are {docs} of {lines} lines"


def test_a_planted_docstring_and_module_are_counted(tmp_path):
    (tmp_path / "a.py").write_text('"""One\ntwo\nthree."""\n\n\ndef f():\n    """Doc."""\n    return 1\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("x = 1\n" * 10)
    assert size(tmp_path) == (18, 4)
