//! DevX through the C library (`verbs::devx`, named as libmlx5's
//! `mlx5dv_devx_*`): raw PRM commands under the context's DevX user
//! context (CREATE_UCTX at the first call; every command carries its
//! uid), objects made by raw create commands (`mlx5dv_devx_obj_create`,
//! destroyed by the command the kernel would build from the create's
//! output), UMEMs over process memory, UAR pages whose doorbell register
//! the program writes itself, and the completion EQ numbers a raw
//! CREATE_CQ names.
//!
//! A command firmware fails returns its errno (as `mlx5_cmd_check` maps
//! the status) with the outbox holding the status and syndrome, so a
//! program reads them as it would from the kernel's copy.
//!
//! Over vfio-user a UMEM over private memory is made shared in place
//! first (`crate::remap`), as `ibv_reg_mr` does.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::{c_int, c_void};
use verbs::devx::{DevxCtx, DevxObj, DevxUar, DevxUmem};

use crate::abi::*;
use crate::device::{checked_ctx, Ctx, CtxShared};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno, set_errno};

/// `IBV_ACCESS_LOCAL_WRITE`, `REMOTE_WRITE`, `REMOTE_READ`: what a UMEM
/// may be registered with (`ib_umem_get`'s access).
const UMEM_ACCESS: u32 = 1 | 2 | 4;
/// The one page size this driver registers UMEMs with.
const UMEM_PAGE: u64 = 4096;
/// `MLX5DV_UAR_ALLOC_TYPE_BF`, `_NC`, `_NC_DEDICATED`.
const UAR_TYPES: [u32; 3] = [0, 1, 2];

/// A UMEM (`struct mlx5dv_devx_umem`, then ours).
#[repr(C)]
pub(crate) struct Umem {
    c: mlx5dv_devx_umem,
    umem: DevxUmem,
    shared: Arc<CtxShared>,
}

/// A UAR page (`struct mlx5dv_devx_uar`, then ours).
#[repr(C)]
pub(crate) struct Uar {
    c: mlx5dv_devx_uar,
    _uar: DevxUar,
    shared: Arc<CtxShared>,
}

/// An object made by a raw create command (`struct mlx5dv_devx_obj`,
/// opaque to the program).
pub(crate) struct Obj {
    obj: DevxObj,
    shared: Arc<CtxShared>,
}

/// Runs `f` on the context's DevX user context, made at the first call.
fn with_devx<R>(ctx: &Ctx, what: &str, f: impl FnOnce(&DevxCtx) -> R) -> Result<R, c_int> {
    let mut g = crate::objects::lock(&ctx.devx);
    if g.is_none() {
        match DevxCtx::open(&ctx.vc, 0) {
            Ok(d) => *g = Some(d),
            Err(e) => return Err(crate::errno_of(&format!("{what}: CREATE_UCTX"), &e)),
        }
    }
    match g.as_ref() {
        Some(d) => Ok(f(d)),
        None => Err(libc::EIO),
    }
}

/// `mlx5dv_open_device` with `MLX5DV_CONTEXT_FLAGS_DEVX`: the user
/// context now, and the context's PDs under its uid from here on.
pub(crate) fn open(c: *mut ibv_context) -> Result<(), c_int> {
    let Some(ctx) = checked_ctx(c) else {
        return Err(libc::EINVAL);
    };
    if !verbs::devx::supported(&ctx.vc) {
        return Err(libc::EOPNOTSUPP);
    }
    with_devx(ctx, "mlx5dv_open_device (DEVX)", |_| ())?;
    ctx.devx_open.store(true, Ordering::Release);
    Ok(())
}

/// `ibv_alloc_pd` of a context opened with DevX: a PD of its user
/// context.
pub(crate) fn alloc_pd(ctx: &Ctx) -> verbs::Result<verbs::pd::Pd> {
    match with_devx(ctx, "ibv_alloc_pd", |d| d.alloc_pd()) {
        Ok(r) => r,
        Err(_) => Err(verbs::Error::Invalid(
            "the context's DevX user context is gone",
        )),
    }
}

