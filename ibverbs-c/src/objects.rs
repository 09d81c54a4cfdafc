//! PDs, MRs, completion channels, CQs, SRQs and AHs: each a box whose
//! first field is the C structure the caller sees, then the driver's
//! object. Users of an object are counted, so destroying one that a QP,
//! MR or CQ still uses is `EBUSY`, as in verbs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libc::{c_int, c_void};

use crate::abi::*;
use crate::device::{checked_ctx, CtxShared};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno, set_errno};

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Takes one user off a counter.
pub(crate) fn unuse(n: &AtomicUsize) {
    n.fetch_sub(1, Ordering::AcqRel);
}

/// A protection domain.
#[repr(C)]
pub(crate) struct Pd {
    pub c: ibv_pd,
    pub pd: verbs::pd::Pd,
    pub shared: Arc<CtxShared>,
    /// MRs, QPs, SRQs and AHs on it.
    pub users: AtomicUsize,
}

/// The `Pd` of a live `ibv_pd`, or `None` (errno EINVAL).
pub(crate) fn pd_of<'a>(p: *mut ibv_pd) -> Option<&'a Pd> {
    if !registry::is(p, Kind::Pd) {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: the registry holds `p`: a live Pd box, `c` its first field.
    Some(unsafe { &*(p as *const Pd) })
}

/// `ibv_alloc_pd`.
#[no_mangle]
pub extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    let pd = if ctx.devx_open.load(Ordering::Acquire) {
        crate::devx::alloc_pd(ctx)
    } else {
        ctx.vc.alloc_pd()
    };
    let pd = match pd {
        Ok(p) => p,
        Err(e) => return null_errno(crate::errno_of("ibv_alloc_pd", &e)),
    };
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Pd {
        c: ibv_pd {
            context: c,
            handle: pd.pdn(),
        },
        pd,
        shared: ctx.shared.clone(),
        users: AtomicUsize::new(0),
    }));
    registry::add(p, Kind::Pd);
    p.cast()
}

/// `ibv_dealloc_pd`: `EBUSY` while objects use it.
#[no_mangle]
pub extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    let Some(pd) = pd_of(p) else {
        return libc::EINVAL;
    };
    if pd.users.load(Ordering::Acquire) > 0 {
        return ret_errno(libc::EBUSY);
    }
    registry::remove(p, Kind::Pd);
    // SAFETY: live until removed just now; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Pd) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    match b.pd.dealloc() {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_dealloc_pd", &e)),
    }
}

/// A memory region.
#[repr(C)]
pub(crate) struct Mr {
    pub c: ibv_mr,
    mr: MrKey,
    pd: *const Pd,
}

/// What an `ibv_mr` registers.
pub(crate) enum MrKey {
    /// Process memory (`ibv_reg_mr`).
    Host(verbs::mr::Mr),
    /// Device memory (`ibv_reg_dm_mr`), counted on by its `ibv_dm`.
    Dm(verbs::dm::DmMr, *const crate::dm::Dm),
    /// Process memory on demand (`IBV_ACCESS_ON_DEMAND`, `crate::odp`).
    Odp(crate::odp::OdpKey),
}

/// The lkey and access flags of a live host MR (a window binds only
/// those: a device-memory MR has no `IBV_ACCESS_MW_BIND`).
pub(crate) fn mr_key_and_access(m: *mut ibv_mr) -> Option<(u32, u32)> {
    if !registry::is(m, Kind::Mr) {
        return None;
    }
    // SAFETY: the registry holds `m`: a live Mr box, `c` its first field.
    let mr = unsafe { &*(m as *const Mr) };
    Some(match &mr.mr {
        MrKey::Host(h) => (h.lkey(), h.access()),
        MrKey::Dm(d, _) => (d.lkey(), 0),
        MrKey::Odp(o) => (o.mr.lkey(), o.mr.access()),
    })
}

impl Mr {
    /// Registers a new `ibv_mr` of `pd`, which counts on it.
    pub(crate) fn add(pd: &Pd, c: ibv_mr, mr: MrKey) -> *mut ibv_mr {
        pd.users.fetch_add(1, Ordering::AcqRel);
        let m = Box::into_raw(Box::new(Mr {
            c,
            mr,
            pd: std::ptr::from_ref(pd),
        }));
        registry::add(m, Kind::Mr);
        m.cast()
    }
}

