#!/usr/bin/env bash
# Builds the small Linux 6.12 guest kernel with IOMMUFD and the VFIO device
# cdev (Debian's own 6.12 image has IOMMUFD off), from Debian's
# linux-source-6.12, and caches it outside the repository.
#
#   bash scripts/guest-kernel-iommufd.sh          # build if missing, print the bzImage path
#   bash scripts/guest-kernel-iommufd.sh --path   # print where the image is (or would be)
#
# Everything the guest needs is built in (no modules): the Intel IOMMU with
# interrupt remapping, vfio-pci, the type1 container, the group and cdev
# interfaces, no-IOMMU mode, iommufd. Takes ~15 minutes on 2 cores; runs
# under `nice`. Needs: gcc make flex bison bc libelf-dev libssl-dev and
# linux-source-6.12 (installed here when run as root on Debian).
#
# The image is cached by content: the key hashes this script (its
# configuration) and the linux-source-6.12 package's version, so a changed
# configuration or a source update builds a new image, and an unchanged one
# is never rebuilt (scripts/test-all.sh builds it only when asked,
# MLX5_BUILD_GUEST_KERNEL=1; kernel_vfio uses it whenever it is cached).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=guest-cache.sh
. "$here/guest-cache.sh"

src_version="$(dpkg-query -W -f '${Version}' linux-source-6.12 2>/dev/null || echo none)"
key="$( (cat "$0"; echo "$src_version") | sha256sum | cut -c1-16)"
out="$GUEST_CACHE/iommufd-kernel-$key"
image="$out/bzImage"
if [ "${1:-}" = --path ]; then
    echo "$image"
    exit 0
fi
if [ -f "$image" ]; then
    echo "$image"
    exit 0
fi

need=()
for tool in gcc make flex bison bc; do command -v "$tool" >/dev/null || need+=("$tool"); done
[ -f /usr/include/libelf.h ] || need+=(libelf-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
[ -f /usr/src/linux-source-6.12.tar.xz ] || need+=(linux-source-6.12)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "guest-kernel-iommufd: missing ${need[*]}; install them (Debian: apt-get install ${need[*]})" >&2
        exit 1
    fi
fi

src="$GUEST_CACHE/linux-source-6.12"
build="$GUEST_CACHE/iommufd-build"
if [ ! -f "$src/Makefile" ]; then
    echo "guest-kernel-iommufd: extracting /usr/src/linux-source-6.12.tar.xz" >&2
    tar -C "$GUEST_CACHE" -xf /usr/src/linux-source-6.12.tar.xz
fi
mkdir -p "$build"

kmake() { nice -n 10 make -C "$src" O="$build" "$@"; }
kmake -s x86_64_defconfig
cfg() { "$src/scripts/config" --file "$build/.config" "$@"; }
# What the test needs, built in.
cfg -e PCI -e PCI_MSI -e ACPI -e X86_X2APIC -e IRQ_REMAP \
    -e IOMMU_SUPPORT -e INTEL_IOMMU -d INTEL_IOMMU_SVM \
    -e IOMMUFD -e VFIO -e VFIO_GROUP -e VFIO_CONTAINER -e VFIO_IOMMU_TYPE1 \
    -e VFIO_DEVICE_CDEV -e VFIO_NOIOMMU -e VFIO_PCI_CORE -e VFIO_PCI \
    -e VFIO_PCI_MMAP -e VFIO_PCI_INTX -e VFIO_VIRQFD -e EVENTFD \
    -e MEMFD_CREATE -e TMPFS -e SHMEM -e HUGETLBFS -e HUGETLB_PAGE \
    -e BLK_DEV_INITRD -e RD_GZIP -e DEVTMPFS -e DEVTMPFS_MOUNT \
    -e SERIAL_8250 -e SERIAL_8250_CONSOLE -e BINFMT_ELF -e BINFMT_SCRIPT
# What it does not need, left out to keep the build short.
cfg -d MODULES -d DEBUG_INFO -e DEBUG_INFO_NONE -d NET -d DRM -d SOUND -d USB_SUPPORT \
    -d HID -d WLAN -d WIRELESS -d INPUT_MOUSE -d INPUT_KEYBOARD -d AGP \
    -d FB -d EXT4_FS -d ISO9660_FS -d NFS_FS -d AUTOFS_FS -d QUOTA \
    -d BLK_DEV_SD -d ATA -d SCSI -d MD -d CPU_FREQ -d HIBERNATION -d SUSPEND \
    -d KVM -d VIRTUALIZATION -d XEN -d HYPERV -d SECURITY_SELINUX -d AUDIT \
    -d PROFILING -d KPROBES -d FTRACE -d X86_MCE -d MICROCODE -d EFI
kmake -s olddefconfig
for opt in IOMMUFD VFIO_DEVICE_CDEV VFIO_GROUP VFIO_CONTAINER VFIO_PCI VFIO_NOIOMMU \
    INTEL_IOMMU IRQ_REMAP BLK_DEV_INITRD DEVTMPFS MEMFD_CREATE EVENTFD; do
    grep -qx "CONFIG_$opt=y" "$build/.config" || {
        echo "guest-kernel-iommufd: CONFIG_$opt did not stay on" >&2
        exit 1
    }
done

echo "guest-kernel-iommufd: building (nice -n 10, $(nproc) jobs) in $build" >&2
kmake -s -j"$(nproc)" bzImage
mkdir -p "$out"
cp "$build/arch/x86/boot/bzImage" "$image.tmp"
cp "$build/.config" "$out/config"
mv "$image.tmp" "$image"
echo "$image"
