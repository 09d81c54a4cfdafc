#!/usr/bin/env bash
# Builds the initramfs of the kernel-VFIO guest test:
#
#   bash scripts/guest-initramfs.sh OUT.cpio.gz GUEST_BINARY [MODULES_DIR]
#
# It holds busybox (static), the static test binary, the modules listed in
# MODULES_DIR/order (none for a kernel with VFIO built in) and an /init that
# mounts proc/sys/dev, loads the modules, reserves two 2 MiB huge pages,
# binds QEMU's edu device (1234:11e8) to vfio-pci through driver_override,
# runs the binary for the path named by MLX5_PATH on the kernel command line
# (group, cdev or noiommu) and powers off. MLX5_PATH=rdma-group or rdma-cdev
# instead binds every Mellanox function (15b3, the device model served over
# vfio-user), reserves eight 2 MiB pages, mounts a hugetlbfs on
# /dev/hugepages and runs `kernel-vfio-guest rdma` on the first two.
# MLX5_DMA_ENTRY_LIMIT (default 64) is type1's mapping-count limit when
# vfio_iommu_type1 is a module. Needs busybox-static and cpio.
set -euo pipefail
out="$1"
bin="$2"
mods="${3:-}"
# busybox-static puts a static busybox at /bin/busybox.
busybox="$(command -v busybox || true)"
[ -x "$busybox" ] || { echo "guest-initramfs: no busybox (apt-get install busybox-static)" >&2; exit 1; }
command -v cpio >/dev/null || { echo "guest-initramfs: no cpio (apt-get install cpio)" >&2; exit 1; }

root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,dev,proc,sys,modules}
cp "$busybox" "$root/bin/busybox"
cp "$bin" "$root/kernel-vfio-guest"
if [ -n "$mods" ] && [ -f "$mods/order" ]; then
    cp "$mods"/*.ko "$mods/order" "$root/modules/"
fi
cat >"$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "kvfio: guest $(uname -r) up"
if [ -f /modules/order ]; then
    for m in $(cat /modules/order); do
        args=""
        # A small mapping-count limit, so the test can reach it.
        [ "$m" = vfio_iommu_type1 ] && args="dma_entry_limit=${MLX5_DMA_ENTRY_LIMIT:-64}"
        insmod "/modules/$m.ko" $args || echo "kvfio: insmod $m failed"
    done
fi
bind() {
    echo vfio-pci > "/sys/bus/pci/devices/$1/driver_override"
    echo "$1" > /sys/bus/pci/drivers_probe
    echo "kvfio: $1 bound to $(basename "$(readlink "/sys/bus/pci/devices/$1/driver")")," \
        "IOMMU group $(basename "$(readlink "/sys/bus/pci/devices/$1/iommu_group")")"
}
case "${MLX5_PATH:-group}" in rdma-*)
    echo 8 > /proc/sys/vm/nr_hugepages
    mkdir -p /dev/hugepages
    mount -t hugetlbfs -o pagesize=2M none /dev/hugepages
    fns=""
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/vendor")" = 0x15b3 ] || continue
        bind "$(basename "$d")"
        fns="$fns $(basename "$d")"
    done
    /kernel-vfio-guest rdma "${MLX5_PATH#rdma-}" $fns
    echo "kvfio: guest exit $?"
    poweroff -f
esac
echo 2 > /proc/sys/vm/nr_hugepages
edu=""
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "$d/vendor")" = 0x1234 ] && [ "$(cat "$d/device")" = 0x11e8 ]; then
        edu="$(basename "$d")"
    fi
done
if [ -z "$edu" ]; then
    echo "kvfio: no edu device (1234:11e8) in the guest"
else
    bind "$edu"
    /kernel-vfio-guest "$edu" "${MLX5_PATH:-group}"
    echo "kvfio: guest exit $?"
fi
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
