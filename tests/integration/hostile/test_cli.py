"""Hostile command lines: every subcommand's options fed values a user, a script or an
attacker may pass, checked for the exit code, one escaped line, no traceback and no hang.

A seeded generator (:func:`generate`, deterministic for :data:`SEED`) crosses each value
option of every subcommand (the table :data:`OPTIONS`: the option, the class of its value
and a valid value) with the hostile values of that class (:func:`hostile_values`):
a trailing newline (Python's ``$`` matches before it), CR, NUL, ESC sequences, a bidi
override, DEL, a line separator, a lone surrogate, an over-long value, option-looking values,
huge and negative numbers, NaN/inf spellings, Unicode digits. The generator chooses the
``--opt=value`` or ``--opt value`` form and where the option sits among the valid ones.
Each is a usage error: exit 64, before anything is contacted (the harness points
``DOCKER_HOST`` at a socket that does not exist, so a case that got further would be 3).

Input files that cannot be read (missing, a directory, a FIFO without writer, ``/dev/zero``,
a symlink to it, over the size limit) are exit 3, named in the one line, without blocking.
Unknown options and commands, and options that do not go together, are 64.
"""

from __future__ import annotations

import os
import random

import pytest

from hostile.harness import ROOT, Case, assert_held, run_cases

SEED = 20260801
IMAGE = "envbuild/cpu-torch2:0123456789ab"
SUBCOMMANDS = {"check", "render", "build", "certify", "make", "probe", "verify", "doctor", "base", "lock", "push",
               "pull", "k8s", "audit", "report"}

