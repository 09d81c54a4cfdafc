# Sourced by smoke.sh and featured.sh (/guest/eth_pair.sh in the guest).
# suite_ipv4 (below) gives the suite's netdev its IPv4 address.
# eth_pair DEV0 DEV1: mlx5e's own data path between the two functions,
# judged by Linux's IP, UDP and TCP stacks (eth_traffic.py): DEV1 moves to
# a network namespace of its own so that traffic between the two addresses
# crosses the cable. Then Linux's pktgen sends PKTGEN_COUNT UDP frames from
# DEV0 to DEV1 in bursts of 8 (xmit_more: mlx5e puts a burst in one
# enhanced multi-packet WQE where the caps offer them) and DEV1's receive
# counter says how many arrived (ping and iperf3 before it,
# ping_iperf3). Then the UDP echo and TCP stream again
# over a VXLAN tunnel (VNI 42, UDP port 4789) between the two: mlx5e
# registers the port with the device and asks it for the inner checksums
# and tunnel segmentation ("=== eth vxlan ..." lines), and over a GRE
# tunnel ("=== eth gre ...": the device parses GRE for the same offloads).
# Last, both netdevs' ethtool TX counters:
# tx_mpwqe_pkts counts what mlx5e sent by enhanced multi-packet WQEs
# (linear SKBs without inline headers), tx_mpwqe_blks those WQEs,
# tx_csum_partial_inner and tx_tso_inner_packets the tunnelled frames whose
# inner checksums and segmentation it left to the device; and whether each
# received through striding RQs (rx_striding_rq) and how many packets the
# device merged by LRO (rx_lro_packets: DEV1 asks for LRO first, where
# mlx5e offers it) and how many receive CQEs came compressed
# (rx_cqe_compress_pkts in rx_cqe_compress_blks sessions: both netdevs turn
# CQE compression on first) and how many tunnelled packets the device
# said were tunnelled with good inner checksums (rx_csum_unnecessary_inner,
# counted while DEV1 takes the CQEs' verdicts: rx_no_csum_complete, on
# before the tunnels); then DEV0's global pause
# read, turned off and read back (ethtool -a/-A: the PFCC register). Every
# line the host checks starts with "=== eth ".
PKTGEN_COUNT=256

# suite_ipv4 IBDEV NETDEV: 10.8.0.1/24 on NETDEV for rdma-core's rdma_cm
# tests (test_rdmacm, test_mlx5_rdmacm, test_addr) on IBDEV: base.py takes
# the netdev's first address as the test's (IPv4 is listed before IPv6)
# and builds its multicast group from it ("230" + what follows the first
# "."), which an IPv6 link-local address cannot give. The GID table gains
# the IPv4-mapped RoCE v1 and v2 entries (2 and 3); waits for the second.
suite_ipv4() {
    ip addr add 10.8.0.1/24 dev "$2"
    i=0
    while ! grep -q ffff:0a08:0001 "/sys/class/infiniband/$1/ports/1/gids/3" 2>/dev/null &&
        [ $i -lt 20 ]; do
        sleep 0.5
        i=$((i + 1))
    done
    echo "=== suite ipv4 $(ip -4 -o addr show "$2" | awk '{print $4}') gid3 $(cat "/sys/class/infiniband/$1/ports/1/gids/3")"
}

# cqe_compress NETNS-PREFIX DEV: DEV's rx_cqe_compress private flag (on/off).
cqe_compress() {
    $1 ethtool --show-priv-flags "$2" | awk '$1 == "rx_cqe_compress" { print $3 }'
}

