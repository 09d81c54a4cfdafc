//! CREATE_RQ / MODIFY_RQ / DESTROY_RQ / QUERY_RQ: receive queues, the rings
//! mlx5e receives on (its drop RQ at probe, one per channel when the
//! netdev opens). An RQ is born in RST on its own `wq` (linked list,
//! cyclic, or striding where the card has it) or on an RMP, completes to a
//! CQ and counts into a Q counter set; MODIFY_RQ moves its state and the
//! fields its bitmask selects (vsd, counter_set_id; scatter_fcs only where
//! the caps offer it, which no profile does). RQ
//! numbers share the QP number space with SQs. An RQ on its own cyclic or
//! linked-list ring, striding or not, is also a data-path queue
//! ([`crate::transport::eth_rx`]) that steering delivers frames into; RQs
//! on an RMP are kept as objects only (nothing is received into them yet).

use mlx5_hw::eth::{
    MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID, MODIFY_RQ_BITMASK_SCATTER_FCS, MODIFY_RQ_BITMASK_VSD,
    QUEUE_STATE_RST, RQC_MEM_RQ_TYPE_INLINE, RQC_MEM_RQ_TYPE_RMP, WQ_TYPE_CYCLIC,
    WQ_TYPE_CYCLIC_STRIDING_RQ, WQ_TYPE_LINKED_LIST, WQ_TYPE_LINKED_LIST_STRIDING_RQ,
};
use mlx5_hw::ifc::{
    cmd_hca_cap, create_rq_in, create_rq_out, destroy_rq_in, modify_rq_in,
    per_protocol_networking_offload_caps as eth_cap, query_rq_in, query_rq_out, rq_num, rqc, rqtc,
    tirc, wq,
};
use mlx5_hw::status::CmdStatus;

use super::eth::{known, queue_transition, Obj, WqMem};
use super::uctx::Kind;
use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::profile::cap_type;
use crate::transport::eth_rx::{EthRq, RqRing, Striding};
use crate::transport::{rlock, wlock};
use crate::{lock, Inner};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

impl Firmware {
    /// A Q counter set an RQ counts into: 0 (the default set) or one
    /// ALLOC_Q_COUNTER handed out.
    fn check_counter_set(&self, inner: &Inner, id: u64) -> Result<(), Fail> {
        if id != 0 && !lock(&inner.rdma.q_counters).contains_key(&(id as u32)) {
            return Err(fail(CmdStatus::BadResource, synd::RQ_BAD_COUNTER));
        }
        Ok(())
    }

