//! The data path driven by hand-built commands and WQEs: two functions on
//! a fabric (or one looped back), RC/UC/UD, every RC opcode, errors,
//! RNR, flushes, events, and leak checks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_hw::ifc::{
    ads, cqc, create_cq_in, create_mkey_in, create_qp_in, create_srq_in, mkc, qpc,
    roce_addr_layout, set_roce_address_in, srqc,
};
use vfio::{DmaBuffer, Iova, PciFunction};

use vfio::clock::ManualClock;

use super::{be16, be32, cmd_in, create_eq, until, Drv, HANG_GUARD};
use crate::transport::RETRY_DEADLINE;
use crate::{DeviceConfig, Fabric, Profile};

const DATA_IOVA: u64 = 0x4000_0000;
const DATA_VA: u64 = 0x7f12_3400_0000;
const DATA_LEN: usize = 1 << 20;
const CQ_IOVA: u64 = 0x5000_0000;
const QP_IOVA: u64 = 0x6000_0000;
const DBR_IOVA: u64 = 0x7000_0000;
const SRQ_IOVA: u64 = 0x7800_0000;
const LOG_CQ: u8 = 8;
const LOG_SQ: u8 = 6;
const LOG_RQ: u8 = 5;
const RQ_STRIDE: usize = 64;

struct Node {
    d: Drv,
    uar: u32,
    pd: u32,
    eqn: u8,
    data: Arc<DmaBuffer>,
    lkey: u32,
    cq: Vec<(u32, Arc<DmaBuffer>, u32, usize)>,
    dbr: Arc<DmaBuffer>,
    qbufs: Vec<Arc<DmaBuffer>>,
    next_dbr: usize,
    gid: [u8; 16],
}

struct Q {
    qpn: u32,
    buf: Arc<DmaBuffer>,
    dbr: usize,
    sq_pi: u16,
    rq_pi: u16,
    /// log2 of the send queue's basic blocks.
    log_sq: u8,
}

fn gid_of(mac: u64) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    let m = mac.to_be_bytes();
    g[8] = m[2] ^ 2;
    g[9] = m[3];
    g[10] = m[4];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13] = m[5];
    g[14] = m[6];
    g[15] = m[7];
    g
}

impl Node {
    fn new(f: Arc<vfio::emulated::EmulatedFunction<crate::Device>>) -> Self {
        Self::new_as(f, |_| {})
    }

    /// [`Node::new`], `before_init` run on the driver before INIT_HCA.
    fn new_as(
        f: Arc<vfio::emulated::EmulatedFunction<crate::Device>>,
        before_init: impl FnOnce(&mut Drv),
    ) -> Self {
        let mac = f.model().config().mac;
        let mut d = Drv::on(f);
        d.bring_up_as(before_init);
        let uar = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
        // Completion and async events (QP/CQ errors, SRQ limit).
        let mask = 1u64 | 1 << 0x04 | 1 << 0x05 | 1 << 0x10 | 1 << 0x11 | 1 << 0x14;
        let eqn = create_eq(&mut d, uar, 6, mask, 0);
        let pd = be32(&d.ok(&cmd_in(0x800, 0, 16), 16), 8) & 0xff_ffff;
        // GID 0: fe80::EUI-64(MAC), RoCEv2, IPv6.
        let gid = gid_of(mac);
        let mut s = cmd_in(0x761, 0, set_roce_address_in::SIZE_BYTES);
        let a = &mut s[set_roce_address_in::ROCE_ADDRESS.off / 8..];
        a[..16].copy_from_slice(&gid);
        roce_addr_layout::SOURCE_MAC_47_32.set(a, mac >> 32);
        roce_addr_layout::SOURCE_MAC_31_0.set(a, mac & 0xffff_ffff);
        roce_addr_layout::ROCE_VERSION.set(a, 2);
        roce_addr_layout::ROCE_L3_TYPE.set(a, 1);
        d.ok(&s, 16);
        let data = DmaBuffer::new(DATA_LEN).unwrap();
        d.f.dma_map(Iova(DATA_IOVA), &data).unwrap();
        let dbr = DmaBuffer::new(4096).unwrap();
        d.f.dma_map(Iova(DBR_IOVA), &dbr).unwrap();
        let mut n = Self {
            d,
            uar,
            pd,
            eqn,
            data,
            lkey: 0,
            cq: vec![],
            dbr,
            qbufs: vec![],
            next_dbr: 0,
            gid,
        };
        n.lkey = n.mkey(n.pd, 0x7f, 0, DATA_LEN as u64, 0x42);
        n
    }

    /// An MTT mkey over `[off, off + len)` of the data buffer; `acc` is
    /// the mkc bits a|rw|rr|lw|lr (bit 4..0).
    fn mkey(&mut self, pd: u32, acc: u8, off: u64, len: u64, key: u8) -> u32 {
        let pages = (len as usize).div_ceil(4096);
        let mut c = cmd_in(
            0x200,
            0,
            create_mkey_in::SIZE_BYTES + pages.next_multiple_of(2) * 8,
        );
        let m = &mut c[0x10..0x50];
        mkc::ACCESS_MODE_1_0.set(m, mlx5_hw::wqe::MKC_ACCESS_MODE_MTT.into());
        mkc::A.set(m, u64::from(acc >> 4 & 1));
        mkc::RW.set(m, u64::from(acc >> 3 & 1));
        mkc::RR.set(m, u64::from(acc >> 2 & 1));
        mkc::LW.set(m, u64::from(acc >> 1 & 1));
        mkc::LR.set(m, u64::from(acc & 1));
        mkc::QPN.set(m, 0xff_ffff);
        mkc::MKEY_7_0.set(m, u64::from(key));
        mkc::PD.set(m, u64::from(pd));
        mkc::START_ADDR.set(m, DATA_VA + off);
        mkc::LEN.set(m, len);
        mkc::LOG_PAGE_SIZE.set(m, 12);
        mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, pages.div_ceil(2) as u64);
        create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.set(&mut c, pages.div_ceil(2) as u64);
        for i in 0..pages {
            let at = create_mkey_in::SIZE_BYTES + i * 8;
            c[at..at + 8].copy_from_slice(&(DATA_IOVA + off + i as u64 * 4096).to_be_bytes());
        }
        let idx = be32(&self.d.ok(&c, 16), 8) & 0xff_ffff;
        idx << 8 | u32::from(key)
    }

    fn create_cq(&mut self) -> usize {
        let i = self.cq.len();
        let buf = DmaBuffer::new(64 << LOG_CQ).unwrap();
        for k in 0..(1usize << LOG_CQ) {
            buf.write(k * 64 + 63, &[0xf0]).unwrap();
        }
        let iova = CQ_IOVA + i as u64 * 0x10_0000;
        self.d.f.dma_map(Iova(iova), &buf).unwrap();
        let dbr = self.alloc_dbr();
        let npas = (64usize << LOG_CQ) / 4096;
        let mut c = cmd_in(0x400, 0, create_cq_in::SIZE_BYTES + npas * 8);
        let x = &mut c[0x10..0x50];
        cqc::LOG_CQ_SIZE.set(x, u64::from(LOG_CQ));
        cqc::UAR_PAGE.set(x, u64::from(self.uar));
        cqc::C_EQN_OR_APU_ELEMENT.set(x, u64::from(self.eqn));
        cqc::DBR_ADDR.set(x, DBR_IOVA + dbr as u64);
        for p in 0..npas {
            let at = create_cq_in::SIZE_BYTES + p * 8;
            c[at..at + 8].copy_from_slice(&(iova + p as u64 * 4096).to_be_bytes());
        }
        let cqn = be32(&self.d.ok(&c, 16), 8) & 0xff_ffff;
        self.cq.push((cqn, buf, 0, dbr));
        i
    }

    fn alloc_dbr(&mut self) -> usize {
        let d = self.next_dbr;
        self.next_dbr += 64;
        d
    }

    fn create_qp(&mut self, st: u8, scq: usize, rcq: usize, srqn: Option<u32>) -> Q {
        self.create_qp_with(st, scq, rcq, srqn, |_| {})
    }

    /// [`create_qp`](Self::create_qp) with a send queue of `1 << log_sq`
    /// basic blocks.
    fn create_qp_sized(&mut self, st: u8, scq: usize, rcq: usize, log_sq: u8) -> Q {
        self.create_qp_in(st, scq, rcq, None, log_sq, |_| {})
    }

    /// [`create_qp`](Self::create_qp), `more` setting further QPC fields.
    fn create_qp_with(
        &mut self,
        st: u8,
        scq: usize,
        rcq: usize,
        srqn: Option<u32>,
        more: impl FnOnce(&mut [u8]),
    ) -> Q {
        self.create_qp_in(st, scq, rcq, srqn, LOG_SQ, more)
    }

    fn create_qp_in(
        &mut self,
        st: u8,
        scq: usize,
        rcq: usize,
        srqn: Option<u32>,
        log_sq: u8,
        more: impl FnOnce(&mut [u8]),
    ) -> Q {
        let i = self.qbufs.len();
        let rq_bytes = if srqn.is_some() {
            0
        } else {
            RQ_STRIDE << LOG_RQ
        };
        let size = rq_bytes + (64 << log_sq);
        let buf = DmaBuffer::new(size.next_multiple_of(4096)).unwrap();
        let iova = QP_IOVA + i as u64 * 0x10_0000;
        self.d.f.dma_map(Iova(iova), &buf).unwrap();
        let npas = size.div_ceil(4096);
        let dbr = self.alloc_dbr();
        let mut c = cmd_in(0x500, 0, create_qp_in::SIZE_BYTES + npas * 8);
        let x = &mut c[create_qp_in::QPC.off / 8..];
        qpc::ST.set(x, u64::from(st));
        qpc::PD.set(x, u64::from(self.pd));
        qpc::LOG_RQ_SIZE.set(x, u64::from(LOG_RQ));
        qpc::LOG_RQ_STRIDE.set(x, (RQ_STRIDE.trailing_zeros() - 4) as u64);
        qpc::LOG_SQ_SIZE.set(x, u64::from(log_sq));
        qpc::UAR_PAGE.set(x, u64::from(self.uar));
        qpc::CQN_SND.set(x, u64::from(self.cq[scq].0));
        qpc::CQN_RCV.set(x, u64::from(self.cq[rcq].0));
        qpc::DBR_ADDR.set(x, DBR_IOVA + dbr as u64);
        if let Some(s) = srqn {
            qpc::RQ_TYPE.set(x, 1);
            qpc::SRQN_RMPN_XRQN.set(x, u64::from(s));
            qpc::USER_INDEX.set(x, u64::from(SRQ_QP_UIDX));
        }
        more(x);
        for p in 0..npas {
            let at = create_qp_in::SIZE_BYTES + p * 8;
            c[at..at + 8].copy_from_slice(&(iova + p as u64 * 4096).to_be_bytes());
        }
        let qpn = be32(&self.d.ok(&c, 16), 8) & 0xff_ffff;
        self.qbufs.push(buf.clone());
        Q {
            qpn,
            buf,
            dbr,
            sq_pi: 0,
            rq_pi: 0,
            log_sq,
        }
    }

    fn modify(&mut self, op: u16, q: &Q, f: impl FnOnce(&mut [u8], &mut u32)) -> Vec<u8> {
        let mut c = cmd_in(op, 0, create_qp_in::QPC.off / 8 + qpc::SIZE_BYTES + 16);
        c[8..12].copy_from_slice(&q.qpn.to_be_bytes());
        let mut mask = 0u32;
        f(&mut c[create_qp_in::QPC.off / 8..], &mut mask);
        c[0x10..0x14].copy_from_slice(&mask.to_be_bytes());
        self.d.exec(&c, 16)
    }

    /// RST -> INIT -> RTR -> RTS toward `peer_gid`/`peer_qpn`.
    fn connect(&mut self, q: &Q, peer_gid: [u8; 16], peer_qpn: u32, mtu: u8, ud: bool) {
        let pa = qpc::PRIMARY_ADDRESS_PATH.off / 8;
        let o = self.modify(0x502, q, |x, _| {
            qpc::RRE.set(x, 1);
            qpc::RWE.set(x, 1);
            qpc::RAE.set(x, 1);
            qpc::Q_KEY.set(x, 0x1111_1111);
            ads::VHCA_PORT_NUM.set(&mut x[pa..], 1);
        });
        assert_eq!(o[0], 0, "RST2INIT");
        let o = self.modify(0x503, q, |x, _| {
            qpc::MTU.set(x, u64::from(mtu));
            qpc::REMOTE_QPN.set(x, u64::from(peer_qpn));
            qpc::NEXT_RCV_PSN.set(x, 0x100);
            qpc::MIN_RNR_NAK.set(x, 1);
            let a = &mut x[pa..];
            a[ads::RGID_RIP.off / 8..ads::RGID_RIP.off / 8 + 16].copy_from_slice(&peer_gid);
            ads::HOP_LIMIT.set(a, 64);
        });
        assert_eq!(o[0], 0, "INIT2RTR");
        let o = self.modify(0x504, q, |x, _| {
            qpc::NEXT_SEND_PSN.set(x, 0x100);
            qpc::RETRY_COUNT.set(x, 3);
            qpc::RNR_RETRY.set(x, 2);
            ads::ACK_TIMEOUT.set(&mut x[pa..], 8);
        });
        assert_eq!(o[0], 0, "RTR2RTS");
        let _ = ud;
    }

    /// Writes a send WQE of `segs` (after the control segment) and rings.
    fn post_send(&mut self, q: &mut Q, opcode: u8, imm: u32, segs: &[u8], signaled: bool) -> u16 {
        let (idx, ctrl) = self.write_send(q, opcode, imm, segs, signaled);
        self.ring(q, &ctrl);
        idx
    }

    /// Rings the send doorbell once for everything written so far
    /// (`ctrl`: the first 8 bytes of the last WQE).
    fn ring(&mut self, q: &Q, ctrl: &[u8; 8]) {
        self.dbr
            .write_u32_be(q.dbr + 4, u32::from(q.sq_pi))
            .unwrap();
        let bar = self.d.f.model().bar0();
        bar.write((self.uar as usize) << 12 | 0x800, ctrl).unwrap();
    }

    /// Writes a send WQE without ringing; returns its index and the first
    /// 8 bytes of its control segment.
    fn write_send(
        &mut self,
        q: &mut Q,
        opcode: u8,
        imm: u32,
        segs: &[u8],
        signaled: bool,
    ) -> (u16, [u8; 8]) {
        let ds = 1 + segs.len() / 16;
        let nbb = ds.div_ceil(4) as u16;
        let idx = q.sq_pi;
        let mut w = vec![0u8; nbb as usize * 64];
        w[0..4].copy_from_slice(&(u32::from(idx) << 8 | u32::from(opcode)).to_be_bytes());
        w[4..8].copy_from_slice(&(q.qpn << 8 | ds as u32).to_be_bytes());
        w[11] = if signaled { 0x08 } else { 0 };
        w[12..16].copy_from_slice(&imm.to_be_bytes());
        w[16..16 + segs.len()].copy_from_slice(segs);
        let sq_off = if q.buf.len() >= (RQ_STRIDE << LOG_RQ) + (64 << q.log_sq) {
            RQ_STRIDE << LOG_RQ
        } else {
            0
        };
        for b in 0..nbb {
            let slot = usize::from(idx.wrapping_add(b)) & ((1 << q.log_sq) - 1);
            q.buf
                .write(
                    sq_off + slot * 64,
                    &w[b as usize * 64..(b as usize + 1) * 64],
                )
                .unwrap();
        }
        q.sq_pi = q.sq_pi.wrapping_add(nbb);
        let mut ctrl = [0u8; 8];
        ctrl.copy_from_slice(&w[..8]);
        (idx, ctrl)
    }

    fn post_recv(&mut self, q: &mut Q, addr: u64, len: u32) {
        let slot = usize::from(q.rq_pi) & ((1 << LOG_RQ) - 1);
        let mut w = [0u8; RQ_STRIDE];
        w[0..4].copy_from_slice(&len.to_be_bytes());
        w[4..8].copy_from_slice(&self.lkey.to_be_bytes());
        w[8..16].copy_from_slice(&addr.to_be_bytes());
        w[20..24].copy_from_slice(&0x100u32.to_be_bytes());
        q.buf.write(slot * RQ_STRIDE, &w).unwrap();
        q.rq_pi = q.rq_pi.wrapping_add(1);
        self.dbr.write_u32_be(q.dbr, u32::from(q.rq_pi)).unwrap();
    }

    /// Waits for the next CQE of CQ `i`; returns its 64 bytes.
    fn poll(&mut self, i: usize) -> [u8; 64] {
        self.try_poll(i, HANG_GUARD).expect("no CQE")
    }

    fn try_poll(&mut self, i: usize, wait: Duration) -> Option<[u8; 64]> {
        let (_, buf, ci, dbr) = &mut self.cq[i];
        let dbr = *dbr;
        let slot = (*ci as usize) & ((1 << LOG_CQ) - 1);
        let parity = ((*ci >> LOG_CQ) & 1) as u8;
        let t = Instant::now();
        loop {
            let op = buf.load_u8_acquire(slot * 64 + 63).unwrap();
            if op >> 4 != 0xf && op & 1 == parity {
                break;
            }
            if t.elapsed() > wait {
                return None;
            }
            std::thread::yield_now();
        }
        let mut e = [0u8; 64];
        buf.read(slot * 64, &mut e).unwrap();
        *ci += 1;
        let v = *ci & 0xff_ffff;
        self.dbr.write_u32_be(dbr, v).unwrap();
        Some(e)
    }
}

