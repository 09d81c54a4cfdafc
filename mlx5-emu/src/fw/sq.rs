//! CREATE_SQ / MODIFY_SQ / DESTROY_SQ / QUERY_SQ: send queues, the rings
//! mlx5e sends on (and mlx5_ib's write-combining probe). An SQ is born in
//! RST on a cyclic `wq` of 64-byte WQEBBs, completes to a CQ, sends
//! through a TIS and rings a UAR; MODIFY_SQ moves its state (see
//! [`super::eth::queue_transition`]) and the rate-limit index or QoS group
//! its bitmask selects. SQ numbers share the QP number space (firmware
//! hands out QPs, SQs and RQs from one pool). The data path executes the
//! WQEs posted on an SQ in RDY ([`crate::transport::eth_sq`]) and may move
//! it to ERR; MODIFY_SQ and QUERY_SQ read the state from there.

use mlx5_hw::eth::{
    MODIFY_SQ_BITMASK_PACKET_PACING_RATE_LIMIT_INDEX, MODIFY_SQ_BITMASK_QOS_QUEUE_GROUP_ID,
    QUEUE_STATE_RST, WQ_TYPE_CYCLIC,
};
use mlx5_hw::ifc::{
    cmd_hca_cap, create_sq_in, create_sq_out, destroy_sq_in, modify_sq_in,
    per_protocol_networking_offload_caps as eth_cap, query_sq_in, query_sq_out, sqc, tisc, wq,
};
use mlx5_hw::status::CmdStatus;

use super::eth::{known, limit, queue_transition, Obj};
use super::{fail, sized, synd, CmdResult, Firmware};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::profile::cap_type;
use crate::transport::eth_sq::{EthSq, Ring};
use crate::transport::{rlock, wlock};
use crate::Inner;

/// log2 of an SQ's WQE basic block (64 bytes, `MLX5_SEND_WQE_BB`).
const LOG_SEND_WQE_BB: u64 = 6;

impl Firmware {
    /// A free number in the QP space: no QP, SQ or RQ has it.
    pub(super) fn free_queue_number(&self, inner: &Inner, synd: u32) -> Result<u32, super::Fail> {
        let r = &inner.rdma;
        self.free_queue_number_in(&rlock(&r.qps), &r.qp_floor, synd)
    }

    /// [`Self::free_queue_number`] with the QP table at hand (CREATE_QP
    /// holds it for writing): the one allocator of the shared QP, SQ and
    /// RQ number space.
    pub(super) fn free_queue_number_in(
        &self,
        qps: &crate::transport::Table<crate::transport::Qp>,
        floor: &std::sync::atomic::AtomicU32,
        synd: u32,
    ) -> Result<u32, super::Fail> {
        let first = super::qp::FIRST_QPN;
        let max = limit(self.cap(cmd_hca_cap::LOG_MAX_QP)).max(first + 1);
        crate::transport::lowest_free(floor, first, max, |n| {
            qps.contains_key(&n)
                || self.eth.sqs.contains_key(&n)
                || self.eth.rqs.contains_key(&n)
                || self.dctns.contains(&n)
        })
        .ok_or(fail(CmdStatus::NoResources, synd))
    }