/// The access bits verbs knows; the optional ones (bits 20..29,
/// `IBV_ACCESS_OPTIONAL_RANGE`) are dropped when the driver lacks them.
fn access_of(access: c_int) -> u32 {
    let a = access as u32;
    let optional = 0x3ff << 20;
    (a & !optional) | (a & optional & verbs::mr::access::SUPPORTED)
}

/// A new key over `[addr, addr + len)` of `pd` with access `acc`: on
/// demand (`crate::odp`) or pinned; an errno if it cannot.
fn register(pd: &Pd, addr: *mut c_void, len: usize, acc: u32) -> Result<MrKey, c_int> {
    if crate::odp::on_demand(acc) {
        return crate::odp::register(pd, addr, len, acc).map(MrKey::Odp);
    }
    if addr.is_null() || len == 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: ibv_reg_mr's contract: the caller's memory stays mapped
    // while registered, and the device may access it concurrently.
    let mut r = unsafe { pd.pd.reg_mr_raw(addr.cast(), len, acc) };
    if let Err(verbs::Error::Vfio(vfio::Error::NotShareable { why, .. })) = &r {
        // Private memory over vfio-user: make it shared in place, retry.
        tracing::info!("ibv_reg_mr {addr:p}+{len:#x}: {why}; remapping it shared");
        crate::remap::make_shared(addr as usize, len)?;
        // SAFETY: as above; the same memory, now a shared mapping.
        r = unsafe { pd.pd.reg_mr_raw(addr.cast(), len, acc) };
    }
    r.map(MrKey::Host)
        .map_err(|e| crate::errno_of("ibv_reg_mr", &e))
}

impl MrKey {
    /// The key's lkey (its rkey too).
    fn lkey(&self) -> u32 {
        match self {
            MrKey::Host(h) => h.lkey(),
            MrKey::Dm(d, _) => d.lkey(),
            MrKey::Odp(o) => o.mr.lkey(),
        }
    }

    /// Gives the key back (a device-memory key's `ibv_dm` count is the
    /// caller's).
    fn dereg(self) -> verbs::Result<()> {
        match self {
            MrKey::Host(mr) => mr.dereg(),
            MrKey::Dm(mr, _) => mr.dereg(),
            // Dropped: its watch stops, then the key is destroyed and its
            // mappings undone.
            MrKey::Odp(k) => {
                drop(k);
                Ok(())
            }
        }
    }
}

fn reg_mr(p: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr {
    let Some(pd) = pd_of(p) else {
        return std::ptr::null_mut();
    };
    let key = match register(pd, addr, len, access_of(access)) {
        Ok(k) => k,
        Err(e) => return null_errno(e),
    };
    let c = ibv_mr {
        context: pd.c.context,
        pd: p,
        addr,
        length: len,
        handle: key.lkey(),
        lkey: key.lkey(),
        rkey: key.lkey(),
    };
    Mr::add(pd, c, key)
}

/// `ibv_reg_mr`.
#[no_mangle]
pub extern "C" fn ibv_reg_mr(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    reg_mr(p, addr, len, access)
}

/// `ibv_reg_mr_iova2`: only `iova == addr` (the driver's MRs are
/// addressed by their host address); another IOVA is `EOPNOTSUPP`.
#[no_mangle]
pub extern "C" fn ibv_reg_mr_iova2(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    if iova != addr as u64 {
        return null_errno(libc::EOPNOTSUPP);
    }
    reg_mr(p, addr, len, access as c_int)
}

/// `ibv_reg_mr_iova`.
#[no_mangle]
pub extern "C" fn ibv_reg_mr_iova(
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    ibv_reg_mr_iova2(p, addr, len, iova, access as u32)
}

/// `ibv_dereg_mr`.
#[no_mangle]
pub extern "C" fn ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    if !registry::remove(m, Kind::Mr) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live (removed just now); the box is taken back once.
    let b = unsafe { Box::from_raw(m as *mut Mr) };
    // SAFETY: an MR's PD cannot be deallocated while the MR counts on it.
    unuse(unsafe { &(*b.pd).users });
    if let MrKey::Dm(_, dm) = &b.mr {
        // SAFETY: a DM cannot be freed while an MR counts on it.
        unuse(unsafe { &(**dm).users });
    }
    let r = b.mr.dereg();
    match r {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_dereg_mr", &e)),
    }
}