fn data_seg(len: u32, lkey: u32, va: u64) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..4].copy_from_slice(&len.to_be_bytes());
    s[4..8].copy_from_slice(&lkey.to_be_bytes());
    s[8..16].copy_from_slice(&va.to_be_bytes());
    s
}

fn raddr_seg(va: u64, rkey: u32) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[0..8].copy_from_slice(&va.to_be_bytes());
    s[8..12].copy_from_slice(&rkey.to_be_bytes());
    s
}

fn opcode(e: &[u8; 64]) -> u8 {
    e[63] >> 4
}

fn pair() -> (Fabric, Node, Node) {
    pair_of(Fabric::cabled(2, Profile::ConnectX4Lx))
}

fn pair_of(f: Fabric) -> (Fabric, Node, Node) {
    let a = Node::new(f.function(0).unwrap());
    let b = Node::new(f.function(1).unwrap());
    (f, a, b)
}

/// Two RC QPs connected across the fabric, CQs 0 (send) and 1 (recv) on each side.
fn rc_pair(mtu: u8) -> (Fabric, Node, Node, Q, Q) {
    rc_pair_of(pair(), mtu)
}

/// [`rc_pair`] on `clock`: retry timers wait until the test moves it.
fn rc_pair_on(clock: &Arc<ManualClock>, mtu: u8) -> (Fabric, Node, Node, Q, Q) {
    let cfg = DeviceConfig {
        fw_start: Duration::ZERO,
        clock: clock.shared(),
        ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
    };
    rc_pair_of(pair_of(Fabric::cabled_as(2, &cfg)), mtu)
}

/// Once a send queue waits for its retry timer, moves `clock` to it;
/// returns how long the timer was (the clock moves for nothing else).
fn next_retry(clock: &ManualClock) -> Duration {
    let before = clock.now();
    clock.advance_to_armed(RETRY_DEADLINE, HANG_GUARD) - before
}

/// The RNR timer a's QPs get from b's min_rnr_nak (1: 0.01 ms).
const RNR_TIMER: Duration = Duration::from_micros(10);
/// The local ACK timeout of `connect` (ack_timeout 8): 4.096 µs << 8.
const ACK_TIMEOUT: Duration = Duration::from_nanos(4096 << 8);

fn rc_pair_of((f, mut a, mut b): (Fabric, Node, Node), mtu: u8) -> (Fabric, Node, Node, Q, Q) {
    for n in [&mut a, &mut b] {
        n.create_cq();
        n.create_cq();
    }
    let qa = a.create_qp(0, 0, 1, None);
    let qb = b.create_qp(0, 0, 1, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&qa, gb, qb.qpn, mtu, false);
    b.connect(&qb, ga, qa.qpn, mtu, false);
    (f, a, b, qa, qb)
}

fn fill(n: &Node, off: usize, len: usize, seed: u8) -> Vec<u8> {
    let v: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    n.data.write(off, &v).unwrap();
    v
}

fn read(n: &Node, off: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    n.data.read(off, &mut v).unwrap();
    v
}

#[test]
fn rc_send_write_read_atomics() {
    let (_f, mut a, mut b, mut qa, mut qb) = rc_pair(3); // MTU 1024: multi-packet
                                                         // SEND of 3000 bytes (3 packets) into a 4096-byte receive.
    let msg = fill(&a, 0, 3000, 1);
    b.post_recv(&mut qb, DATA_VA + 0x1_0000, 4096);
    let seg = data_seg(3000, a.lkey, DATA_VA);
    let idx = a.post_send(&mut qa, 0x0a, 0, &seg, true);
    let e = a.poll(0);
    assert_eq!(opcode(&e), 0, "REQ");
    assert_eq!(u16::from_be_bytes([e[0x3c], e[0x3d]]), idx);
    assert_eq!(be32(&e, 0x38) & 0xff_ffff, qa.qpn);
    assert_eq!(e[0x38], 0x0a);
    let r = b.poll(1);
    assert_eq!(opcode(&r), 2, "RESP_SEND");
    assert_eq!(be32(&r, 0x2c), 3000);
    assert_eq!(be32(&r, 0x18) & 0xff_ffff, qa.qpn);
    assert_eq!(be32(&r, 0x38) & 0xff_ffff, qb.qpn);
    assert_eq!(read(&b, 0x1_0000, 3000), msg);
    // SEND with immediate, inline data.
    b.post_recv(&mut qb, DATA_VA + 0x2_0000, 64);
    let mut inl = [0u8; 16];
    inl[0..4].copy_from_slice(&(0x8000_0000u32 | 11).to_be_bytes());
    inl[4..15].copy_from_slice(b"inline-data");
    a.post_send(&mut qa, 0x0b, 0xdead_beef, &inl, true);
    let e = a.poll(0);
    assert_eq!(opcode(&e), 0, "{:02x?}", &e[0x30..]);
    let r = b.poll(1);
    assert_eq!(opcode(&r), 3, "RESP_SEND_IMM");
    assert_eq!(be32(&r, 0x24), 0xdead_beef);
    assert_eq!(be32(&r, 0x2c), 11);
    assert_eq!(read(&b, 0x2_0000, 11), b"inline-data");
    // RDMA WRITE of 5000 bytes, unsignaled, then a signaled WRITE_IMM.
    let w = fill(&a, 0x3_0000, 5000, 7);
    let mut segs = raddr_seg(DATA_VA + 0x4_0000, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(5000, a.lkey, DATA_VA + 0x3_0000));
    a.post_send(&mut qa, 0x08, 0, &segs, false);
    b.post_recv(&mut qb, DATA_VA + 0x2_0000, 64);
    let mut segs = raddr_seg(DATA_VA + 0x5_0000, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(100, a.lkey, DATA_VA + 0x3_0000));
    a.post_send(&mut qa, 0x09, 0x1234_5678, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x38]), (0, 0x09));
    assert_eq!(read(&b, 0x4_0000, 5000), w);
    assert_eq!(read(&b, 0x5_0000, 100), w[..100].to_vec());
    let r = b.poll(1);
    assert_eq!(opcode(&r), 1, "RESP_WR_IMM");
    assert_eq!((be32(&r, 0x24), be32(&r, 0x2c)), (0x1234_5678, 100));
    // RDMA READ of 2500 bytes into a's memory.
    let src = fill(&b, 0x6_0000, 2500, 9);
    let mut segs = raddr_seg(DATA_VA + 0x6_0000, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(2500, a.lkey, DATA_VA + 0x7_0000));
    a.post_send(&mut qa, 0x10, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x38], be32(&e, 0x2c)), (0, 0x10, 2500));
    assert_eq!(read(&a, 0x7_0000, 2500), src);
    // Atomics: big-endian 8 bytes; CS then FA return the old value.
    b.data.write(0x8_0000, &100u64.to_be_bytes()).unwrap();
    let mut segs = raddr_seg(DATA_VA + 0x8_0000, b.lkey).to_vec();
    segs.extend_from_slice(&500u64.to_be_bytes());
    segs.extend_from_slice(&100u64.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA + 0x9_0000));
    a.post_send(&mut qa, 0x11, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x38], be32(&e, 0x2c)), (0, 0x11, 8));
    assert_eq!(read(&a, 0x9_0000, 8), 100u64.to_be_bytes());
    assert_eq!(read(&b, 0x8_0000, 8), 500u64.to_be_bytes());
    let mut segs = raddr_seg(DATA_VA + 0x8_0000, b.lkey).to_vec();
    segs.extend_from_slice(&7u64.to_be_bytes());
    segs.extend_from_slice(&0u64.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA + 0x9_0008));
    a.post_send(&mut qa, 0x12, 0, &segs, true);
    a.poll(0);
    assert_eq!(read(&a, 0x9_0008, 8), 500u64.to_be_bytes());
    assert_eq!(read(&b, 0x8_0000, 8), 507u64.to_be_bytes());
    let s = a.d.f.model().stats();
    assert_eq!(s.error_cqes, 0);
    assert!(s.packets_sent >= 12, "{s:?}");
}

