"""envbuild: reproducible, certified GPU training environments for multi-node PyTorch.

Data flows one way through the stages (one module each):
recipe -> compat (resolved spec) -> render (files) -> build (image) -> launchers
(rank results) -> certify (certificate).
"""

__version__ = "0.1.0"
