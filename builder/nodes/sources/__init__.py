"""Gather node reports, and run agent modules on nodes, for ``envbuild verify`` and ``doctor``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..report import Node
from .base import DEFAULT_PYTHON, DEFAULT_TIMEOUT_S, check_path, check_python, unique_names
from .containers import check_container, check_label, from_containers
from .files import from_files, report_paths
from .slurm import check_partition, check_srun_arg, from_slurm
from .ssh import DEFAULT_CONNECT_TIMEOUT_S, check_host, check_ssh_option, from_ssh

__all__ = ["Sources", "gather", "check_container", "check_host", "check_label", "check_partition", "check_path",
           "check_python", "check_srun_arg", "check_ssh_option"]


@dataclass
class Sources:
    """Where to gather nodes from (the ``verify``/``doctor`` command-line options)."""

    files: Sequence[str] = ()
    images: Sequence[str] = ()
    containers: Sequence[str] = ()
    labels: Sequence[str] = ()
    nodes: int | None = None
    hosts: Sequence[str] = ()
    ssh_config: str | None = None
    ssh_options: Sequence[str] = ()
    connect_timeout_s: int = DEFAULT_CONNECT_TIMEOUT_S
    slurm: bool = False
    partition: str | None = None
    srun_args: Sequence[str] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    python: str = DEFAULT_PYTHON
    client: Any = None

    @property
    def uses_containers(self) -> bool:
        return bool(self.images or self.containers or self.labels)

    @property
    def empty(self) -> bool:
        return not (self.files or self.uses_containers or self.hosts or self.slurm)

    def check(self) -> Sources:
        """Raises UsageError (exit 64) for the first value refused, before anything is contacted."""
        for h in self.hosts:
            check_host(h)
        for o in self.ssh_options:
            check_ssh_option(o)
        if self.ssh_config is not None:
            check_path(self.ssh_config, "--ssh-config")
        if self.partition is not None:
            check_partition(self.partition)
        for a in self.srun_args:
            check_srun_arg(a)
        for c in self.containers:
            check_container(c)
        for label in self.labels:
            check_label(label)
        check_python(self.python)
        return self


def gather(src: Sources) -> list[Node]:
    """Nodes of every source, names made unique. EnvbuildError (exit 64) before contact; Unreachable (exit 3): no
    engine, no such image, not ``nodes`` running containers."""
    src.check()
    nodes: list[Node] = list(from_files(report_paths(src.files))) if src.files else []
    if src.uses_containers:
        from builder.image.engine import connect

        client = src.client or connect()
        nodes += from_containers(client, src.images, src.containers, src.labels,
                                 None if src.slurm else src.nodes, src.timeout_s, src.python)
    if src.hosts:
        nodes += from_ssh(src.hosts, src.ssh_config, src.ssh_options, src.timeout_s, src.connect_timeout_s, src.python)
    if src.slurm:
        nodes += from_slurm(src.nodes, src.partition, src.srun_args, src.timeout_s, src.python)
    return unique_names(nodes, lambda n: f"{n.name} ({n.source})")
