//! CREATE_QP / DESTROY_QP / QUERY_QP and the state transitions
//! (RST2INIT, INIT2INIT, INIT2RTR, RTR2RTS, RTS2RTS, SQERR2RTS, SQD2RTS,
//! 2ERR, 2RST), with the PRM's checks: the command must match the QP's
//! current state (else bad QP state), each transition takes its required
//! context fields and the optional ones its `opt_param_mask` names.

use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};

use mlx5_hw::ifc::{ads, cmd_hca_cap, create_qp_in, create_qp_out, qpc, query_qp_in, query_qp_out};
use mlx5_hw::init::{page_offset_bytes, page_offset_field};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::*;
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::transport::qp::{self as tqp, rq_type, st, state, Buf, Path, Qp, Rq, Sq};
use crate::transport::{rlock, wlock, Rdma};
use crate::{lock, Inner};

/// First QP number firmware hands out.
pub(crate) const FIRST_QPN: u32 = 0x100;
/// Byte offset of the QPC in create_qp_in, query_qp_out and every
/// transition's input.
const CTX: usize = create_qp_in::QPC.off / 8;
const PATH: usize = qpc::PRIMARY_ADDRESS_PATH.off / 8;

fn mtu_bytes(code: u64) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

fn mtu_code(bytes: u32) -> u64 {
    match bytes {
        256 => 1,
        512 => 2,
        1024 => 3,
        2048 => 4,
        4096 => 5,
        _ => 0,
    }
}

fn read_path(c: &[u8]) -> Path {
    let a = &c[PATH..PATH + ads::SIZE_BYTES];
    let mut dgid = [0u8; 16];
    dgid.copy_from_slice(&a[ads::RGID_RIP.off / 8..ads::RGID_RIP.off / 8 + 16]);
    let mac = ads::RMAC_47_32.get(a) << 32 | ads::RMAC_31_0.get(a);
    let mut dmac = [0u8; 6];
    dmac.copy_from_slice(&mac.to_be_bytes()[2..]);
    Path {
        dgid,
        sgid_index: ads::SRC_ADDR_INDEX.get(a) as u8,
        dmac,
        hop_limit: ads::HOP_LIMIT.get(a) as u8,
        tclass: ads::TCLASS.get(a) as u8,
        flow_label: ads::FLOW_LABEL.get(a) as u32,
        udp_sport: ads::UDP_SPORT.get(a) as u16,
        ack_timeout: ads::ACK_TIMEOUT.get(a) as u8,
        pkey_index: ads::PKEY_INDEX.get(a) as u16,
    }
}

/// A QP context's receive queue: its `rq_type` and, on an SRQ, the SRQ
/// (one that exists), or the PRM's refusal.
fn qp_receive_queue(
    r: &crate::transport::Rdma,
    c: &[u8],
) -> Result<(u8, Option<Arc<crate::transport::qp::Srq>>), super::Fail> {
    let rqt = qpc::RQ_TYPE.get(c) as u8;
    if rqt == rq_type::SRQ {
        let n = qpc::SRQN_RMPN_XRQN.get(c) as u32;
        return match rlock(&r.srqs).get(&n).cloned() {
            Some(s) => Ok((rqt, Some(s))),
            None => Err(fail(CmdStatus::BadResource, synd::QP_BAD_SRQ)),
        };
    }
    if rqt == rq_type::REGULAR || rqt == rq_type::ZERO {
        return Ok((rqt, None));
    }
    Err(fail(CmdStatus::BadParameter, synd::QP_BAD_RQ_TYPE))
}

impl Firmware {
    /// What the QP's CQEs carry in `srqn_uidx`: `qpc.user_index` where the
    /// function reports `cqe_version` 1, else nothing (the SRQ number).
    fn cqe_user_index(&self, c: &[u8]) -> Option<u32> {
        (self.caps.get(
            crate::profile::cap_type::GENERAL,
            mlx5_hw::ifc::cmd_hca_cap::CQE_VERSION,
        ) == 1)
            .then(|| qpc::USER_INDEX.get(c) as u32)
    }

