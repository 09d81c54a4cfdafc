//! Memory windows: `ibv_alloc_mw`, `ibv_bind_mw` (type 1), `ibv_dealloc_mw`
//! through `ibv_context_ops` (the header's inline functions call them),
//! and the BIND_MW work request of `ibv_post_send` (type 2, `datapath`).
//! The driver's [`verbs::mw`] does the work: a window is a free indirect
//! mkey, bound and invalidated by UMR WQEs on the QP.
//!
//! As libmlx5 answers: a type other than 1 or 2 is EINVAL
//! (`mlx5_alloc_mw`); `ibv_bind_mw` returns the errno of the post it
//! makes, and on success the window's `rkey` is the new one (the old with
//! its low byte incremented, `ibv_inc_rkey`); a window with a bind still
//! posted may be deallocated (the device refuses access through it after).

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use libc::c_int;
use verbs::mw::{MwBind, MwType};
use verbs::qp::SendOp;

use crate::abi::*;
use crate::objects::{lock, pd_of, unuse, Pd};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno};

/// An `ibv_mw` of this library.
#[repr(C)]
pub(crate) struct Mw {
    pub c: ibv_mw,
    mw: Mutex<verbs::mw::Mw>,
    pd: *const Pd,
}

fn mw_of<'a>(p: *mut ibv_mw) -> Option<&'a Mw> {
    if !registry::is(p, Kind::Mw) {
        return None;
    }
    // SAFETY: the registry holds `p`: a live Mw box, `c` its first field.
    Some(unsafe { &*(p as *const Mw) })
}

/// `ibv_context_ops.alloc_mw`.
pub(crate) unsafe extern "C" fn alloc_mw(p: *mut ibv_pd, ty: c_int) -> *mut ibv_mw {
    let Some(pd) = pd_of(p) else {
        return std::ptr::null_mut();
    };
    let t = match ty {
        1 => MwType::Type1,
        2 => MwType::Type2,
        _ => return null_errno(libc::EINVAL),
    };
    let mw = match pd.pd.alloc_mw(t) {
        Ok(m) => m,
        Err(e) => return null_errno(crate::errno_of("ibv_alloc_mw", &e)),
    };
    pd.users.fetch_add(1, Ordering::AcqRel);
    let m = Box::into_raw(Box::new(Mw {
        c: ibv_mw {
            context: pd.c.context,
            pd: p,
            rkey: mw.rkey(),
            handle: mw.rkey() >> 8,
            type_: ty,
        },
        mw: Mutex::new(mw),
        pd: std::ptr::from_ref(pd),
    }));
    registry::add(m, Kind::Mw);
    m.cast()
}

/// `ibv_context_ops.dealloc_mw`.
pub(crate) unsafe extern "C" fn dealloc_mw(p: *mut ibv_mw) -> c_int {
    if !registry::remove(p, Kind::Mw) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live (removed just now); the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Mw) };
    // SAFETY: a PD is not deallocated while a window counts on it.
    unuse(unsafe { &(*b.pd).users });
    // DESTROY_MKEY runs as the window drops.
    drop(b);
    0
}

/// The driver's bind of `info` (a NULL MR: an unbind), or the errno.
pub(crate) fn bind_of(info: &ibv_mw_bind_info) -> Result<MwBind, c_int> {
    if info.mr.is_null() {
        return Ok(MwBind::unbind());
    }
    let (lkey, mr_access) = crate::objects::mr_key_and_access(info.mr).ok_or(libc::EINVAL)?;
    Ok(MwBind {
        lkey,
        mr_access,
        addr: info.addr,
        length: info.length,
        access: info.mw_access_flags,
    })
}

/// The BIND_MW operation of window `p` to `rkey` over `info`
/// (`ibv_wr_bind_mw`; type 2: the window takes `rkey` when it executes).
pub(crate) fn wr_bind_op(
    p: *mut ibv_mw,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<SendOp, c_int> {
    let mw = mw_of(p).ok_or(libc::EINVAL)?;
    let bind = bind_of(info)?;
    Ok(lock(&mw.mw).bind_op(rkey, bind))
}

/// The BIND_MW work request of `ibv_post_send`'s `wr` (type 2: the window
/// keeps its key until the WR's `rkey` is used by the application).
pub(crate) fn bind_op(w: &ibv_send_wr) -> Result<SendOp, c_int> {
    let b = w.bind_mw;
    let mw = mw_of(b.mw.cast()).ok_or(libc::EINVAL)?;
    let bind = bind_of(&b.bind_info)?;
    Ok(lock(&mw.mw).bind_op(b.rkey, bind))
}

/// `ibv_context_ops.bind_mw` (type 1; the header refuses the others).
pub(crate) unsafe extern "C" fn bind_mw(
    q: *mut ibv_qp,
    p: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    let (Some(qp), Some(mw)) = (crate::qp::qp_of(q), mw_of(p)) else {
        return libc::EINVAL;
    };
    if mw_bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's bind, non-NULL.
    let b = unsafe { *mw_bind };
    let bind = match bind_of(&b.bind_info) {
        Ok(x) => x,
        Err(e) => return e,
    };
    let mut w = lock(&mw.mw);
    let r = qp.qp.lock().bind_mw(b.wr_id, &mut w, bind, b.send_flags);
    match r {
        Ok(rkey) => {
            // SAFETY: the window's own struct; the caller reads the new
            // key from it after the call, as from libmlx5's.
            unsafe { (*p).rkey = rkey };
            0
        }
        Err(e) => crate::datapath::post_errno(e),
    }
}
