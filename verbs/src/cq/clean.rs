//! CQ cleaning: the CQEs of a QP that was destroyed or went to RESET taken
//! out of its CQs before the poller returns any of them (libmlx5's
//! `__mlx5_cq_clean`, called from `mlx5_destroy_qp` and from
//! `mlx5_modify_qp` to RESET; Linux's `mlx5_ib_cq_clean`).
//!
//! libmlx5 takes the CQ's lock and compacts the ring at once. Here the
//! ring's consumer index belongs to the poller ([`super::Cq`] is polled
//! through `&mut`), so the QP side files a request and the poller carries
//! it out first thing at its next poll (it already reads the CQ's
//! generation there, which the request bumps):
//!
//! 1. the QP side, after the device took the QP out of service (DESTROY_QP
//!    or 2RST returned: no CQE of it comes any more), finds the index of
//!    the first CQE the device has not written yet (scanning from the
//!    consumer index the poller last published in the doorbell record
//!    while the entries are software-owned) and files `(qpn, stop)`;
//! 2. the poller walks back from the producer to its consumer index and
//!    drops every CQE of `qpn` before `stop`, moving the others up (each
//!    keeps the owner bit of the place it lands in) and advancing the
//!    consumer index by the number dropped; a dropped receive CQE of a QP
//!    with an SRQ gives its WQE back to the SRQ.
//!
//! CQEs at or after `stop` are a new incarnation's (a QP brought up again
//! from RESET, or a new QP that took the number) and stay. What the poller
//! returned before it saw the request was polled as if before the destroy.

use std::sync::{Arc, Mutex, Weak};

use mlx5_hw::cqe::{self as c, CqeOpcode};
use mlx5_hw::uar as u;
use vfio::DmaRing;

use super::{CqRing, OP_OWN, SOP_QPN};
use crate::srq::SrqShared;

/// A QP's CQEs to take out of the ring: those of `qpn` before index
/// `stop` (the doorbell record's 24-bit counter space).
#[derive(Debug, Clone)]
pub(crate) struct Clean {
    qpn: u32,
    stop: u32,
    /// The QP's SRQ, which gets the WQEs of dropped receive CQEs back.
    /// Weak: the request waits for the CQ's next poll, and a CQ nobody
    /// polls again must not keep the SRQ (and its PD) alive once the
    /// program destroyed them; a destroyed SRQ needs nothing back.
    srq: Option<Weak<SrqShared>>,
}

/// The QP side's view of a CQ's ring: enough to find the producer.
#[derive(Debug)]
pub(crate) struct CqPeek {
    /// The ring (a resize replaces it).
    view: Mutex<View>,
    /// Requests the poller has not carried out yet.
    pending: Mutex<Vec<Clean>>,
}

#[derive(Debug)]
pub(crate) struct View {
    ring: DmaRing<{ c::CQE_SIZE }>,
    dbrec: DmaRing<8>,
    log_size: u8,
    shift: u8,
}

impl View {
    /// The ring is `r` from now on (a resize).
    pub(crate) fn set_ring(&mut self, r: &CqRing) {
        *self = Self::of(r);
    }

    fn of(r: &CqRing) -> Self {
        Self {
            ring: r.ring.clone(),
            dbrec: r.dbrec.clone(),
            log_size: r.log_size,
            shift: r.shift,
        }
    }
}

impl CqPeek {
    /// The view of `r`'s ring.
    pub(crate) fn of(r: &CqRing) -> Self {
        Self {
            view: Mutex::new(View::of(r)),
            pending: Mutex::default(),
        }
    }

