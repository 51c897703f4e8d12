"""Slurm's commands and their answers: submit, the job's state, cancel. The state is ``squeue --json`` where it exists
(checked on Slurm 22.05.8), else ``scontrol show job -o``, else ``sacct -P`` for a job the controller forgot
(``MinJobAge``)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import process
from builder.core.errors import EnvbuildError, Unreachable
from builder.core.inputs import load_json, one_line, read_text

#: Seconds for one Slurm command.
COMMAND_TIMEOUT_S = 30.0
#: Lines of ``job.log`` quoted in the job's note.
LOG_TAIL_LINES = 6
#: Largest ``squeue --json`` answer read, in bytes (larger: ``scontrol`` is asked instead).
MAX_JSON_BYTES = 64 << 20

#: Reasons of a pending job that waiting cannot resolve, with a hint
#: (https://slurm.schedmd.com/job_reason_codes.html). Left out: aggregate limits (other jobs
#: end), down nodes and partitions (they come back), holds.
NEVER_STARTS = {
    "PartitionNodeLimit": "the job asks for {nodes}; the partition allows fewer (or has fewer up): pass "
                          "--slurm-nodes with fewer (the envbuild nodes then share machines) or --partition",
    "PartitionTimeLimit": "its time limit {time_limit} is above the partition's: pass --time-limit or --partition",
    "PartitionConfig": "the partition cannot give what the job asks for (nodes, CPUs, GPUs, memory): "
                       "pass --partition, --slurm-nodes or --gpus-per-node",
    "AccountNotAllowed": "its account may not use the partition: pass --sbatch-arg=--account=A or --partition",
    "InvalidAccount": "its account is invalid: pass --sbatch-arg=--account=A (sacctmgr show assoc user=$USER)",
    "QOSNotAllowed": "its QOS may not be used here: pass --sbatch-arg=--qos=Q or --partition",
    "InvalidQOS": "its QOS is invalid: pass --sbatch-arg=--qos=Q (sacctmgr show assoc user=$USER)",
    "BadConstraints": "no node can satisfy its constraints: check --sbatch-arg, --gpus-per-node and --slurm-nodes",
    "DependencyNeverSatisfied": "its dependency can never be satisfied: drop --sbatch-arg=--dependency",
}
#: Per-job QOS or association limits (``QOSMaxNodePerJobLimit``, ``AssocMaxWallDurationPerJobLimit``...).
_PER_JOB_LIMIT_RE = re.compile(r"(QOS|Assoc)(Max|Min)\w*PerJob\w*")

#: Job states that do not change any more (``squeue`` man page, "JOB STATE CODES").
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
    "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT", "REVOKED", "UNKNOWN",
})
#: States of a job that has not started yet.
PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
#: torchrun's exit statuses of a rank stopped by the signals Slurm sends to end a job
#: (SIGTERM, then SIGKILL after ``KillWait``; ``scancel`` man page).
STOP_STATUSES = frozenset({-15, -9})
#: Terminal states that stop the ranks from outside (the ranks could not be checked).
INTERRUPTED_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "NODE_FAIL", "PREEMPTED", "REVOKED", "UNKNOWN"})
_JOBID_RE = re.compile(r"(\d+)(?:;\S+)?")


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run a Slurm command; text output. Raises Unreachable: (exit 3) not on PATH, or no answer within ``timeout_s``."""
    try:
        return process.run(argv, timeout_s)
    except Unreachable as e:
        raise Unreachable(f"Slurm: {e.message} (envbuild runs Slurm commands on a submit host)") from None


def submit(script: str | os.PathLike) -> str:
    """Submit ``script`` with ``sbatch --parsable``; returns the job id (``"42"``).
    Raises Unreachable: (exit 3) no sbatch, the controller does not answer. EnvbuildError: (exit 3) sbatch refused
    the job (its message: an unknown partition, a time limit above the partition's...)."""
    proc = run_command(["sbatch", "--parsable", str(script)])
    out = proc.stdout.strip().splitlines()
    m = _JOBID_RE.fullmatch(out[-1].strip()) if proc.returncode == 0 and out else None
    if not m:
        msg = one_line(proc.stderr or proc.stdout or f"exit status {proc.returncode}")
        if re.search(r"Unable to contact|Socket timed out|Connection refused|Zero Bytes", msg, re.I):
            raise Unreachable(f"Slurm: sbatch: {msg}")
        raise Unreachable(f"sbatch refused the job: {msg}", file=str(script))
    return m.group(1)


@dataclass
class JobInfo:
    """A job as Slurm reports it.
    """

    state: str
    reason: str | None = None
    exit_code: str | None = None
    nodes: str | None = None
    time_limit: str | None = None
    source: str | None = None

    @property
    def terminal(self) -> bool:
        """True when the state does not change any more."""
        return self.state in TERMINAL_STATES


