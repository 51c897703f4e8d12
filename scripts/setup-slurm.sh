#!/usr/bin/env bash
# A real one-node Slurm on this Debian/Ubuntu machine, for tests and the Slurm launcher. As
# root; idempotent: a node that is already up and idle is left alone.
#
#   scripts/setup-slurm.sh            # install, configure, start, wait until idle
#   scripts/setup-slurm.sh --check    # exit 0 if sinfo shows this node up (idle/mix/alloc)
#
# Steps:
#   1. apt-get install slurm-wlm munge (Debian's packages: slurmctld, slurmd, srun, sinfo).
#   2. /etc/slurm/slurm.conf for this host only: SlurmctldHost and NodeName = $(hostname),
#      the node's CPUs and RealMemory as `slurmd -C` measures them, partition `debug`
#      (Default=YES), ProctrackType=proctrack/linuxproc, TaskPlugin=task/none,
#      SelectType=select/cons_tres (CR_CPU), MpiDefault=none, no cgroup plugin, no
#      accounting. An existing file is kept unless it carries our marker line.
#   3. /etc/munge/munge.key (1024 random bytes, mode 0400, owner munge) when missing.
#   4. munged, slurmctld, slurmd started directly (no systemd here), each only when not
#      already running (by pid file); logs in /var/log/slurm/ and /var/log/munge/.
#   5. wait up to 60 s until `sinfo` shows the node idle (or busy with jobs: mix, alloc);
#      a drained or down node from an earlier run is resumed with scontrol.
set -euo pipefail

say() { printf 'setup-slurm: %s\n' "$*"; }
die() { printf 'setup-slurm: error: %s\n' "$*" >&2; exit 1; }

HOST="$(hostname)"
CONF=/etc/slurm/slurm.conf
MARKER="# written by envbuild scripts/setup-slurm.sh"

node_idle() {  # the node answers and takes jobs: idle, or busy with jobs of others
    command -v sinfo >/dev/null || return 1
    local state
    state="$(timeout 10 sinfo -h -n "$HOST" -o '%t' 2>/dev/null | head -n1)" || return 1
    case "$state" in
        idle|mix|alloc|comp|plnd) return 0 ;;
        *) return 1 ;;
    esac
}

if [ "${1:-}" = "--check" ]; then
    node_idle
    exit $?
fi
[ "$(id -u)" -eq 0 ] || die "needs root"

if node_idle; then
    say "node $HOST is idle; nothing to do"
    exit 0
fi

# 1. packages ------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v srun >/dev/null; then
    command -v apt-get >/dev/null || die "apt-get not found; install slurm-wlm and munge by hand"
    say "apt-get install slurm-wlm munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -q
    # No init system runs here: keep the package scripts from starting daemons.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d.envbuild
    chmod +x /usr/sbin/policy-rc.d.envbuild
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        ln -s /usr/sbin/policy-rc.d.envbuild /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d /usr/sbin/policy-rc.d.envbuild' EXIT
    fi
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends slurm-wlm munge
fi

# 2. slurm.conf ----------------------------------------------------------------------
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ ! -f "$CONF" ] || grep -qxF "$MARKER" "$CONF"; then
    # `slurmd -C` prints this machine as a NodeName line: CPUs, sockets, cores, memory.
    NODE_LINE="$(slurmd -C 2>/dev/null | grep '^NodeName=' | head -n1)"
    [ -n "$NODE_LINE" ] || die "slurmd -C printed no NodeName line"
    CPUS="$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")"
    MEM="$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$NODE_LINE")"
    [ -n "$CPUS" ] && [ -n "$MEM" ] || die "cannot read CPUs/RealMemory from: $NODE_LINE"
    cat > "$CONF.tmp" <<EOF
$MARKER
ClusterName=envbuild
SlurmctldHost=$HOST
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    if [ -f "$CONF" ] && cmp -s "$CONF.tmp" "$CONF"; then
        rm -f "$CONF.tmp"
        say "$CONF is up to date"
    else
        mv "$CONF.tmp" "$CONF"
        say "wrote $CONF (NodeName=$HOST CPUs=$CPUS RealMemory=$MEM)"
        CONF_CHANGED=1
    fi
else
    say "$CONF exists and was not written by envbuild; using it as is"
fi

# 3. munge key -----------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    say "created /etc/munge/munge.key"
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge

# 4. daemons -------------------------------------------------------------------------
running() {  # running PIDFILE NAME: the pid in PIDFILE is alive and is NAME
    local pid
    [ -s "$1" ] || return 1
    pid="$(cat "$1")"
    [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
if running /run/munge/munged.pid munged; then
    say "munged is running"
else
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 20); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.5; done
munge -n </dev/null | unmunge >/dev/null || die "munge does not work; see /var/log/munge/munged.log"

if running /run/slurmctld.pid slurmctld; then
    say "slurmctld is running"
    if [ "${CONF_CHANGED:-0}" = 1 ]; then
        say "scontrol reconfigure (slurm.conf changed)"
        scontrol reconfigure || true
    fi
else
    say "starting slurmctld"
    slurmctld
fi
if running /run/slurmd.pid slurmd; then
    say "slurmd is running"
else
    say "starting slurmd"
    slurmd
fi

# 5. wait for the node -----------------------------------------------------------------
for i in $(seq 60); do
    if node_idle; then
        say "node $HOST is idle (partition debug)"
        exit 0
    fi
    state="$(timeout 10 sinfo -h -n "$HOST" -o '%t' 2>/dev/null | head -n1 || true)"
    case "$state" in
        drain*|drng|down*|fail*) [ $((i % 5)) -eq 1 ] && scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 1
done
die "node $HOST is not idle after 60 s (state: ${state:-unknown}); see /var/log/slurm/slurmctld.log and slurmd.log"