    /// `rqc.scatter_fcs` (the frame check sequence kept at the end of
    /// each frame) only where the card offers it: no profile does, so a
    /// request for it is refused rather than stored and ignored.
    fn check_scatter_fcs(&self, c: &[u8]) -> Result<(), Fail> {
        let offered = self
            .caps
            .get(cap_type::ETHERNET_OFFLOADS, eth_cap::SCATTER_FCS)
            != 0;
        if rqc::SCATTER_FCS.get(c) != 0 && !offered {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_PARAM));
        }
        Ok(())
    }

    /// The RQ's own checks (state, ring type, CQ, RMP).
    fn check_rqc(&self, inner: &Inner, c: &[u8]) -> Result<(), Fail> {
        if rqc::STATE.get(c) != QUEUE_STATE_RST {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_STATE));
        }
        if rqc::HAIRPIN.get(c) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_PARAM));
        }
        self.check_scatter_fcs(c)?;
        let w = &c[rqc::WQ.off / 8..];
        let striding = self.cap(cmd_hca_cap::STRIDING_RQ) != 0;
        match wq::WQ_TYPE.get(w) {
            WQ_TYPE_LINKED_LIST | WQ_TYPE_CYCLIC => {}
            WQ_TYPE_LINKED_LIST_STRIDING_RQ | WQ_TYPE_CYCLIC_STRIDING_RQ if striding => {
                // A WQE holds the next-WQE and the data segment; the
                // extended stride counts need `ext_stride_num_range`.
                let ext = self.cap(cmd_hca_cap::EXT_STRIDE_NUM_RANGE) != 0;
                if wq::LOG_WQ_STRIDE.get(w) < 5 || (wq::LOG_WQE_NUM_OF_STRIDES.get(w) > 9 && !ext) {
                    return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_PARAM));
                }
            }
            _ => return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_TYPE)),
        }
        if !rlock(&inner.rdma.cqs).contains_key(&(rqc::CQN.get(c) as u32)) {
            return Err(fail(CmdStatus::BadResource, synd::WQ_BAD_CQ));
        }
        self.check_counter_set(inner, rqc::COUNTER_SET_ID.get(c))
    }

    pub(super) fn create_rq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use create_rq_in as i;
        sized(input, outlen, i::SIZE_BYTES, create_rq_out::SIZE_BYTES)?;
        self.check_uid(i::UID.get(input))?;
        let at = i::CTX.off / 8;
        let c = &input[at..at + rqc::SIZE_BYTES];
        self.check_rqc(inner, c)?;
        let mut wq_mem = None;
        match rqc::MEM_RQ_TYPE.get(c) {
            RQC_MEM_RQ_TYPE_INLINE => {
                wq_mem = Some(self.check_wq(
                    inner,
                    input,
                    at + rqc::WQ.off / 8,
                    i::SIZE_BYTES,
                    false,
                )?);
            }
            RQC_MEM_RQ_TYPE_RMP => {
                if !rlock(&inner.rdma.srqs).contains_key(&(rqc::RMPN.get(c) as u32)) {
                    return Err(fail(CmdStatus::BadResource, synd::RQ_BAD_RMP));
                }
            }
            _ => return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_TYPE)),
        }
        let rqn = self.free_queue_number(inner, synd::WQ_EXHAUSTED)?;
        tracing::debug!(rqn, cqn = rqc::CQN.get(c), "CREATE_RQ");
        self.eth.rqs.insert(rqn, Obj { ctx: c.to_vec() });
        if let Some(m) = wq_mem {
            self.umem_used_by(Kind::Rq, rqn, &m.umems);
            // Its CQEs name it by `user_index` in `srqn_uidx` under
            // cqe_version 1 (as a QP's do: mlx5_ib sets it from the raw
            // packet QP's, libmlx5 finds the queue by it).
            let uidx = if self.cap(cmd_hca_cap::CQE_VERSION) == 1 {
                rqc::USER_INDEX.get(c) as u32
            } else {
                0
            };
            if let Some(rq) = data_path_rq(inner, rqn, c, m, uidx) {
                wlock(&inner.rdma.eth_rx.rqs).insert(rqn, Arc::new(rq));
            }
        }
        let mut out = vec![0u8; create_rq_out::SIZE_BYTES];
        create_rq_out::RQN.set(&mut out, u64::from(rqn));
        Ok(out)
    }

    pub(super) fn modify_rq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use modify_rq_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let rqn = i::RQN.get(input) as u32;
        let cur = rqc::STATE.get(&known(&self.eth.rqs, rqn, synd::RQ_UNKNOWN)?.ctx);
        if i::RQ_STATE.get(input) != cur {
            return Err(fail(CmdStatus::BadResourceState, synd::WQ_STATE_MISMATCH));
        }
        let c = &input[i::CTX.off / 8..][..rqc::SIZE_BYTES];
        let next = rqc::STATE.get(c);
        queue_transition(cur, next)?;
        let bitmask = i::MODIFY_BITMASK.get(input);
        if bitmask & MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID != 0 {
            self.check_counter_set(inner, rqc::COUNTER_SET_ID.get(c))?;
        }
        if bitmask & MODIFY_RQ_BITMASK_SCATTER_FCS != 0 {
            self.check_scatter_fcs(c)?;
        }
        let Some(rq) = self.eth.rqs.get_mut(&rqn) else {
            return Err(fail(CmdStatus::BadResource, synd::RQ_UNKNOWN));
        };
        rqc::STATE.set(&mut rq.ctx, next);
        if let Some(q) = rlock(&inner.rdma.eth_rx.rqs).get(&rqn) {
            if next == QUEUE_STATE_RST {
                q.reset(&inner.rdma.eth_rx);
            }
            if bitmask & MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID != 0 {
                let id = rqc::COUNTER_SET_ID.get(c) as u32;
                q.counter_set.store(id, Ordering::Relaxed);
            }
            if bitmask & MODIFY_RQ_BITMASK_VSD != 0 {
                q.vsd.store(rqc::VSD.get(c) != 0, Ordering::Relaxed);
            }
            q.state.store(next as u8, Ordering::Release);
        }
        for (bit, f) in [
            (MODIFY_RQ_BITMASK_VSD, rqc::VSD),
            (MODIFY_RQ_BITMASK_SCATTER_FCS, rqc::SCATTER_FCS),
            (MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID, rqc::COUNTER_SET_ID),
        ] {
            if bitmask & bit != 0 {
                f.set(&mut rq.ctx, f.get(c));
            }
        }
        Ok(vec![0; 0x10])
    }

    /// Whether an RQ table lists `rqn` or a direct TIR delivers to it.
    fn rq_referenced(&self, rqn: u32) -> bool {
        let listed = |t: &Obj| {
            t.ctx[rqtc::SIZE_BYTES..]
                .chunks(rq_num::SIZE_BYTES)
                .any(|e| rq_num::RQ_NUM.get(e) as u32 == rqn)
        };
        let direct = |t: &Obj| {
            tirc::DISP_TYPE.get(&t.ctx) == mlx5_hw::eth::TIRC_DISP_TYPE_DIRECT
                && tirc::INLINE_RQN.get(&t.ctx) as u32 == rqn
        };
        self.eth.rqts.values().any(listed) || self.eth.tirs.values().any(direct)
    }

    pub(super) fn destroy_rq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_rq_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let rqn = i::RQN.get(input) as u32;
        known(&self.eth.rqs, rqn, synd::RQ_UNKNOWN)?;
        if self.rq_referenced(rqn) {
            return Err(fail(CmdStatus::BadResourceState, synd::RQ_IN_USE));
        }
        self.eth.rqs.remove(&rqn);
        let gone = wlock(&inner.rdma.eth_rx.rqs).remove(&rqn);
        if let Some(q) = gone {
            q.reset(&inner.rdma.eth_rx);
        }
        crate::transport::freed(&inner.rdma.qp_floor, rqn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_rq(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use query_rq_out as o;
        sized(input, outlen, query_rq_in::SIZE_BYTES, o::SIZE_BYTES)?;
        let rqn = query_rq_in::RQN.get(input) as u32;
        let rq = known(&self.eth.rqs, rqn, synd::RQ_UNKNOWN)?;
        let mut out = vec![0u8; o::SIZE_BYTES];
        out[o::RQ_CONTEXT.off / 8..][..rqc::SIZE_BYTES].copy_from_slice(&rq.ctx);
        Ok(out)
    }
}