    /// The transport service `c` asks for, if the function offers it (DC
    /// initiators with `dct`, XRC with `xrc`, naming an XRC domain).
    fn qp_service(&self, inner: &Inner, c: &[u8]) -> Result<u8, super::Fail> {
        let service = qpc::ST.get(c) as u8;
        if !matches!(
            service,
            st::RC | st::UC | st::UD | st::QP1 | st::REG_UMR | st::DCI | st::XRC
        ) || (service == st::DCI && self.cap(cmd_hca_cap::DCT) == 0)
            || (service == st::XRC && self.cap(cmd_hca_cap::XRC) == 0)
        {
            return Err(fail(CmdStatus::BadParameter, synd::QP_BAD_ST));
        }
        // An XRC QP (initiator or target) names its domain.
        if service == st::XRC && !lock(&inner.rdma.xrcds).contains(&(qpc::XRCD.get(c) as u32)) {
            return Err(fail(CmdStatus::BadResource, synd::QP_BAD_XRCD));
        }
        Ok(service)
    }

    pub(super) fn create_qp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_qp_in::SIZE_BYTES,
            create_qp_out::SIZE_BYTES,
        )?;
        let c = &input[CTX..CTX + qpc::SIZE_BYTES];
        let r = &inner.rdma;
        let service = self.qp_service(inner, c)?;
        let (log_dci_streams, log_dci_errored) = self.dci_streams(service, c)?;
        // A UMR QP has no PD: its WQEs name the mkey's PD in the mkey
        // context, and Linux's create_kernel_qp leaves the field 0 for it
        // (setting latency_sensitive instead).
        let pd = if service == st::REG_UMR {
            0
        } else {
            qpc::PD.get(c) as u32
        };
        if service != st::REG_UMR && !lock(&r.pds).contains(&pd) {
            tracing::debug!(pd, st = service, "CREATE_QP: no such PD");
            return Err(fail(CmdStatus::BadResource, synd::QP_BAD_PD));
        }
        let cqs = rlock(&r.cqs);
        let (Some(scq), Some(rcq)) = (
            cqs.get(&(qpc::CQN_SND.get(c) as u32)).cloned(),
            cqs.get(&(qpc::CQN_RCV.get(c) as u32)).cloned(),
        ) else {
            return Err(fail(CmdStatus::BadResource, synd::QP_BAD_CQ));
        };
        drop(cqs);
        let (rqt, srq) = qp_receive_queue(r, c)?;
        let no_sq = qpc::NO_SQ.get(c) != 0;
        // A QP without a send queue rings no doorbell: its UAR is not
        // read (Linux leaves it 0 for an XRC target).
        let uar = qpc::UAR_PAGE.get(c) as u32;
        if !no_sq && !self.uars.contains(&uar) {
            return Err(fail(CmdStatus::BadResource, synd::QP_BAD_UAR));
        }
        let max_sz = self.cap(cmd_hca_cap::LOG_MAX_QP_SZ);
        let log_rq_size = qpc::LOG_RQ_SIZE.get(c) as u8;
        let log_sq_size = qpc::LOG_SQ_SIZE.get(c) as u8;
        if u64::from(log_rq_size) > max_sz || u64::from(log_sq_size) > max_sz {
            return Err(fail(CmdStatus::BadParameter, synd::QP_BAD_SIZE));
        }
        let log_rq_stride = qpc::LOG_RQ_STRIDE.get(c) as u8 + 4;
        let rq_bytes = if rqt == rq_type::REGULAR {
            (1u64 << log_rq_size) << log_rq_stride
        } else {
            0
        };
        let sq_bytes = if no_sq { 0 } else { 64u64 << log_sq_size };
        let (buf, dbr, umems) = self.qp_memory(inner, input, rq_bytes + sq_bytes)?;
        let mut t = wlock(&r.qps);
        // One number space with the SQs and RQs (fw/sq.rs, fw/rq.rs).
        let qpn = self.free_queue_number_in(&t, &r.qp_floor, synd::QP_EXHAUSTED)?;
        if service == st::QP1 {
            let mut g = wlock(&r.gsi);
            if g.is_some() {
                return Err(fail(CmdStatus::ResourceBusy, synd::QP_GSI_EXISTS));
            }
            *g = Some(qpn);
        }
        let cqe_uidx = self.cqe_user_index(c);
        let xrcd = if service == st::XRC {
            qpc::XRCD.get(c) as u32
        } else {
            0
        };
        tracing::debug!(
            qpn,
            st = service,
            log_sq_size,
            log_rq_size,
            log_page = buf.log_page,
            offset = buf.offset,
            "CREATE_QP"
        );
        t.insert(
            qpn,
            Arc::new(Qp {
                qpn,
                st: service,
                pd,
                scq,
                rcq,
                srq,
                rq_type: rqt,
                log_rq_size,
                log_rq_stride,
                log_sq_size,
                sq_offset: rq_bytes,
                buf,
                dbr,
                uar,
                cqe_uidx,
                state: AtomicU8::new(state::RST),
                counter_set: std::sync::atomic::AtomicU32::new(0),
                sq: Mutex::new(Sq::default()),
                rq: Mutex::new(Rq::default()),
                dct_conn: false,
                log_dci_streams,
                log_dci_errored,
                cs_req: qpc::CS_REQ.get(c) as u8,
                cs_res: qpc::CS_RES.get(c) as u8,
                block_lb_mc: qpc::BLOCK_LB_MC.get(c) != 0,
                xrcd,
                no_sq,
            }),
        );
        drop(t);
        self.umem_used_by(super::uctx::Kind::Qp, qpn, &umems);
        if !no_sq {
            r.track_uar(uar, true);
        }
        let mut out = vec![0u8; create_qp_out::SIZE_BYTES];
        create_qp_out::QPN.set(&mut out, u64::from(qpn));
        Ok(out)
    }

    /// Where a new QP's `bytes` of work queues and its doorbell record
    /// lie: the command's PAS list and `dbr_addr`, or (DevX) `wq_umem_id` at
    /// `wq_umem_offset` and `dbr_umem_id` at `dbr_addr`; and the UMEMs used.
    fn qp_memory(
        &self,
        inner: &Inner,
        input: &[u8],
        bytes: u64,
    ) -> Result<(Buf, u64, Vec<u32>), super::Fail> {
        let c = &input[CTX..CTX + qpc::SIZE_BYTES];
        let uid = super::uctx::uid_of(input);
        let mut umems = Vec::new();
        let buf = if create_qp_in::WQ_UMEM_VALID.get(input) != 0 {
            let id = create_qp_in::WQ_UMEM_ID.get(input) as u32;
            umems.push(id);
            self.umem_buf(uid, id, create_qp_in::WQ_UMEM_OFFSET.get(input), bytes)?
        } else {
            let log_page = 12 + qpc::LOG_PAGE_SIZE.get(c) as u32;
            let offset = page_offset_bytes(qpc::PAGE_OFFSET.get(c), log_page);
            let npas = (offset + bytes).div_ceil(1 << log_page) as usize;
            let pas = super::cq::pas(input, create_qp_in::SIZE_BYTES, npas)?;
            Buf::new(pas, log_page, offset)
        };
        let dbr = if qpc::DBR_UMEM_VALID.get(c) != 0 {
            let id = qpc::DBR_UMEM_ID.get(c) as u32;
            umems.push(id);
            self.umem_dbr(uid, id, qpc::DBR_ADDR.get(c))?
        } else {
            let dbr = qpc::DBR_ADDR.get(c);
            if !inner.bus.dma.is_mapped(dbr, 8) {
                return Err(fail(CmdStatus::BadParameter, synd::QP_NOT_MAPPED));
            }
            dbr
        };
        Ok((buf, dbr, umems))
    }

    pub(super) fn destroy_qp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, 0x10)?;
        let qpn = qpn_of(input);
        let r = &inner.rdma;
        let Some(qp) = wlock(&r.qps).remove(&qpn) else {
            return Err(fail(CmdStatus::BadResource, synd::QP_UNKNOWN));
        };
        crate::transport::freed(&r.qp_floor, qpn);
        // Wait out any packet or WQE in flight on it.
        let _sq = lock(&qp.sq);
        let _rq = lock(&qp.rq);
        qp.destroyed();
        r.odp.forget_qp(qpn);
        super::mcg::forget_qp(r, qpn);
        let mut g = wlock(&r.gsi);
        if *g == Some(qpn) {
            *g = None;
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_qp(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_qp_in::SIZE_BYTES,
            query_qp_out::QPC.off / 8 + qpc::SIZE_BYTES,
        )?;
        let qpn = query_qp_in::QPN.get(input) as u32;
        let Some(qp) = inner.rdma.qp(qpn) else {
            return Err(fail(CmdStatus::BadResource, synd::QP_UNKNOWN));
        };
        let mut out = vec![
            0u8;
            query_qp_out::SIZE_BYTES
                .max(outlen.min(query_qp_out::SIZE_BYTES + 8 * qp.buf.pas.len()))
        ];
        let at = query_qp_out::QPC.off / 8;
        let c = &mut out[at..at + qpc::SIZE_BYTES];
        let sq = lock(&qp.sq);
        let rq = lock(&qp.rq);
        qpc::STATE.set(c, u64::from(qp.state()));
        qpc::ST.set(c, u64::from(qp.st));
        qpc::PD.set(c, u64::from(qp.pd));
        qpc::MTU.set(c, mtu_code(sq.mtu));
        qpc::LOG_MSG_MAX.set(c, 30);
        qpc::LOG_RQ_SIZE.set(c, u64::from(qp.log_rq_size));
        qpc::LOG_RQ_STRIDE.set(c, u64::from(qp.log_rq_stride - 4));
        qpc::LOG_SQ_SIZE.set(c, u64::from(qp.log_sq_size));
        // The model's transport places every message's data in order
        // (one packet after another, no out-of-order placement), so a
        // device that reports it (`qp_data_in_order`) says so of every
        // QP (rdma-core asks only in RTS).
        qpc::CS_REQ.set(c, u64::from(qp.cs_req));
        qpc::CS_RES.set(c, u64::from(qp.cs_res));
        qpc::BLOCK_LB_MC.set(c, u64::from(qp.block_lb_mc));
        qpc::DATA_IN_ORDER.set(c, self.cap(cmd_hca_cap::QP_DATA_IN_ORDER));
        qpc::UAR_PAGE.set(c, u64::from(qp.uar));
        qpc::LOG_PAGE_SIZE.set(c, u64::from(qp.buf.log_page - 12));
        // A queue in a UMEM: the offset within its page.
        qpc::PAGE_OFFSET.set(c, page_offset_field(qp.buf.offset, qp.buf.log_page));
        qpc::REMOTE_QPN.set(c, u64::from(sq.remote_qpn));
        {
            let a = &mut c[PATH..PATH + ads::SIZE_BYTES];
            a[ads::RGID_RIP.off / 8..ads::RGID_RIP.off / 8 + 16].copy_from_slice(&sq.path.dgid);
            ads::SRC_ADDR_INDEX.set(a, u64::from(sq.path.sgid_index));
            ads::HOP_LIMIT.set(a, u64::from(sq.path.hop_limit));
            ads::TCLASS.set(a, u64::from(sq.path.tclass));
            ads::FLOW_LABEL.set(a, u64::from(sq.path.flow_label));
            ads::UDP_SPORT.set(a, u64::from(sq.path.udp_sport));
            ads::ACK_TIMEOUT.set(a, u64::from(sq.path.ack_timeout));
            ads::PKEY_INDEX.set(a, u64::from(sq.path.pkey_index));
            ads::VHCA_PORT_NUM.set(a, 1);
            let mut m = [0u8; 8];
            m[2..].copy_from_slice(&sq.path.dmac);
            let mac = u64::from_be_bytes(m);
            ads::RMAC_47_32.set(a, mac >> 32);
            ads::RMAC_31_0.set(a, mac & 0xffff_ffff);
        }
        qpc::RETRY_COUNT.set(c, u64::from(sq.retry_count));
        qpc::RNR_RETRY.set(c, u64::from(sq.rnr_retry));
        qpc::NEXT_SEND_PSN.set(c, u64::from(sq.psn));
        qpc::CQN_SND.set(c, u64::from(qp.scq.cqn));
        qpc::RRE.set(c, u64::from(rq.rre));
        qpc::RWE.set(c, u64::from(rq.rwe));
        qpc::RAE.set(c, u64::from(rq.rae));
        qpc::MIN_RNR_NAK.set(c, u64::from(rq.min_rnr_nak));
        qpc::NEXT_RCV_PSN.set(c, u64::from(rq.epsn));
        qpc::CQN_RCV.set(c, u64::from(qp.rcq.cqn));
        qpc::DBR_ADDR.set(c, qp.dbr);
        qpc::Q_KEY.set(c, u64::from(rq.qkey));
        qpc::RQ_TYPE.set(c, u64::from(qp.rq_type));
        if let Some(s) = &qp.srq {
            qpc::SRQN_RMPN_XRQN.set(c, u64::from(s.srqn));
        }
        qpc::HW_SQ_WQEBB_COUNTER.set(c, u64::from(sq.ci));
        qpc::HW_RQ_COUNTER.set(c, u64::from(rq.ci));
        Ok(out)
    }

    /// One state transition command (PRM "Modify QP"): the transition
    /// the opcode names must start from the QP's state; a command with a
    /// QPC applies it (`apply_qpc`); then the QP is in the new state.
    pub(super) fn modify_qp(
        &mut self,
        inner: &Inner,
        op: Opcode,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        let with_ctx = !matches!(op, Opcode::ToErrQp | Opcode::ToRstQp);
        // Every transition with a QPC has the same 0x110-byte layout in
        // mlx5_ifc.h (the QPC, then a reserved tail), 2ERR and 2RST 0x10.
        let inlen = if with_ctx {
            mlx5_hw::ifc::rst2init_qp_in::SIZE_BYTES
        } else {
            mlx5_hw::ifc::qp_2rst_in::SIZE_BYTES
        };
        sized(input, outlen, inlen, 0x10)?;
        let qpn = qpn_of(input);
        let r = &inner.rdma;
        let Some(qp) = r.qp(qpn) else {
            return Err(fail(CmdStatus::BadResource, synd::QP_UNKNOWN));
        };
        let cur = qp.state();
        let (from, to) = transition(op);
        if !from.contains(&cur) {
            return Err(fail(CmdStatus::BadQpState, synd::QP_BAD_STATE));
        }
        let mask = u32::from_be_bytes(
            input
                .get(0x10..0x14)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 4]),
        );
        let mut sq = lock(&qp.sq);
        let mut rq = lock(&qp.rq);
        if with_ctx {
            let c = &input[CTX..CTX + qpc::SIZE_BYTES];
            apply_qpc(r, &qp, op, mask, c, &mut sq, &mut rq)?;
            if op == Opcode::Rts2RtsQp {
                super::dct::dci_stream_reset(&qp, input, &mut sq)?;
            }
        }
        if to == state::RST {
            *sq = Sq::default();
            *rq = Rq::default();
        }
        if to == state::RTS && cur == state::SQER {
            sq.retry = None;
        }
        qp.set_state(to);
        drop(sq);
        drop(rq);
        if to == state::ERR || to == state::RTS {
            r.attend(qpn);
        }
        let _ = tqp::st::RC;
        Ok(vec![0; 0x10])
    }
}

