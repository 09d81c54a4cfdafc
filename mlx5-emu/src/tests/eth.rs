//! The Ethernet objects by hand-built commands, in the order mlx5e makes
//! them (TIS, drop RQ, RQ table, TIRs, SQ) and with every check firmware
//! makes on them; then the teardown leaves nothing behind.

use std::sync::Arc;

use mlx5_hw::eth::{
    QUEUE_STATE_ERR, QUEUE_STATE_RDY, QUEUE_STATE_RST, RX_HASH_FN_TOEPLITZ, TIRC_DISP_TYPE_DIRECT,
    TIRC_DISP_TYPE_INDIRECT, WQ_TYPE_CYCLIC,
};
use mlx5_hw::ifc::{
    add_vxlan_udp_dport_in, cqc, create_cq_in, create_rq_in, create_rqt_in, create_sq_in,
    create_tir_in, create_tis_in, delete_vxlan_udp_dport_in, destroy_rq_in, destroy_rqt_in,
    destroy_sq_in, destroy_tir_in, destroy_tis_in, modify_rqt_in, modify_sq_in, modify_tis_bitmask,
    modify_tis_in, query_rq_in, query_rq_out, query_rqt_in, query_rqt_out, query_sq_in,
    query_sq_out, query_tis_in, query_tis_out, rq_num, rqc, rqt_bitmask, rqtc, sqc, tirc, tisc, wq,
};
use mlx5_hw::status::CmdStatus;
use vfio::{DmaBuffer, Iova, PciFunction};

use super::{be32, cmd_in, create_eq, Drv};

const BAD_PARAM: u8 = CmdStatus::BadParameter.to_raw();
const BAD_RES: u8 = CmdStatus::BadResource.to_raw();
const BUSY: u8 = CmdStatus::BadResourceState.to_raw();
pub(super) const RING_IOVA: u64 = 0x5000_0000;
pub(super) const DBR_IOVA: u64 = 0x7000_0000;

/// A brought-up function with a UAR, an EQ, a PD, a TD and a CQ, and the
/// ring and doorbell pages its queues use.
pub(super) struct Eth {
    pub(super) d: Drv,
    pub(super) uar: u32,
    pub(super) pd: u32,
    pub(super) td: u32,
    pub(super) cqn: u32,
    pub(super) bufs: Vec<Arc<DmaBuffer>>,
}

pub(super) fn num(out: &[u8]) -> u32 {
    be32(out, 8) & 0xff_ffff
}

fn setup() -> Eth {
    setup_on(Drv::new())
}

/// [`setup`] on the function `d` drives (one of a fabric's).
pub(super) fn setup_on(mut d: Drv) -> Eth {
    d.bring_up();
    let uar = num(&d.ok(&cmd_in(0x802, 0, 16), 16));
    let eqn = create_eq(&mut d, uar, 6, 1, 0);
    let pd = num(&d.ok(&cmd_in(0x800, 0, 16), 16));
    let td = num(&d.ok(&cmd_in(0x816, 0, 16), 16));
    let ring = DmaBuffer::new(1 << 20).unwrap();
    d.f.dma_map(Iova(RING_IOVA), &ring).unwrap();
    let dbr = DmaBuffer::new(4096).unwrap();
    d.f.dma_map(Iova(DBR_IOVA), &dbr).unwrap();
    let mut c = cmd_in(0x400, 0, create_cq_in::SIZE_BYTES + 8);
    let x = &mut c[create_cq_in::CQ_CONTEXT.off / 8..];
    cqc::LOG_CQ_SIZE.set(x, 6);
    cqc::UAR_PAGE.set(x, u64::from(uar));
    cqc::C_EQN_OR_APU_ELEMENT.set(x, u64::from(eqn));
    cqc::DBR_ADDR.set(x, DBR_IOVA);
    c[create_cq_in::SIZE_BYTES..].copy_from_slice(&RING_IOVA.to_be_bytes());
    let cqn = num(&d.ok(&c, 16));
    Eth {
        d,
        uar,
        pd,
        td,
        cqn,
        bufs: vec![ring, dbr],
    }
}

/// A `wq` of 2^6 entries of 2^`log_stride` bytes on one ring page.
fn set_wq(w: &mut [u8], pd: u32, uar: u32, log_stride: u64) {
    wq::WQ_TYPE.set(w, WQ_TYPE_CYCLIC);
    wq::PD.set(w, u64::from(pd));
    wq::UAR_PAGE.set(w, u64::from(uar));
    wq::DBR_ADDR.set(w, DBR_IOVA + 64);
    wq::LOG_WQ_STRIDE.set(w, log_stride);
    wq::LOG_WQ_SZ.set(w, 6);
}

impl Eth {
    pub(super) fn tis(&mut self, td: u32) -> Vec<u8> {
        let mut c = cmd_in(0x912, 0, create_tis_in::SIZE_BYTES);
        tisc::TRANSPORT_DOMAIN
            .at(create_tis_in::CTX.off)
            .set(&mut c, u64::from(td));
        self.d.exec(&c, 16)
    }

