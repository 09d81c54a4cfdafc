//! A raw packet QP whose completions go to verbs CQs: what
//! `ibv_create_qp(IBV_QPT_RAW_PACKET)` gives a verbs program, which posts
//! one work request at a time and takes the completions with
//! `ibv_poll_cq`, maybe from one CQ it shares with other QPs.
//!
//! The QP gets the tracking a verbs QP has ([`WqTrack`]), attached to
//! its CQs under the SQ's number, which is the QP's (mlx5_ib numbers a
//! raw packet QP by its SQ). Send CQEs name the SQ; receive CQEs carry
//! the flow tag where other CQEs carry the QP number, and name their RQ
//! by its `user_index` in `srqn_uidx` (as with libmlx5's CQE version 1),
//! which is set to the SQ's number, so [`Cq::poll`] finds the QP by the
//! one or the other ([`crate::cq`]'s look-up falls back to `srqn_uidx` for a
//! receive CQE whose number names no QP) and decodes its CQEs as any
//! QP's: a send completion frees the ring to the end of its WQE and gives
//! its wr_id, a receive completion the next posted wr_id and its byte
//! count. As libmlx5 reports them, a completion's `qp_num` is what the
//! CQE says: the SQ's number for a send, the flow tag (0 for a rule
//! without one) for a receive.

use std::sync::Arc;

use crate::cq::{Cq, CqShared};
use crate::device::Context;
use crate::mr::Sge;
use crate::pd::Pd;
use crate::wq::WqTrack;
use crate::{Error, Result};

use super::{
    RawPacketQp, RawQpCap, TxPkt, MAX_INLINE_HEADERS, MIN_INLINE, ONE_BLOCK_INLINE_HEADERS,
};

/// The CQs a polled raw packet QP completes into and its queues' tracking.
#[derive(Debug)]
pub(super) struct Polled {
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    t: Arc<WqTrack>,
}

impl Polled {
    /// The queues are gone (their objects destroyed): the CQs forget the
    /// QP, and its CQEs still in them are dropped (send CQEs before the
    /// next poll returns any; receive CQEs, which carry no QP number, as
    /// the poll finds them: their `user_index` names no QP any more).
    pub(super) fn detach(self) {
        for cq in [&self.send_cq, &self.recv_cq] {
            cq.clean(self.t.qpn(), None);
            cq.detach(self.t.qpn());
        }
    }
}

impl Context {
    /// `ibv_create_qp(IBV_QPT_RAW_PACKET)` for a verbs program: a raw
    /// packet QP ([`Context::create_raw_packet_qp`]) whose work requests
    /// are posted one by one ([`RawPacketQp::post_send_wr`],
    /// [`RawPacketQp::post_recv_wr`]) and whose completions [`Cq::poll`]
    /// takes; `send_cq` and `recv_cq` may be one CQ, and may be shared
    /// with other QPs.
    pub fn create_raw_packet_qp_polled(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: RawQpCap,
    ) -> Result<RawPacketQp> {
        if cap.striding.is_some() {
            return Err(Error::Invalid(
                "raw packet QP polled through verbs CQs: a striding RQ",
            ));
        }
        let mut qp = self.make_raw_packet_qp(pd, send_cq, recv_cq, cap, true)?;
        let t = WqTrack::by_user_index(qp.sqn, 1 << cap.log_sq_bbs, 1 << cap.log_rq_wqes);
        send_cq.shared.attach(qp.sqn, t.clone());
        recv_cq.shared.attach(qp.sqn, t.clone());
        qp.polled = Some(Polled {
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.shared.clone(),
            t,
        });
        Ok(qp)
    }
}

impl RawPacketQp {
    /// Whether its completions go to verbs CQs
    /// ([`Context::create_raw_packet_qp_polled`]).
    pub fn is_polled(&self) -> bool {
        self.polled.is_some()
    }

    /// The tracking of a QP made by
    /// [`Context::create_raw_packet_qp_polled`].
    fn polled(&self) -> Result<&Polled> {
        self.polled.as_ref().ok_or(Error::Invalid(
            "raw packet QP: work requests need a QP polled through verbs CQs",
        ))
    }

    /// Writes one send WQE for `pkt` (as [`Self::tx_burst`] builds it),
    /// asking for a completion when `signaled`; its completion reports
    /// `wr_id`. No doorbell: [`Self::ring_sends`] after the list.
    /// `QueueFull` when the ring has no room for it, `Invalid` for headers
    /// shorter than an Ethernet header or longer than
    /// [`MAX_INLINE_HEADERS`], a VLAN tag to insert, or LSO (not offered
    /// through work requests).
    pub fn post_send_wr(&mut self, pkt: &TxPkt<'_>, wr_id: u64, signaled: bool) -> Result<()> {
        if !(MIN_INLINE..=MAX_INLINE_HEADERS).contains(&pkt.headers.len())
            || pkt.vlan.is_some()
            || pkt.mss != 0
        {
            return Err(Error::Invalid("raw send: headers, VLAN insertion or LSO"));
        }
        let tail = self
            .polled()?
            .t
            .sq_tail
            .load(std::sync::atomic::Ordering::Acquire) as u16;
        let one = pkt.headers.len() <= ONE_BLOCK_INLINE_HEADERS;
        let nbb = if one { 1 } else { 2 };
        let used = self.sq_pc.wrapping_sub(tail);
        if (1u16 << self.log_sq) - used < nbb {
            return Err(Error::QueueFull("raw packet QP: send queue"));
        }
        let first = self.sq_pc;
        if one {
            self.write_send_1bb(pkt);
        } else {
            self.write_send_2bb(pkt);
        }
        if signaled {
            // Control segment bytes 8..16: signature, reserved, fm_ce_se.
            let fm = u64::from_ne_bytes([0, 0, 0, mlx5_hw::wqe::WQE_CTRL_CQ_UPDATE, 0, 0, 0, 0]);
            self.sq_ring.store_words_at::<8, 1>(u32::from(first), &[fm]);
        }
        let p = self.polled()?;
        let mask = (1u16 << self.log_sq) - 1;
        p.t.sq[usize::from(first & mask)].set(wr_id, u32::from(self.sq_pc));
        Ok(())
    }

    /// Rings the send doorbell for the WQEs [`Self::post_send_wr`] wrote.
    pub fn ring_sends(&self) {
        self.ring_sq();
    }

    /// Posts one receive buffer whose completion reports `wr_id`.
    /// `QueueFull` when the ring is full.
    pub fn post_recv_wr(&mut self, buf: Sge, wr_id: u64) -> Result<()> {
        let p = self.polled()?;
        let rq = p.t.clone();
        // The receive ring is free up to where the CQ's poll completed it.
        self.rx.ci = rq.rq_tail.load(std::sync::atomic::Ordering::Acquire) as u16;
        let at = self.rx.pc;
        let mask = (1u16 << self.rx.log) - 1;
        if self.rx.pc.wrapping_sub(self.rx.ci) > mask {
            return Err(Error::QueueFull("raw packet QP: receive queue"));
        }
        rq.rq_wrid[usize::from(at & mask)].store(wr_id, std::sync::atomic::Ordering::Relaxed);
        if self.rx.post(std::slice::from_ref(&buf)) == 1 {
            Ok(())
        } else {
            Err(Error::QueueFull("raw packet QP: receive queue"))
        }
    }
}
