#!/usr/bin/env bash
# Build the test guest into $BANLIEUE_LIBVIRTD_DIR/guest (default
# /tmp/banlieue-libvirtd/guest): Debian's kernel (`vmlinuz`) and two busybox
# initramfs images (cpio.gz) for direct kernel boot with console=ttyS0:
#
#   initrd.img          runs acpid: an ACPI power-button press (virsh shutdown)
#                       powers the guest off
#   initrd-noacpid.img  does not: the guest ignores ACPI shutdown requests
#
# disk.qcow2 / disk-noacpid.qcow2 hold the same kernel and initrd on a BIOS-bootable
# disk (SYSLINUX, FAT, no partition table), for domains that boot from disk.
#
# Either can be switched per boot: kernel parameter banlieue.acpid=0|1, or a
# user-data line `#banlieue-acpid: off|on` (the user-data wins).
#
# The guest's /init mounts proc/sys/dev, loads the virtio/vfat/iso9660/ACPI
# modules, finds the filesystem labelled cidata (vfat or iso9660, on a virtio
# disk or a cdrom), and prints to the console:
#   banlieue-guest: instance-id=<meta-data instance-id>
#   banlieue-guest: marker=<text>        for each user-data line `#banlieue-marker: <text>`
#   banlieue-guest: disk-write=<text>    for a user-data line `#banlieue-disk-write: <text>`:
#                       the line `banlieue-disk:<text>` written (and flushed) at 40 MiB
#                       into /dev/vda, past the boot filesystem, so a test can read the
#                       guest's writes back from the volume (snapshots, reverts)
#   banlieue-guest: acpid=on|off
#   banlieue-guest: ready uptime=<s>
#   banlieue-guest: eth0 address=<ip>/<prefix>   once udhcpc has a lease (asynchronous)
#   banlieue-guest: eth0 static address=<ip>/<prefix>   instead, when the seed's
#                       network-config (cloud-init version 2) names eth0's MAC: the
#                       guest takes the first address and the route's gateway of
#                       that configuration (it has one NIC) and runs no DHCP
# then runs a shell on the serial console (ttyS0), started again when it exits: typed
# into the console, `echo $((6*7))` answers 42. Lines on the serial console end in \r\n.
#
# The kernel is the installed linux-image-amd64's when there is one; otherwise
# the package is downloaded with apt-get and unpacked into $DIR/guest/kernel
# without installing it (installing it pulls initramfs-tools, udev and systemd,
# and builds a 35 MB initrd for the host); BANLIEUE_GUEST_KERNEL_SOURCE=package
# forces that. BANLIEUE_GUEST_KERNEL=/path/vmlinuz with
# BANLIEUE_GUEST_MODULES=/path/lib/modules/<version> picks another kernel.
# Rebuilds only when this script or the kernel changed. Prints the guest dir.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
[ "$(id -u)" = 0 ] || die "must run as root (device nodes in the initramfs)"
out=$DIR/guest
mkdir -p "$out"

ensure_packages busybox-static cpio syslinux syslinux-common dosfstools mtools qemu-utils

# --- the kernel -------------------------------------------------------------
if [ -n "${BANLIEUE_GUEST_KERNEL:-}" ]; then
    kernel=$BANLIEUE_GUEST_KERNEL
    moddir=${BANLIEUE_GUEST_MODULES:?BANLIEUE_GUEST_MODULES must go with BANLIEUE_GUEST_KERNEL}
