"""``python3 -m bench --out DIR`` under torchrun; per rank: the process group, the profiles, the probe,
``DIR/rank-<RANK>.json``."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time

from . import DEFAULT_SIZES, RESULT_SCHEMA, faults, progress

EXIT_USAGE = 64


class UsageError(Exception):
    """A bad option or environment; exit 64."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 by default; the project uses 64
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def parse_sizes(text: str) -> list[int]:
    """``"8,1024"`` -> ``[8, 1024]`` (bytes); ValueError on a bad item or an empty list."""
    sizes = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) <= 0:
            raise ValueError(f"size {item!r} is not a positive integer number of bytes")
        sizes.append(int(item))
    if not sizes:
        raise ValueError("no sizes given")
    return sizes


def _sizes_arg(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python3 -m bench", description="envbuild in-image benchmark; run under torchrun.")
    p.add_argument("--out", required=True, help="directory for rank-<RANK>.json")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="default: nccl if CUDA is available, else gloo")
    p.add_argument("--sizes", type=_sizes_arg, default=list(DEFAULT_SIZES),
                   help="collective sizes in bytes, comma-separated (default {})".format(
                       ",".join(str(s) for s in DEFAULT_SIZES)))
    p.add_argument("--iters", type=int, default=10, help="timed iterations per size")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per size")
    p.add_argument("--ddp-steps", type=int, default=3, help="steps of the DDP check")
    p.add_argument("--ddp-batch", type=int, default=4, help="images per step per rank (DDP check, scaling)")
    p.add_argument("--ddp-image-size", type=int, default=32, help="image side S (3xSxS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profiles", default="ddp",
                   help="comma list of ddp, fsdp, tp, pipeline, moe or all: their collectives "
                        "(over --sizes, --iters, --warmup) and training checks, scaling and the "
                        "numpy features (default: ddp)")
    p.add_argument("--dtypes", default="",
                   help="element types of the profile collectives, comma-separated (default: "
                        "float32, plus bfloat16 on nccl)")
    p.add_argument("--pg-timeout-s", type=float, default=600.0, help="process-group timeout in seconds")
    p.add_argument("--heartbeat-s", type=float, default=progress.DEFAULT_HEARTBEAT_S,
                   help="seconds between two progress heartbeats on stdout (0: phase lines only)")
    p.add_argument("--result-to-stdout", action="store_true",
                   help="also print the result document as one @@envbuild-result line on stdout")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check options; exits 64 with usage on a bad value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    problems = [msg for ok, msg in (
        (args.iters >= 1, "--iters must be >= 1"), (args.warmup >= 0, "--warmup must be >= 0"),
        (args.ddp_steps >= 1, "--ddp-steps must be >= 1"),
        (args.ddp_batch >= 2, "--ddp-batch must be >= 2 (BatchNorm needs 2 values per channel)"),
        (args.ddp_image_size >= 32, "--ddp-image-size must be >= 32"),
        (args.pg_timeout_s > 0, "--pg-timeout-s must be > 0"),
        (0 <= args.heartbeat_s <= 3600, "--heartbeat-s must be in 0..3600")) if not ok]
    from . import profiles

    try:
        args.profiles = ",".join(profiles.parse_profiles(args.profiles))
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        profiles.check_options(args.profiles, args.sizes, args.iters, args.warmup,
                               dtypes or None, args.backend or "gloo")
    except ValueError as e:
        problems.append(f"--profiles/--dtypes: {e}")
    if problems:
        parser.error("; ".join(problems))
    return args


