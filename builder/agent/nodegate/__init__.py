"""The gate inside a Kubernetes DaemonSet pod: probe the node in the certified image, compare
with the gate spec rendered from the certificate, then label or taint the node.

Runs in the certified image with the standard library only (Python >= 3.8), shipped in the
ConfigMap of ``envbuild k8s gate`` (every file of ``builder/agent/``)::

    python3 -m nodegate SPEC.json [--once] [--interval S]

SPEC (schema ``envbuild.gate-spec/1``, written by :mod:`builder.launchers.k8s.gate` from
what :mod:`builder.nodes.gatespec` takes of the certificate)::

    {"schema": "envbuild.gate-spec/1",
     "certificate": str, "made_at": str|null, "max_age_s": float, "envbuild_version": str|null,
     "label_value": "0123456789ab",          # the lock hash, 12 hex: the node label's value
     "fields": [{"field": "torch.version", "path": ["torch", "version"], "want": str|null}],
     "driver": {"fail_below": str|null, "unless": [[[op, version], ...], ...],
                "warn_below": str|null, "why": str},
     "checks": ["gpu-uuid", "gpu-processes"]}

A node passes when every field of its probe equals ``want`` (the certified value; verify's
must-match rules), its driver is not below ``fail_below`` (unless it meets one of the
``unless`` driver ranges, which only warns: the GPU brand decides), and the local checks
pass. A passing node gets the label ``envbuild.dev/certified=<label_value>`` and loses the
taint; a failing one loses the label and gets the taint
``envbuild.dev/uncertified=<reason>:NoSchedule`` (:mod:`.kube`), where the reason is the
first failing field, as a label value. The check repeats every ``--interval`` seconds
(default 600) until the pod is stopped; ``--once`` checks once and exits 0/1/2.
"""
