//! Device memory (MEMIC): `ibv_alloc_dm`, `ibv_free_dm`, `ibv_reg_dm_mr`
//! (the header's inline functions reach them through `verbs_context`),
//! and `ibv_memcpy_to_dm` / `ibv_memcpy_from_dm` (inline too, through the
//! `ibv_dm`'s own pointers). The driver's [`verbs::dm`] does the work.
//!
//! As libmlx5 answers (`mlx5_alloc_dm`, `mlx5_copy_to_dm`,
//! `mlx5_reg_dm_mr` with mlx5_ib's checks): an unknown `comp_mask` or a
//! length past `max_dm_size` is EINVAL; a copy whose offset or length is
//! not a multiple of 4 is EINVAL and one past the allocation EFAULT, the
//! error returned, not put in `errno`; an MR past the allocation or
//! without `IBV_ACCESS_ZERO_BASED` is EINVAL; a DM with MRs over it is not
//! freed (EBUSY).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use libc::{c_int, c_uint, c_void};

use crate::abi::*;
use crate::device::{checked_ctx, CtxShared};
use crate::objects::{pd_of, Mr, MrKey};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno};

/// An `ibv_dm` of this library.
#[repr(C)]
pub(crate) struct Dm {
    pub c: ibv_dm,
    dm: verbs::dm::Dm,
    shared: Arc<CtxShared>,
    /// MRs registered over it.
    pub users: AtomicUsize,
}

fn dm_of<'a>(p: *mut ibv_dm) -> Option<&'a Dm> {
    if !registry::is(p, Kind::Dm) {
        return None;
    }
    // SAFETY: the registry holds `p`: a live Dm box, `c` its first field.
    Some(unsafe { &*(p as *const Dm) })
}

/// `verbs_context.alloc_dm` (`ibv_alloc_dm`).
pub(crate) unsafe extern "C" fn alloc_dm(
    c: *mut ibv_context,
    attr: *mut ibv_alloc_dm_attr,
) -> *mut ibv_dm {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { *attr };
    if a.comp_mask != 0 || a.length as u64 > ctx.vc.max_dm_size() {
        return null_errno(libc::EINVAL);
    }
    let dm = match ctx.vc.alloc_dm(a.length as u64, a.log_align_req) {
        Ok(d) => d,
        Err(e) => return null_errno(crate::errno_of("ibv_alloc_dm", &e)),
    };
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Dm {
        c: ibv_dm {
            context: c,
            memcpy_to_dm: Some(memcpy_to_dm),
            memcpy_from_dm: Some(memcpy_from_dm),
            comp_mask: 0,
            handle: (dm.bar_offset() >> 6) as u32,
        },
        dm,
        shared: ctx.shared.clone(),
        users: AtomicUsize::new(0),
    }));
    registry::add(p, Kind::Dm);
    p.cast()
}

/// `verbs_context.free_dm` (`ibv_free_dm`).
pub(crate) unsafe extern "C" fn free_dm(p: *mut ibv_dm) -> c_int {
    let Some(dm) = dm_of(p) else {
        return ret_errno(libc::EINVAL);
    };
    if dm.users.load(Ordering::Acquire) > 0 {
        return ret_errno(libc::EBUSY);
    }
    registry::remove(p, Kind::Dm);
    // SAFETY: live until removed just now; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Dm) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    match b.dm.free() {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_free_dm", &e)),
    }
}

/// `ibv_dm.memcpy_to_dm`: 0 or the errno value.
unsafe extern "C" fn memcpy_to_dm(
    p: *mut ibv_dm,
    offset: u64,
    host: *const c_void,
    len: usize,
) -> c_int {
    let Some(dm) = dm_of(p) else {
        return libc::EINVAL;
    };
    if len == 0 {
        return 0;
    }
    if host.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's `len` readable bytes at `host`, non-NULL.
    let data = unsafe { std::slice::from_raw_parts(host.cast::<u8>(), len) };
    match dm.dm.memcpy_to_dm(offset, data) {
        Ok(()) => 0,
        Err(e) => crate::errno_of("ibv_memcpy_to_dm", &e),
    }
}

/// `ibv_dm.memcpy_from_dm`: 0 or the errno value.
unsafe extern "C" fn memcpy_from_dm(
    host: *mut c_void,
    p: *mut ibv_dm,
    offset: u64,
    len: usize,
) -> c_int {
    let Some(dm) = dm_of(p) else {
        return libc::EINVAL;
    };
    if len == 0 {
        return 0;
    }
    if host.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's `len` writable bytes at `host`, non-NULL.
    let out = unsafe { std::slice::from_raw_parts_mut(host.cast::<u8>(), len) };
    match dm.dm.memcpy_from_dm(out, offset) {
        Ok(()) => 0,
        Err(e) => crate::errno_of("ibv_memcpy_from_dm", &e),
    }
}

/// `verbs_context.reg_dm_mr` (`ibv_reg_dm_mr`): a zero-based MR over
/// `length` bytes of the DM from `offset`.
pub(crate) unsafe extern "C" fn reg_dm_mr(
    p: *mut ibv_pd,
    d: *mut ibv_dm,
    offset: u64,
    length: usize,
    access: c_uint,
) -> *mut ibv_mr {
    let Some(pd) = pd_of(p) else {
        return std::ptr::null_mut();
    };
    let Some(dm) = dm_of(d) else {
        return null_errno(libc::EINVAL);
    };
    let mr = match pd.pd.reg_dm_mr(&dm.dm, offset, length as u64, access) {
        Ok(m) => m,
        Err(e) => return null_errno(crate::errno_of("ibv_reg_dm_mr", &e)),
    };
    dm.users.fetch_add(1, Ordering::AcqRel);
    let c = ibv_mr {
        context: pd.c.context,
        pd: p,
        // Zero-based: work requests address it from 0.
        addr: std::ptr::null_mut(),
        length,
        handle: mr.lkey(),
        lkey: mr.lkey(),
        rkey: mr.rkey(),
    };
    Mr::add(pd, c, MrKey::Dm(mr, std::ptr::from_ref(dm)))
}