#[test]
fn rc_wire_check_carries_full_frames() {
    let (f, mut a, mut b, mut qa, mut qb) = rc_pair(5);
    f.set_wire_check(true);
    let msg = fill(&a, 0, 10_000, 3);
    b.post_recv(&mut qb, DATA_VA + 0x1_0000, 16_384);
    a.post_send(&mut qa, 0x0a, 0, &data_seg(10_000, a.lkey, DATA_VA), true);
    assert_eq!(opcode(&a.poll(0)), 0);
    let r = b.poll(1);
    assert_eq!((opcode(&r), be32(&r, 0x2c)), (2, 10_000));
    assert_eq!(read(&b, 0x1_0000, 10_000), msg);
    let src = fill(&b, 0x6_0000, 9000, 4);
    let mut segs = raddr_seg(DATA_VA + 0x6_0000, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(9000, a.lkey, DATA_VA + 0x7_0000));
    a.post_send(&mut qa, 0x10, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(read(&a, 0x7_0000, 9000), src);
}

#[test]
fn rc_errors_rnr_and_flush() {
    let clock = ManualClock::new();
    let (_f, mut a, _b, mut qa, _qb) = rc_pair_on(&clock, 5);
    // No receive posted: RNR NAKs (rnr_retry 2), each retried after the
    // RNR timer the NAK carries, then RNR_RETRY_EXC_ERR.
    a.post_send(&mut qa, 0x0a, 0, &data_seg(8, a.lkey, DATA_VA), true);
    for _ in 0..2 {
        assert_eq!(next_retry(&clock), RNR_TIMER);
    }
    let e = a.poll(0);
    assert_eq!(
        (opcode(&e), e[0x37]),
        (13, 0x16),
        "REQ_ERR, RNR retry exceeded"
    );
    assert_eq!(a.d.f.model().stats().retries, 2);
    // The QP is in error: the next WQE is flushed.
    a.post_send(&mut qa, 0x08, 0, &raddr_seg(0, 0), true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x05), "flushed");
    // b was never hurt: a fresh pair works; here check RNR then success.
    let (_f2, mut a, mut b2, mut qa, mut qb2) = rc_pair_on(&clock, 5);
    // rnr_retry 7: retry for ever (RTS2RTS with the RNR_RETRY mask bit).
    let o = a.modify(0x505, &qa, |x, m| {
        qpc::RNR_RETRY.set(x, 7);
        *m = 1 << 13;
    });
    assert_eq!(o[0], 0);
    a.post_send(&mut qa, 0x0a, 0, &data_seg(8, a.lkey, DATA_VA), true);
    // The first send and two retries are NAKed; the third retry waits.
    for _ in 0..2 {
        assert_eq!(next_retry(&clock), RNR_TIMER);
    }
    assert!(clock.wait_armed(RETRY_DEADLINE, HANG_GUARD).is_some());
    assert_eq!(a.d.f.model().stats().rnr_naks, 3);
    // A receive, and the retry goes through.
    b2.post_recv(&mut qb2, DATA_VA, 64);
    assert_eq!(next_retry(&clock), RNR_TIMER);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(opcode(&b2.poll(1)), 2);
    assert!(a.d.f.model().stats().rnr_naks >= 1);
    // Wrong rkey: REMOTE_ACCESS_ERR; b's QP goes to error with an async event.
    let mut segs = raddr_seg(DATA_VA, 0xbad00).to_vec();
    segs.extend_from_slice(&data_seg(16, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x13));
    // b's posted receives are flushed.
    b2.post_recv(&mut qb2, DATA_VA, 64);
    let r = b2.poll(1);
    assert_eq!((opcode(&r), r[0x37]), (14, 0x05));
    // Local protection: bad lkey on a fresh pair.
    let (_f3, mut a, _b3, mut qa, _qb3) = rc_pair(5);
    let mut segs = raddr_seg(DATA_VA, 0).to_vec();
    segs.extend_from_slice(&data_seg(16, 0x7777_7700, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x04));
    // Receive too small: requester REMOTE_INVAL_REQ, responder LOCAL_LENGTH.
    let (_f4, mut a, mut b, mut qa, mut qb) = rc_pair(5);
    b.post_recv(&mut qb, DATA_VA, 16);
    a.post_send(&mut qa, 0x0a, 0, &data_seg(100, a.lkey, DATA_VA), true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x12));
    let r = b.poll(1);
    assert_eq!((opcode(&r), r[0x37]), (14, 0x01));
    // Remote write to a read-only key: REMOTE_ACCESS.
    let ro = b.mkey(b.pd, 0b00101, 0x10_0000, 4096, 0x11);
    let mut segs = raddr_seg(DATA_VA + 0x10_0000, ro).to_vec();
    segs.extend_from_slice(&data_seg(16, a.lkey, DATA_VA));
    let (_f5, mut a2, mut b5, mut qa2, _qb5) = rc_pair(5);
    let ro5 = b5.mkey(b5.pd, 0b00101, 0x10_0000, 4096, 0x11);
    let mut segs5 = raddr_seg(DATA_VA + 0x10_0000, ro5).to_vec();
    segs5.extend_from_slice(&data_seg(16, a2.lkey, DATA_VA));
    a2.post_send(&mut qa2, 0x08, 0, &segs5, true);
    assert_eq!(a2.poll(0)[0x37], 0x13);
    let _ = (segs, &mut qa, &mut b5.cq);
}

#[test]
fn transport_retry_exceeded_when_nobody_answers() {
    let clock = ManualClock::new();
    let (f, mut a, _b, mut qa, _qb) = rc_pair_on(&clock, 5);
    f.drop_packets(100);
    let mut segs = raddr_seg(DATA_VA, _b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(16, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    // retry_count 3: the send and three resends, each after the ACK
    // timeout, then TRANSPORT_RETRY_EXC_ERR.
    for _ in 0..3 {
        assert_eq!(next_retry(&clock), ACK_TIMEOUT);
    }
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x15));
    assert_eq!(a.d.f.model().stats().retries, 3);
}

/// `n` RDMA WRITEs of 100 bytes each, a's `DATA_VA + 0x2_0000 + i * 0x1000`
/// to b's `DATA_VA + 0x4_0000 + i * 0x1000`, posted with one doorbell; the
/// WRITE numbered `bad` (if any) names a wrong rkey. Every WRITE is
/// signaled. Returns the source data.
fn write_burst(a: &mut Node, b: &Node, qa: &mut Q, n: usize, bad: Option<usize>) -> Vec<Vec<u8>> {
    let mut data = vec![];
    let mut ctrl = [0u8; 8];
    for i in 0..n {
        data.push(fill(a, 0x2_0000 + i * 0x1000, 100, i as u8));
        let rkey = if Some(i) == bad { 0xbad00 } else { b.lkey };
        let mut segs = raddr_seg(DATA_VA + 0x4_0000 + i as u64 * 0x1000, rkey).to_vec();
        segs.extend_from_slice(&data_seg(
            100,
            a.lkey,
            DATA_VA + 0x2_0000 + i as u64 * 0x1000,
        ));
        ctrl = a.write_send(qa, 0x08, 0, &segs, true).1;
    }
    a.ring(qa, &ctrl);
    data
}

#[test]
fn rc_coalesced_acks_complete_every_wqe_in_order() {
    for check in [false, true] {
        let (f, mut a, b, mut qa, _qb) = rc_pair(5);
        f.set_wire_check(check);
        let data = write_burst(&mut a, &b, &mut qa, 40, None);
        for (i, d) in data.iter().enumerate() {
            let e = a.poll(0);
            assert_eq!(
                (opcode(&e), e[0x3c..0x3e].to_vec()),
                (0, (i as u16).to_be_bytes().to_vec()),
                "CQE {i}"
            );
            assert_eq!(
                &read(&b, 0x4_0000 + i * 0x1000, 100),
                d,
                "WRITE {i} (wire check {check})"
            );
        }
        let s = a.d.f.model().stats();
        assert_eq!(s.messages_sent, 40);
        // One burst of 40 messages: a single coalesced ACK.
        assert_eq!(s.acks, 1, "{s:?}");
        assert_eq!(b.d.f.model().stats().messages_received, 40);
    }
}

/// A SEND that completes a receive is acknowledged when its CQE is
/// written, not at the burst's end: a consumer may destroy the QP on
/// seeing the CQE (ibv_rc_pingpong's client after its last receive), and
/// an ACK still owed then would never go (the requester retries into
/// RETRY_EXC_ERR). WRITEs in the same burst still share one ACK.
#[test]
fn rc_sends_are_acknowledged_with_their_receive_cqes() {
    let (_f, mut a, mut b, mut qa, mut qb) = rc_pair(5);
    for i in 0..6u64 {
        b.post_recv(&mut qb, DATA_VA + 0x1_0000 + i * 0x100, 0x100);
    }
    let mut ctrl = [0u8; 8];
    for i in 0..6u64 {
        ctrl = a
            .write_send(
                &mut qa,
                0x0a,
                0,
                &data_seg(64, a.lkey, DATA_VA + i * 64),
                true,
            )
            .1;
    }
    a.ring(&qa, &ctrl);
    for _ in 0..6 {
        assert_eq!(opcode(&a.poll(0)), 0);
        assert_eq!(opcode(&b.poll(1)), 2);
    }
    let s = a.d.f.model().stats();
    assert_eq!((s.messages_sent, s.acks), (6, 6), "{s:?}");
    write_burst(&mut a, &b, &mut qa, 10, None);
    for _ in 0..10 {
        assert_eq!(opcode(&a.poll(0)), 0);
    }
    assert_eq!(a.d.f.model().stats().acks, 7);
}

/// Two RC QPs as [`rc_pair`] makes them, a's send queue `1 << log_sq`
/// basic blocks.
fn rc_pair_sized(mtu: u8, log_sq: u8) -> (Fabric, Node, Node, Q, Q) {
    let (f, mut a, mut b) = pair();
    for n in [&mut a, &mut b] {
        n.create_cq();
        n.create_cq();
    }
    let qa = a.create_qp_sized(0, 0, 1, log_sq);
    let qb = b.create_qp(0, 0, 1, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&qa, gb, qb.qpn, mtu, false);
    b.connect(&qb, ga, qa.qpn, mtu, false);
    (f, a, b, qa, qb)
}

/// An inline data segment of `data` (its byte count with `INLINE_SEG`,
/// the bytes, padding to 16).
fn inline_seg(data: &[u8]) -> Vec<u8> {
    let mut s = (data.len() as u32 | mlx5_hw::wqe::INLINE_SEG)
        .to_be_bytes()
        .to_vec();
    s.extend_from_slice(data);
    s.resize(s.len().next_multiple_of(16), 0);
    s
}

/// A long burst of one-packet WRITEs (226 of the queue's 256 basic
/// blocks) after a two-packet one: the
/// responder owes an ACK for each and sends one every 64 owed, the last
/// when the burst ends; every WRITE lands and completes in order, its
/// data inline or in memory, and every packet is counted. The same with
/// every packet through the full frame encoding.
#[test]
fn rc_write_bursts_are_acknowledged_every_64_messages() {
    for check in [false, true] {
        let (f, mut a, b, mut qa, _qb) = rc_pair_sized(1, 8); // MTU 256
        f.set_wire_check(check);
        let first = fill(&a, 0x1_0000, 300, 0xee);
        let mut segs = raddr_seg(DATA_VA + 0x3_0000, b.lkey).to_vec();
        segs.extend_from_slice(&data_seg(300, a.lkey, DATA_VA + 0x1_0000));
        let (first_idx, mut ctrl) = a.write_send(&mut qa, 0x08, 0, &segs, true);
        let mut idx = vec![first_idx];
        let mut data = vec![];
        for i in 1..=150usize {
            let d = fill(&a, 0x2_0000 + i * 0x100, 40, i as u8);
            let mut segs = raddr_seg(DATA_VA + 0x4_0000 + i as u64 * 0x100, b.lkey).to_vec();
            if i % 2 == 0 {
                segs.extend_from_slice(&inline_seg(&d));
            } else {
                let va = DATA_VA + 0x2_0000 + i as u64 * 0x100;
                segs.extend_from_slice(&data_seg(40, a.lkey, va));
            }
            let (at, c) = a.write_send(&mut qa, 0x08, 0, &segs, true);
            idx.push(at);
            ctrl = c;
            data.push(d);
        }
        a.ring(&qa, &ctrl);
        for (n, i) in idx.iter().enumerate() {
            let e = a.poll(0);
            assert_eq!((opcode(&e), be16(&e, 0x3c)), (0, *i), "CQE {n} ({check})");
        }
        assert_eq!(read(&b, 0x3_0000, 300), first);
        for (i, d) in data.iter().enumerate() {
            let at = 0x4_0000 + (i + 1) * 0x100;
            assert_eq!(&read(&b, at, 40), d, "WRITE {} ({check})", i + 1);
        }
        let (sa, sb) = (a.d.f.model().stats(), b.d.f.model().stats());
        assert_eq!(
            (sa.messages_sent, sa.packets_sent, sa.bytes_sent, sa.acks),
            (151, 152, 300 + 150 * 40, 3),
            "{sa:?}"
        );
        assert_eq!(
            (sb.messages_received, sb.packets_received),
            (151, 152),
            "{sb:?}"
        );
    }
}

