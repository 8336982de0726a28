#!/usr/bin/env bash
# Start a root libvirtd for tests (TCG guests, qemu:///system) with a dir
# storage pool and an isolated DHCP network, both named `banlieue`.
#
# Installs what is missing (Debian packages; never libvirt-daemon-system),
# creates the libvirt-qemu user/group, libvirt's dirs and /etc/libvirt/qemu.conf
# (guests run as root, no dynamic ownership, no security driver), starts
# virtlogd and libvirtd with their pidfiles in $BANLIEUE_LIBVIRTD_DIR/run
# (default /tmp/banlieue-libvirtd), waits until libvirtd answers, then defines
# and starts the pool (dir $BANLIEUE_LIBVIRTD_DIR/pool) and the network
# (bridge virbr-banlieue, 192.168.123.0/24, DHCP .10-.250, 5-minute leases, no forwarding:
# guests reach the host's bridge address and nothing else).
# Idempotent: what already runs or exists is kept. Prints the URI(s) on stdout.
#
# BANLIEUE_LIBVIRTD_TCP=1 also listens on 127.0.0.1:${BANLIEUE_LIBVIRTD_TCP_PORT:-16509}
# without authentication (qemu+tcp://127.0.0.1:16509/system).
# tests/backends/libvirtd/stop.sh undoes all of it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
[ "$(id -u)" = 0 ] || die "must run as root"

INSTALLED_SOMETHING=0
# libvirt calls /usr/sbin/iptables for the network's rules (iptables-nft here);
# nft is only for stop.sh's cleanup. Installing libvirt-daemon can take
# qemu-utils away, so it is checked again on its own afterwards.
ensure_packages libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 \
    dnsmasq-base iptables nftables
ensure_packages qemu-utils
if dpkg-query -W -f='${Status}\n' libvirt-daemon-system 2>/dev/null | grep -q '^install ok installed$'; then
    log "warning: libvirt-daemon-system is installed; its systemd units are not used here"
fi

mkdir -p "$RUN" "$LOGS" "$POOL_DIR"

# --- users, dirs, qemu.conf -------------------------------------------------
getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
getent passwd libvirt-qemu >/dev/null \
    || useradd --system --gid libvirt-qemu --home-dir /var/lib/libvirt --no-create-home \
        --shell /usr/sbin/nologin libvirt-qemu
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/lib/libvirt/dnsmasq /var/cache/libvirt \
    /run/libvirt /etc/libvirt

marker="# Written by banlieue tests/backends/libvirtd/start.sh"
qemu_conf=/etc/libvirt/qemu.conf
if [ -e "$qemu_conf" ] && ! grep -qF "$marker" "$qemu_conf" && [ ! -e "$qemu_conf.banlieue-orig" ]; then
    cp -p "$qemu_conf" "$qemu_conf.banlieue-orig"
    log "kept the previous $qemu_conf as $qemu_conf.banlieue-orig"
fi
cat >"$qemu_conf.tmp" <<CONF
$marker
# Guests run as root with no relabelling: this machine has no libvirt-daemon-system
# (no SELinux/AppArmor profiles, no polkit) and libvirtd runs as root outside systemd.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
CONF
mv "$qemu_conf.tmp" "$qemu_conf"

cat >"$RUN/virtlogd.conf" <<CONF
log_outputs = "3:file:$LOGS/virtlogd.log"
CONF
# The unix socket is root-only (0700), so no authentication on it.
cat >"$RUN/libvirtd.conf" <<CONF
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
listen_tls = 0
listen_tcp = $([ "$TCP" = 1 ] && echo 1 || echo 0)
listen_addr = "127.0.0.1"
tcp_port = "$TCP_PORT"
auth_tcp = "none"
log_outputs = "3:file:$LOGS/libvirtd.log"
CONF

# --- nft tables present before libvirt touches the firewall (for stop.sh) ---
if [ ! -e "$RUN/nft-tables-before" ]; then
    nft list tables 2>/dev/null | sort >"$RUN/nft-tables-before" || : >"$RUN/nft-tables-before"
fi

# --- daemons ----------------------------------------------------------------
answers() { timeout 10 virsh -q -c "$URI" version >/dev/null 2>&1; }

libvirtd_pid=$(live_pid "$RUN/libvirtd.pid" libvirtd || true)
if [ -n "$libvirtd_pid" ] && [ "$INSTALLED_SOMETHING" = 1 ]; then
    log "packages were installed: restarting libvirtd (pid $libvirtd_pid) so it sees them"
    stop_pid "$libvirtd_pid" 20
    libvirtd_pid=