    fn rq(&mut self, cqn: u32, state: u64) -> Vec<u8> {
        let mut c = cmd_in(0x908, 0, create_rq_in::SIZE_BYTES + 8);
        let x = &mut c[create_rq_in::CTX.off / 8..];
        rqc::STATE.set(x, state);
        rqc::CQN.set(x, u64::from(cqn));
        set_wq(&mut x[rqc::WQ.off / 8..], 0, 0, 4);
        c[create_rq_in::SIZE_BYTES..].copy_from_slice(&(RING_IOVA + 0x1000).to_be_bytes());
        self.d.exec(&c, 16)
    }

    pub(super) fn sq(&mut self, tisn: u32, log_stride: u64) -> Vec<u8> {
        self.sq_with(tisn, log_stride, false)
    }

    /// [`Self::sq`], allowing legacy multi-packet send WQEs if `mpw`
    /// (`sqc.allow_multi_pkt_send_wqe`).
    pub(super) fn sq_with(&mut self, tisn: u32, log_stride: u64, mpw: bool) -> Vec<u8> {
        self.sq_ctx(tisn, log_stride, |x| {
            sqc::ALLOW_MULTI_PKT_SEND_WQE.set(x, u64::from(mpw))
        })
    }

    /// [`Self::sq`] with the SQ context then edited by `edit`.
    pub(super) fn sq_ctx(
        &mut self,
        tisn: u32,
        log_stride: u64,
        edit: impl FnOnce(&mut [u8]),
    ) -> Vec<u8> {
        let mut c = cmd_in(0x904, 0, create_sq_in::SIZE_BYTES + 8);
        let x = &mut c[create_sq_in::CTX.off / 8..];
        edit(x);
        sqc::CQN.set(x, u64::from(self.cqn));
        sqc::TIS_LST_SZ.set(x, 1);
        sqc::TIS_NUM_0.set(x, u64::from(tisn));
        set_wq(&mut x[sqc::WQ.off / 8..], self.pd, self.uar, log_stride);
        c[create_sq_in::SIZE_BYTES..].copy_from_slice(&(RING_IOVA + 0x2000).to_be_bytes());
        self.d.exec(&c, 16)
    }

    /// An RQ table of `max` entries listing `rqs`.
    pub(super) fn rqt(&mut self, opcode: u16, rqtn: u32, max: u64, rqs: &[u32]) -> Vec<u8> {
        let at = create_rqt_in::RQT_CONTEXT.off / 8;
        let mut c = cmd_in(opcode, 0, at + rqtc::SIZE_BYTES + rqs.len() * 4);
        modify_rqt_in::RQTN.set(&mut c, u64::from(rqtn));
        rqt_bitmask::RQN_LIST
            .at(modify_rqt_in::BITMASK.off)
            .set(&mut c, 1);
        let x = &mut c[at..];
        rqtc::RQT_MAX_SIZE.set(x, max);
        rqtc::RQT_ACTUAL_SIZE.set(x, rqs.len() as u64);
        for (i, r) in rqs.iter().enumerate() {
            let e = &mut x[rqtc::SIZE_BYTES + i * rq_num::SIZE_BYTES..];
            rq_num::RQ_NUM.set(e, u64::from(*r));
        }
        self.d.exec(&c, 16)
    }

    pub(super) fn tir(&mut self, disp: u64, target: u32, hash: u64) -> Vec<u8> {
        let mut c = cmd_in(0x900, 0, create_tir_in::SIZE_BYTES);
        let x = &mut c[create_tir_in::CTX.off / 8..];
        tirc::TRANSPORT_DOMAIN.set(x, u64::from(self.td));
        tirc::DISP_TYPE.set(x, disp);
        if disp == TIRC_DISP_TYPE_DIRECT {
            tirc::INLINE_RQN.set(x, u64::from(target));
        } else {
            tirc::INDIRECT_TABLE.set(x, u64::from(target));
        }
        tirc::RX_HASH_FN.set(x, hash);
        self.d.exec(&c, 16)
    }

    /// MODIFY_SQ (0x905) or MODIFY_RQ (0x909, the same layout) from `cur`
    /// to `next`.
    pub(super) fn modify(&mut self, opcode: u16, n: u32, cur: u64, next: u64) -> u8 {
        let mut c = cmd_in(opcode, 0, modify_sq_in::SIZE_BYTES);
        modify_sq_in::SQ_STATE.set(&mut c, cur);
        modify_sq_in::SQN.set(&mut c, u64::from(n));
        sqc::STATE.at(modify_sq_in::CTX.off).set(&mut c, next);
        self.d.exec(&c, 16)[0]
    }

    pub(super) fn destroy(&mut self, opcode: u16, field: mlx5_hw::bits::BitField, n: u32) -> u8 {
        let mut c = cmd_in(opcode, 0, 16);
        field.set(&mut c, u64::from(n));
        self.d.exec(&c, 16)[0]
    }
}