# tunnel_pair TAG NAME NET DEV0 DEV1 LINK-ARGS...: a tunnel device NAME
# on each side (DEV0's 10.9.0.1 to DEV1's 10.9.0.2 in the peer namespace,
# `ip link add NAME LINK-ARGS... local A remote B dev DEV`), addresses
# NET.1 and NET.2, then the UDP echo and TCP stream between them, their
# lines tagged "=== eth TAG ".
tunnel_pair() {
    tag=$1 name=$2 net=$3 d0=$4 d1=$5
    shift 5
    ip link add "$name" "$@" local 10.9.0.1 remote 10.9.0.2 dev "$d0"
    ip addr add "$net.1/24" dev "$name"
    ip link set "$name" up
    ip netns exec peer ip link add "$name" "$@" local 10.9.0.2 remote 10.9.0.1 dev "$d1"
    ip netns exec peer ip addr add "$net.2/24" dev "$name"
    ip netns exec peer ip link set "$name" up
    rm -f /tmp/eth.ready
    ETH_TAG=$tag PYTHONDONTWRITEBYTECODE=1 ip netns exec peer timeout 180 python3 /guest/eth_traffic.py server "$net.2" &
    i=0
    while [ ! -e /tmp/eth.ready ] && [ $i -lt 120 ]; do
        sleep 0.5
        i=$((i + 1))
    done
    ETH_TAG=$tag PYTHONDONTWRITEBYTECODE=1 timeout 180 python3 /guest/eth_traffic.py client "$net.2"
    wait
}

# ping_iperf3 ADDR: what a user runs first between two hosts, towards
# ADDR in the peer namespace: three pings ("=== eth ping N received"),
# then iperf3 sending 4 MiB over TCP to a one-off server there ("=== eth
# iperf3 sent S received R mbps M", from its JSON report).
ping_iperf3() {
    echo "=== eth ping $(ping -c 3 -i 0.2 -W 5 "$1" | grep -o '[0-9]* received')"
    ip netns exec peer timeout 150 iperf3 -s -1 -B "$1" >/dev/null 2>&1 &
    i=0
    until out=$(timeout 120 iperf3 -c "$1" -n 4M -J 2>/dev/null); do
        i=$((i + 1))
        [ $i -lt 20 ] || break
        sleep 0.5
    done
    echo "$out" | python3 -c 'import json, sys
try:
    e = json.load(sys.stdin)["end"]
    print("=== eth iperf3 sent", e["sum_sent"]["bytes"], "received", e["sum_received"]["bytes"],
          "mbps", round(e["sum_received"]["bits_per_second"] / 1e6, 1))
except Exception as x:
    print("=== eth iperf3 failed", repr(x))'
    wait
}

