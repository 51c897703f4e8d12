#!/usr/bin/env bash
# Prepare a Debian/Ubuntu machine for envbuild, as root. Idempotent: each step checks first.
#
#   scripts/setup.sh                  # engine + debootstrap + .venv with envbuild
#   scripts/setup.sh --test           # same, with the test extras: pip install -e '.[test]'
#   scripts/setup.sh --extras a,b     # same, with other extras: pip install -e '.[a,b]'
#
# Steps:
#   1. Docker engine: if `docker info` fails, install docker.io with apt when there is no
#      dockerd, start dockerd (systemctl when systemd is PID 1, else
#      `nohup dockerd >/var/log/dockerd.log 2>&1 &`) and wait up to 60 s for it.
#   2. debootstrap (bootstraps a Debian base where no registry is reachable).
#   3. .venv in the repository root (python3 -m venv) with `pip install -e '.[EXTRAS]'`.
set -euo pipefail

EXTRAS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --test) EXTRAS="${EXTRAS:+$EXTRAS,}test" ;;
        --extras) [ $# -ge 2 ] || { echo "setup: --extras needs a value" >&2; exit 64; }
                  EXTRAS="${EXTRAS:+$EXTRAS,}$2"; shift ;;
        --extras=*) EXTRAS="${EXTRAS:+$EXTRAS,}${1#--extras=}" ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "setup: unknown argument: $1 (see --help)" >&2; exit 64 ;;
    esac
    shift
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WAIT_S="${ENVBUILD_ENGINE_WAIT_S:-60}"   # seconds to wait for a starting engine
APT_UPDATED=0

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

apt_install() {
    command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
    [ "$(id -u)" -eq 0 ] || die "installing $* needs root"
    if [ "$APT_UPDATED" -eq 0 ]; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        APT_UPDATED=1
    fi
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"
}

engine_answers() { docker info >/dev/null 2>&1; }
dockerd_running() { grep -qx dockerd /proc/[0-9]*/comm 2>/dev/null; }

# 1. Docker engine -------------------------------------------------------------------
if command -v docker >/dev/null && engine_answers; then
    say "Docker engine answers ($(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?'))"
else
    if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
        apt_install docker.io
    fi
    if [ "$(cat /proc/1/comm 2>/dev/null)" = "systemd" ]; then
        say "systemctl start docker"
        systemctl start docker
    elif dockerd_running; then
        say "dockerd is running but does not answer yet"
    else
        say "starting dockerd (log: /var/log/dockerd.log)"
        if command -v setsid >/dev/null; then
            setsid nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &
        else
            nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &
        fi
    fi
    say "waiting up to $WAIT_S s for the engine"
    for _ in $(seq "$WAIT_S"); do
        engine_answers && break
        sleep 1
    done
    engine_answers || die "the Docker engine does not answer after $WAIT_S s; see /var/log/dockerd.log or journalctl -u docker"
    say "Docker engine answers ($(docker version --format '{{.Server.Version}}'))"
fi

# 2. debootstrap ---------------------------------------------------------------------
if command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ]; then
    say "debootstrap present"
else
    apt_install debootstrap
fi

# 3. programs the test suite runs for real (only with --test) ---------------------------
#    docker-registry + apache2-utils: a real OCI registry with htpasswd auth (push/pull);
#    openssh-server, iptables, iproute2: ssh gathering and firewall/netns faults (verify,
#    doctor); chromium: the headless browser that opens the HTML reports
#    (tests/integration/test_report.py); prometheus (with promtool), prometheus-node-exporter
#    and rsyslog: the metrics and log tests start their own on loopback; slurm-wlm + munge are installed and started by scripts/setup-slurm.sh, which the Slurm
#    test fixtures call themselves (the three-node cluster's scripts/setup-slurm-cluster.sh
#    installs slurm-client + munge on the host the same way, slurm-wlm in its node image).
TEST_APT=()
case ",$EXTRAS," in
    *,test,*)
        for pkg in docker-registry apache2-utils openssh-server iptables iproute2 openssl chromium \
                   prometheus prometheus-node-exporter rsyslog; do
            dpkg -s "$pkg" >/dev/null 2>&1 || TEST_APT+=("$pkg")
        done ;;
esac
if [ ${#TEST_APT[@]} -gt 0 ]; then
    apt_install "${TEST_APT[@]}"
    # Debian starts the registry and sshd as services where systemd runs; the tests start
    # their own instances on their own ports.
fi

# 4. virtual environment -------------------------------------------------------------
cd "$ROOT"
if [ -x .venv/bin/python ]; then
    say ".venv present"
else
    say "$PYTHON -m venv .venv"
    "$PYTHON" -m venv .venv
fi
if [ -n "$EXTRAS" ]; then
    TARGET=".[$EXTRAS]"
else
    TARGET="."
fi
say ".venv/bin/pip install -e '$TARGET'"
.venv/bin/pip install -q -e "$TARGET"
say "done: activate with '. .venv/bin/activate', then run 'envbuild --help'"