#[test]
fn tis_rq_rqt_tir_sq_as_mlx5e_makes_them_with_their_checks() {
    let mut e = setup();
    // TIS: on a transport domain that exists; MODIFY_TIS sets prio.
    assert_eq!(e.tis(e.td + 7)[0], BAD_RES, "unknown TD");
    let tisn = num(&e.tis(e.td));
    let mut m = cmd_in(0x913, 0, modify_tis_in::SIZE_BYTES);
    modify_tis_in::TISN.set(&mut m, u64::from(tisn));
    modify_tis_bitmask::PRIO
        .at(modify_tis_in::BITMASK.off)
        .set(&mut m, 1);
    tisc::PRIO.at(modify_tis_in::CTX.off).set(&mut m, 6);
    e.d.ok(&m, 16);
    let mut q = cmd_in(0x915, 0, query_tis_in::SIZE_BYTES);
    query_tis_in::TISN.set(&mut q, u64::from(tisn));
    let out = e.d.ok(&q, query_tis_out::SIZE_BYTES);
    let ctx = query_tis_out::TIS_CONTEXT.off;
    assert_eq!(tisc::PRIO.at(ctx).get(&out), 6);
    assert_eq!(tisc::TRANSPORT_DOMAIN.at(ctx).get(&out), u64::from(e.td));

    // The drop RQ: born in RST on a CQ that exists; RST->RDY.
    assert_eq!(e.rq(e.cqn + 9, QUEUE_STATE_RST)[0], BAD_RES, "unknown CQ");
    assert_eq!(e.rq(e.cqn, QUEUE_STATE_RDY)[0], BAD_PARAM, "born RDY");
    let rqn = num(&e.rq(e.cqn, QUEUE_STATE_RST));
    assert_eq!(e.modify(0x909, rqn, QUEUE_STATE_RDY, QUEUE_STATE_RDY), BUSY);
    assert_eq!(e.modify(0x909, rqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    let mut q = cmd_in(0x90b, 0, query_rq_in::SIZE_BYTES);
    query_rq_in::RQN.set(&mut q, u64::from(rqn));
    let out = e.d.ok(&q, query_rq_out::SIZE_BYTES);
    let st = rqc::STATE.at(query_rq_out::RQ_CONTEXT.off).get(&out);
    assert_eq!(st, QUEUE_STATE_RDY);

    // RQ table over it; sizes checked; MODIFY_RQT keeps the maximum.
    assert_eq!(e.rqt(0x916, 0, 4, &[rqn + 1])[0], BAD_RES, "unknown RQ");
    assert_eq!(e.rqt(0x916, 0, 1, &[rqn, rqn])[0], BAD_PARAM, "over max");
    let rqtn = num(&e.rqt(0x916, 0, 4, &[rqn]));
    assert_eq!(e.rqt(0x917, rqtn, 0, &[rqn; 5])[0], BAD_PARAM);
    assert_eq!(e.rqt(0x917, rqtn, 0, &[rqn, rqn])[0], 0);
    let mut q = cmd_in(0x919, 0, query_rqt_in::SIZE_BYTES);
    query_rqt_in::RQTN.set(&mut q, u64::from(rqtn));
    let out = e.d.ok(&q, query_rqt_out::SIZE_BYTES + 8);
    let ctx = query_rqt_out::RQT_CONTEXT.off;
    assert_eq!(rqtc::RQT_MAX_SIZE.at(ctx).get(&out), 4);
    assert_eq!(rqtc::RQT_ACTUAL_SIZE.at(ctx).get(&out), 2);

    // TIRs: indirect over the table (Toeplitz), direct to the RQ (no hash).
    assert_eq!(e.tir(TIRC_DISP_TYPE_INDIRECT, rqtn + 1, 0)[0], BAD_RES);
    let indirect = num(&e.tir(TIRC_DISP_TYPE_INDIRECT, rqtn, RX_HASH_FN_TOEPLITZ));
    assert_eq!(
        e.tir(TIRC_DISP_TYPE_DIRECT, rqn, RX_HASH_FN_TOEPLITZ)[0],
        BAD_PARAM
    );
    let direct = num(&e.tir(TIRC_DISP_TYPE_DIRECT, rqn, 0));
    assert_eq!(e.tir(7, rqn, 0)[0], BAD_PARAM, "bad disp_type");
    // A transport domain that does not exist is refused; domain 0 is the
    // firmware's own (DPDK's drop TIR at probe names it).
    let td = e.td;
    e.td = td + 7;
    assert_eq!(
        e.tir(TIRC_DISP_TYPE_DIRECT, rqn, 0)[0],
        BAD_RES,
        "unknown TD"
    );
    e.td = 0;
    let td0 = num(&e.tir(TIRC_DISP_TYPE_DIRECT, rqn, 0));
    e.td = td;
    assert_eq!(e.destroy(0x902, destroy_tir_in::TIRN, td0), 0);

    // SQ: 64-byte WQEBBs, through the TIS; RST->ERR is no move.
    assert_eq!(e.sq(tisn + 1, 6)[0], BAD_RES, "unknown TIS");
    assert_eq!(e.sq(tisn, 5)[0], BAD_PARAM, "stride not 64 bytes");
    let sqn = num(&e.sq(tisn, 6));
    assert_ne!(sqn, rqn, "one number space");
    assert_eq!(
        e.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_ERR),
        BAD_PARAM
    );
    // RST->RST is taken (mlx5_ib's raw packet QP RST2INIT asks for it).
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RST), 0);
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RDY, QUEUE_STATE_ERR), 0);
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_ERR, QUEUE_STATE_RST), 0);
    let mut q = cmd_in(0x907, 0, query_sq_in::SIZE_BYTES);
    query_sq_in::SQN.set(&mut q, u64::from(sqn));
    let out = e.d.ok(&q, query_sq_out::SIZE_BYTES);
    let ctx = query_sq_out::SQ_CONTEXT.off;
    assert_eq!(sqc::STATE.at(ctx).get(&out), QUEUE_STATE_RST);
    assert_eq!(sqc::TIS_NUM_0.at(ctx).get(&out), u64::from(tisn));

    // What is referenced cannot go; the CQ neither while queues use it.
    let dtis = destroy_tis_in::TISN;
    assert_eq!(e.destroy(0x914, dtis, tisn), BUSY, "SQ sends through it");
    assert_eq!(e.destroy(0x918, destroy_rqt_in::RQTN, rqtn), BUSY);
    assert_eq!(e.destroy(0x90a, destroy_rq_in::RQN, rqn), BUSY);
    let dcq = mlx5_hw::ifc::destroy_cq_in::CQN;
    assert_eq!(e.destroy(0x401, dcq, e.cqn), BUSY, "SQ and RQ on it");
    // Torn down in mlx5e's order; unknown numbers are BAD_RESOURCE.
    assert_eq!(e.destroy(0x906, destroy_sq_in::SQN, sqn), 0);
    assert_eq!(e.destroy(0x906, destroy_sq_in::SQN, sqn), BAD_RES);
    assert_eq!(e.destroy(0x902, destroy_tir_in::TIRN, indirect), 0);
    assert_eq!(e.destroy(0x902, destroy_tir_in::TIRN, direct), 0);
    assert_eq!(e.destroy(0x918, destroy_rqt_in::RQTN, rqtn), 0);
    assert_eq!(e.destroy(0x90a, destroy_rq_in::RQN, rqn), 0);
    assert_eq!(e.destroy(0x914, dtis, tisn), 0);
    assert_eq!(e.destroy(0x401, dcq, e.cqn), 0);
    assert_eq!(crate::lock(&e.d.f.model().inner.fw).eth.objects(), 0);
}

