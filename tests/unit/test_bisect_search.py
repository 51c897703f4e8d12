"""The bisection's search (builder/certify/bisect.py: search) over nodes whose faults are given:
each run fails when it holds a bad node (or, for a fault between two nodes, both of them)."""

from __future__ import annotations

from builder.certify.bisect import Trial, search


def runs_with(bad: set[int], together: set[int] | None = None):
    seen: list[list[int]] = []

    def trial(nodes: list[int]) -> Trial:
        seen.append(list(nodes))
        failed = bool(bad & set(nodes)) or (together is not None and together <= set(nodes))
        return Trial(nodes=list(nodes), passed=not failed, reason="threshold" if failed else None,
                     evidence=[f"slow on {sorted(set(nodes) & bad)}"] if failed else [], run_id=f"r{len(seen)}",
                     seconds=1.0)
    return trial, seen


def test_one_bad_node_of_eight_in_log_rounds():
    trial, seen = runs_with({5})
    bad, unresolved, trials, rounds = search(list(range(8)), trial)
    assert [(b.node, b.reason, b.evidence, b.run_id) for b in bad] == [(5, "threshold", ["slow on [5]"], "r6")]
    assert unresolved == [] and rounds == 3 and len(trials) == 6
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [4, 5], [6, 7], [4, 0], [5, 0]]


def test_two_bad_nodes_in_both_halves():
    trial, seen = runs_with({1, 6})
    bad, unresolved, trials, _ = search(list(range(8)), trial)
    assert [b.node for b in bad] == [1, 6] and unresolved == []
    assert all(len(n) >= 2 for n in seen)  # a lone node always ran with a good one


def test_a_lone_node_waits_for_a_good_partner():
    trial, seen = runs_with({0})
    bad, _, _, _ = search([0, 1, 2], trial)
    # [0, 1] fails; 2, 0 and 1 are lone halves with no good node known: 2 and 0 together fail,
    # 2 then runs alone, passes and is the partner of the others
    assert [b.node for b in bad] == [0] and seen == [[0, 1], [2, 0], [2], [0, 2], [1, 2]]


def test_a_fault_only_between_two_halves_is_unresolved():
    trial, seen = runs_with(set(), together={1, 2})
    bad, unresolved, _, _ = search([0, 1, 2, 3], trial)
    assert bad == [] and unresolved == [0, 1, 2, 3] and seen == [[0, 1], [2, 3]]


def test_passing_twin_names_no_node():
    trial, seen = runs_with(set())
    bad, unresolved, trials, rounds = search([0, 1, 2, 3], trial)
    assert bad == [] and unresolved == [0, 1, 2, 3] and (len(trials), rounds) == (2, 1)