/// Every QP state: where 2ERR and 2RST may start.
const ANY_STATE: &[u8] = &[
    state::RST,
    state::INIT,
    state::RTR,
    state::RTS,
    state::SQER,
    state::SQD,
    state::ERR,
];

/// The states a transition command may start from, and the one it ends in.
fn transition(op: Opcode) -> (&'static [u8], u8) {
    match op {
        Opcode::Rst2InitQp => (&[state::RST], state::INIT),
        Opcode::Init2InitQp => (&[state::INIT], state::INIT),
        Opcode::Init2RtrQp => (&[state::INIT], state::RTR),
        Opcode::Rtr2RtsQp => (&[state::RTR], state::RTS),
        Opcode::Rts2RtsQp => (&[state::RTS], state::RTS),
        Opcode::Sqerr2RtsQp => (&[state::SQER], state::RTS),
        Opcode::SqdRtsQp => (&[state::SQD], state::RTS),
        Opcode::ToErrQp => (ANY_STATE, state::ERR),
        _ => (ANY_STATE, state::RST),
    }
}

/// Applies a transition's QPC `c`: on RST2INIT every field, else those the
/// opt-param `mask` names, plus what the transition itself sets (INIT2RTR
/// the path, remote QP and MTU; RTR2RTS the send PSN and retry counts).
fn apply_qpc(
    r: &Rdma,
    qp: &Qp,
    op: Opcode,
    mask: u32,
    c: &[u8],
    sq: &mut Sq,
    rq: &mut Rq,
) -> Result<(), Fail> {
    let ud = matches!(qp.st, st::UD | st::QP1);
    apply_access(r, qp, op, mask, c, sq, rq)?;
    // A DCI's path comes with each WQE (its address vector).
    let rtr_path = op == Opcode::Init2RtrQp && qp.st != st::DCI;
    if (rtr_path || mask & QP_OPTPAR_PRIMARY_ADDR_PATH != 0) && !ud {
        apply_path(r, op, c, sq)?;
    }
    if op == Opcode::Init2RtrQp {
        apply_rtr(ud, c, sq, rq)?;
    }
    if op != Opcode::Init2RtrQp && mask & QP_OPTPAR_RNR_TIMEOUT != 0 {
        rq.min_rnr_nak = qpc::MIN_RNR_NAK.get(c) as u8;
    }
    apply_retry(ud, op, mask, c, sq);
    Ok(())
}