#[test]
fn vxlan_ports_added_once_and_deleted_by_number() {
    let mut e = setup();
    let port = |op: u16, p: u64| {
        let mut c = cmd_in(op, 0, add_vxlan_udp_dport_in::SIZE_BYTES);
        add_vxlan_udp_dport_in::VXLAN_UDP_PORT.set(&mut c, p);
        c
    };
    e.d.ok(&port(0x827, 4789), 16);
    // Linux adds IANA's port the hardware holds already: success.
    e.d.ok(&port(0x827, 4789), 16);
    let del = |p| {
        let mut c = cmd_in(0x828, 0, delete_vxlan_udp_dport_in::SIZE_BYTES);
        delete_vxlan_udp_dport_in::VXLAN_UDP_PORT.set(&mut c, p);
        c
    };
    e.d.ok(&del(4789), 16);
    assert_eq!(e.d.exec(&del(4789), 16)[0], BAD_PARAM, "not held");
    // Up to the card's maximum (4 where it reports none).
    let max = {
        use mlx5_hw::ifc::per_protocol_networking_offload_caps as c;
        let fw = crate::lock(&e.d.f.model().inner.fw);
        match fw
            .caps
            .get(crate::cap_type::ETHERNET_OFFLOADS, c::MAX_VXLAN_UDP_PORTS)
        {
            0 => 4,
            n => n,
        }
    };
    for p in 0..max {
        e.d.ok(&port(0x827, 5000 + p), 16);
    }
    let full = e.d.exec(&port(0x827, 6000), 16)[0];
    assert_eq!(full, CmdStatus::NoResources.to_raw());
}

/// Where the SQ's ring is in the ring buffer (`Eth::sq`), and a data page.
pub(super) const SQ_RING: usize = 0x2000;
pub(super) const DATA: u64 = 0x10000;

