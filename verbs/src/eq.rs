//! Event queues: how the device tells the driver that something happened.
//!
//! An EQ is a power-of-two ring of 64-byte EQEs in DMA memory, described to
//! the device by CREATE_EQ (0x301) with one PAS entry (the buffer is one
//! naturally aligned IOVA range, so one "page" of `2^log_page_size` 4 KiB
//! units covers it), a UAR page for its doorbell, an MSI-X vector and a
//! bitmask of event types. Every EQE's owner byte starts at 1; the device
//! writes entry `ci` with owner bit `(ci >> log_nent) & 1` inverted from the
//! initial value on each pass, so an entry is the driver's when
//! `owner & 1 == (ci >> log_nent) & 1`. The driver reads the owner byte,
//! issues a read barrier, then copies the entry; it tells the device how
//! far it got through the UAR (CI update every [`CI_UPDATE_BATCH`] entries,
//! then arm at the end of each drain, so the next EQE raises an interrupt).
//!
//! The control EQs, as Linux 6.12 makes them: one for command completions
//! (CMD), then one for asynchronous events and page requests, both on MSI-X
//! vector 0 (the kernel's `ctrl_irq`). Then one completion EQ per
//! completion vector, vector `1 + i` for completion vector `i`
//! ([`comp_vector_plan`]: as many as the function's MSI-X vectors, its
//! EQ capacity, the CPUs and the caller allow). Each EQ rings its own UAR
//! page: a device that notices doorbells by polling BAR memory (the
//! vfio-user device model) would otherwise lose one EQ's arm under the
//! next EQ's write to the same register. One thread waits (epoll, with
//! a timeout and a stop eventfd) on the MSI-X eventfds, drains the EQs of
//! the vector that fired and dispatches: CMD completions wake command
//! waiters, PAGE_REQUESTs go to the page worker, COMP events the CQ's
//! handler, everything else subscribers. Each vector counts the interrupts
//! it took and each EQ the EQEs it drained ([`VectorStats`]), so a test can
//! tell on which vector an event arrived.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use mlx5_hw::event::{self as ev, EventType};
use mlx5_hw::ifc::{create_eq_in, create_eq_out, destroy_eq_in, destroy_eq_out};
use mlx5_hw::ifc::{CreateEqIn, CreateEqOut, DestroyEqIn, Eqe, EqeCmd, EqeComp};
use mlx5_hw::opcode::Opcode;
use vfio::mmio::dma_rmb;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::buf::DmaSlice;
use crate::cmd::{Cmd, CmdQueue};
use crate::dma::DmaCtx;
use crate::pagealloc::PageRequest;
use crate::uar::Uar;
use crate::{Error, Result};

/// EQEs consumed between consumer-index updates inside one drain.
pub const CI_UPDATE_BATCH: u32 = ev::EQ_POLLING_BUDGET;
/// How long the event thread waits before checking whether to stop.
pub const EVENT_POLL_TIMEOUT: Duration = Duration::from_millis(100);
/// Entries of the command EQ: 32 + the kernel's spare, rounded up.
pub const CMD_EQ_NENT: u32 = (ev::NUM_CMD_EQE + ev::NUM_SPARE_EQE).next_power_of_two();
/// Entries of the async EQ: 1024 + spare, rounded up.
pub const ASYNC_EQ_NENT: u32 = (1024 + ev::NUM_SPARE_EQE).next_power_of_two();

/// The control EQs (command, async + pages), all on MSI-X vector 0.
pub const CTRL_EQS: u32 = 2;
/// The MSI-X vector of the control EQs (Linux: the `ctrl_irq`).
pub const CTRL_VECTOR: u32 = 0;
/// Entries of each completion EQ.
pub const COMP_EQ_NENT: u32 = 1024;
/// The most EQs an `eq_number` (8 bits in CREATE_EQ's output) can name.
pub const EQN_LIMIT: u32 = 256;

