#!/bin/bash
# The entry point of a node of scripts/setup-slurm-cluster.sh: munged with the cluster's key on
# the socket slurm.conf names (AuthInfo), then slurmctld (ctl) or slurmd (node) in the foreground.
set -euo pipefail
sock="$(sed -n 's/^AuthInfo=socket=//p' /etc/slurm/slurm.conf)"
install -o munge -g munge -m 0400 /run/envbuild-cluster-key /etc/munge/munge.key
mkdir -p "$(dirname "$sock")" /run/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
chown munge:munge "$(dirname "$sock")" /run/munge
rm -f "$sock" "$sock.lock"
runuser -u munge -- /usr/sbin/munged --socket="$sock" --force
case "${1:-}" in
    ctl) exec slurmctld -D -i ;;
    node) exec slurmd -D ;;
    *) echo "usage: $0 ctl|node" >&2; exit 64 ;;
esac
