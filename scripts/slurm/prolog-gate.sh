#!/bin/sh
# Slurm Prolog: run `envbuild gate` on the node before each job (issue 11).
#
# slurm.conf:   Prolog=/etc/slurm/prolog-gate.sh        (this file, mode 0755, on every node)
# settings:     /etc/envbuild/gate.conf, a shell file read here, for example
#                 ENVBUILD=/opt/envbuild/bin/envbuild
#                 GATE_ARGS="--against /etc/envbuild/cpu-torch2.cert.json --image registry/x@sha256:..."
#
# The gate drains a node that fails (exit 2) or cannot be checked (exit 3) with the reason
# "envbuild gate: <first failure>", and this script exits non-zero: Slurm then requeues the
# job (held) and it does not run on that node. Warnings only (exit 1) let the job run.
# Resume a node once fixed:  scontrol update NodeName=<node> State=RESUME
# Each run's report is appended to the gate's history folder (/var/lib/envbuild/gate/<host>/).
CONF=/etc/envbuild/gate.conf
ENVBUILD=envbuild
GATE_ARGS=""
LOG=/var/log/envbuild-gate.log
[ -r "$CONF" ] && . "$CONF"
# shellcheck disable=SC2086  # GATE_ARGS is a list of words
"$ENVBUILD" gate $GATE_ARGS --drain >>"$LOG" 2>&1
rc=$?
if [ "$rc" -le 1 ]; then
    exit 0
fi
exit "$rc"
