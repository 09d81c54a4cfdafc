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
echo "=== dmesg mlx5"
dmesg | grep -i mlx5
echo "=== done"
echo o >/proc/sysrq-trigger
