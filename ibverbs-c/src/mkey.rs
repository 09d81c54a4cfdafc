//! mlx5dv indirect mkeys through the C ABI: `mlx5dv_create_mkey` /
//! `mlx5dv_destroy_mkey` over `verbs::mkey::DvMkey`, and the
//! `mlx5dv_qp_ex` builders that configure one by a UMR work request
//! (`mlx5dv_wr_mkey_configure` and its setters, `mlx5dv_wr_mr_list`,
//! `mlx5dv_wr_mr_interleaved`), on RC QPs made by `mlx5dv_create_qp` with
//! `MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS`, as libmlx5 offers them.
//!
//! Each builder is one call of the C API but one step of the driver's
//! `WrBatch`: it resumes the QP's batch (`Qp::wr_resume`) with what the
//! last call left (`WrCarry`: the configuration waiting for setters),
//! applies the step and suspends it again; a failure is the batch's, as
//! any WR's, reported by `ibv_wr_complete`.

use std::sync::atomic::Ordering;

use libc::c_int;
use verbs::mkey::{DvMkey, MkeyConfAttr, MkeyInitAttr, MrInterleaved};
use verbs::mr::Sge;
use verbs::qp::MAX_SGE;

use crate::abi::*;
use crate::objects::{lock, pd_of, unuse, Pd};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno};

/// An indirect mkey: the C struct first.
#[repr(C)]
pub(crate) struct Mkey {
    pub c: mlx5dv_mkey,
    mkey: DvMkey,
    pd: *const Pd,
}

/// `mlx5dv_create_mkey`: a free KLM key of the PD with room for
/// `max_entries` (INDIRECT required; REMOTE_INVALIDATE allowed).
#[no_mangle]
pub extern "C" fn mlx5dv_create_mkey(attr: *mut mlx5dv_mkey_init_attr) -> *mut mlx5dv_mkey {
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { attr.read() };
    let Some(pd) = pd_of(a.pd) else {
        return null_errno(libc::EINVAL);
    };
    let mut init = MkeyInitAttr {
        create_flags: a.create_flags,
        max_entries: a.max_entries,
    };
    let mkey = match pd.pd.create_mkey(&mut init) {
        Ok(k) => k,
        Err(e) => return null_errno(crate::errno_of("mlx5dv_create_mkey", &e)),
    };
    pd.users.fetch_add(1, Ordering::AcqRel);
    let b = Box::into_raw(Box::new(Mkey {
        c: mlx5dv_mkey {
            lkey: mkey.lkey(),
            rkey: mkey.rkey(),
        },
        mkey,
        pd,
    }));
    registry::add(b, Kind::Mkey);
    b.cast()
}

/// `mlx5dv_destroy_mkey`: 0, or EINVAL for what is not a live mkey.
#[no_mangle]
pub extern "C" fn mlx5dv_destroy_mkey(k: *mut mlx5dv_mkey) -> c_int {
    if !registry::remove(k, Kind::Mkey) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(k.cast::<Mkey>()) };
    // SAFETY: the PD is not deallocated while the mkey counts on it.
    unuse(unsafe { &(*b.pd).users });
    match b.mkey.destroy() {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("mlx5dv_destroy_mkey", &e)),
    }
}

/// The driver's key of a live `mlx5dv_mkey`, or `None`.
fn mkey_of<'a>(k: *mut mlx5dv_mkey) -> Option<&'a DvMkey> {
    if !registry::is(k, Kind::Mkey) {
        return None;
    }
    // SAFETY: the registry holds `k`: a live Mkey box.
    Some(unsafe { &(*k.cast::<Mkey>()).mkey })
}

