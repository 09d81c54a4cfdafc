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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mlx5_hw::eth::{ETH_WQE_L3_CSUM, ETH_WQE_L4_CSUM};
use mlx5_hw::ifc::{wqe_ctrl_seg, wqe_data_seg, wqe_eth_seg};
use mlx5_hw::wqe::{self as w, WqeOpcode};

use crate::cq::{Cq, CqShared};
use crate::device::Context;
use crate::mr::Sge;
use crate::pd::Pd;
use crate::wq::WqTrack;
use crate::{Error, Result};

use super::{RawPacketQp, RawQpCap, BB, INLINE_START, MAX_INLINE_HEADERS, MIN_INLINE};

/// The CQs a polled raw packet QP completes into and its queues' tracking.
#[derive(Debug)]
pub(super) struct Polled {
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    t: Arc<WqTrack>,
    /// The RQ's user index.
    uidx: u32,
    /// Payload pieces a send WR may have.
    send_sges: usize,
}

impl Polled {
    /// The queues are gone (their objects destroyed): the CQs forget the
    /// QP, and its CQEs still in them are dropped (send CQEs before the
    /// next poll returns any; receive CQEs as the poll finds them: their
    /// user index names no queue any more).
    pub(super) fn detach(self, ctx: &crate::device::Ctx) {
        self.send_cq.clean(self.t.qpn(), None);
        self.send_cq.detach(self.t.qpn());
        self.recv_cq.detach_uidx(self.uidx);
        ctx.uidx.free(self.uidx);
    }
}

/// One send work request of a polled raw packet QP: a frame whose first
/// bytes go inline in the WQE and whose rest is gathered from memory.
#[derive(Debug, Clone, Copy)]
pub struct RawSendWr<'a> {
    /// Reported by its completion.
    pub wr_id: u64,
    /// The frame's first bytes, copied into the WQE (an Ethernet header at
    /// least, at most [`MAX_INLINE_HEADERS`]; the whole frame if short).
    pub headers: &'a [u8],
    /// The rest of the frame, gathered in order (at most the QP's send
    /// SGEs).
    pub payload: &'a [Sge],
    /// Ask the device for the IPv4 and TCP/UDP checksums.
    pub csum: bool,
    /// Ask for a completion.
    pub signaled: bool,
}

/// How many data segments a polled raw packet QP's work requests carry at
/// most: its send WRs' payload pieces and its receive WRs' buffers (each
/// at most [`crate::qp::MAX_SGE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawSges {
    /// Send payload pieces.
    pub send: usize,
    /// Receive buffers.
    pub recv: usize,
}