elif [ "${BANLIEUE_GUEST_KERNEL_SOURCE:-auto}" != package ] \
    && dpkg-query -W -f='${Status}\n' linux-image-amd64 2>/dev/null | grep -q '^install ok installed$'; then
    kver=$(dpkg-query -W -f='${Depends}\n' linux-image-amd64 | grep -o 'linux-image-[0-9][^ ,]*-amd64' | head -1)
    kver=${kver#linux-image-}
    kernel=/boot/vmlinuz-$kver
    moddir=/lib/modules/$kver
else
    kroot=$out/kernel
    if ! ls "$kroot"/boot/vmlinuz-* >/dev/null 2>&1; then
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
        if [ -z "$pkg" ]; then
            apt-get update -q >&2
            pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
        fi
        [ -n "$pkg" ] || die "no linux-image-amd64 in the apt lists"
        log "downloading $pkg (unpacked, not installed)"
        tmp=$(mktemp -d)
        getent passwd _apt >/dev/null && chown _apt "$tmp"  # apt downloads as _apt
        (cd "$tmp" && apt-get download -q "$pkg" >&2)
        rm -rf "$kroot"
        mkdir -p "$kroot"
        dpkg-deb -x "$tmp"/*.deb "$kroot"
        rm -rf "$tmp"
    fi
    kernel=$(ls "$kroot"/boot/vmlinuz-* | sort -V | tail -1)
    kver=${kernel##*/vmlinuz-}
    for moddir in "$kroot/lib/modules/$kver" "$kroot/usr/lib/modules/$kver"; do
        [ -d "$moddir" ] && break
    done
    if [ ! -e "$moddir/modules.dep" ]; then  # made by depmod at install time
        command -v depmod >/dev/null || ensure_packages kmod
        depmod -b "${moddir%/lib/modules/*}" "$kver"
    fi
fi
[ -r "$kernel" ] || die "no kernel at $kernel"
[ -r "$moddir/modules.dep" ] || die "no modules.dep in $moddir"

stamp="$(sha256sum "$0" | cut -c1-16) $(stat -c '%s %Y' "$kernel") $kernel"
if [ -s "$out/initrd.img" ] && [ -s "$out/initrd-noacpid.img" ] && [ -s "$out/vmlinuz" ] && [ -s "$out/disk.qcow2" ] \
    && [ "$(cat "$out/.stamp" 2>/dev/null)" = "$stamp" ]; then
    log "guest up to date in $out"
    echo "$out"
    exit 0
fi

# --- modules, in dependency order (from modules.dep) ------------------------
# virtio disk and NIC, vfat and iso9660 for the cidata seed, cdrom on IDE/SATA
# (a seed attached as a cdrom), the ACPI power button and evdev for acpid.
wanted="virtio_pci virtio_net virtio_blk vfat nls_cp437 nls_iso8859-1 nls_ascii isofs
        sr_mod ata_piix ahci button evdev"
declare -A seen=()
order=()
dep_path() { awk -v m="$1" -F: '{n=$1; sub(/.*\//, "", n); sub(/\.ko(\.(xz|zst|gz))?$/, "", n); if (n == m) {print; exit}}' "$moddir/modules.dep"; }
visit() {
    local name=$1 line path deps d i
    [ -n "${seen[$name]:-}" ] && return 0
    seen[$name]=1
    line=$(dep_path "$name")
    if [ -z "$line" ]; then
        if grep -Eq "/$name\.ko$" "$moddir/modules.builtin" 2>/dev/null; then return 0; fi
        die "module $name is neither in modules.dep nor built in ($moddir)"
    fi
    path=${line%%:*}
    read -r -a deps <<<"${line#*:}"
    # modules.dep lists what must be loaded first last: visit from the end.
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
        d=${deps[$i]##*/}; d=${d%%.ko*}
        visit "$d"
    done
    order+=("$name:$path")
}
for m in $wanted; do visit "$m"; done

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,run,tmp,etc/acpi/PWRF,lib/modules,mnt/seed}
cp /bin/busybox "$root/bin/busybox"
mknod -m 600 "$root/dev/console" c 5 1
mknod -m 666 "$root/dev/null" c 1 3
: >"$root/lib/modules/order"
for entry in "${order[@]}"; do
    name=${entry%%:*}; path=$moddir/${entry#*:}
    case $path in
        *.ko.xz) xz -dc "$path" ;;
        *.ko.zst) zstd -qdc "$path" ;;
        *.ko.gz) gzip -dc "$path" ;;
        *) cat "$path" ;;
    esac >"$root/lib/modules/$name.ko"
    echo "$name" >>"$root/lib/modules/order"
done
log "modules: $(tr '\n' ' ' <"$root/lib/modules/order")"

