#!/bin/sh
# Runs in the guest (as init) for tests/tests/qemu_rxe.rs (issue 25): Linux's
# Soft-RoCE (rdma_rxe) on a virtio-net NIC whose other end is the device
# model's port (`mlx5-emu serve --wire stream,...`), and the servers of
# ibv_rc_pingpong, ibv_ud_pingpong and perftest on rxe0, one after the
# other; their clients run on the host, on the model, through the repo's
# libibverbs. The host reaches the servers' TCP exchange through a second
# NIC (QEMU's user network, ports forwarded). Every line the host reads
# starts with "=== " or with the program's name and "| ".
#
# The NICs are told apart by the MACs the host gives them (below).
WIRE_MAC=52:54:00:00:25:01
USER_MAC=52:54:00:00:25:02
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mkdir -p /dev/shm && mount -t tmpfs shm /dev/shm
echo "=== up $(uname -r)"
modprobe virtio_net
modprobe rdma_rxe
modprobe ib_uverbs
i=0
while [ $i -lt 100 ]; do
    wire="" user=""
    for n in /sys/class/net/*; do
        read -r mac <"$n/address" || continue
        [ "$mac" = $WIRE_MAC ] && wire=${n##*/}
        [ "$mac" = $USER_MAC ] && user=${n##*/}
    done
    [ -n "$wire" ] && [ -n "$user" ] && break
    sleep 0.1
    i=$((i + 1))
done
echo "=== nics: wire=$wire user=$user"
ip link set lo up
ip link set "$wire" up
ip link set "$user" up
# QEMU's user network: the guest is 10.0.2.15, the host 10.0.2.2.
ip addr add 10.0.2.15/24 dev "$user"
# The model answers no neighbour solicitation (nor does the card: the host's
# netdev does, and the model function here has none): its link-local
# address goes in the table by hand (MODEL_MAC, MODEL_LL from the host).
. /guest/model.env
ip -6 neigh replace "$MODEL_LL" lladdr "$MODEL_MAC" dev "$wire" nud permanent
echo "=== neigh $MODEL_LL $MODEL_MAC rc=$?"
rdma link add rxe0 type rxe netdev "$wire"
echo "=== rdma link add rc=$?"
i=0
zero=0000:0000:0000:0000:0000:0000:0000:0000
gid=$zero
while [ $i -lt 100 ]; do
    read -r gid </sys/class/infiniband/rxe0/ports/1/gids/0 2>/dev/null || gid=$zero
    [ "$gid" != $zero ] && break
    sleep 0.1
    i=$((i + 1))
done
echo "=== rxe0 gid0 $gid"
read -r state </sys/class/infiniband/rxe0/ports/1/state
echo "=== rxe0 state $state"

# One server at a time on TCP port 18515, as its client on the host expects:
# NAME then the command. Each is bounded (a client that never comes, or
# traffic that never completes, ends it).
serve() {
    name=$1
    shift
    echo "=== serve $name"
    timeout 240 "$@" >/tmp/out 2>&1
    rc=$?
    sed "s/^/$name| /" /tmp/out
    echo "=== done $name rc=$rc"
}
serve rc_pingpong ibv_rc_pingpong -d rxe0 -g 0 -c -n 100 -s 4096
serve ud_pingpong ibv_ud_pingpong -d rxe0 -g 0 -c -n 100 -s 1024
serve write_bw ib_write_bw -d rxe0 -x 0 -F -n 200 -s 65536
serve read_bw ib_read_bw -d rxe0 -x 0 -F -n 200 -s 65536
serve send_lat ib_send_lat -d rxe0 -x 0 -F -n 100 -s 1024
serve atomic_bw ib_atomic_bw -d rxe0 -x 0 -F -n 200
rdma statistic show link rxe0/1 2>&1 | sed 's/^/rxe_counters| /'
# Then raw Ethernet: Linux's UDP stack echoes the datagrams our driver's raw
# packet QP sends on the model (mlx5-pkt udp-echo, from 10.25.0.1 at the
# model's MAC); checksums checked in software (the stream netdev offers the
# guest no offload).
ip addr add 10.25.0.2/24 dev "$wire"
ip neigh replace 10.25.0.1 lladdr "$MODEL_MAC" dev "$wire" nud permanent
PYTHONDONTWRITEBYTECODE=1 timeout 400 python3 /guest/eth_traffic.py echo 10.25.0.2 "$ECHO_COUNT"
echo "=== end"
echo o >/proc/sysrq-trigger
