#!/usr/bin/env bash
# By hand, end to end: a real libvirtd (start.sh), the busybox guest
# (build-guest.sh), and TCG guests that boot from it:
#
#   banlieue-bc-acpi     initrd.img, vfat cidata seed volume: marker on the
#                        serial console, DHCP lease on the `banlieue` network,
#                        `virsh shutdown` -> shut off
#   banlieue-bc-noacpid  initrd-noacpid.img, iso9660 cidata seed volume:
#                        `virsh shutdown` does nothing for 10 s, `virsh destroy` works
#   banlieue-bc-directive  initrd.img with `#banlieue-acpid: off` in its
#                        user-data: ignores `virsh shutdown` as well
#   banlieue-bc-disk     boots from a qcow2 volume backed by disk.qcow2
#                        (SeaBIOS + SYSLINUX), seed on vdb: marker, virsh shutdown
#
# Then removes its domains and volumes and runs stop.sh
# (BANLIEUE_BOOTCHECK_KEEP=1 keeps everything running). Prints timings; exit 0
# when all checks passed. Domain XML and serial logs are kept in $DIR/logs.
# Not part of CI or make: it boots qemu guests (TCG; one vCPU each, one at a time).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
[ "$(id -u)" = 0 ] || die "must run as root"
export BANLIEUE_LIBVIRTD_TCP=${BANLIEUE_LIBVIRTD_TCP:-1}
TCP=$BANLIEUE_LIBVIRTD_TCP
MARKER_WAIT=${BANLIEUE_BOOTCHECK_MARKER_WAIT:-60}
LEASE_WAIT=${BANLIEUE_BOOTCHECK_LEASE_WAIT:-60}
OFF_WAIT=${BANLIEUE_BOOTCHECK_OFF_WAIT:-15}
IGNORE_WAIT=${BANLIEUE_BOOTCHECK_IGNORE_WAIT:-10}
results=()
failed=0
pass() { results+=("PASS $*"); log "PASS $*"; }
fail() { results+=("FAIL $*"); log "FAIL $*"; failed=1; }

domains=(banlieue-bc-acpi banlieue-bc-noacpid banlieue-bc-directive banlieue-bc-disk)
cleanup() {
    local rc=$?
    if [ "${BANLIEUE_BOOTCHECK_KEEP:-0}" = 1 ]; then
        log "BANLIEUE_BOOTCHECK_KEEP=1: leaving libvirtd, the domains and volumes in place"
    else
        for d in "${domains[@]}"; do
            v destroy "$d" >/dev/null 2>&1 || true
            v undefine "$d" >/dev/null 2>&1 || true
            v vol-delete --pool "$POOL_NAME" "$d-seed.img" >/dev/null 2>&1 || true
            v vol-delete --pool "$POOL_NAME" "$d-root.qcow2" >/dev/null 2>&1 || true
        done
        "$here/stop.sh" || true
    fi
    echo "---- boot-check summary ----"
    printf '%s\n' "${results[@]}"
    [ "$failed" = 0 ] && [ "$rc" = 0 ] && echo "boot-check: all passed" || echo "boot-check: FAILED"
}
trap cleanup EXIT

ensure_packages dosfstools mtools genisoimage

t=$(now)
"$here/start.sh" >/dev/null
pass "start.sh: libvirtd up in $(since "$t")s"
if [ "$TCP" = 1 ]; then
    timeout 10 virsh -q -c "$TCP_URI" list --all >/dev/null && pass "$TCP_URI answers" || fail "$TCP_URI does not answer"
fi
t=$(now)
"$here/build-guest.sh" >/dev/null
pass "build-guest.sh in $(since "$t")s"
guest=$DIR/guest

# A cidata seed volume $1-seed.img: kind $2 (vfat|iso), instance-id $3, marker $4, extra user-data $5.
make_seed() {
    local name=$1 kind=$2 id=$3 marker=$4 extra=${5:-} src img
    src=$(mktemp -d)
    printf 'instance-id: %s\nlocal-hostname: %s\n' "$id" "$name" >"$src/meta-data"
    printf '#cloud-config\n#banlieue-marker: %s\n%s' "$marker" "$extra" >"$src/user-data"
    img=$src/seed.img
    if [ "$kind" = vfat ]; then
        mkfs.vfat -n cidata -C "$img" 1024 >/dev/null 2>&1
        mcopy -o -i "$img" "$src/user-data" "$src/meta-data" ::
    else
        genisoimage -quiet -output "$img" -volid cidata -joliet -rock "$src/user-data" "$src/meta-data"
    fi
    v vol-delete --pool "$POOL_NAME" "$name-seed.img" >/dev/null 2>&1 || true
    v vol-create-as "$POOL_NAME" "$name-seed.img" "$(stat -c %s "$img")" --format raw >/dev/null
    v vol-upload --pool "$POOL_NAME" "$name-seed.img" "$img"
    rm -rf "$src"
}