cat >"$root/etc/acpi/PWRF/00000080" <<'SH'
#!/bin/sh
echo "banlieue-guest: ACPI power button: powering off" >/dev/console
sync
poweroff -f
SH
chmod 755 "$root/etc/acpi/PWRF/00000080"

cat >"$root/etc/udhcpc.script" <<'SH'
#!/bin/sh
case "$1" in
    deconfig)
        ip -4 addr flush dev "$interface"
        ip link set "$interface" up
        ;;
    bound)
        ip -4 addr flush dev "$interface"
        ip addr add "$ip/${mask:-24}" dev "$interface"
        [ -n "$router" ] && ip route add default via "${router%% *}" dev "$interface" 2>/dev/null
        echo "banlieue-guest: $interface address=$ip/${mask:-24}" >/dev/console
        ;;
    renew)
        ip addr add "$ip/${mask:-24}" dev "$interface" 2>/dev/null
        ;;
esac
exit 0
SH
chmod 755 "$root/etc/udhcpc.script"

cat >"$root/init" <<'SH'
#!/bin/busybox sh
/bin/busybox --install -s
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /run/seed
say() { echo "banlieue-guest: $*"; }
uptime_s() { cut -d' ' -f1 /proc/uptime; }

. /etc/banlieue-guest.conf
for arg in $(cat /proc/cmdline); do
    case $arg in banlieue.acpid=*) ACPID=${arg#banlieue.acpid=} ;; esac
done

for m in $(cat /lib/modules/order); do
    insmod "/lib/modules/$m.ko" 2>/dev/null || say "insmod $m failed"
done

# The cidata seed: by label (vfat or iso9660), else any disk with a meta-data file.
seed=
i=0
while [ $i -lt 50 ]; do
    seed=$(findfs LABEL=cidata 2>/dev/null || findfs LABEL=CIDATA 2>/dev/null)
    [ -n "$seed" ] && break
    if [ $i -ge 15 ]; then
        for d in /dev/vd* /dev/sr* /dev/sd*; do
            [ -b "$d" ] || continue
            if mount -o ro -t vfat "$d" /mnt/seed 2>/dev/null || mount -o ro -t iso9660 "$d" /mnt/seed 2>/dev/null; then
                [ -e /mnt/seed/meta-data ] && seed=$d
                umount /mnt/seed
                [ -n "$seed" ] && break
            fi
        done
        [ -n "$seed" ] && break
    fi
    sleep 0.2
    i=$((i + 1))
done
host=banlieue-guest
if [ -n "$seed" ] && { mount -o ro -t vfat "$seed" /mnt/seed 2>/dev/null || mount -o ro -t iso9660 "$seed" /mnt/seed; }; then
    for f in meta-data user-data network-config; do
        [ -e "/mnt/seed/$f" ] && tr -d '\r' <"/mnt/seed/$f" >"/run/seed/$f"
    done
    umount /mnt/seed
    say "seed=$seed"
    unquote() { sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"; }
    id=$(sed -n 's/^instance-id:[[:space:]]*//p' /run/seed/meta-data 2>/dev/null | head -1 | unquote)
    name=$(sed -n 's/^local-hostname:[[:space:]]*//p' /run/seed/meta-data 2>/dev/null | head -1 | unquote)
    [ -n "$name" ] && host=$name
    say "instance-id=$id"
    if [ -e /run/seed/user-data ]; then
        sed -n 's/^#banlieue-marker:[[:space:]]*//p' /run/seed/user-data | while IFS= read -r marker; do
            say "marker=$marker"
        done
        disk_write=$(sed -n 's/^#banlieue-disk-write:[[:space:]]*//p' /run/seed/user-data | head -1)
        a=$(sed -n 's/^#banlieue-acpid:[[:space:]]*//p' /run/seed/user-data | head -1 | tr -d ' ')
        case $a in off|0|no|false) ACPID=0 ;; on|1|yes|true) ACPID=1 ;; esac
    fi
else
    say "no cidata seed found"
fi
hostname "$host"
if [ -n "${disk_write:-}" ]; then
    # conv=fsync: the write reaches the volume (qemu flushes its qcow2 metadata) before
    # the guest says so.
    if printf 'banlieue-disk:%s\n' "$disk_write" | dd of=/dev/vda bs=1M seek=40 conv=notrunc,fsync 2>/dev/null; then
        say "disk-write=$disk_write"
    else
        say "disk-write failed"
    fi
