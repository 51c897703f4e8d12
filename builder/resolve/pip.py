"""pip requirements to versions and wheel hashes by pip's own resolver (``--dry-run --report`` with the recipe's indexes
and the site's CA and wheels only, as the build sees them). Report format:
https://pip.pypa.io/en/stable/reference/installation-report/"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from builder.core import process
from builder.core.errors import EnvbuildError, Unreachable
from builder.image.site import SiteOptions
from builder.recipe.model import ResolvedWheel
from builder.recipe.spec import Spec

#: Seconds for one pip resolution.
PIP_TIMEOUT_S = 600
#: Oldest manylinux glibc minor pip is told the image accepts (manylinux2014 = 2.17).
MANYLINUX_MIN_MINOR = 17

_SHA256_HEX = re.compile(r"\A[0-9a-f]{64}\Z")


def platform_tags(glibc: str, arch: str = "x86_64") -> list[str]:
    """``manylinux_2_<m>_<arch>`` from the glibc minor down to 17, then ``linux_<arch>`` (pip matches exactly)."""
    major, _, minor = str(glibc).partition(".")
    try:
        top = int(minor) if major == "2" else MANYLINUX_MIN_MINOR
    except ValueError:
        top = MANYLINUX_MIN_MINOR
    tags = [f"manylinux_2_{m}_{arch}" for m in range(max(top, MANYLINUX_MIN_MINOR), MANYLINUX_MIN_MINOR - 1, -1)]
    return [*tags, f"manylinux2014_{arch}", f"linux_{arch}"]


def pip_command(spec: Spec, site: SiteOptions, report: Path, target: Path, *, python: str | None = None) -> list[str]:
    r = spec.recipe
    argv = [python or sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            "--disable-pip-version-check", "--no-input", "--retries", "1", "--timeout", "20", "--report", str(report),
            "--target", str(target), "--only-binary=:all:", "--python-version", r.python, "--implementation", "cp"]
    for tag in platform_tags(spec.glibc):
        argv += ["--platform", tag]
    argv += ["--index-url", r.index.url]
    if spec.torch_index_url:
        argv += ["--extra-index-url", spec.torch_index_url]
    if site.wheel_dir:
        argv += ["--find-links", str(site.wheel_dir)]
    if site.ca_bundle:
        argv += ["--cert", str(site.ca_bundle)]
    return [*argv, *spec.pip_requirements()]


def _sha256(archive: Mapping[str, Any]) -> str | None:
    hashes = dict(archive.get("hashes") or {})
    if not hashes and archive.get("hash"):
        algo, _, value = str(archive["hash"]).partition("=")
        hashes[algo] = value
    sha = hashes.get("sha256")
    return sha if isinstance(sha, str) and _SHA256_HEX.fullmatch(sha) else None


def parse_report(report: Mapping[str, Any]) -> list[ResolvedWheel]:
    """The wheels of a pip installation report, by name; EnvbuildError (exit 3) for one without a sha256."""
    out = []
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        info = item.get("download_info") or {}
        sha = _sha256(info.get("archive_info") or {})
        if not sha:
            raise Unreachable("pip gave no sha256 for it", field="pip",
                              value=f"{meta.get('name')}=={meta.get('version')}")
        url = str(info.get("url") or "")
        out.append(ResolvedWheel(name=str(meta.get("name")), version=str(meta.get("version")),
                                 hashes=(f"sha256:{sha}",), file=url.rsplit("/", 1)[-1].replace("%2B", "+"),
                                 requested=bool(item.get("requested"))))
    return sorted(out, key=lambda p: re.sub(r"[-_.]+", "-", p.name).lower())


def resolve_pip(spec: Spec, site: SiteOptions, *, timeout_s: float = PIP_TIMEOUT_S
                ) -> tuple[list[ResolvedWheel] | None, str | None]:
    """``(wheels, None)``, or ``(None, note)`` when pip could not resolve."""
    with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as tmp:
        report = Path(tmp) / "report.json"
        argv = pip_command(spec, site, report, Path(tmp) / "target")
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # the recipe's indexes only
            proc = process.run(argv, timeout_s, env={**env, "PIP_CONFIG_FILE": os.devnull})
        except Unreachable as e:
            return None, f"pip: not resolved ({e.message})"
        if proc.returncode != 0 or not report.is_file():
            errors = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("ERROR")]
            last = errors[0] if errors else (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"pip: not resolved ({' '.join(last.split())[:300]})"
        try:
            return parse_report(json.loads(report.read_text())), None
        except EnvbuildError as e:
            return None, f"pip: not resolved ({e})"
        except (OSError, ValueError) as e:
            return None, f"pip: unreadable report ({e})"
