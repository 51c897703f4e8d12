"""Judging the profiles (:mod:`builder.agent.bench.profiles`) of a certification run, and
their sections of the certificate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from builder.agent.bench.collectives import COLLECTIVES
from builder.agent.bench.profiles import PROFILES, collectives_for
from builder.core.documents import (
    MAX_WRONG_RANKS,
    CollectiveRow,
    ProfilesResult,
    RankResult,
    TrainingCheck,
    Unsupported,
)
from builder.core.inputs import one_line

from .settings import RunSettings


def _reference(results: Mapping[int, RankResult]) -> tuple[int, ProfilesResult] | None:
    for r in sorted(results):
        if results[r].profiles is not None:
            return r, results[r].profiles  # type: ignore[return-value]
    return None


def _wrong_text(rows: list[CollectiveRow], world: int) -> str | None:
    """``"8 B float32 (1 wrong element on rank 1), ..."`` for the rows with wrong elements."""
    parts = []
    for row in rows:
        if not row.wrong:
            continue
        ranks = row.wrong_ranks or [r for r, w in enumerate(row.wrong_by_rank or []) if w]
        named = row.wrong_rank_count or 0
        more = f" and {named - len(ranks)} more" if named > len(ranks) else ""
        on = f" on rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))}{more}" if ranks else ""
        parts.append(f"{row.size_bytes} B {row.type} ({row.wrong} wrong element{'s' if row.wrong != 1 else ''}{on})")
    if not parts:
        return None
    return ", ".join(parts[:8]) + (f" and {len(parts) - 8} more" if len(parts) > 8 else "")


def _merged_rows(name: str, results: Mapping[int, RankResult], ref_rows: list[CollectiveRow]) -> list[CollectiveRow]:
    """The reference rank's rows, each naming the ranks whose own count was not 0 (one pass
    over each rank's own rows: O(N x rows)); ``wrong`` at least their sum."""
    bad: list[list[int]] = [[] for _ in ref_rows]
    total = [0] * len(ref_rows)
    for r in sorted(results):
        prof = results[r].profiles
        other = prof.collectives.get(name) if prof is not None else None
        if not isinstance(other, list):
            continue
        for i, row in enumerate(ref_rows):
            if i < len(other) and other[i].size_bytes == row.size_bytes and other[i].own_wrong:
                total[i] += other[i].own_wrong or 0
                bad[i].append(r)
    return [CollectiveRow(**{**row.to_dict(), "wrong": max(row.wrong, total[i]),
                             "wrong_ranks": bad[i][:MAX_WRONG_RANKS], "wrong_rank_count": len(bad[i]),
                             "own_time_us": None, "own_wrong": None}) for i, row in enumerate(ref_rows)]


def collectives_section(results: Mapping[int, RankResult]) -> dict[str, list[CollectiveRow] | Unsupported]:
    """``collectives`` of the certificate: per collective its rows (``wrong`` the total over
    ranks, each rank's count the largest any rank reported) or ``{"unsupported": reason}``."""
    found = _reference(results)
    if found is None:
        return {}
    out: dict[str, list[CollectiveRow] | Unsupported] = {}
    got = found[1].collectives
    for name in sorted(got, key=lambda n: (COLLECTIVES.index(n) if n in COLLECTIVES else len(COLLECTIVES), n)):
        value = got[name]
        out[name] = _merged_rows(name, results, value) if isinstance(value, list) else value
    return out