def utc_now_iso() -> str:
    """UTC now, e.g. ``2026-05-12T10:00:00.123Z``."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def write_json_atomic(path: str, doc: dict) -> None:
    """Write ``doc`` as JSON, mode 0644 (the host may be another user), fsynced, then renamed over ``path``."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_probe():
    """``import probe`` (on PYTHONPATH in the image), else the ``probe/`` package of the source tree."""
    with contextlib.suppress(ImportError):
        import probe  # /opt/envbuild/probe/

        return probe
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probe")
    path = os.path.join(folder, "__init__.py")
    spec = importlib.util.spec_from_file_location("envbuild_probe", path, submodule_search_locations=[folder])
    if spec is None or spec.loader is None or not os.path.isfile(path):
        raise ImportError(f"no probe module on sys.path and no {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["envbuild_probe"] = mod  # its relative imports resolve through this name
    spec.loader.exec_module(mod)
    return mod


def _env_int(name: str) -> int | None:
    val = os.environ.get(name)
    if not val:
        return None
    try:
        return int(val)
    except ValueError:
        raise UsageError(f"environment {name}={val!r} is not an integer") from None


def _fire_early_fault(fault, rank: int, prog=None) -> None:
    if fault is None:
        return
    if fault.hits("sleep", rank):
        if prog is not None:
            prog.phase("test fault", f"sleep {faults.SLEEP_S:d} s")
        print(f"envbuild bench: TEST fault {fault}: rank {rank:d} sleeps {faults.SLEEP_S:d} s",
              file=sys.stderr, flush=True)
        time.sleep(faults.SLEEP_S)
    if fault.hits("oom", rank):
        print(f"envbuild bench: TEST fault {fault}: rank {rank:d} allocates up to {faults.OOM_MAX_BYTES:d} B",
              file=sys.stderr, flush=True)
        held = [b"\1" * (64 << 20) for _ in range(faults.OOM_MAX_BYTES >> 26)]
        del held
        os._exit(faults.EXIT_CODE)
    if fault.hits("exit", rank):
        print(f"envbuild bench: TEST fault {fault}: rank {rank:d} exits with {faults.EXIT_CODE:d}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(faults.EXIT_CODE)


def _profiles_step(args, rank, device, backend, lead, log, prog, errors):
    """The profiles section, or None when its fault spec is invalid (said in ``errors`` on every rank)."""
    from . import profiles

    prog.phase("profiles", args.profiles, collective=True)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] or None
    try:
        return profiles.run_profiles(args.profiles, list(args.sizes), args.iters, args.warmup, dtypes,
                                     args.seed, device, backend, log=log if lead else None,
                                     ddp=(args.ddp_steps, args.ddp_batch, args.ddp_image_size))
    except ValueError as e:
        errors.append(f"profiles not run: {e}")
        return None


def _environment():
    """``(fault, rank, world, local_rank, node_rank)`` from torchrun's environment; UsageError otherwise."""
    try:
        fault = faults.parse_fault(os.environ.get(faults.ENV_VAR))
    except ValueError as e:
        raise UsageError(str(e)) from e
    rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    if rank is None or world is None or local_rank is None:
        raise UsageError("RANK, WORLD_SIZE and LOCAL_RANK are unset: launch under torchrun")
    return fault, rank, world, local_rank, _env_int("GROUP_RANK")


def _result_doc(args, run_id, rank, local_rank, world, node_rank, backend, device, probe_doc, fault,
                errors, started_at, profiles_doc) -> dict:
    """The rank result document (:class:`builder.core.documents.RankResult`); times set later."""
    return {
        "schema": RESULT_SCHEMA, "run_id": run_id, "rank": rank, "local_rank": local_rank, "world_size": world,
        "node_rank": node_rank, "hostname": socket.gethostname(), "backend": backend, "device": device,
        "options": {
            "sizes": list(args.sizes), "iters": args.iters, "warmup": args.warmup,
            "ddp_steps": args.ddp_steps, "ddp_batch": args.ddp_batch,
            "ddp_image_size": args.ddp_image_size, "seed": args.seed,
            "pg_timeout_s": args.pg_timeout_s,
        },
        "socket": {k: os.environ.get(k) for k in progress.SOCKET_VARS}, "profiles": profiles_doc,
        "probe": probe_doc, "fault": None if fault is None else str(fault), "errors": errors,
        "started_at": started_at, "finished_at": None, "elapsed_s": None,
    }


def run(args: argparse.Namespace) -> int:
    """Run every step for this rank and write its result file; returns 0."""
    started_at, t_start = utc_now_iso(), time.perf_counter()
    fault, rank, world, local_rank, node_rank = _environment()
    run_id = os.environ.get("ENVBUILD_RUN_ID") or None
    prog = progress.Progress(rank, run_id, args.heartbeat_s)
    prog.start()
    errors = []
    if fault is not None and fault.rank >= world:
        errors.append(f"fault {fault} targets no rank of a world of {world:d}")

    import torch
    import torch.distributed as dist

    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank:d}"
    else:
        device = "cpu"
    prog.phase("init", f"process group ({backend})", collective=True)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.pg_timeout_s))
    lead, log = rank == 0, prog.writer.line
    if lead:
        log(f"# envbuild bench: world {world:d}, backend {backend}, device {device}, "
            f"iters {args.iters:d}, warmup {args.warmup:d}, DDP check {args.ddp_steps:d} steps x "
            f"{args.ddp_batch:d} images of {args.ddp_image_size:d} px per rank")
        if fault is not None:
            log(f"# TEST-ONLY fault injected: {fault}")

    _fire_early_fault(fault, rank, prog)

    profiles_doc = _profiles_step(args, rank, device, backend, lead, log, prog, errors)

    prog.phase("probe")
    probe_doc = None
    try:
        probe_doc = load_probe().collect()
    except Exception as e:
        errors.append(f"probe failed: {type(e).__name__}: {e}")

    result = _result_doc(args, run_id, rank, local_rank, world, node_rank, backend, device, probe_doc,
                         fault, errors, started_at, profiles_doc)
    prog.phase("write")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rank-{rank:d}.json")
    result["finished_at"] = utc_now_iso()
    result["elapsed_s"] = time.perf_counter() - t_start
    write_json_atomic(path, result)
    if args.result_to_stdout:
        prog.result(result)
    if lead:
        log("# rank 0 wrote {} in {:.1f} s".format(path, result["elapsed_s"]))
    prog.phase("done")
    prog.stop()
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        print(f"python3 -m bench: error: {e}", file=sys.stderr)
        return EXIT_USAGE


def fast_exit(code: int) -> None:
    """Flush and ``os._exit`` once the result is written: skipping torch's teardown saves 1-3 s per rank."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    fast_exit(main())
