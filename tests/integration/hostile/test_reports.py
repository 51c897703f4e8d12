"""Hostile node reports and verify/doctor argument sets, generated from one seed.

Every case runs ``envbuild verify`` or ``envbuild doctor`` in the bounded worker of
:mod:`harness` (memory limit, per-case timeout, the engine out of reach) and must hold the
hostile-input contract: the accepted exit code, no traceback, no hang, no raw control
character on the terminal, at most one line on stderr, and for a single fault exactly one
line naming the file (``unknown: invalid: bad.json: ...`` in verify's output, one
``error:`` line from doctor when nothing could be checked). ``--json`` output must stay
exact JSON. The generator is deterministic (:data:`SEED`): the same cases every run.

A second batch puts a trailing newline into every node-report field that is validated by
a pattern (one test per field, literal messages), and checks that this list covers every
such field of :class:`builder.nodes.report.NodeReport`.
"""

from __future__ import annotations

import json
import random
import re
import types
import typing
from pathlib import Path

import msgspec
import pytest

from builder.core import documents, inputs
from builder.nodes import report as nodereport

from fixtures_nodes import gpu_report, set_path
from hostile.harness import Case, Outcome, assert_held, run_cases

SEED = 8
GOOD = json.dumps(gpu_report(1))

#: Report strings that must print literally and escaped: rich markup, ESC sequences,
#: bidi overrides, other C0/C1 controls, separators.
NASTY = ["[/]", "[bold red]x[/bold red]", "\x1b[2J\x1b[H", "\x1b]0;owned\x07", "abc\u202edcba", "\u2066x\u2069",
         "a\rb\x08c", "line\u2028sep", "\x9b31m", "[link=file:///etc/passwd]x[/link]", ":smile: [i]", "\x00nul"]
#: Free-text fields (no pattern): any string is valid there and must be shown escaped.
FREE_TEXT = ["kernel", "os.pretty_name", "glibc", "python.executable", "gpus.0.name", "image.ref",
             "container.runtime", "nccl.found.0.error", "nccl.loaded.path", "shm.path"]
#: Fields whose change alters no doctor verdict of the checks run here.
DOCTOR_NEUTRAL = ["kernel", "os.pretty_name", "glibc", "python.executable", "gpus.0.name", "image.ref",
                  "container.runtime", "nccl.found.0.error"]
INT_FIELDS = ["gpus.0.index", "gpus.0.memory_total_bytes", "nccl.loaded.code", "shm.size_bytes",
              "network.interfaces.1.mtu", "network.interfaces.1.addresses.0.prefixlen", "nccl.found.0.code"]
REQUIRED = ["schema", "kernel", "os", "glibc", "python", "torch", "nccl", "gpus", "driver", "env", "errors",
            "hostname", "python.version", "torch.version", "torch.cuda_available", "nccl.loaded.version",
            "nccl.found.0.path", "gpus.0.uuid", "network.interfaces.1.loopback", "network.interfaces",
            "shm.size_bytes", "os.id", "network.interfaces.1.addresses.0.family"]
WRONG_TYPES = [("torch.cuda_available", "yes"), ("gpus", {}), ("env", []), ("network.interfaces.1.loopback", "no"),
               ("shm.size_bytes", "1g"), ("nccl.found", "x"), ("os", "debian"), ("gpus.0.index", 1.5),
               ("errors", [1]), ("env.NCCL_DEBUG", 5), ("network", []), ("torch", "2.8.0"), ("python", None),
               ("nccl.pip_packages", ["nvidia-nccl-cu12"]), ("gpus.0", "GPU-1"), ("driver", 570),
               ("network.ip_local_port_range", "32768-60999"), ("gpu_processes", {"pid": 1}), ("kernel", None),
               ("network.interfaces.1.addresses.0.prefixlen", True)]