/// Inline WRITEs of three basic blocks, one inline segment or two, and
/// WRITEs from memory, in bursts whose WQEs run around the send queue's
/// end: each lands as posted.
#[test]
fn rc_inline_writes_around_the_ring_end() {
    let (_f, mut a, b, mut qa, _qb) = rc_pair(5);
    let mut n = 0usize;
    for burst in 0..4 {
        let mut ctrl = [0u8; 8];
        let mut data = vec![];
        for _ in 0..20 {
            let d = fill(&a, 0x2_0000 + n * 0x100, 100, n as u8);
            let mut segs = raddr_seg(DATA_VA + 0x4_0000 + n as u64 * 0x100, b.lkey).to_vec();
            match n % 3 {
                0 => segs.extend_from_slice(&inline_seg(&d)),
                1 => {
                    segs.extend_from_slice(&inline_seg(&d[..40]));
                    segs.extend_from_slice(&inline_seg(&d[40..]));
                }
                _ => {
                    let va = DATA_VA + 0x2_0000 + n as u64 * 0x100;
                    segs.extend_from_slice(&data_seg(100, a.lkey, va));
                }
            }
            ctrl = a.write_send(&mut qa, 0x08, 0, &segs, n % 7 == 6).1;
            data.push((n, d));
            n += 1;
        }
        a.ring(&qa, &ctrl);
        // The burst's last WQE is signaled: its CQE says all landed.
        let last = a.write_send(&mut qa, 0x00, 0, &[], true);
        a.ring(&qa, &last.1);
        while be16(&a.poll(0), 0x3c) != last.0 {}
        for (i, d) in &data {
            let at = 0x4_0000 + i * 0x100;
            assert_eq!(&read(&b, at, 100), d, "WRITE {i} (burst {burst})");
        }
    }
    assert_eq!(a.d.f.model().stats().messages_sent, 84);
    assert_eq!(b.d.f.model().stats().messages_received, 80);
}

/// One-packet WRITEs of one burst, some of them odd: empty (an inline
/// segment of no bytes), longer than the MTU, with a bad lkey. Each
/// completes as it would alone, in order: the empty one and the long one
/// with their lengths, the bad lkey with a local protection error, after
/// which the QP is in error and the rest are flushed.
#[test]
fn rc_odd_writes_in_a_burst_complete_as_alone() {
    let (_f, mut a, b, mut qa, _qb) = rc_pair(1); // MTU 256
    let d = fill(&a, 0x2_0000, 1000, 5);
    let to = |i: u64| raddr_seg(DATA_VA + 0x4_0000 + i * 0x1000, b.lkey).to_vec();
    let mut wqes = vec![];
    let mut w = to(0);
    w.extend_from_slice(&data_seg(100, a.lkey, DATA_VA + 0x2_0000));
    wqes.push(w);
    let mut w = to(1);
    w.extend_from_slice(&inline_seg(&[]));
    wqes.push(w);
    let mut w = to(2);
    w.extend_from_slice(&inline_seg(&d[..200]));
    wqes.push(w);
    let mut w = to(3);
    w.extend_from_slice(&data_seg(1000, a.lkey, DATA_VA + 0x2_0000));
    wqes.push(w);
    let mut w = to(4);
    w.extend_from_slice(&data_seg(50, a.lkey, DATA_VA + 0x2_0000));
    wqes.push(w);
    let mut w = to(5);
    w.extend_from_slice(&data_seg(50, 0xbad00, DATA_VA + 0x2_0000));
    wqes.push(w);
    for i in 6..9 {
        let mut w = to(i);
        w.extend_from_slice(&data_seg(50, a.lkey, DATA_VA + 0x2_0000));
        wqes.push(w);
    }
    let mut ctrl = [0u8; 8];
    let mut idx = vec![];
    for w in &wqes {
        let (at, c) = a.write_send(&mut qa, 0x08, 0, w, true);
        idx.push(at);
        ctrl = c;
    }
    a.ring(&qa, &ctrl);
    for (n, len) in [100, 0, 200, 1000, 50].into_iter().enumerate() {
        let e = a.poll(0);
        assert_eq!(
            (opcode(&e), be16(&e, 0x3c), be32(&e, 0x2c)),
            (0, idx[n], len),
            "WRITE {n}"
        );
    }
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37], be16(&e, 0x3c)), (13, 0x04, idx[5]));
    for &i in &idx[6..] {
        let e = a.poll(0);
        assert_eq!(
            (opcode(&e), e[0x37], be16(&e, 0x3c)),
            (13, 0x05, i),
            "flushed"
        );
    }
    assert_eq!(read(&b, 0x4_0000, 100), d[..100]);
    assert_eq!(read(&b, 0x4_2000, 200), d[..200]);
    assert_eq!(read(&b, 0x4_3000, 1000), d);
    assert_eq!(read(&b, 0x4_4000, 50), d[..50]);
    assert_eq!(read(&b, 0x4_5000, 50), vec![0; 50]);
    let s = b.d.f.model().stats();
    // The 1000 bytes are four packets.
    assert_eq!((s.messages_received, s.packets_received), (5, 8), "{s:?}");
}

#[test]
fn rc_nak_in_a_coalesced_run() {
    let (_f, mut a, b, mut qa, _qb) = rc_pair(5);
    write_burst(&mut a, &b, &mut qa, 9, Some(5));
    // The five before the bad rkey complete, in order, as the NAK
    // acknowledges them; the bad one fails; the rest are flushed.
    for i in 0..5u16 {
        let e = a.poll(0);
        assert_eq!((opcode(&e), be16(&e, 0x3c)), (0, i));
    }
    let e = a.poll(0);
    assert_eq!(
        (opcode(&e), e[0x37], be16(&e, 0x3c)),
        (13, 0x13, 5),
        "remote access"
    );
    for i in 6..9u16 {
        let e = a.poll(0);
        assert_eq!(
            (opcode(&e), e[0x37], be16(&e, 0x3c)),
            (13, 0x05, i),
            "flushed"
        );
    }
    assert_eq!(a.d.f.model().stats().acks, 0, "the NAK acknowledged them");
}

#[test]
fn rc_lost_packet_in_a_coalesced_run_is_resent() {
    let clock = ManualClock::new();
    let (f, mut a, b, mut qa, _qb) = rc_pair_on(&clock, 5);
    let t0 = clock.now();
    // The first WRITE is lost: the second is NAKed (PSN sequence error),
    // and the requester goes back to the first at once (IBA 9.7.5.1.3),
    // not after the ACK timeout: every WRITE completes while the clock
    // stands still, and no retry waits for a later time.
    f.drop_packets(1);
    let data = write_burst(&mut a, &b, &mut qa, 6, None);
    let mut cqes = Vec::new();
    until("every WRITE completed", || {
        let later: Vec<_> = clock
            .armed()
            .into_iter()
            .filter(|(at, what)| *at > t0 && what.contains(RETRY_DEADLINE))
            .collect();
        assert!(later.is_empty(), "the resend waits for a timer: {later:?}");
        while let Some(e) = a.try_poll(0, Duration::ZERO) {
            cqes.push(e);
        }
        cqes.len() == data.len()
    });
    assert_eq!(clock.now(), t0);
    for (i, (d, e)) in data.iter().zip(&cqes).enumerate() {
        assert_eq!((opcode(e), be16(e, 0x3c)), (0, i as u16), "CQE {i}");
        assert_eq!(&read(&b, 0x4_0000 + i * 0x1000, 100), d, "WRITE {i}");
    }
    let s = a.d.f.model().stats();
    assert_eq!((s.retries, s.naks, s.messages_sent), (1, 1, 6), "{s:?}");
}

#[test]
fn rc_lost_responses_are_recovered() {
    let clock = ManualClock::new();
    // A lost coalesced ACK: the WRITEs go again after the ACK timeout, their
    // duplicates are acknowledged again and none lands twice.
    let (f, mut a, b, mut qa, _qb) = rc_pair_on(&clock, 5);
    f.drop_responses(1);
    let data = write_burst(&mut a, &b, &mut qa, 3, None);
    assert_eq!(next_retry(&clock), ACK_TIMEOUT);
    for (i, d) in data.iter().enumerate() {
        let e = a.poll(0);
        assert_eq!((opcode(&e), be16(&e, 0x3c)), (0, i as u16), "CQE {i}");
        assert_eq!(&read(&b, 0x4_0000 + i * 0x1000, 100), d, "WRITE {i}");
    }
    assert_eq!(b.d.f.model().stats().messages_received, 3);
    // A READ whose first two read response packets of three (MTU 1024)
    // are lost: the last alone does not complete it (a gap); the READ goes
    // again after the ACK timeout and the responder executes it again.
    let (f, mut a, b, mut qa, _qb) = rc_pair_on(&clock, 3);
    let src = fill(&b, 0x6_0000, 2500, 9);
    let mut segs = raddr_seg(DATA_VA + 0x6_0000, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(2500, a.lkey, DATA_VA + 0x7_0000));
    f.drop_responses(2);
    a.post_send(&mut qa, 0x10, 0, &segs, true);
    assert_eq!(next_retry(&clock), ACK_TIMEOUT);
    let e = a.poll(0);
    assert_eq!((opcode(&e), be32(&e, 0x2c)), (0, 2500));
    assert_eq!(read(&a, 0x7_0000, 2500), src);
    // A lost atomic acknowledgement: the FETCH_ADD is not executed twice;
    // its duplicate is answered with the value it saw.
    let (f, mut a, b, mut qa, _qb) = rc_pair_on(&clock, 5);
    b.data.write(0x8_0000, &100u64.to_be_bytes()).unwrap();
    let mut segs = raddr_seg(DATA_VA + 0x8_0000, b.lkey).to_vec();
    segs.extend_from_slice(&7u64.to_be_bytes());
    segs.extend_from_slice(&0u64.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA + 0x9_0000));
    f.drop_responses(1);
    a.post_send(&mut qa, 0x12, 0, &segs, true);
    assert_eq!(next_retry(&clock), ACK_TIMEOUT);
    let e = a.poll(0);
    assert_eq!((opcode(&e), be32(&e, 0x2c)), (0, 8));
    assert_eq!(read(&a, 0x9_0000, 8), 100u64.to_be_bytes());
    assert_eq!(read(&b, 0x8_0000, 8), 107u64.to_be_bytes());
}

#[test]
fn rc_multi_packet_write_counts_every_packet() {
    let (_f, mut a, mut b, mut qa, _qb) = rc_pair(3); // MTU 1024
    let data = fill(&a, 0x2_0000, 10_000, 9);
    let mut segs = raddr_seg(DATA_VA + 0x4_0000, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(10_000, a.lkey, DATA_VA + 0x2_0000));
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(read(&b, 0x4_0000, 10_000), data);
    let (sa, sb) = (a.d.f.model().stats(), b.d.f.model().stats());
    assert_eq!((sa.packets_sent, sa.bytes_sent), (10, 10_000), "{sa:?}");
    assert_eq!(
        (sb.packets_received, sb.messages_received),
        (10, 1),
        "{sb:?}"
    );
    // Ten packets into a key of 4 KiB: refused at the first, nothing lands.
    let before = read(&b, 0xe_0000, 10_000);
    let small = b.mkey(b.pd, 0b01111, 0xe_0000, 4096, 0x12);
    let mut segs = raddr_seg(DATA_VA + 0xe_0000, small).to_vec();
    segs.extend_from_slice(&data_seg(10_000, a.lkey, DATA_VA + 0x2_0000));
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x13), "remote access");
    assert_eq!(read(&b, 0xe_0000, 10_000), before);
}

