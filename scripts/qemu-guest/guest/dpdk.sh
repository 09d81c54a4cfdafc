# Sourced by featured.sh (/guest/dpdk.sh in the guest). dpdk_pair IB0 IB1
# LABEL DEVARGS [noio]: DPDK's testpmd with its mlx5 PMD (Debian's 24.11, over
# mlx5_ib) between the two functions (issue 26), the PMD configured by
# DEVARGS ("-": none, DPDK's defaults). First `rxonly` on IB1's function
# and `txonly` on IB0's, two processes, each stopped by SIGINT after
# DPDK_SECONDS; then one process with both ports in `io` mode
# (--tx-first: each port sends a burst, then every frame received on one
# port is sent on the other, back and forth over the cable; not with
# `noio`). testpmd
# prints its per-port forward statistics when it stops; the lines the
# host checks start with "=== dpdk LABEL-". Both ports are promiscuous
# (testpmd's default), so what the netdevs' own stacks send in the
# meantime arrives too: each phase prints the two netdevs' tx_packets
# growth beside testpmd's counts.
#
# Under TCG: no huge pages (--no-huge; --in-memory refuses it), 2048 mbufs.
DPDK_SECONDS=${DPDK_SECONDS:-8}

dpdk_pci() { basename "$(readlink -f "/sys/class/infiniband/$1/device")"; }

# dpdk_run TAG LCORES PCI... -- TESTPMD_ARGS: testpmd in the background,
# its output in /tmp/dpdk.TAG; the PID in DPDK_PID. With a stats period
# testpmd forwards until a signal (without one it stops at the end of its
# standard input).
dpdk_run() {
    tag=$1 lcores=$2
    shift 2
    eal=""
    while [ "$1" != -- ]; do
        eal="$eal -a $1${DPDK_ARGS:+,$DPDK_ARGS}"
        shift
    done
    shift
    # shellcheck disable=SC2086
    timeout 300 dpdk-testpmd -v --lcores "$lcores" --no-huge -m 256 \
        --file-prefix "$tag" --no-telemetry $eal \
        --log-level=pmd.net.mlx5:${DPDK_LOG:-notice} --log-level=pmd.common.mlx5:${DPDK_LOG:-notice} \
        -- --total-num-mbufs=2048 --stats-period=5 "$@" \
        </dev/null >"/tmp/dpdk.$tag" 2>&1 &
    DPDK_PID=$!
}

# dpdk_wait_forwarding TAG PID: until testpmd says it forwards (or exits).
dpdk_wait_forwarding() {
    i=0
    while ! grep -q 'start packet forwarding' "/tmp/dpdk.$1" &&
        kill -0 "$2" 2>/dev/null && [ $i -lt 240 ]; do
        sleep 0.5
        i=$((i + 1))
    done
}

# dpdk_stop TAG PID: SIGINT, wait; then a line per port of the forward
# statistics testpmd prints as it stops ("=== dpdk TAG port N rx R
# missed M tx T": RX-dropped is the port's imissed, frames the device
# dropped for want of a posted buffer) and what it logged as failing.
dpdk_stop() {
    # testpmd itself, not the timeout(1) around it.
    read -r pmd _ <"/proc/$2/task/$2/children" 2>/dev/null
    kill -INT "${pmd:-$2}" 2>/dev/null
    wait "$2"
    rc=$?
    echo "=== dpdk $1 rc=$rc"
    [ $rc = 0 ] || tail -5 "/tmp/dpdk.$1" | sed 's/^/=== dpdk '"$1"' tail: /'
    sed -n '/Waiting for lcores to finish/,/Accumulated forward statistics/p' "/tmp/dpdk.$1" |
        awk -v tag="$1" '
            /Forward statistics for port/ { port = $(NF - 1) }
            /RX-packets:/ { rx = $2; missed = $4 }
            /TX-packets:/ && port != "" { print "=== dpdk " tag " port " port " rx " rx " missed " missed " tx " $2; port = "" }'
    grep -aiE 'error|fail|cannot|unable' "/tmp/dpdk.$1" | grep -avE 'RX-errors|TX-errors' | head -20 |
        sed 's/^/=== dpdk '"$1"' log: /'
}

# dpdk_kernel_tx IB: tx_packets of IB's netdev (mlx5e's own queues).
dpdk_kernel_tx() {
    cat "/sys/class/infiniband/$1/device/net/"*/statistics/tx_packets 2>/dev/null || echo 0
}

# dpdk_phase TAG IB0 IB1: the netdevs' tx growth since dpdk_mark.
dpdk_mark() { k0=$(dpdk_kernel_tx "$1") k1=$(dpdk_kernel_tx "$2"); }
dpdk_phase() {
    echo "=== dpdk $1 kernel $(($(dpdk_kernel_tx "$2") - k0)) $(($(dpdk_kernel_tx "$3") - k1))"
}

dpdk_pair() {
    # The PMD's control socket (/var/tmp/dpdk_net_mlx5_PID).
    grep -q ' /var/tmp ' /proc/mounts || mount -t tmpfs vartmp /var/tmp
    DPDK_ARGS=$4
    [ "$DPDK_ARGS" = - ] && DPDK_ARGS=
    l=$3
    a=$(dpdk_pci "$1") b=$(dpdk_pci "$2")
    echo "=== dpdk $l-ports $1=$a $2=$b devargs ${DPDK_ARGS:-none}"
    dpdk_mark "$1" "$2"
    dpdk_run "$l-rx" '0@0,1@1' "$b" -- --forward-mode=rxonly
    rx=$DPDK_PID
    dpdk_wait_forwarding "$l-rx" $rx
    mac=$(sed -n 's/.*Port 0: \([0-9A-Fa-f:]*\).*/\1/p' "/tmp/dpdk.$l-rx" | head -1)
    sed -n "s/.*RTE Version: '\(.*\)'.*/=== dpdk $l-version \1/p" "/tmp/dpdk.$l-rx" | head -1
    dpdk_run "$l-tx" '0@1,1@0' "$a" -- --forward-mode=txonly --eth-peer="0,${mac:-02:00:00:00:00:00}"
    tx=$DPDK_PID
    dpdk_wait_forwarding "$l-tx" $tx
    sleep "$DPDK_SECONDS"
    dpdk_stop "$l-tx" $tx
    sleep 2
    dpdk_stop "$l-rx" $rx
    # Whether the receiver's queue was a Multi-Packet RQ (DPDK's MPRQ on
    # the device's striding RQ: with mprq_en=1, logged at info level) and
    # asked for compressed CQEs (logged at debug level, with the mini CQE
    # format).
    grep -a -m1 'Multi-Packet RQ is configured' "/tmp/dpdk.$l-rx" | sed 's/^/=== dpdk '"$l"'-rxq: /'
    grep -a -m1 'Rx CQE compression is enabled' "/tmp/dpdk.$l-rx" | sed 's/^/=== dpdk '"$l"'-rxq: /'
    dpdk_phase "$l-txonly" "$1" "$2"
    [ "${5:-}" = noio ] && return
    dpdk_mark "$1" "$2"
    dpdk_run "$l-io" '0@0,1@1' "$a" "$b" -- --forward-mode=io --tx-first
    io=$DPDK_PID
    dpdk_wait_forwarding "$l-io" $io
    sleep "$DPDK_SECONDS"
    dpdk_stop "$l-io" $io
    dpdk_phase "$l-io" "$1" "$2"
}
