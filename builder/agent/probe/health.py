"""The in-node half of the ``gpu-health`` check: NVML's health readings (in a child process with a
deadline: a hung NVML call cannot be interrupted in-process), XIDs of the kernel log, whether the PIDs
holding a GPU exist, InfiniBand/RoCE ports from sysfs. Prints one JSON document; judging is the host's."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

#: ``NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.`` (open-gpu-kernel-modules, nv.c).
_XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})[^)]{0,8}\): "
                     r"([0-9]{1,4})")
#: The inode of the initial PID namespace (include/linux/proc_ns.h PROC_PID_INIT_INO).
_INIT_PID_NS = "pid:[4026531836]"
_MAX_LOG_BYTES = 64 << 20
_MAX_XIDS = 1000


def _nvml_child(timeout_s: float) -> tuple[dict, list[str]]:
    """:func:`nvml.health` run by a child Python, killed after ``timeout_s``."""
    root = Path(__file__).resolve().parents[len((__package__ or "probe").split("."))]
    code = (f"import json,sys;sys.path.insert(0,{str(root)!r});from {__package__} import nvml;e=[];"
            "d=nvml.health(e);d['errors']=e;json.dump(d,sys.stdout)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the driver: left behind, never waited on
            proc.wait(2)
        return {"nvml": "timeout"}, [f"nvml: no answer within {timeout_s:g} s (a hung NVML call)"]
    try:
        doc = json.loads(out)
    except ValueError:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return {"nvml": "error"}, [f"nvml: the reader exited {proc.returncode}: {tail[0][:300]}"]
    return {**doc, "nvml": "ok"}, list(doc.pop("errors", []))


def _read_log(path: str) -> str:
    """A log file, or the kernel ring buffer (``/dev/kmsg``: read without blocking until its end)."""
    if path != "/dev/kmsg":
        with open(path, "rb") as f:
            return f.read(_MAX_LOG_BYTES).decode("utf-8", "replace")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    size = 0
    try:
        while size < _MAX_LOG_BYTES:
            try:
                chunks.append(os.read(fd, 8192))
                size += len(chunks[-1])
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno != errno.EPIPE:  # EPIPE: a record was overwritten while reading
                    raise
    finally:
        os.close(fd)
    return b"\n".join(chunks).decode("utf-8", "replace")


def _bus(domain: str, bus: str, device: str) -> tuple[int, int, int]:
    return int(domain, 16), int(bus, 16), int(device, 16)


def log_xids(text: str, gpus: list[dict]) -> list[dict]:
    """The ``NVRM: Xid`` lines of ``text``, each with the index of the GPU at its PCI address (or None)."""
    where = {}
    for g in gpus:
        m = re.fullmatch(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.[0-9A-Fa-f]", str(g.get("pci_bus_id")))
        if m:
            where[_bus(*m.groups())] = g["index"]
    out: list[dict] = []
    for line in text.splitlines():
        m = _XID_RE.search(line)
        if m and len(out) < _MAX_XIDS:
            out.append({"gpu_index": where.get(_bus(*m.groups()[:3])), "xid": int(m.group(4)), "source": "kernel log",
                        "line": line[m.start():m.start() + 300]})
    return out


def ib_ports(root: str) -> list[dict]:
    """``<root>/<device>/ports/<n>/{state,rate,link_layer}``: ``4: ACTIVE``, ``400 Gb/sec (4X NDR)``."""
    out = []
    for port in sorted(Path(root).glob("*/ports/*"))[:256]:
        rate = re.match(r"([0-9]{1,6}(?:\.[0-9]{1,3})?) Gb/sec", _sysfs(port, "rate"))
        out.append({"device": port.parent.parent.name[:64], "port": port.name[:8], "state": _sysfs(port, "state"),
                    "rate_gbps": float(rate.group(1)) if rate else None, "link_layer": _sysfs(port, "link_layer")})
    return out


def _sysfs(folder: Path, name: str) -> str:
    try:
        return (folder / name).read_text(encoding="utf-8", errors="replace").strip()[:100]
    except OSError:
        return ""


def _pid_exists(pid: int) -> bool | None:
    """Whether ``pid`` (a host PID, as NVML reports) runs; None outside the host's PID namespace."""
    try:
        if os.readlink("/proc/self/ns/pid") != _INIT_PID_NS:
            return None
    except OSError:
        return None
    return os.path.exists(f"/proc/{pid}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="probe.health")
    p.add_argument("--timeout-s", type=float, default=30.0)
    p.add_argument("--kernel-log", default="/dev/kmsg")
    p.add_argument("--ib-root", default="/sys/class/infiniband")
    a = p.parse_args(argv)
    doc, errors = _nvml_child(a.timeout_s)
    gpus = doc.get("gpus") or []
    for g in gpus:
        g["pids"] = [{"pid": pid, "exists": _pid_exists(pid)} for pid in g.get("pids") or []]
    xids, log_error = list(doc.get("xids") or []), None
    try:
        xids += log_xids(_read_log(a.kernel_log), gpus)
    except OSError as e:
        log_error = f"cannot read {a.kernel_log}: {e.strerror or e}"
    out = {"nvml": doc["nvml"], "gpus": gpus, "xids": xids[:_MAX_XIDS], "kernel_log": a.kernel_log,
           "kernel_log_error": log_error, "ib_ports": ib_ports(a.ib_root), "errors": errors[:100]}
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
