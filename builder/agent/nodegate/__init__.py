"""The gate inside a Kubernetes DaemonSet pod: ``python3 -m nodegate SPEC.json [--once]``.
Probes the node in the certified image, compares it with the gate spec, then labels a passing
node (removing its taint: a repaired node returns) or taints a failing one ``NoSchedule``, every
``--interval`` s; ``--metrics-port`` serves the last check's gauges. Stdlib only."""
