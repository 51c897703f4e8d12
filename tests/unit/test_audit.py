"""envbuild audit: word expansion as sh and Docker do it, Docker's ARG/ENV scopes, the
definition parser, the one rule set (recipe's), --json, --driver, --build-arg, the
command line's usage errors, and envbuild's own rendered files.

The verdicts of the files under tests/audit/ are in test_audit_files.py; --to-recipe in
test_audit_recipe.py; hostile files in tests/integration/hostile/test_audit.py.
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from builder.audit import definition, dockerfile, run
from builder.audit.shell import MAX_DEPTH, MAX_VALUE, Scanner, Source, Var
from builder.cli import app
from builder.recipe import facts as recipe_facts

ROOT = Path(__file__).resolve().parents[2]
ENV = {"V": Var("2.6.0", 2, "ARG", None, "V"), "E": Var("", 3, "ENV", None, "E"),
       "P": Var("torch==2.1.0 numpy", 4, "ARG", None, "P"), "N": Var(None, 5, "ARG", "ARG N has no default", "N")}


def _words(text: str, env: dict | None = None, shell: bool = True) -> list[tuple[str | None, str | None]]:
    src = Source([(7, text)])
    sc = Scanner(src, (env or ENV).get, shell=shell)
    if not shell:
        return [(w.text, w.why) for w in sc.words()]
    return [(w.text, w.why) for c in sc.commands() for w in c.words]


def _audit(*argv: str) -> tuple[int, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = app.main(list(argv))
    return code, out.getvalue(), err.getvalue()


# ------------------------------------------------------------------- expansion
@pytest.mark.parametrize("text, expected", [
    ("echo $V ${V}", ["echo", "2.6.0", "2.6.0"]),
    ("echo ${V%.*} ${V%%.*} ${V#*.} ${V##*.}", ["echo", "2.6", "2", "6.0", "0"]),
    ("echo a${V}b${V%.*}c", ["echo", "a2.6.0b2.6c"]),
    ("echo ${E:-dflt} ${E:+set} ${V:+set} ${#V}", ["echo", "dflt", "set", "5"]),
    ('echo "${E-dflt}" "${E}"', ["echo", "", ""]),
    ("echo ${E:-${V%.*}}", ["echo", "2.6"]),
    ("echo '$V' \\$V \"$V\"", ["echo", "$V", "$V", "2.6.0"]),
    ("pip install $P", ["pip", "install", "torch==2.1.0", "numpy"]),
    ('pip install "$P"', ["pip", "install", "torch==2.1.0 numpy"]),
    ("pip install $E torch", ["pip", "install", "torch"]),
    ("pip install \\\n  torch", ["pip", "install", "torch"]),
])
def test_words_expand_as_sh_does(text, expected):
    assert [t for t, _why in _words(text)] == expected


@pytest.mark.parametrize("text, why", [
    ("echo $(date)", "$(date) is a command substitution (its value is known only when it runs)"),
    ("echo `date`", "`date` is a command substitution (its output is known only when it runs)"),
    ("echo $((1+2))", "$((1+2)) is an arithmetic expansion (its value is known only when it runs)"),
    ("echo ${V/./_}", "${V/./_} is a form sh does not expand (bash only)"),
    ("echo ${V:1:2}", "${V:1:2} is a form sh does not expand (bash only)"),
    ("echo $1", "$1 is a special parameter of the shell (known only when it runs)"),
    ("echo $CUDA_VERSION", "$CUDA_VERSION is not set by this file (the base image may set it)"),
    ("echo ${N}", "ARG N has no default"),
    ("echo ${E:?}", "${E:?} stops the shell when $E is empty"),
    ("echo 'open", "an unterminated single quote"),
])
def test_what_cannot_be_expanded_is_named_not_guessed(text, why):
    assert _words(text)[1] == (None, why)


def test_expansion_is_bounded_in_depth_and_size():
    deep = "echo " + "${E:-" * (MAX_DEPTH + 2) + "x" + "}" * (MAX_DEPTH + 2)
    assert _words(deep)[1] == (None, f"${{...}} nests deeper than {MAX_DEPTH} levels")
    big = {"A": Var("x" * (MAX_VALUE // 2 + 1), 1, "ARG", None, "A")}
    assert _words("echo $A$A", big)[1] == (None, f"expands to more than {MAX_VALUE} characters")
    assert _words("echo $A", big)[1][0] == "x" * (MAX_VALUE // 2 + 1)


def test_commands_split_on_operators_skip_heredocs_and_keep_assignments():
    src = Source([(1, "A=1 pip install $A && export B=$V; echo $B | tee x 2>&1 > /dev/null <<EOF"),
                  (2, "pip install inside-heredoc"), (3, "EOF"), (4, "if true; then pip install ${B%.*}; fi # $nope")])
    cmds = Scanner(src, ENV.get, shell=True).commands()
    got = [([w.text for w in c.words], c.line, sorted(c.assigns)) for c in cmds]
    assert got == [(["pip", "install", None], 1, ["A"]),  # a prefix assignment is not seen by its own arguments
                   (["export", "B=2.6.0"], 1, []), (["echo", "2.6.0"], 1, []), (["tee", "x"], 1, []),
                   (["true"], 4, []), (["pip", "install", "2.6"], 4, [])]
    assert cmds[0].lookup("A").value == "1" and cmds[3].lookup("B").value == "2.6.0"


def test_instruction_words_keep_blanks_inside_quotes_and_no_command_substitution():
    assert _words('A="x y" B=${V} C=$(no) D=\'$V\'', shell=False) == [
        ("A=x y", None), ("B=2.6.0", None), ("C=$(no)", None), ("D=$V", None)]


# ------------------------------------------------------------------- Docker scopes
def _dockerfile(tmp_path, text: str, **kw):
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return dockerfile.parse(str(path), **kw)


def _texts(stage) -> list[list[str | None]]:
    return [[w.text for w in c.words] for c in stage.commands]


def test_arg_scopes_as_docker_sets_them(tmp_path):
    parsed = _dockerfile(tmp_path, "\n".join([
        "ARG BASE='debian:bookworm-slim'", 'ARG V="2.6.0"', "ARG G=1",
        "FROM ${BASE} as Build",
        "ARG V", "ARG W=${V}-x", "ARG TARGETARCH", "ENV G=env",
        "RUN echo $V $W $TARGETARCH $G $BASE",
        "FROM build AS final",
        "RUN echo $G $W",
        "FROM debian:12",
        "COPY --from=Build /a /b",
        "COPY --from=1 /c /d",
    ]) + "\n")
    build, final, last = parsed.stages
    assert (build.name, build.base.word.text, final.parent, last.copies) == ("build", "debian:bookworm-slim", 0, [(0, 13), (1, 14)])
    assert _texts(build) == [["echo", "2.6.0", "2.6.0-x", "amd64", "env", None]]
    assert build.commands[0].words[-1].why == ("ARG BASE (line 1) is declared before FROM only: declare it again in the "
                                               "stage (ARG BASE) to use it there")
    assert _texts(final) == [["echo", "env", None]]  # ENV is inherited from the stage, ARGs are not
    assert final.commands[0].words[-1].why == "$W is not set by this file (the base image may set it)"
    assert [s.index for s in parsed.used()] == [0, 1, 2]


def test_build_args_replace_defaults_and_an_arg_without_default_is_named(tmp_path):
    text = "FROM debian:12\nARG T\nARG U=1\nRUN pip install torch==$T u==$U\n"
    plain = _dockerfile(tmp_path, text)
    assert plain.stages[0].commands[0].words[2].why == "ARG T (line 2) has no default: its value is given with --build-arg"
    given = _dockerfile(tmp_path, text, build_args={"T": "2.5.1", "U": "2"})
    assert _texts(given.stages[0]) == [["pip", "install", "torch==2.5.1", "u==2"]]


def test_run_flags_continuations_exec_form_and_legacy_env(tmp_path):
    parsed = _dockerfile(tmp_path, "\n".join([
        "FROM debian:12",
        "ENV A 1 2",
        "RUN --mount=type=cache,target=/root/.cache \\",
        "    --network=host \\",
        "    pip install \\",
        "# a comment inside the continuation",
        "",
        "      torch==2.5.1",
        'RUN ["pip", "install", "numpy==2.1.3"]',
        'RUN ["/bin/sh", "-c", "pip install x==$A"]',
    ]) + "\n")
    st = parsed.stages[0]
    assert [(e.name, e.value, e.line) for e in st.env] == [("A", "1 2", 2)]
    assert [([w.text for w in c.words], c.line, [w.line for w in c.words]) for c in st.commands] == [
        (["pip", "install", "torch==2.5.1"], 5, [5, 5, 8]),
        (["pip", "install", "numpy==2.1.3"], 9, [9, 9, 9]),
        (["pip", "install", "x==1", "2"], 10, [10, 10, 10, 10]),
    ]


def test_definition_arguments_build_args_and_files_from(tmp_path):
    path = tmp_path / "x.def"
    path.write_text("Bootstrap: docker\nFrom: ubuntu:{{ UBUNTU }}\nStage: build\n\n%arguments\n    UBUNTU=22.04\n\n"
                    "%post\n    pip install torch=={{ TORCH }}\n\nBootstrap: docker\nFrom: ubuntu:22.04\n\n"
                    "%files from build\n    /opt /opt\n%environment\n    export A=1\n")
    parsed = definition.parse(str(path))
    build, final = parsed.stages
    assert (build.name, build.base.word.text, final.copies, [(e.name, e.value, e.line) for e in final.env]) == (
        "build", "ubuntu:22.04", [(0, 14)], [("A", "1", 17)])
    assert build.commands[0].words[2].why == "{{ TORCH }} is not a build argument of %arguments (give it with --build-arg)"
    given = definition.parse(str(path), {"TORCH": "2.5.1", "UBUNTU": "24.04"})
    assert (given.stages[0].base.word.text, _texts(given.stages[0])) == ("ubuntu:24.04", [["pip", "install", "torch==2.5.1"]])


# ------------------------------------------------------------------- one rule set
@pytest.fixture
def fresh_facts():
    """Facts read anew from ``builder.recipe.facts.FILE`` in the test, and again after it."""
    recipe_facts.facts.cache_clear()
    yield
    recipe_facts.facts.cache_clear()


def test_the_audit_applies_recipe_s_rules_not_a_copy(monkeypatch, tmp_path, fresh_facts):
    """The facts the recipe rules read decide the audit's verdict: give torch 2.5.1 a
    cu126 build in the facts file and no-build.Dockerfile passes."""
    monkeypatch.chdir(ROOT)
    assert _audit("audit", "tests/audit/no-build.Dockerfile")[0] == 2
    data = yaml.safe_load(recipe_facts.FILE.read_text(encoding="utf-8"))
    data["torch"]["2.5.1"]["variants"]["list"].append("cu126")
    changed = tmp_path / "compat.yaml"
    changed.write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.setattr(recipe_facts, "FILE", changed)
    recipe_facts.facts.cache_clear()
    code, _out, err = _audit("audit", "tests/audit/no-build.Dockerfile")
    monkeypatch.undo()
    assert (code, "has no cu126 build" in err) == (0, False)


def test_envbuild_s_own_rendered_files_audit_clean(monkeypatch):
    monkeypatch.chdir(ROOT)
    files = sorted(glob.glob("images/*/Dockerfile") + glob.glob("images/*/Singularity.def"))
    assert len(files) == 4
    code, out, err = _audit("audit", *files)
    assert code in (0, 1), err
    assert [line.split(": ")[1] for line in out.splitlines()] == ["ok"] * 4
    assert "error" not in err and "warning" not in err


# ------------------------------------------------------------------- options
def test_json_report_follows_the_committed_schema(monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = _audit("audit", "--json", "tests/audit/cu-mismatch.Dockerfile", "tests/audit/conflict.Dockerfile",
                            "images/cuda12-torch2/Dockerfile")
    report = json.loads(out)
    jsonschema.validate(report, json.loads((ROOT / "schemas/audit.schema.json").read_text()))
    assert (code, report["exit_code"], [f["verdict"] for f in report["files"]]) == (3, 3, ["errors", "malformed", "clean"])
    # the findings stay on stderr, as without --json; the summary lines of stdout are the document's
    assert [line.split(": line")[0] for line in err.splitlines()] == [
        "error: tests/audit/cu-mismatch.Dockerfile", "note: tests/audit/cu-mismatch.Dockerfile",
        "error: tests/audit/conflict.Dockerfile", "note: images/cuda12-torch2/Dockerfile",
        "note: images/cuda12-torch2/Dockerfile"]
    mismatch = report["files"][0]
    assert mismatch["stack"]["torch"] == {"requirement": "torch==2.5.1+cu121", "line": 5, "installer": "pip",
                                          "version": "2.5.1", "variant": "cu121", "variant_from": "the local version +cu121",
                                          "index": "https://download.pytorch.org/whl/cu121"}
    assert [(f["level"], f["rule"], f["line"]) for f in mismatch["findings"]] == [
        ("error", "wheel-cuda-base", 5), ("note", "driver-floor", 5)]
    assert report["files"][1]["findings"][0]["message"] == "unresolved merge-conflict marker '<<<<<<< HEAD'"
    assert report["files"][2]["stack"]["nccl"] == "2.27.3"


@pytest.mark.parametrize("driver, code, line", [
    ("570.124.06", 0, None),
    ("535.54.03", 1, "warning: images/cuda12-torch2/Dockerfile: line 30: 'torch==2.8.0+cu128' (--driver 535.54.03): driver "
     "535.54.03 is below 570.26 (CUDA 12.8 GA): runs only under minor-version compatibility (no PTX JIT, some APIs fail) [NV-MVC (V)]"),
    ("470.82.01", 2, "error: images/cuda12-torch2/Dockerfile: line 30: 'torch==2.8.0+cu128' (--driver 470.82.01): driver "
     "470.82.01 is below 525.60.13, the oldest that runs CUDA 12.8 (cu128) even with minor-version compatibility; full "
     "support needs >= 570.26 [NV-MVC (V)]"),
])
def test_driver_floor_of_the_wheel_s_cuda(monkeypatch, driver, code, line):
    monkeypatch.chdir(ROOT)
    got, _out, err = _audit("audit", "images/cuda12-torch2/Dockerfile", "--driver", driver)
    assert got == code
    assert (line in err.splitlines()) if line else ("driver-too-old" not in err and "is below" not in err)


def test_build_args_fill_what_the_file_leaves_open(monkeypatch, tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text("FROM nvidia/cuda:12.4.1-base-ubuntu22.04\nARG TORCH\n"
                    "RUN pip install torch==${TORCH} --index-url https://download.pytorch.org/whl/cu124\n")
    assert _audit("audit", str(path))[0] == 1  # unexpanded, no torch: warnings
    assert _audit("audit", str(path), "--build-arg", "TORCH=2.5.1")[0] == 0
    assert _audit("audit", str(path), "--build-arg", "TORCH=2.5.1+cu121")[0] == 2


@pytest.mark.parametrize("argv, message", [
    (["audit"], "envbuild audit: the following arguments are required: FILE"),
    (["audit", "a", "b", "--to-recipe", "x.yaml"], "envbuild audit: --to-recipe takes exactly one FILE"),
    (["audit", "a", "--to-recipe", "X Y.yaml"], "envbuild audit: --to-recipe: 'X Y.yaml' is not a recipe file name "
     "(<name>.yaml, <name> lower-case [a-z0-9] joined by '.', '_' or '-')"),
    (["audit", "a", "--to-recipe", "x.txt"], "envbuild audit: --to-recipe: 'x.txt' is not a recipe file name "
     "(<name>.yaml, <name> lower-case [a-z0-9] joined by '.', '_' or '-')"),
    (["audit", "a", "--driver", "570.x"], "envbuild audit: argument --driver: '570.x' is not a driver version such as 570.124.06"),
    (["audit", "a", "--build-arg", "NOVALUE"], "envbuild audit: argument --build-arg: 'NOVALUE' is not NAME=VALUE"),
])
def test_usage_errors_are_64_before_any_file_is_read(argv, message):
    code, out, err = _audit(*argv)
    assert (code, out, err.splitlines()) == (64, "", [message])


def test_kind_of_file_by_name():
    assert [run.kind_of(n) for n in ("Dockerfile", "Containerfile", "x.Dockerfile", "Dockerfile.gpu", "Singularity",
                                     "Singularity.gpu", "Apptainer", "gpu.def", "a/b/recipe.DEF")] == [
        "dockerfile", "dockerfile", "dockerfile", "dockerfile", "definition", "definition", "definition",
        "definition", "definition"]


@pytest.mark.parametrize("name, code", [("requirements.txt", 3), ("environment.yml", 3), ("env.yaml", 3),
                                        ("requirements", 3), ("Dockerfile", 0), ("train.Dockerfile", 0)])
def test_a_file_the_build_reads_is_not_audited_as_a_dockerfile(tmp_path, name, code):
    path = tmp_path / name
    path.write_text("FROM nvidia/cuda:12.4.1-base-ubuntu22.04\n"
                    "RUN pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124\n")
    got, out, err = _audit("audit", str(path))
    assert got == code
    assert err.splitlines()[0] == (f"error: {path}: not a Dockerfile or Apptainer definition by its name: audit the "
                                   "Dockerfile or definition that installs from it" if code else
                                   f"note: {path}: line 2: 'torch==2.5.1': cu124 needs driver >= 550.54.14 (CUDA 12.4 "
                                   "GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) "
                                   "[NV-RN, NV-MVC (V)]")


@pytest.mark.parametrize("release, driver, code, line", [
    ("24.08", "550.142", 1, "warning: FILE: line 1: 'nvcr.io/nvidia/pytorch:24.08-py3': driver 550.142 is below 560.28.03 "
     "(CUDA 12.6 GA), which the base image's CUDA 12.6.0 needs: it runs only under minor-version compatibility (no PTX "
     "JIT, some APIs fail) [NV-MVC (V)]"),
    ("24.08", "470.82.01", 2, "error: FILE: line 1: 'nvcr.io/nvidia/pytorch:24.08-py3': driver 470.82.01 is below "
     "525.60.13, the oldest that runs the base image's CUDA 12.6.0 [NV-RN, NV-MVC (V)]"),
    ("24.08", "560.35.03", 0, None),
    ("24.05", "550.142", 0, None),  # CUDA 12.4.1: 550.54.14
    ("19.10", "410.48", 1, "warning: FILE: line 1: 'nvcr.io/nvidia/pytorch:19.10-py3': driver 410.48 is below 418.39, "
     "the oldest that runs the base image's CUDA 10.1.243 [NV-RN, NV-MVC (U)]"),
])
def test_driver_floor_of_the_base_image_s_cuda(tmp_path, release, driver, code, line):
    path = tmp_path / "Dockerfile"
    path.write_text(f"FROM nvcr.io/nvidia/pytorch:{release}-py3\nRUN pip install --no-cache-dir fastapi==0.112.0\n")
    got, _out, err = _audit("audit", str(path), "--driver", driver)
    floor = [ln for ln in err.splitlines() if "is below" in ln]
    assert (got, floor) == (code, [line.replace("FILE", str(path))] if line else [])


@pytest.mark.parametrize("install, variant, variant_from, python", [
    ("pip install torch==2.5.1+cu121", "cu121", "the local version +cu121", "3.10"),
    ("pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu118/", "cu118",
     "--index-url https://download.pytorch.org/whl/cu118/", "3.10"),
    ("pip install torch==2.5.1 -f https://download.pytorch.org/whl/cu121/torch_stable.html", "cu121",
     "--find-links https://download.pytorch.org/whl/cu121/torch_stable.html", "3.10"),
    ("PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu pip install torch==2.5.1", "cpu",
     "--extra-index-url https://download.pytorch.org/whl/cpu", "3.10"),
    ("pip install torch==2.5.1", "cu124", "PyPI's build of torch 2.5.1", "3.10"),
    ("pip install -i https://mirror.example/simple torch==2.5.1", "cu124",
     "PyPI's build of torch 2.5.1 (assuming https://mirror.example/simple mirrors PyPI)", "3.10"),
    ("pip install https://download.pytorch.org/whl/cu121/torch-2.1.0%2Bcu121-cp311-cp311-linux_x86_64.whl",
     "cu121", "the local version +cu121", "3.10"),
    ("python3.11 -m pip install torch==2.5.1+cpu", "cpu", "the local version +cpu", "3.11"),
    ("pip install torch==2.5.1 --index-url https://download.pytorch.org/whl", None,
     "https://download.pytorch.org/whl (every variant: pip picks one)", "3.10"),
])
def test_where_the_torch_variant_comes_from(tmp_path, install, variant, variant_from, python):
    path = tmp_path / "Dockerfile"
    path.write_text(f"FROM ubuntu:22.04\nRUN {install}\n")
    done = run.audit_file(str(path))
    torch = done.result.stack.torch
    assert (torch.variant, torch.variant_from, done.result.stack.python) == (variant, variant_from, python)
