"""Runs inside images and on nodes with only the stdlib (+ torch): probe, agents, bench.
"""
