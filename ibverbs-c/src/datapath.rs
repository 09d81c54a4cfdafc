//! The data path the header's inline functions reach through
//! `ibv_context.ops`: `ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`. Each converts
//! the C work requests or completions to the driver's on the stack (no
//! allocation) and calls the driver's fast path under the object's lock.
//!
//! These check their object pointers for NULL only (they are the hot
//! path; a destroyed object's pointer is the caller's use-after-free, as
//! with libibverbs). A bad work request gets `EINVAL` and `bad_wr`, a full
//! queue `ENOMEM`, a failed device `EIO`.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;

use libc::c_int;
use verbs::cq::Wc;
use verbs::mr::Sge;
use verbs::qp::{Payload, PostError, QpType, RecvWr, SendOp, SendWr, UdDest, MAX_INLINE, MAX_SGE};

use crate::abi::*;
use crate::objects::{ah_of, Cq, Srq};
use crate::qp::Qp;
use crate::spin::SpinGuard;

/// `IBV_WR_RDMA_WRITE` (`enum ibv_wr_opcode`).
const IBV_WR_RDMA_WRITE: c_int = 0;
/// `IBV_QPT_UD`: the last type of a `Qp` (RC 2, UC 3, UD 4).
const IBV_QPT_UD: c_int = 4;
/// `IBV_SEND_INLINE` (`enum ibv_send_flags`).
const IBV_SEND_INLINE: libc::c_uint = 8;

/// The errno of a failed post (off the fast path: a post that succeeds
/// only tests the result).
#[cold]
#[inline(never)]
pub(crate) fn post_errno(e: PostError) -> c_int {
    match e {
        PostError::QueueFull => libc::ENOMEM,
        PostError::DeviceFailed => libc::EIO,
        PostError::BadState(_)
        | PostError::TooLarge
        | PostError::BadOp
        | PostError::BadBind(_)
        | PostError::BadMkeyWr(_) => libc::EINVAL,
    }
}

/// The SGEs of a C work request, as the driver's, in `out`.
///
/// # Safety
///
/// `list` points to `n` readable `ibv_sge`s (or `n` is 0).
pub(crate) unsafe fn sges(
    list: *const ibv_sge,
    n: c_int,
    out: &mut [MaybeUninit<Sge>; MAX_SGE],
) -> Result<&[Sge], c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n > MAX_SGE || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    for (i, o) in out.iter_mut().take(n).enumerate() {
        // SAFETY: `i < n` entries are readable (this function's contract).
        let s = unsafe { list.wrapping_add(i).read() };
        // SAFETY: ibv_post_send's contract: each SGE lies in a live MR of
        // that lkey until its WR completes.
        o.write(unsafe { Sge::new_unchecked(s.addr, s.length, s.lkey) });
    }
    // SAFETY: the first `n` entries were written just above.
    Ok(unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<Sge>(), n) })
}

/// The inline bytes of a WR's SGEs: the one buffer itself, or several
/// gathered into `buf`.
///
/// # Safety
///
/// Every SGE's `addr .. addr + length` is readable memory of the caller.
unsafe fn inline_bytes<'a>(
    s: &[Sge],
    buf: &'a mut [MaybeUninit<u8>; MAX_INLINE],
) -> Result<&'a [u8], c_int> {
    if let [one] = s {
        if one.length() as usize > MAX_INLINE {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's buffer, readable for its length.
        return Ok(unsafe {
            std::slice::from_raw_parts(one.addr() as *const u8, one.length() as usize)
        });
    }
    let mut at = 0usize;
    for e in s {
        let n = e.length() as usize;
        if at + n > MAX_INLINE {
            return Err(libc::EINVAL);
        }
        let dst = buf[at..at + n].as_mut_ptr().cast::<u8>();
        // SAFETY: the caller's buffer is readable for `n` bytes; `dst` is
        // `n` bytes of `buf`.
        unsafe { std::ptr::copy_nonoverlapping(e.addr() as *const u8, dst, n) };
        at += n;
    }
    // SAFETY: the first `at` bytes were written just above.
    Ok(unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), at) })
}

