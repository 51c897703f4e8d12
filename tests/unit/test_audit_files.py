"""Every Dockerfile and definition under tests/audit/ with its expected verdict: the exit
code of `envbuild audit FILE` and the literal finding lines it prints (stderr). Each file
with a fault has a twin (`NAME.ok.*`) without it, with its own expected verdict.

The files are modelled on public patterns: multi-stage builds (COPY --from, %files from),
ARG-driven pins (quoted defaults, ARG before FROM, re-declared after it, ${A%.*} forms),
conda installs, NGC and pytorch/pytorch bases, localimage/debootstrap/library bootstraps,
an extra index that lets PyPI win, a CUDA mismatch between the wheel and the base, a
second NCCL from apt or a .deb, loopback socket interfaces, BuildKit here-documents, Apptainer
%arguments and several %files, requirement, constraint and conda environment files read from
the build context, the escape directive, &&/||/if/case decided or "cannot tell", and the
malformed cases (merge conflict, no FROM, a command in a definition's header, a duplicate
section, a bad escape token, %files from an unknown stage).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from builder.cli import app

ROOT = Path(__file__).resolve().parents[2]
DIR = "tests/audit"

#: (file under tests/audit/, exit code, the lines on stderr in order)
CASES = [
    ("arg-pins.Dockerfile", 1, [
        "warning: tests/audit/arg-pins.Dockerfile: line 4: 'nvidia/cuda:12.1.1-base-ubuntu22.04': no torch install found in the stages the final image uses (audit reads pip, uv and conda installs; requirement files are not followed) [audit]",
        "warning: tests/audit/arg-pins.Dockerfile: line 7: 'torch==${TORCH_VERSION}+cu${CUDA}': a pip install argument cannot be expanded: ARG TORCH_VERSION (line 3) is declared before FROM only: declare it again in the stage (ARG TORCH_VERSION) to use it there; audited without it [audit]",
    ]),
    ("arg-pins.ok.Dockerfile", 0, [
        "note: tests/audit/arg-pins.ok.Dockerfile: line 8: 'torch==2.4.0+cu121' (TORCH_VERSION: ARG at line 3, CUDA: ARG at line 2): cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("arguments.def", 2, [
        "error: tests/audit/arguments.def: line 11: 'torch==2.1.2+cu118' (TORCH: %arguments at line 6, VARIANT: %arguments at line 7): torch variant cu118 is CUDA 11.8 but the image's CUDA is 12.1; the major versions must match (use cu121 or CUDA 11.8) [compat.md §5.5 (V)]",
        "note: tests/audit/arguments.def: line 11: 'torch==2.1.2+cu118' (TORCH: %arguments at line 6, VARIANT: %arguments at line 7): cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("arguments.ok.def", 0, [
        "note: tests/audit/arguments.ok.def: line 11: 'torch==2.1.2+cu121' (TORCH: %arguments at line 6, VARIANT: %arguments at line 7): cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("base-driver.Dockerfile", 1, [
        "warning: tests/audit/base-driver.Dockerfile: line 3: 'nvcr.io/nvidia/pytorch:24.08-py3': driver 550.142 is below 560.28.03 (CUDA 12.6 GA), which the base image's CUDA 12.6.0 needs: it runs only under minor-version compatibility (no PTX JIT, some APIs fail) [NV-MVC (V)]",
        "note: tests/audit/base-driver.Dockerfile: line 3: 'nvcr.io/nvidia/pytorch:24.08-py3': torch 2.5.0a0 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-24-08 (U)]",
    ]),
    ("base-driver.ok.Dockerfile", 0, [
        "note: tests/audit/base-driver.ok.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:24.05-py3': torch 2.4.0a0 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-24-05 (U)]",
    ]),
    ("conda-channel.Dockerfile", 2, [
        "error: tests/audit/conda-channel.Dockerfile: line 3: 'pytorch=2.6.0': the pytorch conda channel has no pytorch 2.6.0: 2.5 was the last release published there; install the wheel (pip install torch==2.6.0+cpu --index-url https://download.pytorch.org/whl/cpu) [PT-CONDA (M)]",
    ]),
    ("conda-channel.ok.Dockerfile", 1, [
        "warning: tests/audit/conda-channel.ok.Dockerfile: line 2: 'pytorch=2.5.1': pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; --to-recipe writes the wheel of the same release and variant [PT-CONDA (M)]",
    ]),
    ("conda.Dockerfile", 2, [
        "error: tests/audit/conda.Dockerfile: line 3: 'pytorch==2.1.0': torch variant cu121 is CUDA 12.1 but the image's CUDA is 11.8; the major versions must match (use cu118 or CUDA 12.1) [compat.md §5.5 (V)]",
        "warning: tests/audit/conda.Dockerfile: line 3: 'pytorch==2.1.0': pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; --to-recipe writes the wheel of the same release and variant [PT-CONDA (M)]",
        "note: tests/audit/conda.Dockerfile: line 3: 'pytorch==2.1.0': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("conda.ok.Dockerfile", 1, [
        "warning: tests/audit/conda.ok.Dockerfile: line 2: 'pytorch==2.1.0': pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; --to-recipe writes the wheel of the same release and variant [PT-CONDA (M)]",
        "note: tests/audit/conda.ok.Dockerfile: line 2: 'pytorch==2.1.0': cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("conflict.Dockerfile", 3, [
        "error: tests/audit/conflict.Dockerfile: line 2: unresolved merge-conflict marker '<<<<<<< HEAD'",
    ]),
    ("conflict.ok.Dockerfile", 0, [
        "note: tests/audit/conflict.ok.Dockerfile: line 3: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("cu-mismatch.Dockerfile", 2, [
        "error: tests/audit/cu-mismatch.Dockerfile: line 5: 'torch==2.5.1+cu121': torch 2.5.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/cu-mismatch.Dockerfile: line 5: 'torch==2.5.1+cu121': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("cu-mismatch.ok.Dockerfile", 0, [
        "note: tests/audit/cu-mismatch.ok.Dockerfile: line 5: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("cuda-two-part.Dockerfile", 2, [
        "error: tests/audit/cuda-two-part.Dockerfile: line 4: 'torch==1.7.1+cu101': torch variant cu101 is CUDA 10.1 but the image's CUDA is 11.0; the major versions must match (use cu110 or CUDA 10.1) [compat.md §5.5 (V)]",
        "note: tests/audit/cuda-two-part.Dockerfile: line 4: 'torch==1.7.1+cu101': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("cuda-two-part.ok.Dockerfile", 0, [
        "note: tests/audit/cuda-two-part.ok.Dockerfile: line 4: 'torch==1.7.1+cu110': cu110 needs driver >= 450.51.05 (CUDA 11.0 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("debootstrap.def", 2, [
        "error: tests/audit/debootstrap.def: line 1: 'ubuntu:focal': torch 2.6.0 has wheels for Python 3.9 to 3.13, not 3.8 [S1 (V)]",
    ]),
    ("debootstrap.ok.def", 0, [
    ]),
    ("duplicate-section.def", 3, [
        'error: tests/audit/duplicate-section.def: line 11: duplicate section %post (first at line 4)',
    ]),
    ("duplicate-section.ok.def", 0, [
    ]),
    ("glibc.Dockerfile", 2, [
        "error: tests/audit/glibc.Dockerfile: line 2: 'ubuntu:18.04': torch 2.7.0+cpu wheels are manylinux_2_28 and need glibc >= 2.28; ubuntu 18.04 has glibc 2.27 [S1, pytorch#141565 (V)]",
    ]),
    ("glibc.ok.Dockerfile", 0, [
    ]),
    ("header-command.def", 3, [
        "error: tests/audit/header-command.def: line 3: a command in the header ('apt-get update && apt-get install -y python3-pip') outside any section; commands belong in %post",
    ]),
    ("header-command.ok.def", 0, [
        "note: tests/audit/header-command.ok.def: line 6: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("heredoc.Dockerfile", 2, [
        "error: tests/audit/heredoc.Dockerfile: line 8: 'https://download.pytorch.org/whl/cu128': index.torch_url https://download.pytorch.org/whl/cu128 is the cu128 index but the variant is cu126: pip finds no torch==2.8.0+cu126 there; use https://download.pytorch.org/whl/cu126 or leave index.torch_url out [PT-IDX (V)]",
        "error: tests/audit/heredoc.Dockerfile: line 8: 'torch==2.8.0+cu126': torch 2.8.0+cu126 (from the local version +cu126) is built for CUDA 12.6 but the base image nvidia/cuda:12.8.1-base-ubuntu24.04 has CUDA 12.8.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu128 or a CUDA 12.6 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/heredoc.Dockerfile: line 8: 'torch==2.8.0+cu126': cu126 needs driver >= 560.28.03 (CUDA 12.6 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("heredoc.ok.Dockerfile", 0, [
        "note: tests/audit/heredoc.ok.Dockerfile: line 8: 'torch==2.8.0+cu128': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("library.def", 1, [
        "warning: tests/audit/library.def: line 6: 'torch==2.6.0': torch==2.6.0 comes from --extra-index-url https://download.pytorch.org/whl/cpu with PyPI still read: pip takes the highest matching version of every index, so PyPI's torch 2.6.0 (its cu124 build) can be installed instead of +cpu; pin torch==2.6.0+cpu or use --index-url https://download.pytorch.org/whl/cpu [compat.md §5.1 (V)]",
    ]),
    ("library.ok.def", 0, [
    ]),
    ("localimage.def", 2, [
        "warning: tests/audit/localimage.def: line 2: '/shared/images/cuda-base.sif': base image: localimage '/shared/images/cuda-base.sif' is an image file: its CUDA, OS and Python are not in the definition; the rules on what it does not say are skipped [audit]",
        "error: tests/audit/localimage.def: line 5: 'torch': torch is not pinned to one release: pip installs the newest matching one, and which CUDA build that is changes from release to release; pin one release and its build, e.g. torch==2.14.1+cu130 --index-url https://download.pytorch.org/whl/cu130 [compat.md §5.1 (V)]",
    ]),
    ("localimage.ok.def", 1, [
        "warning: tests/audit/localimage.ok.def: line 2: '/shared/images/cuda-base.sif': base image: localimage '/shared/images/cuda-base.sif' is an image file: its CUDA, OS and Python are not in the definition; the rules on what it does not say are skipped [audit]",
        "note: tests/audit/localimage.ok.def: line 5: 'torch==2.6.0+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("loopback.Dockerfile", 2, [
        "error: tests/audit/loopback.Dockerfile: line 4: 'GLOO_SOCKET_IFNAME=lo': GLOO_SOCKET_IFNAME=lo selects only the loopback interface; ranks on 2 nodes cannot reach each other over it (remove it, or name the interface the nodes share, e.g. eth0) [NCCL-ENV, multinode.md (M)]",
        "error: tests/audit/loopback.Dockerfile: line 5: 'TP_SOCKET_IFNAME=lo': TP_SOCKET_IFNAME=lo selects only the loopback interface; ranks on several nodes cannot reach each other over it (remove it, or name the interface the nodes share, e.g. eth0) [NCCL-ENV, multinode.md (M)]",
    ]),
    ("loopback.ok.Dockerfile", 0, [
    ]),
    ("multistage.Dockerfile", 2, [
        "error: tests/audit/multistage.Dockerfile: line 6: 'torch==2.4.1+cu121': torch 2.4.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/multistage.Dockerfile: line 6: 'torch==2.4.1+cu121': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "note: tests/audit/multistage.Dockerfile: line 9: 'docs': stage docs is not used by the final image; its installs are not audited [audit]",
    ]),
    ("multistage.def", 2, [
        "note: tests/audit/multistage.def: line 8: 'torch==2.5.1': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "error: tests/audit/multistage.def: line 19: 'NCCL_SOCKET_IFNAME=lo': NCCL_SOCKET_IFNAME=lo selects only the loopback interface; ranks on 2 nodes cannot reach each other over it (remove it, or name the interface the nodes share, e.g. eth0) [NCCL-ENV, multinode.md (M)]",
    ]),
    ("multistage.ok.Dockerfile", 0, [
        "note: tests/audit/multistage.ok.Dockerfile: line 6: 'torch==2.4.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "note: tests/audit/multistage.ok.Dockerfile: line 9: 'docs': stage docs is not used by the final image; its installs are not audited [audit]",
    ]),
    ("multistage.ok.def", 0, [
        "note: tests/audit/multistage.ok.def: line 8: 'torch==2.5.1': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("ngc-2019.Dockerfile", 2, [
        "error: tests/audit/ngc-2019.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:19.10-py3': base image nvcr.io/nvidia/pytorch:19.10-py3 already ships PyTorch: installing torch 1.3.0+cu101 makes a second one; start from its CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian) [NGC PyTorch container release notes (PyTorch preinstalled) (V)]",
        "note: tests/audit/ngc-2019.Dockerfile: line 3: 'torch==1.3.0': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("ngc-2019.ok.Dockerfile", 0, [
        "note: tests/audit/ngc-2019.ok.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:19.10-py3': torch 1.3.0a0 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-19-10 (U)]",
    ]),
    ("ngc-companion.Dockerfile", 1, [
        "note: tests/audit/ngc-companion.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:24.08-py3': torch 2.5.0a0 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-24-08 (U)]",
        "warning: tests/audit/ngc-companion.Dockerfile: line 3: 'torchaudio': torchaudio is not pinned over the base image's torch 2.5.0a0: pip installs the newest torchaudio, whose wheel requires its own torch release, and may replace the base's torch and its CUDA; use the torchaudio the image ships, or pin the release of its torch [S1-COMP, NGC-RN rel-24-08 (U)]",
    ]),
    ("ngc-companion.ok.Dockerfile", 0, [
        "note: tests/audit/ngc-companion.ok.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:24.08-py3': torch 2.5.0a0 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-24-08 (U)]",
    ]),
    ("ngc-old.Dockerfile", 2, [
        "error: tests/audit/ngc-old.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:21.05-py3': base image nvcr.io/nvidia/pytorch:21.05-py3 already ships PyTorch: installing torch 1.8.1+cu102 makes a second one; start from its CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian) [NGC PyTorch container release notes (PyTorch preinstalled) (V)]",
        "error: tests/audit/ngc-old.Dockerfile: line 3: 'torch==1.8.1+cu102': torch variant cu102 is CUDA 10.2 but the image's CUDA is 11.3; the major versions must match (use cu111 or CUDA 10.2) [compat.md §5.5 (V)]",
        "note: tests/audit/ngc-old.Dockerfile: line 3: 'torch==1.8.1+cu102': cu102 needs driver >= 440.33 (CUDA 10.2 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("ngc-old.ok.Dockerfile", 0, [
        "note: tests/audit/ngc-old.ok.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:21.05-py3': torch 1.9.0a0 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-21-05 (U)]",
    ]),
    ("ngc.Dockerfile", 2, [
        "error: tests/audit/ngc.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:25.12-py3': base image nvcr.io/nvidia/pytorch:25.12-py3 already ships PyTorch: installing torch 2.10.0+cu130 makes a second one; start from its CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian) [NGC PyTorch container release notes (PyTorch preinstalled) (V)]",
        "error: tests/audit/ngc.Dockerfile: line 3: 'torch==2.10.0': torch 2.10.0+cu130 (from --index-url https://download.pytorch.org/whl/cu130) is built for CUDA 13.0 but the base image nvcr.io/nvidia/pytorch:25.12-py3 has CUDA 13.1.0: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use a CUDA 13.0 base (torch 2.10.0 has no cu131 build) [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/ngc.Dockerfile: line 3: 'torch==2.10.0': cu130 needs driver >= 580.65.06 (CUDA 13.0 GA); >= 580 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("ngc.ok.Dockerfile", 0, [
        "note: tests/audit/ngc.ok.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:25.12-py3': torch 2.10.0a0+b4e4ee81d3 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-25-12 (M)]",
    ]),
    ("no-build.Dockerfile", 2, [
        "error: tests/audit/no-build.Dockerfile: line 4: 'torch==2.5.1': torch 2.5.1 has no cu126 build; builds exist for cu118, cu121, cu124 [S2 (V)]",
        "note: tests/audit/no-build.Dockerfile: line 4: 'torch==2.5.1': cu126 needs driver >= 560.28.03 (CUDA 12.6 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("no-build.ok.Dockerfile", 0, [
        "note: tests/audit/no-build.ok.Dockerfile: line 3: 'torch==2.7.0': cu126 needs driver >= 560.28.03 (CUDA 12.6 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("no-from.Dockerfile", 3, [
        'error: tests/audit/no-from.Dockerfile: line 2: no FROM instruction; a Dockerfile starts its first stage with FROM',
    ]),
    ("no-from.ok.Dockerfile", 0, [
    ]),
    ("old-conda.Dockerfile", 2, [
        "error: tests/audit/old-conda.Dockerfile: line 4: 'pytorch==1.10.1': torch variant cu102 is CUDA 10.2 but the image's CUDA is 11.3; the major versions must match (use cu111 or cu113 or CUDA 10.2) [compat.md §5.5 (V)]",
        "warning: tests/audit/old-conda.Dockerfile: line 4: 'pytorch==1.10.1': pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; it is judged as the wheel of the same release (recipes start at torch 2.0.0) [PT-CONDA (M)]",
        "note: tests/audit/old-conda.Dockerfile: line 4: 'pytorch==1.10.1': cu102 needs driver >= 440.33 (CUDA 10.2 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-conda.ok.Dockerfile", 1, [
        "warning: tests/audit/old-conda.ok.Dockerfile: line 3: 'pytorch==1.10.1': pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; it is judged as the wheel of the same release (recipes start at torch 2.0.0) [PT-CONDA (M)]",
        "note: tests/audit/old-conda.ok.Dockerfile: line 3: 'pytorch==1.10.1': cu113 needs driver >= 465.19.01 (CUDA 11.3 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-minor.Dockerfile", 2, [
        "error: tests/audit/old-minor.Dockerfile: line 4: 'torch==1.7.1+cu110': torch 1.7.1+cu110 (from the local version +cu110) is built for CUDA 11.0 but the base image nvidia/cuda:11.1.1-cudnn8-runtime-ubuntu20.04 has CUDA 11.1.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use a CUDA 11.0 base (torch 1.7.1 has no cu111 build) [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/old-minor.Dockerfile: line 4: 'torch==1.7.1+cu110': cu110 needs driver >= 450.51.05 (CUDA 11.0 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-minor.ok.Dockerfile", 0, [
        "note: tests/audit/old-minor.ok.Dockerfile: line 4: 'torch==1.8.1+cu111': cu111 needs driver >= 455.23 (CUDA 11.1 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-python.Dockerfile", 1, [
        "warning: tests/audit/old-python.Dockerfile: line 3: 'python:3.9-slim-bullseye': torch 1.4.0 has wheels for Python 3.5 to 3.8, not 3.9 [S1 (U)]",
        "note: tests/audit/old-python.Dockerfile: line 4: 'torch==1.4.0': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-python.ok.Dockerfile", 0, [
        "note: tests/audit/old-python.ok.Dockerfile: line 3: 'torch==1.4.0': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-pytorch-tag.Dockerfile", 1, [
        "warning: tests/audit/old-pytorch-tag.Dockerfile: line 2: 'pytorch/pytorch:1.3-cuda10.1-cudnn7-devel': base image: the OS and Python of pytorch/pytorch images are not in the tag; the rules on what it does not say are skipped [PT-IMG]",
        "note: tests/audit/old-pytorch-tag.Dockerfile: line 2: 'pytorch/pytorch:1.3-cuda10.1-cudnn7-devel': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
        "note: tests/audit/old-pytorch-tag.Dockerfile: line 2: 'pytorch/pytorch:1.3-cuda10.1-cudnn7-devel': torch 1.3.0 comes with the base image (no pip or conda install of torch in this file) [PT-IMG]",
        "warning: tests/audit/old-pytorch-tag.Dockerfile: line 3: 'torchvision==0.5.0': torchvision==0.5.0 does not pair with torch 1.3.0: torchvision 0.4.1 is the release for it (its wheel requires torch==1.3.0); use torchvision==0.4.1 [S1-COMP PT-PREV torch==1.3.0 torchvision==0.4.1 (U)]",
    ]),
    ("old-pytorch-tag.ok.Dockerfile", 1, [
        "warning: tests/audit/old-pytorch-tag.ok.Dockerfile: line 2: 'pytorch/pytorch:1.3-cuda10.1-cudnn7-devel': base image: the OS and Python of pytorch/pytorch images are not in the tag; the rules on what it does not say are skipped [PT-IMG]",
        "note: tests/audit/old-pytorch-tag.ok.Dockerfile: line 2: 'pytorch/pytorch:1.3-cuda10.1-cudnn7-devel': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
        "note: tests/audit/old-pytorch-tag.ok.Dockerfile: line 2: 'pytorch/pytorch:1.3-cuda10.1-cudnn7-devel': torch 1.3.0 comes with the base image (no pip or conda install of torch in this file) [PT-IMG]",
    ]),
    ("old-release.Dockerfile", 2, [
        "error: tests/audit/old-release.Dockerfile: line 6: 'torch==1.6.0+cu101': torch variant cu101 is CUDA 10.1 but the image's CUDA is 11.0; the major versions must match (torch 1.6.0 has no CUDA 11 build; use CUDA 10.1) [compat.md §5.5 (V)]",
        "note: tests/audit/old-release.Dockerfile: line 6: 'torch==1.6.0+cu101': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("old-release.ok.Dockerfile", 0, [
        "note: tests/audit/old-release.ok.Dockerfile: line 6: 'torch==1.6.0+cu101': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("pypi-wins.Dockerfile", 1, [
        "warning: tests/audit/pypi-wins.Dockerfile: line 4: 'torch==2.1.0': torch==2.1.0 comes from --extra-index-url https://download.pytorch.org/whl/cu118 with PyPI still read: pip takes the highest matching version of every index, so PyPI's torch 2.1.0 (its cu121 build) can be installed instead of +cu118; pin torch==2.1.0+cu118 or use --index-url https://download.pytorch.org/whl/cu118 [compat.md §5.1 (V)]",
        "note: tests/audit/pypi-wins.Dockerfile: line 4: 'torch==2.1.0': cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("pypi-wins.ok.Dockerfile", 0, [
        "note: tests/audit/pypi-wins.ok.Dockerfile: line 3: 'torch==2.1.0': cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("python-image.Dockerfile", 2, [
        "error: tests/audit/python-image.Dockerfile: line 2: 'python:3.8-slim-bookworm': torch 2.5.1 has wheels for Python 3.9 to 3.13, not 3.8 [S1 (V)]",
    ]),
    ("python-image.ok.Dockerfile", 0, [
    ]),
    ("python-os.Dockerfile", 2, [
        "error: tests/audit/python-os.Dockerfile: line 2: 'ubuntu:20.04': torch 2.5.1 has wheels for Python 3.9 to 3.13, not 3.8 [S1 (V)]",
    ]),
    ("python-os.ok.Dockerfile", 0, [
    ]),
    ("pytorch-base.Dockerfile", 2, [
        "warning: tests/audit/pytorch-base.Dockerfile: line 1: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime': base image: the OS and Python of pytorch/pytorch images are not in the tag; the rules on what it does not say are skipped [PT-IMG]",
        "note: tests/audit/pytorch-base.Dockerfile: line 1: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "note: tests/audit/pytorch-base.Dockerfile: line 1: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime': torch 2.5.1 comes with the base image (no pip or conda install of torch in this file) [PT-IMG]",
        "error: tests/audit/pytorch-base.Dockerfile: line 2: 'torchvision==0.2.2': torchvision==0.2.2 does not pair with torch 2.5.1: torchvision 0.20.1 is the release for it (its wheel requires torch==2.5.1); use torchvision==0.20.1 [S1-COMP torchvision-0.20.1-cp311-cp311-manylinux1_x86_64.whl (V)]",
    ]),
    ("pytorch-base.ok.Dockerfile", 1, [
        "warning: tests/audit/pytorch-base.ok.Dockerfile: line 1: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime': base image: the OS and Python of pytorch/pytorch images are not in the tag; the rules on what it does not say are skipped [PT-IMG]",
        "note: tests/audit/pytorch-base.ok.Dockerfile: line 1: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "note: tests/audit/pytorch-base.ok.Dockerfile: line 1: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime': torch 2.5.1 comes with the base image (no pip or conda install of torch in this file) [PT-IMG]",
        "note: tests/audit/pytorch-base.ok.Dockerfile: line 2: '/tmp/requirements.txt': a requirements file is not followed (audit reads this file only); the pins in it are not judged [audit]",
    ]),
    ("pytorch-companion.Dockerfile", 1, [
        "warning: tests/audit/pytorch-companion.Dockerfile: line 2: 'pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime': base image: the OS and Python of pytorch/pytorch images are not in the tag; the rules on what it does not say are skipped [PT-IMG]",
        "note: tests/audit/pytorch-companion.Dockerfile: line 2: 'pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime': cu102 needs driver >= 440.33 (CUDA 10.2 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
        "note: tests/audit/pytorch-companion.Dockerfile: line 2: 'pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime': torch 1.9.0 comes with the base image (no pip or conda install of torch in this file) [PT-IMG]",
        "warning: tests/audit/pytorch-companion.Dockerfile: line 3: 'torchaudio': torchaudio is not pinned over the base image's torch 1.9.0: pip installs the newest torchaudio, whose wheel requires its own torch release, and may replace the base's torch and its CUDA; pin torchaudio==0.9.0 [S1-COMP, PT-IMG]",
    ]),
    ("pytorch-companion.ok.Dockerfile", 1, [
        "warning: tests/audit/pytorch-companion.ok.Dockerfile: line 2: 'pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime': base image: the OS and Python of pytorch/pytorch images are not in the tag; the rules on what it does not say are skipped [PT-IMG]",
        "note: tests/audit/pytorch-companion.ok.Dockerfile: line 2: 'pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime': cu102 needs driver >= 440.33 (CUDA 10.2 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
        "note: tests/audit/pytorch-companion.ok.Dockerfile: line 2: 'pytorch/pytorch:1.9.0-cuda10.2-cudnn7-runtime': torch 1.9.0 comes with the base image (no pip or conda install of torch in this file) [PT-IMG]",
    ]),
    ("ranged.Dockerfile", 2, [
        "error: tests/audit/ranged.Dockerfile: line 4: 'torch>=2.0': torch>=2.0 is not pinned to one release: pip installs the newest matching one, and which CUDA build that is changes from release to release; pin one release and its build, e.g. torch==2.14.1+cpu --index-url https://download.pytorch.org/whl/cpu [compat.md §5.1 (V)]",
        "warning: tests/audit/ranged.Dockerfile: line 4: 'torch>=2.0': torch>=2.0 comes from --extra-index-url https://download.pytorch.org/whl/cpu with PyPI still read: pip takes the highest matching version of every index, so PyPI's torch can be installed instead of +cpu; use --index-url https://download.pytorch.org/whl/cpu [compat.md §5.1 (V)]",
    ]),
    ("ranged.ok.Dockerfile", 0, [
    ]),
    ("runtime-flavour.Dockerfile", 1, [
        "warning: tests/audit/runtime-flavour.Dockerfile: line 2: 'nvidia/cuda:12.8.1-runtime-ubuntu24.04': the runtime flavour ships a system libnccl2 2.25.1 beside torch's NCCL 2.27.3: two NCCLs in one image; prefer the base flavour [compat.md §4 (S)]",
        "note: tests/audit/runtime-flavour.Dockerfile: line 4: 'torch==2.8.0': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("runtime-flavour.ok.Dockerfile", 0, [
        "note: tests/audit/runtime-flavour.ok.Dockerfile: line 3: 'torch==2.8.0': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("second-nccl.Dockerfile", 2, [
        "error: tests/audit/second-nccl.Dockerfile: line 3: 'libnccl2=2.21.5-1+cuda12.4': libnccl2=2.21.5-1+cuda12.4 is a second NCCL: torch 2.5.1+cu124 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.21.5); remove it [compat.md §5.3 (V)]",
        "error: tests/audit/second-nccl.Dockerfile: line 3: 'libnccl-dev=2.21.5-1+cuda12.4': libnccl-dev=2.21.5-1+cuda12.4 is a second NCCL: torch 2.5.1+cu124 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.21.5); remove it [compat.md §5.3 (V)]",
        "note: tests/audit/second-nccl.Dockerfile: line 4: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("second-nccl.ok.Dockerfile", 0, [
        "note: tests/audit/second-nccl.ok.Dockerfile: line 3: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("stage-chain.Dockerfile", 2, [
        "error: tests/audit/stage-chain.Dockerfile: line 2: 'GLOO_SOCKET_IFNAME=lo': GLOO_SOCKET_IFNAME=lo selects only the loopback interface; ranks on 2 nodes cannot reach each other over it (remove it, or name the interface the nodes share, e.g. eth0) [NCCL-ENV, multinode.md (M)]",
        "note: tests/audit/stage-chain.Dockerfile: line 5: 'torch==2.7.1': cu126 needs driver >= 560.28.03 (CUDA 12.6 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("stage-chain.ok.Dockerfile", 0, [
        "note: tests/audit/stage-chain.ok.Dockerfile: line 5: 'torch==2.7.1': cu126 needs driver >= 560.28.03 (CUDA 12.6 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("suffix-forms.Dockerfile", 1, [
        "warning: tests/audit/suffix-forms.Dockerfile: line 6: 'https://download.pytorch.org/whl/cu${CUDA_VERSION//./}': the value of --index-url cannot be expanded: ${CUDA_VERSION//./} is a form sh does not expand (bash only); audited without it [audit]",
        "warning: tests/audit/suffix-forms.Dockerfile: line 6: 'torch==2.1.0': cannot tell which build of torch 2.1.0 this installs (the index https://download.pytorch.org/whl/cu${CUDA_VERSION//./} cannot be expanded); the rules on its CUDA are skipped [PT-IDX (V)]",
    ]),
    ("suffix-forms.ok.Dockerfile", 0, [
        "note: tests/audit/suffix-forms.ok.Dockerfile: line 7: 'torch==2.1.0': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("unjudged.Dockerfile", 3, [
        "warning: tests/audit/unjudged.Dockerfile: line 3: 'mycompany/train-base:2018': base image: envbuild cannot read CUDA, OS or Python from the name mycompany/train-base; the rules on what it does not say are skipped [audit]",
        "error: tests/audit/unjudged.Dockerfile: line 4: 'torch==0.4.1': cannot judge torch 0.4.1: envbuild's compatibility data holds 1.0.0 to 2.15.0; neither its build nor the base image's CUDA and OS are known: nothing could be judged [S2 (V)]",
        "warning: tests/audit/unjudged.Dockerfile: line 4: 'torch==0.4.1': cannot tell which build of torch 0.4.1 this installs (no index names a variant); the rules on its CUDA are skipped [PT-IDX (V)]",
    ]),
    ("unjudged.ok.Dockerfile", 1, [
        "warning: tests/audit/unjudged.ok.Dockerfile: line 2: 'mycompany/train-base:2020': base image: envbuild cannot read CUDA, OS or Python from the name mycompany/train-base; the rules on what it does not say are skipped [audit]",
        "note: tests/audit/unjudged.ok.Dockerfile: line 3: 'torch==1.4.0': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("unknown-release.Dockerfile", 2, [
        "error: tests/audit/unknown-release.Dockerfile: line 5: 'torch==0.4.1+cu92': torch variant cu92 is CUDA 9.2 but the image's CUDA is 10.0; the major versions must match (torch 0.4.1 has no CUDA 10 build; use CUDA 9.2) [compat.md §5.5 (V)]",
        "warning: tests/audit/unknown-release.Dockerfile: line 5: 'torch==0.4.1+cu92': cannot judge torch 0.4.1: envbuild's compatibility data holds 1.0.0 to 2.15.0; the rules on its release are skipped [S2 (V)]",
        "note: tests/audit/unknown-release.Dockerfile: line 5: 'torch==0.4.1+cu92': cu92 needs driver >= 396.26 (CUDA 9.2 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("unknown-release.ok.Dockerfile", 1, [
        "warning: tests/audit/unknown-release.ok.Dockerfile: line 5: 'torch==0.4.1+cu92': cannot judge torch 0.4.1: envbuild's compatibility data holds 1.0.0 to 2.15.0; the rules on its release are skipped [S2 (V)]",
        "note: tests/audit/unknown-release.ok.Dockerfile: line 5: 'torch==0.4.1+cu92': cu92 needs driver >= 396.26 (CUDA 9.2 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("unpinned.Dockerfile", 2, [
        "error: tests/audit/unpinned.Dockerfile: line 3: 'torch': torch is not pinned to one release: pip installs the newest matching one, and which CUDA build that is changes from release to release; pin one release and its build, e.g. torch==2.5.1+cu121 --index-url https://download.pytorch.org/whl/cu121 [compat.md §5.1 (V)]",
    ]),
    ("unpinned.ok.Dockerfile", 0, [
        "note: tests/audit/unpinned.ok.Dockerfile: line 3: 'torch==2.1.0+cu121': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("uv.Dockerfile", 1, [
        "warning: tests/audit/uv.Dockerfile: line 4: 'torch==2.3.1': torch==2.3.1 comes from --extra-index-url https://download.pytorch.org/whl/cu118 with PyPI still read: uv with --index-strategy unsafe-best-match takes the highest matching version of every index, so PyPI's torch 2.3.1 (its cu121 build) can be installed instead of +cu118; pin torch==2.3.1+cu118 or use --index-url https://download.pytorch.org/whl/cu118 [compat.md §5.1 (V)]",
        "note: tests/audit/uv.Dockerfile: line 4: 'torch==2.3.1': cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("uv.ok.Dockerfile", 0, [
        "note: tests/audit/uv.ok.Dockerfile: line 3: 'torch==2.3.1': cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    # followed files (context/ holds what they COPY), .deb installs, parser directives, shell logic, %files
    ("case-cuda.Dockerfile", 1, [
        "warning: tests/audit/case-cuda.Dockerfile: line 3: 'nvidia/cuda:12.4.1-base-ubuntu22.04': no torch install found in the stages the final image uses (audit reads pip, uv and conda installs; requirement files are not followed) [audit]",
        'warning: tests/audit/case-cuda.Dockerfile: line 7: \'pip install torch==2.5.1+cu124 --index-url https://download.pytorch.org/whl/cu124\': runs depending on case "$CUDA" (line 6): audit cannot tell whether it does; audited without it [audit]',
        'warning: tests/audit/case-cuda.Dockerfile: line 8: \'pip install torch==2.5.1+cu118 --index-url https://download.pytorch.org/whl/cu118\': runs depending on case "$CUDA" (line 6): audit cannot tell whether it does; audited without it [audit]',
    ]),
    ("case-cuda.ok.Dockerfile", 0, [
        "note: tests/audit/case-cuda.ok.Dockerfile: line 6: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("conda-env.Dockerfile", 2, [
        "error: tests/audit/conda-env.Dockerfile: line 4: 'pytorch==2.1.0' (context/environment-cu121.yml: line 8): torch variant cu121 is CUDA 12.1 but the image's CUDA is 11.8; the major versions must match (use cu118 or CUDA 12.1) [compat.md §5.5 (V)]",
        "warning: tests/audit/conda-env.Dockerfile: line 4: 'pytorch==2.1.0' (context/environment-cu121.yml: line 8): pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; --to-recipe writes the wheel of the same release and variant [PT-CONDA (M)]",
        "note: tests/audit/conda-env.Dockerfile: line 4: 'pytorch==2.1.0' (context/environment-cu121.yml: line 8): cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("conda-env.ok.Dockerfile", 1, [
        "warning: tests/audit/conda-env.ok.Dockerfile: line 4: 'pytorch==2.1.0' (context/environment-cu118.yml: line 8): pytorch from conda (-c pytorch) is a conda build, not the wheel envbuild's rules and recipes pin; the pytorch channel publishes no release after 2.5; --to-recipe writes the wheel of the same release and variant [PT-CONDA (M)]",
        "note: tests/audit/conda-env.ok.Dockerfile: line 4: 'pytorch==2.1.0' (context/environment-cu118.yml: line 8): cu118 needs driver >= 520.61.05 (CUDA 11.8 GA); >= 450.80.02 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("constraints.Dockerfile", 2, [
        "error: tests/audit/constraints.Dockerfile: line 5: 'torch==2.5.1+cu121' (context/constraints-cu121.txt: line 1): torch 2.5.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/constraints.Dockerfile: line 5: 'torch==2.5.1+cu121' (context/constraints-cu121.txt: line 1): cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("constraints.ok.Dockerfile", 0, [
        "note: tests/audit/constraints.ok.Dockerfile: line 5: 'torch==2.5.1+cu124' (context/constraints-cu124.txt: line 1): cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("deb-nccl.Dockerfile", 2, [
        "error: tests/audit/deb-nccl.Dockerfile: line 4: './libnccl2_2.6.4-1+cuda9.1_amd64.deb': libnccl2=2.6.4-1+cuda9.1 is a second NCCL: torch 2.7.1+cu128 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.26.2); remove it [compat.md §5.3 (V)]",
        "note: tests/audit/deb-nccl.Dockerfile: line 5: 'torch==2.7.1+cu128': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("deb-nccl.ok.Dockerfile", 0, [
        "note: tests/audit/deb-nccl.ok.Dockerfile: line 5: 'torch==2.7.1+cu128': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("dpkg-nccl.Dockerfile", 2, [
        "error: tests/audit/dpkg-nccl.Dockerfile: line 4: '/tmp/nccl/libnccl2_*.deb': libnccl2 is a second NCCL: torch 2.7.1+cu128 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.26.2); remove it [compat.md §5.3 (V)]",
        "error: tests/audit/dpkg-nccl.Dockerfile: line 4: '/tmp/nccl/libnccl-dev_*.deb': libnccl-dev is a second NCCL: torch 2.7.1+cu128 loads the NCCL of its own wheel (nvidia-nccl-cu12 2.26.2); remove it [compat.md §5.3 (V)]",
        "note: tests/audit/dpkg-nccl.Dockerfile: line 5: 'torch==2.7.1+cu128': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("dpkg-nccl.ok.Dockerfile", 0, [
        "note: tests/audit/dpkg-nccl.ok.Dockerfile: line 5: 'torch==2.7.1+cu128': cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("escape.Dockerfile", 2, [
        "error: tests/audit/escape.Dockerfile: line 6: 'torch==2.5.1+cu121': torch 2.5.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/escape.Dockerfile: line 6: 'torch==2.5.1+cu121': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("escape.ok.Dockerfile", 0, [
        "note: tests/audit/escape.ok.Dockerfile: line 6: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("escape-token.Dockerfile", 3, [
        "error: tests/audit/escape-token.Dockerfile: line 2: invalid escape token 'x': Docker takes only \\ or `",
    ]),
    ("escape-token.ok.Dockerfile", 0, [
        "note: tests/audit/escape-token.ok.Dockerfile: line 6: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("files-from.def", 3, [
        "error: tests/audit/files-from.def: line 11: %files from devel: no earlier stage has Stage: devel",
    ]),
    ("files-from.ok.def", 0, [
        "note: tests/audit/files-from.ok.def: line 17: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("if-cpu.def", 2, [
        "error: tests/audit/if-cpu.def: line 13: 'torch==2.5.1+cu121': torch 2.5.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/if-cpu.def: line 13: 'torch==2.5.1+cu121': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("if-cpu.ok.def", 0, [
        "note: tests/audit/if-cpu.ok.def: line 13: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("requirements.Dockerfile", 2, [
        "error: tests/audit/requirements.Dockerfile: line 3: 'nvcr.io/nvidia/pytorch:25.12-py3': base image nvcr.io/nvidia/pytorch:25.12-py3 already ships PyTorch: installing torch 2.10.0+cu128 makes a second one; start from its CUDA/OS base (e.g. nvidia/cuda:X.Y.Z-base-ubuntuVER or debian) [NGC PyTorch container release notes (PyTorch preinstalled) (V)]",
        "error: tests/audit/requirements.Dockerfile: line 6: 'torch==2.10.0' (context/requirements-train.txt: line 3): torch variant cu128 is CUDA 12.8 but the image's CUDA is 13.1; the major versions must match (use cu130 or CUDA 12.8) [compat.md §5.5 (V)]",
        "note: tests/audit/requirements.Dockerfile: line 6: 'torch==2.10.0' (context/requirements-train.txt: line 3): cu128 needs driver >= 570.26 (CUDA 12.8 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("requirements.ok.Dockerfile", 0, [
        "note: tests/audit/requirements.ok.Dockerfile: line 2: 'nvcr.io/nvidia/pytorch:25.12-py3': torch 2.10.0a0+b4e4ee81d3 comes with the base image (no pip or conda install of torch in this file) [NGC-RN rel-25-12 (M)]",
    ]),
    ("shell-test.Dockerfile", 2, [
        "error: tests/audit/shell-test.Dockerfile: line 7: 'torch==2.5.1+cu121': torch 2.5.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/shell-test.Dockerfile: line 7: 'torch==2.5.1+cu121': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("shell-test.ok.Dockerfile", 0, [
        "note: tests/audit/shell-test.ok.Dockerfile: line 7: 'torch==2.5.1+cu124': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("two-files.def", 2, [
        "error: tests/audit/two-files.def: line 13: 'torch==2.5.1+cu121' (context/requirements-cu121.txt: line 2): torch 2.5.1+cu121 (from the local version +cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/two-files.def: line 13: 'torch==2.5.1+cu121' (context/requirements-cu121.txt: line 2): cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("two-files.ok.def", 0, [
        "note: tests/audit/two-files.ok.def: line 13: 'torch==2.5.1+cu124' (context/requirements-cu124.txt: line 2): cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
    ]),
    ("series.Dockerfile", 2, [
        "error: tests/audit/series.Dockerfile: line 4: 'torch==2.4.*': torch 2.4.1+cu121 (from --index-url https://download.pytorch.org/whl/cu121) is built for CUDA 12.1 but the base image nvidia/cuda:12.4.1-base-ubuntu22.04 has CUDA 12.4.1: two CUDA runtimes in one image, and extensions built with the base's nvcc get a CUDA mismatch; use torch +cu124 or a CUDA 12.1 base [compat.md §5.5, NV-IMG (V)]",
        "note: tests/audit/series.Dockerfile: line 4: 'torch==2.4.*': cu121 needs driver >= 530.30.02 (CUDA 12.1 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "note: tests/audit/series.Dockerfile: line 4: 'torch==2.4.*': torch==2.4.* is judged as 2.4.1, the newest release of the series in envbuild's facts: pip installs the newest one [compat.md §5.1 (V)]",
    ]),
    ("series.ok.Dockerfile", 0, [
        "note: tests/audit/series.ok.Dockerfile: line 4: 'torch==2.4.*': cu124 needs driver >= 550.54.14 (CUDA 12.4 GA); >= 525.60.13 runs under minor-version compatibility (no PTX JIT) [NV-RN, NV-MVC (V)]",
        "note: tests/audit/series.ok.Dockerfile: line 4: 'torch==2.4.*': torch==2.4.* is judged as 2.4.1, the newest release of the series in envbuild's facts: pip installs the newest one [compat.md §5.1 (V)]",
    ]),
    ("python-tag.Dockerfile", 1, [
        "warning: tests/audit/python-tag.Dockerfile: line 2: 'mycompany/train-base:2020-py3.9': torch 1.4.0 has wheels for Python 3.5 to 3.8, not 3.9 [S1 (U)]",
        "warning: tests/audit/python-tag.Dockerfile: line 2: 'mycompany/train-base:2020-py3.9': base image: envbuild cannot read CUDA or OS from the name mycompany/train-base (its tag names Python 3.9); the rules on what it does not say are skipped [audit]",
        "note: tests/audit/python-tag.Dockerfile: line 3: 'torch==1.4.0': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
    ("python-tag.ok.Dockerfile", 1, [
        "warning: tests/audit/python-tag.ok.Dockerfile: line 2: 'mycompany/train-base:2020-py38': base image: envbuild cannot read CUDA or OS from the name mycompany/train-base (its tag names Python 3.8); the rules on what it does not say are skipped [audit]",
        "note: tests/audit/python-tag.ok.Dockerfile: line 3: 'torch==1.4.0': cu101 needs driver >= 418.39 (CUDA 10.1 GA) (no lower floor under minor-version compatibility) [NV-RN, NV-MVC (U)]",
    ]),
]


#: Files audited with options (the hosts' driver of the pattern they follow).
ARGS = {"base-driver.Dockerfile": ["--driver", "550.142"], "base-driver.ok.Dockerfile": ["--driver", "550.142"]}


def _audit(*argv: str) -> tuple[int, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = app.main(["audit", *argv])
    return code, out.getvalue(), err.getvalue()


def test_every_file_under_tests_audit_has_a_case_and_a_twin():
    files = sorted(p.name for p in (ROOT / DIR).iterdir() if p.is_file())  # context/: what the files COPY
    assert sorted(name for name, _code, _lines in CASES) == files
    assert len(files) >= 40
    for name in files:
        stem, _dot, suffix = name.partition(".")
        twin = name.replace(".ok.", ".") if ".ok." in name else f"{stem}.ok.{suffix}"
        assert twin in files, f"{name} has no twin {twin}"


#: What no finding may say: a placeholder, or a recipe's own words (a file has no torch section).
PLACEHOLDERS = re.compile(r"\bNone\b|\?\+\?|<variant>|X\.Y\.Z\+|torch \?|the recipe's|the torch section|a cuda section"
                          r"|set cuda to|\(release unknown\)")


def test_no_finding_of_the_corpus_says_a_placeholder_or_a_recipe_word():
    said = [line for _name, _code, lines in CASES for line in lines if PLACEHOLDERS.search(line)]
    assert said == []
    assert PLACEHOLDERS.search("torch variant cu118 is CUDA 11.8 but the recipe's CUDA is 12.1")  # the broken twin
    assert not PLACEHOLDERS.search("torch<2.1 is not pinned to one release")


@pytest.mark.parametrize("name, code, lines", CASES, ids=[c[0] for c in CASES])
def test_audit_gives_the_expected_verdict_and_lines(name, code, lines, monkeypatch):
    monkeypatch.chdir(ROOT)
    got, out, err = _audit(f"{DIR}/{name}", *ARGS.get(name, []))
    assert (got, err.splitlines()) == (code, lines)
    if code < 3 or "nothing could be judged" in err:
        assert "?" not in out.split(" on ", 1)[-1]  # what the summary does not know it says in words  # the summary line on stdout names the file and the count
        assert out.startswith(f"{DIR}/{name}: ")
    else:
        assert out == ""


def test_the_summary_names_the_python_of_the_tag_and_says_in_words_when_none_is_known(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert _audit(f"{DIR}/python-tag.ok.Dockerfile")[1] == (
        f"{DIR}/python-tag.ok.Dockerfile: 1 warning: torch 1.4.0+cu101 (pip) on mycompany/train-base:2020-py38 "
        "(OS unknown, python 3.8, cuda none)\n")
    assert _audit(f"{DIR}/unjudged.ok.Dockerfile")[1] == (
        f"{DIR}/unjudged.ok.Dockerfile: 1 warning: torch 1.4.0+cu101 (pip) on mycompany/train-base:2020 "
        "(OS unknown, Python unknown, cuda none)\n")
