#!/usr/bin/env python3
"""DMA-BUF memory regions through Linux's mlx5_ib on the model (issue 22).

rdma-core's own dma-buf tests (test_mlx5_dmabuf.py, test_mr.py's DmaBuf
cases) allocate their buffers from an amdgpu or i915 GPU through DRM
(pyverbs/dmabuf_alloc.c knows no other), which no QEMU machine offers, so
they skip here. This check uses the exporter the guest kernel has,
udmabuf (a memfd made a dma-buf: CONFIG_UDMABUF=y), and pyverbs' own
DmaBufMR, which takes a dma-buf fd: `ibv_reg_dmabuf_mr` goes through
ib_uverbs to mlx5_ib's `reg_user_mr_dmabuf` (a dynamic attachment, the
pages' DMA addresses written into the key by UMR), and the model then
carries RC traffic into and out of the dma-buf. Linux's importer and
the bytes read back through the memfd are the judges:

- mlx5_1 registers a udmabuf (64 KiB) as a dma-buf MR at iova 0;
- mlx5_0 RDMA WRITEs a pattern into it (the memfd then holds the
  pattern), and RDMA READs it back after the memfd was rewritten (the
  read returns the new bytes);
- refusals: a range past the dma-buf's end, an fd that is not a
  dma-buf (a memfd), a closed fd.

Run as `dmabuf.py DEV_A DEV_B GID_INDEX`; every line the host checks
starts with "=== dmabuf ".
"""

import fcntl
import mmap
import os
import struct
import sys

from pyverbs.cq import CQ
from pyverbs.device import Context
import pyverbs.enums as e
from pyverbs.mr import MR, DmaBufMR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

from guest_rc import connect_rc

SIZE = 64 << 10
# _IOW('u', 0x42, struct udmabuf_create { u32 memfd, flags; u64 offset, size; })
UDMABUF_CREATE = 0x40187542
UDMABUF_FLAGS_CLOEXEC = 0x01
F_SEAL_SHRINK = 0x0002
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
          | e.IBV_ACCESS_REMOTE_READ)


def say(*words):
    print("=== dmabuf", *words, flush=True)


def udmabuf(size):
    """A udmabuf of `size` bytes and the memfd behind it."""
    memfd = os.memfd_create("dmabuf-check", os.MFD_ALLOW_SEALING)
    os.ftruncate(memfd, size)
    fcntl.fcntl(memfd, fcntl.F_ADD_SEALS, F_SEAL_SHRINK)
    dev = os.open("/dev/udmabuf", os.O_RDWR)
    try:
        arg = bytearray(struct.pack("=IIQQ", memfd, UDMABUF_FLAGS_CLOEXEC, 0, size))
        fd = fcntl.ioctl(dev, UDMABUF_CREATE, arg, True)
    finally:
        os.close(dev)
    return fd, memfd


def pattern(n, seed):
    return bytes((seed + i * 31) & 0xFF for i in range(n))


class Side:
    def __init__(self, name, gid_index):
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 16)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
        self.qp = QP(self.pd, init)
        self.gid_index = gid_index
        self.gid = self.ctx.query_gid(1, gid_index)

    def connect(self, peer):
        connect_rc(self.qp, peer.qp.qp_num, peer.gid, self.gid_index, ACCESS)

    def rdma(self, opcode, mr, length, rkey, raddr):
        wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(mr.buf, length, mr.lkey)])
        wr.set_wr_rdma(rkey, raddr)
        self.qp.post_send(wr)
        for _ in range(200000):
            n, wcs = self.cq.poll()
            if n:
                return wcs[0].status
        return "no completion"


def refused(what, fn):
    try:
        fn()
    except PyverbsError as err:
        say("refused", what, "ok:", str(err).splitlines()[0][:120])
        return
    say("refused", what, "FAILED: registered")


def main():
    dev_a, dev_b, gid_index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        fd, memfd = udmabuf(SIZE)
    except OSError as err:
        say("udmabuf FAILED:", err)
        return
    say("udmabuf fd", fd, "size", SIZE)
    a, b = Side(dev_a, gid_index), Side(dev_b, gid_index)
    a.connect(b)
    b.connect(a)
    try:
        dmr = DmaBufMR(b.pd, SIZE, ACCESS, dmabuf=fd)
    except PyverbsError as err:
        say("reg FAILED:", str(err).splitlines()[0])
        return
    say("reg ok rkey", hex(dmr.rkey))
    view = mmap.mmap(memfd, SIZE)
    src = MR(a.pd, SIZE, ACCESS)
    data = pattern(SIZE, 5)
    src.write(data, SIZE)
    status = a.rdma(e.IBV_WR_RDMA_WRITE, src, SIZE, dmr.rkey, 0)
    landed = view[:SIZE] == data
    say("write status", status, "landed", "ok" if landed else "FAILED")
    fresh = pattern(SIZE, 77)
    view[:SIZE] = fresh
    dst = MR(a.pd, SIZE, ACCESS)
    status = a.rdma(e.IBV_WR_RDMA_READ, dst, SIZE, dmr.rkey, 0)
    back = dst.read(SIZE, 0) == fresh
    say("read status", status, "returned", "ok" if back else "FAILED")
    refused("past-end", lambda: DmaBufMR(b.pd, SIZE, ACCESS, dmabuf=fd, offset=4096))
    refused("not-a-dmabuf", lambda: DmaBufMR(b.pd, 4096, ACCESS, dmabuf=memfd))
    closed = os.dup(fd)
    os.close(closed)
    refused("closed-fd", lambda: DmaBufMR(b.pd, 4096, ACCESS, dmabuf=closed))
    dmr.close()
    say("done")


if __name__ == "__main__":
    main()