/// Remote access, Q_Key, counter set, P_Key index and port.
fn apply_access(
    r: &Rdma,
    qp: &Qp,
    op: Opcode,
    mask: u32,
    c: &[u8],
    sq: &mut Sq,
    rq: &mut Rq,
) -> Result<(), Fail> {
    let ud = matches!(qp.st, st::UD | st::QP1);
    let all = op == Opcode::Rst2InitQp;
    if all || mask & QP_OPTPAR_RRE != 0 {
        rq.rre = qpc::RRE.get(c) != 0;
    }
    if all || mask & QP_OPTPAR_RWE != 0 {
        rq.rwe = qpc::RWE.get(c) != 0;
    }
    if all || mask & QP_OPTPAR_RAE != 0 {
        rq.rae = qpc::RAE.get(c) != 0;
    }
    if (all && ud) || mask & QP_OPTPAR_Q_KEY != 0 {
        rq.qkey = qpc::Q_KEY.get(c) as u32;
        sq.qkey = rq.qkey;
    }
    if all || mask & QP_OPTPAR_COUNTER_SET_ID != 0 {
        let id = qpc::COUNTER_SET_ID.get(c) as u32;
        if id != 0 && !lock(&r.q_counters).contains_key(&id) {
            return Err(fail(CmdStatus::BadParameter, synd::Q_COUNTER_UNKNOWN));
        }
        qp.counter_set
            .store(id, std::sync::atomic::Ordering::Relaxed);
    }
    if all || mask & QP_OPTPAR_PKEY_INDEX != 0 {
        sq.path.pkey_index = ads::PKEY_INDEX.get(&c[PATH..]) as u16;
    }
    if all {
        let port = ads::VHCA_PORT_NUM.get(&c[PATH..]);
        if port > 1 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_PORT));
        }
        if ud {
            sq.mtu = 4096;
            rq.mtu = 4096;
        }
    }
    Ok(())
}