#[test]
fn rc_cached_rkey_goes_with_its_mkey() {
    let (_f, mut a, mut b, mut qa, _qb) = rc_pair(5);
    let k = b.mkey(b.pd, 0b01111, 0xc_0000, 4096, 0x21);
    let mut segs = raddr_seg(DATA_VA + 0xc_0000, k).to_vec();
    segs.extend_from_slice(&data_seg(64, a.lkey, DATA_VA));
    for seed in [1, 2] {
        let d = fill(&a, 0, 64, seed);
        a.post_send(&mut qa, 0x08, 0, &segs, true);
        assert_eq!(opcode(&a.poll(0)), 0);
        assert_eq!(read(&b, 0xc_0000, 64), d);
    }
    // Destroyed: the same WRITE (its key and range cached by b's QP) is
    // refused, and nothing lands.
    let mut c = cmd_in(0x202, 0, 16);
    c[8..12].copy_from_slice(&(k >> 8).to_be_bytes());
    b.d.ok(&c, 16);
    let before = read(&b, 0xc_0000, 64);
    fill(&a, 0, 64, 3);
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x13), "remote access");
    assert_eq!(read(&b, 0xc_0000, 64), before);
}

#[test]
fn ud_send_with_grh_and_qkey() {
    let (_f, mut a, mut b) = pair();
    for n in [&mut a, &mut b] {
        n.create_cq();
        n.create_cq();
    }
    let mut qa = a.create_qp(2, 0, 1, None);
    let mut qb = b.create_qp(2, 0, 1, None);
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&qa, gb, 0, 0, true);
    b.connect(&qb, ga, 0, 0, true);
    b.post_recv(&mut qb, DATA_VA, 1024);
    let msg = fill(&a, 0x1000, 200, 5);
    let mut av = [0u8; 48];
    av[0..4].copy_from_slice(&0x1111_1111u32.to_be_bytes());
    av[8..12].copy_from_slice(&qb.qpn.to_be_bytes());
    av[0x1b] = 64;
    av[0x1c..0x20].copy_from_slice(&(1u32 << 30).to_be_bytes());
    av[0x20..0x30].copy_from_slice(&gb);
    let mut segs = av.to_vec();
    segs.extend_from_slice(&data_seg(200, a.lkey, DATA_VA + 0x1000));
    a.post_send(&mut qa, 0x0b, 0x55, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    let r = b.poll(1);
    assert_eq!(opcode(&r), 3);
    assert_eq!(be32(&r, 0x2c), 240);
    assert_eq!(be32(&r, 0x18) & 0xff_ffff, qa.qpn);
    assert_eq!(be32(&r, 0x18) >> 28 & 3, 1, "GRH flag");
    assert_eq!(
        be32(&r, 0x18) >> mlx5_hw::cqe::CQE_ROCE_L3_HEADER_TYPE_SHIFT & 3,
        mlx5_hw::cqe::CQE_ROCE_L3_HEADER_TYPE_IPV6,
        "RoCE v2 over IPv6, where mlx5_ib reads it"
    );
    assert_eq!(read(&b, 40, 200), msg);
    // The GRH: IPv6, source GID a's.
    let g = read(&b, 0, 40);
    assert_eq!(g[0] >> 4, 6);
    assert_eq!(&g[8..24], &ga);
    // A wrong Q_Key is dropped: nothing arrives.
    b.post_recv(&mut qb, DATA_VA, 1024);
    let mut segs = av.to_vec();
    segs[0..4].copy_from_slice(&0x2222u32.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA));
    let dropped = b.d.f.model().stats().dropped;
    a.post_send(&mut qa, 0x0a, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    until("the drop", || b.d.f.model().stats().dropped > dropped);
    assert!(b.try_poll(1, Duration::ZERO).is_none());
}

/// The user_index `create_qp` gives a QP on an SRQ.
const SRQ_QP_UIDX: u32 = 0xabc;

#[test]
fn loopback_and_srq_and_objects_leak_free() {
    let f = Fabric::loopback(Profile::ConnectX4Lx);
    let mut n = Node::new(f.function(0).unwrap());
    n.create_cq();
    n.create_cq();
    // SRQ of 16 WQEs, stride 32 (next segment + one data segment).
    let srq_buf = DmaBuffer::new(4096).unwrap();
    n.d.f.dma_map(Iova(SRQ_IOVA), &srq_buf).unwrap();
    for i in 0..16u16 {
        srq_buf
            .write(i as usize * 32 + 2, &((i + 1) % 16).to_be_bytes())
            .unwrap();
    }
    let srq_dbr = n.alloc_dbr();
    let mut c = cmd_in(0x700, 0, create_srq_in::SIZE_BYTES + 8);
    let x = &mut c[create_srq_in::SRQ_CONTEXT_ENTRY.off / 8..];
    srqc::LOG_SRQ_SIZE.set(x, 4);
    srqc::LOG_RQ_STRIDE.set(x, 1);
    srqc::PD.set(x, u64::from(n.pd));
    srqc::DBR_ADDR.set(x, DBR_IOVA + srq_dbr as u64);
    c[create_srq_in::SIZE_BYTES..].copy_from_slice(&SRQ_IOVA.to_be_bytes());
    let srqn = be32(&n.d.ok(&c, 16), 8) & 0xff_ffff;
    let mut q1 = n.create_qp(0, 0, 1, None);
    let q2 = n.create_qp(0, 0, 1, Some(srqn));
    let g = n.gid;
    n.connect(&q1, g, q2.qpn, 5, false);
    n.connect(&q2, g, q1.qpn, 5, false);
    // Post SRQ WQE 0.
    let mut w = [0u8; 16];
    w[0..4].copy_from_slice(&64u32.to_be_bytes());
    w[4..8].copy_from_slice(&n.lkey.to_be_bytes());
    w[8..16].copy_from_slice(&(DATA_VA + 0x2000).to_be_bytes());
    srq_buf.write(16, &w).unwrap();
    n.dbr.write_u32_be(srq_dbr, 1).unwrap();
    let msg = fill(&n, 0, 40, 8);
    n.post_send(&mut q1, 0x0a, 0, &data_seg(40, n.lkey, DATA_VA), true);
    assert_eq!(opcode(&n.poll(0)), 0);
    let r = n.poll(1);
    assert_eq!(opcode(&r), 2);
    // cqe_version 1 (the profile's): srqn_uidx is the QP's user_index,
    // not the SRQ number (libmlx5 finds the QP, then its SRQ, by it).
    assert_ne!(SRQ_QP_UIDX, srqn);
    assert_eq!(be32(&r, 0x20) & 0xff_ffff, SRQ_QP_UIDX);
    assert_eq!(u16::from_be_bytes([r[0x3c], r[0x3d]]), 0);
    assert_eq!(read(&n, 0x2000, 40), msg);
    let s = n.d.f.model().stats();
    assert_eq!((s.pds, s.mkeys, s.cqs, s.qps, s.srqs), (1, 1, 2, 2, 1));
    // Destroy in the wrong order is refused; in the right order, nothing left.
    let mut dcq = cmd_in(0x401, 0, 16);
    dcq[8..12].copy_from_slice(&n.cq[0].0.to_be_bytes());
    assert_eq!(n.d.exec(&dcq, 16)[0], 0x09);
    for qpn in [q1.qpn, q2.qpn] {
        let mut c = cmd_in(0x501, 0, 16);
        c[8..12].copy_from_slice(&qpn.to_be_bytes());
        n.d.ok(&c, 16);
    }
    let mut c = cmd_in(0x701, 0, 16);
    c[8..12].copy_from_slice(&srqn.to_be_bytes());
    n.d.ok(&c, 16);
    for i in 0..2 {
        let mut c = cmd_in(0x401, 0, 16);
        c[8..12].copy_from_slice(&n.cq[i].0.to_be_bytes());
        n.d.ok(&c, 16);
    }
    let mut c = cmd_in(0x202, 0, 16);
    c[8..12].copy_from_slice(&(n.lkey >> 8).to_be_bytes());
    n.d.ok(&c, 16);
    let mut c = cmd_in(0x801, 0, 16);
    c[8..12].copy_from_slice(&n.pd.to_be_bytes());
    n.d.ok(&c, 16);
    let s = n.d.f.model().stats();
    assert_eq!((s.pds, s.mkeys, s.cqs, s.qps, s.srqs), (0, 0, 0, 0, 0));
}

#[test]
fn qp_state_machine_checks() {
    let (_f, mut a, _b) = pair();
    a.create_cq();
    a.create_cq();
    let q = a.create_qp(0, 0, 1, None);
    // RTR2RTS from RESET: bad QP state.
    let o = a.modify(0x504, &q, |_, _| {});
    assert_eq!(o[0], 0x10);
    // INIT2RTR with a source GID index that names no GID: bad parameter.
    assert_eq!(a.modify(0x502, &q, |_, _| {})[0], 0);
    let o = a.modify(0x503, &q, |x, _| {
        qpc::MTU.set(x, 5);
        ads::SRC_ADDR_INDEX.set(&mut x[qpc::PRIMARY_ADDRESS_PATH.off / 8..], 7);
    });
    assert_eq!(o[0], 0x03);
    // 2ERR from INIT, 2RST, then RST2INIT again.
    assert_eq!(a.modify(0x507, &q, |_, _| {})[0], 0);
    assert_eq!(a.modify(0x50a, &q, |_, _| {})[0], 0);
    assert_eq!(a.modify(0x502, &q, |_, _| {})[0], 0);
    // QUERY_QP says INIT.
    let mut c = cmd_in(0x50b, 0, 16);
    c[8..12].copy_from_slice(&q.qpn.to_be_bytes());
    let out = a.d.ok(&c, 0x120);
    assert_eq!(qpc::STATE.get(&out[create_qp_in::QPC.off / 8..]), 1);
}

#[test]
fn q_counter_sets_count_rnr_of_the_qps_bound_to_them() {
    use mlx5_hw::ifc::{alloc_q_counter_out, query_q_counter_in, query_q_counter_out};
    let clock = ManualClock::new();
    let (_f, mut a, mut b, mut qa, qb) = rc_pair_on(&clock, 5);
    let set_a = alloc_q_counter_out::COUNTER_SET_ID.get(&a.d.ok(&cmd_in(0x771, 0, 16), 16));
    let set_b = alloc_q_counter_out::COUNTER_SET_ID.get(&b.d.ok(&cmd_in(0x771, 0, 16), 16));
    // A set that does not exist cannot be bound.
    let o = a.modify(0x505, &qa, |x, m| {
        qpc::COUNTER_SET_ID.set(x, 77);
        *m = 1 << 25;
    });
    assert_eq!(o[0], mlx5_hw::status::CmdStatus::BadParameter.to_raw());
    // RTS2RTS with COUNTER_SET_ID binds each QP to its function's set.
    for (n, q, set) in [(&mut a, &qa, set_a), (&mut b, &qb, set_b)] {
        let o = n.modify(0x505, q, |x, m| {
            qpc::COUNTER_SET_ID.set(x, set);
            *m = 1 << 25;
        });
        assert_eq!(o[0], 0);
    }
    // No receive posted at b: RNR NAKs until a's rnr_retry (2) runs out.
    a.post_send(&mut qa, 0x0a, 0, &data_seg(8, a.lkey, DATA_VA), true);
    for _ in 0..2 {
        assert_eq!(next_retry(&clock), RNR_TIMER);
    }
    assert_eq!(a.poll(0)[0x37], 0x16, "RNR retry exceeded");
    let query = |n: &mut Node, set: u64, clear: bool| {
        let mut c = cmd_in(0x773, 0, query_q_counter_in::SIZE_BYTES);
        query_q_counter_in::COUNTER_SET_ID.set(&mut c, set);
        query_q_counter_in::CLEAR.set(&mut c, u64::from(clear));
        n.d.ok(&c, query_q_counter_out::SIZE_BYTES)
    };
    let qa_out = query(&mut a, set_a, false);
    assert_eq!(query_q_counter_out::RNR_NAK_RETRY_ERR.get(&qa_out), 1);
    assert_eq!(query_q_counter_out::OUT_OF_BUFFER.get(&qa_out), 0);
    // b answered the first send and each of its 2 retries with an RNR NAK.
    let qb_out = query(&mut b, set_b, true);
    assert_eq!(query_q_counter_out::OUT_OF_BUFFER.get(&qb_out), 3);
    // Read with clear: the next read starts from 0.
    let qb_out = query(&mut b, set_b, false);
    assert_eq!(query_q_counter_out::OUT_OF_BUFFER.get(&qb_out), 0);
    // A set still bound to a QP cannot go.
    let mut dealloc = cmd_in(0x772, 0, 16);
    dealloc[8..12].copy_from_slice(&(set_b as u32).to_be_bytes());
    assert_eq!(
        b.d.exec(&dealloc, 16)[0],
        mlx5_hw::status::CmdStatus::BadResourceState.to_raw()
    );
}

