//! Threads: which verbs objects may be used from which threads, and the
//! handles that let several threads post to one QP or poll one CQ.
//!
//! # The rules, in types
//!
//! | object | `Send` | `Sync` | what `&self` allows from many threads |
//! |---|---|---|---|
//! | [`Context`], [`Pd`], [`Mr`], [`Srq`], [`Ah`], [`CompChannel`] | yes | yes | everything: commands go through the command queue (any number of threads, one slot each), `Srq::post_recv` holds the SRQ's lock |
//! | [`Cq`], [`Qp`] | yes | yes | the queries (`cqn`, `qp_num`, `state`, ...); polling, arming, posting and `modify` take `&mut self` |
//! | [`SharedCq`], [`SharedQp`] | yes | yes | polling and arming, posting and `modify`, each under the object's lock |
//!
//! A [`Qp`] and its CQs are separate objects: one thread may post to a QP
//! while another polls the CQ its completions land on (the queue space a
//! completion frees is handed back through atomics, [`WqTrack`]). What
//! needs one owner at a time is one queue: the producer counter, the
//! BlueFlame buffer that alternates between posts, the CQ's consumer index.
//! `&mut self` says so at compile time, so the single-owner fast path has
//! no lock at all: that is what rdma-core's thread domains (`ibv_alloc_td`
//! with a parent domain, `MLX5_SINGLE_THREADED`) promise at run time to
//! drop its spinlocks, here proven by the borrow checker instead of
//! trusted.
//!
//! # Several threads on one queue
//!
//! libibverbs lets any thread post to any QP and poll any CQ; the mlx5
//! provider takes a spinlock per send queue, per receive queue and per CQ.
//! [`Qp::into_shared`] and [`Cq::into_shared`] give that: a [`SharedQp`]
//! or [`SharedCq`] holds the object behind a [`Mutex`] and offers the data
//! path on `&self` (`post_send`, `post_recv`, `poll`, `req_notify`), so it
//! can live in an `Arc` used by every thread; [`SharedQp::lock`] and
//! [`SharedCq::lock`] give the whole object under the lock (the `ibv_wr_*`
//! batch, `modify`, a QP created on a shared CQ: `send_cq: &cq.lock()`).
//! `into_inner` takes the single-owner object back. A wrapper rather than a
//! lock inside [`Qp`], because the lock would cost every single-owner post
//! (the common case: one QP per thread) an atomic read-modify-write and a
//! branch, and because a flag checked at run time could not stop a caller
//! who set it from racing; a type that is `Sync` only with the lock can.
//!
//! Known difference: one lock covers a [`SharedQp`]'s send and receive
//! queues (rdma-core keeps one for each), so a thread reposting receives
//! waits while another posts sends.
//!
//! [`Context`]: crate::device::Context
//! [`Pd`]: crate::pd::Pd
//! [`Mr`]: crate::mr::Mr
//! [`Srq`]: crate::srq::Srq
//! [`Ah`]: crate::ah::Ah
//! [`CompChannel`]: crate::channel::CompChannel
//! [`WqTrack`]: crate::qp::WqTrack

use std::sync::{Mutex, MutexGuard};

use crate::cq::{Cq, Wc};
use crate::qp::{PostError, Qp, QpAttr, QpState, QpType, RecvWr, SendWr};
use crate::Result;

/// A QP several threads may post to (`Send + Sync`; share it in an `Arc`).
#[derive(Debug)]
pub struct SharedQp {
    qpn: u32,
    qp_type: QpType,
    inner: Mutex<Qp>,
}

/// A CQ several threads may poll (`Send + Sync`; share it in an `Arc`).
#[derive(Debug)]
pub struct SharedCq {
    cqn: u32,
    cqe: u32,
    inner: Mutex<Cq>,
}

/// What a post returns: `Err((index of the first WR not posted, why))`.
pub type PostResult = std::result::Result<(), (usize, PostError)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A thread that panicked holding the lock left the queue as consistent
    // as any post or poll that stops between two WQEs or CQEs: go on.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Qp {
    /// Puts the QP behind a lock so that several threads may post to it.
    pub fn into_shared(self) -> SharedQp {
        SharedQp {
            qpn: self.qp_num(),
            qp_type: self.qp_type(),
            inner: Mutex::new(self),
        }
    }
}

impl SharedQp {
    /// The QP number (no lock).
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The transport type (no lock).
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The QP under its lock, for everything else ([`Qp::wr_start`],
    /// [`Qp::post_rdma_write`], the queries). Hold it only as long as a
    /// post: every other poster waits.
    pub fn lock(&self) -> MutexGuard<'_, Qp> {
        lock(&self.inner)
    }

    /// `ibv_post_send` from any thread.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> PostResult {
        self.lock().post_send(wrs)
    }

    /// `ibv_post_recv` from any thread.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> PostResult {
        self.lock().post_recv(wrs)
    }

    /// `ibv_modify_qp` from any thread (posts wait meanwhile).
    pub fn modify(&self, attr: &QpAttr, mask: u32) -> Result<()> {
        self.lock().modify(attr, mask)
    }

    /// The QP's state as last set.
    pub fn state(&self) -> QpState {
        self.lock().state()
    }

    /// The single-owner QP back.
    pub fn into_inner(self) -> Qp {
        self.inner.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl Cq {
    /// Puts the CQ behind a lock so that several threads may poll it.
    pub fn into_shared(self) -> SharedCq {
        SharedCq {
            cqn: self.cqn(),
            cqe: self.cqe(),
            inner: Mutex::new(self),
        }
    }
}

impl SharedCq {
    /// The CQ number (no lock).
    pub fn cqn(&self) -> u32 {
        self.cqn
    }

    /// Entries the CQ holds (no lock).
    pub fn cqe(&self) -> u32 {
        self.cqe
    }

    /// The CQ under its lock (to create QPs on it: `send_cq: &cq.lock()`).
    pub fn lock(&self) -> MutexGuard<'_, Cq> {
        lock(&self.inner)
    }

    /// `ibv_poll_cq` from any thread: each completion goes to exactly one
    /// caller.
    pub fn poll(&self, wc: &mut [Wc]) -> Result<usize> {
        self.lock().poll(wc)
    }

    /// `ibv_req_notify_cq` from any thread.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        self.lock().req_notify(solicited_only)
    }

    /// The single-owner CQ back.
    pub fn into_inner(self) -> Cq {
        self.inner.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

// The table above, checked when the crate compiles.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<crate::device::Context>();
    send_sync::<crate::pd::Pd>();
    send_sync::<crate::mr::Mr>();
    send_sync::<crate::srq::Srq>();
    send_sync::<crate::ah::Ah>();
    send_sync::<crate::channel::CompChannel>();
    send_sync::<Cq>();
    send_sync::<Qp>();
    send_sync::<SharedCq>();
    send_sync::<SharedQp>();
};