/// How many completion vectors a function gets, as Linux 6.12 counts them
/// (`mlx5_irq_table_create`, `get_num_eqs`): MSI-X vectors past the
/// control vector, at most one per CPU and port (`cpus * ports`), at most
/// the EQs the device offers (`max_eqs`) less the [`CTRL_EQS`], and at
/// most `asked` when the caller says. A function with a single MSI-X vector
/// gets one completion vector sharing it with the control EQs.
///
/// Returns `(completion vectors, MSI-X vectors to attach)`, or why none can
/// exist.
pub fn comp_vector_plan(
    msix: u32,
    max_eqs: u32,
    cpus: u32,
    ports: u32,
    asked: Option<u32>,
) -> Result<(u32, u32)> {
    if asked == Some(0) {
        return Err(Error::Invalid(
            "num_comp_vectors 0: a context needs at least one completion vector",
        ));
    }
    if msix == 0 {
        return Err(Error::NotSupported("MSI-X"));
    }
    let eqs = max_eqs.min(EQN_LIMIT).saturating_sub(CTRL_EQS);
    if eqs == 0 {
        return Err(Error::NotSupported(
            "completion EQs (max EQs leaves none past the control EQs)",
        ));
    }
    let offered = (msix - 1).max(1).min(eqs);
    let want = asked.unwrap_or(cpus.max(1).saturating_mul(ports.max(1)));
    let n = offered.min(want);
    Ok((n, if msix == 1 { 1 } else { 1 + n }))
}

/// The MSI-X vector of completion vector `i` when `msix` vectors are
/// attached: `1 + i`, or the control vector when it is the only one.
pub fn comp_msix_vector(i: u32, attached: u32) -> u32 {
    if attached <= 1 {
        CTRL_VECTOR
    } else {
        1 + i
    }
}

/// What one completion vector saw since the context opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorStats {
    /// The completion EQ's number (CQs name it as `c_eqn`).
    pub eqn: u8,
    /// The MSI-X vector the EQ raises.
    pub msix_vector: u32,
    /// Interrupts (eventfd wake-ups) the event thread took on that vector.
    pub interrupts: u64,
    /// EQEs drained from the EQ.
    pub eqes: u64,
}

/// An asynchronous event delivered to subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// The EQE type.
    pub event_type: EventType,
    /// The EQE sub-type.
    pub sub_type: u8,
    /// The 28-byte data area (overlay an `eqe_*` layout).
    pub data: [u8; ev::EQE_DATA_SIZE],
}

impl AsyncEvent {
    /// Decodes a copied EQE.
    pub fn from_eqe(e: &[u8; ev::EQE_SIZE]) -> Self {
        let e = Eqe::new_unchecked(&e[..]);
        let mut data = [0u8; ev::EQE_DATA_SIZE];
        data.copy_from_slice(e.event_data().into_inner());
        Self {
            event_type: EventType::from_raw(e.event_type()),
            sub_type: e.event_sub_type(),
            data,
        }
    }
}

/// The event types the async EQ subscribes to (the kernel's async mask,
/// limited to what the caps advertise).
pub fn async_event_mask(port_module: bool, general: bool, temp_warn: bool) -> u64 {
    let mut m = 0u64;
    for t in [
        EventType::PathMig,
        EventType::CommEst,
        EventType::SqDrained,
        EventType::SrqLastWqe,
        EventType::SrqRqLimit,
        EventType::CqError,
        EventType::WqCatasError,
        EventType::PathMigFailed,
        EventType::WqInvalReqError,
        EventType::WqAccessError,
        EventType::SrqCatasError,
        EventType::InternalError,
        EventType::PortChange,
        EventType::PageRequest,
        EventType::DctDrained,
    ] {
        m |= 1 << t.to_raw();
    }
    if port_module {
        m |= 1 << EventType::PortModuleEvent.to_raw();
    }
    if general {
        m |= 1 << EventType::GeneralEvent.to_raw();
    }
    if temp_warn {
        m |= 1 << EventType::TempWarnEvent.to_raw();
    }
    m
}