/// `ibv_rereg_mr`: 0, or libibverbs' `IBV_REREG_MR_ERR_INPUT` (-1) for
/// arguments it refuses before the device, `IBV_REREG_MR_ERR_CMD` (-4) for
/// a change the device refused, errno set; the MR is then as it was.
/// A new PD or new access by the driver's `Mr::rereg` (UMR on the same
/// key where mlx5 can, else a new key); a new translation (`addr`,
/// `len`), any change of an ODP region, or one between on-demand and
/// pinned access by a new registration of that memory, the old key then
/// deregistered (new lkey and rkey, as the kernel gives when it cannot
/// reuse the key). A device-memory MR is not re-registered (EINVAL).
#[no_mangle]
pub extern "C" fn ibv_rereg_mr(
    m: *mut ibv_mr,
    flags: c_int,
    p: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    use verbs::umr::rereg_flags::{CHANGE_ACCESS, CHANGE_PD, CHANGE_TRANSLATION, SUPPORTED};
    const ERR_INPUT: c_int = -1;
    const ERR_CMD: c_int = -4;
    let input = |e: c_int| {
        set_errno(e);
        ERR_INPUT
    };
    let f = flags as u32;
    if !registry::is(m, Kind::Mr) || f == 0 || f & !SUPPORTED != 0 {
        return input(libc::EINVAL);
    }
    if f & CHANGE_TRANSLATION != 0 && (addr.is_null() || len == 0) {
        return input(libc::EINVAL);
    }
    let new_pd = if f & CHANGE_PD != 0 {
        match pd_of(p) {
            Some(pd) => Some(pd),
            None => return input(libc::EINVAL),
        }
    } else {
        None
    };
    // SAFETY: the registry holds `m`: a live Mr box; verbs lets no other
    // call use the MR while it is re-registered.
    let mr = unsafe { &mut *(m as *mut Mr) };
    // SAFETY: an MR's PD is not deallocated while the MR counts on it.
    let old_pd = unsafe { &*mr.pd };
    let old_acc = match &mr.mr {
        MrKey::Host(h) => h.access(),
        MrKey::Odp(o) => o.mr.access(),
        MrKey::Dm(..) => return input(libc::EINVAL),
    };
    let acc = if f & CHANGE_ACCESS != 0 {
        access_of(access)
    } else {
        old_acc
    };
    let target = new_pd.unwrap_or(old_pd);
    let on_demand = crate::odp::on_demand;
    // A new translation, an ODP region, or a change between on-demand and
    // pinned: a new key over the memory, the old one given back
    // (mlx5_ib's `recreate`). Else a UMR on the same key where it can.
    let recreate = f & CHANGE_TRANSLATION != 0
        || matches!(mr.mr, MrKey::Odp(_))
        || on_demand(acc) != on_demand(old_acc);
    if recreate {
        let (a, l) = if f & CHANGE_TRANSLATION != 0 {
            (addr, len)
        } else {
            (mr.c.addr, mr.c.length)
        };
        match register(target, a, l, acc) {
            Ok(new) => {
                let old = std::mem::replace(&mut mr.mr, new);
                if let Err(e) = old.dereg() {
                    tracing::warn!("ibv_rereg_mr: the old key: {e}");
                }
                mr.c.addr = a;
                mr.c.length = l;
            }
            Err(e) => {
                set_errno(e);
                return ERR_CMD;
            }
        }
    } else if let MrKey::Host(h) = &mut mr.mr {
        if let Err(e) = h.rereg(f, new_pd.map(|n| &n.pd), None, acc) {
            set_errno(crate::errno_of("ibv_rereg_mr", &e));
            return ERR_CMD;
        }
    }
    if let Some(n) = new_pd {
        n.users.fetch_add(1, Ordering::AcqRel);
        unuse(&old_pd.users);
        mr.pd = std::ptr::from_ref(n);
        mr.c.pd = p;
    }
    let k = mr.mr.lkey();
    mr.c.lkey = k;
    mr.c.rkey = k;
    mr.c.handle = k;
    0
}

/// A completion channel.
#[repr(C)]
pub(crate) struct Channel {
    pub c: ibv_comp_channel,
    pub ch: verbs::channel::CompChannel,
    /// `ibv_cq` pointers by CQ number, for `ibv_get_cq_event`.
    pub cqs: Mutex<HashMap<u32, usize>>,
    pub users: AtomicUsize,
    shared: Arc<CtxShared>,
}

/// `ibv_create_comp_channel`: `fd` is an eventfd, readable while events
/// are queued.
#[no_mangle]
pub extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    let ch = match ctx.vc.create_comp_channel() {
        Ok(ch) => ch,
        Err(e) => return null_errno(crate::errno_of("ibv_create_comp_channel", &e)),
    };
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Channel {
        c: ibv_comp_channel {
            context: c,
            fd: ch.fd(),
            refcnt: 0,
        },
        ch,
        cqs: Mutex::default(),
        users: AtomicUsize::new(0),
        shared: ctx.shared.clone(),
    }));
    registry::add(p, Kind::Channel);
    p.cast()
}