#: (command line before the option, option or None for the last positional, value class,
#:  a valid value, command line after the option).
OPTIONS: list[tuple[list[str], str | None, str, str, list[str]]] = [
    ([], "--recipes-dir", "path", "recipes", ["check", "cpu-torch2"]),
    ([], "--images-dir", "path", "images", ["render", "cpu-torch2"]),
    (["check"], None, "path", "cpu-torch2", []),
    (["render"], None, "path", "cpu-torch2", []),
    (["lock", "cpu-torch2"], "--base", "pattern", "debian:bookworm-slim", []),
    (["build", "cpu-torch2"], "--ca-cert", "path", "ca.pem", []),
    (["build", "cpu-torch2"], "--wheels", "path", "wheels", []),
    (["build", "cpu-torch2"], "--base", "pattern", "debian:bookworm-slim", []),
    (["certify"], None, "pattern", IMAGE, []),
    (["certify", IMAGE], "--nodes", "int", "2", []),
    (["certify", IMAGE], "--gpus-per-node", "int", "0", []),
    (["certify", IMAGE], "--port", "int", "29500", []),
    (["certify", IMAGE], "--timeout", "int", "60", []),
    (["certify", IMAGE], "--min-busbw", "float", "1.5", []),
    (["certify", IMAGE], "--sizes", "int", "8", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--partition", "pattern", "debug", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--time-limit", "pattern", "10", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--container-image", "pattern", "/shared/x.sqsh", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--slurm-dir", "path", "/shared/runs", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--slurm-nodes", "int", "1", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--sbatch-arg", "pattern", "--account=ml", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--socket-ifname", "pattern", "ib0", []),
    (["certify", IMAGE, "--launcher", "slurm"], "--pending-timeout", "float", "60", []),
    (["make", "cpu-torch2", "--launcher", "slurm"], "--time-limit", "pattern", "1:00:00", []),
    (["make"], None, "path", "cpu-torch2", []),
    (["report"], None, "path", "x.json", []),
    (["report", "x.json"], "--out", "path", "x.html", []),
    (["doctor"], "--port", "int", "29500", []),
    (["doctor"], "--min-shm", "pattern", "256m", []),
    (["doctor"], "--straggler-ratio", "float", "1.5", []),
    (["doctor"], "--stale-after", "float", "3600", []),
    (["doctor"], "--master", "text", "node-0", []),
    (["doctor"], "--stale-label", "text", "envbuild.test-case=x", []),
    (["verify", "x.json"], "--timeout", "float", "10", []),
    (["verify", "x.json"], "--connect-timeout", "int", "5", []),
    (["push"], None, "pattern", "cpu-torch2", ["--registry", "registry.invalid:5000"]),
    (["push", "cpu-torch2"], "--registry", "pattern", "registry.invalid:5000", []),
    (["push", "cpu-torch2", "--registry", "registry.invalid:5000"], "--image", "pattern", IMAGE, []),
    (["push", "cpu-torch2", "--registry", "registry.invalid:5000"], "--namespace", "pattern", "envbuild", []),
    (["push", "cpu-torch2", "--registry", "registry.invalid:5000"], "--sign-key", "path", "site.key", []),
    (["push", "cpu-torch2", "--registry", "registry.invalid:5000"], "--registry-ca", "path", "ca.pem", []),
    (["pull"], None, "text", "cpu-torch2", ["--registry", "registry.invalid:5000"]),
    (["pull", "cpu-torch2"], "--registry", "pattern", "registry.invalid:5000", []),
    (["pull", "cpu-torch2", "--registry", "registry.invalid:5000"], "--verify-key", "path", "site.pub", []),
    (["pull", "cpu-torch2", "--registry", "registry.invalid:5000", "--format", "sif"], "--output", "dashless", "x.sif", []),
    (["pull", "cpu-torch2", "--registry", "registry.invalid:5000"], "--namespace", "pattern", "envbuild", []),
    (["k8s", "render", "cpu-torch2", "--out", "k8s"], "--runtime", "pattern", "torch-distributed", []),
    (["k8s", "render", "cpu-torch2", "--out", "k8s"], "--run-id", "text", "run1", []),
    (["k8s", "render", "cpu-torch2", "--out", "k8s"], "--ttl", "int", "3600", []),
    (["k8s", "render", "cpu-torch2", "--out", "k8s"], "--env", "text", "A=1", []),
    (["k8s", "render", "cpu-torch2", "--out", "k8s"], "--namespace", "pattern", "default", []),
    (["k8s", "render", "cpu-torch2", "--out", "k8s"], "--context", "text", "kind-x", []),
    (["k8s", "render", "cpu-torch2"], "--out", "path", "k8s", []),
    (["base", "bootstrap"], "--suite", "pattern", "bookworm", []),
    (["base", "bootstrap"], "--stands-for", "pattern", "debian:bookworm-slim", []),
    (["audit"], None, "path", "Dockerfile", []),
    (["audit", "Dockerfile"], "--to-recipe", "dashless", "x.yaml", []),
    (["audit", "Dockerfile"], "--driver", "pattern", "570.26", []),
    (["audit", "Dockerfile"], "--build-arg", "text", "A=1", []),
]

#: Values each class refuses whatever the option (a number class refuses number-like junk).
_CONTROL = [("newline", "{v}\n"), ("cr", "{v}\r"), ("nul", "{v}\x00"), ("esc", "{v}\x1b[2J\x1b]0;pwned\x07"),
            ("bidi", "\u202e{v}"), ("del", "{v}\x7f"), ("line-separator", "{v}\u2028"),
            ("surrogate", "{v}\ud800"), ("tab", "{v}\t"), ("c1", "{v}\x9b31m")]
_NUMBERS = [("nan", "nan"), ("NaN", "NaN"), ("inf", "inf"), ("-inf", "-inf"), ("huge-exp", "1e999"),
            ("negative", "-5"), ("huge", "9" * 5000), ("hex", "0x10"), ("underscore", "1_000"),
            ("blank", " 5"), ("arabic-digit", "\u0665"), ("fullwidth-digit", "\uff15"), ("empty", "")]


def hostile_values(cls: str, valid: str) -> list[tuple[str, str]]:
    """``(name, value)`` pairs that a value of class ``cls`` (``int``, ``float``, ``pattern``,
    ``path``, ``dashless`` (a path handed to another program), ``text``) must refuse."""
    out = [(name, t.format(v=valid)) for name, t in _CONTROL]
    if cls in ("int", "float"):
        out += _NUMBERS + ([("fraction", "1.5"), ("exponent", "1e3")] if cls == "int" else [])
    else:
        out.append(("over-long", valid + "x" * 100_000))
    if cls in ("pattern", "dashless"):
        out.append(("option-looking", "--wrap=id"))
    if cls == "pattern":
        out += [("shell", valid + ";id"), ("blank", valid + " x")]
    if cls in ("path", "dashless", "text", "pattern"):
        out.append(("empty", ""))
    return out


def generate(seed: int = SEED) -> list[Case]:
    """The malformed-value cases: every option of :data:`OPTIONS` with every hostile value of
    its class, in a form and position the seeded generator picks; all exit 64."""
    rng = random.Random(seed)
    cases = []
    for before, option, cls, valid, after in OPTIONS:
        for name, value in hostile_values(cls, valid):
            if option is None:
                if value.startswith("-") or value == "":
                    continue  # a positional starting with - is an option; "" is covered by options
                argv = [*before, value, *after]
            else:
                pair = [f"{option}={value}"] if rng.random() < 0.5 or value.startswith("-") else [option, value]
                rest = list(after)
                at = rng.randint(0, len(rest))
                argv = [*before, *rest[:at], *pair, *rest[at:]]
            cid = f"{'-'.join(a for a in before[:2] if not a.startswith('envbuild/'))}{option or '@arg'}:{name}"
            cases.append(Case(id=cid, argv=argv, expect=(64,)))
    return cases


def special_file_cases() -> list[Case]:
    """Input files that cannot be read: exit 3 naming the file, in one line, without blocking."""
    kinds = {
        "missing": ("missing.pem", {}),
        "directory": ("adir", {"adir/keep": "x"}),
        "fifo": ("fifo.pem", {"fifo.pem": {"fifo": True}}),
        "dev-zero": ("/dev/zero", {}),
        "symlink-to-dev-zero": ("zero.pem", {"zero.pem": {"symlink": "/dev/zero"}}),
        "over-limit": ("big.pem", {"big.pem": b"-" * ((1 << 20) + 1)}),
    }
    where = [
        (["push", "cpu-torch2", "--registry", "registry.invalid:5000", "--sign-key"], "signing key (--sign-key)"),
        (["pull", "cpu-torch2", "--registry", "registry.invalid:5000", "--verify-key"], "public key (--verify-key)"),
        (["pull", "cpu-torch2", "--registry", "registry.invalid:5000", "--registry-ca"], "CA bundle (--registry-ca)"),
        (["push", "cpu-torch2", "--registry", "registry.invalid:5000", "--registry-ca"], "CA bundle (--registry-ca)"),
        (["build", "cpu-torch2", "--ca-cert"], "CA bundle (--ca-cert)"),
        (["lock", "cpu-torch2", "--ca-cert"], "CA bundle (--ca-cert)"),
        (["report"], "certificate"),
    ]
    cases = []
    for argv, what in where:
        for kind, (path, files) in kinds.items():
            if kind == "over-limit" and ("CA" in what or what == "certificate"):
                continue  # their limit is 16 MiB: the same bounded read as the keys' 1 MiB (test_report: 16 MiB)
            cases.append(Case(id=f"{argv[0]}{argv[-1]}:{kind}", argv=[*argv, path], expect=(3,), files=files))
    cases.append(Case(id="build--wheels:missing", argv=["build", "cpu-torch2", "--wheels", "nowheels"], expect=(3,)))
    cases.append(Case(id="build--wheels:file", argv=["build", "cpu-torch2", "--wheels", "f"], expect=(3,),
                      files={"f": "x"}))
    return cases


def usage_cases() -> list[Case]:
    """Unknown commands and options, missing arguments, options that do not go together: 64."""
    lines = [
        ["frobnicate"], ["frob\x1b[31mnicate"], [], ["k8s"], ["base"], ["certify"], ["push", "cpu-torch2"],
        ["check", "cpu-torch2", "--no-such-option"], ["check", "cpu-torch2", "--no-such=\x1b]0;t\x07"],
        ["certify", IMAGE, "--partition", "debug"], ["certify", IMAGE, "--launcher", "k8s", "--time-limit", "5"],
        ["certify", IMAGE, "--launcher", "slurm", "--nodes", "2", "--slurm-nodes", "3"],
        ["certify", IMAGE, "--launcher", "slurm", "--sbatch-arg=--output=/tmp/x"],
        ["certify", IMAGE, "--launcher", "slurm", "--sbatch-arg=--out=/tmp/x"],
        ["certify", IMAGE, "--launcher", "slurm", "--slurm-dir", "/a b"],
        ["certify", IMAGE, "--launcher", "podman"], ["render", "--all", "cpu-torch2"], ["render"],
        ["pull", "cpu-torch2", "--registry", "registry.invalid:5000", "--output", "x.sif"],
        ["pull", "cpu-torch2", "--registry", "registry.invalid:5000", "--print-only"],
        ["pull", "cpu-torch2"], ["pull", "h:99999/a/b"], ["pull", "h;id:5000/a/b"],
        ["push", "cpu-torch2", "--registry", "registry.invalid:99999"], ["probe", "--bogus"],
        ["k8s", "render", "cpu-torch2", "--out", "k8s", "--apply", "--kubeflow"],
        ["doctor", "--checks", "shm,\x1b[2Jnope"],
    ]
    return [Case(id=f"usage:{i}", argv=argv, expect=(64,)) for i, argv in enumerate(lines)]


CERT = str(ROOT / "tests" / "fixtures" / "certificate-profiles.json")
DIGEST_IMAGE = "reg.example/x@sha256:" + "a" * 64


def output_cases() -> list[Case]:
    """Output targets that are no regular file (a device node, a FIFO, a symlink, a symlinked
    folder): exit 3 naming the target in one line, the target left as it was."""
    def targets(name: str) -> dict[str, tuple[str, dict]]:
        return {"fifo": (name, {name: {"fifo": True}}), "symlink": (name, {name: {"symlink": "elsewhere"}}),
                "symlinked-folder": (f"d/{name}", {"real/keep": "x", "d": {"symlink": "real"}})}

    writers = [("report", ["report", CERT, "--out"], {"dev-full": ("/dev/full", {}), "dev-null": ("/dev/null", {}),
                                                       **targets("out.html")}),
               ("to-recipe", ["audit", str(ROOT / "tests/audit/ranged.ok.Dockerfile"), "--to-recipe"],
                targets("out.yaml"))]  # --to-recipe takes only NAME.yaml: no device path
    cases = [Case(id=f"out:{w}:{kind}", argv=[*argv, path], expect=(3,), files=files,
                  max_stderr_lines=2 if w == "to-recipe" else 1)  # audit's note on the file, then the refusal
             for w, argv, kinds in writers for kind, (path, files) in kinds.items()]
    return [*cases, Case(id="out:k8s-gate:symlinked-folder", argv=["k8s", "gate", CERT, "--image", DIGEST_IMAGE,
                                                                   "--out", "k8s"], expect=(3,),
                         files={"real/keep": "x", "k8s": {"symlink": "real"}})]


ALL = generate() + special_file_cases() + usage_cases() + output_cases()


@pytest.fixture(scope="module")
def outcomes():
    return run_cases(ALL)


def test_the_generator_is_deterministic_and_large_enough():
    assert [c.argv for c in generate()] == [c.argv for c in generate(SEED)]
    assert [c.argv for c in generate(SEED + 1)] != [c.argv for c in generate()]  # the seed picks forms
    assert len(ALL) >= 300 and len({c.id for c in ALL}) == len(ALL), len(ALL)
    assert {a for c in ALL for a in c.argv} >= SUBCOMMANDS


@pytest.mark.parametrize("case", ALL, ids=[c.id for c in ALL])
def test_hostile_command_line(case, outcomes):
    assert_held(case, outcomes[case.id])


def test_special_files_are_named_in_the_line(outcomes):
    """The one line of an unreadable input names the file and why, literally."""
    expect = {
        "push--sign-key:missing": "error: missing.pem: no such signing key (--sign-key)",
        "pull--verify-key:fifo": "error: fifo.pem: is not a regular file (a FIFO); give a public key (--verify-key)",
        "pull--registry-ca:dev-zero": "error: /dev/zero: is not a regular file (a character device); give a CA "
                                      "bundle (--registry-ca)",
        "build--ca-cert:directory": "error: adir: is a directory, not a CA bundle (--ca-cert)",
        "push--sign-key:over-limit": "error: big.pem: is 1048577 bytes, over the 1048576-byte limit of a signing key "
                                     "(--sign-key)",
        "build--wheels:missing": "error: nowheels: no such folder (--wheels)",
        "reportreport:fifo": "error: fifo.pem: is not a regular file (a FIFO); give a certificate",
        "reportreport:symlink-to-dev-zero": "error: zero.pem: is not a regular file (a character device); give a "
                                            "certificate",
    }
    assert {k: outcomes[k].stderr.strip() for k in expect} == expect


def test_output_targets_that_are_no_regular_file_are_named_in_the_line(outcomes):
    tail = "envbuild writes only regular files, never through a symlink (remove it or give another path)"
    expect = {
        "out:report:dev-full": f"error: /dev/full: is a character device, not a regular file: {tail}",
        "out:report:dev-null": f"error: /dev/null: is a character device, not a regular file: {tail}",
        "out:to-recipe:fifo": f"error: out.yaml: is a FIFO, not a regular file: {tail}",
        "out:report:symlink": f"error: out.html: is a symlink, not a regular file: {tail}",
        "out:to-recipe:symlinked-folder": f"error: d: is a symlink, not a folder: {tail}",
        "out:k8s-gate:symlinked-folder": f"error: k8s: is a symlink, not a folder: {tail}",
    }
    assert {k: outcomes[k].stderr.strip().splitlines()[-1] for k in expect} == expect
    assert os.stat("/dev/null").st_rdev == os.makedev(1, 3) and os.stat("/dev/full").st_rdev == os.makedev(1, 7)


def test_malformed_values_are_shown_escaped(outcomes):
    expect = {
        "certify--partition:newline": r"envbuild certify: argument --partition: 'debug\n' is not a partition name "
                                      "(letters, digits, _.-; a comma list of at most 16)",
        "doctor--master:esc": r"envbuild doctor: argument --master: 'node-0\x1b[2J\x1b]0;pwned\x07' is not a node name",
        "push-cpu-torch2--namespace:bidi": r"envbuild push: argument --namespace: '\u202eenvbuild' is not a "
                                           "repository path",
        "certify--nodes:nan": "envbuild certify: argument --nodes: 'nan' is not an integer in 1..1024",
        "usage:1": r"envbuild: argument command: invalid choice: 'frob\x1b[31mnicate' (choose from 'check', "
                   "'audit', 'render', 'build', 'rebuild', 'certify', 'make', 'report', 'probe', 'verify', 'doctor', 'gate', "
                   "'push', 'pull', 'lock', 'k8s', 'base', 'config', 'completion')",
        "usage:8": r"envbuild: unrecognized arguments: --no-such=\x1b]0;t\x07",
    }
    assert {k: outcomes[k].stderr.strip() for k in expect} == expect


def test_valid_values_twin():
    """The same option table with the valid values (a few, one per class) gets past the
    arguments: the command then needs the missing engine (3) or works offline (0)."""
    dirs = ["--recipes-dir", str(ROOT / "recipes"), "--images-dir", str(ROOT / "images")]
    cases = [
        Case(id="twin:check", argv=[*dirs, "check", "cpu-torch2"], expect=(0,)),
        Case(id="twin:certify-slurm", argv=["certify", IMAGE, "--launcher", "slurm", "--partition", "debug",
                                            "--time-limit", "10", "--sbatch-arg=--account=ml", "--nodes", "2",
                                            "--slurm-nodes", "1", "--pending-timeout", "60"], expect=(3,)),
        Case(id="twin:push-key", argv=["push", "cpu-torch2", "--registry", "registry.invalid:5000", "--sign-key", "k.pem"],
             expect=(64,), files={"k.pem": "not a key\n"}),  # read (a file), but no key: a usage error
        Case(id="twin:build-ca", argv=[*dirs, "build", "cpu-torch2", "--ca-cert", "ca.pem"], expect=(3,),
             files={"ca.pem": "-----BEGIN CERTIFICATE-----\n"}),
        Case(id="twin:audit", argv=["audit", str(ROOT / "images/cuda12-torch2/Dockerfile"), "--driver", "570.26",
                                    "--build-arg", "A=1", "--to-recipe", "x.yaml"], expect=(0,), max_stderr_lines=None),
    ]
    got = run_cases(cases)
    for case in cases:
        assert_held(case, got[case.id])
    for cid in ("twin:certify-slurm", "twin:build-ca"):
        assert got[cid].stderr.startswith("error: no Docker engine answers at unix:///nonexistent/"), got[cid].stderr
    assert got["twin:push-key"].stderr.startswith("error: k.pem: is not a usable PEM private key")
