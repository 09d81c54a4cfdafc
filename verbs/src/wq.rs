//! Work queue tracking (mlx5_ib's `struct mlx5_ib_wq` `wrid` / `wqe_head`
//! / `tail`, rdma-core's `mlx5_wq`): what a completion needs to find its
//! work request, shared by a QP's rings and the CQs it reports to.
//!
//! The send side keeps one `SqSlot` per 64-byte block: the wr_id of the
//! WQE that starts there and the producer counter after it, so a
//! completion for WQE index `n` frees the queue up to the end of that WQE
//! (and an unsignaled run before it). The receive side keeps the wr_ids in
//! posting order (or defers to the SRQ's table).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

use crate::srq::SrqShared;

/// What a send WQE's completion needs: its wr_id and the producer counter
/// after it (the queue is free up to there once it completes). One slot per
/// first block, wr_id and end side by side (one cache line touched), and
/// for a UMR WQE the work-completion opcode it reports (libmlx5's
/// `wr_data`: the CQE says only "UMR"; the padding holds it).
#[derive(Debug, Default)]
pub(crate) struct SqSlot {
    wrid: AtomicU64,
    end: AtomicU32,
    wc_op: AtomicU8,
}

impl SqSlot {
    #[inline(always)]
    pub(crate) fn set(&self, wrid: u64, end: u32) {
        self.wrid.store(wrid, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
    }

    /// The `ibv_wc_opcode` a UMR WQE starting here completes with.
    pub(crate) fn set_wc_op(&self, op: u8) {
        self.wc_op.store(op, Ordering::Relaxed);
    }
}

/// Per-QP completion bookkeeping shared with the CQs.
#[derive(Debug)]
pub struct WqTrack {
    qpn: u32,
    /// One slot per send block, shared with the [`SendRing`](crate::wqe::SendRing).
    pub(crate) sq: Arc<[SqSlot]>,
    /// The send counter up to which the device is done (the ring may
    /// reuse the blocks before it).
    pub(crate) sq_tail: AtomicU32,
    sq_mask: u32,
    /// The receive wr_ids, by receive counter.
    pub(crate) rq_wrid: Box<[AtomicU64]>,
    /// The receive counter up to which WQEs have completed.
    pub(crate) rq_tail: AtomicU32,
    rq_mask: u32,
    /// The SRQ receive WQEs come from. Weak: a CQ's poll cache keeps the
    /// track of a destroyed QP until its next poll, and that must not
    /// keep the SRQ (and through it the PD) alive: `ibv_dealloc_pd` after
    /// the QP and the SRQ went would be busy on a CQ nobody polls again.
    /// The QP holds the SRQ while it lives.
    srq: Option<Weak<SrqShared>>,
    /// The receive ring read back by the poller, set when the QP asked
    /// for scatter to CQE (`crate::scatter_cqe`).
    pub(crate) recv_view: std::sync::OnceLock<crate::scatter_cqe::RecvView>,
    /// The send ring read back by the poller, set when the QP asked for
    /// requester scatter to CQE.
    pub(crate) send_view: std::sync::OnceLock<crate::scatter_cqe::SendView>,
    /// The send doorbell record (the 16-bit send counter the device was
    /// last told), set by the send ring: how much send work is in flight
    /// ([`sends_in_flight`](Self::sends_in_flight)).
    pub(crate) send_dbrec: std::sync::OnceLock<vfio::DmaRing<4>>,
}

impl WqTrack {
    /// Tracking for a send queue of `sq_cnt` blocks and a receive queue of
    /// `rq_cnt` WQEs (powers of two; 0 for none).
    pub fn new(qpn: u32, sq_cnt: u32, rq_cnt: u32) -> Arc<Self> {
        Self::with_srq(qpn, sq_cnt, rq_cnt, None)
    }

    pub(crate) fn with_srq(
        qpn: u32,
        sq_cnt: u32,
        rq_cnt: u32,
        srq: Option<&Arc<SrqShared>>,
    ) -> Arc<Self> {
        let v64 = |n: u32| (0..n.max(1)).map(|_| AtomicU64::new(0)).collect();
        Arc::new(Self {
            qpn,
            sq: (0..sq_cnt.max(1)).map(|_| SqSlot::default()).collect(),
            sq_tail: AtomicU32::new(0),
            sq_mask: sq_cnt.max(1) - 1,
            rq_wrid: v64(rq_cnt),
            rq_tail: AtomicU32::new(0),
            rq_mask: rq_cnt.max(1) - 1,
            srq: srq.map(Arc::downgrade),
            recv_view: std::sync::OnceLock::new(),
            send_view: std::sync::OnceLock::new(),
            send_dbrec: std::sync::OnceLock::new(),
        })
    }