/// Ring state of one EQ: consumer index, and whether it was destroyed.
#[derive(Debug)]
struct Ring {
    ci: u32,
    dead: bool,
}

/// One event queue.
#[derive(Debug)]
pub(crate) struct Eq {
    eqn: u8,
    vector: u32,
    log_nent: u32,
    region: DmaSlice,
    uar: Arc<Uar>,
    ring: Mutex<Ring>,
    eqes: AtomicU64,
}

/// Whether the EQE at consumer index `ci` belongs to software, given its
/// owner byte.
pub fn eqe_is_sw_owned(owner: u8, ci: u32, log_nent: u32) -> bool {
    (owner & ev::EQE_OWNER_MASK) as u32 == (ci >> log_nent) & 1
}

/// Reads the next software-owned EQE of a ring at `base` of `buf` (owner
/// byte, read barrier, copy), or `None`.
pub(crate) fn next_eqe(
    buf: &vfio::DmaBuffer,
    base: usize,
    ci: u32,
    log_nent: u32,
) -> Result<Option<[u8; ev::EQE_SIZE]>> {
    let off = base + ((ci & ((1 << log_nent) - 1)) as usize) * ev::EQE_SIZE;
    let owner = buf.load_u8_acquire(off + ev::EQE_OWNER_OFFSET)?;
    if !eqe_is_sw_owned(owner, ci, log_nent) {
        return Ok(None);
    }
    // The owner bit said "ours": read the rest only after it.
    dma_rmb();
    let mut e = [0u8; ev::EQE_SIZE];
    buf.read(off, &mut e)?;
    Ok(Some(e))
}

/// Sets every EQE's owner byte of the ring at `base` of `buf` to the
/// initial value (PRM: hardware owns every entry of a new EQ).
pub(crate) fn init_owner(buf: &vfio::DmaBuffer, base: usize, nent: u32) -> Result<()> {
    for i in 0..nent as usize {
        buf.write(
            base + i * ev::EQE_SIZE + ev::EQE_OWNER_OFFSET,
            &[ev::EQE_OWNER_INIT_VAL],
        )?;
    }
    Ok(())
}