/// A connected QP's primary address path (its source GID must exist); the
/// ACK timeout is RTR2RTS's, so INIT2RTR keeps the old one.
fn apply_path(r: &Rdma, op: Opcode, c: &[u8], sq: &mut Sq) -> Result<(), Fail> {
    let p = read_path(c);
    if rlock(&r.gids)
        .get(usize::from(p.sgid_index))
        .copied()
        .flatten()
        .is_none()
    {
        return Err(fail(CmdStatus::BadParameter, synd::QP_BAD_SGID));
    }
    let ack = sq.path.ack_timeout;
    sq.path = p;
    if op == Opcode::Init2RtrQp {
        sq.path.ack_timeout = ack;
    }
    sq.peer = None;
    Ok(())
}

/// INIT2RTR: the path MTU; on a connected QP also the remote QP, the
/// expected PSN and the RNR NAK timer.
fn apply_rtr(ud: bool, c: &[u8], sq: &mut Sq, rq: &mut Rq) -> Result<(), Fail> {
    let m = mtu_bytes(qpc::MTU.get(c));
    if !ud {
        if m == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::QP_BAD_MTU));
        }
        sq.remote_qpn = qpc::REMOTE_QPN.get(c) as u32;
        rq.remote_qpn = sq.remote_qpn;
        rq.epsn = qpc::NEXT_RCV_PSN.get(c) as u32;
        rq.min_rnr_nak = qpc::MIN_RNR_NAK.get(c) as u8;
        sq.mtu = m;
        rq.mtu = m;
    } else if m != 0 {
        sq.mtu = m;
        rq.mtu = m;
    }
    Ok(())
}