/// The caller's inbox of `len` bytes; `None` for NULL or shorter than a
/// command header.
fn inbox<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if p.is_null() || len < 8 {
        return None;
    }
    // SAFETY: the caller's inbox of `len` bytes, non-NULL.
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Copies a command's output into the caller's outbox of `len` bytes;
/// for a command firmware failed, its status and syndrome.
fn to_outbox(out: *mut c_void, len: usize, r: &verbs::Result<Vec<u8>>) {
    let bytes: Vec<u8> = match r {
        Ok(o) => o.clone(),
        Err(verbs::Error::Cmd {
            status, syndrome, ..
        }) => {
            let mut b = vec![0u8; 8];
            b[0] = status.to_raw();
            b[4..8].copy_from_slice(&syndrome.to_be_bytes());
            b
        }
        Err(_) => return,
    };
    let n = bytes.len().min(len);
    // SAFETY: the caller's outbox holds `len` >= n bytes, non-NULL.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), n) };
}

/// Runs a raw command (`f` on the checked inbox), the outbox filled; 0
/// or an errno (set too).
fn raw_cmd(
    what: &str,
    input: *const c_void,
    inlen: usize,
    out: *mut c_void,
    outlen: usize,
    f: impl FnOnce(&[u8]) -> Result<verbs::Result<Vec<u8>>, c_int>,
) -> c_int {
    let Some(inb) = inbox(input, inlen) else {
        return ret_errno(libc::EINVAL);
    };
    if out.is_null() || outlen < 8 {
        return ret_errno(libc::EINVAL);
    }
    match f(inb) {
        Err(e) => ret_errno(e),
        Ok(r) => {
            to_outbox(out, outlen, &r);
            match r {
                Ok(_) => 0,
                Err(e) => ret_errno(crate::errno_of(what, &e)),
            }
        }
    }
}

/// `mlx5dv_devx_general_cmd`: 0 and the outbox, or an errno.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_general_cmd(
    c: *mut ibv_context,
    input: *const c_void,
    inlen: usize,
    out: *mut c_void,
    outlen: usize,
) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    let what = "mlx5dv_devx_general_cmd";
    raw_cmd(what, input, inlen, out, outlen, |inb| {
        with_devx(ctx, what, |d| d.general_cmd(inb, outlen))
    })
}

/// `mlx5dv_devx_obj_create`: the object, or NULL with errno (the outbox
/// holding a failed command's status and syndrome).
#[no_mangle]
pub extern "C" fn mlx5dv_devx_obj_create(
    c: *mut ibv_context,
    input: *const c_void,
    inlen: usize,
    out: *mut c_void,
    outlen: usize,
) -> *mut c_void {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    let what = "mlx5dv_devx_obj_create";
    let mut made = None;
    let r = raw_cmd(what, input, inlen, out, outlen, |inb| {
        with_devx(ctx, what, |d| {
            d.obj_create(inb, outlen).map(|o| {
                let bytes = o.create_out().to_vec();
                made = Some(o);
                bytes
            })
        })
    });
    let Some(obj) = made.filter(|_| r == 0) else {
        return std::ptr::null_mut();
    };
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Obj {
        obj,
        shared: ctx.shared.clone(),
    }));
    registry::add(p, Kind::DevxObj);
    p.cast()
}

/// The live DevX object `p`, or `None` (errno EINVAL).
fn obj_of<'a>(p: *mut c_void) -> Option<&'a mut Obj> {
    if !registry::is(p, Kind::DevxObj) {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: the registry holds `p`: a live Obj box. libmlx5 lets one
    // thread use an object at a time.
    Some(unsafe { &mut *(p as *mut Obj) })
}

/// A raw command `f` runs on the DevX object `p` (modify, query).
fn obj_cmd(
    what: &str,
    p: *mut c_void,
    input: *const c_void,
    inlen: usize,
    out: *mut c_void,
    outlen: usize,
    f: fn(&DevxObj, &[u8], usize) -> verbs::Result<Vec<u8>>,
) -> c_int {
    let Some(o) = obj_of(p) else {
        return libc::EINVAL;
    };
    raw_cmd(what, input, inlen, out, outlen, |inb| {
        Ok(f(&o.obj, inb, outlen))
    })
}

/// `mlx5dv_devx_obj_modify`: a raw command on the object.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_obj_modify(
    p: *mut c_void,
    input: *const c_void,
    inlen: usize,
    out: *mut c_void,
    outlen: usize,
) -> c_int {
    let what = "mlx5dv_devx_obj_modify";
    obj_cmd(what, p, input, inlen, out, outlen, DevxObj::modify)
}

