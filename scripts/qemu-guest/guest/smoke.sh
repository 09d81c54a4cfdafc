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
# mlx5e's netdevs (the PCI functions' net/ directories), brought up; the
# port follows the netdev's carrier, and RoCE GIDs appear for it.
netdevs=$(ls /sys/bus/pci/drivers/mlx5_core/*/net 2>/dev/null | grep -v ':$' | grep -v '^$' | tr '\n' ' ')
echo "=== netdevs: $netdevs"
for n in $netdevs; do
    ip link set dev "$n" up
    echo "=== ip link set $n up rc=$?"
done
# Carrier and the GID table settle from events; wait for both, at most 30 s
# (shell builtins only: under TCG every process costs).
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
    echo "=== link $n: $(ip -o link show dev "$n" | sed 's/.*<\([^>]*\)>.*state \([A-Z]*\).*/flags=\1 state=\2/')"
done
for d in /sys/class/infiniband/mlx5_*; do
    echo "=== port $(basename "$d"): $(cat "$d/ports/1/state") $(cat "$d/ports/1/phys_state")"
    echo "=== gid $(basename "$d") 0: $(cat "$d/ports/1/gids/0") $(cat "$d/ports/1/gid_attrs/types/0" 2>/dev/null)"
done
timeout 60 ibv_devinfo >/tmp/devinfo 2>&1
echo "=== ibv_devinfo rc=$?"
cat /tmp/devinfo
echo "=== dmesg mlx5"
dmesg | grep -i mlx5
echo "=== done"
echo o >/proc/sysrq-trigger
