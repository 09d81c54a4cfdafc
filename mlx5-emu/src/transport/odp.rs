//! On-demand paging: page faults of the data path and their resume.
//!
//! An access through a key whose translation entry is not present (an MTT
//! entry without the `rd_en`/`wr_en` the access needs, a KSM/KLM entry on
//! the null mkey: [`super::mem::KeyError::NotPresent`]) is a page fault
//! when the function has a page-fault EQ (an EQ subscribed to
//! `MLX5_EVENT_TYPE_PAGE_FAULT`, as Linux's `mlx5r_odp_create_eq` makes):
//! firmware writes a page-fault EQE and holds the work queue until the
//! driver answers with PAGE_FAULT_RESUME (fw/odp.rs), as ConnectX does.
//!
//! - Requester (a WQE's local data): a WQE-subtype fault, type
//!   `REQ_SEND_OR_WRITE` or `REQ_READ_OR_ATOMIC`, naming the QP and the
//!   WQE index; the send queue stops at that WQE (nothing of it is sent)
//!   until the resume, then executes it again from its start.
//! - Responder, RDMA WRITE/READ/atomic on an rkey: an RDMA-subtype fault
//!   (rkey, address, length, type `RDMA` and `WRITE` for a write or
//!   atomic); the packet is answered with an RNR NAK (the requester
//!   retries after the responder's RNR timer, counting `rnr_retry`), and
//!   every retry meets an RNR NAK until the resume.
//! - Responder, a SEND's receive WQE: a WQE-subtype fault of type `RESP`
//!   naming the QP and the receive WQE, which stays posted; RNR NAKs as
//!   above.
//!
//! A resume with `error` makes the held access fail as a protection
//! error: the requester's WQE completes with LOCAL_PROT_ERR, the
//! responder NAKs (remote access error, or for a receive WQE a local
//! protection error CQE at the responder). Without a page-fault EQ a not
//! present entry is such an error at once. Bytes committed are always 0:
//! the model restarts the access from its beginning.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use mlx5_hw::event::{EventType, PageFaultSubtype, PFAULT_RDMA, PFAULT_WRITE, PFTYPE_SHIFT};
use mlx5_hw::ifc::{EqePageFaultRdma, EqePageFaultWqe};
use zerocopy::FromZeros;

use super::{PendingEvent, Rdma};
use crate::lock;

/// What a held access became.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Raised, not resumed yet: the queue waits (RNR NAKs at a responder).
    Pending,
    /// Resumed without error: try again (a new fault if still absent).
    Resumed,
    /// Resumed with `error`: the access fails.
    Failed,
}

/// Which side of a QP a fault holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Side {
    /// The send queue (WQE subtype, requester types).
    Requester,
    /// Incoming requests (RDMA subtype, or WQE subtype `RESP`).
    Responder,
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    token: u32,
    /// Page-fault type as the EQE carried it.
    ty: u8,
    /// WQ number the EQE named (WQE subtype) or the token (RDMA).
    wq: u32,
    subtype: PageFaultSubtype,
    hold: Hold,
}

/// A function's page-fault state.
#[derive(Debug, Default)]
pub(crate) struct Odp {
    /// Some EQ takes page-fault events (set by fw/eq.rs).
    pf_eq: AtomicBool,
    next_token: AtomicU32,
    /// Faults raised and not yet consumed, by QP and side.
    held: std::sync::Mutex<HashMap<(u32, Side), Fault>>,
    /// How many QPs have a requester fault pending (the send queue's fast
    /// path looks no further while 0).
    pending_req: AtomicU32,
    /// The same of responders (their packets get RNR NAKs meanwhile, even
    /// once the page is present: the resume releases the QP).
    pending_resp: AtomicU32,
    /// Page-fault events raised.
    pub faults: AtomicU64,
    /// PAGE_FAULT_RESUME commands taken (with `error`: `resume_errors`).
    pub resumes: AtomicU64,
    pub resume_errors: AtomicU64,
}

/// Why a PAGE_FAULT_RESUME was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResumeError {
    /// No fault with that token (or it was resumed already).
    UnknownToken,
    /// The token's fault is of another type or work queue.
    Mismatch,
}

/// A fault the requester met: the WQE and the page-fault type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WqeFault {
    pub qpn: u32,
    /// WQ number the event names (the QP, or the SRQ of an RMP fault).
    pub wq: u32,
    pub wqe_index: u16,
    /// `MLX5_WQE_PF_TYPE_*`.
    pub ty: u8,
    pub side: Side,
    /// Payload length of the packet (responder), 0 at the requester.
    pub packet_length: u16,
}

/// A fault an incoming RDMA request met.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RdmaFault {
    pub qpn: u32,
    pub rkey: u32,
    pub va: u64,
    pub len: u32,
    pub write: bool,
    pub packet_length: u16,
}

impl Odp {
    /// Whether some EQ takes page-fault events now.
    pub(crate) fn set_pf_eq(&self, on: bool) {
        self.pf_eq.store(on, Ordering::Release);
    }

