"""verify's default view at scale (issue 13, item 6): one line per group of equal nodes and full
rows only for the nodes that differ; ``--all`` a row for every node. Timing targets are in
benchmarks/bench_verify.py, not here."""

from __future__ import annotations

from fixtures_nodes import gpu_report, run_envbuild, write_reports


def rows(text: str) -> list[str]:
    """The node names that start a table row (``│`` after the name)."""
    return [line.split("│")[0].strip() for line in text.splitlines()
            if line.startswith(" node-") and "│" in line]


def test_summary_groups_equal_nodes_and_shows_only_the_odd_rows(tmp_path):
    docs = {f"n{i}.json": gpu_report(i) for i in range(1, 8)}
    docs["n7.json"] = gpu_report(7, kernel="6.8.0-51-generic")
    paths = write_reports(tmp_path, docs)
    proc = run_envbuild("verify", *paths)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[:3] == ["nodes: 7 in 2 groups",
                         "  6 nodes agree in every compared field: node-1, node-2, node-3, node-4, node-5 (+1 more)",
                         "  1 node: kernel 6.8.0-51-generic: node-7"]
    assert rows(proc.stdout) == ["node-7"]
    proc = run_envbuild("verify", *paths, "--all")  # its twin: every row
    assert proc.returncode == 1
    assert rows(proc.stdout) == [f"node-{i}" for i in range(1, 8)]


def test_summary_of_equal_nodes_has_no_rows(tmp_path):
    paths = write_reports(tmp_path, {f"n{i}.json": gpu_report(i) for i in range(1, 4)})
    proc = run_envbuild("verify", *paths)
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[:2] == ["nodes: 3 in 1 group",
                                            "  3 nodes agree in every compared field: node-1, node-2, node-3"]
    assert rows(proc.stdout) == []