impl Eq {
    /// CREATE_EQ with `nent` entries on MSI-X `vector` for event types `mask`, then arms it.
    pub(crate) fn create(
        cmd: &Cmd,
        dma: &Arc<DmaCtx>,
        uar: Arc<Uar>,
        vector: u32,
        nent: u32,
        mask: u64,
    ) -> Result<Self> {
        let nent = nent.next_power_of_two();
        let log_nent = nent.trailing_zeros();
        let region = dma.alloc_buf(nent as usize * ev::EQE_SIZE)?;
        init_owner(region.buf(), region.offset(), nent)?;
        let log_page = region.len().trailing_zeros() - 12;
        let mut inb = vec![0u8; create_eq_in::SIZE_BYTES + 8];
        {
            let mut c = CreateEqIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateEq.to_raw());
            c.eq_context_entry_mut()
                .set_log_eq_size(log_nent as u8)
                .set_uar_page(uar.index())
                .set_intr(vector as u16)
                .set_log_page_size(log_page as u8);
            c.set_event_bitmask(0, mask);
            c.set_pas(0, region.iova().0);
        }
        let out = cmd.exec(&inb, create_eq_out::SIZE_BYTES)?;
        let eqn = CreateEqOut::new_unchecked(&out[..]).eq_number();
        let eq = Self {
            eqn,
            vector,
            log_nent,
            region,
            uar,
            ring: Mutex::new(Ring { ci: 0, dead: false }),
            eqes: AtomicU64::new(0),
        };
        eq.uar.eq_doorbell(eqn, 0, true)?;
        Ok(eq)
    }

    /// The EQ number.
    pub(crate) fn eqn(&self) -> u8 {
        self.eqn
    }

    /// The MSI-X vector the EQ raises.
    pub(crate) fn vector(&self) -> u32 {
        self.vector
    }

    /// EQEs drained so far.
    pub(crate) fn eqes(&self) -> u64 {
        self.eqes.load(Ordering::Relaxed)
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// DESTROY_EQ; the buffer stays mapped until the `Eq` is dropped.
    pub(crate) fn destroy(&self, cmd: &Cmd) -> Result<()> {
        self.ring().dead = true;
        let mut inb = [0u8; destroy_eq_in::SIZE_BYTES];
        DestroyEqIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DestroyEq.to_raw())
            .set_eq_number(self.eqn);
        let r = cmd.exec(&inb, destroy_eq_out::SIZE_BYTES).map(|_| ());
        if r.is_err() {
            // The device may still write EQEs: the memory stays out of use.
            self.region.device_may_still_use();
        }
        r
    }

    /// Drains every ready EQE into `f`, updating CI every
    /// [`CI_UPDATE_BATCH`] and arming at the end. Returns how many.
    fn drain(&self, mut f: impl FnMut(&[u8; ev::EQE_SIZE])) -> Result<u32> {
        let mut r = self.ring();
        if r.dead {
            return Ok(0);
        }
        let mut n = 0;
        while let Some(e) = next_eqe(self.region.buf(), self.region.offset(), r.ci, self.log_nent)?
        {
            r.ci = r.ci.wrapping_add(1);
            n += 1;
            // Counted before it is handed on: whoever the event wakes
            // sees it counted.
            self.eqes.fetch_add(1, Ordering::Relaxed);
            f(&e);
            if n % CI_UPDATE_BATCH == 0 {
                self.uar.eq_doorbell(self.eqn, r.ci, false)?;
            }
        }
        self.uar.eq_doorbell(self.eqn, r.ci, true)?;
        Ok(n)
    }
}

/// What a completion event (an EQE of type COMP) is handed to: the CQ's
/// notification path, looked up by CQ number.
pub(crate) type CompHandler = Arc<dyn Fn() + Send + Sync>;

/// CQ number to completion handler, shared by the event thread and the
/// verbs objects that register CQs.
#[derive(Default)]
pub(crate) struct CompTable(std::sync::RwLock<std::collections::HashMap<u32, CompHandler>>);

impl std::fmt::Debug for CompTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompTable").finish_non_exhaustive()
    }
}

impl CompTable {
    /// Routes completion events of CQ `cqn` to `h`.
    pub(crate) fn insert(&self, cqn: u32, h: CompHandler) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(cqn, h);
    }

    /// Stops routing completion events of CQ `cqn`.
    pub(crate) fn remove(&self, cqn: u32) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&cqn);
    }

    /// Fires every CQ's handler once: the device failed, and whoever waits
    /// on a completion channel must wake and poll to find out (mlx5_ib's
    /// `mlx5_ib_handle_internal_error` triggers the CQs' handlers too).
    pub(crate) fn fire_all(&self) {
        let all: Vec<CompHandler> = self
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for h in all {
            h();
        }
    }

    fn fire(&self, cqn: u32) {
        let h = self
            .0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&cqn)
            .cloned();
        match h {
            Some(h) => h(),
            None => tracing::debug!("completion event for unknown CQ {cqn:#x}"),
        }
    }
}

/// Where events go.
#[derive(Debug, Clone)]
pub(crate) struct Dispatch {
    pub(crate) cmd: Arc<CmdQueue>,
    pub(crate) pages: Arc<Mutex<Option<Sender<PageRequest>>>>,
    pub(crate) subs: Arc<Mutex<Vec<Sender<AsyncEvent>>>>,
    pub(crate) comp: Arc<CompTable>,
}

