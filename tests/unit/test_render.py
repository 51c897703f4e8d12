"""Rendering (builder/render/): golden files, drift of the committed files, both formats
describing the same environment, hadolint and spython, byte-determinism across processes."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from dockerfile_parse import DockerfileParser
from spython.main.parse.parsers import SingularityParser

from builder.core.errors import EnvbuildError
from builder.recipe import load, rules
from builder.render import context
from builder.render import rendered as render
from builder.render import write as render_write

from helpers import CPU, CUDA, merge, tmpfs, write_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


def rendered(recipes_dir, name):
    return render.render(rules.require_ok(rules.check(load.load(Path(recipes_dir) / f"{name}.yaml"))))


def test_golden_files():
    """Regenerate with `make golden` and review the diff."""
    out = rendered(ROOT / "tests/recipes", "golden-extras")
    for name, data in out.files.items():
        assert data.decode() == (ROOT / "tests/golden/golden-extras" / name).read_text(), name


@pytest.mark.parametrize("name", RECIPES)
def test_committed_files_are_not_stale(name):
    out = rendered(ROOT / "recipes", name)
    assert render_write.stale(out, ROOT / "images") == [], f"run `envbuild render {name}`"


def test_stale_file_is_detected(tmp_path):
    shutil.copytree(ROOT / "images/cpu-torch2", tmp_path / "cpu-torch2")
    path = tmp_path / "cpu-torch2/Dockerfile"
    path.write_text(path.read_text().replace("torch==2.13.0+cpu", "torch==2.12.0+cpu"))
    assert render_write.stale(rendered(ROOT / "recipes", "cpu-torch2"), tmp_path) == ["Dockerfile"]


def test_render_check_cli_exit_codes(tmp_path):
    shutil.copytree(ROOT / "images", tmp_path / "images")
    cmd = [sys.executable, "-m", "builder.cli", "--images-dir", str(tmp_path / "images"), "render", "--check", "cpu-torch2"]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0
    (tmp_path / "images/cpu-torch2/Singularity.def").write_text("x")
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2
    assert f"{tmp_path}/images/cpu-torch2/Singularity.def: stale; run `envbuild render cpu-torch2`" in res.stderr.replace("\n", "")


def _docker_final_stage(path):
    parser = DockerfileParser(str(path))
    stages = [i for i, s in enumerate(parser.structure) if s["instruction"] == "FROM"]
    final = parser.structure[stages[-1]:]
    env = [s["value"] for s in final if s["instruction"] == "ENV"]
    runs = " ".join(s["value"] for s in parser.structure if s["instruction"] == "RUN")
    return parser, env, runs


def _pip_reqs(text):
    after = text.split("pip install", 1)[1]
    return re.findall(r"(?:^|\s)('?[A-Za-z0-9_.\-\[\]]+(?:==|>=|<)[^\s\\]+)", after)


@pytest.mark.parametrize("recipes_dir, name", [("recipes", "cpu-torch2"), ("recipes", "cuda12-torch2"), ("tests/golden", "golden-extras")])
def test_both_formats_describe_the_same_environment(recipes_dir, name):
    base = ROOT / ("tests/golden" if recipes_dir == "tests/golden" else "images") / name
    parser, docker_env, docker_runs = _docker_final_stage(base / "Dockerfile")
    sing = list(SingularityParser(str(base / "Singularity.def")).recipe.values())[0]
    # the same base image
    assert parser.structure[[s["instruction"] for s in parser.structure].index("ARG")]["value"] == f"BASE_IMAGE={sing.fromHeader}"
    # the same environment variables, exported in %environment and in %post
    sing_env = [e.replace('"', "") for e in sing.environ]
    assert docker_env == sing_env
    post_exports = [line[len("export "):].replace('"', "") for line in sing.install if line.startswith("export ") and "DEBIAN" not in line and "PIP_CERT" not in line and "SOURCE_DATE_EPOCH" not in line]
    assert post_exports == sing_env
    # the same labels
    sing_labels = dict(item.split(" ", 1) for item in sing.labels)
    assert parser.labels == sing_labels
    # the same pip requirements, in the same order
    assert _pip_reqs(docker_runs) == _pip_reqs("\n".join(sing.install))
    # a runscript that passes arguments through
    assert sing.cmd == 'exec "$@"'


def test_literal_pins_in_cuda_outputs():
    docker = (ROOT / "images/cuda12-torch2/Dockerfile").read_text()
    sing = (ROOT / "images/cuda12-torch2/Singularity.def").read_text()
    for text in (docker, sing):
        assert "torch==2.8.0+cu128" in text
        assert "nvidia-nccl-cu12==2.27.3" in text
        assert "numpy==2.3.5" in text
    # the torch index: a build argument pip reads (emptied at build time when the wheel folder
    # holds the pinned torch wheel); apptainer builds name it on the pip line
    assert "\nARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128\n" in docker
    assert "--extra-index-url" not in docker
    assert "--extra-index-url https://download.pytorch.org/whl/cu128 " in sing
    assert "ARG BASE_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04\n" in docker
    assert "From: nvidia/cuda:12.8.1-base-ubuntu24.04\n" in sing
    assert '      envbuild.nccl="2.27.3" \\\n' in docker
    assert "    envbuild.nccl 2.27.3\n" in sing
    assert "    export PATH=\"/opt/venv/bin:$PATH\"\n" in sing


def test_lock_contents():
    lock = json.loads((ROOT / "images/cuda12-torch2/envbuild.lock.json").read_text())
    assert lock["torch"] == {"local": "2.8.0+cu128", "variant": "cu128", "version": "2.8.0"}
    assert (lock["nccl"], lock["nccl_package"], lock["cuda"], lock["python"]) == ("2.27.3", "nvidia-nccl-cu12", "12.8", "3.12")
    assert lock["driver"] == {"min": "570.26", "minor_compat_min": "525.60.13"}


def test_requirements_are_shell_quoted():
    docker = (ROOT / "tests/golden/golden-extras/Dockerfile").read_text()
    assert "      'requests[socks]<3,>=2.31' \\\n" in docker
    assert "      numpy==2.2.6 \\\n" in docker


def test_final_image_keeps_no_build_leftovers():
    text = (ROOT / "images/cpu-torch2/Dockerfile").read_text()
    stages = text.split("\nFROM ")
    assert len(stages) == 3  # header, build, final
    final = stages[2]
    assert "pip install" not in final and "--mount" not in final and "COPY --from=build /opt/venv /opt/venv" in final
    assert "rm -rf /var/lib/apt/lists/*" in final
    assert "--no-cache-dir" in stages[1]


@pytest.mark.parametrize("path", [*(f"images/{n}/Dockerfile" for n in RECIPES), "tests/golden/golden-extras/Dockerfile"])
def test_hadolint_clean(path):
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    res = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(ROOT / path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_catches_a_fault(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text((ROOT / "images/cpu-torch2/Dockerfile").read_text().replace("CMD [\"python3\"]", "CMD python3"))
    hadolint = shutil.which("hadolint", path=os.path.dirname(sys.executable)) or shutil.which("hadolint")
    res = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--no-color", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "DL3025" in res.stdout


@pytest.mark.parametrize("name", RECIPES)
def test_singularity_definition_parses(name):
    sing = list(SingularityParser(str(ROOT / f"images/{name}/Singularity.def")).recipe.values())[0]
    assert sing.fromHeader and sing.install and sing.environ and sing.labels


def test_rendering_is_byte_deterministic_across_processes(tmp_path):
    outputs = []
    settings = [
        {"PYTHONHASHSEED": "1", "TZ": "UTC", "LANG": "C", "umask": 0o022},
        {"PYTHONHASHSEED": "987654", "TZ": "Asia/Shanghai", "LANG": "zh_CN.UTF-8", "umask": 0o077},
    ]
    for i, s in enumerate(settings):
        out = tmp_path / f"out{i}"
        cwd = tmp_path / f"cwd{i}"
        cwd.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": s["PYTHONHASHSEED"], "TZ": s["TZ"], "LANG": s["LANG"], "LC_ALL": s["LANG"]}
        code = f"import os,sys; os.umask({s['umask']}); from builder.cli.app import main; sys.exit(main(sys.argv[1:]))"
        res = subprocess.run([sys.executable, "-c", code, "--recipes-dir", str(ROOT / "recipes"), "--images-dir", str(out), "render", "--all"],
                             cwd=cwd, env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        outputs.append({p.relative_to(out).as_posix(): (p.read_bytes(), p.stat().st_mode & 0o777) for p in sorted(out.rglob("*")) if p.is_file()})
    assert outputs[0] == outputs[1]
    assert outputs[0]["cpu-torch2/Dockerfile"][0] == (ROOT / "images/cpu-torch2/Dockerfile").read_bytes()


# --------------------------------------------------------------------------- issue 8


def spec_from(tmp_path, data, name="t"):
    return rules.require_ok(rules.check(load.load(write_recipe(tmp_path, data, name=name))))


_replace = msgspec.structs.replace


@pytest.mark.parametrize("field, change, template", [
    ("apt", lambda r: _replace(r, packages=_replace(r.packages, apt=("python3\nRUN touch pwned",))), "Dockerfile.j2"),
    ("base_image", lambda r: _replace(r, base=_replace(r.base, image="debian:bookworm\nRUN x")), "Dockerfile.j2"),
    ("env", lambda r: _replace(r, env={"FOO": "a\rb"}), "Dockerfile.j2"),
    # the Dockerfile's labels are JSON-quoted (ESC becomes \u001b); the definition's are raw
    ("description", lambda r: _replace(r, description="x\x1b[2J"), "Singularity.def.j2"),
])
def test_render_refuses_control_characters_a_second_time(tmp_path, field, change, template):
    """The recipe loader refuses these; a Recipe made around it must still not reach a file."""
    spec = spec_from(tmp_path, CPU)
    bad = dataclasses.replace(spec, recipe=change(spec.recipe))
    with pytest.raises(EnvbuildError) as info:
        render.render(bad)
    assert info.value.exit_code == 2
    assert str(info.value).startswith(f"builder/render/templates/{template}: ")
    assert str(info.value).endswith(" refusing to write a value with a newline or control character into the template")
    assert "\n" not in str(info.value) and "\x1b" not in str(info.value)


def test_render_of_the_same_recipe_without_them_twin(tmp_path):
    spec = spec_from(tmp_path, merge(CPU, {"packages": {"apt": ["curl"]}, "env": {"FOO": "a"}}))
    assert b"curl" in render.render(spec).files["Dockerfile"]


def test_cuda_recipe_without_torch_url_renders_the_variant_index(tmp_path):
    spec = spec_from(tmp_path, merge(CUDA, {"index": {"url": "https://pypi.org/simple"}}))
    out = render.render(spec)
    docker, sing = out.files["Dockerfile"].decode(), out.files["Singularity.def"].decode()
    assert "\nARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu128\n" in docker
    assert "--index-url https://pypi.org/simple --find-links /run/envbuild/wheels " in docker
    assert "--index-url https://pypi.org/simple --extra-index-url https://download.pytorch.org/whl/cu128 " in sing
    for text in (docker, sing):
        assert "torch==2.8.0+cu128" in text
    assert json.loads(out.files["envbuild.lock.json"])["index"]["torch_url"] == "https://download.pytorch.org/whl/cu128"


def test_header_names_the_recipe_file(tmp_path):
    path = tmp_path / "my-recipe.yml"
    path.write_text(write_recipe(tmp_path, CPU).read_text())
    out = render.render(rules.require_ok(rules.check(load.load(path))))
    assert out.files["Dockerfile"].decode().splitlines()[0] == (
        "# Rendered by envbuild from the recipe my-recipe.yml: do not edit, run `envbuild render my-recipe`.")
    assert ("# Rendered by envbuild from the recipe my-recipe.yml: do not edit, run `envbuild render my-recipe`."
            in out.files["Singularity.def"].decode().splitlines())


def test_docker_build_stage_installs_the_recipe_apt_packages():
    text = (ROOT / "tests/golden/golden-extras/Dockerfile").read_text()
    build, final = text.split("\nFROM ")[1:]
    assert " && apt-get install -y --no-install-recommends curl=8.5.0-2ubuntu10.6 libgomp1 python3 python3-venv \\\n" in build
    assert "apt-get install -y --no-install-recommends curl=8.5.0-2ubuntu10.6 libgomp1 python3 \\\n" in final
    sing = (ROOT / "tests/golden/golden-extras/Singularity.def").read_text()
    assert "    apt-get install -y --no-install-recommends curl=8.5.0-2ubuntu10.6 libgomp1 python3 python3-venv\n" in sing


CPU_INDEXED = merge(CPU, {"index": {"torch_url": "https://download.pytorch.org/whl/cpu"}})


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 KiB tmpfs at tmp_path/fs (root only; unmounted afterwards)."""
    with tmpfs(tmp_path / "fs", "64k") as mnt:
        yield mnt