/// RTR2RTS: the send PSN and (connected) the retry counts and ACK timeout;
/// later transitions change those the mask names. The retry budgets start
/// full.
fn apply_retry(ud: bool, op: Opcode, mask: u32, c: &[u8], sq: &mut Sq) {
    if op == Opcode::Rtr2RtsQp {
        sq.psn = qpc::NEXT_SEND_PSN.get(c) as u32;
        if !ud {
            sq.retry_count = qpc::RETRY_COUNT.get(c) as u8;
            sq.rnr_retry = qpc::RNR_RETRY.get(c) as u8;
            sq.path.ack_timeout = ads::ACK_TIMEOUT.get(&c[PATH..]) as u8;
        }
    } else {
        if mask & QP_OPTPAR_RETRY_COUNT != 0 {
            sq.retry_count = qpc::RETRY_COUNT.get(c) as u8;
        }
        if mask & QP_OPTPAR_RNR_RETRY != 0 {
            sq.rnr_retry = qpc::RNR_RETRY.get(c) as u8;
        }
        if mask & QP_OPTPAR_ACK_TIMEOUT != 0 {
            sq.path.ack_timeout = ads::ACK_TIMEOUT.get(&c[PATH..]) as u8;
        }
    }
    sq.retries_left = sq.retry_count;
    sq.rnr_left = sq.rnr_retry;
}

fn qpn_of(input: &[u8]) -> u32 {
    u32::from_be_bytes(
        input
            .get(8..12)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 4]),
    ) & 0xff_ffff
}
