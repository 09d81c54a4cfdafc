//! The device clock through C: `ibv_query_rt_values_ex` (the raw clock),
//! `mlx5dv_get_clock_info` (its conversion to wall time, which the
//! header's inline `mlx5dv_ts_to_ns` applies), and the clock fields of
//! `ibv_query_device_ex` and `mlx5dv_query_device`. The conversion is the
//! driver's ([`verbs::clock`]), as libmlx5's is the clock-info page that
//! mlx5_core keeps.

use libc::c_int;

use crate::abi::*;
use crate::device::{checked_ctx, Ctx};
use crate::ret_errno;

/// `IBV_VALUES_MASK_RAW_CLOCK`.
const VALUES_MASK_RAW_CLOCK: u32 = 1 << 0;

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex`), as
/// libmlx5's `mlx5_query_rt_values`: the raw clock in device cycles, in
/// `raw_clock.tv_nsec` (`tv_sec` 0); `comp_mask` out says what was
/// written. EINVAL for a bit it does not know.
pub(crate) unsafe extern "C" fn query_rt_values(
    c: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if values.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's struct, non-NULL.
    let v = unsafe { &mut *values };
    if v.comp_mask & !VALUES_MASK_RAW_CLOCK != 0 {
        return libc::EINVAL;
    }
    let mut got = 0;
    let mut err = 0;
    if v.comp_mask & VALUES_MASK_RAW_CLOCK != 0 {
        match ctx.vc.read_clock() {
            Ok(cycles) => {
                v.raw_clock.tv_sec = 0;
                v.raw_clock.tv_nsec = cycles as libc::c_long;
                got |= VALUES_MASK_RAW_CLOCK;
            }
            Err(e) => err = crate::errno_of("ibv_query_rt_values_ex", &e),
        }
    }
    v.comp_mask = got;
    err
}

/// The device clock's conversion as `struct mlx5dv_clock_info`, or the
/// errno libmlx5 gives without a clock-info page (EINVAL).
pub(crate) fn clock_info(ctx: &Ctx) -> Result<mlx5dv_clock_info, c_int> {
    let i = ctx.vc.clock_info().map_err(|e| {
        crate::errno_of("mlx5dv_get_clock_info", &e);
        libc::EINVAL
    })?;
    Ok(mlx5dv_clock_info {
        nsec: i.nsec,
        last_cycles: i.last_cycles,
        frac: i.frac,
        mult: i.mult,
        shift: i.shift,
        mask: i.mask,
    })
}

/// `mlx5dv_get_clock_info`: the wall time at a recent reading of the
/// device clock and the rate between them (a snapshot at most
/// `verbs::clock::CLOCK_INFO_REFRESH` old).
#[no_mangle]
pub extern "C" fn mlx5dv_get_clock_info(c: *mut ibv_context, out: *mut mlx5dv_clock_info) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if out.is_null() {
        return ret_errno(libc::EINVAL);
    }
    match clock_info(ctx) {
        Ok(i) => {
            // SAFETY: the caller's struct, non-NULL.
            unsafe { out.write(i) };
            0
        }
        Err(e) => ret_errno(e),
    }
}

/// `ibv_device_attr_ex.completion_timestamp_mask` and `hca_core_clock`
/// (kHz), as mlx5_ib reports them; both 0 on a device that reports no
/// clock frequency.
pub(crate) fn device_attr_clock(ctx: &Ctx, ex: &mut ibv_device_attr_ex) {
    let khz = ctx.vc.device_frequency_khz();
    if khz != 0 {
        ex.completion_timestamp_mask = verbs::clock::COMPLETION_TIMESTAMP_MASK;
        ex.hca_core_clock = u64::from(khz);
    }
}
