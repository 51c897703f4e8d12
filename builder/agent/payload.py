"""The one payload mechanism for envbuild's in-image and in-node code (stdlib only).

What is shipped is always the same set: every ``*.py`` file under ``builder/agent/``
(:func:`files`), keyed by its POSIX path relative to this folder (``probe/__init__.py``,
``doctor_agent.py``, ``bench/__main__.py``, ...). Certifying never changes the image: the
code is handed to the ranks at run time, read-only. The delivery depends on where the code
runs:

* a folder the runtime bind-mounts read-only (local Docker, Slurm nodes with a shared
  filesystem): :data:`AGENT_DIR` itself, mounted at :data:`MOUNT_POINT`, a module run
  from there with ``[python, "-c", MOUNTED, MODULE, *args]`` (:func:`mounted_command`);
* files a platform projects into the container (a Kubernetes ConfigMap): :func:`files`;
* a process's stdin (``docker exec``, ssh, ``srun``): :func:`archive` (a deterministic
  tar.gz) read by :data:`BOOTSTRAP`, which unpacks it into a private temporary folder and
  runs the named module: ``[python, "-c", BOOTSTRAP, MODULE, *args]`` (:func:`command`).

:func:`digest` names the payload (sha256 of :func:`archive`), so a certificate can say
which agent code ran.
"""

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

#: Run with ``python3 -c BOOTSTRAP MODULE ARGS...`` and the :func:`archive` on stdin: unpack
#: into a private temporary folder (mode 0700, removed afterwards; regular files with relative
#: names only, and tarfile's ``data`` filter where it has one), then run MODULE (``probe``,
#: ``doctor_agent``, ``bench``) as ``python3 -m MODULE ARGS...`` would. Python >= 3.8.
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


#: Run with ``python3 -c MOUNTED MODULE ARGS...`` where :data:`AGENT_DIR` is bind-mounted at
#: :data:`MOUNT_POINT`: runs MODULE from there as ``python3 -m MODULE ARGS...`` would
#: (``sys.argv[0]`` is the module's file), leaving the image's ``PYTHONPATH`` and working
#: directory alone. Python >= 3.8.
MOUNTED = (
    "import runpy,sys\n"
    f"sys.path.insert(0,{MOUNT_POINT!r});mod=sys.argv[1];sys.argv=[mod]+sys.argv[2:]\n"
    "runpy.run_module(mod,run_name='__main__',alter_sys=True)\n"
)


def files() -> dict[str, bytes]:
    """Every ``*.py`` under :data:`AGENT_DIR` (``__pycache__`` excluded), by relative POSIX
    path, in sorted order."""
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
    """``sha256:<hex>`` of :func:`archive`."""
    return "sha256:" + hashlib.sha256(archive()).hexdigest()


def command(python: str, module: str, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``module`` of the payload fed on stdin (see :data:`BOOTSTRAP`)."""
    return [python, "-c", BOOTSTRAP, module, *args]


def mounted_command(python: str, module: str, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``module`` of :data:`AGENT_DIR` mounted at :data:`MOUNT_POINT`
    (see :data:`MOUNTED`)."""
    return [python, "-c", MOUNTED, module, *args]
