"""The operating system: os-release fields (freedesktop os-release(5)) and the glibc version."""

from __future__ import annotations

import os
import platform


def parse_os_release(text: str) -> dict[str, str | None]:
    """``{"id", "version_id", "pretty_name"}`` of os-release text, None when absent."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, val = line.partition("=")
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "\"'":
            val = val[1:-1]
        values[key.strip()] = val
    return {"id": values.get("ID"), "version_id": values.get("VERSION_ID"), "pretty_name": values.get("PRETTY_NAME")}


def os_release(errors: list[str]) -> dict[str, str | None]:
    """Of ``/etc/os-release`` (else ``/usr/lib/os-release``); a read error goes to ``errors``."""
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return parse_os_release(f.read())
        except FileNotFoundError:
            continue
        except OSError as e:
            errors.append(f"os-release: {path}: {e}")
    return {"id": None, "version_id": None, "pretty_name": None}


def glibc(errors: list[str]) -> str | None:
    """The glibc version (``"2.36"``), None on other C libraries."""
    try:
        lib, ver = platform.libc_ver()
        if lib == "glibc" and ver:
            return ver
    except Exception as e:  # platform.libc_ver reads the executable; never fatal
        errors.append(f"glibc: platform.libc_ver: {e}")
    try:
        val = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.36"
        if val:
            return val.split()[-1]
    except (ValueError, OSError, AttributeError):
        pass
    return None
