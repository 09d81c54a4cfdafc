//! Asynchronous events: `ibv_get_async_event` and `ibv_ack_async_event`.
//!
//! Every `ibv_context` opened on one device shares that device's verbs
//! context, and with it the one async event queue the device raises
//! events on. So one dispatcher thread per device takes them
//! ([`Dispatch`], started at the first `ibv_open_device`, stopped at the
//! last close) and queues each on the contexts it concerns, as the
//! kernel's uverbs does: an event of a QP, CQ or SRQ on the context that
//! made that object, a port or device event on every context. A context
//! counts its queued events in an eventfd (`async_fd`, semaphore mode):
//! `ibv_get_async_event` reads one count and takes one event; the caller
//! may poll the fd or make it non-blocking (then `EAGAIN`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use libc::{c_int, c_void};
use verbs::device::{AsyncEventKind, Context};

use crate::abi::*;
use crate::device::checked_ctx;
use crate::set_errno;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the objects of one `ibv_context` share with the device's
/// dispatcher: the maps from object numbers to the C pointers an event
/// names, and the context's queue of events.
#[derive(Debug)]
pub(crate) struct CtxShared {
    /// `ibv_qp` pointers by QP number.
    pub qps: Mutex<HashMap<u32, usize>>,
    /// `ibv_cq` pointers by CQ number.
    pub cqs: Mutex<HashMap<u32, usize>>,
    /// `ibv_srq` pointers by SRQ number.
    pub srqs: Mutex<HashMap<u32, usize>>,
    /// Events queued for `ibv_get_async_event`: element, `ibv_event_type`.
    events: Mutex<VecDeque<(usize, c_int)>>,
    /// The context's `async_fd`: an eventfd counting `events`.
    efd: OwnedFd,
    /// Objects made on this context and not destroyed.
    pub objects: std::sync::atomic::AtomicUsize,
}

impl CtxShared {
    /// A context's share, with its eventfd (semaphore mode).
    pub(crate) fn new() -> Result<Self, i32> {
        // SAFETY: eventfd has no memory arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE));
        }
        Ok(Self {
            qps: Mutex::default(),
            cqs: Mutex::default(),
            srqs: Mutex::default(),
            events: Mutex::default(),
            // SAFETY: `fd` was just opened and is owned by nobody else.
            efd: unsafe { OwnedFd::from_raw_fd(fd) },
            objects: Default::default(),
        })
    }

    /// The `async_fd` of the context.
    pub(crate) fn async_fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    /// Queues `k` if it concerns this context: true if it did.
    fn deliver(&self, k: &AsyncEventKind) -> bool {
        let Some(ev) = element_of(self, k) else {
            return false;
        };
        lock(&self.events).push_back(ev);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd.
        let r = unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if r != 8 {
            tracing::warn!("async event eventfd: {}", std::io::Error::last_os_error());
        }
        true
    }
}

/// The element and `ibv_event_type` of an event, with the objects of
/// this context resolved (`None`: not one of this context's).
fn element_of(s: &CtxShared, k: &AsyncEventKind) -> Option<(usize, c_int)> {
    use AsyncEventKind::*;
    let ty = k.ibv_event_type()? as c_int;
    let find = |m: &Mutex<HashMap<u32, usize>>, n: u32| lock(m).get(&n).copied();
    let el = match *k {
        CqErr { cqn, .. } => find(&s.cqs, cqn)?,
        QpFatal(q) | QpReqErr(q) | QpAccessErr(q) | CommEst(q) | SqDrained(q) | PathMig(q)
        | PathMigErr(q) | QpLastWqeReached(q) => find(&s.qps, q)?,
        SrqErr(n) | SrqLimitReached(n) => find(&s.srqs, n)?,
        PortActive(p) | PortErr(p) => usize::from(p),
        DeviceFatal => 0,
        Other(..) => return None,
    };
    Some((el, ty))
}

/// One device's dispatcher: the contexts opened on it and the thread
/// that takes the device's events for them.
#[derive(Debug, Default)]
pub(crate) struct Dispatch {
    inner: Mutex<DispatchInner>,
}

#[derive(Debug, Default)]
struct DispatchInner {
    subs: Arc<Mutex<Vec<Arc<CtxShared>>>>,
    thread: Option<(JoinHandle<()>, Arc<AtomicBool>)>,
}

impl Dispatch {
    /// Events of `vc` (the device's shared verbs context) go to `s` from
    /// now on; the thread starts with the first context.
    pub(crate) fn subscribe(&self, vc: &Context, s: Arc<CtxShared>) {
        let mut g = lock(&self.inner);
        lock(&g.subs).push(s);
        if g.thread.is_some() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (vc, subs, st) = (vc.clone(), g.subs.clone(), stop.clone());
        match std::thread::Builder::new()
            .name("ibv-async".into())
            .spawn(move || dispatch(&vc, &subs, &st))
        {
            Ok(t) => g.thread = Some((t, stop)),
            Err(e) => tracing::warn!("async event thread: {e}"),
        }
    }

    /// `s`'s context closes: no more events for it; the thread stops (and
    /// lets go of the verbs context) with the last context.
    pub(crate) fn unsubscribe(&self, s: &Arc<CtxShared>) {
        let mut g = lock(&self.inner);
        let left = {
            let mut subs = lock(&g.subs);
            subs.retain(|x| !Arc::ptr_eq(x, s));
            subs.len()
        };
        if left == 0 {
            if let Some((t, stop)) = g.thread.take() {
                stop.store(true, Ordering::Release);
                let _ = t.join();
            }
        }
    }
}

/// The dispatcher thread: each event of the device to every context it
/// concerns, until told to stop.
fn dispatch(vc: &Context, subs: &Mutex<Vec<Arc<CtxShared>>>, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let Some(k) = vc.get_async_event(Duration::from_millis(50)) else {
            continue;
        };
        let delivered = lock(subs).iter().filter(|s| s.deliver(&k)).count();
        if delivered == 0 {
            tracing::debug!("async event {k:?}: no context of this device has its object");
        }
    }
}

/// `ibv_get_async_event`: blocks unless the caller made `async_fd`
/// non-blocking (then `EAGAIN`).
#[no_mangle]
pub extern "C" fn ibv_get_async_event(c: *mut ibv_context, ev: *mut ibv_async_event) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return -1;
    };
    if ev.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let s = &c.shared;
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from the context's eventfd
    // (semaphore mode: one event per read).
    let r = unsafe { libc::read(s.efd.as_raw_fd(), (&raw mut v).cast(), 8) };
    if r != 8 {
        return -1; // errno from read (EAGAIN when non-blocking)
    }
    let Some((el, ty)) = lock(&s.events).pop_front() else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    // SAFETY: the caller's out struct, non-NULL.
    unsafe {
        ev.write(ibv_async_event {
            element: el as *mut c_void,
            event_type: ty,
        })
    };
    0
}

/// `ibv_ack_async_event`: nothing to count (destroys do not wait for acks).
#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_ev: *mut ibv_async_event) {}
