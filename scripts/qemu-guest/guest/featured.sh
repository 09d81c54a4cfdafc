#!/bin/sh
# Runs in the guest (as init) when the two cabled functions are a
# feature-rich profile (ConnectX-7: DC, DevX, ODP, device memory,
# host-endian atomics; run.sh with MLX5_EMU_PROFILE, or qemu_mlx5's second
# boot): what the ConnectX-4 Lx boot (smoke.sh) cannot judge. Brings both
# ports up as smoke.sh does, prints ibv_devinfo -v's lines the host checks,
# runs perftest ib_atomic_bw and ib_write_bw -c DC (DCI on mlx5_1, DCT on
# mlx5_0) between the functions, then rdma-core's whole suite on mlx5_0
# (RDMA_SUITE_FILES, from the kernel command line, narrows it), DPDK's
# testpmd and mlx5e's traffic between the functions. Every line the host
# checks starts with "=== ".
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
echo "=== up $(uname -r) $(cut -d' ' -f1 /proc/uptime)"
modprobe mlx5_core
modprobe mlx5_ib
modprobe ib_uverbs
i=0
while [ "$(ls /sys/class/infiniband 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
echo "=== ib devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
echo "=== probed at $(cut -d' ' -f1 /proc/uptime)"
netdevs=$(ls /sys/bus/pci/drivers/mlx5_core/*/net 2>/dev/null | grep -v ':$' | grep -v '^$' | tr '\n' ' ')
echo "=== netdevs: $netdevs"
(
    for n in $netdevs; do
        ip link set dev "$n" up
    done
    zero=0000:0000:0000:0000:0000:0000:0000:0000
    i=0
    while [ $i -lt 60 ]; do
        ok=1
        for d in /sys/class/infiniband/mlx5_*; do
            read -r state <"$d/ports/1/state" || state=
            read -r gid <"$d/ports/1/gids/0" || gid=$zero
            case "$state" in *ACTIVE*) ;; *) ok=0 ;; esac
            [ "$gid" = "$zero" ] && ok=0
        done
        [ $ok = 1 ] && break
        sleep 0.5
        i=$((i + 1))
    done
    for d in /sys/class/infiniband/mlx5_*; do
        read -r state <"$d/ports/1/state"
        echo "=== port $(basename "$d"): $state"
    done
    : >/tmp/eth.done
) &
i=0
while [ ! -e /tmp/eth.done ] && [ $i -lt 80 ]; do
    sleep 0.5
    i=$((i + 1))
done
[ -e /tmp/eth.done ] || echo "=== netdev bring-up still blocked after 40 s"
for d in mlx5_0 mlx5_1; do
    timeout 60 ibv_devinfo -v -d $d >/tmp/devinfo.$d 2>&1
    echo "=== devinfo -v $d rc=$?"
    grep -E 'hca_id|fw_ver|vendor_part_id|atomic_cap|state:|link_layer|GID\[ *[01]\]' \
        /tmp/devinfo.$d | sed "s/^/=== devinfo -v $d: /"
done
ip link set lo up
ip -6 neigh replace fe80::268a:7ff:fea0:2 lladdr 24:8a:07:a0:00:02 dev eth0 nud permanent
ip -6 neigh replace fe80::268a:7ff:fea0:1 lladdr 24:8a:07:a0:00:01 dev eth1 nud permanent
# perftest as in smoke.sh: server on mlx5_0, client on mlx5_1, RoCE v2.
port=18700
. /guest/perftest.sh
perf atomic_bw ib_atomic_bw -n 100
perf dc_write_bw ib_write_bw -c DC -s 65536 -n 100
# DMA-BUF MRs through mlx5_ib (issue 22): udmabuf stands in for the GPU
# rdma-core's own dma-buf tests need (they skip: no amdgpu or i915 here).
PYTHONDONTWRITEBYTECODE=1 timeout 180 python3 /guest/dmabuf.py mlx5_0 mlx5_1 1 >/tmp/dmabuf.log 2>&1
echo "=== dmabuf rc=$?"
grep -v '^=== ' /tmp/dmabuf.log | tail -5 | sed 's/^/=== dmabuf log: /'
grep '^=== ' /tmp/dmabuf.log
# ODP receive buffers behind an SRQ through mlx5_ib (issue 21): page
# faults of type RMP, which rdma-core 56.1's suite never raises.
PYTHONDONTWRITEBYTECODE=1 timeout 180 python3 /guest/odp_srq.py mlx5_0 mlx5_1 1 >/tmp/odp_srq.log 2>&1
echo "=== odp_srq rc=$?"
grep -v '^=== ' /tmp/odp_srq.log | tail -5 | sed 's/^/=== odp_srq log: /'
grep '^=== ' /tmp/odp_srq.log
dmesg -n 1
# 2 MiB huge pages for the suite's huge-page cases (test_odp's
# huge_traffic, test_parent_domain's huge_page_traffic skip without them):
# 64 of the guest's 2 GiB.
echo 64 >/proc/sys/vm/nr_hugepages
echo "=== hugepages $(cat /proc/sys/vm/nr_hugepages)"
. /guest/eth_pair.sh
suite_ipv4 mlx5_0 eth0
# RDMA_SUITE_REPEAT=N (kernel command line, with RDMA_SUITE_FILES): the
# narrowed suite N times first, a line of counts per round and its ERROR
# and FAIL lines (for a rare crash: where it was, from rdma_suite.py).
k=1
while [ $k -le "${RDMA_SUITE_REPEAT:-0}" ]; do
    PYTHONDONTWRITEBYTECODE=1 HOME=/tmp timeout 1500 python3 /guest/rdma_suite.py /tmp/rep.txt \
        --dev mlx5_0 --gid 1 >/tmp/rep.log 2>&1
    echo "=== repeat $k: $(grep -v '^#' /tmp/rep.txt | cut -f1 | sort | uniq -c | tr -s ' \n' ' ')"
    grep -E '^(ERROR|FAIL)' /tmp/rep.txt | sed "s/^/=== repeat $k: /"
    k=$((k + 1))
done
echo "=== suite start $(cut -d' ' -f1 /proc/uptime)"
PYTHONDONTWRITEBYTECODE=1 HOME=/tmp timeout 1500 python3 /guest/rdma_suite.py /tmp/suite.txt \
    --dev mlx5_0 --gid 1 >/tmp/suite.log 2>&1
echo "=== suite rc=$? end $(cut -d' ' -f1 /proc/uptime)"
sed 's/^/=== suite: /' /tmp/suite.txt
tail -5 /tmp/suite.log | sed 's/^/=== suite log: /'
# What a two-process test's side raised (rdma-core's base.py prints
# "Player <side> got: <exception>" and exits; the result line only says
# that a side failed).
grep -m 40 '^Player .* got: ' /tmp/suite.log | cut -c1-300 | sed 's/^/=== suite side: /'
# DPDK's testpmd between the two functions (dpdk.sh, issue 26), beside
# the netdevs: its mlx5 PMD with queues and flows through verbs
# (dv_flow_en=0), then with DPDK's defaults (DevX queues in UMEMs, DV
# flows, eMPW; logged at debug level so the receiver says it asked for
# compressed CQEs, which it does by default); txonly to rxonly, then io
# both ways. Last with its Multi-Packet RQs (mprq_en=1, from one queue
# on: the device's striding RQs, 64 strides of 2 KiB a WQE by the
# extended stride range), logged at info level so the receiver says it
# made them.
. /guest/dpdk.sh
dpdk_pair mlx5_0 mlx5_1 verbs dv_flow_en=0
DPDK_LOG=debug dpdk_pair mlx5_0 mlx5_1 devx -
DPDK_LOG=info dpdk_pair mlx5_0 mlx5_1 mprq mprq_en=1,rxqs_min_mprq=1
# mlx5e's own data path between the two functions (eth_pair.sh): on
# ConnectX-7 it sends by enhanced multi-packet WQEs (issue 26).
set -- $netdevs
eth_pair "$1" "$2"
echo "=== dmesg mlx5"
dmesg | grep -i mlx5
echo "=== done"
echo o >/proc/sysrq-trigger
