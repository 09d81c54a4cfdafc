//! The extended CQ: `ibv_create_cq_ex` and `struct ibv_cq_ex`'s poll API.
//!
//! A program polls an extended CQ through the structure's function
//! pointers, as libmlx5 offers them: `ibv_start_poll` takes the CQ's lock
//! and the first completion (or answers `ENOENT` and gives the lock back),
//! `ibv_next_poll` takes the next (`ENOENT` when none is left), and
//! `ibv_end_poll` gives the lock back; between them `cq_ex.status` and
//! `cq_ex.wr_id` hold the current completion's, and the `ibv_wc_read_*`
//! functions read its other fields. Every CQ of this library is laid out
//! as an `ibv_cq_ex` (its `ibv_cq` first, as `ibv_cq_ex_to_cq` casts), so
//! these pointers are filled for all; `ibv_create_cq_ex` is what checks
//! the extended attributes.
//!
//! The completion being read is the CQ's `cur` (a [`Wc`], which is
//! `ibv_wc`, and its CQE's timestamp): each step polls one CQE into it
//! with the driver's `Cq::poll_stamped`. Completion timestamps are read
//! as the device clock's cycles (`ibv_wc_read_completion_ts`) or as wall
//! time (`ibv_wc_read_completion_wallclock_ns`, converted with the clock
//! info taken at `ibv_start_poll`, as libmlx5 converts on a device whose
//! clock is free-running); their read functions are set only on CQs that
//! asked for them, as libmlx5 sets them. Fields the driver does not
//! report (CVLAN, flow tag, tag matching) are refused at creation
//! (`EOPNOTSUPP`), as libmlx5 refuses the flags a device lacks.

use libc::{c_int, c_uint};
use verbs::cq::Wc;

use crate::abi::*;
use crate::device::checked_ctx;
use crate::null_errno;
use crate::objects::{make_cq, Cq};

/// `IBV_WC_STANDARD_FLAGS`: the fields of `ibv_wc` (byte_len, imm, qp_num,
/// src_qp, slid, sl, dlid_path_bits), which the driver reports.
const WC_STANDARD_FLAGS: u64 = 0x7f;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: the CQE's device-clock stamp.
const WC_COMPLETION_TIMESTAMP: u64 = 1 << 7;
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`: that stamp as wall
/// time.
const WC_COMPLETION_TIMESTAMP_WALLCLOCK: u64 = 1 << 11;
/// The `wc_flags` this library reports.
const WC_OFFERED: u64 =
    WC_STANDARD_FLAGS | WC_COMPLETION_TIMESTAMP | WC_COMPLETION_TIMESTAMP_WALLCLOCK;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`, `IBV_CQ_INIT_ATTR_MASK_PD`.