fn send_op(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    // SAFETY: reading the union member the opcode selects; all members
    // are plain integers and pointers.
    let rdma = unsafe { w.wr.rdma };
    // SAFETY: as above.
    let atomic = unsafe { w.wr.atomic };
    Ok(match w.opcode {
        0 => SendOp::RdmaWrite {
            raddr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        1 => SendOp::RdmaWriteImm {
            raddr: rdma.remote_addr,
            rkey: rdma.rkey,
            imm: u32::from_be(w.imm_data),
        },
        2 => SendOp::Send,
        3 => SendOp::SendImm(u32::from_be(w.imm_data)),
        4 => SendOp::RdmaRead {
            raddr: rdma.remote_addr,
            rkey: rdma.rkey,
        },
        5 => SendOp::AtomicCmpSwp {
            raddr: atomic.remote_addr,
            rkey: atomic.rkey,
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        6 => SendOp::AtomicFetchAdd {
            raddr: atomic.remote_addr,
            rkey: atomic.rkey,
            add: atomic.compare_add,
        },
        7 => SendOp::LocalInv { rkey: w.imm_data },
        8 => return crate::mw::bind_op(w),
        9 => SendOp::SendInv { rkey: w.imm_data },
        _ => return Err(libc::EINVAL),
    })
}

/// The common WR, an RDMA WRITE of one SGE, not inline: its SGE, remote
/// address and rkey, or `None` for any other.
///
/// # Safety
///
/// As [`post_one`].
#[inline(always)]
unsafe fn plain_write(w: &ibv_send_wr) -> Option<(Sge, u64, u32)> {
    if w.opcode == IBV_WR_RDMA_WRITE
        && w.num_sge == 1
        && !w.sg_list.is_null()
        && w.send_flags & IBV_SEND_INLINE == 0
    {
        // SAFETY: one readable SGE (ibv_post_send's contract).
        let s = unsafe { w.sg_list.read() };
        // SAFETY: the rdma member is the one an RDMA WRITE uses.
        let rdma = unsafe { w.wr.rdma };
        // SAFETY: ibv_post_send's contract: the SGE lies in a live MR of
        // that lkey until its WR completes.
        let sge = unsafe { Sge::new_unchecked(s.addr, s.length, s.lkey) };
        return Some((sge, rdma.remote_addr, rdma.rkey));
    }
    None
}

/// Writes one C send WR (no doorbell; the list's checks made).
///
/// # Safety
///
/// `w`'s SGE list and inline buffers are the caller's, as ibv_post_send
/// requires.
#[inline(always)]
unsafe fn post_one(q: &mut verbs::qp::Qp, w: &ibv_send_wr) -> Result<(), c_int> {
    // The common WR straight to the WQE writer (the same WQE as through
    // `SendWr`; on a UD QP the driver refuses it as `post_one_general`
    // would, EINVAL).
    // SAFETY: forwarded from this function's contract.
    if let Some((sge, raddr, rkey)) = unsafe { plain_write(w) } {
        // Matched, not mapped: the errno is worked out only on failure.
        return match q.write_rdma_write(w.wr_id, &sge, raddr, rkey, w.send_flags & 0x7) {
            Ok(()) => Ok(()),
            Err(e) => Err(post_errno(e)),
        };
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { post_one_general(q, w) }
}

/// [`post_one`] for any WR: through the driver's `SendWr`.
///
/// # Safety
///
/// As [`post_one`].
#[inline(never)]
unsafe fn post_one_general(q: &mut verbs::qp::Qp, w: &ibv_send_wr) -> Result<(), c_int> {
    let mut sg = [const { MaybeUninit::uninit() }; MAX_SGE];
    let mut buf = [const { MaybeUninit::uninit() }; MAX_INLINE];
    // SAFETY: forwarded from this function's contract.
    let s = unsafe { sges(w.sg_list, w.num_sge, &mut sg) }?;
    let payload = if w.send_flags & IBV_SEND_INLINE != 0 {
        // SAFETY: forwarded.
        Payload::Inline(unsafe { inline_bytes(s, &mut buf) }?)
    } else {
        Payload::Sges(s)
    };
    let dest = if q.qp_type() == QpType::Ud {
        // SAFETY: `wr.ud` is the member a UD QP's WR uses.
        let u = unsafe { w.wr.ud };
        let ah = ah_of(u.ah).ok_or(libc::EINVAL)?;
        Some(UdDest {
            ah: &ah.ah,
            remote_qpn: u.remote_qpn,
            remote_qkey: u.remote_qkey,
        })
    } else {
        None
    };
    let wr = SendWr {
        wr_id: w.wr_id,
        op: send_op(w)?,
        payload,
        flags: w.send_flags & 0x7,
        ud: dest,
    };
    q.write_send(&wr).map_err(post_errno)
}

/// `ibv_post_send`.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // RC, UC and UD QPs are `Qp`s; a raw packet QP is a `RawQp`; a DC QP
    // takes no `ibv_send_wr` (a DCI's WRs name their DCT through
    // `mlx5dv_wr_set_dc_addr`; a DCT sends nothing), and a DCT is no `Qp`.
    // SAFETY: a QP this library made (the data path's contract).
    if qp.is_null() || unsafe { (*qp).qp_type } > IBV_QPT_UD {
        // SAFETY: forwarded.
        return unsafe { post_send_other(qp, wr, bad) };
    }
    // SAFETY: as above; not a DCT.
    let q = unsafe { &*(qp as *const Qp) };
    let mut g = q.qp.lock();
    // SAFETY: the caller's WR list and buffers (ibv_post_send's contract).
    match unsafe { post_list(&mut g, wr) } {
        Ok(()) => 0,
        Err((at, e)) => post_send_failed(bad, at, e),
    }
}

/// `ibv_post_send` on a QP that is no `Qp`: a raw packet QP's frames,
/// EINVAL for anything else (DC QPs, NULL).
///
/// # Safety
///
/// As `ibv_post_send`'s.
#[cold]
#[inline(never)]
unsafe fn post_send_other(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    let Some(q) = crate::raw::raw_of(qp) else {
        return post_send_failed(bad, wr, libc::EINVAL);
    };
    // SAFETY: the caller's WR list and buffers.
    match unsafe { crate::raw::post_send(q, wr) } {
        Ok(()) => 0,
        Err((at, e)) => post_send_failed(bad, at, e),
    }
}

/// Writes the WRs of the list from `wr` and rings once: the WR that
/// failed and its errno, those before it posted.
///
/// # Safety
///
/// `wr` is the caller's list, its buffers as ibv_post_send requires.
#[inline(always)]
unsafe fn post_list(
    q: &mut verbs::qp::Qp,
    wr: *mut ibv_send_wr,
) -> Result<(), (*mut ibv_send_wr, c_int)> {
    // The device and state checks, once for the list (a post of no WR
    // checks nothing).
    if wr.is_null() {
        return Ok(());
    }
    if let Err(e) = q.send_ready() {
        return Err((wr, post_errno(e)));
    }
    // SAFETY: the caller's WR list.
    let first = unsafe { &*wr };
    if first.next.is_null() {
        // One WR, the common one, with the room known: written and rung
        // as the driver's `post_send` of one WR does.
        // SAFETY: the caller's WR and its buffers.
        if let Some((sge, raddr, rkey)) = unsafe { plain_write(first) } {
            if q.post_one_rdma_write(first.wr_id, &sge, raddr, rkey, first.send_flags & 0x7) {
                return Ok(());
            }
        }
    }
    let mut cur = wr;
    let r = loop {
        // SAFETY: the caller's WR list.
        let w = unsafe { &*cur };
        // SAFETY: ibv_post_send's contract on the WR's buffers.
        if let Err(e) = unsafe { post_one(q, w) } {
            break Err((cur, e));
        }
        cur = w.next;
        if cur.is_null() {
            break Ok(());
        }
    };
    q.ring_send();
    r
}

/// `ibv_post_send` failing at `at`: `*bad` set (when given), the errno.
#[cold]
#[inline(never)]
fn post_send_failed(bad: *mut *mut ibv_send_wr, at: *mut ibv_send_wr, e: c_int) -> c_int {
    if !bad.is_null() {
        // SAFETY: the caller's out pointer, non-NULL.
        unsafe { *bad = at };
    }
    e
}

/// `ibv_post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // DC QPs have no receive queue (a DCT receives through its SRQ); a
    // raw packet QP is a `RawQp`.
    // SAFETY: a QP this library made (the data path's contract).
    if qp.is_null() || unsafe { (*qp).qp_type } > IBV_QPT_UD {
        let Some(q) = crate::raw::raw_of(qp) else {
            return fail_recv(bad, wr, libc::EINVAL);
        };
        // SAFETY: the caller's WR list and buffers.
        return match unsafe { crate::raw::post_recv(q, wr) } {
            Ok(()) => 0,
            Err((at, e)) => fail_recv(bad, at, e),
        };
    }
    // SAFETY: as above; not a DCT.
    let q = unsafe { &*(qp as *const Qp) };
    let mut g = q.qp.lock();
    // SAFETY: the caller's WR list and buffers.
    unsafe {
        walk_recv(wr, bad, |r| {
            g.post_recv(std::slice::from_ref(r)).map_err(|(_, e)| e)
        })
    }
}

/// `ibv_post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return fail_recv(bad, wr, libc::EINVAL);
    }
    // SAFETY: an SRQ this library made (the data path's contract).
    let s = unsafe { &*(srq as *const Srq) };
    // SAFETY: the caller's WR list and buffers.
    unsafe {
        walk_recv(wr, bad, |r| {
            s.srq.post_recv(std::slice::from_ref(r)).map_err(|(_, e)| e)
        })
    }
}