/// `mlx5dv_devx_obj_query`: a raw command on the object.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_obj_query(
    p: *mut c_void,
    input: *const c_void,
    inlen: usize,
    out: *mut c_void,
    outlen: usize,
) -> c_int {
    let what = "mlx5dv_devx_obj_query";
    obj_cmd(what, p, input, inlen, out, outlen, DevxObj::query)
}

/// `mlx5dv_devx_obj_destroy`: 0, or the errno of a refused destroy (the
/// object stays: something still uses it).
#[no_mangle]
pub extern "C" fn mlx5dv_devx_obj_destroy(p: *mut c_void) -> c_int {
    let Some(o) = obj_of(p) else {
        return libc::EINVAL;
    };
    if let Err(e) = o.obj.destroy_in_place() {
        return ret_errno(crate::errno_of("mlx5dv_devx_obj_destroy", &e));
    }
    registry::remove(p, Kind::DevxObj);
    // SAFETY: was live (removed just now); the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Obj) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    0
}

/// Registers `[addr, addr + size)` as a UMEM of `c`.
fn umem_reg(
    c: *mut ibv_context,
    addr: *mut c_void,
    size: usize,
    access: u32,
) -> *mut mlx5dv_devx_umem {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    if addr.is_null() || size == 0 || access & !UMEM_ACCESS != 0 {
        return null_errno(libc::EINVAL);
    }
    let write = access & 1 != 0;
    let what = "mlx5dv_devx_umem_reg";
    // SAFETY: mlx5dv_devx_umem_reg's contract: the memory stays mapped
    // while registered, and the device may access it concurrently.
    let reg = |d: &DevxCtx| unsafe { d.umem_reg_host(addr.cast(), size, write) };
    let mut r = match with_devx(ctx, what, reg) {
        Ok(r) => r,
        Err(e) => return null_errno(e),
    };
    if let Err(verbs::Error::Vfio(vfio::Error::NotShareable { why, .. })) = &r {
        tracing::info!("{what} {addr:p}+{size:#x}: {why}; remapping it shared");
        if let Err(e) = crate::remap::make_shared(addr as usize, size) {
            return null_errno(e);
        }
        r = match with_devx(ctx, what, reg) {
            Ok(r) => r,
            Err(e) => return null_errno(e),
        };
    }
    let umem = match r {
        Ok(u) => u,
        Err(e) => return null_errno(crate::errno_of(what, &e)),
    };
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Umem {
        c: mlx5dv_devx_umem {
            umem_id: umem.umem_id(),
        },
        umem,
        shared: ctx.shared.clone(),
    }));
    registry::add(p, Kind::DevxUmem);
    p.cast()
}

/// `mlx5dv_devx_umem_reg`: 4 KiB pages of process memory; `access`
/// `IBV_ACCESS_LOCAL_WRITE` lets the device write them.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_umem_reg(
    c: *mut ibv_context,
    addr: *mut c_void,
    size: usize,
    access: u32,
) -> *mut mlx5dv_devx_umem {
    umem_reg(c, addr, size, access)
}

/// `mlx5dv_devx_umem_reg_ex`: as `mlx5dv_devx_umem_reg`; the page sizes
/// allowed must include 4 KiB (the one this driver registers: EINVAL
/// otherwise, as the kernel finds no page size), and a dma-buf
/// (`MLX5DV_UMEM_MASK_DMABUF`) is `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_umem_reg_ex(
    c: *mut ibv_context,
    umem_in: *mut mlx5dv_devx_umem_in,
) -> *mut mlx5dv_devx_umem {
    if umem_in.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's struct, non-NULL.
    let u = unsafe { *umem_in };
    if u.comp_mask != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    if u.pgsz_bitmap & UMEM_PAGE == 0 {
        return null_errno(libc::EINVAL);
    }
    umem_reg(c, u.addr, u.size, u.access)
}

/// `mlx5dv_devx_umem_dereg`: 0, or the errno of a refused DESTROY_UMEM
/// (an object still uses it; the UMEM stays).
#[no_mangle]
pub extern "C" fn mlx5dv_devx_umem_dereg(p: *mut mlx5dv_devx_umem) -> c_int {
    if !registry::is(p, Kind::DevxUmem) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the registry holds `p`: a live Umem box, `c` its first field.
    let u = unsafe { &mut *(p as *mut Umem) };
    if let Err(e) = u.umem.dereg() {
        return ret_errno(crate::errno_of("mlx5dv_devx_umem_dereg", &e));
    }
    registry::remove(p, Kind::DevxUmem);
    // SAFETY: was live (removed just now); the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Umem) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    0
}