const MASK_FLAGS: u32 = 1 << 0;
const MASK_PD: u32 = 1 << 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`, `IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN`.
const ATTR_SINGLE_THREADED: u32 = 1 << 0;
const ATTR_IGNORE_OVERRUN: u32 = 1 << 1;

/// `cq` with the extended poll API filled in.
pub(crate) fn cq_ex(cq: ibv_cq) -> ibv_cq_ex {
    ibv_cq_ex {
        context: cq.context,
        channel: cq.channel,
        cq_context: cq.cq_context,
        handle: cq.handle,
        cqe: cq.cqe,
        mutex: cq.mutex,
        cond: cq.cond,
        comp_events_completed: cq.comp_events_completed,
        async_events_completed: cq.async_events_completed,
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        start_poll: Some(start_poll),
        next_poll: Some(next_poll),
        end_poll: Some(end_poll),
        read_opcode: Some(read_opcode),
        read_vendor_err: Some(read_vendor_err),
        read_byte_len: Some(read_byte_len),
        read_imm_data: Some(read_imm_data),
        read_qp_num: Some(read_qp_num),
        read_src_qp: Some(read_src_qp),
        read_wc_flags: Some(read_wc_flags),
        read_slid: Some(read_slid),
        read_sl: Some(read_sl),
        read_dlid_path_bits: Some(read_dlid_path_bits),
        read_completion_ts: None,
        read_cvlan: None,
        read_flow_tag: None,
        read_tm_info: None,
        read_completion_wallclock_ns: None,
    }
}

/// `verbs_context.create_cq_ex` (`ibv_create_cq_ex`).
pub(crate) unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    a: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: forwarded: the caller's attributes.
    unsafe { create_cq_dv(c, a, None) }
}

/// `enum mlx5dv_cq_init_attr_mask`.
const DV_MASK_COMPRESSED_CQE: u64 = 1 << 0;
const DV_MASK_FLAGS: u64 = 1 << 1;
const DV_MASK_CQE_SIZE: u64 = 1 << 2;
/// `MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD`, and the first reserved flag.
const DV_FLAGS_CQE_PAD: u32 = 1 << 0;
const DV_FLAGS_RESERVED: u32 = 1 << 1;

/// `mlx5dv_create_cq`: `ibv_create_cq_ex` with the mlx5 attributes, as
/// libmlx5's `create_cq` checks them: the CQE size (64 or 128, else
/// EINVAL; `MLX5_CQE_SIZE` when not given); CQE compression and 128-byte
/// CQE padding, which the driver does not do (`mlx5dv_query_device`
/// reports neither), EINVAL as libmlx5 answers a device without them.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_cq(
    c: *mut ibv_context,
    a: *mut ibv_cq_init_attr_ex,
    dv: *mut mlx5dv_cq_init_attr,
) -> *mut ibv_cq_ex {
    // SAFETY: the caller's mlx5 attributes, when given.
    let d = (!dv.is_null()).then(|| unsafe { dv.read() });
    // SAFETY: forwarded: the caller's attributes.
    unsafe { create_cq_dv(c, a, d) }
}

/// `ibv_create_cq_ex` and `mlx5dv_create_cq` (`dv`: its attributes).
///
/// # Safety
///
/// `a` is NULL or the caller's attributes.
unsafe fn create_cq_dv(
    c: *mut ibv_context,
    a: *mut ibv_cq_init_attr_ex,
    dv: Option<mlx5dv_cq_init_attr>,
) -> *mut ibv_cq_ex {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    if a.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { *a };
    let mut asked_size = None;
    if let Some(d) = dv {
        if d.comp_mask & !(DV_MASK_COMPRESSED_CQE | DV_MASK_FLAGS | DV_MASK_CQE_SIZE) != 0 {
            return null_errno(libc::EINVAL);
        }
        if d.comp_mask & DV_MASK_COMPRESSED_CQE != 0 {
            tracing::debug!("mlx5dv_create_cq: CQE compression not offered");
            return null_errno(libc::EINVAL);
        }
        if d.comp_mask & DV_MASK_FLAGS != 0
            && (d.flags & !(DV_FLAGS_RESERVED - 1) != 0 || d.flags & DV_FLAGS_CQE_PAD != 0)
        {
            tracing::debug!(
                "mlx5dv_create_cq: flags {:#x} (128-byte CQE padding not offered)",
                d.flags
            );
            return null_errno(libc::EINVAL);
        }
        if d.comp_mask & DV_MASK_CQE_SIZE != 0 {
            asked_size = Some(d.cqe_size);
        }
    }
    let cqe_bytes = match crate::objects::cqe_size_of(asked_size) {
        Ok(b) => b,
        Err(e) => return null_errno(e),
    };
    if a.comp_mask & !(MASK_FLAGS | MASK_PD) != 0 {
        return null_errno(libc::EINVAL);
    }
    let flags = if a.comp_mask & MASK_FLAGS != 0 {
        a.flags
    } else {
        0
    };
    if flags & !(ATTR_SINGLE_THREADED | ATTR_IGNORE_OVERRUN) != 0 {
        return null_errno(libc::EINVAL);
    }
    // Fields the driver does not report, parent domains, and CQs whose
    // overrun the device would ignore are not offered.
    if a.wc_flags & !WC_OFFERED != 0
        || a.comp_mask & MASK_PD != 0
        || flags & ATTR_IGNORE_OVERRUN != 0
    {
        return null_errno(libc::EOPNOTSUPP);
    }
    // Timestamps need a device clock (a frequency to convert with), as
    // libmlx5's wall-clock reads need the clock-info page.
    let stamped = WC_COMPLETION_TIMESTAMP | WC_COMPLETION_TIMESTAMP_WALLCLOCK;
    let wallclock = if a.wc_flags & stamped != 0 {
        match ctx.vc.clock_info() {
            Ok(i) => (a.wc_flags & WC_COMPLETION_TIMESTAMP_WALLCLOCK != 0).then_some(i),
            Err(e) => return null_errno(crate::errno_of("ibv_create_cq_ex", &e)),
        }
    } else {
        None
    };
    let p = make_cq(
        ctx,
        c,
        a.cqe,
        a.cq_context,
        a.channel,
        a.comp_vector as usize,
        flags & ATTR_SINGLE_THREADED != 0,
        cqe_bytes,
    );
    if !p.is_null() {
        // SAFETY: the CQ just made, not yet handed to the caller.
        let cq = unsafe { &mut *(p as *mut Cq) };
        if a.wc_flags & WC_COMPLETION_TIMESTAMP != 0 {
            cq.c.read_completion_ts = Some(read_completion_ts);
        }
        if wallclock.is_some() {
            cq.wallclock = wallclock;
            cq.c.read_completion_wallclock_ns = Some(read_completion_wallclock_ns);
        }
    }
    p
}

/// The CQ of an `ibv_cq_ex` this library made.
///
/// # Safety
///
/// `cq` is a live CQ of this library (the data path's contract: NULL is
/// checked by the callers, a destroyed one is the caller's use-after-free).
unsafe fn cq_of<'a>(cq: *mut ibv_cq_ex) -> &'a crate::spin::SpinLock<verbs::cq::Cq> {
    // SAFETY: `cq` is the `c` field, first, of a live `Cq`; only the lock
    // field is borrowed, so the `ibv_cq_ex` fields stay writable.
    unsafe { &(*(cq as *mut Cq)).cq }
}

/// Polls one completion into the CQ's `cur` and publishes its status and
/// wr_id: 0, `ENOENT` if none, or the errno of a failed device.
///
/// # Safety
///
/// `cq` is live and this thread holds its lock (a leaked guard).
unsafe fn take_one(cq: *mut ibv_cq_ex) -> c_int {
    let p = cq as *mut Cq;
    // SAFETY: a live CQ (the caller's contract).
    let lock = unsafe { cq_of(cq) };
    // SAFETY: the lock is held (the caller's contract), and no other
    // reference to the driver's CQ is live.
    let v = unsafe { lock.locked_mut() };
    // SAFETY: `cur` is written only under the lock, through this place.
    let cur = unsafe { &mut (*p).cur };
    let r = v.poll_stamped(std::slice::from_mut(cur));
    // SAFETY: live, and the lock is held (the caller's contract).
    unsafe { Cq::polled(p, v, *r.as_ref().unwrap_or(&0)) };
    match r {
        Ok(0) => libc::ENOENT,
        Ok(_) => {
            let (status, wr_id) = (cur.wc.status as c_int, cur.wc.wr_id);
            // SAFETY: the caller's live `ibv_cq_ex` (the `Cq`'s first
            // field, apart from the lock borrowed above).
            let ex = unsafe { &mut *cq };
            (ex.status, ex.wr_id) = (status, wr_id);
            0
        }
        Err(e) => crate::errno_of("ibv_start_poll", &e),
    }
}

/// `ibv_start_poll`: the CQ's lock and its first completion; `ENOENT`
/// (lock given back) if there is none.
unsafe extern "C" fn start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's attributes when not NULL.
    if !attr.is_null() && unsafe { (*attr).comp_mask } != 0 {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ (the data path's contract).
    let lock = unsafe { cq_of(cq) };
    let biased = lock.lock().leak();
    // SAFETY: written under the lock just taken.
    unsafe { (*(cq as *mut Cq)).cur_biased = biased };
    // SAFETY: as above.
    if unsafe { (*(cq as *mut Cq)).wallclock.is_some() } {
        // A fresh conversion for this poll's stamps (libmlx5 retakes its
        // `last_clock_info` here too).
        // SAFETY: a live CQ (the data path's contract).
        let c = unsafe { (*cq).context };
        // SAFETY: the CQ's context outlives it.
        let ctx = unsafe { crate::device::ctx_of(c) };
        match ctx.vc.clock_info() {
            // SAFETY: as above.
            Ok(i) => unsafe { (*(cq as *mut Cq)).wallclock = Some(i) },
            Err(e) => {
                // SAFETY: held through the guard leaked above, not used after.
                unsafe { lock.unlock_leaked(biased) };
                return crate::errno_of("ibv_start_poll", &e);
            }
        }
    }
    // SAFETY: live, and the lock is held.
    let r = unsafe { take_one(cq) };
    if r != 0 {
        // SAFETY: held through the guard leaked above, not used after.
        unsafe { lock.unlock_leaked(biased) };
    }
    r
}

/// `ibv_next_poll`: the next completion, `ENOENT` if none is left.
unsafe extern "C" fn next_poll(cq: *mut ibv_cq_ex) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: between a successful start_poll and end_poll (the API's
    // contract): the lock is held.
    unsafe { take_one(cq) }
}

/// `ibv_end_poll`: gives the CQ's lock back.
unsafe extern "C" fn end_poll(cq: *mut ibv_cq_ex) {
    if cq.is_null() {
        return;
    }
    // SAFETY: after a successful start_poll (the API's contract): the lock
    // is held, and the mode of the guard it leaked is recorded here.
    let biased = unsafe { (*(cq as *mut Cq)).cur_biased };
    // SAFETY: a live CQ.
    let lock = unsafe { cq_of(cq) };
    // SAFETY: held through that leaked guard, not used after.
    unsafe { lock.unlock_leaked(biased) };
}

/// The current completion.
///
/// # Safety
///
/// `cq` is live, polled by this thread between start and end.
unsafe fn cur<'a>(cq: *mut ibv_cq_ex) -> &'a Wc {
    // SAFETY: the caller's contract; `cur` is not written while read here.
    unsafe { &(*(cq as *const Cq)).cur.wc }
}

/// `ibv_wc_read_completion_ts`: the CQE's device-clock stamp (cycles of
/// `hca_core_clock` kHz).
unsafe extern "C" fn read_completion_ts(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: the read_* contract: between start and end poll.
    unsafe { (*(cq as *const Cq)).cur.timestamp }
}

/// `ibv_wc_read_completion_wallclock_ns`: the stamp as wall time
/// (`mlx5dv_ts_to_ns` with the clock info of this poll).
unsafe extern "C" fn read_completion_wallclock_ns(cq: *mut ibv_cq_ex) -> u64 {
    // SAFETY: the read_* contract: between start and end poll.
    let p = unsafe { &*(cq as *const Cq) };
    p.wallclock.map_or(0, |i| i.to_ns(p.cur.timestamp))
}

macro_rules! read_fields {
    ($($(#[$doc:meta])* $name:ident -> $ty:ty = |$w:ident| $e:expr;)*) => {$(
        $(#[$doc])*
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $ty {
            // SAFETY: the read_* contract: between start and end poll.
            let $w = unsafe { cur(cq) };
            $e
        }
    )*};
}

read_fields! {
    /// `ibv_wc_read_opcode`.
    read_opcode -> c_int = |w| w.opcode as c_int;
    /// `ibv_wc_read_vendor_err`.
    read_vendor_err -> u32 = |w| w.vendor_err;
    /// `ibv_wc_read_byte_len`.
    read_byte_len -> u32 = |w| w.byte_len;
    /// `ibv_wc_read_imm_data` (network order, or the invalidated rkey).
    read_imm_data -> u32 = |w| w.imm_data;
    /// `ibv_wc_read_qp_num`.
    read_qp_num -> u32 = |w| w.qp_num;
    /// `ibv_wc_read_src_qp`.
    read_src_qp -> u32 = |w| w.src_qp;
    /// `ibv_wc_read_wc_flags`.
    read_wc_flags -> c_uint = |w| w.wc_flags;
    /// `ibv_wc_read_slid`.
    read_slid -> u32 = |w| u32::from(w.slid);
    /// `ibv_wc_read_sl`.
    read_sl -> u8 = |w| w.sl;
    /// `ibv_wc_read_dlid_path_bits`.
    read_dlid_path_bits -> u8 = |w| w.dlid_path_bits;
}
