#!/usr/bin/env python3
"""Traffic between the two model functions through mlx5e (issue 26).

Run in the guest with the second function's netdev in a network namespace
of its own, so that the kernel sends between the two addresses over the
cable: `eth_traffic.py server ADDR` there (in the background), then
`eth_traffic.py client ADDR` here. Linux's IP, UDP and TCP stacks are the
judges: the client sends UDP datagrams of every size from 1 to 1472 bytes
in steps (one frame each) that the server echoes, and streams a TCP payload
(large sends: mlx5e asks for LSO) whose SHA-256 the server sends back.
Every line the host checks starts with "=== eth " (with ETH_TAG set,
"=== eth TAG ": the same traffic over another path, e.g. a VXLAN tunnel).

`eth_traffic.py stats DEV NAME...` prints the netdev's ethtool statistics
of those names ("=== eth stat DEV NAME VALUE"), read through the
SIOCETHTOOL ioctl as `ethtool -S` reads them (the guest has no ethtool):
mlx5e's `tx_mpwqe_pkts` counts the frames it sent by enhanced multi-packet
WQEs.

`eth_traffic.py echo ADDR COUNT` is the UDP echo alone, for a peer that is
not Linux (tests/tests/qemu_rxe.rs: `mlx5-pkt udp-echo`, our driver's raw
packet QP on the model, beyond the model's wire): COUNT datagrams echoed,
or none for ECHO_IDLE seconds, then "=== eth echo served N".
"""

import ctypes
import fcntl
import hashlib
import socket
import os
import struct
import sys

TAG = "=== eth " + (os.environ["ETH_TAG"] + " " if os.environ.get("ETH_TAG") else "")

UDP_PORT = 7000
TCP_PORT = 7001
TCP_BYTES = 1 << 20
SIZES = list(range(1, 1473, 47)) + [1472]
TIMEOUT = 60


def payload(n, seed):
    return bytes((seed * 7 + i * 13) & 0xFF for i in range(n))


def server(addr):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, UDP_PORT))
    u.settimeout(TIMEOUT)
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind((addr, TCP_PORT))
    t.listen(1)
    t.settimeout(TIMEOUT)
    open("/tmp/eth.ready", "w").close()
    try:
        for _ in SIZES:
            d, peer = u.recvfrom(65536)
            u.sendto(d, peer)
        c, _ = t.accept()
        c.settimeout(TIMEOUT)
        h = hashlib.sha256()
        got = 0
        while got < TCP_BYTES:
            d = c.recv(65536)
            if not d:
                break
            h.update(d)
            got += len(d)
        c.sendall(("%d %s\n" % (got, h.hexdigest())).encode())
        c.close()
    except OSError as e:
        print(TAG + "server error %s" % e, flush=True)


ECHO_IDLE = 300


def echo(addr, count):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((addr, UDP_PORT))
    u.settimeout(ECHO_IDLE)
    print("=== eth echo ready", flush=True)
    served = 0
    try:
        while served < int(count):
            d, peer = u.recvfrom(65536)
            u.sendto(d, peer)
            served += 1
    except OSError as e:
        print("=== eth echo error %s" % e, flush=True)
    print("=== eth echo served %d" % served, flush=True)


def client(addr):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(TIMEOUT)
    intact = 0
    for k, n in enumerate(SIZES):
        p = payload(n, k)
        u.sendto(p, (addr, UDP_PORT))
        try:
            d, _ = u.recvfrom(65536)
        except OSError as e:
            print(TAG + "udp error size %d: %s" % (n, e), flush=True)
            break
        intact += d == p
    print(TAG + "udp sizes %d echoed intact %d" % (len(SIZES), intact), flush=True)
    data = payload(TCP_BYTES, 99)
    want = hashlib.sha256(data).hexdigest()
    try:
        t = socket.create_connection((addr, TCP_PORT), timeout=TIMEOUT)
        t.sendall(data)
        line = t.makefile().readline().split()
        t.close()
        ok = line == [str(TCP_BYTES), want]
        print(TAG + "tcp bytes %d sha256 %s" % (TCP_BYTES, "ok" if ok else "bad: %s" % line),
              flush=True)
    except OSError as e:
        print(TAG + "tcp error %s" % e, flush=True)


SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32


def ethtool(dev, buf):
    """SIOCETHTOOL on `dev` with the command in `buf` (a ctypes buffer)."""
    ifr = struct.pack("16sP", dev.encode(), ctypes.addressof(buf))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)


def stats(dev, *names):
    info = ctypes.create_string_buffer(struct.pack("IIQI", ETHTOOL_GSSET_INFO, 0,
                                                   1 << ETH_SS_STATS, 0))
    ethtool(dev, info)
    n = struct.unpack_from("I", info, 16)[0]
    strings = ctypes.create_string_buffer(struct.pack("III", ETHTOOL_GSTRINGS, ETH_SS_STATS, n)
                                          + bytes(n * ETH_GSTRING_LEN))
    ethtool(dev, strings)
    keys = [strings.raw[12 + i * ETH_GSTRING_LEN:12 + (i + 1) * ETH_GSTRING_LEN]
            .split(b"\0")[0].decode() for i in range(n)]
    values = ctypes.create_string_buffer(struct.pack("II", ETHTOOL_GSTATS, n) + bytes(n * 8))
    ethtool(dev, values)
    got = dict(zip(keys, struct.unpack_from("%dQ" % n, values, 8)))
    for name in names:
        print("=== eth stat %s %s %s" % (dev, name, got.get(name, "absent")), flush=True)


if __name__ == "__main__":
    {"server": server, "client": client, "echo": echo,
     "stats": stats}[sys.argv[1]](*sys.argv[2:])