impl Dispatch {
    fn eqe(&self, e: &[u8; ev::EQE_SIZE]) {
        let a = AsyncEvent::from_eqe(e);
        match a.event_type {
            EventType::Comp => {
                let d: &EqeComp = zerocopy::transmute_ref!(&a.data);
                self.comp.fire(d.cqn.get() & ev::EQE_RESOURCE_NUMBER_MASK);
            }
            EventType::Cmd => {
                let d: &EqeCmd = zerocopy::transmute_ref!(&a.data);
                self.cmd.complete(d.vector.get());
            }
            EventType::PageRequest => {
                let req = PageRequest::from_eqe_data(&a.data);
                let tx = self.pages.lock().unwrap_or_else(|p| p.into_inner());
                match tx.as_ref() {
                    Some(tx) if tx.send(req).is_ok() => {}
                    _ => tracing::warn!("page request {req:?} dropped: no page worker"),
                }
            }
            _ => {
                tracing::debug!("event {} sub_type {:#x}", a.event_type, a.sub_type);
                self.subs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|s| s.send(a).is_ok());
            }
        }
    }
}

/// What one vector's eventfd counted, and how much of it were the
/// driver's own kicks.
#[derive(Debug, Default)]
struct IrqCount {
    counted: AtomicU64,
    kicks: AtomicU64,
}