impl Eth {
    /// An MTT mkey over one page of the ring buffer at `DATA`, local read.
    fn data_mkey(&mut self) -> u32 {
        use mlx5_hw::ifc::{create_mkey_in, mkc};
        let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES + 2 * 8);
        let m = &mut c[create_mkey_in::MEMORY_KEY_MKEY_ENTRY.off / 8..];
        mkc::ACCESS_MODE_1_0.set(m, mlx5_hw::wqe::MKC_ACCESS_MODE_MTT.into());
        mkc::LR.set(m, 1);
        mkc::QPN.set(m, 0xff_ffff);
        mkc::MKEY_7_0.set(m, 0x33);
        mkc::PD.set(m, u64::from(self.pd));
        mkc::START_ADDR.set(m, RING_IOVA + DATA);
        mkc::LEN.set(m, 4096);
        mkc::LOG_PAGE_SIZE.set(m, 12);
        mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, 1);
        create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.set(&mut c, 1);
        let at = create_mkey_in::SIZE_BYTES;
        c[at..at + 8].copy_from_slice(&(RING_IOVA + DATA).to_be_bytes());
        num(&self.d.ok(&c, 16)) << 8 | 0x33
    }

    /// Writes a WQE of `segs` (after the control segment) at basic block
    /// `idx` of SQ `sqn`, moves the producer counter past it and rings.
    pub(super) fn post(&mut self, sqn: u32, idx: u16, opcode: u8, segs: &[u8], signaled: bool) {
        self.post_opmod(sqn, idx, 0, opcode, segs, signaled);
    }

    /// [`Self::post`] with the opcode modifier `opmod`.
    pub(super) fn post_opmod(
        &mut self,
        sqn: u32,
        idx: u16,
        opmod: u8,
        opcode: u8,
        segs: &[u8],
        signaled: bool,
    ) {
        let op = u32::from(opmod) << 24 | u32::from(idx) << 8 | u32::from(opcode);
        self.post_ctrl(sqn, idx, op, 0, segs, signaled);
    }

    /// [`Self::post`], signaled, with the control segment's `imm` (a
    /// UMR's mkey).
    pub(super) fn post_imm(&mut self, sqn: u32, idx: u16, opcode: u8, imm: u32, segs: &[u8]) {
        let op = u32::from(idx) << 8 | u32::from(opcode);
        self.post_ctrl(sqn, idx, op, imm, segs, true);
    }

    /// Writes a WQE (control segment words `op` and `imm`, then `segs`)
    /// at basic block `idx` of SQ `sqn`, moves the producer counter past
    /// it and rings.
    fn post_ctrl(&mut self, sqn: u32, idx: u16, op: u32, imm: u32, segs: &[u8], signaled: bool) {
        let (pi, head) = self.stage(sqn, idx, op, imm, segs, signaled);
        self.ring_sq(pi, &head);
    }

    /// Posts WQEs of `segs` (opcode `opcode`, each signaled) from basic
    /// block `idx` of SQ `sqn` and rings once for them all: one burst.
    pub(super) fn post_burst(&mut self, sqn: u32, mut idx: u16, opcode: u8, segs: &[Vec<u8>]) {
        let mut head = [0u8; 8];
        for s in segs {
            let op = u32::from(idx) << 8 | u32::from(opcode);
            (idx, head) = self.stage(sqn, idx, op, 0, s, true);
        }
        self.ring_sq(idx, &head);
    }

    /// Writes a WQE (control segment words `op` and `imm`, then `segs`)
    /// at basic block `idx` of SQ `sqn`: the producer counter after it
    /// and the doorbell's 8 bytes.
    fn stage(
        &mut self,
        sqn: u32,
        idx: u16,
        op: u32,
        imm: u32,
        segs: &[u8],
        signaled: bool,
    ) -> (u16, [u8; 8]) {
        let ds = 1 + segs.len() / 16;
        let mut w = vec![0u8; ds.div_ceil(4) * 64];
        w[0..4].copy_from_slice(&op.to_be_bytes());
        w[4..8].copy_from_slice(&(sqn << 8 | ds as u32).to_be_bytes());
        w[11] = if signaled {
            mlx5_hw::wqe::WQE_CTRL_CQ_UPDATE
        } else {
            0
        };
        w[12..16].copy_from_slice(&imm.to_be_bytes());
        w[16..16 + segs.len()].copy_from_slice(segs);
        let ring = &self.bufs[0];
        for (b, bb) in w.chunks(64).enumerate() {
            let slot = (usize::from(idx) + b) & 63;
            ring.write(SQ_RING + slot * 64, bb).unwrap();
        }
        let pi = idx + (w.len() / 64) as u16;
        let mut head = [0u8; 8];
        head.copy_from_slice(&w[..8]);
        (pi, head)
    }

    /// Moves the SQ's producer counter to `pi` and rings with `head`.
    fn ring_sq(&mut self, pi: u16, head: &[u8; 8]) {
        self.bufs[1].write_u32_be(64 + 4, u32::from(pi)).unwrap();
        let bar = self.d.f.model().bar0();
        bar.write((self.uar as usize) << 12 | 0x800, head).unwrap();
    }

    /// Waits for CQE `n` of the CQ (its op_own bytes were set invalid).
    pub(super) fn cqe(&self, n: usize) -> Vec<u8> {
        let ring = &self.bufs[0];
        super::until("a CQE", || {
            ring.load_u8_acquire(n * 64 + 63).unwrap() >> 4 != 0xf
        });
        let mut b = vec![0u8; 64];
        ring.read(n * 64, &mut b).unwrap();
        b
    }

    pub(super) fn sq_state(&mut self, sqn: u32) -> u64 {
        let mut q = cmd_in(0x907, 0, query_sq_in::SIZE_BYTES);
        query_sq_in::SQN.set(&mut q, u64::from(sqn));
        let out = self.d.ok(&q, query_sq_out::SIZE_BYTES);
        sqc::STATE.at(query_sq_out::SQ_CONTEXT.off).get(&out)
    }
}

/// An Ethernet segment with `ihs` bytes of inline headers, then one data
/// segment of `len` bytes at `addr` under `lkey`.
fn eth_send(ihs: usize, len: u32, lkey: u32, addr: u64) -> Vec<u8> {
    use mlx5_hw::ifc::{wqe_data_seg, wqe_eth_seg};
    let inl = wqe_eth_seg::SIZE_BYTES + (ihs - 2).next_multiple_of(16);
    let mut s = vec![0u8; inl + wqe_data_seg::SIZE_BYTES];
    wqe_eth_seg::INLINE_HDR_SZ.set(&mut s, ihs as u64);
    s[14..14 + ihs].fill(0xee);
    let d = &mut s[inl..];
    wqe_data_seg::BYTE_COUNT.set(d, u64::from(len));
    wqe_data_seg::LKEY.set(d, u64::from(lkey));
    wqe_data_seg::ADDR.set(d, addr);
    s
}