fi
if [ -n "$libvirtd_pid" ] && [ "$(cat "$RUN/libvirtd.tcp" 2>/dev/null)" != "$TCP" ]; then
    log "BANLIEUE_LIBVIRTD_TCP changed: restarting libvirtd (pid $libvirtd_pid)"
    stop_pid "$libvirtd_pid" 20
    libvirtd_pid=
fi
if [ -z "$libvirtd_pid" ] && answers; then
    log "warning: a libvirtd not started by this script already answers on $URI; using it as it is"
    foreign=1
else
    foreign=0
fi

if [ "$foreign" = 0 ]; then
    if ! virtlogd_pid=$(live_pid "$RUN/virtlogd.pid" virtlogd); then
        rm -f "$RUN/virtlogd.pid"
        virtlogd -d -f "$RUN/virtlogd.conf" -p "$RUN/virtlogd.pid"
        for _ in $(seq 50); do virtlogd_pid=$(live_pid "$RUN/virtlogd.pid" virtlogd) && break; sleep 0.1; done
        [ -n "${virtlogd_pid:-}" ] || die "virtlogd did not start (see $LOGS/virtlogd.log)"
        log "virtlogd started, pid $virtlogd_pid"
    fi
    if [ -z "$libvirtd_pid" ]; then
        rm -f "$RUN/libvirtd.pid"
        args=(-d -f "$RUN/libvirtd.conf" -p "$RUN/libvirtd.pid")
        [ "$TCP" = 1 ] && args+=(--listen)
        libvirtd "${args[@]}"
        echo "$TCP" >"$RUN/libvirtd.tcp"
        for _ in $(seq 50); do libvirtd_pid=$(live_pid "$RUN/libvirtd.pid" libvirtd) && break; sleep 0.1; done
        [ -n "${libvirtd_pid:-}" ] || die "libvirtd did not start (see $LOGS/libvirtd.log)"
        log "libvirtd started, pid $libvirtd_pid"
    fi
fi

wait_s=${BANLIEUE_LIBVIRTD_WAIT:-60}
t0=$(now)
until answers; do
    [ "$(since "$t0" | cut -d. -f1)" -lt "$wait_s" ] || die "libvirtd does not answer on $URI after ${wait_s}s (see $LOGS/libvirtd.log)"
    sleep 0.5
done
log "libvirtd answers on $URI after $(since "$t0")s: $(v version | tr -s ' \n' ' ')"
if [ "$TCP" = 1 ]; then
    timeout 10 virsh -q -c "$TCP_URI" version >/dev/null || die "libvirtd does not answer on $TCP_URI"
fi

# --- storage pool -----------------------------------------------------------
if ! v pool-info "$POOL_NAME" >/dev/null 2>&1; then
    cat >"$RUN/pool.xml" <<XML
<pool type='dir'>
  <name>$POOL_NAME</name>
  <target><path>$POOL_DIR</path></target>
</pool>
XML
    v pool-define "$RUN/pool.xml" >/dev/null
    v pool-build "$POOL_NAME" >/dev/null
    log "pool $POOL_NAME defined at $POOL_DIR"
fi
if ! grep -Eq '^State:[[:space:]]+running' <<<"$(v pool-info "$POOL_NAME")"; then
    v pool-start "$POOL_NAME" >/dev/null
    log "pool $POOL_NAME started"
fi

# --- network ----------------------------------------------------------------
if ! v net-info "$NET_NAME" >/dev/null 2>&1; then
    if grep -v " $NET_BRIDGE " <<<"$(ip -4 -o addr show)" | grep " inet $NET_PREFIX\." >/dev/null; then
        die "$NET_PREFIX.0/24 is already in use on this machine; set BANLIEUE_LIBVIRTD_NET_PREFIX"
    fi
    # No <forward>: an isolated network. No DNS server, only DHCP.
    cat >"$RUN/network.xml" <<XML
<network>
  <name>$NET_NAME</name>
  <bridge name='$NET_BRIDGE' stp='off' delay='0'/>
  <dns enable='no'/>
  <ip address='$NET_PREFIX.1' netmask='255.255.255.0'>
    <dhcp>
      <!-- Every test guest has a new MAC: short leases keep the range from running out. -->
      <range start='$NET_PREFIX.10' end='$NET_PREFIX.250'>
        <lease expiry='5' unit='minutes'/>
      </range>
    </dhcp>
  </ip>
</network>
XML
    v net-define "$RUN/network.xml" >/dev/null
    log "network $NET_NAME defined ($NET_PREFIX.0/24 on $NET_BRIDGE)"
fi
if ! grep -Eq '^Active:[[:space:]]+yes' <<<"$(v net-info "$NET_NAME")"; then
    v net-start "$NET_NAME" >/dev/null
    log "network $NET_NAME started"
fi

echo "$URI"
[ "$TCP" = 1 ] && echo "$TCP_URI"
exit 0