eth_pair() {
    ip netns add peer && ip link set dev "$2" netns peer
    ip addr add 10.9.0.1/24 dev "$1"
    ip netns exec peer ip addr add 10.9.0.2/24 dev "$2"
    ip netns exec peer ip link set dev "$2" up
    # LRO on the receiving side where mlx5e offers it (its RQs stride):
    # the TCP stream below then arrives merged by the device.
    ip netns exec peer ethtool -K "$2" lro on 2>/dev/null
    echo "=== eth lro $(ip netns exec peer ethtool -k "$2" | awk '/^large-receive-offload:/ { $1 = ""; print substr($0, 2) }')"
    # CQE compression on both netdevs' receive CQs (mlx5e's rx_cqe_compress
    # private flag, off by default on a fast link): the device then writes
    # a burst's receive CQEs as a title and mini CQE arrays, which mlx5e
    # expands (rx_cqe_compress_blks / _pkts below).
    ethtool --set-priv-flags "$1" rx_cqe_compress on
    rc0=$?
    ip netns exec peer ethtool --set-priv-flags "$2" rx_cqe_compress on
    echo "=== eth cqe_compress rc=$rc0,$? $(cqe_compress "" "$1") $(cqe_compress "ip netns exec peer" "$2")"
    PYTHONDONTWRITEBYTECODE=1 ip netns exec peer timeout 180 python3 /guest/eth_traffic.py server 10.9.0.2 &
    i=0
    while [ ! -e /tmp/eth.ready ] && [ $i -lt 120 ]; do
        sleep 0.5
        i=$((i + 1))
    done
    PYTHONDONTWRITEBYTECODE=1 timeout 180 python3 /guest/eth_traffic.py client 10.9.0.2
    wait
    ping_iperf3 10.9.0.2
    rx() { ip netns exec peer cat "/sys/class/net/$2/statistics/rx_packets"; }
    before=$(rx "$@")
    modprobe pktgen
    echo "rem_device_all" >/proc/net/pktgen/kpktgend_0
    echo "add_device $1" >/proc/net/pktgen/kpktgend_0
    for c in "count $PKTGEN_COUNT" "pkt_size 64" "flag SHARED" "burst 8" "delay 1000000" "dst 10.9.0.2" \
        "dst_mac $(ip netns exec peer cat "/sys/class/net/$2/address")" "udp_dst_min 9" "udp_dst_max 9"; do
        echo "$c" >"/proc/net/pktgen/$1"
    done
    timeout 120 sh -c 'echo start >/proc/net/pktgen/pgctrl'
    sent=$(sed -n 's/.*Result: OK: .* usec, \([0-9]*\) (.*/\1/p' "/proc/net/pktgen/$1" | head -1)
    i=0
    while [ "$(($(rx "$@") - before))" -lt "${sent:-1}" ] && [ $i -lt 40 ]; do
        sleep 0.5
        i=$((i + 1))
    done
    echo "=== eth pktgen sent ${sent:-none} of $PKTGEN_COUNT received $(($(rx "$@") - before))"
    grep -m1 'Result' "/proc/net/pktgen/$1" | sed 's/^/=== eth pktgen log: /'
    # From here the receiving netdev hands the stack the CQEs' checksum
    # verdicts rather than their sums (mlx5e's rx_no_csum_complete): a
    # tunnelled packet whose CQE says tunnelled with good inner checksums
    # (its TIR parses tunnels: mlx5e asks that of every RSS TIR where the
    # caps announce inner_ip_version, and steers GRE by its inner headers)
    # counts in rx_csum_unnecessary_inner, one whose CQE gives the outer
    # headers only in rx_csum_unnecessary or rx_csum_none.
    ip netns exec peer ethtool --set-priv-flags "$2" rx_no_csum_complete on
    echo "=== eth no_csum_complete rc=$?"
    tunnel_pair vxlan vx0 10.10.0 "$1" "$2" type vxlan id 42 dstport 4789
    # Then over a GRE tunnel (IPv4 inside GRE, Linux's ip_gre): mlx5e
    # leaves the inner checksums and the tunnel's segmentation to the
    # device (tunnel_stateless_gre), which parses the GRE header.
    tunnel_pair gre gre1 10.11.0 "$1" "$2" type gre
    for c in tx_packets tx_mpwqe_blks tx_mpwqe_pkts tx_csum_partial_inner tx_tso_inner_packets rx_lro_packets \
        rx_cqe_compress_blks rx_cqe_compress_pkts rx_csum_unnecessary_inner; do
        PYTHONDONTWRITEBYTECODE=1 python3 /guest/eth_traffic.py stats "$1" $c
        PYTHONDONTWRITEBYTECODE=1 ip netns exec peer python3 /guest/eth_traffic.py stats "$2" $c
    done
    # Whether mlx5e received through striding RQs (its rx_striding_rq
    # private flag: on where the caps allow its UMR-mapped MPWQEs).
    striding() { $1 ethtool --show-priv-flags "$2" | awk '$1 == "rx_striding_rq" { print ($3 == "on") }'; }
    echo "=== eth stat $1 rx_striding_rq $(striding "" "$1")"
    echo "=== eth stat $2 rx_striding_rq $(striding "ip netns exec peer" "$2")"
    # The CQE checksums mlx5e handed the stack as CHECKSUM_COMPLETE
    # (rx_csum_complete on the receiving side) and the stack's verdict on
    # them: "hw csum failure" where a sum disagreed with the frame.
    complete=$(ip netns exec peer ethtool -S "$2" | awk '$1 == "rx_csum_complete:" { print $2 }')
    echo "=== eth csum complete ${complete:-none} faults $(dmesg | grep -c 'hw csum failure')"
    # Global pause as mlx5e reads and sets it (PFCC): on from power-on,
    # then off and read back, then on again.
    pause() { ethtool -a "$1" | awk '/^RX:/ { rx = $2 } /^TX:/ { tx = $2 } END { print rx, tx }'; }
    echo "=== eth pause $(pause "$1")"
    ethtool -A "$1" rx off tx off
    echo "=== eth pause-off rc=$? $(pause "$1")"
    ethtool -A "$1" rx on tx on
}
