//! CREATE_SRQ / DESTROY_SRQ / QUERY_SRQ / ARM_RQ: shared receive queues
//! (a linked list of receive WQEs, each a next segment and data segments)
//! and their limit event. CREATE_XRC_SRQ / DESTROY_XRC_SRQ: the same queue
//! in an XRC domain (mlx5_ib creates one for its device resources); XRC
//! SRQs share the SRQ number space. CREATE_RMP / DESTROY_RMP: the same
//! queue as a receive memory pool, which is how Linux creates a basic SRQ
//! once ISSI is 1 (the WQ's linked-list WQEs are the SRQ's).

use std::sync::{Arc, Mutex};

use mlx5_hw::ifc::{
    arm_rq_in, cmd_hca_cap, create_rmp_in, create_rmp_out, create_srq_in, create_srq_out,
    create_xrc_srq_in, create_xrc_srq_out, destroy_rmp_in, destroy_srq_in, destroy_xrc_srq_in,
    modify_rmp_in, modify_rmp_out, query_rmp_in, query_rmp_out, query_srq_in, query_srq_out,
    rmp_bitmask, rmpc, srqc, wq, xrc_srqc,
};
use mlx5_hw::init::{page_offset_bytes, page_offset_field};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;

use super::cq::pas;
use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::transport::qp::{Buf, SrqKind, SrqState};
use crate::transport::{rlock, wlock, Srq};
use crate::{lock, Inner};

const CTX: usize = create_srq_in::SRQ_CONTEXT_ENTRY.off / 8;
use mlx5_hw::eth::{RMPC_STATE_ERR, RMPC_STATE_RDY, WQ_TYPE_LINKED_LIST};

/// What the three SRQ flavours' contexts say about the queue.
struct SrqSpec {
    pd: u32,
    log_size: u8,
    /// log2 of the WQE stride in 16-byte units.
    log_stride: u8,
    log_page: u32,
    /// Byte offset of the queue in its first page.
    offset: u64,
    dbr: u64,
    /// The CQ XRC completions go to (0: none).
    cqn: u32,
    /// The XRC domain (0: none).
    xrcd: u32,
    lwm: u16,
    kind: SrqKind,
    /// An XRC SRQ's user index for its CQEs (`cqe_version` 1), or
    /// `Some(u32::MAX)`: the number it gets (`user_index_equal_xrc_srqn`).
    uidx: Option<u32>,
}

/// SRQ `n` if `kind` made it; another kind's number is unknown to this
/// kind's commands, as to firmware (BAD_RESOURCE).
fn srq_of_kind(inner: &Inner, n: u32, kind: SrqKind) -> Result<Arc<Srq>, Fail> {
    rlock(&inner.rdma.srqs)
        .get(&n)
        .filter(|s| s.kind == kind)
        .cloned()
        .ok_or_else(|| fail(CmdStatus::BadResource, synd::SRQ_UNKNOWN))
}

/// ARM_RQ / ARM_XRC_SRQ: the limit event fires once when fewer than
/// `lwm` WQEs remain; a limit of the queue's size or more is refused.
fn arm_limit(s: &Srq, lwm: u16) -> Result<(), Fail> {
    if lwm >= 1 << s.log_size {
        return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_SIZE));
    }
    lock(&s.st).lwm = lwm;
    Ok(())
}

/// The SRQ family's commands: SRQs, XRC SRQs, RMPs and ARM_RQ.
pub(super) fn is_srq(o: Opcode) -> bool {
    use Opcode as O;
    matches!(
        o,
        O::CreateSrq
            | O::DestroySrq
            | O::QuerySrq
            | O::ArmRq
            | O::CreateXrcSrq
            | O::DestroyXrcSrq
            | O::QueryXrcSrq
            | O::ArmXrcSrq
            | O::CreateRmp
            | O::DestroyRmp
            | O::ModifyRmp
            | O::QueryRmp
    )
}

