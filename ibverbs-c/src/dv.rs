//! The `mlx5dv_*` (libmlx5.so.1, MLX5_1.x) and `efadv_*` (libefa.so.1,
//! EFA_1.1) entry points perftest links. This library is installed under
//! those names too (symlinks to one object), so a perftest binary finds
//! them here and never loads the distribution's providers, which need
//! libibverbs' private provider ABI.
//!
//! What the driver has is done: `mlx5dv_open_device` opens the device,
//! `mlx5dv_devx_general_cmd` runs the command on the device's command
//! queue under a DevX user context (CREATE_UCTX, made at the first call).
//! What it lacks answers `EOPNOTSUPP` (crypto, DEKs, mlx5dv QPs and mkeys,
//! `mlx5dv_qp_ex`), and the EFA calls say this is not an EFA device, as
//! libefa does for a foreign context.

use libc::{c_int, c_void};

use crate::abi::*;
use crate::device::checked_ctx;
use crate::{null_errno, ret_errno};

/// `mlx5dv_open_device`: `ibv_open_device` (the attributes' flags, DEVX
/// among them, need nothing more: DevX contexts are made on demand).
#[no_mangle]
pub extern "C" fn mlx5dv_open_device(dev: *mut ibv_device, _attr: *mut c_void) -> *mut ibv_context {
    crate::device::ibv_open_device(dev)
}

/// `mlx5dv_devx_general_cmd`: 0 and the outbox, or an errno (the outbox
/// then holds the command's status and syndrome when it ran).
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
    if input.is_null() || out.is_null() || inlen < 8 || outlen < 8 {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's inbox of `inlen` bytes.
    let inb = unsafe { std::slice::from_raw_parts(input.cast::<u8>(), inlen) };
    let mut g = crate::objects::lock(&ctx.devx);
    if g.is_none() {
        match verbs::devx::DevxCtx::open(&ctx.vc, 0) {
            Ok(d) => *g = Some(d),
            Err(e) => {
                return ret_errno(crate::errno_of("mlx5dv_devx_general_cmd: CREATE_UCTX", &e))
            }
        }
    }
    let Some(d) = g.as_ref() else {
        return ret_errno(libc::EIO);
    };
    match d.general_cmd(inb, outlen) {
        Ok(o) => {
            let n = o.len().min(outlen);
            // SAFETY: the caller's outbox holds `outlen` >= n bytes.
            unsafe { std::ptr::copy_nonoverlapping(o.as_ptr(), out.cast::<u8>(), n) };
            0
        }
        Err(e) => ret_errno(crate::errno_of("mlx5dv_devx_general_cmd", &e)),
    }
}

/// `mlx5dv_create_qp`: mlx5dv QP attributes (DC, ...) are not offered.
#[no_mangle]
pub extern "C" fn mlx5dv_create_qp(
    _c: *mut ibv_context,
    _a: *mut c_void,
    _dv: *mut c_void,
) -> *mut ibv_qp {
    null_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_qp_ex_from_ibv_qp_ex`: no extended QPs are made.
#[no_mangle]
pub extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut c_void) -> *mut c_void {
    null_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_create_mkey`: indirect mkeys are not offered.
#[no_mangle]
pub extern "C" fn mlx5dv_create_mkey(_attr: *mut c_void) -> *mut c_void {
    null_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_destroy_mkey`: none exist.
#[no_mangle]
pub extern "C" fn mlx5dv_destroy_mkey(_mkey: *mut c_void) -> c_int {
    ret_errno(libc::EINVAL)
}

/// `mlx5dv_crypto_login`: no crypto engine.
#[no_mangle]
pub extern "C" fn mlx5dv_crypto_login(_c: *mut ibv_context, _a: *mut c_void) -> c_int {
    ret_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_dek_create`: no crypto engine.
#[no_mangle]
pub extern "C" fn mlx5dv_dek_create(_c: *mut ibv_context, _a: *mut c_void) -> *mut c_void {
    null_errno(libc::EOPNOTSUPP)
}

/// `mlx5dv_dek_destroy`: none exist.
#[no_mangle]
pub extern "C" fn mlx5dv_dek_destroy(_dek: *mut c_void) -> c_int {
    ret_errno(libc::EINVAL)
}

/// `efadv_query_device`: not an EFA device.
#[no_mangle]
pub extern "C" fn efadv_query_device(_c: *mut ibv_context, _a: *mut c_void, _len: u32) -> c_int {
    ret_errno(libc::EOPNOTSUPP)
}

/// `efadv_create_qp_ex`: not an EFA device.
#[no_mangle]
pub extern "C" fn efadv_create_qp_ex(
    _c: *mut ibv_context,
    _a: *mut c_void,
    _e: *mut c_void,
    _len: u32,
) -> *mut ibv_qp {
    null_errno(libc::EOPNOTSUPP)
}