/// `ibv_destroy_comp_channel`: `EBUSY` while CQs use it.
#[no_mangle]
pub extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if !registry::is(ch, Kind::Channel) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: live (the registry holds it).
    if unsafe { &*(ch as *const Channel) }
        .users
        .load(Ordering::Acquire)
        > 0
    {
        return ret_errno(libc::EBUSY);
    }
    registry::remove(ch, Kind::Channel);
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(ch as *mut Channel) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    0
}

/// A completion queue: an `ibv_cq_ex` (its `ibv_cq` first), for CQs of
/// `ibv_create_cq` and `ibv_create_cq_ex` alike, then ours.
#[repr(C)]
pub(crate) struct Cq {
    pub c: ibv_cq_ex,
    pub cq: crate::spin::SpinLock<verbs::cq::Cq>,
    pub cqn: u32,
    pub channel: *const Channel,
    pub shared: Arc<CtxShared>,
    /// QPs on it.
    pub users: AtomicUsize,
    /// The extended poll's current completion and its CQE's timestamp
    /// (`cq_ex.rs`), and how its lock was taken: written and read only
    /// under the CQ's lock.
    pub cur: verbs::cq::WcStamped,
    pub cur_biased: bool,
    /// The wall-clock conversion a CQ made with
    /// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK` reads its stamps
    /// with, retaken at each `ibv_start_poll` (libmlx5's
    /// `last_clock_info`); `None` on any other CQ.
    pub wallclock: Option<verbs::clock::ClockInfo>,
    /// What `ibv_poll_cq` reads, without the lock, to tell an empty CQ
    /// (`verbs::cq::CqProbe`): the current ring's probe, one of
    /// `probes`, which keeps every probe a resize replaced until the CQ
    /// goes (a poller may still be reading it).
    pub probe: AtomicPtr<verbs::cq::CqProbe>,
    // Boxed: `probe` points into them, and a box keeps its place when the
    // vector grows.
    #[allow(clippy::vec_box)]
    pub probes: Mutex<Vec<Box<verbs::cq::CqProbe>>>,
    /// The consumer index the last poll left, written under the lock.
    pub probe_ci: AtomicU32,
    /// The last poll under the lock found nothing: the next one tries the
    /// lock-free test first (a CQ that just gave completions is polled
    /// under the lock straight away, paying nothing for the test).
    pub was_empty: AtomicBool,
}

impl Cq {
    /// Whether a poll of the live CQ `p` could find anything (or report a
    /// failed device), told without its lock: false is an empty CQ. A
    /// consumer index another thread just moved makes it say true, never
    /// false (the entry it reads was software's), but for a reader as far
    /// behind as a whole lap of the ring: a spurious empty poll beside a
    /// poller on another thread.
    ///
    /// # Safety
    ///
    /// `p` is a live `Cq` of this library.
    #[inline(always)]
    pub(crate) unsafe fn may_have_cqe(p: *const Cq) -> bool {
        // SAFETY: a field of a live CQ (the caller's contract).
        if !unsafe { (*p).was_empty.load(Ordering::Relaxed) } {
            return true;
        }
        // SAFETY: fields of a live CQ (the caller's contract), borrowed
        // alone.
        let at = unsafe { (*p).probe.load(Ordering::Acquire) };
        // SAFETY: as above.
        let ci = unsafe { (*p).probe_ci.load(Ordering::Relaxed) };
        // SAFETY: `probe` points at one of `probes`' boxes, which live as
        // long as the CQ.
        let probe = unsafe { &*at };
        probe.ready_at(ci)
    }

    /// After a poll under the lock that found `got` completions: the
    /// consumer index it left, for [`Cq::may_have_cqe`].
    ///
    /// # Safety
    ///
    /// `p` is a live `Cq` whose lock this thread holds through `v`.
    #[inline(always)]
    pub(crate) unsafe fn polled(p: *const Cq, v: &verbs::cq::Cq, got: usize) {
        // Read only after a poll that found nothing (`was_empty`).
        if got == 0 {
            // SAFETY: a field of a live CQ, borrowed alone.
            unsafe { (*p).probe_ci.store(v.consumer_index(), Ordering::Relaxed) };
        }
        // SAFETY: as above.
        unsafe { (*p).was_empty.store(got == 0, Ordering::Relaxed) };
    }

