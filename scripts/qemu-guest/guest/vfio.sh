#!/bin/sh
# Runs in the guest (as init) with the emulated Intel IOMMU (run.sh with
# MLX5_QEMU_IOMMU=1): our own driver owns a model function through the guest
# kernel's VFIO (issue 17 part 5). Linux's mlx5_core + mlx5_ib take both
# functions first; ibv_devinfo -v of mlx5_1 is printed whole; then function
# 0000:02:00.0 leaves mlx5_core for vfio-pci (group path through the IOMMU)
# and the host's binaries (/guest/mlx5, /guest/mlx5-perf) run on it:
# devinfo -v (the host compares it with ibv_devinfo -v field by field),
# trace, reset, and mlx5-pkt's raw frames to the other function's mlx5e
# netdev (tcpdump lists them); then function 0 goes to vfio-pci too and mlx5-perf
# write_bw runs between the two, both ours. Every line the host checks
# starts with "=== ".
mount -t tmpfs tmp /tmp
RAW_COUNT=16
# client OUT ARGS...: mlx5-perf as a client (ARGS) with its output in OUT,
# run again while the server is not listening yet (at most 40 tries);
# returns the last run's status.
client() {
    out=$1
    shift
    j=0
    while [ $j -lt 40 ]; do
        timeout 300 /guest/mlx5-perf "$@" >"$out" 2>&1
        rc=$?
        grep -qi "refused\|couldn't connect" "$out" || return $rc
        sleep 0.5
        j=$((j + 1))
    done
    return $rc
}
mount -t tmpfs run /run
echo "=== up $(uname -r)"
modprobe mlx5_core
modprobe mlx5_ib
modprobe ib_uverbs
i=0
while [ "$(ls /sys/class/infiniband 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
echo "=== ib devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
echo "=== iommu groups: $(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)"
for n in eth0 eth1; do ip link set dev $n up; done
ip link set lo up
i=0
while [ $i -lt 60 ]; do
    read -r state </sys/class/infiniband/mlx5_1/ports/1/state || state=
    case "$state" in *ACTIVE*) break ;; esac
    sleep 0.5
    i=$((i + 1))
done
dmesg -n 1
timeout 60 ibv_devinfo -v -d mlx5_1 >/tmp/ibv 2>&1
echo "=== ibv_devinfo -v mlx5_1 rc=$?"
sed 's/^/=== ibv -v: /' /tmp/ibv

fn=0000:02:00.0
# The MAC our driver's raw packet QP sends from (the function's own, as
# mlx5e had it on eth1).
mac1=$(cat /sys/class/net/eth1/address)
echo "$fn" >/sys/bus/pci/drivers/mlx5_core/unbind
echo "=== unbind $fn rc=$?"
modprobe vfio-pci
echo vfio-pci >/sys/bus/pci/devices/$fn/driver_override
echo "$fn" >/sys/bus/pci/drivers_probe
echo "=== vfio-pci $fn: driver=$(basename "$(readlink /sys/bus/pci/devices/$fn/driver)") group=$(basename "$(readlink /sys/bus/pci/devices/$fn/iommu_group)")"
ls /dev/vfio | tr '\n' ' ' | sed 's/^/=== \/dev\/vfio: /'
echo

timeout 300 /guest/mlx5 devinfo -v -d $fn >/tmp/ours 2>&1
echo "=== mlx5 devinfo -v rc=$?"
sed 's/^/=== ours -v: /' /tmp/ours

timeout 300 /guest/mlx5 trace -d $fn >/tmp/trace 2>&1
rc=$?
cmds=$(grep 'dump command' /tmp/trace | awk '{print $6}')
echo "=== mlx5 trace rc=$rc lines=$(wc -l </tmp/trace) commands=$(echo "$cmds" | grep -c .)"
echo "=== mlx5 trace sequence: $(echo "$cmds" | uniq | tr '\n' ' ')"
grep -iv 'dump command\|^[0-9a-f]\{3\}:' /tmp/trace | head -5 | sed 's/^/=== mlx5 trace other: /'

timeout 300 /guest/mlx5 reset -d $fn >/tmp/reset 2>&1
echo "=== mlx5 reset rc=$?"
sed 's/^/=== mlx5 reset: /' /tmp/reset

