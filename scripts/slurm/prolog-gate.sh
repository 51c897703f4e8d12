#!/bin/sh
# Slurm Prolog: `envbuild gate` on the node before each job. The policy (each outcome -> the job
# runs, or the node is drained with envbuild's reason and the job held) is the `case` below;
# docs/slurm-gate.md explains it, with the slurm.conf lines. As the Epilog too
# (SLURM_SCRIPT_CONTEXT=epilog_slurmd), it runs `envbuild gate --epilog` after each job: a failing
# node is drained the same way, and the script exits 0 (the job has ended: nothing to hold).
#
# slurm.conf:   Prolog=/etc/slurm/prolog-gate.sh        (this file, mode 0755, on every node)
#               Epilog=/etc/slurm/prolog-gate.sh
# settings:     /etc/envbuild/gate.conf, a shell file read here, for example
#                 ENVBUILD=/opt/envbuild/bin/envbuild
#                 GATE_ARGS="--against /etc/envbuild/cpu-torch2.cert.json --image registry/x@sha256:..."
#                 GATE_TIMEOUT_S=120
# Slurm runs a Prolog with its own SLURM_* variables only (no PATH, no HOME): a site that wants no
# job to run ungated sets ENVBUILD_GATE_REQUIRED=1 on the line below or in gate.conf.
ENVBUILD_GATE_REQUIRED="${ENVBUILD_GATE_REQUIRED:-0}"
CONF=/etc/envbuild/gate.conf
ENVBUILD=envbuild
GATE_ARGS=""
GATE_TIMEOUT_S=120
LOG=/var/log/envbuild-gate.log
PATH="${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}"
NODE="${SLURMD_NODENAME:-$(hostname -s)}"
EPILOG=0
case "${SLURM_SCRIPT_CONTEXT:-}" in epilog*) EPILOG=1 ;; esac

log() {
    printf '%s envbuild-gate: job %s on %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "${SLURM_JOB_ID:-none}" \
        "$NODE" "$1" >>"$LOG" 2>/dev/null || true
}

# The job names the reason (its Comment: `scontrol show job`); Slurm requeues it held. After the
# job (Epilog) the drained node is all: exit 0 (a failing Epilog adds Slurm's own "Epilog error").
hold() {
    [ "$EPILOG" = 1 ] && { log "drained after the job: $1"; exit 0; }
    [ -n "${SLURM_JOB_ID:-}" ] && scontrol update JobId="$SLURM_JOB_ID" Comment="$1" >>"$LOG" 2>&1
    log "drained, job held: $1"
    exit "$2"
}

# Drain the node with REASON ("<check> <value>: envbuild gate: ..."), then hold the job.
drain() {
    reason="$(printf '%s' "$1" | tr -c '[:print:]' ' ' | cut -c1-240)"
    scontrol update NodeName="$NODE" State=DRAIN Reason="$reason" >>"$LOG" 2>&1 || EPILOG=0  # Slurm drains it
    hold "$reason" "$2"
}

# The site's setup, not the node (no config, no envbuild, bad arguments): run ungated, unless required.
unset_up() {
    [ "$ENVBUILD_GATE_REQUIRED" = 1 ] && drain "$1: envbuild gate: $2, ENVBUILD_GATE_REQUIRED=1" "$3"
    log "not gated, the job runs: $2 (set ENVBUILD_GATE_REQUIRED=1 to drain instead)"
    exit 0
}

if [ ! -r "$CONF" ]; then
    unset_up "gate.conf missing" "no readable $CONF" 3
fi
if ! (. "$CONF") >/dev/null 2>&1; then
    unset_up "gate.conf invalid" "$CONF does not run as a shell file" 64
fi
. "$CONF"
case "$GATE_TIMEOUT_S" in ''|*[!0-9]*|0*|?????*) GATE_TIMEOUT_S=120 ;; esac  # 1 to 9999 s
if ! command -v "$ENVBUILD" >/dev/null 2>&1; then
    unset_up "envbuild missing" "$ENVBUILD: not found" 3
fi
MODE=--drain
[ "$EPILOG" = 1 ] && MODE="--drain --epilog"
# shellcheck disable=SC2086  # GATE_ARGS and MODE are lists of words
timeout -k 5 "$GATE_TIMEOUT_S" "$ENVBUILD" gate $GATE_ARGS $MODE >>"$LOG" 2>&1
rc=$?
case "$rc" in
    0|1) [ "$EPILOG" = 1 ] && { log "epilog: gate exit $rc: the node stays up"; exit 0; }
         log "gate exit $rc: the job runs"; exit 0 ;;
    2|3) reason="$(sinfo -h -n "$NODE" -o '%E' 2>/dev/null | head -n 1)"  # the gate drained the node
         [ -n "$reason" ] && [ "$reason" != none ] && hold "$reason" "$rc"
         drain "gate.exit $rc: envbuild gate: the gate could not drain the node (see $LOG)" "$rc" ;;
    64) unset_up "gate.args 64" "GATE_ARGS of $CONF refused (exit 64)" 64 ;;
    124|137) drain "gate.timeout ${GATE_TIMEOUT_S}s: envbuild gate: ran over GATE_TIMEOUT_S, killed" 3 ;;
    *) drain "gate.exit $rc: envbuild gate: ended unexpectedly (see $LOG)" 3 ;;
esac