    /// After a resize under the lock: the new ring's probe (the old one
    /// kept) and consumer index.
    ///
    /// # Safety
    ///
    /// As [`Cq::polled`].
    pub(crate) unsafe fn resized(p: *const Cq, v: &verbs::cq::Cq) {
        let b = Box::new(v.probe());
        let at: *const verbs::cq::CqProbe = &*b;
        // SAFETY: fields of a live CQ, borrowed alone.
        lock(unsafe { &(*p).probes }).push(b);
        // SAFETY: as above.
        unsafe { (*p).probe.store(at.cast_mut(), Ordering::Release) };
        // SAFETY: the caller's contract.
        unsafe { Cq::polled(p, v, 0) };
    }
}

/// The `Cq` of a live `ibv_cq`, or `None` (errno EINVAL).
pub(crate) fn cq_of<'a>(p: *mut ibv_cq) -> Option<&'a Cq> {
    if !registry::is(p, Kind::Cq) {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: the registry holds `p`: a live Cq box.
    Some(unsafe { &*(p as *const Cq) })
}

/// `ibv_create_cq`.
#[no_mangle]
pub extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    let (Ok(cqe), Ok(vector)) = (u32::try_from(cqe), usize::try_from(comp_vector)) else {
        return null_errno(libc::EINVAL);
    };
    let cqe_bytes = match cqe_size_of(None) {
        Ok(b) => b,
        Err(e) => return null_errno(e),
    };
    make_cq(ctx, c, cqe, cq_context, channel, vector, false, cqe_bytes).cast()
}

/// The CQE size of a new CQ, as libmlx5's `get_cqe_size`: the mlx5dv
/// attributes' `cqe_size` when given, else `MLX5_CQE_SIZE` from the
/// environment, else 64; 64 or 128, anything else EINVAL.
pub(crate) fn cqe_size_of(asked: Option<u16>) -> Result<usize, i32> {
    let size = match asked {
        Some(s) => usize::from(s),
        None => std::env::var("MLX5_CQE_SIZE")
            .ok()
            .map_or(Some(64), |v| v.trim().parse().ok())
            .unwrap_or(0),
    };
    match size {
        64 | 128 => Ok(size),
        _ => {
            tracing::debug!("CQE size {size}: 64 or 128 (MLX5_CQE_SIZE)");
            Err(libc::EINVAL)
        }
    }
}

/// A CQ of `ctx` (whose `ibv_context` is `c`), for `ibv_create_cq` and
/// `ibv_create_cq_ex`: its `ibv_cq_ex`, or NULL with errno set. `single`:
/// the creator promises one thread at a time (no lock taken);
/// `cqe_bytes`: 64 or 128 ([`cqe_size_of`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_cq(
    ctx: &crate::device::Ctx,
    c: *mut ibv_context,
    cqe: u32,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    vector: usize,
    single: bool,
    cqe_bytes: usize,
) -> *mut ibv_cq_ex {
    if cqe == 0 || cqe > i32::MAX as u32 {
        return null_errno(libc::EINVAL);
    }
    let ch: Option<&Channel> = if channel.is_null() {
        None
    } else if registry::is(channel, Kind::Channel) {
        // SAFETY: live (the registry holds it).
        Some(unsafe { &*(channel as *const Channel) })
    } else {
        return null_errno(libc::EINVAL);
    };
    let cq = match ctx
        .vc
        .create_cq_sized(cqe, ch.map(|c| &c.ch), Some(vector), cqe_bytes)
    {
        Ok(cq) => cq,
        Err(e) => return null_errno(crate::errno_of("ibv_create_cq", &e)),
    };
    let cqn = cq.cqn();
    let n = cq.cqe();
    let probe = Box::new(cq.probe());
    let probe_at: *const verbs::cq::CqProbe = &*probe;
    let probe_ci = AtomicU32::new(cq.consumer_index());
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let p = Box::into_raw(Box::new(Cq {
        c: crate::cq_ex::cq_ex(ibv_cq {
            context: c,
            channel,
            cq_context,
            handle: cqn,
            cqe: n as c_int,
            mutex: mutex_init(),
            cond: cond_init(),
            comp_events_completed: 0,
            async_events_completed: 0,
        }),
        cq: crate::spin::SpinLock::with_single(cq, single),
        cqn,
        channel: ch.map_or(std::ptr::null(), |c| c as *const Channel),
        shared: ctx.shared.clone(),
        users: AtomicUsize::new(0),
        cur: verbs::cq::WcStamped::default(),
        cur_biased: false,
        wallclock: None,
        probe: AtomicPtr::new(probe_at.cast_mut()),
        probes: Mutex::new(vec![probe]),
        probe_ci,
        was_empty: AtomicBool::new(true),
    }));
    if let Some(ch) = ch {
        ch.users.fetch_add(1, Ordering::AcqRel);
        lock(&ch.cqs).insert(cqn, p as usize);
    }
    lock(&ctx.shared.cqs).insert(cqn, p as usize);
    registry::add(p, Kind::Cq);
    p.cast()
}