#[test]
fn xrc_srq_and_rmp_are_srqs_with_their_checks() {
    use mlx5_hw::ifc::{create_rmp_in, rmpc, wq};
    use mlx5_hw::status::CmdStatus;
    let (_f, mut n, _b) = pair();
    let buf = DmaBuffer::new(4096).unwrap();
    n.d.f.dma_map(Iova(SRQ_IOVA), &buf).unwrap();
    let cq = n.create_cq();
    let cqn = n.cq[cq].0;
    let xrcd = be32(&n.d.ok(&cmd_in(0x80e, 0, 16), 16), 8) & 0xff_ffff;
    let dbr = DBR_IOVA + n.alloc_dbr() as u64;
    let xrc = |xrcd: u32, cqn: u32, pd: u32| create_xrc_srq(xrcd, cqn, pd, dbr, SRQ_IOVA, 0);
    let pd = n.pd;
    // Unknown XRC domain, CQ or PD: bad resource.
    for c in [
        xrc(xrcd + 9, cqn, pd),
        xrc(xrcd, cqn + 9, pd),
        xrc(xrcd, cqn, pd + 9),
    ] {
        assert_eq!(n.d.exec(&c, 16)[0], CmdStatus::BadResource.to_raw());
    }
    let xsrqn = be32(&n.d.ok(&xrc(xrcd, cqn, pd), 16), 8) & 0xff_ffff;
    assert_eq!(n.d.f.model().stats().srqs, 1);
    // The domain is busy while its SRQ lives.
    let mut dx = cmd_in(0x80f, 0, 16);
    dx[8..12].copy_from_slice(&xrcd.to_be_bytes());
    assert_eq!(n.d.exec(&dx, 16)[0], CmdStatus::BadResourceState.to_raw());
    // An RMP: a linked-list WQ in the ready state.
    let rmp = |state: u64, wq_type: u64, log_stride: u64| {
        let mut c = cmd_in(0x90c, 0, create_rmp_in::SIZE_BYTES + 8);
        let at = create_rmp_in::CTX.off / 8;
        let x = &mut c[at..at + rmpc::SIZE_BYTES];
        rmpc::STATE.set(x, state);
        let w = &mut x[rmpc::WQ.off / 8..];
        wq::WQ_TYPE.set(w, wq_type);
        wq::LOG_WQ_SZ.set(w, 4);
        wq::LOG_WQ_STRIDE.set(w, log_stride);
        wq::PD.set(w, u64::from(pd));
        wq::DBR_ADDR.set(w, dbr + 8);
        c[create_rmp_in::SIZE_BYTES..].copy_from_slice(&SRQ_IOVA.to_be_bytes());
        c
    };
    for c in [rmp(0, 0, 5), rmp(1, 1, 5), rmp(1, 0, 3)] {
        assert_eq!(n.d.exec(&c, 16)[0], CmdStatus::BadParameter.to_raw());
    }
    let rmpn = be32(&n.d.ok(&rmp(1, 0, 5), 16), 8) & 0xff_ffff;
    assert_ne!(rmpn, xsrqn, "one number space");
    assert_eq!(n.d.f.model().stats().srqs, 2);
    // MODIFY_RMP arms the limit (mlx5_ib's arm_rmp_cmd): RDY to RDY with
    // the lwm bit; QUERY_RMP reads it back.
    let modify = |num: u32, state: u64, lwm: u64| {
        use mlx5_hw::ifc::{modify_rmp_in, rmp_bitmask};
        let mut c = cmd_in(0x90d, 0, modify_rmp_in::SIZE_BYTES);
        modify_rmp_in::RMP_STATE.set(&mut c, state);
        modify_rmp_in::RMPN.set(&mut c, u64::from(num));
        let b = modify_rmp_in::BITMASK.off / 8;
        rmp_bitmask::LWM.set(&mut c[b..b + rmp_bitmask::SIZE_BYTES], 1);
        let at = modify_rmp_in::CTX.off / 8;
        let x = &mut c[at..at + rmpc::SIZE_BYTES];
        rmpc::STATE.set(x, state);
        wq::LWM.set(&mut x[rmpc::WQ.off / 8..], lwm);
        c
    };
    let lwm_of = |n: &mut Node, num: u32| {
        use mlx5_hw::ifc::{query_rmp_in, query_rmp_out};
        let mut q = cmd_in(0x90f, 0, query_rmp_in::SIZE_BYTES);
        query_rmp_in::RMPN.set(&mut q, u64::from(num));
        let out = n.d.ok(&q, query_rmp_out::SIZE_BYTES);
        let at = query_rmp_out::RMP_CONTEXT.off / 8;
        let x = &out[at..at + rmpc::SIZE_BYTES];
        assert_eq!(rmpc::STATE.get(x), 1, "RDY");
        wq::LWM.get(&x[rmpc::WQ.off / 8..])
    };
    assert_eq!(lwm_of(&mut n, rmpn), 0);
    n.d.ok(&modify(rmpn, 1, 7), 16);
    assert_eq!(lwm_of(&mut n, rmpn), 7);
    // Not RDY to RDY, a limit of the queue's size, an unknown RMP.
    assert_eq!(
        n.d.exec(&modify(rmpn, 3, 7), 16)[0],
        CmdStatus::BadParameter.to_raw()
    );
    assert_eq!(
        n.d.exec(&modify(rmpn, 1, 16), 16)[0],
        CmdStatus::BadParameter.to_raw()
    );
    assert_eq!(
        n.d.exec(&modify(rmpn + 9, 1, 7), 16)[0],
        CmdStatus::BadResource.to_raw()
    );
    // An XRC SRQ is no RMP.
    assert_eq!(
        n.d.exec(&modify(xsrqn, 1, 7), 16)[0],
        CmdStatus::BadResource.to_raw()
    );
    assert_eq!(lwm_of(&mut n, rmpn), 7);
    // Each goes only by its own kind's destroy.
    let destroy = |op: u16, num: u32| {
        let mut c = cmd_in(op, 0, 16);
        c[8..12].copy_from_slice(&num.to_be_bytes());
        c
    };
    assert_eq!(
        n.d.exec(&destroy(0x706, rmpn), 16)[0],
        CmdStatus::BadResource.to_raw()
    );
    assert_eq!(
        n.d.exec(&destroy(0x90e, xsrqn), 16)[0],
        CmdStatus::BadResource.to_raw()
    );
    n.d.ok(&destroy(0x90e, rmpn), 16);
    n.d.ok(&destroy(0x706, xsrqn), 16);
    n.d.ok(&dx, 16);
    let s = n.d.f.model().stats();
    assert_eq!((s.srqs, s.xrcds), (0, 0));
}

/// A WQE whose ds count reaches past the producer counter (the control
/// segment claims four blocks, the doorbell record says one) completes
/// once, as a local QP operation error, and the consumer index stops at
/// the counter: the next WQE posted is the next one completed. (Before,
/// the index jumped past the counter and the flush ran it round the whole
/// 16-bit space: thousands of flush CQEs from one WQE, found by the `wqe`
/// fuzz target.)
#[test]
fn wqe_reaching_past_the_producer_counter_is_one_error() {
    let (_f, mut a, _b, mut qa, _qb) = rc_pair(5);
    // RDMA WRITE with 15 segments after the control: ds 16, 4 blocks.
    let mut segs = raddr_seg(DATA_VA, 0).to_vec();
    for _ in 0..14 {
        segs.extend_from_slice(&data_seg(16, a.lkey, DATA_VA));
    }
    let (idx, ctrl) = a.write_send(&mut qa, 0x08, 0, &segs, true);
    assert_eq!((idx, qa.sq_pi), (0, 4));
    qa.sq_pi = 1;
    a.ring(&qa, &ctrl);
    let e = a.poll(0);
    assert_eq!(
        (opcode(&e), e[0x37], u16::from_be_bytes([e[0x3c], e[0x3d]])),
        (13, 0x02, 0),
        "REQ_ERR, local QP operation error, on WQE 0"
    );
    // The QP is in error: the next WQE (index 1) is flushed, and it is the
    // next completion.
    a.post_send(&mut qa, 0x08, 0, &raddr_seg(0, 0), true);
    let e = a.poll(0);
    assert_eq!(
        (opcode(&e), e[0x37], u16::from_be_bytes([e[0x3c], e[0x3d]])),
        (13, 0x05, 1),
        "WQE 1 flushed, right after WQE 0"
    );
    assert_eq!(a.d.f.model().stats().error_cqes, 1);
}

/// CREATE_MKEY with one MTT entry of `2^log_page` bytes over the first
/// byte of the data range: (status, syndrome).
fn mkey_of_page(n: &mut Node, log_page: u8) -> (u8, u32) {
    let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES + 2 * 8);
    let m = &mut c[0x10..0x50];
    mkc::ACCESS_MODE_1_0.set(m, mlx5_hw::wqe::MKC_ACCESS_MODE_MTT.into());
    mkc::LR.set(m, 1);
    mkc::QPN.set(m, 0xff_ffff);
    mkc::PD.set(m, u64::from(n.pd));
    mkc::START_ADDR.set(m, DATA_VA);
    mkc::LEN.set(m, 1);
    mkc::LOG_PAGE_SIZE.set(m, log_page.into());
    mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, 1);
    create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.set(&mut c, 1);
    let at = create_mkey_in::SIZE_BYTES;
    c[at..at + 8].copy_from_slice(&0u64.to_be_bytes());
    let out = n.d.exec(&c, 16);
    (out[0], be32(&out, 4))
}

#[test]
fn mkey_page_size_runs_from_4k_to_the_caps_limit() {
    let (_f, mut a, _b) = pair();
    // ConnectX-4 Lx has no umr_log_entity_size_5: 5 bits of log_page_size.
    for ok in [12u8, 21, 30, 31] {
        assert_eq!(mkey_of_page(&mut a, ok), (0, 0), "log_page_size {ok}");
    }
    for bad in [0u8, 11, 32, 63] {
        assert_eq!(
            mkey_of_page(&mut a, bad),
            (0x03, crate::fw::synd::MKEY_BAD_PAGE_SIZE),
            "log_page_size {bad}"
        );
    }
}

#[path = "umr.rs"]
mod umr;

/// Linux's `dev->priv.uar` served trapped (QEMU, `trap_control_pages`):
/// CQ doorbells are taken from the trapped writes, whole and in order, and
/// a CQ is armed by them only. Reproduces what the QEMU guest did: the
/// write-combining test CQ of mlx5_core, never armed, whose doorbell record
/// read 0x2000_0000 once created, got a completion event from the model's
/// doorbell-record sweep; and a doorbell a client splits in two 32-bit
/// writes must not arm the CQ the register named before.
#[test]
fn trapped_cq_doorbells_arm_only_the_cq_they_name() {
    let fabric = Fabric::new();
    let f = fabric.add(DeviceConfig {
        trap_control_pages: true,
        ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
    });
    let mut n = Node::new(f.clone());
    assert_eq!(
        n.uar,
        crate::initseg::FIRST_UAR,
        "the first UAR is the trapped page"
    );
    n.create_cq();
    n.create_cq();
    let (cq0, dbr0) = (n.cq[0].0, n.cq[0].3);
    let cq1 = n.cq[1].0;
    let mut q1 = n.create_qp(0, 0, 1, None);
    let q2 = n.create_qp(0, 0, 1, None);
    let g = n.gid;
    n.connect(&q1, g, q2.qpn, 5, false);
    n.connect(&q2, g, q1.qpn, 5, false);
    let dev = f.model();
    let rdma = dev.inner.rdma.clone();
    let st = |cqn: u32| {
        let cq = crate::transport::rlock(&rdma.cqs)
            .get(&cqn)
            .cloned()
            .unwrap();
        let s = crate::lock(&cq.st);
        (s.armed, s.last_arm)
    };
    // The record's arm word says "armed" but nobody rang: after several
    // sweeps the CQ is still unarmed, and its CQE raises no event.
    n.dbr.write_u32_be(dbr0 + 4, 0x2000_0000).unwrap();
    let s = dev.doorbell_sweeps();
    until("several sweeps", || dev.doorbell_sweeps() > s + 10);
    assert_eq!(st(cq0), (None, None), "armed from the doorbell record");
    let eqes = dev.stats().eqes;
    let segs = [
        raddr_seg(DATA_VA + 0x1000, n.lkey).as_slice(),
        data_seg(8, n.lkey, DATA_VA).as_slice(),
    ]
    .concat();
    n.post_send(&mut q1, 0x08, 0, &segs, true);
    assert_eq!(opcode(&n.poll(0)), 0);
    super::settle(dev);
    assert_eq!(
        dev.stats().eqes,
        eqes,
        "a completion event for a CQ never armed"
    );
    // A whole 64-bit doorbell arms CQ 0 (consumer index 1: nothing new).
    let page = u64::from(n.uar) << 12;
    let db = page + mlx5_hw::uar::CQ_DOORBELL as u64;
    let word0 = 1u32;
    f.region_write(
        0,
        db,
        &(u64::from(word0) << 32 | u64::from(cq0)).to_be_bytes(),
    )
    .unwrap();
    until("CQ 0 armed", || st(cq0) == (Some(false), Some(word0)));
    // CQ 1's doorbell as two 32-bit writes, the worker passing between
    // them: the arm word with CQ 0's number still in the register arms
    // neither CQ; the number completes it and arms CQ 1 only.
    let word1: u32 = 1 << 28 | 1 << 24;
    f.region_write(0, db, &word1.to_be_bytes()).unwrap();
    super::settle(dev);
    assert_eq!(
        st(cq0),
        (Some(false), Some(word0)),
        "half a doorbell armed CQ 0"
    );
    assert_eq!(st(cq1), (None, None));
    f.region_write(0, db + 4, &cq1.to_be_bytes()).unwrap();
    until("CQ 1 armed", || st(cq1) == (Some(true), Some(word1)));
    super::settle(dev);
    assert_eq!(st(cq0), (Some(false), Some(word0)));
}

