# perftest between the two functions over RoCE v2, sourced by the guest
# scripts (smoke.sh, featured.sh): `perf NAME PROGRAM ARGS...` runs the
# server on mlx5_0 and the client on mlx5_1 (-x 1: GID index 1), each on a
# port of its own, and prints both sides' lines tagged "=== perf NAME".
# -F: go on when the CPU frequency cannot be read (TCG).
#
# perftest turns cycles into rates with its estimate of the CPU's MHz; under
# TCG on a loaded host that estimate can fail ("Correlation coefficient r^2
# ... < 0.9" on stderr) and every rate it prints is then 0. Such a run moved
# its data but measured nothing, so it is run again, at most three times in
# all; each retry is printed. The caller sets `port` (the first port - 1).
perf() {
    name=$1
    shift
    try=1
    while :; do
        perf_once "$@"
        grep -q "Correlation coefficient" /tmp/pcli.$name || break
        [ $try -lt 3 ] || break
        echo "=== perf $name retry: perftest could not time attempt $try"
        try=$((try + 1))
    done
    echo "=== perf $name client rc=$rc server rc=$src"
    sed "s/^/=== perf $name server: /" /tmp/psrv.$name
    sed "s/^/=== perf $name client: /" /tmp/pcli.$name
}

# One server and client run; sets rc (client) and src (server).
perf_once() {
    port=$((port + 1))
    timeout 120 "$@" -d mlx5_0 -x 1 -F -p $port >/tmp/psrv.$name 2>&1 &
    sleep 1
    j=0
    while [ $j -lt 20 ]; do
        timeout 120 "$@" -d mlx5_1 -x 1 -F -p $port 127.0.0.1 >/tmp/pcli.$name 2>&1
        rc=$?
        grep -q "Couldn't connect\|Unable to init the socket" /tmp/pcli.$name || break
        sleep 0.5
        j=$((j + 1))
    done
    wait $!
    src=$?
}