# Define domain $1. Direct kernel boot of initrd $2 (kernel command line extra
# $3), or with $2 = disk: boot from a qcow2 root volume $1-root.qcow2 whose
# backing file is the guest's disk.qcow2 (as the libvirt driver defines machines).
define_domain() {
    local name=$1 initrd=$2 extra=${3:-} serial=$LOGS/$1.serial.log os root='' seed_dev=vda
    rm -f "$serial"
    if [ "$initrd" = disk ]; then
        os="<type arch='x86_64'>hvm</type><boot dev='hd'/>"
        cat >"$LOGS/$name-root.xml" <<XML
<volume>
  <name>$name-root.qcow2</name>
  <capacity unit='GiB'>1</capacity>
  <allocation>0</allocation>
  <target><format type='qcow2'/></target>
  <backingStore><path>$guest/disk.qcow2</path><format type='qcow2'/></backingStore>
</volume>
XML
        v vol-delete --pool "$POOL_NAME" "$name-root.qcow2" >/dev/null 2>&1 || true
        v vol-create "$POOL_NAME" "$LOGS/$name-root.xml" >/dev/null
        root="
    <disk type='volume' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source pool='$POOL_NAME' volume='$name-root.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>"
        seed_dev=vdb
    else
        os="<type arch='x86_64'>hvm</type>
    <kernel>$guest/vmlinuz</kernel>
    <initrd>$guest/$initrd</initrd>
    <cmdline>console=ttyS0 panic=-1 $extra</cmdline>"
    fi
    cat >"$LOGS/$name.xml" <<XML
<domain type='qemu'>
  <name>$name</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    $os
  </os>
  <features><acpi/><apic/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>$root
    <disk type='volume' device='disk'>
      <driver name='qemu' type='raw'/>
      <source pool='$POOL_NAME' volume='$name-seed.img'/>
      <target dev='$seed_dev' bus='virtio'/>
      <readonly/>
    </disk>
    <interface type='network'>
      <source network='$NET_NAME'/>
      <model type='virtio'/>
    </interface>
    <serial type='file'>
      <source path='$serial'/>
      <target port='0'/>
    </serial>
    <console type='file'>
      <source path='$serial'/>
      <target type='serial' port='0'/>
    </console>
  </devices>
</domain>
XML
    v destroy "$name" >/dev/null 2>&1 || true
    v undefine "$name" >/dev/null 2>&1 || true
    v define "$LOGS/$name.xml" >/dev/null
}

state() { v domstate "$1" 2>/dev/null | head -1; }
# Wait up to $3 s for the serial log of $1 to have a line containing $2; print the seconds since $4.
wait_serial() {
    local name=$1 text=$2 limit=$3 t0=$4 t1
    t1=$(now)
    while :; do
        grep -qF -- "$text" "$LOGS/$name.serial.log" 2>/dev/null && { since "$t0"; return 0; }
        [ "$(since "$t1" | cut -d. -f1)" -lt "$limit" ] || return 1
        sleep 0.2
    done
}
# Wait up to $2 s for domain $1 to be "shut off"; print the seconds since $3.
wait_off() {
    local name=$1 limit=$2 t0=$3 t1
    t1=$(now)
    while :; do
        [ "$(state "$name")" = "shut off" ] && { since "$t0"; return 0; }
        [ "$(since "$t1" | cut -d. -f1)" -lt "$limit" ] || return 1
        sleep 0.2
    done
}
# Boot $1 and wait for its instance-id, marker and ready lines.
boot() {
    local name=$1 id=$2 marker=$3 t0 s
    t0=$(now)
    v start "$name" >/dev/null
    BOOT_T0=$t0
    if s=$(wait_serial "$name" "banlieue-guest: marker=$marker" "$MARKER_WAIT" "$t0"); then
        pass "$name: start -> marker ${s}s"
    else
        fail "$name: no marker within ${MARKER_WAIT}s (serial log $LOGS/$name.serial.log)"
        tail -20 "$LOGS/$name.serial.log" >&2 || true
        return 1
    fi
    grep -qF "banlieue-guest: instance-id=$id" "$LOGS/$name.serial.log" \
        && pass "$name: instance-id=$id read from the seed" || fail "$name: no instance-id=$id line"
    s=$(wait_serial "$name" "banlieue-guest: ready" 20 "$t0") \
        && pass "$name: start -> ready ${s}s (guest $(grep -a -o 'ready uptime=[0-9.]*' "$LOGS/$name.serial.log" | head -1))" \
        || { fail "$name: no ready line"; return 1; }
}