fi

ip link set lo up
# A static address from the seed's network-config (one line of JSON, as banlieue writes it)
# when it matches eth0's MAC; else DHCP.
static=
if [ -e /run/seed/network-config ] && ip link show eth0 >/dev/null 2>&1 \
    && grep -qi "\"macaddress\":\"$(cat /sys/class/net/eth0/address)\"" /run/seed/network-config; then
    static=$(sed -n 's/.*"addresses":\["\([^"]*\)".*/\1/p' /run/seed/network-config | head -1)
    via=$(sed -n 's/.*"via":"\([^"]*\)".*/\1/p' /run/seed/network-config | head -1)
fi
if [ -n "$static" ]; then
    ip link set eth0 up
    ip addr add "$static" dev eth0
    [ -n "$via" ] && ip route add default via "$via" dev eth0
    say "eth0 static address=$static"
elif ip link show eth0 >/dev/null 2>&1; then
    udhcpc -f -i eth0 -s /etc/udhcpc.script -t 60 -T 1 -A 2 -x "hostname:$host" >/dev/null 2>&1 &
else
    say "no eth0"
fi

if [ "$ACPID" = 1 ]; then
    i=0
    while ! ls /dev/input/event* >/dev/null 2>&1 && [ $i -lt 20 ]; do sleep 0.1; i=$((i + 1)); done
    acpid -c /etc/acpi -l /run/acpid.log
    say "acpid=on"
else
    say "acpid=off"
fi
say "ready uptime=$(uptime_s)"
# A shell on the serial console: what is typed into the console (kubectl vm console) gets
# the shell's answer. Started again if it exits.
while :; do
    setsid sh -c 'exec sh -i </dev/ttyS0 >/dev/ttyS0 2>&1'
    sleep 1
done
SH
chmod 755 "$root/init"

pack() { (cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -9 >"$1.tmp" && mv "$1.tmp" "$1"; }
echo "ACPID=1" >"$root/etc/banlieue-guest.conf"
pack "$out/initrd.img"
echo "ACPID=0" >"$root/etc/banlieue-guest.conf"
pack "$out/initrd-noacpid.img"
cp "$kernel" "$out/vmlinuz.tmp" && mv "$out/vmlinuz.tmp" "$out/vmlinuz"

# BIOS-bootable disks: one FAT filesystem over the whole disk (no partition
# table) with SYSLINUX in its boot sector, the kernel and one initrd. For a
# domain that boots from its disk (<boot dev='hd'/>, as the libvirt driver
# defines them) with the qcow2 as the backing file of its root volume.
disk() { # $1 initrd, $2 output
    local img=$out/disk.raw
    rm -f "$img"
    mkfs.vfat -n BANLIEUE -C "$img" $((32 * 1024)) >/dev/null
    syslinux --install "$img"
    printf '%s\n' 'SERIAL 0 115200' 'PROMPT 0' 'TIMEOUT 0' 'DEFAULT banlieue' 'LABEL banlieue' \
        '  LINUX /vmlinuz' '  INITRD /initrd.img' '  APPEND console=ttyS0 panic=-1 edd=off' >"$root/syslinux.cfg"
    mcopy -o -i "$img" "$out/vmlinuz" ::vmlinuz
    mcopy -o -i "$img" "$out/$1" ::initrd.img
    mcopy -o -i "$img" "$root/syslinux.cfg" ::syslinux.cfg
    qemu-img convert -f raw -O qcow2 "$img" "$2.tmp" && mv "$2.tmp" "$2"
    rm -f "$img"
}
disk initrd.img "$out/disk.qcow2"
disk initrd-noacpid.img "$out/disk-noacpid.qcow2"

echo "$stamp" >"$out/.stamp"
log "guest built in $out: vmlinuz ($(basename "$kernel")), initrd.img $(du -k "$out/initrd.img" | cut -f1) KiB, initrd-noacpid.img, disk.qcow2, disk-noacpid.qcow2"
echo "$out"
