#!/usr/bin/env bash
# A three-node Slurm cluster of containers on this Docker engine, beside the one-node Slurm of
# scripts/setup-slurm.sh (docs/slurm-cluster.md). As root.
#
#   scripts/setup-slurm-cluster.sh up IMAGE   # build the node image FROM IMAGE, start, wait until idle
#   scripts/setup-slurm-cluster.sh down       # remove the containers, the network, the host's munged
#   scripts/setup-slurm-cluster.sh env        # the variables the host's Slurm clients need
#
# One controller (ebc-ctl) and three slurmd machines (ebc-n1..3), each a container with its own
# hostname and fixed address on the network envbuild-slurm-cluster, one munge key. The host's
# own Slurm clients submit (SLURM_CONF=$STATE/etc/slurm.conf, printed by `env`) through a second
# munged on the host with the cluster's key on its own socket: envbuild then runs where the
# Docker engine and the certified image are, and no host Slurm setting changes.
# Run folders go under $STATE/shared (bind-mounted at the same path in every node).
#
# The node image is IMAGE plus Debian's slurm-wlm and munge, plus envbuild installed from wheels
# offline (`pip wheel` here, `pip install --no-index` in the image); tagged by IMAGE's ID and
# the wheels' content, so a second `up` reuses it. Environment:
#   ENVBUILD_CLUSTER_STATE   state folder (default /var/lib/envbuild/slurm-cluster)
#   ENVBUILD_CLUSTER_LABELS  extra labels k=v,k=v on the network, containers and image
#   ENVBUILD_PYTHON          a Python where envbuild and pip are installed (default python3): it
#                            builds the wheels and finds the BuildKit client as `envbuild build` does
set -euo pipefail