/// `ibv_destroy_cq`: `EBUSY` while QPs use it.
#[no_mangle]
pub extern "C" fn ibv_destroy_cq(p: *mut ibv_cq) -> c_int {
    let Some(cq) = cq_of(p) else {
        return libc::EINVAL;
    };
    if cq.users.load(Ordering::Acquire) > 0 {
        return ret_errno(libc::EBUSY);
    }
    registry::remove(p, Kind::Cq);
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Cq) };
    if !b.channel.is_null() {
        // SAFETY: a channel is not destroyed while a CQ counts on it.
        let ch = unsafe { &*b.channel };
        lock(&ch.cqs).remove(&b.cqn);
        unuse(&ch.users);
    }
    lock(&b.shared.cqs).remove(&b.cqn);
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let cq = b.cq.into_inner();
    match cq.destroy() {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_destroy_cq", &e)),
    }
}

/// `ibv_resize_cq`: room for at least `cqe` completions (the driver's
/// `Cq::resize`, MODIFY_CQ RESIZE); `ibv_cq.cqe` tells the new size. 0 or
/// an errno (EINVAL for a size below what is outstanding).
#[no_mangle]
pub extern "C" fn ibv_resize_cq(p: *mut ibv_cq, cqe: c_int) -> c_int {
    if cq_of(p).is_none() {
        return libc::EINVAL;
    }
    let Ok(n) = u32::try_from(cqe) else {
        return ret_errno(libc::EINVAL);
    };
    // SAFETY: live (checked above); only the lock field is borrowed, so
    // the `ibv_cq` fields stay writable.
    let lock = unsafe { &(*(p as *mut Cq)).cq };
    let mut g = lock.lock_control();
    let r = g.resize(n);
    // The ring may be new even after an error (MODIFY_CQ done, the copy
    // failed): the lock-free empty test reads the CQ's ring as it is now.
    // SAFETY: live, and the lock is held through `g`.
    unsafe { Cq::resized(p as *const Cq, &g) };
    match r {
        Ok(()) => {
            let size = g.cqe();
            drop(g);
            // SAFETY: the caller's live CQ; the new size, as verbs reports it.
            unsafe { (*p).cqe = size as c_int };
            0
        }
        Err(e) => ret_errno(crate::errno_of("ibv_resize_cq", &e)),
    }
}

/// `ibv_get_cq_event`: waits for the next event of a CQ on `ch`.
#[no_mangle]
pub extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if !registry::is(ch, Kind::Channel) || cq.is_null() || cq_context.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: live (the registry holds it).
    let chan = unsafe { &*(ch as *const Channel) };
    loop {
        let cqn = match chan.ch.get_cq_event(Duration::from_secs(3600)) {
            Ok(Some(n)) => n,
            Ok(None) => continue,
            Err(e) => {
                set_errno(crate::errno_of("ibv_get_cq_event", &e));
                return -1;
            }
        };
        let Some(p) = lock(&chan.cqs).get(&cqn).copied() else {
            continue; // a CQ destroyed since: its event is dropped
        };
        let p = p as *mut ibv_cq;
        // SAFETY: `p` is live (still in the channel's table).
        let ctx = unsafe { (*p).cq_context };
        // SAFETY: the caller's out parameters, non-NULL.
        unsafe { cq.write(p) };
        // SAFETY: as above.
        unsafe { cq_context.write(ctx) };
        return 0;
    }
}

/// `ibv_ack_cq_events`.
#[no_mangle]
pub extern "C" fn ibv_ack_cq_events(p: *mut ibv_cq, n: u32) {
    if let Some(cq) = cq_of(p) {
        let _g = cq.cq.lock_control();
        // SAFETY: `p` is a live CQ (checked above).
        let c = unsafe { &raw mut (*p).comp_events_completed };
        // SAFETY: its counter, written under the CQ's lock only.
        let v = unsafe { c.read() };
        // SAFETY: as above.
        unsafe { c.write(v.wrapping_add(n)) };
    }
}