/// SET_HCA_CAP of the atomic caps with `atomic_req_8B_endianness_mode`
/// `mode` and every other field zero (what Linux's handle_hca_cap_atomic
/// sends); the command's status.
fn set_atomic_mode(d: &mut Drv, mode: u64) -> u8 {
    use mlx5_hw::ifc::atomic_caps;
    let ty = crate::profile::cap_type::ATOMIC;
    let mut s = cmd_in(0x109, ty << 1, 0x1010);
    atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE.set(&mut s[16..], mode);
    d.exec(&s, 16)[0]
}

#[test]
fn host_endian_atomics_where_the_driver_asks_and_the_card_offers() {
    use mlx5_hw::ifc::atomic_caps;
    let host = u64::from(mlx5_hw::init::ATOMIC_REQ_MODE_HOST_ENDIANNESS);
    // The traced ConnectX-4 Lx offers network order only: mode 1 refused.
    let f = Fabric::cabled(1, Profile::ConnectX4Lx);
    let mut refused = 0;
    let _n = Node::new_as(f.function(0).unwrap(), |d| {
        refused = set_atomic_mode(d, host);
    });
    assert_eq!(refused, mlx5_hw::status::CmdStatus::BadParameter.to_raw());
    // ConnectX-5 and later offer host order; both drivers choose it.
    let f = Fabric::cabled(2, Profile::ConnectX5);
    let mut nodes = (0..2).map(|i| {
        Node::new_as(f.function(i).unwrap(), |d| {
            let ty = crate::profile::cap_type::ATOMIC;
            let max = d.ok(&cmd_in(0x100, ty << 1, 16), 0x1010);
            assert_eq!(
                atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1.get(&max[16..]),
                1
            );
            assert_eq!(set_atomic_mode(d, host), 0);
            let cur = d.ok(&cmd_in(0x100, ty << 1 | 1, 16), 0x1010);
            assert_eq!(
                atomic_caps::ATOMIC_REQ_8B_ENDIANNESS_MODE.get(&cur[16..]),
                host
            );
            // What the card does stays (mlx5_ib reads it back for
            // atomic_cap): compare-swap and fetch-add, 8-byte QP atomics.
            assert_eq!(atomic_caps::ATOMIC_OPERATIONS.get(&cur[16..]), 0xf);
            assert_eq!(atomic_caps::ATOMIC_SIZE_QP.get(&cur[16..]) & 8, 8);
            assert_eq!(
                atomic_caps::SUPPORTED_ATOMIC_REQ_8B_ENDIANNESS_MODE_1.get(&cur[16..]),
                1
            );
        })
    });
    let (mut a, mut b) = (nodes.next().unwrap(), nodes.next().unwrap());
    let (_f, mut qa, qb) = {
        let (mut a2, mut b2) = (&mut a, &mut b);
        for n in [&mut a2, &mut b2] {
            n.create_cq();
            n.create_cq();
        }
        let qa = a.create_qp(0, 0, 1, None);
        let qb = b.create_qp(0, 0, 1, None);
        let (ga, gb) = (a.gid, b.gid);
        a.connect(&qa, gb, qb.qpn, 3, false);
        b.connect(&qb, ga, qa.qpn, 3, false);
        (f, qa, qb)
    };
    let _ = qb;
    // COMPARE_SWAP on a little-endian 100: swapped to 500, little-endian;
    // the original lands little-endian (the WQE's operands stay big-endian).
    b.data.write(0x8_0000, &100u64.to_le_bytes()).unwrap();
    let mut segs = raddr_seg(DATA_VA + 0x8_0000, b.lkey).to_vec();
    segs.extend_from_slice(&500u64.to_be_bytes());
    segs.extend_from_slice(&100u64.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA + 0x9_0000));
    a.post_send(&mut qa, 0x11, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x38]), (0, 0x11));
    assert_eq!(read(&a, 0x9_0000, 8), 100u64.to_le_bytes());
    assert_eq!(read(&b, 0x8_0000, 8), 500u64.to_le_bytes());
    // FETCH_ADD carries across bytes as a little-endian number.
    b.data.write(0x8_0000, &0xffu64.to_le_bytes()).unwrap();
    let mut segs = raddr_seg(DATA_VA + 0x8_0000, b.lkey).to_vec();
    segs.extend_from_slice(&1u64.to_be_bytes());
    segs.extend_from_slice(&0u64.to_be_bytes());
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA + 0x9_0008));
    a.post_send(&mut qa, 0x12, 0, &segs, true);
    a.poll(0);
    assert_eq!(read(&a, 0x9_0008, 8), 0xffu64.to_le_bytes());
    assert_eq!(read(&b, 0x8_0000, 8), 0x100u64.to_le_bytes());
    // A function reset returns to network order.
    b.d.f.reset().unwrap();
    assert!(!b
        .d
        .f
        .model()
        .rdma()
        .host_endian_atomics
        .load(std::sync::atomic::Ordering::Acquire));
}

/// MODIFY_CQ's resize (`op_mod` RESIZE): refused for an unknown op_mod, a
/// resize that names no size, a size past the caps, a ring in unmapped
/// memory or in a UMEM; done, it writes a RESIZE_CQ CQE into the old ring
/// at the producer index (software-owned for that index) and QUERY_CQ
/// reports the new size.
#[test]
fn cq_resize_refusals_and_the_resize_cqe() {
    use mlx5_hw::cqe::{
        CqeOpcode, CQ_OPMOD_RESIZE, MODIFY_CQ_MASK_LOG_SIZE, MODIFY_CQ_MASK_PG_OFFSET,
        MODIFY_CQ_MASK_PG_SIZE,
    };
    use mlx5_hw::ifc::{modify_cq_in, query_cq_in, query_cq_out};
    use mlx5_hw::status::CmdStatus;
    let (_f, mut n, _b) = pair();
    let cq = n.create_cq();
    let cqn = n.cq[cq].0;
    const NEW_LOG: u8 = LOG_CQ + 1;
    const NEW_IOVA: u64 = CQ_IOVA + 0x80_0000;
    let new = DmaBuffer::new(64 << NEW_LOG).unwrap();
    let npas = (64usize << NEW_LOG) / 4096;
    let resize = |op_mod: u16, sel: u32, log: u8, iova: u64, umem: bool| {
        let mut c = cmd_in(0x403, op_mod, modify_cq_in::SIZE_BYTES + npas * 8);
        modify_cq_in::CQN.set(&mut c, u64::from(cqn));
        modify_cq_in::MODIFY_FIELD_SELECT_RESIZE_FIELD_SELECT.set(&mut c, u64::from(sel));
        modify_cq_in::CQ_UMEM_VALID.set(&mut c, u64::from(umem));
        let at = modify_cq_in::CQ_CONTEXT.off / 8;
        cqc::LOG_CQ_SIZE.set(&mut c[at..at + cqc::SIZE_BYTES], u64::from(log));
        for p in 0..npas {
            let a = modify_cq_in::SIZE_BYTES + p * 8;
            c[a..a + 8].copy_from_slice(&(iova + p as u64 * 4096).to_be_bytes());
        }
        c
    };
    let all = MODIFY_CQ_MASK_LOG_SIZE | MODIFY_CQ_MASK_PG_OFFSET | MODIFY_CQ_MASK_PG_SIZE;
    let bad = CmdStatus::BadParameter.to_raw();
    for c in [
        resize(7, all, NEW_LOG, NEW_IOVA, false),
        resize(
            CQ_OPMOD_RESIZE,
            MODIFY_CQ_MASK_PG_SIZE,
            NEW_LOG,
            NEW_IOVA,
            false,
        ),
        resize(CQ_OPMOD_RESIZE, all, 31, NEW_IOVA, false),
        // Not mapped yet.
        resize(CQ_OPMOD_RESIZE, all, NEW_LOG, NEW_IOVA, false),
        resize(CQ_OPMOD_RESIZE, all, NEW_LOG, NEW_IOVA, true),
    ] {
        assert_eq!(n.d.exec(&c, 16)[0], bad);
    }
    n.d.f.dma_map(Iova(NEW_IOVA), &new).unwrap();
    n.d.ok(&resize(CQ_OPMOD_RESIZE, all, NEW_LOG, NEW_IOVA, false), 16);
    // The old ring's entry 0 (the producer index): RESIZE_CQ, owner 0.
    let mut e = [0u8; 64];
    n.cq[cq].1.read(0, &mut e).unwrap();
    assert_eq!(e[63], CqeOpcode::ResizeCq.to_raw() << 4);
    let mut q = cmd_in(0x402, 0, query_cq_in::SIZE_BYTES);
    query_cq_in::CQN.set(&mut q, u64::from(cqn));
    let out = n.d.ok(&q, query_cq_out::SIZE_BYTES + npas * 8);
    let at = query_cq_out::CQ_CONTEXT.off / 8;
    let c = &out[at..at + cqc::SIZE_BYTES];
    assert_eq!(cqc::LOG_CQ_SIZE.get(c), u64::from(NEW_LOG));
    assert_eq!(
        cqc::PRODUCER_COUNTER.get(c),
        1,
        "the RESIZE_CQ CQE took index 0"
    );
}

/// CREATE_XRC_SRQ of 16 WQEs (stride 32) at `iova`, in domain `xrcd`,
/// completing on CQ `cqn`, under `pd`, its doorbell record at `dbr`, user
/// index `uidx`.
fn create_xrc_srq(xrcd: u32, cqn: u32, pd: u32, dbr: u64, iova: u64, uidx: u32) -> Vec<u8> {
    use mlx5_hw::ifc::{create_xrc_srq_in, xrc_srqc};
    let mut c = cmd_in(0x705, 0, create_xrc_srq_in::SIZE_BYTES + 8);
    let at = create_xrc_srq_in::XRC_SRQ_CONTEXT_ENTRY.off / 8;
    let x = &mut c[at..at + xrc_srqc::SIZE_BYTES];
    xrc_srqc::LOG_XRC_SRQ_SIZE.set(x, 4);
    xrc_srqc::LOG_RQ_STRIDE.set(x, 1);
    xrc_srqc::XRCD.set(x, u64::from(xrcd));
    xrc_srqc::CQN.set(x, u64::from(cqn));
    xrc_srqc::PD.set(x, u64::from(pd));
    xrc_srqc::USER_INDEX.set(x, u64::from(uidx));
    xrc_srqc::DB_RECORD_ADDR_H.set(x, dbr >> 32);
    xrc_srqc::DB_RECORD_ADDR_L.set(x, (dbr & 0xffff_ffff) >> 2);
    c[create_xrc_srq_in::SIZE_BYTES..].copy_from_slice(&iova.to_be_bytes());
    c
}

/// An XRC SRQ of 16 WQEs at `iova` (mapped here, its free list linked)
/// in domain `xrcd`, completing on CQ `cq`, with user index `uidx`: its
/// number, doorbell record offset and memory.
fn xrc_srq(
    n: &mut Node,
    iova: u64,
    xrcd: u32,
    cq: usize,
    uidx: u32,
) -> (u32, usize, Arc<DmaBuffer>) {
    let buf = DmaBuffer::new(4096).unwrap();
    n.d.f.dma_map(Iova(iova), &buf).unwrap();
    for i in 0..16u16 {
        buf.write(i as usize * 32 + 2, &((i + 1) % 16).to_be_bytes())
            .unwrap();
    }
    let dbr = n.alloc_dbr();
    let c = create_xrc_srq(xrcd, n.cq[cq].0, n.pd, DBR_IOVA + dbr as u64, iova, uidx);
    (be32(&n.d.ok(&c, 16), 8) & 0xff_ffff, dbr, buf)
}