impl Context {
    /// `ibv_create_qp(IBV_QPT_RAW_PACKET)` for a verbs program: a raw
    /// packet QP ([`Context::create_raw_packet_qp`]) whose work requests
    /// are posted one by one ([`RawPacketQp::post_send_wr`],
    /// [`RawPacketQp::post_recv_wr`]) with up to `sges` pieces each, and
    /// whose completions [`Cq::poll`] takes; `send_cq` and `recv_cq` may
    /// be one CQ, and may be shared with other QPs.
    pub fn create_raw_packet_qp_polled(
        &self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cap: RawQpCap,
        sges: RawSges,
    ) -> Result<RawPacketQp> {
        if cap.striding.is_some() {
            return Err(Error::Invalid(
                "raw packet QP polled through verbs CQs: a striding RQ",
            ));
        }
        let most = crate::qp::MAX_SGE;
        if sges.send > most || sges.recv > most {
            return Err(Error::Invalid("raw packet QP: more SGEs than MAX_SGE"));
        }
        let uidx = self.ctx.uidx.alloc()?;
        let mut qp = match self.make_raw_packet_qp(pd, send_cq, recv_cq, cap, Some(uidx), sges.recv)
        {
            Ok(q) => q,
            Err(e) => {
                self.ctx.uidx.free(uidx);
                return Err(e);
            }
        };
        let t = WqTrack::new(qp.sqn, 1 << cap.log_sq_bbs, 1 << cap.log_rq_wqes);
        send_cq.shared.attach(qp.sqn, t.clone());
        recv_cq.shared.attach_uidx(uidx, t.clone());
        qp.polled = Some(Polled {
            send_cq: send_cq.shared.clone(),
            recv_cq: recv_cq.shared.clone(),
            t,
            uidx,
            send_sges: sges.send,
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

    /// Writes one send WQE for `wr`: control segment, Ethernet segment
    /// with the headers inline (and the checksum flags), a data segment
    /// per payload piece; asks for a completion when `wr.signaled`. No
    /// doorbell: [`Self::ring_sends`] after the list. `QueueFull` when the
    /// ring has no room for it; `Invalid` for headers shorter than an
    /// Ethernet header (unless they are the whole frame of at least one)
    /// or longer than [`MAX_INLINE_HEADERS`], or more pieces than the QP
    /// takes.
    pub fn post_send_wr(&mut self, wr: &RawSendWr<'_>) -> Result<()> {
        let p = self.polled()?;
        let t = p.t.clone();
        let ihs = wr.headers.len();
        if !(MIN_INLINE..=MAX_INLINE_HEADERS).contains(&ihs) || wr.payload.len() > p.send_sges {
            return Err(Error::Invalid(
                "raw send: headers out of range or too many pieces",
            ));
        }
        // Control, Ethernet (its first two header bytes), the rest of the
        // headers in 16-byte units, a data segment per piece.
        let ctrl = wqe_ctrl_seg::SIZE_BYTES;
        let eth = ctrl + wqe_eth_seg::SIZE_BYTES;
        let data = eth + (ihs - INLINE_START).next_multiple_of(16);
        let len = data + wqe_data_seg::SIZE_BYTES * wr.payload.len();
        let nbb = len.div_ceil(BB) as u16;
        let tail = t.sq_tail.load(Ordering::Acquire) as u16;
        if (1u16 << self.log_sq) - self.sq_pc.wrapping_sub(tail) < nbb {
            return Err(Error::QueueFull("raw packet QP: send queue"));
        }
        let mut wqe = vec![0u8; usize::from(nbb) * BB];
        let e = &mut wqe[ctrl..];
        if wr.csum {
            wqe_eth_seg::CS_FLAGS.set(e, u64::from(ETH_WQE_L3_CSUM | ETH_WQE_L4_CSUM));
        }
        wqe_eth_seg::INLINE_HDR_SZ.set(e, ihs as u64);
        let at = wqe_eth_seg::INLINE_HDR_START.off / 8;
        e[at..at + ihs].copy_from_slice(wr.headers);
        for (d, s) in wqe[data..len]
            .chunks_exact_mut(wqe_data_seg::SIZE_BYTES)
            .zip(wr.payload)
        {
            wqe_data_seg::BYTE_COUNT.set(d, u64::from(s.length));
            wqe_data_seg::LKEY.set(d, u64::from(s.lkey));
            wqe_data_seg::ADDR.set(d, s.addr);
        }
        if wr.signaled {
            wqe_ctrl_seg::FM_CE_SE.set(&mut wqe, u64::from(w::WQE_CTRL_CQ_UPDATE));
        }
        let first = self.sq_pc;
        let mut words = [0u64; 8];
        for (b, block) in wqe.chunks_exact(BB).enumerate() {
            for (x, c) in words.iter_mut().zip(block.chunks_exact(8)) {
                *x = u64::from_ne_bytes(c.try_into().unwrap_or_default());
            }
            if b == 0 {
                words[0] = self.ctrl_word(first, len / 16, WqeOpcode::Send);
            }
            self.sq_ring
                .store_words_at::<0, 8>(u32::from(first.wrapping_add(b as u16)), &words);
        }
        self.advance(nbb);
        let mask = (1u16 << self.log_sq) - 1;
        t.sq[usize::from(first & mask)].set(wr.wr_id, u32::from(self.sq_pc));
        Ok(())
    }

    /// Rings the send doorbell for the WQEs [`Self::post_send_wr`] wrote.
    pub fn ring_sends(&self) {
        self.ring_sq();
    }

    /// Posts one receive WQE of the buffers `sg` (at most the QP's receive
    /// SGEs; a frame fills them in order) whose completion reports
    /// `wr_id`. `QueueFull` when the ring is full.
    pub fn post_recv_wr(&mut self, sg: &[Sge], wr_id: u64) -> Result<()> {
        let t = self.polled()?.t.clone();
        self.rx.post_tracked(&t, sg, wr_id)
    }
}