/// A shared receive queue.
#[repr(C)]
pub(crate) struct Srq {
    pub c: ibv_srq,
    pub srq: verbs::srq::Srq,
    attr: Mutex<ibv_srq_attr>,
    pd: *const Pd,
    pub shared: Arc<CtxShared>,
    /// QPs on it.
    pub users: AtomicUsize,
}

/// The `Srq` of a live `ibv_srq`, or `None` (errno EINVAL).
pub(crate) fn srq_of<'a>(p: *mut ibv_srq) -> Option<&'a Srq> {
    if !registry::is(p, Kind::Srq) {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: the registry holds `p`: a live Srq box.
    Some(unsafe { &*(p as *const Srq) })
}

/// `ibv_create_srq`; `attr` gets the sizes made.
#[no_mangle]
pub extern "C" fn ibv_create_srq(p: *mut ibv_pd, init: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    let Some(pd) = pd_of(p) else {
        return std::ptr::null_mut();
    };
    if init.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let init = unsafe { &mut *init };
    let srq = match pd.pd.create_srq(init.attr.max_wr, init.attr.max_sge) {
        Ok(s) => s,
        Err(e) => return null_errno(crate::errno_of("ibv_create_srq", &e)),
    };
    // What was made, as libmlx5 writes it back.
    init.attr.max_wr = srq.max_wr();
    init.attr.max_sge = srq.max_sge();
    let srqn = srq.srqn();
    pd.users.fetch_add(1, Ordering::AcqRel);
    let b = Box::into_raw(Box::new(Srq {
        c: ibv_srq {
            context: pd.c.context,
            srq_context: init.srq_context,
            pd: p,
            handle: srqn,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        },
        srq,
        attr: Mutex::new(init.attr),
        pd,
        shared: pd.shared.clone(),
        users: AtomicUsize::new(0),
    }));
    lock(&pd.shared.srqs).insert(srqn, b as usize);
    registry::add(b, Kind::Srq);
    b.cast()
}

/// `ibv_modify_srq`: `IBV_SRQ_LIMIT` arms the SRQ's limit (ARM_RQ: one
/// `IBV_EVENT_SRQ_LIMIT_REACHED` when fewer WQEs remain); `IBV_SRQ_MAX_WR`
/// (resizing) is not offered (`EOPNOTSUPP`); a mask of nothing is a no-op.
#[no_mangle]
pub extern "C" fn ibv_modify_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int {
    const IBV_SRQ_MAX_WR: c_int = 1;
    const IBV_SRQ_LIMIT: c_int = 2;
    let Some(s) = srq_of(p) else {
        return libc::EINVAL;
    };
    if mask == 0 {
        return 0;
    }
    if mask & !(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT) != 0 || attr.is_null() {
        return ret_errno(libc::EINVAL);
    }
    if mask & IBV_SRQ_MAX_WR != 0 {
        return ret_errno(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let limit = unsafe { (*attr).srq_limit };
    match s.srq.arm_limit(limit) {
        Ok(()) => {
            lock(&s.attr).srq_limit = limit;
            0
        }
        Err(e) => ret_errno(crate::errno_of("ibv_modify_srq", &e)),
    }
}

/// `ibv_query_srq`.
#[no_mangle]
pub extern "C" fn ibv_query_srq(p: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let Some(s) = srq_of(p) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // The limit as the device holds it: 0 again once its event fired.
    let limit = match s.srq.limit() {
        Ok(l) => l,
        Err(e) => return ret_errno(crate::errno_of("ibv_query_srq", &e)),
    };
    let mut a = *lock(&s.attr);
    a.srq_limit = limit;
    // SAFETY: the caller's out struct, non-NULL.
    unsafe { *attr = a };
    0
}

/// `ibv_destroy_srq`: `EBUSY` while QPs use it.
#[no_mangle]
pub extern "C" fn ibv_destroy_srq(p: *mut ibv_srq) -> c_int {
    let Some(s) = srq_of(p) else {
        return libc::EINVAL;
    };
    if s.users.load(Ordering::Acquire) > 0 {
        return ret_errno(libc::EBUSY);
    }
    registry::remove(p, Kind::Srq);
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Srq) };
    lock(&b.shared.srqs).remove(&b.c.handle);
    // SAFETY: the PD is not deallocated while the SRQ counts on it.
    unuse(unsafe { &(*b.pd).users });
    0
}

/// `verbs_context.get_srq_num`.
pub(crate) unsafe extern "C" fn get_srq_num(p: *mut ibv_srq, n: *mut u32) -> c_int {
    let Some(s) = srq_of(p) else {
        return libc::EINVAL;
    };
    if n.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's out value, non-NULL.
    unsafe { *n = s.srq.srqn() };
    0
}

/// An address handle.
#[repr(C)]
pub(crate) struct Ah {
    pub c: ibv_ah,
    pub ah: verbs::ah::Ah,
    pd: *const Pd,
}

/// The driver's address of an `ibv_ah_attr` (RoCE: a GRH is required).
pub(crate) fn ah_attr_of(a: &ibv_ah_attr) -> Result<verbs::qp::AhAttr, i32> {
    if a.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(verbs::qp::AhAttr {
        dgid: a.grh.dgid.raw,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        sl: a.sl,
        port_num: a.port_num,
        dmac: None,
    })
}

/// `ibv_create_ah`.
#[no_mangle]
pub extern "C" fn ibv_create_ah(p: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    let Some(pd) = pd_of(p) else {
        return std::ptr::null_mut();
    };
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = match ah_attr_of(unsafe { &*attr }) {
        Ok(a) => a,
        Err(e) => return null_errno(e),
    };
    let ah = match pd.pd.create_ah(&a) {
        Ok(ah) => ah,
        Err(e) => return null_errno(crate::errno_of("ibv_create_ah", &e)),
    };
    pd.users.fetch_add(1, Ordering::AcqRel);
    let b = Box::into_raw(Box::new(Ah {
        c: ibv_ah {
            context: pd.c.context,
            pd: p,
            handle: 0,
        },
        ah,
        pd,
    }));
    registry::add(b, Kind::Ah);
    b.cast()
}

/// The `Ah` of a live `ibv_ah` (for UD sends).
pub(crate) fn ah_of<'a>(p: *mut ibv_ah) -> Option<&'a Ah> {
    if !registry::is(p, Kind::Ah) {
        return None;
    }
    // SAFETY: the registry holds `p`: a live Ah box.
    Some(unsafe { &*(p as *const Ah) })
}

/// `ibv_destroy_ah`.
#[no_mangle]
pub extern "C" fn ibv_destroy_ah(p: *mut ibv_ah) -> c_int {
    if !registry::remove(p, Kind::Ah) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Ah) };
    // SAFETY: the PD is not deallocated while the AH counts on it.
    unuse(unsafe { &(*b.pd).users });
    0
}

