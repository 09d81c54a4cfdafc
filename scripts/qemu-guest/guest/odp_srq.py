#!/usr/bin/env python3
"""ODP receive buffers behind a shared receive queue, through Linux's
mlx5_ib on the model (issue 21).

rdma-core 56.1's test_odp.py has no SRQ case (its ODP tests' receive
buffers are RQ WQEs, or DCT SRQ WQEs over pages the registration's
snapshot already mapped), so a responder page fault on an SRQ WQE is
never raised by the suite. Here the receive buffers are anonymous memory
the process has never touched, registered ON_DEMAND: the first SEND into
an SRQ WQE meets absent pages, the model raises a WQE page fault of type
RMP naming the SRQ, and mlx5_ib must find the SRQ by that number
(`odp_get_rsc`), read the WQE from the SRQ's user memory, fault the pages
in, write them by UMR and resume; the SEND then lands. Linux's fault
handler and the bytes read back in this process are the judges:

- mlx5_1 has an SRQ fed by two RC QPs, its two WQEs pointing into
  untouched ODP memory (one WQE crossing a page boundary);
- mlx5_0 SENDs one message on each QP; both land, each in the WQE it
  was meant for, intact, with mlx5_ib's page-fault counter of the MR
  (`rdma statistic show mr`, where the tool is there) above zero.

Run as `odp_srq.py DEV_A DEV_B GID_INDEX`; every line the host checks
starts with "=== odp_srq ".
"""

import ctypes
import mmap
import subprocess
import sys

from pyverbs.cq import CQ
from pyverbs.device import Context
import pyverbs.enums as e
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from guest_rc import connect_rc

SIZE = 1 << 20
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
          | e.IBV_ACCESS_REMOTE_READ)
# (offset in the ODP memory, length) of each receive WQE's buffer.
RECVS = [(0x4_0800, 5000), (0x8_0000, 3000)]


def say(*words):
    print("=== odp_srq", *words, flush=True)


def pattern(n, seed):
    return bytes((seed + i * 13) & 0xFF for i in range(n))


def poll(cq, n):
    """Up to `n` completions, or fewer when none came for a while."""
    out = []
    for _ in range(2000000):
        k, wcs = cq.poll(num_entries=n - len(out))
        out.extend(wcs[:k])
        if len(out) == n:
            break
    return out


def mr_page_faults(dev):
    """mlx5_ib's page_faults of `dev`'s MRs (rdma statistic show mr)."""
    try:
        out = subprocess.run(["rdma", "statistic", "show", "mr"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"no rdma tool ({err})"
    # One MR per "dev DEV mrn N" line, its counters on that line or on
    # the indented lines after it (the tool's two layouts).
    total = 0
    seen = False
    cur = None
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["dev"]:
            cur = words[1] if len(words) > 1 else None
        if cur == dev and "page_faults" in words:
            seen = True
            total += int(words[words.index("page_faults") + 1])
    return total if seen else f"no page_faults in {out.strip()[:200]!r}"


def main():
    dev_a, dev_b, gid_index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ca, cb = Context(name=dev_a), Context(name=dev_b)
    pa, pb = PD(ca), PD(cb)
    qa, qb = CQ(ca, 16), CQ(cb, 16)
    ga, gb = ca.query_gid(1, gid_index), cb.query_gid(1, gid_index)
    srq = SRQ(pb, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
    cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
    senders = [QP(pa, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=qa, rcq=qa, cap=cap))
               for _ in RECVS]
    receivers = [QP(pb, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=qb, rcq=qb, srq=srq, cap=cap))
                 for _ in RECVS]
    for s, r in zip(senders, receivers):
        connect_rc(s, r.qp_num, gb, gid_index, ACCESS, min_rnr_timer=1)
        connect_rc(r, s.qp_num, ga, gid_index, ACCESS, min_rnr_timer=1)
    # Anonymous memory never touched: no page of it is present when the
    # region is registered, nor when the SENDs arrive.
    mem = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    try:
        odp = MR(pb, SIZE, ACCESS | e.IBV_ACCESS_ON_DEMAND, address=addr)
    except PyverbsError as err:
        say("reg FAILED:", str(err).splitlines()[0])
        return
    say("reg ok lkey", hex(odp.lkey))
    for i, (off, n) in enumerate(RECVS):
        srq.post_recv(RecvWR(wr_id=70 + i, num_sge=1, sg=[SGE(addr + off, n, odp.lkey)]))
    src = MR(pa, SIZE, ACCESS)
    sent = []
    for i, (s, (_, n)) in enumerate(zip(senders, RECVS)):
        data = pattern(n, 11 + i)
        src.write(data, n, i * 0x1_0000)
        s.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1,
                           sg=[SGE(src.buf + i * 0x1_0000, n, src.lkey)]))
        wc = poll(qa, 1)
        say(f"send {i} status", wc[0].status if wc else "none")
        sent.append(data)
    wcs = poll(qb, len(RECVS))
    got = [(w.wr_id, w.status, w.byte_len, w.qp_num) for w in wcs]
    want = [(70 + i, 0, n, r.qp_num) for i, ((_, n), r) in enumerate(zip(RECVS, receivers))]
    say("receives", "ok" if got == want else f"FAILED: {got} != {want}")
    intact = all(mem[off:off + n] == d for (off, n), d in zip(RECVS, sent))
    say("data", "ok" if intact else "FAILED")
    say("page faults", mr_page_faults(dev_b))
    say("done")


if __name__ == "__main__":
    main()