/// The data-path side of an RQ on its own ring, striding or not (`c`: its
/// context, `m`: where its ring and doorbell record lie).
fn data_path_rq(inner: &Inner, rqn: u32, c: &[u8], m: WqMem, user_index: u32) -> Option<EthRq> {
    let w = &c[rqc::WQ.off / 8..];
    let ty = wq::WQ_TYPE.get(w);
    let linked_list = matches!(ty, WQ_TYPE_LINKED_LIST | WQ_TYPE_LINKED_LIST_STRIDING_RQ);
    let striding = matches!(
        ty,
        WQ_TYPE_LINKED_LIST_STRIDING_RQ | WQ_TYPE_CYCLIC_STRIDING_RQ
    )
    .then(|| {
        use mlx5_hw::eth::{
            MPWQE_LOG_NUM_STRIDES_BASE as BASE, MPWQE_LOG_NUM_STRIDES_EXT_BASE as EXT,
            MPWQE_LOG_STRIDE_SZ_BASE,
        };
        // 0..=9: 2^(9 + v); 10..=15: 2^(v - 7), the extended range.
        let v = wq::LOG_WQE_NUM_OF_STRIDES.get(w) as u8;
        Striding {
            log_num: if v <= 9 { BASE + v } else { v - 10 + EXT },
            log_size: MPWQE_LOG_STRIDE_SZ_BASE + wq::LOG_WQE_STRIDE_SIZE.get(w) as u8,
            shift2: wq::TWO_BYTE_SHIFT_EN.get(w) != 0,
        }
    });
    let cq = rlock(&inner.rdma.cqs)
        .get(&(rqc::CQN.get(c) as u32))
        .cloned()?;
    Some(EthRq {
        rqn,
        user_index,
        cq,
        pd: wq::PD.get(w) as u32,
        log_size: wq::LOG_WQ_SZ.get(w) as u8,
        log_stride: wq::LOG_WQ_STRIDE.get(w) as u8,
        linked_list,
        striding,
        buf: m.buf,
        dbr: m.dbr,
        counter_set: AtomicU32::new(rqc::COUNTER_SET_ID.get(c) as u32),
        vsd: AtomicBool::new(rqc::VSD.get(c) != 0),
        state: AtomicU8::new(QUEUE_STATE_RST as u8),
        ring: Mutex::new(RqRing::default()),
    })
}