#[test]
fn sq_runs_nops_and_eth_sends_with_cqes_then_errs_and_flushes() {
    use mlx5_hw::cqe::{CqeOpcode, CqeSyndrome};
    use std::sync::atomic::Ordering;
    let mut e = setup();
    for i in 0..64 {
        e.bufs[0].write(i * 64 + 63, &[0xf0]).unwrap();
    }
    let lkey = e.data_mkey();
    let tisn = num(&e.tis(e.td));
    let sqn = num(&e.sq(tisn, 6));
    // In RST nothing posted runs.
    e.post(sqn, 0, 0x00, &[], true);
    super::settle(e.d.f.model());
    assert_eq!(
        e.bufs[0].load_u8_acquire(63).unwrap() >> 4,
        0xf,
        "RST runs nothing"
    );
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    // mlx5e's ICOSQ NOP, a TX SEND (14 bytes inline + 50), an unsignaled
    // NOP (no CQE), a signaled one.
    e.post(sqn, 0, 0x00, &[], true);
    e.post(
        sqn,
        1,
        0x0a,
        &eth_send(14, 50, lkey, RING_IOVA + DATA),
        true,
    );
    e.post(sqn, 2, 0x00, &[], false);
    e.post(sqn, 3, 0x00, &[], true);
    for (n, (counter, opcode)) in [(0u16, 0x00u8), (1, 0x0a), (3, 0x00)]
        .into_iter()
        .enumerate()
    {
        let c = e.cqe(n);
        assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw(), "CQE {n}");
        assert_eq!(be32(&c, 56), u32::from(opcode) << 24 | sqn, "CQE {n}");
        assert_eq!(u16::from_be_bytes([c[60], c[61]]), counter, "CQE {n}");
    }
    let counters = &e.d.f.model().inner.rdma.counters;
    assert_eq!(counters.packets_sent.load(Ordering::Relaxed), 1);
    assert_eq!(counters.bytes_sent.load(Ordering::Relaxed), 64);
    // A key that does not exist: an error CQE, the SQ in ERR; what is
    // posted after it is flushed.
    e.post(
        sqn,
        4,
        0x0a,
        &eth_send(14, 50, lkey + 0x100, RING_IOVA + DATA),
        true,
    );
    let c = e.cqe(3);
    assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw());
    assert_eq!(c[55], CqeSyndrome::LocalProtErr.to_raw());
    assert_eq!(u16::from_be_bytes([c[60], c[61]]), 4);
    assert_eq!(e.sq_state(sqn), QUEUE_STATE_ERR);
    e.post(sqn, 5, 0x00, &[], false);
    let c = e.cqe(4);
    assert_eq!(c[63] >> 4, CqeOpcode::ReqErr.to_raw());
    assert_eq!(c[55], CqeSyndrome::WrFlushErr.to_raw());
    assert_eq!(u16::from_be_bytes([c[60], c[61]]), 5);
    // mlx5e's recovery: ERR -> RST -> RDY, and the ring starts at 0 again.
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RDY, QUEUE_STATE_RST), BUSY);
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_ERR, QUEUE_STATE_RST), 0);
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    // The doorbell record still says 6 from before: a sweep runs nothing
    // until the driver posts again.
    let rdma = &e.d.f.model().inner.rdma;
    let dp = rdma.eth_sq(sqn).unwrap();
    assert!(!crate::transport::eth_sq::run(
        rdma,
        &dp,
        &rdma.dma.memory(),
        false
    ));
    assert_eq!(e.bufs[0].load_u8_acquire(5 * 64 + 63).unwrap() >> 4, 0xf);
    e.post(sqn, 0, 0x00, &[], true);
    let c = e.cqe(5);
    assert_eq!(c[63] >> 4, CqeOpcode::Req.to_raw());
    assert_eq!(u16::from_be_bytes([c[60], c[61]]), 0);
    // An opcode an SQ does not run (RDMA WRITE): an error CQE.
    e.post(sqn, 1, 0x08, &[0u8; 16], true);
    let c = e.cqe(6);
    assert_eq!(c[55], CqeSyndrome::LocalQpOpErr.to_raw());
}

