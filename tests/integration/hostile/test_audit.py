"""Hostile files through ``envbuild audit`` (the hostile-input rules of issue 8): a huge
file, a FIFO, a device, a folder, a dangling link, non-UTF-8 bytes, control characters, a
10,000-line continuation, ``${...}`` nested 100,000 deep, an ARG expansion bomb, 10,000
stages, unterminated quotes and here-documents, malformed ``--to-recipe`` targets.

Each runs in the bounded worker of :mod:`hostile.harness` (address space limited, a
per-case timeout): the expected exit code, the expected one line for a fault the file
cannot be audited with, no traceback, no hang, every output line escaped and short.
"""

from __future__ import annotations

import pytest

from hostile.harness import Case, assert_held, run_cases

OK = "FROM debian:bookworm-slim\nRUN pip install torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu\n"
LIMIT = 1 << 20


def _cont(n: int) -> str:
    return "FROM debian:bookworm-slim\nRUN echo \\\n" + "".join(f"  word{i} \\\n" for i in range(n)) + \
        " && pip install torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu\n"


#: (id, files, argv after `audit`, exit code, the one stderr line it must end with; None: several lines)
CASES: list[tuple[str, dict, list[str], int, str | None]] = [
    ("over-the-limit", {"Dockerfile": "FROM debian:12\n" + "#" * LIMIT}, ["Dockerfile"], 3,
     f"error: Dockerfile: is {LIMIT + 15} bytes, over the {LIMIT}-byte limit of a file to audit"),
    ("at-the-limit", {"Dockerfile": OK + "#" * (LIMIT - len(OK))}, ["Dockerfile"], 0, None),
    ("fifo", {"Dockerfile": {"fifo": True}}, ["Dockerfile"], 3,
     "error: Dockerfile: is not a regular file (a FIFO); give a file to audit"),
    ("device", {}, ["/dev/zero"], 3, "error: /dev/zero: is not a regular file (a character device); give a file to audit"),
    ("link-to-device", {"Dockerfile": {"symlink": "/dev/zero"}}, ["Dockerfile"], 3,
     "error: Dockerfile: is not a regular file (a character device); give a file to audit"),
    ("folder", {"d/x": "x"}, ["d"], 3, "error: d: is a directory, not a file to audit"),
    ("dangling-link", {"Dockerfile": {"symlink": "nowhere"}}, ["Dockerfile"], 3, "error: Dockerfile: no such file to audit"),
    ("missing", {}, ["Dockerfile"], 3, "error: Dockerfile: no such file to audit"),
    ("not-utf8", {"Dockerfile": b"FROM debian:12\nRUN echo \xff\xfe\n"}, ["Dockerfile"], 3,
     "error: Dockerfile: line 2: is not UTF-8 text (byte 24)"),
    ("escape-sequence", {"Dockerfile": "FROM debian:12\nRUN echo \x1b[2J\n"}, ["Dockerfile"], 3,
     "error: Dockerfile: line 2: holds a control character (\\x1b); a build file is printable text"),
    ("nul", {"Singularity.def": "Bootstrap: docker\nFrom: debian:12\n%post\n  echo \x00\n"}, ["Singularity.def"], 3,
     "error: Singularity.def: line 4: holds a control character (\\x00); a build file is printable text"),
    ("bidi-override", {"Dockerfile": "FROM debian:12\n# \u202e txet\nRUN true\n"}, ["Dockerfile"], 3,
     "error: Dockerfile: line 2: holds a control character (\\u202e); a build file is printable text"),
    ("lone-cr", {"Dockerfile": "FROM debian:12\rRUN pip install torch\n"}, ["Dockerfile"], 3,
     "error: Dockerfile: line 1: holds a control character (\\x0d); a build file is printable text"),
    ("crlf", {"Dockerfile": OK.replace("\n", "\r\n")}, ["Dockerfile"], 0, None),
    ("continuation-10k", {"Dockerfile": _cont(10_000)}, ["Dockerfile"], 0, None),
    ("continuation-10k-post", {"x.def": "Bootstrap: docker\nFrom: debian:bookworm-slim\n%post\n" +
                               _cont(10_000).split("\n", 1)[1].replace("RUN ", "  ")}, ["x.def"], 0, None),
    ("nested-100k", {"Dockerfile": "FROM debian:12\nARG E=\nRUN echo " + "${E:-" * 100_000 + "x" + "}" * 100_000 + "\n" + OK},
     ["Dockerfile"], 0, None),
    ("arg-bomb", {"Dockerfile": "FROM debian:12\nARG A0=" + "x" * 1000 + "\n" +
                  "".join(f"ARG A{i + 1}=" + f"$A{i}" * 16 + "\n" for i in range(30)) +
                  "RUN pip install $A30 " + "$A3" * 50_000 + "\n"}, ["Dockerfile"], 1, None),
    ("stages-10k", {"Dockerfile": "".join(f"FROM debian:12 AS s{i}\nRUN pip install x{i}==1\n" for i in range(10_000)) +
                    "FROM s9999\n"}, ["Dockerfile"], 1, None),
    ("unterminated-quote", {"Dockerfile": "FROM debian:12\nRUN pip install 'torch==2.13.0+cpu\n"}, ["Dockerfile"], 1, None),
    ("unterminated-heredoc", {"Dockerfile": "FROM debian:12\nRUN <<EOF\npip install torch\n"}, ["Dockerfile"], 2, None),
    ("only-a-keyword", {"Dockerfile": "FROM\n"}, ["Dockerfile"], 3, "error: Dockerfile: line 1: 'FROM' has no arguments"),
    ("empty", {"Dockerfile": ""}, ["Dockerfile"], 3,
     "error: Dockerfile: line 1: no FROM instruction; a Dockerfile starts its first stage with FROM"),
    ("empty-definition", {"x.def": "\n\n"}, ["x.def"], 3,
     "error: x.def: line 1: no Bootstrap: header; a definition starts with Bootstrap: (and From:)"),
    ("duplicate-stage", {"Dockerfile": "FROM debian:12 AS a\nFROM debian:12 AS A\n"}, ["Dockerfile"], 3,
     "error: Dockerfile: line 2: duplicate stage name 'a' (first at line 1)"),
    ("unknown-instruction", {"Dockerfile": "FROM debian:12\nPIP install torch\n"}, ["Dockerfile"], 3,
     "error: Dockerfile: line 2: unknown instruction 'PIP'"),
    ("control-in-file-name", {}, ["Docker\x1bfile"], 64,
     "envbuild audit: argument FILE: 'Docker\\x1bfile' is not a file (1-4096 characters without control characters)"),
    ("to-recipe-newline", {"Dockerfile": OK}, ["Dockerfile", "--to-recipe", "r.yaml\n"], 64,
     "envbuild audit: argument --to-recipe: 'r.yaml\\n' is not a file name (1-4096 characters without control "
     "characters, not starting with -)"),
    ("to-recipe-folder", {"Dockerfile": OK, "r.yaml/x": "x"}, ["Dockerfile", "--to-recipe", "r.yaml"], 3, None),
    ("build-arg-escape", {"Dockerfile": OK}, ["Dockerfile", "--build-arg", "A=\x1b[2J"], 64,
     "envbuild audit: argument --build-arg: 'A=\\x1b[2J' is not NAME=VALUE"),
    ("value-with-escapes-shown", {"Dockerfile": "FROM debian:12\nENV NCCL_SOCKET_IFNAME=lo\\\\x1b\n" + OK.split("\n", 1)[1]},
     ["Dockerfile"], 0, None),
]
CASE_OBJECTS = [Case(cid, ["audit", *argv], (code,), files=files, max_stderr_lines=1 if line else None, timeout_s=30)
                for cid, files, argv, code, line in CASES]


@pytest.fixture(scope="module")
def outcomes():
    return run_cases(CASE_OBJECTS)


@pytest.mark.parametrize("case, spec", list(zip(CASE_OBJECTS, CASES, strict=True)), ids=[c[0] for c in CASES])
def test_hostile_file_holds(outcomes, case, spec):
    outcome = outcomes[case.id]
    assert_held(case, outcome)
    line = spec[4]
    if line is not None:
        assert outcome.stderr.splitlines() == [line]
        assert outcome.stdout == ""
    assert outcome.seconds < 20, f"{case.id} took {outcome.seconds} s"