/// `ibv_init_ah_from_wc`: the reply address of a UD receive (its GRH).
#[no_mangle]
pub extern "C" fn ibv_init_ah_from_wc(
    c: *mut ibv_context,
    port: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah: *mut ibv_ah_attr,
) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return -1;
    };
    if wc.is_null() || grh.is_null() || ah.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's structures, non-NULL.
    let wc = unsafe { &*wc };
    // SAFETY: as above.
    let grh = unsafe { &*grh };
    if wc.wc_flags & 1 == 0 {
        set_errno(libc::EINVAL); // no GRH: RoCE needs one
        return -1;
    }
    let sgid_index = (0..ctx.gid_tbl_len)
        .find(|&i| ctx.vc.query_gid(port, i).ok() == Some(grh.dgid.raw))
        .unwrap_or(0);
    let flow = u32::from_be(grh.version_tclass_flow);
    let a = ibv_ah_attr {
        grh: ibv_global_route {
            dgid: grh.sgid,
            flow_label: flow & 0xf_ffff,
            sgid_index: sgid_index as u8,
            hop_limit: 0xff,
            traffic_class: (flow >> 20) as u8,
        },
        dlid: wc.slid,
        sl: wc.sl,
        src_path_bits: wc.dlid_path_bits,
        static_rate: 0,
        is_global: 1,
        port_num: port,
    };
    // SAFETY: the caller's out struct, non-NULL.
    unsafe { ah.write(a) };
    0
}

/// `ibv_create_ah_from_wc`.
#[no_mangle]
pub extern "C" fn ibv_create_ah_from_wc(
    p: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port: u8,
) -> *mut ibv_ah {
    let Some(pd) = pd_of(p) else {
        return std::ptr::null_mut();
    };
    let mut a = ibv_ah_attr::default();
    if ibv_init_ah_from_wc(pd.c.context, port, wc, grh, &mut a) != 0 {
        return std::ptr::null_mut();
    }
    ibv_create_ah(p, &mut a)
}