    /// Send blocks rung but not yet completed: an upper bound of the send
    /// completions still to come (a WQE is one block or more, and an
    /// unsignaled one completes with the next signaled one). A CQ resize
    /// counts them (`cq/resize.rs`).
    pub(crate) fn sends_in_flight(&self) -> u32 {
        let Some(d) = self.send_dbrec.get() else {
            return 0;
        };
        let rung = d.entry(0).load_u32_be(0).unwrap_or(0);
        let tail = self.sq_tail.load(Ordering::Acquire);
        rung.wrapping_sub(tail) & 0xffff
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// A send completion for WQE index `wqe_counter`: its wr_id; frees the
    /// queue up to the end of that WQE.
    #[inline(always)]
    pub fn sq_complete(&self, wqe_counter: u16) -> u64 {
        // The slot is read before the tail frees it: once the tail moves,
        // a poster on another thread may reuse the slot for a new WR
        // (seen under load as a wr_id completed twice).
        let (wrid, end) = self.sq_take(wqe_counter);
        self.sq_free_to(end);
        wrid
    }

    /// [`sq_complete`](Self::sq_complete) in two steps, for a poll that
    /// completes a run of this QP's WQEs and frees the queue once at the
    /// end of it: the wr_id of WQE `wqe_counter` and the send counter after
    /// it, read; the queue is freed by [`sq_free_to`](Self::sq_free_to)
    /// with the last of the run's counters, after every slot was read.
    #[inline(always)]
    pub(crate) fn sq_take(&self, wqe_counter: u16) -> (u64, u32) {
        self.sq_take_checked(wqe_counter)
            .expect("a masked WQE index lies in the send table")
    }

    /// [`sq_take`](Self::sq_take) that cannot panic: `None` for an index
    /// past the table, which the mask never gives. For the usual
    /// completion's straight-line path, which then has no panic (and so
    /// no unwinding through its caller's lock guard) in it.
    #[inline(always)]
    pub(crate) fn sq_take_checked(&self, wqe_counter: u16) -> Option<(u64, u32)> {
        let i = (u32::from(wqe_counter) & self.sq_mask) as usize;
        let s = self.sq.get(i)?;
        Some((
            s.wrid.load(Ordering::Relaxed),
            s.end.load(Ordering::Relaxed),
        ))
    }

    /// Frees the send queue up to counter `end`
    /// ([`sq_take`](Self::sq_take)): the slots before it may be reused.
    #[inline(always)]
    pub(crate) fn sq_free_to(&self, end: u32) {
        self.sq_tail.store(end, Ordering::Release);
    }

    /// Whether receive completions come from an SRQ (their wr_ids are in
    /// its table).
    #[inline(always)]
    pub(crate) fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// The `ibv_wc_opcode` recorded for the UMR WQE at index
    /// `wqe_counter` (read before [`sq_complete`](Self::sq_complete)
    /// frees its slot).
    #[inline(always)]
    pub fn sq_wc_op(&self, wqe_counter: u16) -> u8 {
        let i = (u32::from(wqe_counter) & self.sq_mask) as usize;
        self.sq[i].wc_op.load(Ordering::Relaxed)
    }

    /// Copies received bytes that came in a CQE into receive WQE
    /// `wqe_counter` (the QP's RQ, or its SRQ's), before it completes.
    pub(crate) fn copy_scattered(&self, wqe_counter: u16, data: &[u8]) -> crate::cq::WcStatus {
        match (self.recv_view.get(), self.srq.as_ref().map(Weak::upgrade)) {
            (Some(v), _) => v.copy_to_wqe(wqe_counter, data),
            (None, Some(Some(s))) => s.copy_to_wqe(wqe_counter, data),
            // A QP that did not ask for it (or whose SRQ is gone):
            // nowhere to put the bytes.
            (None, _) => crate::cq::WcStatus::GeneralErr,
        }
    }

    /// A receive completion: its wr_id (in order, or by SRQ index).
    #[inline(always)]
    pub fn rq_complete(&self, wqe_counter: u16) -> u64 {
        if let Some(s) = &self.srq {
            // A QP's receive CQEs go when it is destroyed (before its SRQ
            // can be), so the SRQ is there; were it not, no wr_id.
            return s.upgrade().map_or(0, |s| s.complete(wqe_counter));
        }
        self.rq_complete_checked()
            .expect("a masked receive index lies in the receive table")
    }

    /// [`rq_complete`](Self::rq_complete) of a QP without an SRQ that
    /// cannot panic, as [`sq_take_checked`](Self::sq_take_checked): `None`,
    /// nothing freed, for an index past the table.
    #[inline(always)]
    pub(crate) fn rq_complete_checked(&self) -> Option<u64> {
        let t = self.rq_tail.load(Ordering::Relaxed);
        // As for the send queue: read the slot before freeing it.
        let wrid = self.rq_wrid.get((t & self.rq_mask) as usize)?;
        let wrid = wrid.load(Ordering::Relaxed);
        self.rq_tail.store(t.wrapping_add(1), Ordering::Release);
        Some(wrid)
    }
}
