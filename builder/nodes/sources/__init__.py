"""Gather node reports, and run agent modules on nodes, for ``envbuild verify`` and ``doctor``.

Four sources, one module each, each giving a list of :class:`builder.nodes.report.Node` in a
stable order: report files (:mod:`.files`), running containers on this Docker engine
(:mod:`.containers`, ``docker exec``), hosts over ssh (:mod:`.ssh`) and Slurm (:mod:`.slurm`,
one ``srun`` step). The agent code reaches a node as the payload archive of
:mod:`builder.agent.payload` on the process's stdin (:mod:`.base`); nothing is copied onto
the node.

A node that cannot be checked (unreachable, timed out, no python3, a report that does
not validate) is returned with ``error`` set (exit 3 material) and never stops the others.
Nodes that can run agent modules carry a :class:`~.base.Target` (``node.target``) used by
``doctor``.

Bounds: what a node prints is read in binary chunks, at most ``MAX_REPORT_BYTES`` (16 MiB)
of stdout per node (:data:`.slurm.MAX_SRUN_OUTPUT_BYTES` for the one srun step) and the last
:data:`.base.STDERR_TAIL_BYTES` of stderr; a node printing more is stopped. Every value that
reaches an ssh or srun command line or the engine (hosts, ``--ssh-option``,
``--partition``, ``--srun-arg``, ``--python``, container names, labels) is matched whole
first (:meth:`Sources.check`; usage error, exit 64), and ssh gets ``--`` before the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..report import Node
from .base import DEFAULT_PYTHON, DEFAULT_TIMEOUT_S, check_path, check_python
from .containers import check_container, check_label, from_containers
from .files import from_files
from .slurm import check_partition, check_srun_arg, from_slurm
from .ssh import DEFAULT_CONNECT_TIMEOUT_S, check_host, check_ssh_option, from_ssh

__all__ = ["Sources", "gather", "check_container", "check_host", "check_label", "check_partition", "check_path",
           "check_python", "check_srun_arg", "check_ssh_option"]


@dataclass
class Sources:
    """Where to gather nodes from (the ``verify``/``doctor`` command-line options).

    Attributes:
        files: report files. images, containers, labels: running containers on this
        engine (see :func:`.containers.find_containers`). nodes: how many containers there
        must be, or ``srun --nodes``. hosts: ssh hosts ``[user@]host[:port]``. ssh_config,
        ssh_options: ``ssh -F`` and ``-o``. connect_timeout_s: ``ssh -o ConnectTimeout``.
        slurm, partition, srun_args: gather with ``srun``. timeout_s: per node (per srun).
        python: the interpreter on nodes. client: a docker client (default: connect).
    """

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
        """True when running containers are a source."""
        return bool(self.images or self.containers or self.labels)

    @property
    def empty(self) -> bool:
        """True when no source is given."""
        return not (self.files or self.uses_containers or self.hosts or self.slurm)

    def check(self) -> Sources:
        """Every value that reaches a command line or the engine, checked whole before
        anything is contacted (:func:`check_host`, :func:`check_ssh_option`,
        :func:`check_partition`, :func:`check_srun_arg`, :func:`check_python`,
        :func:`check_container`, :func:`check_label`); returns ``self``.

        Raises:
            EnvbuildError: (exit 64) the first value refused, naming its option.
        """
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
    """Gather nodes from every source in ``src``: files, containers, ssh hosts, Slurm (in
    that order); names are made unique across sources.

    Raises:
        EnvbuildError: (exit 64) a value refused by :meth:`Sources.check` (before
            anything is contacted); (exit 2) no such image.
        Unreachable: (exit 3) no Docker engine; no (or not ``nodes``) running containers;
            srun gave nothing.
    """
    src.check()
    nodes: list[Node] = list(from_files(src.files)) if src.files else []
    if src.uses_containers:
        from builder.image.engine import connect

        client = src.client or connect()
        nodes += from_containers(client, src.images, src.containers, src.labels,
                                 None if src.slurm else src.nodes, src.timeout_s, src.python)
    if src.hosts:
        nodes += from_ssh(src.hosts, src.ssh_config, src.ssh_options, src.timeout_s,
                          src.connect_timeout_s, src.python)
    if src.slurm:
        nodes += from_slurm(src.nodes, src.partition, src.srun_args, src.timeout_s, src.python)
    seen: dict[str, int] = {}
    for n in nodes:
        seen[n.name] = seen.get(n.name, 0) + 1
    for n in nodes:
        if seen[n.name] > 1:
            n.name = f"{n.name} ({n.source})"
    return nodes