fn fail_recv(bad: *mut *mut ibv_recv_wr, at: *mut ibv_recv_wr, e: c_int) -> c_int {
    if !bad.is_null() {
        // SAFETY: the caller's out pointer, non-NULL.
        unsafe { *bad = at };
    }
    e
}

/// Posts each receive WR of a list through `post`.
///
/// # Safety
///
/// `wr` is the caller's list; its SGEs lie in live MRs.
unsafe fn walk_recv(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(&RecvWr<'_>) -> Result<(), PostError>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller's WR list.
        let w = unsafe { &*cur };
        let mut sg = [const { MaybeUninit::uninit() }; MAX_SGE];
        // SAFETY: forwarded from this function's contract.
        let s = match unsafe { sges(w.sg_list, w.num_sge, &mut sg) } {
            Ok(s) => s,
            Err(e) => return fail_recv(bad, cur, e),
        };
        if let Err(e) = post(&RecvWr {
            wr_id: w.wr_id,
            sg_list: s,
        }) {
            return fail_recv(bad, cur, post_errno(e));
        }
        cur = w.next;
    }
    0
}

// The driver's `Wc` is `ibv_wc` byte for byte: a poll writes completions
// straight into the caller's array.
macro_rules! same_layout {
    ([$($f:ident),*]) => {
        const _: () = {
            assert!(size_of::<Wc>() == size_of::<ibv_wc>());
            assert!(align_of::<Wc>() == align_of::<ibv_wc>());
            $(assert!(std::mem::offset_of!(Wc, $f) == std::mem::offset_of!(ibv_wc, $f));)*
        };
    };
}
crate::abi::ibv_wc_fields!(same_layout);