    pub(super) fn create_sq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use create_sq_in as i;
        sized(input, outlen, i::SIZE_BYTES, create_sq_out::SIZE_BYTES)?;
        self.check_uid(i::UID.get(input))?;
        let at = i::CTX.off / 8;
        let c = &input[at..at + sqc::SIZE_BYTES];
        let w = &c[sqc::WQ.off / 8..];
        if sqc::STATE.get(c) != QUEUE_STATE_RST {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_STATE));
        }
        if wq::WQ_TYPE.get(w) != WQ_TYPE_CYCLIC || wq::LOG_WQ_STRIDE.get(w) != LOG_SEND_WQE_BB {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_TYPE));
        }
        let cqn = sqc::CQN.get(c) as u32;
        if !rlock(&inner.rdma.cqs).contains_key(&cqn) {
            return Err(fail(CmdStatus::BadResource, synd::WQ_BAD_CQ));
        }
        // UMR WQEs on the SQ (mlx5e's control SQ) where the card offers
        // them.
        let reg_umr = sqc::REG_UMR.get(c) != 0;
        if reg_umr
            && self
                .caps
                .get(cap_type::ETHERNET_OFFLOADS, eth_cap::REG_UMR_SQ)
                == 0
        {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_PARAM));
        }
        let tises = sqc::TIS_LST_SZ.get(c);
        let hairpin = sqc::HAIRPIN.get(c) != 0;
        if hairpin || tises > 1u64 << self.cap(cmd_hca_cap::LOG_MAX_TIS_PER_SQ) {
            return Err(fail(CmdStatus::BadParameter, synd::WQ_BAD_PARAM));
        }
        if tises != 0 {
            known(
                &self.eth.tises,
                sqc::TIS_NUM_0.get(c) as u32,
                synd::SQ_BAD_TIS,
            )?;
        }
        // The transport domain its frames come from (a TIR of the same
        // domain may refuse them when they loop back: self_lb_block).
        let td = (tises != 0)
            .then(|| self.eth.tises.get(&(sqc::TIS_NUM_0.get(c) as u32)))
            .flatten()
            .map(|t| tisc::TRANSPORT_DOMAIN.get(&t.ctx) as u32);
        let m = self.check_wq(inner, input, at + sqc::WQ.off / 8, i::SIZE_BYTES, true)?;
        let Some(cq) = rlock(&inner.rdma.cqs).get(&cqn).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::WQ_BAD_CQ));
        };
        let sqn = self.free_queue_number(inner, synd::WQ_EXHAUSTED)?;
        tracing::debug!(sqn, cqn, "CREATE_SQ");
        self.eth.sqs.insert(sqn, Obj { ctx: c.to_vec() });
        self.umem_used_by(super::uctx::Kind::Sq, sqn, &m.umems);
        let uar = wq::UAR_PAGE.get(w) as u32;
        wlock(&inner.rdma.eth_sqs).insert(
            sqn,
            Arc::new(EthSq {
                sqn,
                cq,
                pd: wq::PD.get(w) as u32,
                log_size: wq::LOG_WQ_SZ.get(w) as u8,
                buf: m.buf,
                dbr: m.dbr,
                state: AtomicU8::new(QUEUE_STATE_RST as u8),
                vlan_insert: self
                    .caps
                    .get(cap_type::ETHERNET_OFFLOADS, eth_cap::WQE_VLAN_INSERT)
                    != 0,
                mpw: self
                    .caps
                    .get(cap_type::ETHERNET_OFFLOADS, eth_cap::MULTI_PKT_SEND_WQE)
                    != 0
                    && sqc::ALLOW_MULTI_PKT_SEND_WQE.get(c) != 0,
                empw: self.caps.get(
                    cap_type::ETHERNET_OFFLOADS,
                    eth_cap::ENHANCED_MULTI_PKT_SEND_WQE,
                ) != 0,
                reg_umr,
                td,
                ring: Mutex::new(Ring::default()),
            }),
        );
        inner.rdma.track_uar(uar, true);
        let mut out = vec![0u8; create_sq_out::SIZE_BYTES];
        create_sq_out::SQN.set(&mut out, u64::from(sqn));
        Ok(out)
    }

    pub(super) fn modify_sq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use modify_sq_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let sqn = i::SQN.get(input) as u32;
        known(&self.eth.sqs, sqn, synd::SQ_UNKNOWN)?;
        let dp = inner.rdma.eth_sq(sqn);
        // The data path moves an SQ to ERR on an error CQE.
        let cur = dp.as_ref().map_or(QUEUE_STATE_RST, |q| q.state());
        if i::SQ_STATE.get(input) != cur {
            return Err(fail(CmdStatus::BadResourceState, synd::WQ_STATE_MISMATCH));
        }
        let c = &input[i::CTX.off / 8..][..sqc::SIZE_BYTES];
        let next = sqc::STATE.get(c);
        queue_transition(cur, next)?;
        let bitmask = i::MODIFY_BITMASK.get(input);
        let Some(sq) = self.eth.sqs.get_mut(&sqn) else {
            return Err(fail(CmdStatus::BadResource, synd::SQ_UNKNOWN));
        };
        sqc::STATE.set(&mut sq.ctx, next);
        if let Some(q) = dp {
            if next == QUEUE_STATE_RST {
                // Back to RST: the ring starts again at 0 (mlx5e resets its
                // counters too).
                q.reset(&inner.rdma.dma.memory());
            }
            q.state.store(next as u8, Ordering::Release);
            inner.rdma.wake();
        }
        for (bit, f) in [
            (
                MODIFY_SQ_BITMASK_PACKET_PACING_RATE_LIMIT_INDEX,
                sqc::PACKET_PACING_RATE_LIMIT_INDEX,
            ),
            (
                MODIFY_SQ_BITMASK_QOS_QUEUE_GROUP_ID,
                sqc::QOS_QUEUE_GROUP_ID,
            ),
        ] {
            if bitmask & bit != 0 {
                f.set(&mut sq.ctx, f.get(c));
            }
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn destroy_sq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_sq_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let sqn = i::SQN.get(input) as u32;
        if self.eth.sqs.remove(&sqn).is_none() {
            return Err(fail(CmdStatus::BadResource, synd::SQ_UNKNOWN));
        }
        wlock(&inner.rdma.eth_sqs).remove(&sqn);
        crate::transport::freed(&inner.rdma.qp_floor, sqn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_sq(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use query_sq_out as o;
        sized(input, outlen, query_sq_in::SIZE_BYTES, o::SIZE_BYTES)?;
        let sqn = query_sq_in::SQN.get(input) as u32;
        let sq = known(&self.eth.sqs, sqn, synd::SQ_UNKNOWN)?;
        let mut out = vec![0u8; o::SIZE_BYTES];
        let ctx = &mut out[o::SQ_CONTEXT.off / 8..][..sqc::SIZE_BYTES];
        ctx.copy_from_slice(&sq.ctx);
        if let Some(q) = inner.rdma.eth_sq(sqn) {
            sqc::STATE.set(ctx, q.state());
        }
        Ok(out)
    }
}