# Raw frames from our driver to mlx5e (issue 26): mlx5-pkt udp-echo sends
# UDP datagrams by a raw packet QP on the function vfio-pci now holds to
# eth0, the other function's netdev, whose UDP stack echoes each back
# (eth_traffic.py); tcpdump on eth0 lists what arrived from our MAC.
ip addr add 10.25.0.2/24 dev eth0
ip neigh replace 10.25.0.1 lladdr "$mac1" dev eth0 nud permanent
mac0=$(cat /sys/class/net/eth0/address)
timeout 200 tcpdump -i eth0 -nn -e -l udp port 7000 >/tmp/tcpdump 2>/tmp/tcpdump.err &
dump=$!
PYTHONDONTWRITEBYTECODE=1 timeout 200 python3 /guest/eth_traffic.py echo 10.25.0.2 "$RAW_COUNT" >/tmp/echo 2>&1 &
echoer=$!
sleep 2
timeout 180 /guest/mlx5-pkt udp-echo -d $fn -n "$RAW_COUNT" -s 300 --peer-mac "$mac0" --peer-ip 10.25.0.2 >/tmp/pkt 2>&1
echo "=== raw pkt rc=$? from $mac1 to $mac0"
sed 's/^/=== raw pkt: /' /tmp/pkt
wait $echoer
grep '^=== eth echo served' /tmp/echo | sed 's/^=== eth echo/=== raw echo/'
sleep 1
read -r tcpd _ <"/proc/$dump/task/$dump/children" 2>/dev/null
kill -INT "${tcpd:-$dump}"
wait $dump
echo "=== raw tcpdump from ours: $(grep -ci "$mac1 > $mac0, ethertype IPv4.* 10.25.0.1.9001 > 10.25.0.2.7000: " /tmp/tcpdump)"
echo "=== raw tcpdump echoes: $(grep -ci "$mac0 > $mac1, ethertype IPv4.* 10.25.0.2.7000 > 10.25.0.1.9001: " /tmp/tcpdump)"
head -3 /tmp/tcpdump | sed 's/^/=== raw tcpdump: /'
tail -2 /tmp/tcpdump.err | sed 's/^/=== raw tcpdump err: /'

# DMA-BUF (issue 22): mlx5-perf's buffers as udmabufs (the guest kernel has
# CONFIG_UDMABUF=y; the suite's hosts have no udmabuf). On the in-process
# model (both sides in one process) the run completes through dma-buf MRs;
# through the guest's VFIO type1 (below, once both functions are ours) the
# registration must be refused naming why (udmabuf's mmap is VM_PFNMAP
# RAM, which type1 will not map).
timeout 300 /guest/mlx5-perf write_bw -d emu:cx5 --use_udmabuf -s 65536 -n 100 >/tmp/u.wbw 2>&1
echo "=== udmabuf emu rc=$?"
sed 's/^/=== udmabuf emu: /' /tmp/u.wbw

# mlx5-perf write_bw between the two functions, both owned by our driver
# through VFIO (function 0 leaves mlx5_core too): RoCE v2, GID 0 (the
# link-local address our driver sets), perftest's TCP exchange on
# 127.0.0.1. (Against perftest's own ib_write_bw on mlx5_ib it does not
# get through perftest's version and report handshake yet.)
fn0=0000:01:00.0
echo "$fn0" >/sys/bus/pci/drivers/mlx5_core/unbind
echo vfio-pci >/sys/bus/pci/devices/$fn0/driver_override
echo "$fn0" >/sys/bus/pci/drivers_probe
echo "=== vfio-pci $fn0: driver=$(basename "$(readlink /sys/bus/pci/devices/$fn0/driver)")"
timeout 300 /guest/mlx5-perf write_bw -d $fn0 -x 0 -s 65536 -n 100 >/tmp/s.wbw 2>&1 &
sleep 1
client /tmp/c.wbw write_bw -d $fn -x 0 -s 65536 -n 100 127.0.0.1
rc=$?
wait $!
echo "=== perf vfio_both client rc=$rc server rc=$?"
sed "s/^/=== perf vfio_both server: /" /tmp/s.wbw
sed "s/^/=== perf vfio_both client: /" /tmp/c.wbw

# The dma-buf refusal through the guest's VFIO type1: a server on function
# 0 with --use_udmabuf, a plain client on the other function (perftest's
# order: the client connects first, then each side builds its buffers, so
# the server gets as far as ibv_reg_dmabuf_mr).
timeout 120 /guest/mlx5-perf write_bw -d $fn0 -x 0 --use_udmabuf -s 4096 -n 10 -p 18601 >/tmp/uv.wbw 2>&1 &
sleep 1
client /tmp/uc.wbw write_bw -d $fn -x 0 -s 4096 -n 10 -p 18601 127.0.0.1
wait $!
echo "=== udmabuf vfio rc=$?"
sed 's/^/=== udmabuf vfio: /' /tmp/uv.wbw

echo "=== dmesg mlx5"
dmesg | grep -i 'mlx5\|vfio\|DMAR'
echo "=== done"
echo o >/proc/sysrq-trigger
