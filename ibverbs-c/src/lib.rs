//! `libibverbs.so.1` for programs built against rdma-core's headers,
//! backed by this workspace's driver (`verbs`): an unmodified binary run
//! with `LD_LIBRARY_PATH` at this library's directory uses a VFIO-owned,
//! vfio-user or built-in device-model function with no kernel RDMA stack.
//!
//! - [`abi`]: the structures of `infiniband/verbs.h`, laid out as C lays
//!   them out (checked against the installed header by a test).
//! - `device`: the device list from `MLX5_DEVICES`, open/close, the
//!   queries, GIDs.
//! - `async_event`: one dispatcher per device hands its async events to
//!   the contexts they concern; `ibv_get_async_event`.
//! - `objects`: PDs, MRs, completion channels, CQs, SRQs, AHs.
//! - `cq_ex`: `ibv_create_cq_ex` and the extended poll (`ibv_start_poll`,
//!   `ibv_next_poll`, `ibv_end_poll`, `ibv_wc_read_*`).
//! - `qp`: QPs: create, modify, query, destroy.
//! - `datapath`: post/poll/arm, the functions the header's inline
//!   `ibv_post_send`, `ibv_poll_cq`, ... call through `ibv_context.ops`.
//! - `misc`: the string and rate helpers, and the verbs this driver does
//!   not offer (they answer `EOPNOTSUPP`/`NULL`, as libibverbs does for a
//!   provider without them).
//! - `dv`: the `mlx5dv_*` and `efadv_*` entry points perftest links.
//!
//! Symbol versions come from `libibverbs.map` (see `build.rs`). The
//! library also answers for `libmlx5.so.1` and `libefa.so.1` (symlinks to
//! it: one object, so the loader maps it once), since perftest links them
//! and the distribution's providers need libibverbs' private ABI.
//!
//! Bad use gets verbs' answers, never a crash: a NULL or unknown object
//! pointer on a control-path call is `EINVAL` (every object handed out is
//! in a registry until destroyed), a destroy of an object others use is
//! `EBUSY`, a post to a QP in the wrong state is `EINVAL` with `bad_wr`
//! set. The data path (post, poll, arm) checks for NULL only: a pointer to
//! a destroyed QP or CQ there is the caller's use-after-free, as in C.

#[cfg(not(test))]
core::arch::global_asm!(include_str!(concat!(env!("OUT_DIR"), "/symver.s")));

pub mod abi;
mod async_event;
mod clock;
mod cq_ex;
mod datapath;
mod dc;
mod device;
mod devx;
mod dm;
mod dv;
mod misc;
mod mkey;
mod mw;
mod objects;
mod odp;
mod qp;
mod qp_ex;
mod raw;
mod registry;
mod remap;
mod rss;
mod spin;
#[cfg(test)]
mod thread_tests;

pub use device::DEVICES_ENV;

/// Sets `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: __errno_location has no preconditions.
    let slot = unsafe { libc::__errno_location() };
    // SAFETY: it points to this thread's errno.
    unsafe { *slot = e };
}

/// NULL with `errno` = `e`.
pub(crate) fn null_errno<T>(e: i32) -> *mut T {
    set_errno(e);
    std::ptr::null_mut()
}

/// The negative-free verbs convention for int returns: `e` (and errno).
pub(crate) fn ret_errno(e: i32) -> i32 {
    set_errno(e);
    e
}

/// Logs a driver error and gives its errno.
pub(crate) fn errno_of(what: &str, e: &verbs::Error) -> i32 {
    tracing::debug!("{what}: {e}");
    e.errno()
}