OUT_OF_RANGE = [("network.ip_local_port_range", [32768, 65536]), ("network.ip_local_port_range", [-1, 5]),
                ("network.ip_local_port_range", [9, 8]), ("shm.size_bytes", -1), ("gpus.0.memory_total_bytes", -5),
                ("gpus.0.index", -1), ("network.interfaces.1.addresses.0.prefixlen", 129),
                ("gpu_processes", [{"gpu_index": 0, "gpu_uuid": "GPU-1", "pid": 0, "used_memory_bytes": 1,
                                    "name": None}]),
                ("gpu_processes", [{"gpu_index": 0, "gpu_uuid": "GPU-1", "pid": 4194305, "used_memory_bytes": 1,
                                    "name": None}]),
                ("network.interfaces.1.mtu", -1)]
BAD_ARGS = [
    ["--hosts=-oProxyCommand=touch pwned"], ["--hosts", "a,-oProxyCommand=x"], ["--hosts=-F/etc/passwd"],
    ["--hosts", "node\n-oProxyCommand=x"], ["--hosts", "node:0"], ["--hosts", "node:99999"],
    ["--hosts", "a b"], ["--hosts", "$(touch pwned)"],
    ["--hosts", "n", "--ssh-option", "ProxyCommand=touch pwned"], ["--hosts", "n", "--ssh-option", "LocalCommand=id"],
    ["--hosts", "n", "--ssh-option", "PermitLocalCommand=yes"], ["--hosts", "n", "--ssh-option", "BatchMode=no"],
    ["--hosts", "n", "--ssh-option", "ProxyJump=-oProxyCommand=x"], ["--hosts", "n", "--ssh-option", "User=a\n"],
    ["--hosts", "n", "--ssh-option", "proxycommand=x"], ["--hosts", "n", "--ssh-config", "cfg\x1b[2J"],
    ["--slurm", "--partition", "debug\n"], ["--slurm", "--partition", "-wnode"], ["--slurm", "--partition", "[/]"],
    ["--slurm", "--srun-arg=--prolog=/tmp/x"], ["--slurm", "--srun-arg=--export=LD_PRELOAD=/x.so"],
    ["--slurm", "--srun-arg=-A"], ["--slurm", "--srun-arg=--account=a\n"],
    ["--hosts", "n", "--python=--version"], ["--hosts", "n", "--python", "python3;id"],
    ["--slurm", "--python", "python3\n"], ["--container", "-x"], ["--container", "../../etc"],
    ["--label", "k=\x1b[2J"], ["--label", "=v"],
]


def _bad(case_id: str, argv: list[str], bad: str | bytes | dict, expect: tuple[int, ...], *,
         good: bool = True, **kw) -> Case:
    files = {"bad.json": bad}
    if good:
        files["good.json"] = GOOD
    return Case(case_id, [*argv, *(["good.json"] if good else []), "bad.json"], expect, files=files, **kw)


def _verify_or_doctor(i: int) -> list[str]:
    """Alternate between ``verify``, ``verify --json`` and a report-only ``doctor``."""
    return [["verify"], ["verify", "--json"], ["doctor", "--checks", "nodes,shm,interface,gpu-uuid,gpu-processes"],
            ["doctor", "--json", "--checks", "nodes,shm,gpu-uuid"]][i % 4]


def _report(changes: dict) -> str:
    doc = gpu_report(2)
    for path, value in changes.items():
        set_path(doc, path, value)
    return json.dumps(doc)


def _without(path: str) -> str:
    doc = gpu_report(2)
    parts = path.split(".")
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    del cur[parts[-1]]
    return json.dumps(doc)


