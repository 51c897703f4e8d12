"""The one payload mechanism for envbuild's in-image and in-node code: ``builder/agent/``, handed to the ranks at run
time so the image is never changed. :func:`digest` names it, so a certificate can say which agent code ran."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Sequence

#: The folder shipped (this package).
AGENT_DIR = Path(__file__).resolve().parent
#: Where nodes see it (read-only); ``PYTHONPATH`` points here.
MOUNT_POINT = "/opt/envbuild"

#: ``python3 -c BOOTSTRAP MODULE ARGS...`` with the :func:`archive` on stdin: unpack into a
#: private temporary folder (regular files with relative names only), run MODULE as ``-m`` would.
BOOTSTRAP = (
    "import io,os,runpy,shutil,sys,tarfile,tempfile\n"
    "d=tempfile.mkdtemp(prefix='envbuild-agent-')\n"
    "try:\n"
    " t=tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()),mode='r:gz')\n"
    " for m in t.getmembers():\n"
    "  n=os.path.normpath(m.name)\n"
    "  if not m.isfile() or n.startswith(('/','..')):\n"
    "   raise SystemExit('envbuild agent: bad payload member '+repr(m.name))\n"
    " t.extractall(d,**({'filter':'data'} if hasattr(tarfile,'data_filter') else {}))\n"
    " sys.path.insert(0,d);mod=sys.argv[1];sys.argv=[mod]+sys.argv[2:]\n"
    " runpy.run_module(mod,run_name='__main__',alter_sys=True)\n"
    "finally:\n"
    " shutil.rmtree(d,ignore_errors=True)\n"
)


#: ``python3 -c MOUNTED MODULE ARGS...`` with :data:`AGENT_DIR` at :data:`MOUNT_POINT`: runs
#: MODULE as ``-m`` would, leaving the image's ``PYTHONPATH`` and working directory alone.
MOUNTED = (
    "import runpy,sys\n"
    f"sys.path.insert(0,{MOUNT_POINT!r});mod=sys.argv[1];sys.argv=[mod]+sys.argv[2:]\n"
    "runpy.run_module(mod,run_name='__main__',alter_sys=True)\n"
)


def files() -> dict[str, bytes]:
    """Every ``*.py`` under :data:`AGENT_DIR` by relative POSIX path, sorted."""
    out = {}
    for p in sorted(AGENT_DIR.rglob("*.py")):
        rel = p.relative_to(AGENT_DIR)
        if "__pycache__" in rel.parts:
            continue
        out[rel.as_posix()] = p.read_bytes()
    return out


def archive() -> bytes:
    """:func:`files` as a deterministic tar.gz (mtime 0, uid/gid 0, mode 0644, sorted)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files().items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def digest() -> str:
    return "sha256:" + hashlib.sha256(archive()).hexdigest()


def command(python: str, module: str, args: Sequence[str] = ()) -> list[str]:
    return [python, "-c", BOOTSTRAP, module, *args]


def mounted_command(python: str, module: str, args: Sequence[str] = ()) -> list[str]:
    return [python, "-c", MOUNTED, module, *args]
