"""The in-node half of ``envbuild doctor``, printing JSON lines. Stdlib only (torch imported lazily), Python >= 3.8.
Every mode has a deadline, so a blocked port or a vanished peer never makes it hang."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from typing import Any

HELLO = b"envbuild-doctor"
ANSWER = b"ok\n"


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()


def _args(argv: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        key = argv[i]
        if not key.startswith("--") or i + 1 >= len(argv):
            raise SystemExit(f"doctor_agent: bad argument {key!r}")
        out[key[2:]] = argv[i + 1]
        i += 2
    return out


def sample_ports(lo: int, hi: int, k: int) -> list[int]:
    """K ports spread evenly over [lo, hi], ends included: (32768, 60999, 3) gives [32768, 46883, 60999]."""
    if k <= 0 or hi < lo:
        return []
    if k == 1:
        return [lo + (hi - lo) // 2]
    step = (hi - lo) / float(k - 1)
    out: list[int] = []
    for i in range(k):
        p = int(round(lo + i * step))
        if p not in out:
            out.append(p)
    return out


def _bind(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(64)
    except OSError:
        s.close()
        raise
    return s


def listen(opts: dict[str, str]) -> int:
    """Bind the ports and K from the ephemeral range (NCCL, gloo); answer hellos to deadline or ``expect-total``."""
    deadline = time.time() + float(opts.get("deadline-s", "30"))
    expect = int(opts.get("expect-total", "0"))
    ports = [int(p) for p in opts.get("ports", "").split(",") if p]
    socks: dict[int, socket.socket] = {}
    status: dict[str, str] = {}
    for p in ports:
        try:
            socks[p] = _bind(p)
            status[str(p)] = "listening"
        except OSError as e:
            status[str(p)] = "in-use" if e.errno == 98 else "error: %s" % (e.strerror or e)
    sample: list[int] = []
    k = int(opts.get("sample", "0"))
    if k:
        lo, hi = (int(x) for x in opts.get("range", "32768-60999").split("-"))
        # Try the evenly spread ports first, then their neighbours, until K are bound.
        for base in sample_ports(lo, hi, k):
            for p in [base + d for d in range(0, 64)] + [base - d for d in range(1, 64)]:
                if p < lo or p > hi or p in socks:
                    continue
                try:
                    socks[p] = _bind(p)
                except OSError:
                    continue
                sample.append(p)
                status[str(p)] = "listening"
                break
    _emit({"ports": status, "sample": sample})
    accepted: dict[str, list[str]] = {str(p): [] for p in socks}
    lock = threading.Lock()
    enough = threading.Event()

    def serve(port: int, sock: socket.socket) -> None:
        sock.settimeout(0.2)
        while time.time() < deadline and not enough.is_set():
            try:
                conn, _ = sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                conn.settimeout(max(0.1, deadline - time.time()))
                data = b""
                while not data.endswith(b"\n") and len(data) < 512:
                    chunk = conn.recv(512)
                    if not chunk:
                        break
                    data += chunk
                if data.startswith(HELLO):
                    conn.sendall(ANSWER)
                    who = data[len(HELLO):].strip().decode("utf-8", "replace")
                    with lock:
                        accepted[str(port)].append(who)
                        if expect and sum(len(v) for v in accepted.values()) >= expect:
                            enough.set()
            except OSError:
                pass
            finally:
                conn.close()

    threads = [threading.Thread(target=serve, args=(p, s)) for p, s in socks.items()]
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.time()) + 1)
    for s in socks.values():
        s.close()
    _emit({"accepted": accepted})
    return 0


def probe_port(host: str, port: int, name: str, timeout_s: float) -> dict[str, Any]:
    """Connect, hello, answer: ``ok``, ``open`` (other program), ``refused`` (RST), ``timeout`` (DROP), ``error``..."""
    t0 = time.time()

    def result(status: str, detail: str) -> dict[str, Any]:
        return {"status": status, "detail": detail, "seconds": round(time.time() - t0, 3)}

    try:
        s = socket.create_connection((host, port), timeout=timeout_s)
    except socket.timeout:
        return result("timeout", f"no answer within {timeout_s:g} s")
    except ConnectionRefusedError:
        return result("refused", "connection refused")
    except OSError as e:
        if e.errno in (101, 113):  # ENETUNREACH, EHOSTUNREACH
            return result("unreachable", e.strerror or str(e))
        return result("error", e.strerror or str(e))
    try:
        s.settimeout(max(0.1, timeout_s - (time.time() - t0)))
        s.sendall(HELLO + b" " + name.encode("utf-8") + b"\n")
        data = s.recv(16)
        if data.startswith(ANSWER.strip()):
            return result("ok", "connected")
        return result("open", f"connected, but the answer was {data[:16]!r}")
    except socket.timeout:
        return result("open", f"connected, but no answer within {timeout_s:g} s")
    except OSError as e:
        return result("open", "connected, then %s" % (e.strerror or e))
    finally:
        s.close()


def connect(opts: dict[str, str]) -> int:
    """Probe every target at once (threads), each within ``timeout-s``."""
    targets = json.loads(opts["targets"])
    timeout_s = float(opts.get("timeout-s", "3"))
    name = opts.get("from", "?")
    results: dict[str, Any] = {}

    def run(t: dict[str, Any]) -> None:
        results[t["id"]] = probe_port(t["host"], int(t["port"]), name, timeout_s)

    threads = [threading.Thread(target=run, args=(t,)) for t in targets]
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(timeout_s + 5)
    for t in targets:
        results.setdefault(t["id"], {"status": "timeout", "detail": "probe thread did not end", "seconds": None})
    _emit({"results": results})
    return 0


def round_robin(n: int) -> list[list[tuple]]:
    """Rounds of disjoint pairs covering every pair of n nodes once (circle method)."""
    ids: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    rounds: list[list[tuple]] = []
    for _ in range(m - 1):
        pairs: list[tuple] = []
        for i in range(m // 2):
            a, b = ids[i], ids[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ids = [ids[0]] + [ids[-1]] + ids[1:-1]
    return rounds


def _compute_python(iters: int) -> float:
    n = 24
    a = [[(i * n + j) % 7 / 7.0 for j in range(n)] for i in range(n)]
    b = [[(i + j) % 5 / 5.0 for j in range(n)] for i in range(n)]
    for _ in range(iters):
        c = [[sum(a[i][k] * b[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
        a = [[c[i][j] / (1.0 + c[i][j]) for j in range(n)] for i in range(n)]
    return a[0][0]


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def compute(opts: dict[str, str]) -> int:
    """Time this node's compute alone: R repeats (after a warm-up) of N MLP steps, one thread, pure Python."""
    backend = opts.get("backend", "gloo")
    iters = int(opts.get("iters", "100"))
    repeats = int(opts.get("repeats", "5"))
    torch = _torch()
    seconds: list[float] = []
    if torch is None:
        label = "python"
        for r in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            _compute_python(iters)
            if r:
                seconds.append(time.perf_counter() - t0)
    else:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        device = "cuda" if backend == "nccl" else "cpu"
        width = 2048 if device == "cuda" else 256
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).to(device)
        x = torch.randn(64, width, device=device)
        label = "torch-" + device
        for r in range(repeats + 1):  # the first is a warm-up
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                model.zero_grad()
                model(x).sum().backward()
            if device == "cuda":
                torch.cuda.synchronize()
            if r:
                seconds.append(time.perf_counter() - t0)
    _emit({"compute": {"backend": label, "iters": iters, "seconds": [round(s, 6) for s in seconds],
                       "best_s": round(min(seconds), 6) if seconds else None}})
    return 0


