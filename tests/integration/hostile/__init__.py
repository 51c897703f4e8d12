"""Hostile-input suite: seeded generators of hostile recipes, node reports and command lines,
run through the real ``envbuild`` entry point in a bounded worker process (harness.py)."""