def _render_cli(recipes_dir, images_dir, name):
    res = subprocess.run([sys.executable, "-m", "builder.cli", "--recipes-dir", str(recipes_dir), "--images-dir",
                          str(images_dir), "render", name], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return res.returncode, res.stderr


def test_render_on_a_full_disk_writes_no_file_and_names_the_one_that_failed(tmp_path, small_tmpfs):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    write_recipe(recipes, CPU_INDEXED, name="t")
    assert _render_cli(recipes, small_tmpfs, "t") == (0, "")
    old = {p.name: p.read_bytes() for p in (small_tmpfs / "t").iterdir()}
    assert sorted(old) == ["Dockerfile", "Singularity.def", "envbuild.lock.json"]
    write_recipe(recipes, merge(CPU_INDEXED, {"env": {f"V{i}": "x" * 40 for i in range(300)}}), name="t")  # ~17 KB a file more
    code, err = _render_cli(recipes, small_tmpfs, "t")
    assert code == 3, err
    assert re.fullmatch(rf"error: {small_tmpfs}/t/(Dockerfile|Singularity\.def|envbuild\.lock\.json): cannot write: "
                        r"No space left on device\n", err), err
    assert {p.name: p.read_bytes() for p in (small_tmpfs / "t").iterdir()} == old  # the old set, no temp file left


def test_render_with_room_writes_the_whole_set_twin(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    write_recipe(recipes, merge(CPU_INDEXED, {"env": {f"V{i}": "x" * 40 for i in range(300)}}), name="t")
    assert _render_cli(recipes, tmp_path / "images", "t") == (0, "")
    assert sorted(p.name for p in (tmp_path / "images/t").iterdir()) == ["Dockerfile", "Singularity.def", "envbuild.lock.json"]


OFFLINE = """
import sys
from builder import cli
codes = [cli.main(["--recipes-dir", sys.argv[1], "--images-dir", sys.argv[2], "check", "cpu-torch2"]),
         cli.main(["--recipes-dir", sys.argv[1], "--images-dir", sys.argv[2], "render", "--all"]),
         cli.main(["--recipes-dir", sys.argv[1], "--images-dir", sys.argv[2], "check", "nope"])]
print(codes, sorted(m for m in sys.modules if m == "docker" or m.startswith("docker.")))
"""


def test_offline_commands_never_import_docker(tmp_path):
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/envbuild.sock"}
    res = subprocess.run([sys.executable, "-c", OFFLINE, str(ROOT / "recipes"), str(tmp_path / "images")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.stdout.splitlines()[-1] == "[0, 0, 3] []", res.stdout + res.stderr


def test_a_command_that_needs_the_engine_imports_docker_twin(tmp_path):
    """The probe of the test above sees docker once the engine is asked beyond inspect."""
    code = ("import sys; from builder.core.errors import Unreachable; from builder.image import engine\n"
            "try: engine.Engine(env={'DOCKER_HOST': 'unix:///nonexistent/envbuild.sock'}).ping()\n"
            "except Unreachable: print('docker' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True).stdout == "True\n"


# ------------------------------------------------------------------- a lean image (issue 13)
LEAN_TORCH = ("rm -rf /opt/venv/lib/python3.11/site-packages/torch/test",
              "if [ -d /opt/venv/lib/python3.11/site-packages/torch/bin ]; then find "
              "/opt/venv/lib/python3.11/site-packages/torch/bin -maxdepth 1 -type f \\( -name 'test_*' -o -name '*Test' \\) "
              "-delete; fi")


def test_lean_by_default_in_both_formats():
    docker = (ROOT / "images/cpu-torch2/Dockerfile").read_text()
    sing = (ROOT / "images/cpu-torch2/Singularity.def").read_text()
    build, final = docker.split("\nFROM ")[1:]
    for cmd in LEAN_TORCH:
        assert f"\n && {cmd} \\\n" in build
        assert f"\n    {cmd}\n" in sing
    drop = f'/opt/venv/bin/python3 -c "{context.DROP_TOOLS}"'
    clamp = '\n && find /opt/venv -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +\n'
    assert build.endswith(f"\n && {drop} \\{clamp}") and f"\n    {drop}\n" in sing
    # the final stage's apt leaves no package cache (the bootstrapped base has no docker-clean)
    assert " && apt-get clean \\\n && rm -rf /var/lib/apt/lists/*\n" in final
    assert "    apt-get clean\n    rm -rf /var/lib/apt/lists/*\n" in sing


def test_keep_pip_keeps_pip_and_the_lean_rest(tmp_path):
    spec = spec_from(tmp_path, merge(CPU, {"packages": {"keep_pip": True}}))
    out = render.render(spec)
    for name in ("Dockerfile", "Singularity.def"):
        text = out.files[name].decode()
        assert "pip uninstall" not in text and "DROP" not in text and "envbuild: removing" not in text
        assert all(cmd in text for cmd in LEAN_TORCH)
    twin_dir = tmp_path / "twin"
    twin_dir.mkdir()
    twin = render.render(spec_from(twin_dir, CPU)).files["Dockerfile"].decode()
    assert "envbuild: removing" in twin


def test_drop_tools_keeps_what_an_installed_package_requires(tmp_path):
    # the program on this interpreter's own venv: pip is dropped unless something requires it
    import importlib.metadata

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python3")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    pip = importlib.metadata.distribution("pip")  # this venv's pip, copied: ensurepip takes seconds
    for top in ("pip", str(pip._path.name)):  # type: ignore[attr-defined]
        shutil.copytree(Path(str(pip.locate_file(top))), Path(site) / top)
    shutil.copy(Path(sys.executable).parent / "pip", venv / "bin" / "pip")
    needy = Path(site) / "needs_pip-1.0.dist-info"  # a distribution that requires pip
    needy.mkdir()
    (needy / "METADATA").write_text("Metadata-Version: 2.1\nName: needs-pip\nVersion: 1.0\nRequires-Dist: pip\n")
    res = subprocess.run([py, "-c", context.DROP_TOOLS], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("envbuild: removing") and " pip" not in res.stdout
    assert (venv / "bin" / "pip").exists()
    (needy / "METADATA").write_text("Metadata-Version: 2.1\nName: needs-pip\nVersion: 1.0\n")
    res = subprocess.run([py, "-c", context.DROP_TOOLS], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "pip" in res.stdout.split()[2:] and not (venv / "bin" / "pip").exists()


def test_locked_recipe_declares_the_no_index_build_argument():
    docker = (ROOT / "tests/golden/golden-locked/Dockerfile").read_text()
    assert "\nARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu\n" in docker
    assert "\nARG PIP_NO_INDEX=\n" in docker and "\nARG SOURCE_DATE_EPOCH=315532800\nRUN --mount=type=secret,id=pip_ca " in docker
    plain = (ROOT / "images/cpu-torch2/Dockerfile").read_text()
    assert "PIP_NO_INDEX" not in plain