def check_profiles(s: RunSettings, results: Mapping[int, RankResult]) -> tuple[list[str], list[str]]:
    """``(failures, warnings)`` of the profiles, each naming the collective or profile."""
    if not s.profiles or not results:
        return [], []
    failures = [f"rank {r}: no profile results ({one_line('; '.join(d.errors) or 'not reported', 300)})"
                for r, d in sorted(results.items()) if d.profiles is None]
    found = _reference(results)
    if found is None:
        return failures, []
    ref, doc = found
    warnings: list[str] = [f"fault note: {one_line(n, 200)}" for n in doc.fault_notes]
    coll = collectives_section(results)
    for name in collectives_for(s.profiles):
        value = coll.get(name)
        if value is None:
            failures.append(f"collective {name}: no result (rank {ref})")
        elif isinstance(value, Unsupported):
            warnings.append(f"collective {name} unsupported (not counted as passed): "
                            f"{one_line(value.unsupported, 300)}")
        else:
            bad = _wrong_text(value, s.world_size)
            if bad:
                failures.append(f"collective {name} wrong at {bad}")
            if not value:
                failures.append(f"collective {name}: no rows")
    for name, types in sorted(doc.unsupported_types.items()):
        for dtype, why in sorted(types.items()):
            warnings.append(f"collective {name} {dtype} unsupported: {one_line(why, 200)}")
    for profile in s.profiles:
        failures += _training_failures(profile, doc.training.get(profile), warnings)
    failures += _scaling_failures(s, doc)
    numpy = _numpy_warning(doc)
    if numpy:
        warnings.append(numpy)
    return failures, warnings


def _training_failures(profile: str, check: TrainingCheck | None, warnings: list[str]) -> list[str]:
    if check is None:
        return [f"training {profile}: no result"]
    if check.unsupported is not None:
        if not check.needs_numpy:  # numpy: one line for all (_numpy_warning)
            warnings.append(f"training {profile} unsupported (not counted as passed): "
                            f"{one_line(check.unsupported, 300)}")
        return []
    if check.reference_match:
        return []
    diff = "n/a" if check.max_param_diff is None else f"{check.max_param_diff:.3g}"
    tol = check.tolerance or {}
    return [f"training {profile} does not match its single-process reference: losses "
            f"{'match' if check.losses_match else 'differ'}, parameters {'match' if check.params_match else 'differ'} "
            f"(max difference {diff}; rtol {tol.get('rtol')}, atol {tol.get('atol')})"]


def _scaling_failures(s: RunSettings, doc: ProfilesResult) -> list[str]:
    floor = s.min_scaling_efficiency
    if floor is None:
        return []
    eff = doc.scaling.efficiency if doc.scaling is not None else None
    if eff is None:
        return [f"scaling efficiency not measured; --min-scaling-efficiency {floor:g} cannot be checked"]
    if eff < floor:
        sc = doc.scaling
        assert sc is not None
        return [f"scaling efficiency {eff:.3f} is below the floor of {floor:g} (argument): {sc.throughput_n:.2f} "
                f"images/s at {sc.world_size} ranks, {sc.throughput_1:.2f} at 1"]
    return []


def _numpy_warning(doc: ProfilesResult) -> str | None:
    """One line when numpy is missing: what needs it (reported unsupported)."""
    needs = [f"training {p}" for p, c in doc.training.items() if c.needs_numpy]
    feats = doc.features
    if feats is not None:
        for name in ("all_gather_object", "pipeline_shape_inference", "dcp_save"):
            value = getattr(feats, name)
            if not isinstance(value, str) and value.needs_numpy:
                needs.append(name)
    if not needs and (feats is None or feats.numpy.available):
        return None
    where = ""
    if feats is not None and feats.numpy.ranks_without:
        where = f" on rank(s) {','.join(map(str, feats.numpy.ranks_without))}"
    return (f"numpy is not installed in the image{where}: {', '.join(needs) or 'nothing'} reported unsupported "
            "(a training image without numpy breaks jobs that use them)")


def training_section(results: Mapping[int, RankResult]) -> dict[str, TrainingCheck]:
    """``training`` of the certificate: the reference rank's checks per profile."""
    found = _reference(results)
    got = found[1].training if found else {}
    order = list(PROFILES)
    return {p: got[p] for p in sorted(got, key=lambda p: (order.index(p) if p in order else len(order), p))}


def scaling_section(results: Mapping[int, RankResult]) -> Any:
    """``scaling`` of the certificate (the reference rank's), None when not measured."""
    found = _reference(results)
    return found[1].scaling if found else None


def features_section(results: Mapping[int, RankResult]) -> Any:
    """``features`` of the certificate (the reference rank's), None when not run."""
    found = _reference(results)
    return found[1].features if found else None


def profile_wall_s(results: Mapping[int, RankResult]) -> dict[str, Any]:
    """``profile_wall_s`` of the certificate: the reference rank's ``wall_s`` (seconds)."""
    found = _reference(results)
    return dict(found[1].wall_s) if found else {}