/// Runs one mkey step on the batch of `mqp`'s QP: resumed with what the
/// last step left, the WR's id and flags (inline among them: a
/// configuration needs it) from the `ibv_qp_ex`, suspended after.
///
/// # Safety
///
/// `mqp` is the `mlx5dv_qp_ex` of a live QP of this library.
unsafe fn step(mqp: *mut mlx5dv_qp_ex, f: impl FnOnce(&mut verbs::wr::WrBatch<'_>)) {
    if mqp.is_null() {
        return;
    }
    // SAFETY: forwarded from this function's contract.
    let q = unsafe { crate::dc::qp_of_dv(mqp) };
    let mut st = lock(&q.wr);
    let mut g = q.qp.lock();
    if let Err(e) = g.send_ready() {
        st.fail(crate::datapath::post_errno(e));
        return;
    }
    let (id, flags) = (q.c.wr_id, q.c.wr_flags & 0xf);
    let mut b = g.wr_resume(st.start_pc(), st.take_carry());
    b.wr_id(id, flags);
    f(&mut b);
    let (carry, err) = b.suspend();
    st.put_carry(carry);
    if let Some(e) = err {
        st.fail(crate::datapath::post_errno(e));
    }
}

/// The SGEs of a C list of `n`, or an errno.
///
/// # Safety
///
/// `list` holds `n` entries.
unsafe fn sge_list(
    list: *const ibv_sge,
    n: u16,
    buf: &mut [std::mem::MaybeUninit<Sge>; MAX_SGE],
) -> Result<&[Sge], c_int> {
    // SAFETY: forwarded from this function's contract.
    unsafe { crate::datapath::sges(list, c_int::from(n), buf) }
}

/// The entries of a C `mlx5dv_mr_interleaved` list of `n`.
///
/// # Safety
///
/// `data` holds `n` entries.
unsafe fn interleaved(data: *const mlx5dv_mr_interleaved, n: u16) -> Option<Vec<MrInterleaved>> {
    if data.is_null() && n > 0 {
        return None;
    }
    Some(
        (0..usize::from(n))
            .map(|i| {
                // SAFETY: the caller's list of `n` entries: entry `i` of it.
                let d = unsafe { data.wrapping_add(i).read() };
                MrInterleaved {
                    addr: d.addr,
                    bytes_count: d.bytes_count,
                    bytes_skip: d.bytes_skip,
                    lkey: d.lkey,
                }
            })
            .collect(),
    )
}

/// Records EINVAL for a step that named no live mkey or a bad list.
///
/// # Safety
///
/// As [`step`].
unsafe fn refuse(mqp: *mut mlx5dv_qp_ex, e: c_int) {
    if mqp.is_null() {
        return;
    }
    // SAFETY: forwarded from this function's contract.
    let q = unsafe { crate::dc::qp_of_dv(mqp) };
    let mut st = lock(&q.wr);
    st.take_carry();
    st.fail(e);
}

/// `mlx5dv_wr_mkey_configure`.
pub(crate) unsafe extern "C" fn wr_mkey_configure(
    mqp: *mut mlx5dv_qp_ex,
    k: *mut mlx5dv_mkey,
    num_setters: u8,
    attr: *mut mlx5dv_mkey_conf_attr,
) {
    let Some(key) = mkey_of(k) else {
        // SAFETY: the data path's contract.
        return unsafe { refuse(mqp, libc::EINVAL) };
    };
    let a = if attr.is_null() {
        MkeyConfAttr::default()
    } else {
        // SAFETY: the caller's attributes, non-NULL.
        let a = unsafe { attr.read() };
        MkeyConfAttr {
            conf_flags: a.conf_flags,
            comp_mask: a.comp_mask,
        }
    };
    // SAFETY: the data path's contract.
    unsafe {
        step(mqp, |b| {
            b.mkey_configure(key, num_setters, &a);
        })
    }
}

/// `mlx5dv_wr_set_mkey_access_flags`.
pub(crate) unsafe extern "C" fn wr_set_mkey_access_flags(mqp: *mut mlx5dv_qp_ex, flags: u32) {
    // SAFETY: the data path's contract.
    unsafe {
        step(mqp, |b| {
            b.set_mkey_access_flags(flags);
        })
    }
}

/// `mlx5dv_wr_set_mkey_layout_list`.
pub(crate) unsafe extern "C" fn wr_set_mkey_layout_list(
    mqp: *mut mlx5dv_qp_ex,
    n: u16,
    list: *const ibv_sge,
) {
    let mut buf = [const { std::mem::MaybeUninit::uninit() }; MAX_SGE];
    // SAFETY: the caller's list of `n` entries.
    match unsafe { sge_list(list, n, &mut buf) } {
        // SAFETY: the data path's contract.
        Ok(s) => unsafe {
            step(mqp, |b| {
                b.set_mkey_layout_list(s);
            })
        },
        // SAFETY: the data path's contract.
        Err(e) => unsafe { refuse(mqp, e) },
    }
}

/// `mlx5dv_wr_set_mkey_layout_interleaved`.
pub(crate) unsafe extern "C" fn wr_set_mkey_layout_interleaved(
    mqp: *mut mlx5dv_qp_ex,
    repeat_count: u32,
    n: u16,
    data: *const mlx5dv_mr_interleaved,
) {
    // SAFETY: the caller's list of `n` entries.
    match unsafe { interleaved(data, n) } {
        // SAFETY: the data path's contract.
        Some(d) => unsafe {
            step(mqp, |b| {
                b.set_mkey_layout_interleaved(repeat_count, &d);
            })
        },
        // SAFETY: the data path's contract.
        None => unsafe { refuse(mqp, libc::EINVAL) },
    }
}

/// `mlx5dv_wr_mr_list`: configure, access flags, KLM list.
pub(crate) unsafe extern "C" fn wr_mr_list(
    mqp: *mut mlx5dv_qp_ex,
    k: *mut mlx5dv_mkey,
    access: u32,
    n: u16,
    list: *mut ibv_sge,
) {
    let mut buf = [const { std::mem::MaybeUninit::uninit() }; MAX_SGE];
    // SAFETY: the caller's list of `n` entries.
    let s = unsafe { sge_list(list, n, &mut buf) };
    match (mkey_of(k), s) {
        // SAFETY: the data path's contract.
        (Some(key), Ok(s)) => unsafe {
            step(mqp, |b| {
                b.mr_list(key, access, s);
            })
        },
        // SAFETY: the data path's contract.
        (None, _) => unsafe { refuse(mqp, libc::EINVAL) },
        // SAFETY: the data path's contract.
        (_, Err(e)) => unsafe { refuse(mqp, e) },
    }
}

/// `mlx5dv_wr_mr_interleaved`: configure, access flags, repeat block.
pub(crate) unsafe extern "C" fn wr_mr_interleaved(
    mqp: *mut mlx5dv_qp_ex,
    k: *mut mlx5dv_mkey,
    access: u32,
    repeat_count: u32,
    n: u16,
    data: *mut mlx5dv_mr_interleaved,
) {
    // SAFETY: the caller's list of `n` entries.
    match (mkey_of(k), unsafe { interleaved(data, n) }) {
        // SAFETY: the data path's contract.
        (Some(key), Some(d)) => unsafe {
            step(mqp, |b| {
                b.mr_interleaved(key, access, repeat_count, &d);
            })
        },
        // SAFETY: the data path's contract.
        _ => unsafe { refuse(mqp, libc::EINVAL) },
    }
}
