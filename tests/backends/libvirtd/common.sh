# Shared by the scripts in tests/backends/libvirtd/ (sourced, not run).
# shellcheck disable=SC2034  # the variables are for the scripts that source this file
# A root libvirtd on this machine for tests: qemu:///system (TCG guests),
# a dir storage pool and an isolated DHCP network, both named `banlieue`.
# Everything it makes lives under $BANLIEUE_LIBVIRTD_DIR, except what libvirt
# itself insists on (/etc/libvirt/qemu.conf, /var/lib/libvirt, /run/libvirt).

DIR=${BANLIEUE_LIBVIRTD_DIR:-/tmp/banlieue-libvirtd}
RUN=$DIR/run
LOGS=$DIR/logs
POOL_NAME=${BANLIEUE_LIBVIRTD_POOL:-banlieue}
POOL_DIR=$DIR/pool
NET_NAME=${BANLIEUE_LIBVIRTD_NET:-banlieue}
NET_BRIDGE=${BANLIEUE_LIBVIRTD_BRIDGE:-virbr-banlieue}
# The /24 of the isolated network: .1 is the host's bridge, leases from .10 to .250, for 5 minutes.
NET_PREFIX=${BANLIEUE_LIBVIRTD_NET_PREFIX:-192.168.123}
URI=qemu:///system
TCP=${BANLIEUE_LIBVIRTD_TCP:-0}
TCP_PORT=${BANLIEUE_LIBVIRTD_TCP_PORT:-16509}
TCP_URI="qemu+tcp://127.0.0.1:$TCP_PORT/system"

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# virsh on $URI, never hanging for more than $VIRSH_TIMEOUT seconds.
v() { timeout "${VIRSH_TIMEOUT:-60}" virsh -q -c "$URI" "$@"; }

# Seconds since the epoch with milliseconds, and the difference of two of them.
now() { date +%s.%3N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The PID in pidfile $1 if that process is alive and its command name is $2.
live_pid() {
    local pid
    [ -s "$1" ] || return 1
    pid=$(tr -dc 0-9 <"$1")
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm")" = "$2" ] || return 1
    echo "$pid"
}

# Stop process $1 by PID: TERM, up to $2 seconds, then KILL.
stop_pid() {
    local pid=$1 wait=${2:-15} i
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < wait * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    log "pid $pid still alive after ${wait}s, sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
}

# Install the Debian packages among "$@" that are not installed (apt-get update
# first, only when something is missing). Never libvirt-daemon-system: it
# brings systemd units and the default network, which these scripts replace.
ensure_packages() {
    local p missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    INSTALLED_SOMETHING=1
}