class _Gen:
    """Collects cases and, for single-fault cases, the one fault line each must print."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cases: list[Case] = []
        self.fault: dict[str, str] = {}

    def invalid(self, case_id: str, bad, i: int, message_start: str = "", **kw) -> None:
        """An invalid report run through the ``i``-th command of :func:`_verify_or_doctor`
        (with a good report beside it, or alone for every other doctor run)."""
        argv = _verify_or_doctor(i)
        alone = argv[0] == "doctor" and i % 8 == 2  # doctor on the bad report only: nothing checked
        self.cases.append(_bad(case_id, argv, bad, (3,), good=not alone, **kw))
        if argv == ["verify"]:
            self.fault[case_id] = "unknown: invalid: bad.json: " + message_start
        elif alone:
            self.fault[case_id] = "error: doctor checked nothing: no node answered (1 given): bad.json: " + message_start
        elif "--json" in argv:
            self.fault[case_id] = "json: bad.json: " + message_start


def _nasty_cases(g: _Gen) -> None:
    """Valid reports holding hostile strings: printed literally, escaped."""
    for n, s in enumerate(NASTY):
        for cmd in ("verify", "doctor"):
            field = g.rng.choice(FREE_TEXT if cmd == "verify" else DOCTOR_NEUTRAL)
            argv = ["verify"] if cmd == "verify" else ["doctor", "--checks", "nodes,shm,interface,gpu-uuid,gpu-processes"]
            if g.rng.random() < 0.3:
                argv.insert(1, "--json")
            report = _report({field: s, "errors": [s], "env.NCCL_DEBUG": s})
            g.cases.append(_bad(f"nasty-{n}-{cmd}-{field}", argv, report, (0, 1) if cmd == "verify" else (0,)))


def _json_cases(g: _Gen) -> None:
    """Reports that are not bounded JSON: lone surrogates, deep nesting, huge integers, NaN."""
    for i in range(8):
        where = g.rng.choice(["kernel", "os.pretty_name", "env.NCCL_DEBUG", "errors"])
        text = _report({where: ["X"] if where == "errors" else "X"}).replace('"X"', '"a\\ud83d"', 1)
        if i % 2:
            text = text.replace('"NCCL_SOCKET_IFNAME"', '"NCCL_\\udc00"')
        g.invalid(f"surrogate-{i}", text, i, "not valid JSON: ")
    for i in range(8):
        depth = g.rng.randint(65, 10000)
        text = "[" * depth + "]" * depth if i % 2 else _report({"extra": "X"}).replace('"X"', "[" * depth + "]" * depth)
        g.invalid(f"deep-{i}-{depth}", text, i, "not valid JSON: nesting deeper than 64 levels")
    for i in range(8):
        digits = g.rng.randint(31, 5000)
        text = _report({g.rng.choice(INT_FIELDS): "X"}).replace('"X"', "7" * digits)
        g.invalid(f"bigint-{i}-{digits}", text, i, f"not valid JSON: an integer of {digits} digits (at most 30)")
    for i, const in enumerate(["NaN", "Infinity", "-Infinity", "NaN", "Infinity", "-Infinity"]):
        g.invalid(f"constant-{i}-{const}", _report({g.rng.choice(INT_FIELDS): "X"}).replace('"X"', const), i,
                  f"not valid JSON: {const} is not a number")


def _schema_cases(g: _Gen) -> None:
    """Reports that are JSON but break the schema: types, missing keys, sizes, ranges, patterns."""
    for i, (field, value) in enumerate(WRONG_TYPES):
        g.invalid(f"type-{i}-{field}", _report({field: value}), i)
    for i, field in enumerate(REQUIRED):
        g.invalid(f"missing-{i}-{field}", _without(field), i)
    huge = [("gpus", [gpu_report(1)["gpus"][0]] * 1025, "gpus: has 1025 items, over the limit of 1024"),
            ("errors", ["e"] * 4097, "errors: has 4097 items, over the limit of 4096"),
            ("nccl.found", [gpu_report(1)["nccl"]["found"][0]] * 1025, "nccl.found: has 1025 items"),
            ("network.interfaces.1.addresses", [{"family": "inet", "address": "10.0.0.1", "prefixlen": 8}] * 4097,
             "network.interfaces[1].addresses: has 4097 items"),
            ("env", {f"NCCL_{i}": "1" for i in range(65537)}, "env: has 65537 entries, over the limit of 65536"),
            ("kernel", "k" * 4097, "kernel: is 4097 characters long"),
            ("env.NCCL_DEBUG", "v" * 131073, "env.NCCL_DEBUG: is 131073 characters long")]
    for i, (field, value, message) in enumerate(huge):
        g.invalid(f"huge-{i}-{field}", _report({field: value}), i, message)
    for i, (field, value) in enumerate(OUT_OF_RANGE):
        g.invalid(f"range-{i}-{field}", _report({field: value}), i)
    for i, (field, value) in enumerate([("driver", "570.124.06\n"), ("hostname", "node-2\n"),
                                        ("python.version", "3.12.3\n"), ("gpus.0.uuid", "GPU-1\x1b[2J"),
                                        ("network.interfaces.1.name", "eth0\n"), ("image.digest", "sha256:\n")]):
        g.invalid(f"pattern-{i}-{field}", _report({field: value}), i, re.sub(r"\.([0-9]+)(?=\.|\Z)", r"[\1]", field))


def _file_cases(g: _Gen, big_file: Path) -> None:
    """Files that are not a readable node report: too big, FIFO, devices, missing, not UTF-8 JSON."""
    files = [
        ("oversize", {"symlink": str(big_file)}, f"is {big_file.stat().st_size} bytes, over the 16777216-byte limit"),
        ("fifo", {"fifo": True}, "is not a regular file (a FIFO)"),
        ("dev-zero", {"symlink": "/dev/zero"}, "is not a regular file (a character device)"),
        ("dev-null", {"symlink": "/dev/null"}, "is not a regular file (a character device)"),
        ("dangling", {"symlink": "/nonexistent/x.json"}, "no such node report"),
        ("empty", b"", "not valid JSON: Expecting value"),
        ("latin1", b'{"hostname": "n\xe9"}', "is not UTF-8 text (byte 15)"),
        ("binary", bytes(range(256)) * 4, "is not UTF-8 text"),
        ("not-json", "kernel: 6.8\n", "not valid JSON: Expecting value"),
        ("top-list", "[1, 2]", "'list' is not a JSON object (a node report)"),
    ]
    for i, (name, content, message) in enumerate(files):
        g.invalid(f"file-{name}", content, i, message, timeout_s=30)
    g.cases.append(Case("file-directory", ["verify", "good.json", "d"], (3,), files={"good.json": GOOD, "d/x": "{}"}))
    g.fault["file-directory"] = "unknown: invalid: d: is a directory, not a node report"
    g.cases.append(Case("file-missing-doctor", ["doctor", "--checks", "shm", "missing.json"], (3,)))
    g.fault["file-missing-doctor"] = "error: doctor checked nothing: no node answered (1 given): missing.json: no such"


def _argument_cases(g: _Gen) -> None:
    """20k environment entries (linear, bounded in time), hostile arguments (64 before
    anything runs) and doctor runs that can check nothing (3) or ask for nothing (64)."""
    for cmd in ("verify", "doctor"):
        docs = {}
        for k in (1, 2):
            doc = gpu_report(k)
            doc["env"] = {f"NCCL_KNOB_{j}": str(j * k) for j in range(20000)}
            docs[f"n{k}.json"] = json.dumps(doc)
        argv = ["verify", "n1.json", "n2.json"] if cmd == "verify" else ["doctor", "--checks", "shm,gpu-uuid",
                                                                          "n1.json", "n2.json"]
        g.cases.append(Case(f"env-20k-{cmd}", argv, (1,) if cmd == "verify" else (0,), files=docs, timeout_s=60))
    for i, args in enumerate(BAD_ARGS):
        cmd = "verify" if i % 2 == 0 else "doctor"
        g.cases.append(Case(f"args-{i}-{cmd}", [cmd, *args], (64,)))
    for i, argv in enumerate([["doctor", "--checks", "port", "good.json", "b.json"],
                              ["doctor", "--checks", "straggler,port", "good.json"],
                              ["doctor", "--checks", "shm", "--min-shm", "1g\n", "good.json"],
                              ["doctor", "--checks", "shm"]]):
        g.cases.append(Case(f"doctor-nothing-{i}", argv, (3,) if i < 2 else (64,),
                            files={"good.json": GOOD, "b.json": json.dumps(gpu_report(2))}))
    for argv in (["doctor", "--checks", "stale-containers"], ["doctor", "--checks", "stale-containers", "--fix"],
                 ["doctor", "--json", "--checks", "stale-containers"]):
        case_id = "doctor-no-engine-" + "-".join(a.strip("-") for a in argv[1:])  # the worker's engine is away
        g.cases.append(Case(case_id, argv, (3,)))
        g.fault[case_id] = "error: doctor checked nothing: no nodes given; stale-containers: no Docker engine here"
    g.cases.append(Case("doctor-no-source", ["doctor"], (64,)))  # nothing to check: a usage error


def generate(big_file: Path) -> tuple[list[Case], dict[str, str]]:
    """The hostile cases (seeded: the same every run) and, for single-fault cases, the
    start of the one fault line each must print (``verify``: a stdout line ``unknown:
    invalid: bad.json: ...``; ``doctor`` on the bad file alone: its stderr line; ``--json``:
    one finding or detail, prefixed ``json: `` here)."""
    g = _Gen(SEED)
    _nasty_cases(g)
    _json_cases(g)
    _schema_cases(g)
    _file_cases(g, big_file)
    _argument_cases(g)
    return g.cases, g.fault


@pytest.fixture(scope="module")
def big_file(tmp_path_factory) -> Path:
    """A sparse file one byte over the node-report limit (never read: refused by size)."""
    path = tmp_path_factory.mktemp("hostile") / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(inputs.MAX_REPORT_BYTES + 1)
    return path


@pytest.fixture(scope="module")
def outcomes(big_file) -> tuple[list[Case], dict[str, str], dict[str, Outcome]]:
    cases, fault = generate(big_file)
    return cases, fault, run_cases(cases)


def test_the_generator_is_deterministic_and_large_enough(big_file):
    a, _ = generate(big_file)
    b, _ = generate(big_file)
    assert [(c.id, c.argv, sorted(c.files)) for c in a] == [(c.id, c.argv, sorted(c.files)) for c in b]
    assert len(a) >= 110
    assert len({c.id for c in a}) == len(a)


def test_every_hostile_case_holds(outcomes):
    cases, fault, results = outcomes
    problems = []
    for case in cases:
        out = results[case.id]
        try:
            assert_held(case, out)
            _assert_fault_line(case, out, fault.get(case.id))
        except AssertionError as e:
            problems.append(str(e)[:600])
    assert not problems, f"{len(problems)} of {len(cases)} cases broke the contract:\n" + "\n".join(problems)


def _assert_fault_line(case: Case, out: Outcome, start: str | None) -> None:
    if "--json" in case.argv and out.code != 64 and not out.stderr:
        doc = json.loads(out.stdout)  # exact JSON, whatever the reports held
        if start and start.startswith("json: "):
            messages = [f["message"] for f in doc.get("findings", [])] + \
                       [d for c in doc.get("checks", []) for d in c["details"]]
            hits = [m for m in messages if m.startswith(start[len("json: "):])]
            assert len(hits) == 1, f"{case.id}: {start!r} not among {messages!r}"
        return
    if start is None:
        return
    lines = out.stderr.splitlines() if start.startswith("error: ") else out.stdout.splitlines()
    hits = [line for line in lines if line.startswith(start)]
    faults = [line for line in lines if line.startswith(("unknown: ", "error: "))]
    assert len(hits) == 1 and len(faults) == 1, f"{case.id}: expected one line starting {start!r}, got {faults!r}"


def test_nasty_strings_reach_the_terminal_escaped(outcomes):
    cases, _, results = outcomes
    human = [c for c in cases if c.id.startswith("nasty-") and c.argv[0] == "verify" and "--json" not in c.argv]
    assert len(human) >= 4
    for case in human:  # env.NCCL_DEBUG holds the nasty string on node-2 only: a difference row
        out = results[case.id]
        assert out.code == 1, (case.id, out.stdout[-300:])
        rows = [" ".join(line.replace("│", " ").split()) for line in out.stdout.splitlines()]
        assert any(r.startswith("should-match env.NCCL_DEBUG ") or r.startswith("warn: should-match: env.NCCL_DEBUG")
                   for r in rows), (case.id, rows)
    markup = [c for c in human if c.id.startswith("nasty-0-")]
    for case in markup:  # "[/]" printed as it is, never read as markup
        assert "[/]" in results[case.id].stdout


# --- a trailing newline in every field validated by a pattern -------------------------------------

NEWLINE_FIELDS = [
    ("hostname", "hostname: 'node-2\\n' is not a host name (letters, digits, _ . -)"),
    ("python.version", "python.version: '3.12.3\\n' is not a Python version"),
    ("torch.version", "torch.version: '2.8.0+cu128\\n' is not a version (digits, letters, . + _ ! -)"),
    ("torch.cuda", "torch.cuda: '12.8\\n' is not a CUDA version like 12.8"),
    ("torch.cudnn", "torch.cudnn: '91002\\n' is not a cuDNN version number like 91002"),
    ("torch.nccl_compiled", "torch.nccl_compiled: '2.27.3\\n' is not an X.Y.Z version"),
    ("nccl.loaded.version", "nccl.loaded.version: '2.27.3\\n' is not an X.Y.Z version"),
    ("nccl.found.0.version", "nccl.found[0].version: '2.27.3\\n' is not an X.Y.Z version"),
    ("nccl.pip_packages.nvidia-nccl-cu12",
     "nccl.pip_packages.nvidia-nccl-cu12: '2.27.3\\n' is not a version (digits, letters, . + _ ! -)"),
    ("gpus.0.uuid", "gpus[0].uuid: 'GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02\\n' is not a GPU UUID like GPU-8f6a1c52-..."),
    ("gpus.0.pci_bus_id", "gpus[0].pci_bus_id: '00000000:18:00.0\\n' is not a PCI bus id like 00000000:18:00.0"),
    ("gpus.0.pci_id", "gpus[0].pci_id: '10de:2330\\n' is not a PCI vendor:device id like 10de:2330"),
    ("driver", "driver: '570.124.06\\n' is not a driver version like 570.124.06"),
    ("network.interfaces.1.name",
     "network.interfaces[1].name: 'eth0\\n' is not an interface name (at most 15 characters, no / : or blank)"),
    ("network.interfaces.1.addresses.0.family",
     "network.interfaces[1].addresses[0].family: 'inet\\n' is not 'inet' or 'inet6'"),
    ("network.interfaces.1.addresses.0.address",
     "network.interfaces[1].addresses[0].address: '10.0.0.12\\n' is not an IP address"),
    ("network.default_route_interface",
     "network.default_route_interface: 'eth0\\n' is not an interface name (at most 15 characters, no / : or blank)"),
    ("network.hostname_addresses.0", "network.hostname_addresses[0]: '10.0.0.12\\n' is not an IP address"),
    ("image.digest", "image.digest: 'sha256:" + "ab" * 32 + "\\n' is not a digest like sha256:<64 hex>"),
    ("image.id", "image.id: 'sha256:" + "cd" * 32 + "\\n' is not a digest like sha256:<64 hex>"),
    ("gpu_processes.0.gpu_uuid",
     "gpu_processes[0].gpu_uuid: 'GPU-8f6a1c52-0d1e-4a7b-9c3e-1f2a3b4c5d02\\n' is not a GPU UUID like GPU-8f6a1c52-..."),
    ("env key", "env.NCCL_SOCKET_IFNAME\\x0a: 'NCCL_SOCKET_IFNAME\\n' is not an environment variable name "
                "(printable, no = or blank)"),
    ("nccl.pip_packages key", "nccl.pip_packages.nvidia-nccl-cu12\\x0a: 'nvidia-nccl-cu12\\n' is not a package name"),
    ("schema", "schema: 'envbuild.probe/1\\n' is not a node-report schema this envbuild reads (envbuild.probe/1)"),
    ("scope", "scope: 'image\\n' is not 'host' or 'image'"),
    ("probed_at", "probed_at: '2026-12-01T12:00:00Z\\n' is not a UTC time like 2025-06-01T12:00:00Z"),
    ("nccl.net_plugin.api", "nccl.net_plugin.api: 'v8\\n' is not a plugin API version like v8"),
    ("nccl.net_plugin.sha256",
     "nccl.net_plugin.sha256: 'sha256:" + "ef" * 32 + "\\n' is not a sha256:<64 hex> digest"),
    ("nccl.net_plugin.version", "nccl.net_plugin.version: '1.2\\n' is not a version (digits, letters, . + _ ! -)"),
    ("cuda_runtime.loaded.0.version", "cuda_runtime.loaded[0].version: '12.8\\n' is not a CUDA version like 12.8"),
]


def _with_newline(field: str) -> dict:
    doc = gpu_report(2)
    doc["gpu_processes"] = [{"gpu_index": 0, "gpu_uuid": doc["gpus"][0]["uuid"], "pid": 4242,
                             "used_memory_bytes": 1 << 20, "name": "python3"}]
    doc.update(scope="image", probed_at="2026-12-01T12:00:00Z",  # the issue-11 fields, all set
               cuda_runtime={"loaded": [{"path": "/usr/lib/libcudart.so.12", "version": "12.8"}]})
    doc["nccl"]["net_plugin"] = {"requested": None, "path": "/usr/lib/libnccl-net.so",
                                 "realpath": "/usr/lib/libnccl-net.so.1.2", "sha256": "sha256:" + "ef" * 32,
                                 "name": "IB", "api": "v8", "version": "1.2"}
    if field.endswith(" key"):
        mapping = doc
        for p in field[:-4].split("."):
            mapping = mapping[p]
        key = next(iter(mapping))
        mapping[key + "\n"] = mapping.pop(key)
        return doc
    cur, parts = doc, field.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    last = int(parts[-1]) if isinstance(cur, list) else parts[-1]
    cur[last] = cur[last] + "\n"
    return doc


@pytest.fixture(scope="module")
def newline_outcomes() -> dict[str, Outcome]:
    cases = [Case(f"newline-{field}", ["verify", "--json", "bad.json"], (3,),
                  files={"bad.json": json.dumps(_with_newline(field))}) for field, _ in NEWLINE_FIELDS]
    twin = Case("newline-twin", ["verify", "--json", "bad.json"], (0,), files={"bad.json": json.dumps(_with_newline(
        "kernel"))})  # a trailing newline in a free-text field is a valid value, shown escaped
    return run_cases([*cases, twin])


@pytest.mark.parametrize("field, message", NEWLINE_FIELDS, ids=[f for f, _ in NEWLINE_FIELDS])
def test_trailing_newline_is_refused(newline_outcomes, field, message):
    out = newline_outcomes[f"newline-{field}"]
    assert (out.code, out.traceback, out.stderr) == (3, None, "")
    assert [f["message"] for f in json.loads(out.stdout)["findings"]] == [f"bad.json: {message}"]


def test_trailing_newline_in_free_text_is_a_value(newline_outcomes):
    out = newline_outcomes["newline-twin"]
    assert (out.code, json.loads(out.stdout)["findings"]) == (0, [])


def _pattern_fields(ann, path: str = "") -> set[str]:
    """Every field path of the model ``ann`` validated by a pattern or a fixed set of
    values (lists as ``.0``, map values ``.*``, map keys ``key``)."""
    metas = []
    while True:  # through Optional and Annotated
        if typing.get_origin(ann) in (typing.Union, types.UnionType):
            ann = next(a for a in typing.get_args(ann) if a is not type(None))
        elif typing.get_origin(ann) is typing.Annotated:
            ann, *more = typing.get_args(ann)
            metas += more
        else:
            break
    if typing.get_origin(ann) is typing.Literal or any(getattr(m, "pattern", None) for m in metas):
        return {path}
    if isinstance(ann, type) and issubclass(ann, msgspec.Struct):
        hints = typing.get_type_hints(ann, include_extras=True)
        return set().union(*(_pattern_fields(hints[f.name], f"{path}.{f.encode_name}" if path else f.encode_name)
                             for f in msgspec.structs.fields(ann)))
    if typing.get_origin(ann) is list:
        return _pattern_fields(typing.get_args(ann)[0], f"{path}.0")
    if typing.get_origin(ann) is dict:
        key, value = typing.get_args(ann)
        out = _pattern_fields(value, f"{path}.*")
        return out | ({f"{path} key"} if key is not documents.Key and _pattern_fields(key) else set())
    return set()


def test_every_pattern_field_has_a_newline_test():
    tested = {re.sub(r"\.[0-9]+(?=\.|\Z)", ".0", f) for f, _ in NEWLINE_FIELDS}
    tested = {"nccl.pip_packages.*" if f.startswith("nccl.pip_packages.") and " " not in f else f for f in tested}
    assert _pattern_fields(nodereport.NodeReport) | {"schema"} == tested