/// `ibv_poll_cq`: completions written, or -1 (errno EIO) once the device
/// failed and nothing is left. Completions go straight into the caller's
/// array: the driver's `Wc` is `ibv_wc` (checked above).
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // One test for the usual call; the rest sorted out off the fast path.
    if cq.is_null() | wc.is_null() | (n <= 0) {
        return poll_cq_odd(cq, n);
    }
    let p = cq as *const Cq;
    // An empty CQ (most polls of a poll-mode program) is told from its
    // ring without taking the lock.
    // SAFETY: a CQ this library made (the data path's contract).
    if !unsafe { Cq::may_have_cqe(p) } {
        return 0;
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { poll_cq_found(p, n, wc) }
}

/// `ibv_poll_cq` once the CQ may hold a completion. Out of line, so that
/// an empty poll (its caller) needs no stack frame; the C ABI, so that its
/// caller jumps to it rather than calls it. The usual `ibv_poll_cq(cq, 1,
/// &wc)` (the cached QP's usual completion, the lock taken at once) is
/// done here, a leaf that calls nothing and so saves no registers;
/// anything else goes to [`poll_cq_general`], which starts over.
///
/// # Safety
///
/// `p` is a live CQ of this library; `wc` holds `n > 0` entries.
#[inline(never)]
unsafe extern "C" fn poll_cq_found(p: *const Cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if n == 1 {
        // SAFETY: only its lock is borrowed, as in `poll_cq_general`.
        let lock = unsafe { &(*p).cq };
        if let Some(mut g) = lock.try_lock() {
            // SAFETY: the caller's array holds one `ibv_wc`, which `Wc`
            // is laid out as.
            let one = unsafe { &mut *wc.cast::<MaybeUninit<Wc>>() };
            if g.poll_one_usual(one) {
                // SAFETY: a field of a live CQ, written under its lock.
                unsafe { (*p).was_empty.store(false, Ordering::Relaxed) };
                return 1;
            }
        }
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { poll_cq_general(p, n, wc) }
}

/// `ibv_poll_cq` under the CQ's lock: any number of slots, any
/// completion, the empty CQ's consumer index for the lock-free test, a
/// failed device's error.
///
/// # Safety
///
/// As [`poll_cq_found`].
#[inline(never)]
unsafe extern "C" fn poll_cq_general(p: *const Cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: only its lock is borrowed (the `ibv_cq_ex` fields are
    // written through raw pointers by the extended poll and resize).
    let lock = unsafe { &(*p).cq };
    let Some(g) = lock.try_lock() else {
        // SAFETY: forwarded from this function's contract.
        return unsafe { poll_cq_contended(p, n, wc) };
    };
    // SAFETY: forwarded from this function's contract.
    unsafe { poll_locked(p, g, n, wc) }
}

/// `ibv_poll_cq` with the CQ locked, `wc` non-NULL and `n > 0`: the
/// driver's poll (its own owner-bit test in the load of the CQE's last 8
/// bytes), a one-slot poll inlined.
///
/// # Safety
///
/// `wc` holds `n` entries of `ibv_wc`.
#[inline(always)]
unsafe fn poll_locked(
    p: *const Cq,
    mut g: SpinGuard<'_, verbs::cq::Cq>,
    n: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    // SAFETY: the caller's array holds `n` entries of `ibv_wc`, which
    // `Wc` is laid out as; the poll writes only whole completions into it.
    let out = unsafe { std::slice::from_raw_parts_mut(wc.cast::<MaybeUninit<Wc>>(), n as usize) };
    let r = g.poll_uninit_inline(out);
    // SAFETY: `p` is live and its lock held through `g`.
    unsafe { Cq::polled(p, &g, r.unwrap_or(0)) };
    match r {
        Some(got) => got as c_int,
        None => poll_cq_failed(&g),
    }
}

/// `ibv_poll_cq` while another thread holds the CQ: waits for it. Out of
/// line, so that the uncontended poll keeps its arguments in registers.
///
/// # Safety
///
/// As [`poll_locked`].
#[cold]
#[inline(never)]
unsafe fn poll_cq_contended(p: *const Cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: forwarded; only the lock is borrowed.
    let lock = unsafe { &(*p).cq };
    // SAFETY: forwarded.
    unsafe { poll_locked(p, lock.lock(), n, wc) }
}

/// `ibv_poll_cq` that found nothing on a failed device: -1 with its
/// errno (0 if the failure is not recorded yet).
#[cold]
#[inline(never)]
fn poll_cq_failed(cq: &verbs::cq::Cq) -> c_int {
    match cq.failure() {
        Some(e) => {
            crate::set_errno(crate::errno_of("ibv_poll_cq", &e));
            -1
        }
        None => 0,
    }
}

/// `ibv_poll_cq` with no CQ, no array or no room: nothing polled for
/// `n == 0` (verbs lets the array be NULL then), EINVAL otherwise.
#[cold]
#[inline(never)]
fn poll_cq_odd(cq: *mut ibv_cq, n: c_int) -> c_int {
    if n == 0 && !cq.is_null() {
        return 0;
    }
    crate::set_errno(libc::EINVAL);
    -1
}

/// `ibv_req_notify_cq`.
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a CQ this library made (the data path's contract); only its
    // lock is borrowed, as in `poll_cq`.
    let lock = unsafe { &(*(cq as *const Cq)).cq };
    match lock.lock_unclaimed().req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => crate::errno_of("ibv_req_notify_cq", &e),
    }
}