/// `mlx5dv_devx_alloc_uar`: a UAR page (ALLOC_UAR under the uid) mapped
/// in this process: `base_addr` the page, `reg_addr` its doorbell
/// register (`MLX5_BF_OFFSET`), `page_id` its index for `uar_page`.
/// `mmap_off` is 0: the page is already mapped (the whole BAR is). Any
/// of the three allocation types gets the same kind of page: the
/// mapping's memory type is the backend's.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_alloc_uar(c: *mut ibv_context, flags: u32) -> *mut mlx5dv_devx_uar {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    if !UAR_TYPES.contains(&flags) {
        return null_errno(libc::EOPNOTSUPP);
    }
    let what = "mlx5dv_devx_alloc_uar";
    let uar = match with_devx(ctx, what, |d| d.alloc_uar()) {
        Ok(Ok(u)) => u,
        Ok(Err(e)) => return null_errno(crate::errno_of(what, &e)),
        Err(e) => return null_errno(e),
    };
    let base = match uar.page_addr() {
        Ok(b) => b,
        Err(e) => return null_errno(crate::errno_of(what, &e)),
    };
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Uar {
        c: mlx5dv_devx_uar {
            reg_addr: base.wrapping_add(mlx5_hw::uar::BF_OFFSET).cast(),
            base_addr: base.cast(),
            page_id: uar.index(),
            mmap_off: 0,
            comp_mask: 0,
        },
        _uar: uar,
        shared: ctx.shared.clone(),
    }));
    registry::add(p, Kind::DevxUar);
    p.cast()
}

/// `mlx5dv_devx_free_uar` (DEALLOC_UAR); an unknown pointer is ignored.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_free_uar(p: *mut mlx5dv_devx_uar) {
    if !registry::remove(p, Kind::DevxUar) {
        return;
    }
    // SAFETY: was live (removed just now); the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Uar) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
}

/// `mlx5dv_devx_query_eqn`: the EQ number of completion vector `vector`.
#[no_mangle]
pub extern "C" fn mlx5dv_devx_query_eqn(c: *mut ibv_context, vector: u32, eqn: *mut u32) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if eqn.is_null() {
        return ret_errno(libc::EINVAL);
    }
    let what = "mlx5dv_devx_query_eqn";
    match with_devx(ctx, what, |d| d.query_eqn(vector)) {
        Ok(Ok(n)) => {
            // SAFETY: the caller's out word, non-NULL.
            unsafe { eqn.write(n) };
            0
        }
        Ok(Err(e)) => ret_errno(crate::errno_of(what, &e)),
        Err(e) => ret_errno(e),
    }
}

/// `mlx5dv_init_obj`: the PD's number (`MLX5DV_OBJ_PD`). The queues'
/// buffers, doorbell records and UAR registers are the driver's, which
/// keeps its own producer and consumer counts in them: handing them out
/// would let a program and the driver both write them, so `MLX5DV_OBJ_QP`,
/// `_CQ`, `_SRQ`, `_RWQ`, `_DM` and `_AH` are `EOPNOTSUPP` (and nothing
/// is written). Queues a program drives itself are made by raw commands
/// over its UMEMs.
#[no_mangle]
pub extern "C" fn mlx5dv_init_obj(obj: *mut mlx5dv_obj, types: u64) -> c_int {
    const PD: u64 = 1 << 6;
    if obj.is_null() {
        return ret_errno(libc::EINVAL);
    }
    if types & !PD != 0 {
        return ret_errno(libc::EOPNOTSUPP);
    }
    if types & PD != 0 {
        // SAFETY: the caller's struct, non-NULL.
        let pair = unsafe { (*obj).pd };
        let Some(pd) = crate::objects::pd_of(pair.in_.cast()) else {
            return libc::EINVAL;
        };
        if pair.out.is_null() {
            return ret_errno(libc::EINVAL);
        }
        let out = pair.out.cast::<mlx5dv_pd>();
        let v = mlx5dv_pd {
            pdn: pd.pd.pdn(),
            comp_mask: 0,
        };
        // SAFETY: the caller's `struct mlx5dv_pd`, non-NULL.
        unsafe { out.write(v) };
    }
    0
}