/// The EQs, their vectors' eventfds and the thread that serves them.
#[derive(Debug)]
pub(crate) struct EventLoop {
    func: Arc<dyn vfio::PciFunction>,
    eqs: Arc<Mutex<Vec<Arc<Eq>>>>,
    fds: Vec<Arc<EventFd>>,
    irqs: Arc<[IrqCount]>,
    stop: Arc<EventFd>,
    running: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventLoop {
    /// Creates one eventfd per vector (`vectors` of them), attaches them to
    /// MSI-X and starts the thread (no EQs yet).
    pub(crate) fn start(
        func: Arc<dyn vfio::PciFunction>,
        vectors: u32,
        dispatch: Dispatch,
    ) -> Result<Self> {
        let mk = || EventFd::new(EFD_NONBLOCK).map_err(|e| Error::os("eventfd", e));
        let fds: Vec<Arc<EventFd>> = (0..vectors)
            .map(|_| mk().map(Arc::new))
            .collect::<Result<_>>()?;
        let stop = Arc::new(mk()?);
        let refs: Vec<Option<&EventFd>> = fds.iter().map(|f| Some(&**f)).collect();
        // Attaching the vectors is what enables MSI-X: vfio-pci (and every
        // backend of ours) sets the capability's enable bit itself.
        func.set_irqs(vfio::IrqKind::MsiX, 0, &refs)?;
        let epoll = Epoll::new().map_err(|e| Error::os("epoll_create", e))?;
        let add = |fd: &EventFd, data: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, data),
                )
                .map_err(|e| Error::os("epoll_ctl", e))
        };
        let setup = (|| {
            for (i, f) in fds.iter().enumerate() {
                add(f, i as u64)?;
            }
            add(&stop, u64::MAX)
        })();
        if let Err(e) = setup {
            let _ = func.set_irqs(vfio::IrqKind::MsiX, 0, &[]);
            return Err(e);
        }
        let eqs: Arc<Mutex<Vec<Arc<Eq>>>> = Arc::default();
        let irqs: Arc<[IrqCount]> = (0..vectors).map(|_| IrqCount::default()).collect();
        let running = Arc::new(AtomicBool::new(true));
        let t = {
            let lp = Loop {
                epoll,
                fds: fds.clone(),
                irqs: irqs.clone(),
                stop: stop.clone(),
                eqs: eqs.clone(),
                dispatch,
                running: running.clone(),
            };
            std::thread::Builder::new()
                .name("mlx5-events".into())
                .spawn(move || lp.run())
        };
        let thread = match t {
            Ok(t) => t,
            Err(e) => {
                let _ = func.set_irqs(vfio::IrqKind::MsiX, 0, &[]);
                return Err(Error::os("spawn event thread", e));
            }
        };
        Ok(Self {
            func,
            eqs,
            fds,
            irqs,
            stop,
            running,
            thread: Some(thread),
        })
    }

    /// Hands an EQ to the thread.
    pub(crate) fn add(&self, eq: Eq) -> Arc<Eq> {
        let eq = Arc::new(eq);
        self.eqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(eq.clone());
        // An EQE may have arrived before the EQ was registered: kick the
        // thread (a kick, not an interrupt: counted apart).
        let v = eq.vector as usize;
        if let (Some(f), Some(c)) = (self.fds.get(v), self.irqs.get(v)) {
            c.kicks.fetch_add(1, Ordering::Relaxed);
            if f.write(1).is_err() {
                c.kicks.fetch_sub(1, Ordering::Relaxed);
            }
        }
        eq
    }

    /// MSI-X messages the thread took on `vector` (each signal adds one
    /// to the vector's eventfd), less the thread's own kicks; 0 for a
    /// vector not attached.
    pub(crate) fn interrupts(&self, vector: u32) -> u64 {
        self.irqs.get(vector as usize).map_or(0, |c| {
            let kicks = c.kicks.load(Ordering::Relaxed);
            c.counted.load(Ordering::Relaxed).saturating_sub(kicks)
        })
    }

    /// Stops the thread, detaches the eventfds; the EQ buffers are unmapped
    /// when the last reference goes.
    /// Once: `Drop` after an explicit stop does nothing (a second detach
    /// is EINVAL from vfio-pci, whose MSI-X is off by then).
    pub(crate) fn stop(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.running.store(false, Ordering::Release);
        let _ = self.stop.write(1);
        if t.join().is_err() {
            tracing::error!("event thread panicked");
        }
        if let Err(e) = self.func.set_irqs(vfio::IrqKind::MsiX, 0, &[]) {
            tracing::warn!("detaching MSI-X eventfds: {e}");
        }
        self.eqs.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Drop for EventLoop {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the event thread owns.
struct Loop {
    epoll: Epoll,
    fds: Vec<Arc<EventFd>>,
    irqs: Arc<[IrqCount]>,
    stop: Arc<EventFd>,
    eqs: Arc<Mutex<Vec<Arc<Eq>>>>,
    dispatch: Dispatch,
    running: Arc<AtomicBool>,
}

impl Loop {
    fn run(self) {
        let mut events = vec![EpollEvent::default(); self.fds.len() + 1];
        while self.running.load(Ordering::Acquire) {
            let n = match self
                .epoll
                .wait(EVENT_POLL_TIMEOUT.as_millis() as i32, &mut events)
            {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("epoll_wait: {e}");
                    std::thread::sleep(EVENT_POLL_TIMEOUT);
                    continue;
                }
            };
            for e in &events[..n] {
                let data = e.data();
                if data == u64::MAX {
                    let _ = self.stop.read();
                    continue;
                }
                self.vector(data);
            }
        }
    }

    /// MSI-X vector `v` fired: drain every EQ on it.
    fn vector(&self, v: u64) {
        let Some(fd) = self.fds.get(v as usize) else {
            return;
        };
        // Clear the eventfd before draining, so an interrupt raised
        // while draining is not lost.
        if let (Ok(k), Some(c)) = (fd.read(), self.irqs.get(v as usize)) {
            c.counted.fetch_add(k, Ordering::Relaxed);
        }
        let list: Vec<Arc<Eq>> = self
            .eqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|q| u64::from(q.vector) == v)
            .cloned()
            .collect();
        for q in list {
            if let Err(err) = q.drain(|eqe| self.dispatch.eqe(eqe)) {
                tracing::error!("draining EQ {}: {err}", q.eqn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_logic_on_a_dma_buffer() {
        let log = 2u32; // 4 entries
        let buf = vfio::DmaBuffer::new(4096).unwrap();
        init_owner(&buf, 0, 4).unwrap();
        // A new EQ: nothing for software.
        assert!(next_eqe(&buf, 0, 0, log).unwrap().is_none());
        // The device writes entries 0 and 1 with owner 0 (first pass).
        for i in 0..2 {
            let mut e = [0u8; ev::EQE_SIZE];
            let mut v = Eqe::new_unchecked(&mut e[..]);
            v.set_event_type(EventType::PortChange.to_raw())
                .set_owner(false);
            v.event_data_mut().into_inner()[0] = i as u8;
            buf.write(i * ev::EQE_SIZE, &e).unwrap();
        }
        let e = next_eqe(&buf, 0, 0, log).unwrap().unwrap();
        assert_eq!(AsyncEvent::from_eqe(&e).event_type, EventType::PortChange);
        let e = next_eqe(&buf, 0, 1, log).unwrap().unwrap();
        assert_eq!(AsyncEvent::from_eqe(&e).data[0], 1);
        assert!(next_eqe(&buf, 0, 2, log).unwrap().is_none());
        // Second pass: owner 1 belongs to software at ci 4..8.
        assert!(next_eqe(&buf, 0, 4, log).unwrap().is_none()); // entry 0 still owner 0
        buf.write(ev::EQE_OWNER_OFFSET, &[ev::EQE_OWNER_MASK])
            .unwrap();
        assert!(next_eqe(&buf, 0, 4, log).unwrap().is_some());
        assert!(eqe_is_sw_owned(0, 3, log));
        assert!(!eqe_is_sw_owned(1, 3, log));
        assert!(eqe_is_sw_owned(1, 7, log));
    }

    #[test]
    fn comp_vectors_as_linux_counts_them() {
        // ConnectX-4 Lx: 64 MSI-X vectors, 256 EQs, one port.
        assert_eq!(comp_vector_plan(64, 256, 2, 1, None).unwrap(), (2, 3));
        assert_eq!(comp_vector_plan(64, 256, 128, 1, None).unwrap(), (63, 64));
        assert_eq!(comp_vector_plan(64, 256, 2, 1, Some(8)).unwrap(), (8, 9));
        assert_eq!(
            comp_vector_plan(64, 256, 2, 1, Some(1000)).unwrap(),
            (63, 64)
        );
        // Two ports: one vector per CPU and port.
        assert_eq!(comp_vector_plan(64, 256, 4, 2, None).unwrap(), (8, 9));
        // EQs bound it (less the two control EQs).
        assert_eq!(comp_vector_plan(64, 6, 16, 1, None).unwrap(), (4, 5));
        assert_eq!(
            comp_vector_plan(1024, 4096, 1024, 1, None).unwrap(),
            (254, 255)
        );
        // One MSI-X vector: one completion EQ sharing it.
        assert_eq!(comp_vector_plan(1, 256, 8, 1, None).unwrap(), (1, 1));
        assert_eq!(comp_msix_vector(0, 1), CTRL_VECTOR);
        assert_eq!(comp_msix_vector(3, 9), 4);
        // Refusals, by name.
        assert!(matches!(
            comp_vector_plan(64, 256, 2, 1, Some(0)),
            Err(Error::Invalid(m)) if m.contains("num_comp_vectors")
        ));
        assert!(matches!(
            comp_vector_plan(0, 256, 2, 1, None),
            Err(Error::NotSupported("MSI-X"))
        ));
        assert!(matches!(
            comp_vector_plan(64, 2, 2, 1, None),
            Err(Error::NotSupported(m)) if m.contains("max EQs")
        ));
    }

    #[test]
    fn async_mask_has_page_requests_not_cmd() {
        let m = async_event_mask(false, false, false);
        assert_ne!(m & (1 << 0x0b), 0);
        assert_ne!(m & (1 << 0x09), 0);
        assert_eq!(m & (1 << 0x0a), 0);
        assert_eq!(CMD_EQ_NENT, 256);
    }
}
