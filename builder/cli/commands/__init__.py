"""The commands, one module per stage they drive: recipe (check, audit, render, lock), image
(build, base bootstrap), certify (certify, make, k8s render), nodes (probe, verify, doctor),
publish (push, pull).

Each ``cmd_*(args) -> exit code`` imports its stage when it runs, so a command loads only what
it needs (``envbuild check`` imports neither docker, jinja2, requests, kubernetes, oras nor rich).
"""