say() { printf 'setup-slurm-cluster: %s\n' "$*"; }
die() { printf 'setup-slurm-cluster: error: %s\n' "$*" >&2; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="${ENVBUILD_CLUSTER_STATE:-/var/lib/envbuild/slurm-cluster}"
NET=envbuild-slurm-cluster
LABEL=envbuild.slurm-cluster
NODES=(ebc-n1 ebc-n2 ebc-n3)
CTL=ebc-ctl
RUNDIR=/run/envbuild-slurm-cluster  # the host munged of whichever state folder is up
SOCK=$RUNDIR/munge.socket
CONF="$STATE/etc/slurm.conf"
PY="${ENVBUILD_PYTHON:-python3}"
case "$STATE" in /*) ;; *) die "ENVBUILD_CLUSTER_STATE must be an absolute path: $STATE" ;; esac

label_args() {  # --label k=v for the cluster's label and each of ENVBUILD_CLUSTER_LABELS
    printf -- '--label\n%s=1\n' "$LABEL"
    local item
    IFS=',' read -ra items <<<"${ENVBUILD_CLUSTER_LABELS:-}"
    for item in "${items[@]}"; do
        [[ "$item" =~ ^[A-Za-z0-9][A-Za-z0-9._/-]*=[A-Za-z0-9._/:-]*$ ]] || die "not a label k=v: $item"
        printf -- '--label\n%s\n' "$item"
    done
}

host_munged_stop() {
    local pid
    [ -s "$RUNDIR/munged.pid" ] || return 0
    pid="$(cat "$RUNDIR/munged.pid")"
    if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = munged ]; then
        kill "$pid" || true
        for _ in $(seq 20); do [ -d "/proc/$pid" ] || break; sleep 0.25; done
    fi
    rm -f "$RUNDIR/munged.pid"
}

down() {
    docker ps -aq --filter "label=$LABEL" | xargs -r docker rm -f >/dev/null
    docker network rm "$NET" >/dev/null 2>&1 || true
    host_munged_stop
    say "down"
}

idle_nodes() {  # how many of the three nodes sinfo shows idle
    SLURM_CONF="$CONF" timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | sort -u | wc -l
}

build_image() {  # build_image IMAGE -> prints the node image tag
    local image="$1" ctx="$STATE/build" id hash tag
    id="$(docker image inspect -f '{{.Id}}' "$image")" || die "no such image: $image"
    rm -rf "$ctx" && mkdir -p "$ctx/wheels"
    "$PY" -m pip wheel -q --disable-pip-version-check "$ROOT" pip -w "$ctx/wheels" >&2 \
        || die "pip wheel failed"
    cp "$ROOT/scripts/slurm/cluster-node.sh" "$ctx/node.sh"
    cat > "$ctx/Dockerfile" <<EOF
FROM $image
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      slurm-wlm munge tini procps iproute2 \\
 && rm -rf /var/lib/apt/lists/*
# envbuild as a site installs it: from wheel files, no index, in its own venv (the certified
# stack in /opt/venv stays as it is); python3 on the jobs' PATH is that stack's.
RUN --mount=type=bind,source=wheels,target=/wheels \\
    /usr/bin/python3 -m venv --without-pip /usr/local/lib/envbuild \\
 && /usr/local/lib/envbuild/bin/python3 /wheels/\$(cd /wheels && ls pip-*.whl)/pip install -q --no-index \\
      --no-cache-dir --disable-pip-version-check --find-links /wheels envbuild \\
 && ln -s /usr/local/lib/envbuild/bin/envbuild /usr/local/bin/envbuild \\
 && printf '#!/bin/sh\nexec /opt/venv/bin/python3 "\$@"\n' > /usr/local/bin/python3 \\
 && chmod 0755 /usr/local/bin/python3
COPY node.sh /usr/local/sbin/envbuild-cluster-node
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/sbin/envbuild-cluster-node"]
EOF
    # the tag: IMAGE's ID, the wheels' contents (a wheel's zip times change, its files do not), the recipe
    hash="$( { echo "$id"; cat "$ctx/Dockerfile" "$ctx/node.sh";
               python3 - "$ctx/wheels" <<'PY'
import hashlib, pathlib, sys, zipfile
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    with zipfile.ZipFile(w) as z:
        for n in sorted(z.namelist()):
            print(w.name, n, hashlib.sha256(z.read(n)).hexdigest())
PY
             } | sha256sum | cut -c1-12)"
    tag="envbuild/slurm-node:$hash"
    if docker image inspect "$tag" >/dev/null 2>&1; then
        say "node image $tag is built" >&2
    else
        say "building node image $tag FROM $image" >&2
        mapfile -t labels < <(label_args)
        mapfile -t bk < <("$PY" -c 'from builder.image.buildkit import buildkit_cli as b; c = b()
print(" ".join(f"{k}={v}" for k, v in c.env.items())); print(*c.argv, sep="\n")') || die "no BuildKit client"
        env ${bk[0]} "${bk[@]:1}" -q -t "$tag" "${labels[@]}" "$ctx" >&2 || die "docker build failed"
    fi
    printf '%s\n' "$tag"
}

write_conf() {  # write_conf PREFIX (the network's first three octets)
    local p="$1" i=0 cpus
    cpus="$(nproc)"
    mkdir -p "$STATE/etc" "$STATE/shared"
    {
        echo "# written by envbuild scripts/setup-slurm-cluster.sh"
        echo "ClusterName=envbuild-cluster"
        echo "SlurmctldHost=$CTL($p.10)"
        echo "AuthType=auth/munge"
        echo "AuthInfo=socket=$SOCK"
        echo "MpiDefault=none"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "ReturnToService=2"
        echo "SlurmdTimeout=20"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "StateSaveLocation=/var/spool/slurmctld"
        echo "SlurmdSpoolDir=/var/spool/slurmd"
        echo "SlurmctldPidFile=/run/slurmctld.pid"
        echo "SlurmdPidFile=/run/slurmd.pid"
        echo "SlurmctldLogFile=/var/log/slurm/slurmctld.log"
        echo "SlurmdLogFile=/var/log/slurm/slurmd.log"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "JobCompType=jobcomp/none"
        for n in "${NODES[@]}"; do
            i=$((i + 1))
            echo "NodeName=$n NodeAddr=$p.$((10 + i)) CPUs=$cpus RealMemory=512 State=UNKNOWN"
        done
        echo "PartitionName=cluster Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
    } > "$CONF"
}

host_munged() {  # a munged with the cluster's key on its own socket, for the host's clients
    mkdir -p "$STATE/munge" "$RUNDIR"
    if [ ! -s "$STATE/munge/munge.key" ]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0700 "$STATE/munge" && chmod 0400 "$STATE/munge/munge.key"
    host_munged_stop
    # munged runs as munge, which may not reach into STATE (a private temporary folder): its
    # files live in RUNDIR, the key copied there
    install -o munge -g munge -m 0400 "$STATE/munge/munge.key" "$RUNDIR/munge.key"
    chown munge:munge "$RUNDIR" && chmod 0755 "$RUNDIR"
    runuser -u munge -- /usr/sbin/munged --socket="$SOCK" --key-file="$RUNDIR/munge.key" \
        --pid-file="$RUNDIR/munged.pid" --seed-file="$RUNDIR/munged.seed" --log-file="$RUNDIR/munged.log"
    for _ in $(seq 20); do munge -S "$SOCK" -n </dev/null >/dev/null 2>&1 && return 0; sleep 0.5; done
    die "the host's cluster munged does not answer; see $RUNDIR/munged.log"
}

up() {
    local image="${1:-}" tag p i
    [ -n "$image" ] || die "usage: $0 up IMAGE"
    [ "$(id -u)" -eq 0 ] || die "needs root"
    command -v docker >/dev/null || die "docker not found"
    if ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
        say "apt-get install slurm-client munge (the host's clients and its munged)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o DPkg::Lock::Timeout=300 update -q && apt-get -o DPkg::Lock::Timeout=300 install -y -q \
            --no-install-recommends slurm-client munge || die "apt-get install slurm-client munge failed"
    fi
    tag="$(build_image "$image")"
    down >/dev/null
    mapfile -t labels < <(label_args)
    # fixed addresses need a subnet of our own: the first free one of 10.213.0-31.0/24
    for i in $(seq 0 31); do
        p="10.213.$i"
        docker network create --subnet "$p.0/24" "${labels[@]}" "$NET" >/dev/null 2>&1 && break
        p=""
    done
    [ -n "$p" ] || die "no free subnet in 10.213.0.0/19 for the network $NET"
    write_conf "$p"
    host_munged
    local i=0 n
    for n in "$CTL" "${NODES[@]}"; do
        docker run -d --name "$n" --hostname "$n" --network "$NET" --ip "$p.$((10 + i))" "${labels[@]}" \
            --cap-add NET_ADMIN --shm-size 1g \
            -v "$STATE/etc:$STATE/etc:ro" -v "$CONF:/etc/slurm/slurm.conf:ro" \
            -v "$STATE/munge/munge.key:/run/envbuild-cluster-key:ro" -v "$STATE/shared:$STATE/shared" \
            "$tag" "$([ "$n" = "$CTL" ] && echo ctl || echo node)" >/dev/null
        i=$((i + 1))
    done
    for _ in $(seq 90); do
        [ "$(idle_nodes)" -eq 3 ] && { say "3 nodes idle (${NODES[*]}, partition cluster); export SLURM_CONF=$CONF"; return 0; }
        sleep 1
    done
    SLURM_CONF="$CONF" sinfo -N >&2 || true
    die "the nodes are not idle after 90 s; see docker logs $CTL"
}

case "${1:-}" in
    up) up "${2:-}" ;;
    down) down ;;
    env) echo "SLURM_CONF=$CONF"; echo "ENVBUILD_CLUSTER_SHARED=$STATE/shared" ;;
    *) die "usage: $0 up IMAGE | down | env" ;;
esac
