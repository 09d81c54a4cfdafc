#!/bin/sh
# Runs in the guest (as init): load the RDMA stack over the two model
# functions and show what registered. Every line the host checks starts
# with "=== ".
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
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
echo "=== dmesg mlx5"
dmesg | grep -i mlx5
echo "=== done"
echo o >/proc/sysrq-trigger
