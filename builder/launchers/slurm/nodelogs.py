"""The node logs of a Slurm run folder, read as they grow, at most :data:`READ_CHUNK` bytes a file and poll: the ranks'
progress (with arrival time, to name a hang) and results."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from builder.core.documents import RankResult
from builder.core.events import Event
from builder.core.inputs import one_line

from ..base import LaunchSpec
from ..output import LineBuffer, NodeOutput, log_events, problems_by_rank
from ..progress import ProgressTracker

#: Bytes read from one node log at each poll (the rest at the next).
READ_CHUNK = 8 << 20


class NodeLogs:
    """The logs ``<folder>/node-<i>.log`` of the ``spec.nodes`` nodes, followed."""

    def __init__(self, folder: Path, spec: LaunchSpec) -> None:
        self.folder = folder
        self.spec = spec
        self.tracker = ProgressTracker(spec.world_size, spec.run_id)
        self.outputs = [NodeOutput(n, spec, self.tracker) for n in range(spec.nodes)]
        self._offsets = [0] * spec.nodes
        self._buffers = [LineBuffer() for _ in range(spec.nodes)]
        self._refused: dict[int, str] = {}

    def poll(self, limit: int | None = READ_CHUNK) -> None:
        """Read what the logs gained since the last poll (at most ``limit`` bytes each;
        None: all of it)."""
        for node in range(self.spec.nodes):
            if node not in self._refused:
                self._read(node, limit)

    def finish(self) -> None:
        """Read everything left, then the last lines without a newline."""
        self.poll(None)
        for node, buf in enumerate(self._buffers):
            for line in buf.rest():
                self.outputs[node].raw_line(line)

    def _read(self, node: int, limit: int | None) -> None:
        path = self.folder / f"node-{node}.log"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            return
        except OSError as e:
            self._refuse(node, f"cannot read {path}: {e.strerror or e}")
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._refuse(node, f"{path} is not a regular file")
                return
            os.lseek(fd, self._offsets[node], os.SEEK_SET)
            left = limit
            while left is None or left > 0:
                data = os.read(fd, 1 << 20 if left is None else min(1 << 20, left))
                if not data:
                    break
                self._offsets[node] += len(data)
                left = None if left is None else left - len(data)
                for line in self._buffers[node].feed(data):
                    self.outputs[node].raw_line(line)
        except OSError as e:
            self._refuse(node, f"cannot read {path}: {one_line(e.strerror or e, 200)}")
        finally:
            os.close(fd)

    def _refuse(self, node: int, why: str) -> None:
        self._refused[node] = why
        self.outputs[node].keep(f"(envbuild: the log of node {node} was not read: {why})")

    def results(self) -> dict[int, RankResult]:
        """The results read so far, checked, by rank."""
        out: dict[int, RankResult] = {}
        for o in self.outputs:
            out.update(o.results)
        return out

    def problems(self) -> dict[int, str]:
        """The problems of what the nodes printed, by rank (see :func:`~builder.launchers.output.problems_by_rank`); the
        ranks of a node whose log could not be read could not be checked."""
        results = self.results()
        problems = problems_by_rank(self.outputs, results, self.spec.world_size)
        for node, why in sorted(self._refused.items()):
            for rank in self.spec.ranks_of_node(node):
                if rank not in results:
                    problems.setdefault(rank, f"the log of node {node} was not read: {why}")
        return problems

    def logs(self) -> dict[int, str]:
        """``{node: its log}`` (progress and result lines taken out) of the nodes whose
        log exists."""
        return {n: o.log() for n, o in enumerate(self.outputs)
                if (self.folder / f"node-{n}.log").exists() or n in self._refused}

    def events(self) -> list[Event]:
        """The lines of :meth:`logs` as ``log`` events (``ts``: when envbuild read each line)."""
        return [e for n in self.logs() for e in log_events(self.spec, n, self.outputs[n].log_lines())]