def pairs(opts: dict[str, str]) -> int:
    """An all-reduce with every other node, one pair at a time (round-robin rounds, pair (i, j)
    meets at ``A_min(i,j):port-base+round``), as Google's cluster-health-scanner tests pairs."""
    index = int(opts["index"])
    addrs = opts["addrs"].split(",")
    backend = opts.get("backend", "gloo")
    iters = int(opts.get("iters", "20"))
    size = int(opts.get("size", str(4 << 20)))
    timeout_s = float(opts.get("timeout-s", "60"))
    port_base = int(opts.get("port-base", "29600"))
    torch = _torch()
    if torch is None:
        _emit({"pairs": [], "error": "torch is not importable here: no pairwise all-reduce"})
        return 0
    import datetime

    import torch.distributed as dist

    device = "cuda" if backend == "nccl" else "cpu"
    numel = max(1, size // 4)
    out: list[dict[str, Any]] = []
    for rnd, chosen in enumerate(round_robin(len(addrs))):
        for a, b in chosen:
            if index not in (a, b):
                continue
            peer = b if index == a else a
            entry: dict[str, Any] = {"peer": peer, "round": rnd, "seconds": None, "error": None}
            try:
                dist.init_process_group(backend, init_method=f"tcp://{addrs[a]}:{port_base + rnd}",
                                        rank=0 if index == a else 1, world_size=2,
                                        timeout=datetime.timedelta(seconds=timeout_s))
                try:
                    t = torch.ones(numel, device=device)
                    for _ in range(2):
                        dist.all_reduce(t)
                    dist.barrier()
                    if device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        dist.all_reduce(t)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    entry["seconds"] = round(time.perf_counter() - t0, 6)
                finally:
                    dist.destroy_process_group()
            except Exception as e:  # a failed pair is a finding, not a crash
                entry["error"] = (f"{type(e).__name__}: {e}").splitlines()[0][:300]
            out.append(entry)
    _emit({"pairs": out})
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit("doctor_agent: give a mode: listen, connect, compute, pairs")
    modes = {"listen": listen, "connect": connect, "compute": compute, "pairs": pairs}
    if argv[0] not in modes:
        raise SystemExit(f"doctor_agent: unknown mode {argv[0]!r}")
    return modes[argv[0]](_args(argv[1:]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