# --- 1. a guest that boots, leases, and powers off on ACPI -----------------
name=banlieue-bc-acpi
make_seed "$name" vfat "iid-$name-$$" "hello-from-$name"
define_domain "$name" initrd.img
if boot "$name" "iid-$name-$$" "hello-from-$name"; then
    mac=$(v domiflist "$name" | awk -v n="$NET_NAME" '$3 == n && !m {m = $5} END {print m}')
    t1=$(now)
    ip=
    while [ "$(since "$t1" | cut -d. -f1)" -lt "$LEASE_WAIT" ]; do
        ip=$(v net-dhcp-leases "$NET_NAME" --mac "$mac" 2>/dev/null | awk '$4 == "ipv4" && !a {a = $5} END {print a}')
        [ -n "$ip" ] && break
        sleep 0.5
    done
    if [ -n "$ip" ]; then
        pass "$name: start -> lease $ip for $mac $(since "$BOOT_T0")s"
        v net-dhcp-leases "$NET_NAME" --mac "$mac" >&2
        wait_serial "$name" "banlieue-guest: eth0 address=${ip%/*}/" 10 "$BOOT_T0" >/dev/null \
            && pass "$name: guest reports eth0 address ${ip%/*}" || fail "$name: guest did not report ${ip%/*}"
    else
        fail "$name: no lease for $mac within ${LEASE_WAIT}s"
    fi
    t1=$(now)
    v shutdown "$name" >/dev/null
    if s=$(wait_off "$name" "$OFF_WAIT" "$t1"); then
        pass "$name: virsh shutdown -> shut off ${s}s"
    else
        fail "$name: still '$(state "$name")' ${OFF_WAIT}s after virsh shutdown"
        v destroy "$name" >/dev/null 2>&1 || true
    fi
fi

# --- 2./3. guests that ignore ACPI shutdown ---------------------------------
ignores_acpi() {
    local name=$1 t1 s
    grep -qF "banlieue-guest: acpid=off" "$LOGS/$name.serial.log" && pass "$name: acpid=off" || fail "$name: acpid not off"
    t1=$(now)
    v shutdown "$name" >/dev/null
    if s=$(wait_off "$name" "$IGNORE_WAIT" "$t1"); then
        fail "$name: powered off ${s}s after virsh shutdown, should have ignored it"
    else
        pass "$name: still '$(state "$name")' ${IGNORE_WAIT}s after virsh shutdown"
    fi
    t1=$(now)
    v destroy "$name" >/dev/null
    s=$(wait_off "$name" 10 "$t1") && pass "$name: virsh destroy -> shut off ${s}s" || fail "$name: not off after destroy"
}

name=banlieue-bc-noacpid
make_seed "$name" iso "iid-$name-$$" "hello-from-$name"
define_domain "$name" initrd-noacpid.img
boot "$name" "iid-$name-$$" "hello-from-$name" && ignores_acpi "$name"

name=banlieue-bc-directive
make_seed "$name" vfat "iid-$name-$$" "hello-from-$name" $'#banlieue-acpid: off\n'
define_domain "$name" initrd.img
boot "$name" "iid-$name-$$" "hello-from-$name" && ignores_acpi "$name"

# --- 4. a guest that boots from its disk (SeaBIOS, SYSLINUX), like a driver machine
name=banlieue-bc-disk
make_seed "$name" vfat "iid-$name-$$" "hello-from-$name"
define_domain "$name" disk
if boot "$name" "iid-$name-$$" "hello-from-$name"; then
    t1=$(now)
    v shutdown "$name" >/dev/null
    if s=$(wait_off "$name" "$OFF_WAIT" "$t1"); then
        pass "$name: virsh shutdown -> shut off ${s}s"
    else
        fail "$name: still '$(state "$name")' ${OFF_WAIT}s after virsh shutdown"
        v destroy "$name" >/dev/null 2>&1 || true
    fi
fi

[ "$failed" = 0 ]