#[test]
fn xrc_initiator_sends_into_the_xrc_srq_its_xrceth_names() {
    const XRC: u8 = mlx5_hw::qp::QPC_ST_XRC;
    let (_f, mut a, mut b) = pair();
    a.create_cq();
    b.create_cq();
    b.create_cq();
    let xrcd_of = |n: &mut Node| be32(&n.d.ok(&cmd_in(0x80e, 0, 16), 16), 8) & 0xff_ffff;
    let (xa, xb, xb2) = (xrcd_of(&mut a), xrcd_of(&mut b), xrcd_of(&mut b));
    // b: an XRC SRQ completing on CQ 1, and one of another domain.
    let (srqn, sdbr, sbuf) = xrc_srq(&mut b, SRQ_IOVA, xb, 1, 0x5a5);
    let (other, _, _) = xrc_srq(&mut b, SRQ_IOVA + 0x10_0000, xb2, 1, 0x5a6);
    // The target (no send queue; the SRQ in its context is a placeholder,
    // as Linux's devr->s0) on CQ 0, as mlx5_ib's create_xrc_tgt_qp makes
    // it; the initiator on a.
    let tgt = b.create_qp_with(XRC, 0, 0, Some(other), |x| {
        qpc::XRCD.set(x, u64::from(xb));
        qpc::NO_SQ.set(x, 1);
        // No doorbell: Linux leaves a target's UAR 0.
        qpc::UAR_PAGE.set(x, 0);
    });
    // Linux gives a target no doorbell record (the address it names holds
    // whatever is there): nothing of it is read as a send counter.
    b.dbr.write_u32_be(tgt.dbr + 4, 0x1234).unwrap();
    let mut ini = a.create_qp_with(XRC, 0, 0, None, |x| qpc::XRCD.set(x, u64::from(xa)));
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&ini, gb, tgt.qpn, 5, false);
    b.connect(&tgt, ga, ini.qpn, 5, false);
    // XRC SRQ WQE 0: 64 bytes at data offset 0x2000.
    let mut w = [0u8; 16];
    w.copy_from_slice(&data_seg(64, b.lkey, DATA_VA + 0x2000));
    sbuf.write(16, &w).unwrap();
    b.dbr.write_u32_be(sdbr, 1).unwrap();
    let xrc_seg = |n: u32| {
        let mut s = [0u8; 16];
        s[..4].copy_from_slice(&n.to_be_bytes());
        s
    };
    let msg = fill(&a, 0, 40, 3);
    let mut segs = xrc_seg(srqn).to_vec();
    segs.extend_from_slice(&data_seg(40, a.lkey, DATA_VA));
    a.post_send(&mut ini, 0x0a, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0, "the SEND completes at the initiator");
    let r = b.poll(1);
    assert_eq!(opcode(&r), 2, "a receive on the XRC SRQ's CQ");
    assert_eq!(be32(&r, 0x38) & 0xff_ffff, tgt.qpn, "the target's number");
    assert_eq!(
        be32(&r, 0x20) & 0xff_ffff,
        0x5a5,
        "the XRC SRQ's user index"
    );
    assert_eq!(be32(&r, 0x2c), 40);
    assert_eq!(read(&b, 0x2000, 40), msg);
    assert!(
        b.try_poll(0, Duration::ZERO).is_none(),
        "nothing on the target's CQ"
    );
    // An RDMA WRITE and a READ through the target: memory checked under
    // the XRC SRQ's PD; no receive taken, nothing on any CQ of b.
    let d = fill(&a, 0x100, 48, 9);
    let mut segs = xrc_seg(srqn).to_vec();
    segs.extend_from_slice(&raddr_seg(DATA_VA + 0x3000, b.lkey));
    segs.extend_from_slice(&data_seg(48, a.lkey, DATA_VA + 0x100));
    a.post_send(&mut ini, 0x08, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0, "WRITE");
    assert_eq!(read(&b, 0x3000, 48), d);
    let mut segs = xrc_seg(srqn).to_vec();
    segs.extend_from_slice(&raddr_seg(DATA_VA + 0x3000, b.lkey));
    segs.extend_from_slice(&data_seg(48, a.lkey, DATA_VA + 0x200));
    a.post_send(&mut ini, 0x10, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0, "READ");
    assert_eq!(read(&a, 0x200, 48), d);
    assert!(b.try_poll(1, Duration::ZERO).is_none());
    // Every exchange acknowledged as it went (the XRC target's ACKs
    // reached the initiator): nothing waited for a retry timer.
    assert_eq!(a.d.f.model().stats().retries, 0);
    // An XRCETH naming an SRQ of another domain: Invalid Request NAK,
    // the initiator's WQE in error (remote invalid request), nothing
    // received.
    let mut segs = xrc_seg(other).to_vec();
    segs.extend_from_slice(&data_seg(40, a.lkey, DATA_VA));
    a.post_send(&mut ini, 0x0a, 0, &segs, true);
    let e = a.poll(0);
    assert_eq!((opcode(&e), e[0x37]), (13, 0x12), "remote invalid request");
    assert!(b.try_poll(1, Duration::ZERO).is_none());
}

#[test]
fn xrc_srq_query_and_arm() {
    use mlx5_hw::ifc::xrc_srqc;
    use mlx5_hw::status::CmdStatus;
    let (_f, mut n, _b) = pair();
    let buf = DmaBuffer::new(4096).unwrap();
    n.d.f.dma_map(Iova(SRQ_IOVA), &buf).unwrap();
    let cq = n.create_cq();
    let cqn = n.cq[cq].0;
    let xrcd = be32(&n.d.ok(&cmd_in(0x80e, 0, 16), 16), 8) & 0xff_ffff;
    let dbr = DBR_IOVA + n.alloc_dbr() as u64;
    let pd = n.pd;
    let c = create_xrc_srq(xrcd, cqn, pd, dbr, SRQ_IOVA, 0);
    let xsrqn = be32(&n.d.ok(&c, 16), 8) & 0xff_ffff;
    // QUERY_XRC_SRQ reads the context back; ARM_XRC_SRQ arms its limit
    // (mlx5_ib's query_xrc_srq_cmd / arm_xrc_srq_cmd).
    let query_xrc = |n: &mut Node, num: u32| {
        use mlx5_hw::ifc::{query_xrc_srq_in, query_xrc_srq_out};
        let mut q = cmd_in(0x707, 0, query_xrc_srq_in::SIZE_BYTES);
        query_xrc_srq_in::XRC_SRQN.set(&mut q, u64::from(num));
        let out = n.d.exec(&q, query_xrc_srq_out::SIZE_BYTES);
        let at = query_xrc_srq_out::XRC_SRQ_CONTEXT_ENTRY.off / 8;
        (out[0], out[at..at + xrc_srqc::SIZE_BYTES].to_vec())
    };
    let arm_xrc = |num: u32, op_mod: u16, lwm: u64| {
        use mlx5_hw::ifc::arm_xrc_srq_in;
        let mut c = cmd_in(0x708, op_mod, arm_xrc_srq_in::SIZE_BYTES);
        arm_xrc_srq_in::XRC_SRQN.set(&mut c, u64::from(num));
        arm_xrc_srq_in::LWM.set(&mut c, lwm);
        c
    };
    let (st, x) = query_xrc(&mut n, xsrqn);
    assert_eq!(st, 0);
    assert_eq!(
        [
            xrc_srqc::STATE.get(&x),
            xrc_srqc::XRCD.get(&x),
            xrc_srqc::CQN.get(&x),
            xrc_srqc::PD.get(&x),
            xrc_srqc::LOG_XRC_SRQ_SIZE.get(&x),
            xrc_srqc::LWM.get(&x),
        ],
        [0, u64::from(xrcd), u64::from(cqn), u64::from(pd), 4, 0]
    );
    n.d.ok(&arm_xrc(xsrqn, 1, 3), 16);
    assert_eq!(xrc_srqc::LWM.get(&query_xrc(&mut n, xsrqn).1), 3);
    for (c, status) in [
        (arm_xrc(xsrqn, 0, 3), CmdStatus::BadParameter),
        (arm_xrc(xsrqn, 1, 16), CmdStatus::BadParameter),
        (arm_xrc(xsrqn + 9, 1, 3), CmdStatus::BadResource),
    ] {
        assert_eq!(n.d.exec(&c, 16)[0], status.to_raw());
    }
    assert_eq!(
        query_xrc(&mut n, xsrqn + 9).0,
        CmdStatus::BadResource.to_raw()
    );
}

/// CQ event moderation on a clock the test moves: CQ 0 of A (the send
/// CQ) set by MODIFY_CQ to `cq_period` 100 µs and `cq_max_count` 4, the
/// period from the last event (`cq_period_mode` 0). Armed, one CQE raises
/// no event until the period has run (the model waits on
/// [`crate::transport::cq::CQ_MODERATION`]), then one; armed again, the
/// fourth CQE since that event raises it at once; an arm that finds CQEs
/// already there raises it at once; an arm after the consumer polled the
/// CQE a period waited for drops the period.
#[test]
fn cq_moderation_holds_the_event_for_the_period_or_the_count() {
    use crate::transport::cq::CQ_MODERATION;
    use mlx5_hw::cqe::{CQ_MODIFY_COUNT, CQ_MODIFY_PERIOD};
    use mlx5_hw::ifc::modify_cq_in;
    let clock = ManualClock::new();
    let (f, mut a, b, mut qa, _qb) = rc_pair_on(&clock, 5);
    let dev = f.function(0).unwrap();
    let dev = dev.model();
    let cqn = a.cq[0].0;
    let mut c = cmd_in(0x403, 0, modify_cq_in::SIZE_BYTES);
    modify_cq_in::CQN.set(&mut c, u64::from(cqn));
    modify_cq_in::MODIFY_FIELD_SELECT_RESIZE_FIELD_SELECT
        .set(&mut c, u64::from(CQ_MODIFY_PERIOD | CQ_MODIFY_COUNT));
    let at = modify_cq_in::CQ_CONTEXT.off / 8;
    cqc::CQ_PERIOD.set(&mut c[at..], 100);
    cqc::CQ_MAX_COUNT.set(&mut c[at..], 4);
    a.d.ok(&c, 16);
    let db = (u64::from(a.uar) << 12) + mlx5_hw::uar::CQ_DOORBELL as u64;
    let arm = |a: &mut Node, sn: u32| {
        let ci = a.cq[0].2;
        let word = sn << 28 | ci & 0xff_ffff;
        a.dbr.write_u32_be(a.cq[0].3 + 4, word).unwrap();
        a.d.f
            .region_write(
                0,
                db,
                &(u64::from(word) << 32 | u64::from(cqn)).to_be_bytes(),
            )
            .unwrap();
    };
    let mut segs = raddr_seg(DATA_VA, b.lkey).to_vec();
    segs.extend_from_slice(&data_seg(8, a.lkey, DATA_VA));
    arm(&mut a, 1);
    super::settle(dev);
    let eqes = dev.stats().eqes;
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    let due = clock
        .wait_armed(CQ_MODERATION, HANG_GUARD)
        .expect("the moderation period waits on the clock");
    super::settle(dev);
    assert_eq!(dev.stats().eqes, eqes, "an event before the period ran");
    clock.advance_to(due - Duration::from_micros(1));
    super::settle(dev);
    assert_eq!(dev.stats().eqes, eqes, "an event before the period ran");
    clock.advance_to(due);
    until("the event once the period ran", || {
        dev.stats().eqes == eqes + 1
    });
    assert!(clock.armed().is_empty(), "{:?}", clock.armed());

    // Four CQEs since that event: the fourth raises it, no time passing.
    arm(&mut a, 2);
    for k in 0..4 {
        a.post_send(&mut qa, 0x08, 0, &segs, true);
        assert_eq!(opcode(&a.poll(0)), 0);
        if k < 3 {
            super::settle(dev);
            assert_eq!(dev.stats().eqes, eqes + 1, "an event at CQE {k}");
        }
    }
    until("the event at the fourth CQE", || {
        dev.stats().eqes == eqes + 2
    });
    // A CQE unpolled, then an arm with the consumer index before it.
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    super::settle(dev);
    arm(&mut a, 3);
    until("the event for the CQE already there", || {
        dev.stats().eqes == eqes + 3
    });
    assert_eq!(opcode(&a.poll(0)), 0);
    // A CQE under the period, polled, then an arm past it: the period
    // goes with it, and running the clock raises no event.
    arm(&mut a, 4);
    a.post_send(&mut qa, 0x08, 0, &segs, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    clock
        .wait_armed(CQ_MODERATION, HANG_GUARD)
        .expect("the period waits");
    arm(&mut a, 5);
    super::settle(dev);
    assert!(clock.armed().is_empty(), "{:?}", clock.armed());
    clock.advance(Duration::from_millis(1));
    super::settle(dev);
    assert_eq!(dev.stats().eqes, eqes + 3, "an event with nothing new");
}
