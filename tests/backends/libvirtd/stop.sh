#!/usr/bin/env bash
# Undo tests/backends/libvirtd/start.sh: destroy and undefine the domains that
# belong to the test setup (named banlieue-*, or using the `banlieue` pool or
# network, or a file under $BANLIEUE_LIBVIRTD_DIR), the network and the pool
# (its directory too), stop libvirtd and virtlogd by the PIDs in their
# pidfiles, and remove the firewall chains libvirt left behind (LIBVIRT_*, and
# the nft tables that held only those). Idempotent; safe when nothing runs.
# Leaves /etc/libvirt/qemu.conf, the libvirt-qemu user and $DIR/guest (the
# built guest, reused by build-guest.sh).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
export VIRSH_TIMEOUT=30

answers() { timeout 10 virsh -q -c "$URI" version >/dev/null 2>&1; }
libvirtd_pid=$(live_pid "$RUN/libvirtd.pid" libvirtd || true)
virtlogd_pid=$(live_pid "$RUN/virtlogd.pid" virtlogd || true)

ours() { # is domain $1 part of the test setup?
    case $1 in banlieue-*) return 0 ;; esac
    grep -Eq "pool=['\"]${POOL_NAME}['\"]|network=['\"]${NET_NAME}['\"]|['\">]${DIR}/" <<<"$(v dumpxml --inactive "$1" 2>/dev/null)"
}

if command -v virsh >/dev/null && answers; then
    for dom in $(v list --all --name); do
        ours "$dom" || continue
        v destroy "$dom" >/dev/null 2>&1 || true
        v undefine --nvram "$dom" >/dev/null 2>&1 || v undefine "$dom" >/dev/null 2>&1 || true
        log "domain $dom removed"
    done
    if v net-info "$NET_NAME" >/dev/null 2>&1; then
        v net-destroy "$NET_NAME" >/dev/null 2>&1 || true
        v net-undefine "$NET_NAME" >/dev/null 2>&1 || true
        log "network $NET_NAME removed"
    fi
    if v pool-info "$POOL_NAME" >/dev/null 2>&1; then
        v pool-destroy "$POOL_NAME" >/dev/null 2>&1 || true
        v pool-undefine "$POOL_NAME" >/dev/null 2>&1 || true
        log "pool $POOL_NAME removed"
    fi
    [ -n "$libvirtd_pid" ] || log "libvirtd answering on $URI was not started by start.sh: left running"
fi

if [ -n "$libvirtd_pid" ]; then
    stop_pid "$libvirtd_pid" 20
    log "libvirtd (pid $libvirtd_pid) stopped"
fi
if [ -n "$virtlogd_pid" ]; then
    stop_pid "$virtlogd_pid" 10
    log "virtlogd (pid $virtlogd_pid) stopped"
fi
rm -f "$RUN/libvirtd.pid" "$RUN/virtlogd.pid" "$RUN/libvirtd.tcp"

# --- leftovers when libvirtd is gone (crashed, killed, or just stopped) -----
if ! answers; then
    # qemu of our domains (by libvirt's status XML and pidfile), their
    # definitions, and the network's dnsmasq.
    mentions_ours() { grep -Eq "<name>banlieue-|pool=['\"]${POOL_NAME}['\"]|network=['\"]${NET_NAME}['\"]|['\">]${DIR}/" "$1"; }
    for status in /run/libvirt/qemu/*.xml; do
        [ -e "$status" ] && mentions_ours "$status" || continue
        pidfile=${status%.xml}.pid
        if pid=$(live_pid "$pidfile" qemu-system-x86); then
            stop_pid "$pid" 5; log "leftover qemu of $(basename "${status%.xml}") (pid $pid) stopped"
        fi
        rm -f "$pidfile" "$status"
    done
    for def in /etc/libvirt/qemu/*.xml; do
        [ -e "$def" ] && mentions_ours "$def" || continue
        rm -f "$def" "/etc/libvirt/qemu/autostart/$(basename "$def")"
        log "leftover definition $def removed"
    done
    for pidfile in "/run/libvirt/network/$NET_NAME.pid" "/var/lib/libvirt/dnsmasq/$NET_NAME.pid"; do
        if pid=$(live_pid "$pidfile" dnsmasq); then
            stop_pid "$pid" 5; log "leftover dnsmasq (pid $pid) stopped"
        fi
    done
    if ip link show "$NET_BRIDGE" >/dev/null 2>&1; then
        ip link delete "$NET_BRIDGE" && log "leftover bridge $NET_BRIDGE deleted"
    fi
    rm -f "/etc/libvirt/qemu/networks/$NET_NAME.xml" "/etc/libvirt/qemu/networks/autostart/$NET_NAME.xml" \
        "/run/libvirt/network/$NET_NAME.xml" "/etc/libvirt/storage/$POOL_NAME.xml" \
        "/etc/libvirt/storage/autostart/$POOL_NAME.xml" "/run/libvirt/storage/$POOL_NAME.xml" \
        /var/lib/libvirt/dnsmasq/"$NET_NAME".* /var/lib/libvirt/dnsmasq/"$NET_BRIDGE".*

    # Firewall: libvirt (9.x, iptables backend = iptables-nft here) adds LIBVIRT_*
    # chains to ip/ip6 filter, nat and mangle, and jumps to them from the base
    # chains; net-destroy leaves them. Remove the jumps and the chains, then any
    # table that did not exist before start.sh and is left with empty base chains.
    # Only done when no libvirtd runs any more (another one might own them).
    if command -v nft >/dev/null; then
        before=$(cat "$RUN/nft-tables-before" 2>/dev/null || true)
        nft list tables 2>/dev/null | while read -r _ family table; do
            listing=$(nft -a list table "$family" "$table" 2>/dev/null) || continue
            grep -q 'LIBVIRT_' <<<"$listing" || continue
            # Rules jumping to LIBVIRT_* chains, as "chain handle".
            awk '/^[ \t]*chain /{c=$2} /(jump|goto) LIBVIRT_/{print c, $NF}' <<<"$listing" \
                | while read -r chain handle; do
                    nft delete rule "$family" "$table" "$chain" handle "$handle" 2>/dev/null || true
                done
            for chain in $(awk '/^[ \t]*chain LIBVIRT_/{print $2}' <<<"$listing"); do
                nft flush chain "$family" "$table" "$chain" 2>/dev/null || true
            done
            for chain in $(awk '/^[ \t]*chain LIBVIRT_/{print $2}' <<<"$listing"); do
                nft delete chain "$family" "$table" "$chain" 2>/dev/null || true
            done
            log "nft: LIBVIRT_* chains removed from $family $table"
            if ! grep -qx "table $family $table" <<<"$before"; then
                rules=$(nft list table "$family" "$table" 2>/dev/null \
                    | grep -Ev '^[[:space:]]*(table |chain |type |policy |\}|$)' | grep -c . || true)
                if [ "${rules:-0}" = 0 ]; then
                    nft delete table "$family" "$table" && log "nft: table $family $table removed"
                fi
            fi
        done
    fi
    rm -f "$RUN/nft-tables-before"
fi

rm -rf "$POOL_DIR"
log "stopped"
exit 0
