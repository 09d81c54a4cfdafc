#!/bin/sh
# Runs in the guest (as init): load the RDMA stack over the two model
# functions and show what registered. Every line the host checks starts
# with "=== ".
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
echo "=== up $(uname -r)"
modprobe mlx5_core
modprobe mlx5_ib
modprobe ib_uverbs
# mlx5_ib registers each device from the probe's work; wait for both, at
# most 60 s.
i=0
while [ "$(ls /sys/class/infiniband 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 600 ]; do
    sleep 0.1
    i=$((i + 1))
done
echo "=== ib devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')"
timeout 60 ibv_devinfo >/tmp/devinfo 2>&1
echo "=== ibv_devinfo rc=$?"
cat /tmp/devinfo
# mlx5e's netdevs (the PCI functions' net/ directories), brought up; the
# port follows the netdev's carrier, and RoCE GIDs appear for it. Opening a
# netdev can block (mlx5e waits for RX WQEs, TX timeouts hold RTNL) while
# the model does not execute SQ WQEs, so this runs in the background and
# the script moves on after 40 s whatever it printed.
netdevs=$(ls /sys/bus/pci/drivers/mlx5_core/*/net 2>/dev/null | grep -v ':$' | grep -v '^$' | tr '\n' ' ')
echo "=== netdevs: $netdevs"
(
    for n in $netdevs; do
        ip link set dev "$n" up
        echo "=== ip link set $n up rc=$?"
    done
    # Carrier and the GID table settle from events; wait for both, at most
    # 30 s (shell builtins only: under TCG every process costs).
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
    echo "=== waited for ports and GIDs: $i half-seconds"
    for n in $netdevs; do
        read -r flags <"/sys/class/net/$n/flags"
        read -r oper <"/sys/class/net/$n/operstate"
        echo "=== link $n: flags=$flags operstate=$oper"
    done
    for d in /sys/class/infiniband/mlx5_*; do
        read -r state <"$d/ports/1/state"
        read -r phys <"$d/ports/1/phys_state"
        read -r gid <"$d/ports/1/gids/0"
        echo "=== port $(basename "$d"): $state $phys"
        echo "=== gid $(basename "$d") 0: $gid"
    done
    : >/tmp/eth.done
) &
i=0
while [ ! -e /tmp/eth.done ] && [ $i -lt 80 ]; do
    sleep 0.5
    i=$((i + 1))
done
[ -e /tmp/eth.done ] || echo "=== netdev bring-up still blocked after 40 s"
# ibv_devinfo -v per device: the lines the host checks (the whole output
# is ~230 lines a device, slow on the serial console).
for d in mlx5_0 mlx5_1; do
    timeout 60 ibv_devinfo -v -d $d >/tmp/devinfo.$d 2>&1
    echo "=== devinfo -v $d rc=$? lines=$(wc -l </tmp/devinfo.$d)"
    grep -E 'hca_id|fw_ver|node_guid|vendor_part_id|max_qp:|max_cq:|max_mr:|max_pd:|max_srq:|atomic_cap|state:|link_layer|GID\[ *[01]\]' \
        /tmp/devinfo.$d | sed "s/^/=== devinfo -v $d: /"
done
# Verbs between mlx5_0 and mlx5_1 over RoCE v2 (GID index 1, the MAC's
# link-local address), the examples of libibverbs with data checked (-c:
# the server finds the client's bytes at every page start). The GID's
# route goes through the IP stack (rdma_addr_find_l2_eth_by_grh), which
# would resolve the peer's MAC by neighbour discovery, but no Ethernet
# frame crosses the model's wire yet (no receive side): static neighbours.
ip link set lo up
ip -6 neigh replace fe80::268a:7ff:fea0:2 lladdr 24:8a:07:a0:00:02 dev eth0 nud permanent
ip -6 neigh replace fe80::268a:7ff:fea0:1 lladdr 24:8a:07:a0:00:01 dev eth1 nud permanent
# pingpong KIND ARGS...: server on mlx5_0, client on mlx5_1 (again while
# the server does not listen yet). Its lines, less the addresses, tagged.
pingpong() {
    t=$1
    shift
    timeout 60 ibv_${t}_pingpong -d mlx5_0 -g 1 "$@" >/tmp/srv.$t 2>&1 &
    sleep 2
    j=0
    while [ $j -lt 20 ]; do
        timeout 60 ibv_${t}_pingpong -d mlx5_1 -g 1 "$@" 127.0.0.1 >/tmp/cli.$t 2>&1
        rc=$?
        grep -q "Couldn't connect" /tmp/cli.$t || break
        sleep 0.5
        j=$((j + 1))
    done
    wait $!
    echo "=== pingpong $t client rc=$rc server rc=$?"
    grep -v 'address:' /tmp/srv.$t | sed "s/^/=== pingpong $t server: /"
    grep -v 'address:' /tmp/cli.$t | sed "s/^/=== pingpong $t client: /"
}
pingpong rc -n 10 -c
pingpong uc -n 10 -c
pingpong ud -n 10 -c -s 1024
pingpong srq -n 10 -c
# perftest between the two functions over RoCE v2 (-x 1: GID index 1), the
# server on mlx5_0 and the client on mlx5_1, each on a port of its own; -F:
# go on when the CPU frequency cannot be read (TCG). Its lines tagged.
# Sizes and counts keep TCG's share short (the data moves in the model).
port=18600
. /guest/perftest.sh
perf write_bw ib_write_bw -s 65536 -n 100
perf read_bw ib_read_bw -q 4 -n 100
perf send_bw ib_send_bw -a -n 10
perf atomic_bw ib_atomic_bw -n 100
# -C: latencies in CPU cycles (TCG's clock makes perftest's CPU MHz
# estimate fail now and then, and it then prints inf).
perf write_lat ib_write_lat -C -n 100
perf send_lat ib_send_lat -C -s 1024 -n 100
# rdma-core's own suite on mlx5_0, RoCE v2 GID 1 (traffic tests loop back
# on the device), one result line per test (rdma_suite.py), for the host's
# ratchet. The kernel's console output is quietened first so that it
# cannot cut a result line (the dmesg below still has every line).
dmesg -n 1
. /guest/eth_pair.sh
suite_ipv4 mlx5_0 eth0
echo "=== suite start $(date +%s)"
PYTHONDONTWRITEBYTECODE=1 HOME=/tmp timeout 1500 python3 /guest/rdma_suite.py /tmp/suite.txt \
    --dev mlx5_0 --gid 1 >/tmp/suite.log 2>&1
echo "=== suite rc=$? end $(date +%s)"
sed 's/^/=== suite: /' /tmp/suite.txt
tail -5 /tmp/suite.log | sed 's/^/=== suite log: /'
# mlx5e's own data path between the two functions (eth_pair.sh).
set -- $netdevs
eth_pair "$1" "$2"
echo "=== dmesg mlx5"
dmesg | grep -i mlx5
echo "=== done"
echo o >/proc/sysrq-trigger