def _field(text: str, key: str) -> str | None:
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    if not m or m.group(1) in ("", "(null)", "None"):
        return None
    return m.group(1)


def parse_scontrol_job(text: str) -> JobInfo | None:
    """A :class:`JobInfo` from ``scontrol show job -o ID`` output (``Key=Value`` fields);
    None when it holds no ``JobState``."""
    state = _field(text, "JobState")
    if not state:
        return None
    return JobInfo(state=state.split("+")[0], reason=_field(text, "Reason"), exit_code=_field(text, "ExitCode"),
                   nodes=_field(text, "NodeList"), time_limit=_field(text, "TimeLimit"), source="scontrol")


def _number(value: Any) -> int | None:
    """An integer of Slurm's JSON: a plain integer (plugin v0.0.38) or ``{"set": true,
    "infinite": false, "number": N}`` (later plugins); None when unset, infinite or absent."""
    if isinstance(value, dict):
        if value.get("set") is False or value.get("infinite"):
            return None
        value = value.get("number")
    return value if type(value) is int else None


def _minutes_text(minutes: int | None) -> str | None:
    """A time limit in minutes as ``scontrol`` shows it: ``"00:01:00"``, ``"365-00:00:00"``."""
    if minutes is None or minutes < 0:
        return None
    days, rest = divmod(minutes, 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


def _exit_text(value: Any) -> str | None:
    """``"<status>:<signal>"`` of a job's ``exit_code``: a wait status (v0.0.38: ``256`` is
    ``1:0``, ``15`` is ``0:15``) or ``{"return_code": N, "signal": {"id": S}}`` (later)."""
    if type(value) is int:
        return f"{(value >> 8) & 0xFF}:{value & 0x7F}"
    if isinstance(value, dict):
        code = _number(value.get("return_code"))
        sig = value.get("signal")
        signo = _number(sig.get("id")) if isinstance(sig, dict) else None
        if code is not None or signo is not None:
            return f"{code or 0}:{signo or 0}"
    return None


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value not in ("", "None", "(null)") else None


def parse_squeue_json(text: str, job_id: str) -> JobInfo | None:
    """The :class:`JobInfo` of job ``job_id`` in ``squeue --json`` output (``{"jobs": [...]}``; the job picked by
    ``job_id``: Slurm 22.05 lists every job whatever ``-j`` says); None when the job is not listed."""
    if len(text) > MAX_JSON_BYTES:
        raise ValueError(f"squeue --json: an answer over {MAX_JSON_BYTES} bytes")
    try:
        doc = load_json(text, "squeue --json", max_depth=32)
    except EnvbuildError as e:
        raise ValueError(str(e)) from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise ValueError("squeue --json: no jobs list")
    for job in jobs:
        if not isinstance(job, dict) or str(_number(job.get("job_id"))) != str(job_id):
            continue
        state = job.get("job_state")
        state = state[0] if isinstance(state, list) and state else state
        if not isinstance(state, str) or not re.fullmatch(r"[A-Z_]{1,40}", state):
            raise ValueError(f"squeue --json: job {job_id} without a state")
        return JobInfo(state=state, reason=_text_or_none(job.get("state_reason")),
                       exit_code=_exit_text(job.get("exit_code")), nodes=_text_or_none(job.get("nodes")),
                       time_limit=_minutes_text(_number(job.get("time_limit"))), source="squeue --json")
    return None


def parse_sacct(text: str, job_id: str) -> JobInfo | None:
    """A :class:`JobInfo` from ``sacct -X -n -P -o JobID,State,ExitCode,NodeList,Timelimit,Reason``;
    None when the job is not listed. ``CANCELLED by 0`` is read as ``CANCELLED``."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] == str(job_id):
            got = [p if p not in ("None", "") else None for p in parts] + [None] * 6
            return JobInfo(state=parts[1].split()[0] if parts[1] else "UNKNOWN", exit_code=got[2], nodes=got[3],
                           time_limit=got[4], reason=got[5], source="sacct")
    return None


def never_starts(info: JobInfo, slurm_nodes: int) -> str | None:
    """Why the pending job can never start as submitted, with a hint, or None when waiting may help."""
    reason = info.reason or ""
    if info.state != "PENDING":
        return None
    if reason in NEVER_STARTS:
        hint = NEVER_STARTS[reason].format(nodes=f"{slurm_nodes} node{'s' if slurm_nodes != 1 else ''}",
                                           time_limit=info.time_limit or "?")
    elif _PER_JOB_LIMIT_RE.fullmatch(reason):
        hint = ("it is above a per-job limit of its QOS or association: ask for less (--slurm-nodes, "
                "--time-limit, --gpus-per-node) or pass --sbatch-arg=--qos=Q")
    else:
        return None
    return f"cannot start (pending, reason {reason}): {hint}"


class ControllerError(Exception):
    """``scontrol`` could not reach the controller (transient, retried)."""


#: False once ``squeue --json`` was refused as an unknown option (a Slurm before 21.08).
_json_works = True


def _from_squeue_json(job_id: str) -> tuple[bool, JobInfo | None]:
    """``(answered, info)`` of ``squeue --json``: answered False when unusable (ask ``scontrol``),
    info None when the controller forgot the job. Raises ControllerError: unreachable controller."""
    global _json_works
    proc = run_command(["squeue", "--json", "-j", str(job_id)])
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout or "").lower()
        if "unrecognized option" in err or "invalid option" in err:
            _json_works = False
            return False, None
        if "invalid job id" in err:
            return True, None
        raise ControllerError(one_line(proc.stderr or proc.stdout or f"squeue exit status {proc.returncode}"))
    try:
        return True, parse_squeue_json(proc.stdout, job_id)
    except ValueError:
        return False, None


def _from_sacct(job_id: str) -> JobInfo | None:
    """The job in the accounting database (``sacct -P``), None when not there or no
    accounting storage."""
    with contextlib.suppress(Unreachable):
        acct = run_command(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o",
                     "JobID,State,ExitCode,NodeList,Timelimit,Reason"])
        if acct.returncode == 0:
            return parse_sacct(acct.stdout, job_id)
    return None


def job_info(job_id: str) -> JobInfo:
    """The job's state: ``squeue --json``, else ``scontrol`` (the controller keeps finished jobs for ``MinJobAge``, 300
    s by default), then ``sacct`` (needs accounting storage), else ``UNKNOWN``. Raises ControllerError: squeue or
    scontrol did not reach the controller. Unreachable: (exit 3) the command is missing or hangs."""
    if _json_works:
        answered, info = _from_squeue_json(job_id)
        if answered:
            return info or _from_sacct(job_id) or JobInfo(state="UNKNOWN")
    proc = run_command(["scontrol", "show", "job", "-o", str(job_id)])
    info = parse_scontrol_job(proc.stdout) if proc.returncode == 0 else None
    if info is not None:
        return info
    err = proc.stderr or proc.stdout
    if "invalid job id" not in err.lower():
        raise ControllerError(one_line(err or f"scontrol exit status {proc.returncode}"))
    return _from_sacct(job_id) or JobInfo(state="UNKNOWN")


def scancel(job_id: str) -> str | None:
    """``scancel ID`` (SIGTERM to every step, SIGKILL after ``KillWait``); returns an error
    line, or None when it worked or the job was gone already."""
    try:
        proc = run_command(["scancel", str(job_id)])
    except Unreachable as e:
        return str(e)
    if proc.returncode != 0 and "invalid job id" not in (proc.stderr or "").lower() \
            and "already completing" not in (proc.stderr or "").lower():
        return f"scancel {job_id}: {one_line(proc.stderr or proc.returncode)}"
    return None


def scancel_by_name(job_name: str) -> str | None:
    """``scancel --name=NAME --user=ME``: for a job whose id never came back (sbatch cut
    short by Ctrl-C); returns an error line or None."""
    import getpass

    try:
        proc = run_command(["scancel", f"--name={job_name}", f"--user={getpass.getuser()}"])
    except (Unreachable, KeyError, OSError) as e:
        return f"scancel --name={job_name}: {e}"
    return None if proc.returncode == 0 else f"scancel --name={job_name}: {one_line(proc.stderr or proc.returncode)}"


def hostnames(nodelist: str | None) -> list[str]:
    """Host names of a Slurm node list (``scontrol show hostnames``); [] on failure."""
    if not nodelist:
        return []
    with contextlib.suppress(Unreachable):
        proc = run_command(["scontrol", "show", "hostnames", nodelist])
        if proc.returncode == 0:
            return [h.strip() for h in proc.stdout.splitlines() if h.strip()]
    return []


def down_nodes(nodelist: str | None) -> list[str]:
    """The nodes of ``nodelist`` that Slurm has down, failing or drained (``sinfo -N``), as
    ``name (state)``; [] when none or sinfo does not answer."""
    if not nodelist:
        return []
    with contextlib.suppress(Unreachable):
        proc = run_command(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N %t"])
        if proc.returncode == 0:
            rows = sorted({(w[0], w[1]) for w in (line.split() for line in proc.stdout.splitlines()[:65536])
                           if len(w) >= 2})
            return [one_line(f"{n} ({s})", 300) for n, s in rows if s.startswith(("down", "fail", "drain", "drng"))]
    return []


def log_tail(path: str | os.PathLike, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` non-blank lines of a file joined with `` | `` ("" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def read_exit_status(path: str | os.PathLike[str]) -> int | None:
    """A node's ``node-<i>.exit``: the integer status, or None (missing, unreadable, not a
    regular file of at most 64 bytes, or a signal name: the node was stopped)."""
    try:
        text = read_text(path, 64, "exit status").strip()
    except EnvbuildError:
        return None
    return int(text) if re.fullmatch(r"-?\d{1,9}", text) else None

