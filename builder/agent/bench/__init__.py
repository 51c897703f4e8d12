"""envbuild's in-image benchmark: all-reduce sweep, DDP steps, probe; one JSON per rank.

Runs INSIDE the image being certified, under torchrun, with only the stdlib and torch
(torchvision is used if present). The host mounts this directory read-only at
``/opt/envbuild/bench`` and ``builder/agent/probe/`` at ``/opt/envbuild/probe``, and sets
``PYTHONPATH=/opt/envbuild``. Nothing is written outside ``--out`` and ``/tmp``, so it
works with a read-only root filesystem, an arbitrary UID without a passwd entry and
``HOME`` on a tmpfs.

Launch, on each node R of N with G processes each::

    python3 -m torch.distributed.run --nnodes N --nproc-per-node G --node-rank R \\
        --master-addr node-0 --master-port 29500 -m bench --out /results [options]

Options (``python3 -m bench --help``):

==========================  ==========================================================
``--out DIR``               required; each rank writes ``DIR/rank-<RANK>.json``
``--backend gloo|nccl``     default nccl if ``torch.cuda.is_available()`` else gloo
``--sizes 8,1024,...``      all-reduce buffer sizes in bytes, comma-separated, each a
                            multiple of the element size (default ``DEFAULT_SIZES``)
``--iters 20``              timed all-reduce iterations per size
``--warmup 5``              untimed iterations before them
``--dtype float32``         float32 or float64
``--ddp-steps 3``           DDP optimizer steps; 0 skips DDP (``"ddp": null``)
``--ddp-batch 8``           images per step per rank (>= 2: BatchNorm needs it)
``--ddp-image-size 64``     synthetic images are 3 x S x S (S >= 32)
``--seed 0``                model-init seed (all ranks); data seed is rank-dependent
``--profiles ddp,fsdp``     profiles (``bench.profiles``: ddp, fsdp, tp, pipeline, moe,
                            all): their collectives over ``--sizes``/``--iters``/
                            ``--warmup``, training checks, scaling, numpy features
                            (default none: ``"profiles": null``)
``--dtypes float32``        element types of the profile collectives (default float32,
                            plus bfloat16 on nccl)
``--pg-timeout-s 600``      process-group timeout in seconds for every collective
``--heartbeat-s 2``         seconds between two heartbeats of the rank's heartbeat
                            process (0: phase lines only; :mod:`bench.progress`)
``--result-to-stdout``      also print the result document as one ``@@envbuild-result``
                            line on stdout (the local launcher reads it there)
==========================  ==========================================================

Every rank prints progress lines on stdout (``@@envbuild-progress {...}``: each phase it
enters, and heartbeats with its process state; :mod:`bench.progress`), so that the host
can name a rank that stopped making progress. The local launcher runs torchrun under the
node watchdog ``python3 -m bench.node --deadline-s S -- ...`` (:mod:`bench.node`), which
ends the node at its deadline even when nobody else is left to.

Exit status of the bench process (torchrun itself exits 0 only when all its local
workers exit 0, else 1):

- 0: the result file was written. Judging it (``wrong``, ``params_identical``,
  bandwidth) is the host's job: a wrong all-reduce still exits 0.
- 3: the TEST-ONLY ``exit`` fault fired on this rank (see :mod:`bench.faults`).
- 64: usage error (bad option, invalid ``ENVBUILD_BENCH_FAULT``, not under torchrun).
- 1: any other failure (Python traceback on stderr, e.g. a peer died or a collective
  timed out); no result file is written for this rank.

Result file ``<out>/rank-<RANK>.json``, schema ``envbuild.rank-result/1``, written
atomically (temporary file in the same directory, mode 0644, then ``os.replace``)::

    {"schema": "envbuild.rank-result/1",
     "run_id": str|null,               # $ENVBUILD_RUN_ID: the host refuses another run's
     "rank": int, "local_rank": int, "world_size": int,
     "node_rank": int|null,            # torchrun's GROUP_RANK
     "hostname": str,
     "backend": "gloo"|"nccl", "device": "cpu"|"cuda:<LOCAL_RANK>", "dtype": "float32",
     "options": {"sizes": [int], "iters": int, "warmup": int, "ddp_steps": int,
                 "ddp_batch": int, "ddp_image_size": int, "seed": int,
                 "pg_timeout_s": float},
     "socket": {"GLOO_SOCKET_IFNAME": str|null, "NCCL_SOCKET_IFNAME": str|null},
                                       # what this rank saw (the image's or the override)
     "allreduce": [{"size_bytes": int, "count": int, "type": "float32", "redop": "sum",
                    "time_us": float,          # max over ranks of the mean per iteration
                    "rank_time_us": [float],   # index = rank
                    "algbw_gbps": float,       # size_bytes / time / 1e9
                    "busbw_gbps": float,       # algbw * 2(n-1)/n, 0 for one rank
                    "wrong": int,              # this rank's elements != exact sum
                    "wrong_by_rank": [int]}],
     "ddp": null | {"model": "resnet18", "source": "torchvision"|"builtin",
                    "steps": int, "batch_size": int, "image_size": int,
                    "wall_s": float, "images_per_s": float,     # this rank
                    "final_loss": float|null,
                    "param_checksum": "<sha256 hex>",           # this rank
                    "checksums_by_rank": [str], "params_identical": bool,
                    "mismatched_ranks": [int]},  # differ from the most common checksum
                                                 # (tie: from rank 0's)
     "profiles": null | {...bench.profiles.run_profiles' dict...},
     "probe": {...envbuild.probe/1, see probe.py...} | null,
     "fault": null | "allreduce-corrupt@1",     # ENVBUILD_BENCH_FAULT, on every rank
     "errors": [str],                           # non-fatal problems (e.g. probe failed)
     "started_at": "2026-05-12T10:00:00.123Z", "finished_at": "...", "elapsed_s": float}

Rank 0 also prints an nccl-tests-like table (one line per size) and a DDP summary.
"""

RESULT_SCHEMA = "envbuild.rank-result/1"

# Default sweep: 8 B to 8 MiB by x16; about 1 s on 2 gloo ranks sharing 2 CPU cores.
# GPU certification should pass larger sizes (nccl-tests sweeps up to 8G).
DEFAULT_SIZES = (8, 128, 2048, 32768, 524288, 8388608)