/// No profile offers `scatter_fcs` (the frame check sequence kept on
/// each received frame): CREATE_RQ and MODIFY_RQ asking for it are refused
/// as the card refuses what its caps lack, not stored and ignored.
#[test]
fn scatter_fcs_is_refused_where_the_caps_lack_it() {
    use mlx5_hw::eth::MODIFY_RQ_BITMASK_SCATTER_FCS;
    use mlx5_hw::ifc::modify_rq_in;
    let mut e = setup();
    let mut c = cmd_in(0x908, 0, create_rq_in::SIZE_BYTES + 8);
    let x = &mut c[create_rq_in::CTX.off / 8..];
    rqc::CQN.set(x, u64::from(e.cqn));
    rqc::SCATTER_FCS.set(x, 1);
    set_wq(&mut x[rqc::WQ.off / 8..], 0, 0, 4);
    c[create_rq_in::SIZE_BYTES..].copy_from_slice(&(RING_IOVA + 0x1000).to_be_bytes());
    assert_eq!(e.d.exec(&c, 16)[0], BAD_PARAM, "CREATE_RQ with scatter_fcs");

    let rqn = num(&e.rq(e.cqn, QUEUE_STATE_RST));
    let modify = |e: &mut Eth, bitmask: u64| {
        let mut m = cmd_in(0x909, 0, modify_rq_in::SIZE_BYTES);
        modify_rq_in::RQ_STATE.set(&mut m, QUEUE_STATE_RST);
        modify_rq_in::RQN.set(&mut m, u64::from(rqn));
        modify_rq_in::MODIFY_BITMASK.set(&mut m, bitmask);
        let x = &mut m[modify_rq_in::CTX.off / 8..];
        rqc::STATE.set(x, QUEUE_STATE_RDY);
        rqc::SCATTER_FCS.set(x, 1);
        e.d.exec(&m, 16)[0]
    };
    assert_eq!(modify(&mut e, MODIFY_RQ_BITMASK_SCATTER_FCS), BAD_PARAM);
    let mut q = cmd_in(0x90b, 0, query_rq_in::SIZE_BYTES);
    query_rq_in::RQN.set(&mut q, u64::from(rqn));
    let out = e.d.ok(&q, query_rq_out::SIZE_BYTES);
    let ctx = query_rq_out::RQ_CONTEXT.off;
    assert_eq!(rqc::STATE.at(ctx).get(&out), QUEUE_STATE_RST, "unchanged");
    assert_eq!(rqc::SCATTER_FCS.at(ctx).get(&out), 0);
    // Without the bitmask bit the field is not looked at.
    assert_eq!(modify(&mut e, 0), 0);
}

#[test]
fn qps_sqs_and_rqs_share_one_number_space() {
    use mlx5_hw::ifc::{create_qp_in, qpc};
    let mut e = setup();
    let tisn = num(&e.tis(e.td));
    let sqn = num(&e.sq(tisn, 6));
    let rqn = num(&e.rq(e.cqn, QUEUE_STATE_RST));
    // A UD QP with no receive queue on the same ring page.
    let mut c = cmd_in(0x500, 0, create_qp_in::SIZE_BYTES + 8);
    let x = &mut c[create_qp_in::QPC.off / 8..];
    qpc::ST.set(x, mlx5_hw::qp::QPC_ST_UD.into());
    qpc::PD.set(x, u64::from(e.pd));
    qpc::CQN_SND.set(x, u64::from(e.cqn));
    qpc::CQN_RCV.set(x, u64::from(e.cqn));
    qpc::RQ_TYPE.set(x, 3);
    qpc::UAR_PAGE.set(x, u64::from(e.uar));
    qpc::LOG_SQ_SIZE.set(x, 6);
    qpc::DBR_ADDR.set(x, DBR_IOVA + 128);
    c[create_qp_in::SIZE_BYTES..].copy_from_slice(&(RING_IOVA + 0x4000).to_be_bytes());
    let qpn = num(&e.d.ok(&c, 16));
    assert!(
        qpn != sqn && qpn != rqn,
        "QP {qpn:#x} SQ {sqn:#x} RQ {rqn:#x}"
    );
    // And an SQ made after the QP skips it.
    let sqn2 = num(&e.sq(tisn, 6));
    assert!(![sqn, rqn, qpn].contains(&sqn2));
}

#[test]
fn a_tir_stays_while_a_flow_entry_forwards_to_it() {
    use mlx5_hw::ifc::{create_flow_table_out, dest_format_struct, flow_context, set_fte_in};
    let mut e = setup();
    let rqn = num(&e.rq(e.cqn, QUEUE_STATE_RST));
    let tirn = num(&e.tir(TIRC_DISP_TYPE_DIRECT, rqn, 0));
    let out = super::flow::create_table(&mut e.d, 0, 1, 4, None);
    let table = create_flow_table_out::TABLE_ID.get(&out) as u32;
    let (st, group) = super::flow::create_group(&mut e.d, table, 0, 3);
    assert_eq!(st, 0);
    // An entry forwarding to the TIR (destination type TIR, 2).
    let dests = (set_fte_in::FLOW_CONTEXT.off + flow_context::DESTINATION.off) / 8;
    let mut c = cmd_in(0x936, 0, dests + dest_format_struct::SIZE_BYTES);
    set_fte_in::TABLE_ID.set(&mut c, u64::from(table));
    let fc = set_fte_in::FLOW_CONTEXT.off;
    flow_context::GROUP_ID.at(fc).set(&mut c, u64::from(group));
    flow_context::ACTION.at(fc).set(&mut c, 0x4);
    flow_context::DESTINATION_LIST_SIZE.at(fc).set(&mut c, 1);
    dest_format_struct::DESTINATION_TYPE.set(&mut c[dests..], 2);
    dest_format_struct::DESTINATION_ID.set(&mut c[dests..], u64::from(tirn));
    e.d.ok(&c, 16);
    let dtir = destroy_tir_in::TIRN;
    assert_eq!(
        e.destroy(0x902, dtir, tirn),
        BUSY,
        "an entry forwards to it"
    );
    assert_eq!(super::flow::delete_fte(&mut e.d, table, 0), 0);
    assert_eq!(e.destroy(0x902, dtir, tirn), 0);
    assert_eq!(e.destroy(0x902, dtir, tirn), BAD_RES);
}