impl Firmware {
    /// Runs one of the SRQ family's commands ([`is_srq`]).
    pub(super) fn execute_srq(
        &mut self,
        inner: &Inner,
        o: Opcode,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use Opcode as O;
        match o {
            O::CreateSrq => self.create_srq(inner, input, outlen),
            O::DestroySrq => self.destroy_srq(inner, input, outlen),
            O::QuerySrq => self.query_srq(inner, input, outlen),
            O::ArmRq => self.arm_rq(inner, input, outlen),
            O::CreateXrcSrq => self.create_xrc_srq(inner, input, outlen),
            O::DestroyXrcSrq => self.destroy_xrc_srq(inner, input, outlen),
            O::QueryXrcSrq => self.query_xrc_srq(inner, input, outlen),
            O::ArmXrcSrq => self.arm_xrc_srq(inner, input, outlen),
            O::CreateRmp => self.create_rmp(inner, input, outlen),
            O::DestroyRmp => self.destroy_rmp(inner, input, outlen),
            O::ModifyRmp => self.modify_rmp(inner, input, outlen),
            O::QueryRmp => self.query_rmp(inner, input, outlen),
            _ => Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE)),
        }
    }

    pub(super) fn create_srq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_srq_in::SIZE_BYTES,
            create_srq_out::SIZE_BYTES,
        )?;
        let c = &input[CTX..CTX + srqc::SIZE_BYTES];
        let log_size = srqc::LOG_SRQ_SIZE.get(c) as u8;
        if u64::from(log_size) > self.cap(cmd_hca_cap::LOG_MAX_SRQ_SZ).max(15) {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_SIZE));
        }
        let pd = srqc::PD.get(c) as u32;
        if !lock(&inner.rdma.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_BAD_PD));
        }
        let srqn = self.place_srq(
            inner,
            input,
            create_srq_in::SIZE_BYTES,
            SrqSpec {
                pd,
                log_size,
                log_stride: srqc::LOG_RQ_STRIDE.get(c) as u8,
                log_page: 12 + srqc::LOG_PAGE_SIZE.get(c) as u32,
                offset: page_offset_bytes(
                    srqc::PAGE_OFFSET.get(c),
                    12 + srqc::LOG_PAGE_SIZE.get(c) as u32,
                ),
                dbr: srqc::DBR_ADDR.get(c),
                cqn: srqc::CQN.get(c) as u32,
                xrcd: 0,
                lwm: srqc::LWM.get(c) as u16,
                kind: SrqKind::Basic,
                uidx: None,
            },
        )?;
        let mut out = vec![0u8; create_srq_out::SIZE_BYTES];
        create_srq_out::SRQN.set(&mut out, u64::from(srqn));
        Ok(out)
    }

    pub(super) fn create_xrc_srq(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            create_xrc_srq_in::SIZE_BYTES,
            create_xrc_srq_out::SIZE_BYTES,
        )?;
        if self.cap(cmd_hca_cap::XRC) == 0 {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        self.check_uid(create_xrc_srq_in::UID.get(input))?;
        let at = create_xrc_srq_in::XRC_SRQ_CONTEXT_ENTRY.off / 8;
        let c = &input[at..at + xrc_srqc::SIZE_BYTES];
        let log_size = xrc_srqc::LOG_XRC_SRQ_SIZE.get(c) as u8;
        if u64::from(log_size) > self.cap(cmd_hca_cap::LOG_MAX_SRQ_SZ).max(15) {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_SIZE));
        }
        let r = &inner.rdma;
        let pd = xrc_srqc::PD.get(c) as u32;
        if !lock(&r.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_BAD_PD));
        }
        let xrcd = xrc_srqc::XRCD.get(c) as u32;
        if !lock(&r.xrcds).contains(&xrcd) {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_BAD_XRCD));
        }
        let cqn = xrc_srqc::CQN.get(c) as u32;
        if !rlock(&r.cqs).contains_key(&cqn) {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_BAD_CQ));
        }
        let log_stride = xrc_srqc::LOG_RQ_STRIDE.get(c) as u8;
        let dbr = xrc_srqc::DB_RECORD_ADDR_H.get(c) << 32 | xrc_srqc::DB_RECORD_ADDR_L.get(c) << 2;
        let srqn = self.place_srq(
            inner,
            input,
            create_xrc_srq_in::SIZE_BYTES,
            SrqSpec {
                pd,
                log_size,
                log_stride,
                log_page: 12 + xrc_srqc::LOG_PAGE_SIZE.get(c) as u32,
                offset: page_offset_bytes(
                    xrc_srqc::PAGE_OFFSET.get(c),
                    12 + xrc_srqc::LOG_PAGE_SIZE.get(c) as u32,
                ),
                dbr,
                cqn,
                xrcd,
                kind: SrqKind::Xrc,
                lwm: xrc_srqc::LWM.get(c) as u16,
                uidx: (self
                    .caps
                    .get(crate::profile::cap_type::GENERAL, cmd_hca_cap::CQE_VERSION)
                    == 1)
                    .then(|| {
                        if xrc_srqc::USER_INDEX_EQUAL_XRC_SRQN.get(c) != 0 {
                            u32::MAX
                        } else {
                            xrc_srqc::USER_INDEX.get(c) as u32
                        }
                    }),
            },
        )?;
        let mut out = vec![0u8; create_xrc_srq_out::SIZE_BYTES];
        create_xrc_srq_out::XRC_SRQN.set(&mut out, u64::from(srqn));
        Ok(out)
    }

    pub(super) fn create_rmp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_rmp_in::SIZE_BYTES,
            create_rmp_out::SIZE_BYTES,
        )?;
        self.check_uid(create_rmp_in::UID.get(input))?;
        let at = create_rmp_in::CTX.off / 8;
        let c = &input[at..at + rmpc::SIZE_BYTES];
        if rmpc::STATE.get(c) != RMPC_STATE_RDY {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_STATE));
        }
        let w = &c[rmpc::WQ.off / 8..rmpc::WQ.off / 8 + wq::SIZE_BYTES];
        if wq::WQ_TYPE.get(w) != WQ_TYPE_LINKED_LIST {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_WQ_TYPE));
        }
        let log_size = wq::LOG_WQ_SZ.get(w) as u8;
        if u64::from(log_size) > self.cap(cmd_hca_cap::LOG_MAX_SRQ_SZ).max(15) {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_SIZE));
        }
        // A receive WQE is at least a next segment and one data segment.
        let log_wq_stride = wq::LOG_WQ_STRIDE.get(w) as u8;
        if !(5..=11).contains(&log_wq_stride) {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_SIZE));
        }
        let r = &inner.rdma;
        let pd = wq::PD.get(w) as u32;
        if !lock(&r.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_BAD_PD));
        }
        let log_stride = log_wq_stride - 4;
        let srqn = self.place_srq(
            inner,
            input,
            create_rmp_in::SIZE_BYTES,
            SrqSpec {
                pd,
                log_size,
                log_stride,
                log_page: 12 + wq::LOG_WQ_PG_SZ.get(w) as u32,
                offset: page_offset_bytes(
                    wq::PAGE_OFFSET.get(w),
                    12 + wq::LOG_WQ_PG_SZ.get(w) as u32,
                ),
                dbr: wq::DBR_ADDR.get(w),
                cqn: 0,
                xrcd: 0,
                lwm: wq::LWM.get(w) as u16,
                kind: SrqKind::Rmp,
                uidx: None,
            },
        )?;
        let mut out = vec![0u8; create_rmp_out::SIZE_BYTES];
        create_rmp_out::RMPN.set(&mut out, u64::from(srqn));
        Ok(out)
    }

    /// Takes the queue's page list (`pas` after `in_size` bytes of input),
    /// checks its doorbell record is mapped, and gives it the lowest free
    /// SRQ number (one space for SRQs, XRC SRQs and RMPs).
    fn place_srq(
        &mut self,
        inner: &Inner,
        input: &[u8],
        in_size: usize,
        s: SrqSpec,
    ) -> Result<u32, Fail> {
        let bytes = s.offset + ((16u64 << s.log_stride) << s.log_size);
        let npas = bytes.div_ceil(1 << s.log_page) as usize;
        let pas = pas(input, in_size, npas)?;
        if !inner.bus.dma.is_mapped(s.dbr, 4) {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_NOT_MAPPED));
        }
        let max = 1u32 << self.cap(cmd_hca_cap::LOG_MAX_SRQ).clamp(1, 24);
        let xrc_cq = (s.kind == SrqKind::Xrc)
            .then(|| rlock(&inner.rdma.cqs).get(&s.cqn).cloned())
            .flatten();
        let mut t = wlock(&inner.rdma.srqs);
        let Some(srqn) = (1..max).find(|n| !t.contains_key(n)) else {
            return Err(fail(CmdStatus::NoResources, synd::SRQ_EXHAUSTED));
        };
        t.insert(
            srqn,
            Arc::new(Srq {
                srqn,
                pd: s.pd,
                log_size: s.log_size,
                log_stride: s.log_stride,
                buf: Buf::new(pas, s.log_page, s.offset),
                dbr: s.dbr,
                cqn: s.cqn,
                xrcd: s.xrcd,
                kind: s.kind,
                xrc_cq,
                cqe_uidx: s.uidx.map(|u| if u == u32::MAX { srqn } else { u }),
                st: Mutex::new(SrqState {
                    lwm: s.lwm,
                    ..SrqState::default()
                }),
            }),
        );
        Ok(srqn)
    }

    /// MODIFY_RMP: RDY to RDY, taking the low-water mark where the bitmask
    /// names it (mlx5_ib arms an SRQ's limit so, `arm_rmp_cmd`): the
    /// SRQ_RQ_LIMIT event fires once when fewer WQEs remain, as ARM_RQ's.
    pub(super) fn modify_rmp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            modify_rmp_in::SIZE_BYTES,
            modify_rmp_out::SIZE_BYTES,
        )?;
        let s = srq_of_kind(inner, modify_rmp_in::RMPN.get(input) as u32, SrqKind::Rmp)?;
        let at = modify_rmp_in::CTX.off / 8;
        let c = &input[at..at + rmpc::SIZE_BYTES];
        if modify_rmp_in::RMP_STATE.get(input) != RMPC_STATE_RDY
            || rmpc::STATE.get(c) != RMPC_STATE_RDY
        {
            // RDY to RDY is the one transition an RMP has.
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_STATE));
        }
        let b = modify_rmp_in::BITMASK.off / 8;
        if rmp_bitmask::LWM.get(&input[b..b + rmp_bitmask::SIZE_BYTES]) != 0 {
            let w = &c[rmpc::WQ.off / 8..rmpc::WQ.off / 8 + wq::SIZE_BYTES];
            let lwm = wq::LWM.get(w) as u16;
            if u32::from(lwm) >= 1 << s.log_size {
                return Err(fail(CmdStatus::BadParameter, synd::SRQ_BAD_SIZE));
            }
            let mut st = lock(&s.st);
            if st.error {
                return Err(fail(CmdStatus::BadResourceState, synd::SRQ_BAD_STATE));
            }
            st.lwm = lwm;
        }
        Ok(vec![0; modify_rmp_out::SIZE_BYTES])
    }

    /// QUERY_RMP: the RMP's context (state, and the WQ as created, with
    /// the low-water mark now: 0 once its event fired).
    pub(super) fn query_rmp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_rmp_in::SIZE_BYTES,
            query_rmp_out::SIZE_BYTES,
        )?;
        let s = srq_of_kind(inner, query_rmp_in::RMPN.get(input) as u32, SrqKind::Rmp)?;
        let mut out = vec![0u8; query_rmp_out::SIZE_BYTES];
        let at = query_rmp_out::RMP_CONTEXT.off / 8;
        let c = &mut out[at..at + rmpc::SIZE_BYTES];
        let st = lock(&s.st);
        rmpc::STATE.set(
            c,
            if st.error {
                RMPC_STATE_ERR
            } else {
                RMPC_STATE_RDY
            },
        );
        let w = &mut c[rmpc::WQ.off / 8..rmpc::WQ.off / 8 + wq::SIZE_BYTES];
        wq::WQ_TYPE.set(w, WQ_TYPE_LINKED_LIST);
        wq::PD.set(w, u64::from(s.pd));
        wq::DBR_ADDR.set(w, s.dbr);
        wq::LOG_WQ_STRIDE.set(w, u64::from(s.log_stride + 4));
        wq::LOG_WQ_PG_SZ.set(w, u64::from(s.buf.log_page - 12));
        wq::LOG_WQ_SZ.set(w, u64::from(s.log_size));
        wq::PAGE_OFFSET.set(w, page_offset_field(s.buf.offset, s.buf.log_page));
        wq::LWM.set(w, u64::from(st.lwm));
        Ok(out)
    }

    pub(super) fn destroy_rmp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_rmp_in::SIZE_BYTES, 0x10)?;
        let rmpn = destroy_rmp_in::RMPN.get(input) as u32;
        self.remove_srq(inner, rmpn, SrqKind::Rmp)
    }

    pub(super) fn destroy_xrc_srq(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(input, outlen, destroy_xrc_srq_in::SIZE_BYTES, 0x10)?;
        let srqn = destroy_xrc_srq_in::XRC_SRQN.get(input) as u32;
        self.remove_srq(inner, srqn, SrqKind::Xrc)
    }

    /// Destroys SRQ `srqn` if it is of the kind the command names (a basic
    /// SRQ for DESTROY_SRQ, an XRC SRQ for DESTROY_XRC_SRQ) and no QP uses it.
    fn remove_srq(&mut self, inner: &Inner, srqn: u32, kind: SrqKind) -> CmdResult {
        let r = &inner.rdma;
        srq_of_kind(inner, srqn, kind)?;
        if rlock(&r.qps)
            .values()
            .any(|q| q.srq.as_ref().is_some_and(|s| s.srqn == srqn))
        {
            return Err(fail(CmdStatus::BadResourceState, synd::SRQ_IN_USE));
        }
        wlock(&r.srqs).remove(&srqn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn destroy_srq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_srq_in::SIZE_BYTES, 0x10)?;
        let srqn = destroy_srq_in::SRQN.get(input) as u32;
        self.remove_srq(inner, srqn, SrqKind::Basic)
    }

    pub(super) fn query_srq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_srq_in::SIZE_BYTES,
            query_srq_out::SIZE_BYTES,
        )?;
        let srqn = query_srq_in::SRQN.get(input) as u32;
        let Some(s) = rlock(&inner.rdma.srqs).get(&srqn).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_UNKNOWN));
        };
        let mut out = vec![0u8; query_srq_out::SIZE_BYTES];
        let at = query_srq_out::SRQ_CONTEXT_ENTRY.off / 8;
        let c = &mut out[at..at + srqc::SIZE_BYTES];
        let st = lock(&s.st);
        srqc::STATE.set(c, u64::from(st.error));
        srqc::LOG_SRQ_SIZE.set(c, u64::from(s.log_size));
        srqc::LOG_RQ_STRIDE.set(c, u64::from(s.log_stride));
        srqc::CQN.set(c, u64::from(s.cqn));
        srqc::LOG_PAGE_SIZE.set(c, u64::from(s.buf.log_page - 12));
        srqc::PAGE_OFFSET.set(c, page_offset_field(s.buf.offset, s.buf.log_page));
        srqc::PD.set(c, u64::from(s.pd));
        srqc::LWM.set(c, u64::from(st.lwm));
        srqc::WQE_CNT.set(c, u64::from(st.ci));
        srqc::DBR_ADDR.set(c, s.dbr);
        Ok(out)
    }

    /// QUERY_XRC_SRQ: the context as CREATE_XRC_SRQ gave it, with the
    /// state, the limit armed and the WQEs consumed (mlx5_ib's
    /// `query_xrc_srq_cmd`, for `ibv_query_srq` of an XRC SRQ).
    pub(super) fn query_xrc_srq(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use mlx5_hw::ifc::{query_xrc_srq_in, query_xrc_srq_out};
        use mlx5_hw::qp::{XRC_SRQC_STATE_ERROR, XRC_SRQC_STATE_GOOD};
        sized(
            input,
            outlen,
            query_xrc_srq_in::SIZE_BYTES,
            query_xrc_srq_out::SIZE_BYTES,
        )?;
        let n = query_xrc_srq_in::XRC_SRQN.get(input) as u32;
        let s = srq_of_kind(inner, n, SrqKind::Xrc)?;
        let mut out = vec![0u8; query_xrc_srq_out::SIZE_BYTES];
        let at = query_xrc_srq_out::XRC_SRQ_CONTEXT_ENTRY.off / 8;
        let c = &mut out[at..at + xrc_srqc::SIZE_BYTES];
        let st = lock(&s.st);
        let state = if st.error {
            XRC_SRQC_STATE_ERROR
        } else {
            XRC_SRQC_STATE_GOOD
        };
        xrc_srqc::STATE.set(c, u64::from(state));
        xrc_srqc::LOG_XRC_SRQ_SIZE.set(c, u64::from(s.log_size));
        xrc_srqc::LOG_RQ_STRIDE.set(c, u64::from(s.log_stride));
        xrc_srqc::XRCD.set(c, u64::from(s.xrcd));
        xrc_srqc::PAGE_OFFSET.set(c, page_offset_field(s.buf.offset, s.buf.log_page));
        xrc_srqc::CQN.set(c, u64::from(s.cqn));
        xrc_srqc::LOG_PAGE_SIZE.set(c, u64::from(s.buf.log_page - 12));
        xrc_srqc::USER_INDEX.set(c, u64::from(s.cqe_uidx.unwrap_or(0)));
        xrc_srqc::PD.set(c, u64::from(s.pd));
        xrc_srqc::LWM.set(c, u64::from(st.lwm));
        xrc_srqc::WQE_CNT.set(c, u64::from(st.ci));
        xrc_srqc::DB_RECORD_ADDR_H.set(c, s.dbr >> 32);
        xrc_srqc::DB_RECORD_ADDR_L.set(c, (s.dbr & 0xffff_ffff) >> 2);
        Ok(out)
    }

    /// ARM_XRC_SRQ: the limit event of an XRC SRQ (mlx5_ib's
    /// `arm_xrc_srq_cmd`, for `ibv_modify_srq(IBV_SRQ_LIMIT)`), as ARM_RQ's.
    pub(super) fn arm_xrc_srq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use mlx5_hw::ifc::{arm_xrc_srq_in, arm_xrc_srq_out};
        sized(
            input,
            outlen,
            arm_xrc_srq_in::SIZE_BYTES,
            arm_xrc_srq_out::SIZE_BYTES,
        )?;
        if arm_xrc_srq_in::OP_MOD.get(input)
            != u64::from(mlx5_hw::qp::ARM_XRC_SRQ_IN_OP_MOD_XRC_SRQ)
        {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_UNKNOWN));
        }
        let n = arm_xrc_srq_in::XRC_SRQN.get(input) as u32;
        let s = srq_of_kind(inner, n, SrqKind::Xrc)?;
        arm_limit(&s, arm_xrc_srq_in::LWM.get(input) as u16)?;
        Ok(vec![0; arm_xrc_srq_out::SIZE_BYTES])
    }

    pub(super) fn arm_rq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, arm_rq_in::SIZE_BYTES, 0x10)?;
        if arm_rq_in::OP_MOD.get(input) != u64::from(mlx5_hw::qp::ARM_RQ_IN_OP_MOD_SRQ) {
            return Err(fail(CmdStatus::BadParameter, synd::SRQ_UNKNOWN));
        }
        let srqn = arm_rq_in::SRQ_NUMBER.get(input) as u32;
        let Some(s) = rlock(&inner.rdma.srqs).get(&srqn).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::SRQ_UNKNOWN));
        };
        arm_limit(&s, arm_rq_in::LWM.get(input) as u16)?;
        Ok(vec![0; 0x10])
    }
}