    /// The view, held: a resize holds it from its cleaning to the new
    /// ring, so that no request counts in the old ring meanwhile.
    pub(crate) fn hold(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The index of the first CQE the device has not written: from the
    /// consumer index last published, past every software-owned entry.
    fn producer(v: &View) -> u32 {
        let mut i = v.dbrec.entry(0).load_u32_be(0).unwrap_or(0) & u::DB_CI_MASK;
        for _ in 0..1u32 << v.log_size {
            let idx = (i << v.shift) | u32::from(v.shift);
            let Ok(op_own) = v.ring.entry(idx).load_u8_acquire(OP_OWN) else {
                break;
            };
            if !c::cqe_is_sw_owned(op_own, i, v.log_size) {
                break;
            }
            i = i.wrapping_add(1);
        }
        i & u::DB_CI_MASK
    }

    /// Files the cleaning of `qpn`'s CQEs (the device writes no more of
    /// them); the poller carries it out at its next poll.
    pub(crate) fn request(&self, qpn: u32, srq: Option<Arc<SrqShared>>) {
        // Under the view's lock: a resize does not switch rings between
        // the scan and the filing.
        let v = self.hold();
        let stop = Self::producer(&v);
        let srq = srq.as_ref().map(Arc::downgrade);
        self.lock().push(Clean { qpn, stop, srq });
    }

    /// The requests filed, taken.
    pub(crate) fn take(&self) -> Vec<Clean> {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Clean>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether index `i` comes before `stop` in the 24-bit counter space.
fn before(i: u32, stop: u32) -> bool {
    let d = stop.wrapping_sub(i) & u::DB_CI_MASK;
    d != 0 && d <= u::DB_CI_MASK / 2
}

impl CqRing {
    /// Carries out `cleans`: drops their CQEs between the consumer index
    /// and the producer, keeping the others in order; returns how many
    /// went.
    pub(crate) fn clean(&mut self, cleans: &[Clean]) -> u32 {
        let mut p = self.ci;
        while p.wrapping_sub(self.ci) < 1 << self.log_size && self.sw_owned(p) {
            p = p.wrapping_add(1);
        }
        let mut freed = 0u32;
        let mut i = p;
        while i != self.ci {
            i = i.wrapping_sub(1);
            let idx = self.cqe_index(i);
            let tail = self.ring.entry(idx).load_u64_be(SOP_QPN).unwrap_or(0);
            let qpn = (tail >> 32) as u32 & c::CQE_QPN_MASK;
            let hit = cleans
                .iter()
                .find(|r| r.qpn == qpn && before(i & u::DB_CI_MASK, r.stop));
            if let Some(r) = hit {
                give_back_srq_wqe(r, tail);
                freed += 1;
            } else if freed > 0 {
                self.move_cqe(i, i.wrapping_add(freed));
            }
        }
        if freed > 0 {
            self.ci = self.ci.wrapping_add(freed);
            self.update_ci();
        }
        freed
    }

    /// Copies CQE `from` over CQE `to` (both halves of a 128-byte one),
    /// keeping `to`'s owner bit.
    fn move_cqe(&self, from: u32, to: u32) {
        let owner = self
            .ring
            .entry(self.cqe_index(to))
            .load_u8(OP_OWN)
            .map_or(0, |o| o & c::CQE_OWNER_MASK);
        self.copy_cqe(from, self, to, owner);
    }

    /// Copies CQE `i` (both halves of a 128-byte one) to index `j` of
    /// `to` (this ring or another with CQEs of the same size), with owner
    /// bit `owner`.
    pub(super) fn copy_cqe(&self, i: u32, to: &CqRing, j: u32, owner: u8) {
        let (f, t) = (self.cqe_index(i), to.cqe_index(j));
        for h in 0..=u32::from(self.shift) {
            let (fi, ti) = (f - u32::from(self.shift) + h, t - u32::from(to.shift) + h);
            let Ok(mut w) = self.ring.load_words::<8>(fi, 0) else {
                return;
            };
            if h == u32::from(self.shift) {
                // op_own is the CQE's last byte.
                let mut b = w[7].to_ne_bytes();
                b[7] = (b[7] & !c::CQE_OWNER_MASK) | owner;
                w[7] = u64::from_ne_bytes(b);
            }
            let _ = to.ring.store_words::<8>(ti, 0, &w);
        }
    }
}

/// A dropped receive CQE of a QP with an SRQ: its WQE goes back to the
/// SRQ (libmlx5's `mlx5_free_srq_wqe` in the clean).
fn give_back_srq_wqe(r: &Clean, tail: u64) {
    let Some(srq) = &r.srq else {
        return;
    };
    let op = (tail as u8) >> c::CQE_OPCODE_SHIFT;
    let responder = [
        CqeOpcode::RespWrImm,
        CqeOpcode::RespSend,
        CqeOpcode::RespSendImm,
        CqeOpcode::RespSendInv,
        CqeOpcode::RespErr,
    ]
    .iter()
    .any(|o| o.to_raw() == op);
    if let Some(srq) = responder.then(|| srq.upgrade()).flatten() {
        srq.complete((tail >> 16) as u16);
    }
}