    /// Whether QP `qpn`'s send queue waits for a resume.
    #[inline]
    pub(crate) fn requester_waits(&self, qpn: u32) -> bool {
        self.pending_req.load(Ordering::Acquire) != 0 && self.held(qpn, Side::Requester)
    }

    /// Whether QP `qpn`'s responder waits for a resume.
    #[inline]
    pub(crate) fn responder_waits(&self, qpn: u32) -> bool {
        self.pending_resp.load(Ordering::Acquire) != 0 && self.held(qpn, Side::Responder)
    }

    /// Whether `side` of QP `qpn` holds a pending fault (out of line: the
    /// data path asks per packet, and mostly none is pending at all).
    #[inline(never)]
    fn held(&self, qpn: u32, side: Side) -> bool {
        lock(&self.held)
            .get(&(qpn, side))
            .is_some_and(|f| f.hold == Hold::Pending)
    }

    /// Forgets the faults of a destroyed QP.
    pub(crate) fn forget_qp(&self, qpn: u32) {
        let mut h = lock(&self.held);
        for side in [Side::Requester, Side::Responder] {
            if h.remove(&(qpn, side))
                .is_some_and(|f| f.hold == Hold::Pending)
            {
                match side {
                    Side::Requester => self.pending_req.fetch_sub(1, Ordering::AcqRel),
                    Side::Responder => self.pending_resp.fetch_sub(1, Ordering::AcqRel),
                };
            }
        }
    }

    /// Forgets every fault (reset, teardown).
    pub(crate) fn reset(&self) {
        lock(&self.held).clear();
        self.pending_req.store(0, Ordering::Release);
        self.pending_resp.store(0, Ordering::Release);
        self.pf_eq.store(false, Ordering::Release);
    }

    /// What the fault that held `(qpn, side)` became, taking a resumed
    /// one (the access is tried again or fails now); `None` when nothing
    /// is held there.
    fn take_resolved(&self, qpn: u32, side: Side) -> Option<Hold> {
        let mut h = lock(&self.held);
        let f = h.get(&(qpn, side))?;
        if f.hold == Hold::Pending {
            return Some(Hold::Pending);
        }
        let hold = f.hold;
        h.remove(&(qpn, side));
        Some(hold)
    }

    /// PAGE_FAULT_RESUME: the fault `token` of type `ty` on `wq` is
    /// resolved (or failed, `error`); returns the QP to run again.
    pub(crate) fn resume(
        &self,
        token: u32,
        ty: u8,
        wq: u32,
        error: bool,
    ) -> Result<u32, ResumeError> {
        let mut h = lock(&self.held);
        let (&(qpn, side), f) = h
            .iter_mut()
            .find(|(_, f)| f.token == token && f.hold == Hold::Pending)
            .ok_or(ResumeError::UnknownToken)?;
        if f.ty != ty || f.wq != wq {
            tracing::debug!(
                token,
                ty,
                wq,
                held_ty = f.ty,
                held_wq = f.wq,
                subtype = %f.subtype,
                "PAGE_FAULT_RESUME for another fault"
            );
            return Err(ResumeError::Mismatch);
        }
        f.hold = if error { Hold::Failed } else { Hold::Resumed };
        match side {
            Side::Requester => self.pending_req.fetch_sub(1, Ordering::AcqRel),
            Side::Responder => self.pending_resp.fetch_sub(1, Ordering::AcqRel),
        };
        self.resumes.fetch_add(1, Ordering::Relaxed);
        if error {
            self.resume_errors.fetch_add(1, Ordering::Relaxed);
        }
        Ok(qpn)
    }
}

impl Rdma {
    /// A work queue's WQE met a page not present: `Pending` when the
    /// queue now waits for PAGE_FAULT_RESUME (an event was raised, or one
    /// is outstanding), `Resumed` never (a resumed fault that faults
    /// again raises a new event), `Failed` when the access fails (resumed
    /// with error, or no page-fault EQ).
    pub(crate) fn wqe_fault(&self, f: WqeFault) -> Hold {
        match self.odp.take_resolved(f.qpn, f.side) {
            Some(Hold::Pending) => return Hold::Pending,
            Some(Hold::Failed) => return Hold::Failed,
            Some(Hold::Resumed) | None => {}
        }
        if !self.odp.pf_eq.load(Ordering::Acquire) {
            return Hold::Failed;
        }
        let token = self.new_fault(f.qpn, f.side, f.ty, f.wq, PageFaultSubtype::Wqe);
        let mut d = EqePageFaultWqe::new_zeroed();
        d.wqe_index.set(f.wqe_index);
        d.packet_length.set(f.packet_length);
        d.token.set(token);
        d.pftype_wq
            .set(u32::from(f.ty) << PFTYPE_SHIFT | (f.wq & 0xff_ffff));
        tracing::debug!(
            qpn = f.qpn,
            wq = f.wq,
            wqe = f.wqe_index,
            ty = f.ty,
            token,
            "page fault (WQE)"
        );
        self.raise(PageFaultSubtype::Wqe, zerocopy::transmute!(d));
        Hold::Pending
    }

