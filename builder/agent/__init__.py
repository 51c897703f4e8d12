"""Code that runs inside images and on nodes with only the stdlib (+ torch, NVML if present):
the probe, the doctor agent, the benchmark, and the one payload mechanism that ships them.

May import: nothing of builder (relative imports inside agent only); Python >= 3.8.
"""
