//! On-demand paging through the C library: `ibv_reg_mr` with
//! `IBV_ACCESS_ON_DEMAND` (an explicit region, or the implicit one of
//! `ibv_reg_mr(pd, NULL, SIZE_MAX, ...)`), `ibv_advise_mr`, and the caps
//! `ibv_query_device_ex` reports (`verbs::odp`, which does the work).
//!
//! The kernel learns that memory under an ODP region went away through
//! its MMU notifier; user space has no such hook. Each explicit region
//! here is watched with a `userfaultfd` (`verbs::uffd`): `munmap`,
//! `madvise(MADV_DONTNEED)` and `mremap` of its memory invalidate it, so
//! the device faults again and maps what is there then. Where the watch
//! cannot be had (userfaultfd refused to the process) the region works
//! without it, as the Rust API's does, and a warning says so. The implicit
//! region spans the whole address space and is not watched.
//!
//! Over vfio-user the server reaches memory only through a file: a
//! private range is made shared in place at registration
//! (`crate::remap`), as `ibv_reg_mr` does, so that faults can map it.

use libc::{c_int, c_void};
use verbs::mr::access;
use verbs::odp::{AdviseSge, OdpMr};
use verbs::uffd::UnmapWatch;

use crate::abi::*;
use crate::device::ctx_of;
use crate::objects::{pd_of, Pd};
use crate::set_errno;

/// An ODP region and the watch on its memory.
pub(crate) struct OdpKey {
    // Declared first: dropped (its thread stopped) before the region.
    _watch: Option<UnmapWatch>,
    pub mr: OdpMr,
}

/// Registers `[addr, addr + len)` of `pd` on demand (`access` has
/// `IBV_ACCESS_ON_DEMAND`): the implicit region for `addr` NULL and `len`
/// `SIZE_MAX`, else an explicit one; an errno if it cannot.
pub(crate) fn register(pd: &Pd, addr: *mut c_void, len: usize, acc: u32) -> Result<OdpKey, c_int> {
    let errno = |e: verbs::Error| crate::errno_of("ibv_reg_mr (ON_DEMAND)", &e);
    if addr.is_null() && len == usize::MAX {
        // SAFETY: ibv_reg_mr's contract for an ODP region: the device
        // reaches only memory the process maps when it faults, and the
        // program does not unmap memory the device is using.
        let mr = unsafe { pd.pd.reg_mr_implicit(acc) }.map_err(errno)?;
        return Ok(OdpKey { _watch: None, mr });
    }
    if addr.is_null() || len == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the PD's context is live while the PD is.
    let ctx = unsafe { ctx_of(pd.c.context) };
    let (start, span) = page_span(addr, len);
    if ctx.is_vfio_user() && vfio::host_memory::shared_file_of(start, span).is_err() {
        tracing::info!("ibv_reg_mr (ON_DEMAND) {addr:p}+{len:#x}: private; remapping it shared");
        crate::remap::make_shared(addr as usize, len)?;
    }
    // SAFETY: as above, for this range.
    let mr = unsafe { pd.pd.reg_mr_odp(addr.cast(), len, acc) }.map_err(errno)?;
    let watch = match mr.watch_unmaps(addr as u64, len as u64) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "ibv_reg_mr (ON_DEMAND) {addr:p}+{len:#x}: no userfaultfd watch ({e}): \
                 unmapping its memory will not invalidate it"
            );
            None
        }
    };
    Ok(OdpKey { _watch: watch, mr })
}

/// The whole 4 KiB pages under `[addr, addr + len)`: start and length.
fn page_span(addr: *mut c_void, len: usize) -> (u64, u64) {
    let start = addr as u64 & !0xfff;
    let end = (addr as u64)
        .saturating_add(len as u64)
        .next_multiple_of(0x1000);
    (start, end - start)
}

/// `verbs_context.advise_mr` (`ibv_advise_mr`): 0 or a positive errno,
/// as `mlx5_ib_advise_mr` answers (`verbs::pd::Pd::advise_mr`): ENOENT
/// for an lkey that is no ODP region, EPERM for another PD's or a
/// read-only one asked PREFETCH_WRITE, EOPNOTSUPP for an unknown advice
/// or flag, EFAULT for a range outside its region with
/// `IBV_ADVISE_MR_FLAG_FLUSH`.
pub(crate) unsafe extern "C" fn advise_mr(
    p: *mut ibv_pd,
    advice: c_int,
    flags: u32,
    sg: *mut ibv_sge,
    n: u32,
) -> c_int {
    let Some(pd) = pd_of(p) else {
        return libc::EINVAL;
    };
    if sg.is_null() || n == 0 || advice < 0 {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    // SAFETY: the caller's list of `n` SGEs, non-NULL.
    let list = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    let sges: Vec<AdviseSge> = list
        .iter()
        .map(|s| AdviseSge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        })
        .collect();
    match pd.pd.advise_mr(advice as u32, flags, &sges) {
        Ok(()) => 0,
        Err(e) => {
            let r = crate::errno_of("ibv_advise_mr", &e);
            set_errno(r);
            r
        }
    }
}

/// Whether `access` asks for an ODP region.
pub(crate) fn on_demand(access: u32) -> bool {
    access & access::ON_DEMAND != 0
}