    /// An incoming RDMA request met a page not present; as
    /// [`Rdma::wqe_fault`].
    pub(crate) fn rdma_fault(&self, f: RdmaFault) -> Hold {
        match self.odp.take_resolved(f.qpn, Side::Responder) {
            Some(Hold::Pending) => return Hold::Pending,
            Some(Hold::Failed) => return Hold::Failed,
            Some(Hold::Resumed) | None => {}
        }
        if !self.odp.pf_eq.load(Ordering::Acquire) {
            return Hold::Failed;
        }
        let ty = PFAULT_RDMA | if f.write { PFAULT_WRITE } else { 0 };
        // Linux resumes an RDMA fault with the token as its WQ number.
        let token = self.next_token();
        self.hold(
            f.qpn,
            Side::Responder,
            token,
            ty,
            token,
            PageFaultSubtype::Rdma,
        );
        let mut d = EqePageFaultRdma::new_zeroed();
        d.r_key.set(f.rkey);
        d.packet_length.set(f.packet_length);
        d.rdma_op_len.set(f.len);
        d.rdma_va.set(f.va);
        d.pftype_token.set(u32::from(ty) << PFTYPE_SHIFT | token);
        tracing::debug!(
            qpn = f.qpn,
            rkey = format_args!("{:#x}", f.rkey),
            va = format_args!("{:#x}", f.va),
            len = f.len,
            token,
            "page fault (RDMA)"
        );
        self.raise(PageFaultSubtype::Rdma, zerocopy::transmute!(d));
        Hold::Pending
    }

    fn next_token(&self) -> u32 {
        self.odp
            .next_token
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1)
            & 0xff_ffff
    }

    fn new_fault(&self, qpn: u32, side: Side, ty: u8, wq: u32, sub: PageFaultSubtype) -> u32 {
        let token = self.next_token();
        self.hold(qpn, side, token, ty, wq, sub);
        token
    }

    fn hold(&self, qpn: u32, side: Side, token: u32, ty: u8, wq: u32, subtype: PageFaultSubtype) {
        let f = Fault {
            token,
            ty,
            wq,
            subtype,
            hold: Hold::Pending,
        };
        lock(&self.odp.held).insert((qpn, side), f);
        match side {
            Side::Requester => self.odp.pending_req.fetch_add(1, Ordering::AcqRel),
            Side::Responder => self.odp.pending_resp.fetch_add(1, Ordering::AcqRel),
        };
        self.odp.faults.fetch_add(1, Ordering::Relaxed);
    }

    fn raise(&self, sub: PageFaultSubtype, data: [u8; 28]) {
        self.event(PendingEvent {
            eqn: None,
            ty: EventType::PageFault.to_raw(),
            sub: sub.to_raw(),
            data,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(o: &Odp, qpn: u32, side: Side, token: u32, ty: u8, wq: u32) {
        let f = Fault {
            token,
            ty,
            wq,
            subtype: PageFaultSubtype::Wqe,
            hold: Hold::Pending,
        };
        lock(&o.held).insert((qpn, side), f);
        match side {
            Side::Requester => o.pending_req.fetch_add(1, Ordering::AcqRel),
            Side::Responder => o.pending_resp.fetch_add(1, Ordering::AcqRel),
        };
    }

    #[test]
    fn resume_matches_token_type_and_queue() {
        let o = Odp::default();
        held(&o, 0x11, Side::Requester, 5, 1, 0x11);
        assert!(o.requester_waits(0x11));
        assert_eq!(o.resume(6, 1, 0x11, false), Err(ResumeError::UnknownToken));
        assert_eq!(o.resume(5, 3, 0x11, false), Err(ResumeError::Mismatch));
        assert_eq!(o.resume(5, 1, 0x12, false), Err(ResumeError::Mismatch));
        assert_eq!(o.resume(5, 1, 0x11, true), Ok(0x11));
        assert!(!o.requester_waits(0x11));
        // Resumed once: the token is no longer pending.
        assert_eq!(o.resume(5, 1, 0x11, false), Err(ResumeError::UnknownToken));
        assert_eq!(o.take_resolved(0x11, Side::Requester), Some(Hold::Failed));
        assert_eq!(o.take_resolved(0x11, Side::Requester), None);
        assert_eq!(
            (
                o.resumes.load(Ordering::Relaxed),
                o.resume_errors.load(Ordering::Relaxed)
            ),
            (1, 1)
        );
    }

    #[test]
    fn a_destroyed_qp_forgets_its_faults() {
        let o = Odp::default();
        held(&o, 0x20, Side::Responder, 9, PFAULT_RDMA, 9);
        assert!(o.responder_waits(0x20));
        o.forget_qp(0x20);
        assert!(!o.responder_waits(0x20));
        assert_eq!(o.pending_resp.load(Ordering::Relaxed), 0);
        assert_eq!(
            o.resume(9, PFAULT_RDMA, 9, false),
            Err(ResumeError::UnknownToken)
        );
    }
}
