"""envbuild's in-image benchmark: the profiles' checks, one JSON result per rank.

Runs inside the image under torchrun with only the stdlib and torch, mounted read-only at ``/opt/envbuild/bench``;
writes only under ``--out`` and ``/tmp`` (read-only root, any UID). Exit: 0 result written (the host judges it), 3 the
test-only ``exit`` fault, 64 usage, 1 other failure (no result file). Options: ``python3 -m bench --help``.
"""

RESULT_SCHEMA = "envbuild.rank-result/3"

# Default sweep: 8 B to 8 MiB by x16; about 1 s on 2 gloo ranks sharing 2 CPU cores.
# GPU certification should pass larger sizes (nccl-tests sweeps up to 8G).
DEFAULT_SIZES = (8, 128, 2048, 32768, 524288, 8388608)
