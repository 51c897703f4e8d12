"""Slurm nodes: one ``srun --ntasks-per-node=1 --label`` step probes every node (``N: `` prefixes split
the output); later modules run as one-task steps. Every srun value is matched whole first (exit 64)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from builder.agent import payload
from builder.core.errors import EnvbuildError, Unreachable, UsageError

from .. import report as nodereport
from ..report import MAX_REPORT_BYTES, Node
from .base import (
    DEFAULT_PYTHON,
    DEFAULT_TIMEOUT_S,
    PROBE_MODULE,
    ProcessRunning,
    Running,
    Target,
    check_python,
    exit_status,
    last_line,
    payload_archive,
    unique_names,
)

#: Bytes of stdout read from the one ``srun`` step that probes every node: each task's
#: report is still at most ``MAX_REPORT_BYTES`` (a real report is ~10-50 KB).
MAX_SRUN_OUTPUT_BYTES = 4 * MAX_REPORT_BYTES
#: Most tasks of one srun step envbuild reads (``--nodes`` is at most 1024 here).
MAX_TASKS = 65536

_PARTITION_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(,[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}){0,31}")
#: ``--srun-arg`` options accepted (``srun(1)``): resources, placement and accounting. Refused:
#: those that run programs (``--prolog``...), redirect files (``--output``...), change what runs
#: or its environment (``--export``, ``--uid``...), and short options.
SRUN_OPTIONS = frozenset((
    "account", "qos", "reservation", "time", "constraint", "exclusive", "gres", "gpus", "gpus-per-node",
    "gpus-per-task", "gpu-bind", "mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "cpus-per-gpu",
    "nodelist", "exclude", "network", "overlap", "comment", "wckey", "clusters", "cluster", "distribution",
    "hint", "cpu-bind", "mpi", "switches", "licenses", "immediate", "exact", "oversubscribe", "priority",
    "nice", "threads-per-core", "cores-per-socket", "sockets-per-node", "ntasks-per-core", "mem-bind"))
_SRUN_ARG_RE = re.compile(r"--(?P<name>[a-z][a-z0-9-]{0,40})(=(?P<value>[!-~]{1,1024}))?")
_LABEL_RE = re.compile(r"\s{0,8}([0-9]{1,6}): ?(.*)", re.DOTALL)
_SRUN_ERR_RE = re.compile(r"srun: error: ([^:\s]{1,255}): tasks? ([0-9][0-9,\-]{0,4000}):")


def check_partition(text: str) -> str:
    """``text`` if it is a Slurm partition name or a comma list of them; else exit 64."""
    if not isinstance(text, str) or _PARTITION_RE.fullmatch(text) is None:
        raise UsageError("is not a Slurm partition name (letters, digits, _ . -; a comma list)",
                         field="--partition", value=text)
    return text


def check_srun_arg(text: str) -> str:
    """``text`` if ``--name[=value]`` with a name of :data:`SRUN_OPTIONS`, a printable value without blanks; else 64."""
    m = _SRUN_ARG_RE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise UsageError("is not an srun option --name[=value] (long form, printable, no blanks)",
                         field="--srun-arg", value=text)
    if m.group("name") not in SRUN_OPTIONS:
        raise UsageError(f"is refused: --{m.group('name')} is not among the srun options envbuild passes on "
                         "(resources, placement and accounting; no prologs, file redirections or --export)",
                         field="--srun-arg", value=text)
    return text


def split_labelled(text: str) -> dict[int, str]:
    """``srun --label`` output (``"0: line"``) as ``{task: text}``; other lines, tasks past MAX_TASKS dropped."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = _LABEL_RE.fullmatch(line)
        if m and int(m.group(1)) < MAX_TASKS:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return {task: "\n".join(lines) + "\n" for task, lines in sorted(out.items())}


def failed_tasks(stderr: str) -> dict[int, str]:
    """``{task: node}`` of ``srun: error: NODE: tasks 0-2,5: ...`` lines, bounded by :data:`MAX_TASKS` in all."""
    failed: dict[int, str] = {}
    for m in _SRUN_ERR_RE.finditer(stderr):
        for part in m.group(2).split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            for t in range(int(lo), min(int(hi or lo), MAX_TASKS - 1) + 1):
                failed[t] = m.group(1)
                if len(failed) >= MAX_TASKS:
                    return failed
    return failed


def srun_argv(nodes: int | None = None, partition: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    """``srun`` arguments shared by every step envbuild starts. Raises UsageError (exit 64)."""
    argv = ["srun", "--job-name=envbuild"]
    if partition:
        argv.append(f"--partition={check_partition(partition)}")
    if nodes:
        argv.append(f"--nodes={int(nodes)}")
    return [*argv, *(check_srun_arg(a) for a in extra)]


class SlurmTarget(Target):
    """One Slurm node; modules run as a one-task ``srun`` step pinned to it (``-w``)."""

    def __init__(self, node: str, srun_argv: Sequence[str], python: str = DEFAULT_PYTHON) -> None:
        self.node, self.srun_argv, self.python = node, list(srun_argv), check_python(python)
        self.where = f"slurm {node}"
        self.machine = node

    def start(self, module: str, args: Sequence[str] = ()) -> Running:
        """``srun --nodes=1 --ntasks=1 --nodelist=NODE python3 -c BOOTSTRAP MODULE ARGS``, payload on stdin."""
        argv = [*self.srun_argv, "--nodes=1", "--ntasks=1", f"--nodelist={self.node}",
                *payload.command(self.python, module, args)]
        return ProcessRunning(argv, payload_archive(), self.where)


def _task_node(task: int, tasks: dict[int, str], failed: dict[int, str], stderr: str,
               base: list[str], python: str) -> Node:
    """The node of one task: its report, or why it has none."""
    source = f"slurm task {task}"
    node = Node(name=failed.get(task, f"task-{task}"), source=source)
    try:
        if task not in tasks:
            raise Unreachable(f"task failed on {failed[task]}: {last_line(stderr)}", file=source)
        node.report = nodereport.parse(tasks[task], source)
        node.name = node.report.hostname or node.name
    except EnvbuildError as e:
        node.error = e
    node.source = f"slurm {node.name}"
    if node.report is not None:
        node.address = node.name
        node.target = SlurmTarget(node.name, base, python)
    return node


def from_slurm(nodes: int | None = None, partition: str | None = None, extra: Sequence[str] = (),
               timeout_s: float = DEFAULT_TIMEOUT_S, python: str = DEFAULT_PYTHON) -> list[Node]:
    """Probe every node in one job step, a task per node, named by hostname; Unreachable, InvalidReport."""
    base = srun_argv(nodes, partition, extra)
    argv = [*base, "--ntasks-per-node=1", "--label", "--input=all",
            *payload.command(check_python(python), PROBE_MODULE, ["--host"])]
    out = ProcessRunning(argv, payload_archive(), "srun", MAX_SRUN_OUTPUT_BYTES).wait(timeout_s)
    tasks = split_labelled(out.stdout)
    failed = failed_tasks(out.stderr)
    if not tasks and not failed:
        status = f"exit status {out.rc}" if out.rc is not None and out.rc >= 0 else exit_status(out.rc)
        raise Unreachable(f"srun gave no node reports ({status}): {last_line(out.stderr)}", field="slurm")
    result = [_task_node(task, tasks, failed, out.stderr, base, python) for task in sorted(set(tasks) | set(failed))]
    return unique_names(result, lambda n: f"{n.name}@{n.source.split(' ', 1)[-1]}")