#[test]
fn l2_table_entries_are_set_and_deleted_by_index() {
    use mlx5_hw::ifc::{delete_l2_table_entry_in, mac_address_layout, set_l2_table_entry_in};
    let mut e = setup();
    let set = |index: u64, mac: u64| {
        let mut c = cmd_in(0x829, 0, set_l2_table_entry_in::SIZE_BYTES);
        set_l2_table_entry_in::TABLE_INDEX.set(&mut c, index);
        let m = &mut c[set_l2_table_entry_in::MAC_ADDRESS.off / 8..];
        mac_address_layout::MAC_ADDR_47_32.set(m, mac >> 32);
        mac_address_layout::MAC_ADDR_31_0.set(m, mac & 0xffff_ffff);
        c
    };
    let del = |index: u64| {
        let mut c = cmd_in(0x82b, 0, delete_l2_table_entry_in::SIZE_BYTES);
        delete_l2_table_entry_in::TABLE_INDEX.set(&mut c, index);
        c
    };
    let mac = 0x248a_07a0_0001;
    e.d.ok(&set(0, mac), 16);
    let table = |e: &Eth| crate::lock(&e.d.f.model().inner.fw).eth.l2_table.clone();
    assert_eq!(table(&e).get(&0).map(|x| x.mac), Some(mac));
    assert_eq!(
        e.d.exec(&set(1, mac), 16)[0],
        BAD_PARAM,
        "one MAC, one index"
    );
    let size = {
        let fw = crate::lock(&e.d.f.model().inner.fw);
        1u64 << fw.cap(mlx5_hw::ifc::cmd_hca_cap::LOG_MAX_L2_TABLE)
    };
    assert_eq!(
        e.d.exec(&set(size, mac + 1), 16)[0],
        BAD_PARAM,
        "past the table"
    );
    e.d.ok(&del(0), 16);
    assert_eq!(e.d.exec(&del(0), 16)[0], BAD_PARAM, "not set");
    assert!(table(&e).is_empty());
}

#[test]
fn vport_counter_and_ppcnt_count_what_the_sq_sent() {
    use mlx5_hw::ifc::{
        access_register_in, eth_802_3_cntrs_grp_data_layout as g, ppcnt_reg,
        query_vport_counter_in, query_vport_counter_out as o, traffic_counter,
    };
    let mut e = setup();
    let lkey = e.data_mkey();
    let tisn = num(&e.tis(e.td));
    let sqn = num(&e.sq(tisn, 6));
    for i in 0..64 {
        e.bufs[0].write(i * 64 + 63, &[0xf0]).unwrap();
    }
    assert_eq!(e.modify(0x905, sqn, QUEUE_STATE_RST, QUEUE_STATE_RDY), 0);
    e.post(
        sqn,
        0,
        0x0a,
        &eth_send(14, 86, lkey, RING_IOVA + DATA),
        true,
    );
    e.cqe(0);
    let vport = |e: &mut Eth, clear: u64, other: u64| {
        let mut c = cmd_in(0x770, 0, query_vport_counter_in::SIZE_BYTES);
        query_vport_counter_in::CLEAR.set(&mut c, clear);
        query_vport_counter_in::OTHER_VPORT.set(&mut c, other);
        e.d.exec(&c, o::SIZE_BYTES)
    };
    let out = vport(&mut e, 1, 0);
    assert_eq!(out[0], 0);
    let tx = o::TRANSMITTED_ETH_UNICAST.off;
    assert_eq!(traffic_counter::PACKETS.at(tx).get(&out), 1);
    assert_eq!(traffic_counter::OCTETS.at(tx).get(&out), 100);
    let out = vport(&mut e, 0, 0);
    assert_eq!(traffic_counter::PACKETS.at(tx).get(&out), 0, "cleared");
    assert_eq!(vport(&mut e, 0, 1)[0], BAD_PARAM, "no e-switch");
    // PPCNT, IEEE 802.3 group: the same frame; an unknown group refused.
    let ppcnt = |e: &mut Eth, grp: u64| {
        let at = access_register_in::SIZE_BYTES;
        let mut c = cmd_in(0x805, 1, at + ppcnt_reg::SIZE_BYTES);
        access_register_in::REGISTER_ID.set(&mut c, 0x5008);
        ppcnt_reg::LOCAL_PORT.set(&mut c[at..], 1);
        ppcnt_reg::GRP.set(&mut c[at..], grp);
        e.d.exec(
            &c,
            mlx5_hw::ifc::access_register_out::SIZE_BYTES + ppcnt_reg::SIZE_BYTES,
        )
    };
    let out = ppcnt(&mut e, 0);
    assert_eq!(out[0], 0);
    let set = mlx5_hw::ifc::access_register_out::SIZE_BYTES * 8 + ppcnt_reg::COUNTER_SET.off;
    assert_eq!(g::A_FRAMES_TRANSMITTED_OK_LOW.at(set).get(&out), 1);
    assert_eq!(g::A_OCTETS_TRANSMITTED_OK_LOW.at(set).get(&out), 100);
    assert_eq!(ppcnt(&mut e, 0x3f)[0], BAD_PARAM);
}
