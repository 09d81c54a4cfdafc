//! A software ConnectX (mlx5) PCI function: config space, BAR0 (the
//! initialization segment, the MSI-X table and UAR pages), and the firmware
//! behind the command queue, for bring-up.
//!
//! The model sees only what silicon sees (config-space accesses, BAR stores,
//! DMA to IOVAs the driver mapped) and answers only through what silicon
//! writes: command outputs and EQEs by DMA, MSI-X vectors through eventfds.
//!
//! # Shape
//!
//! - [`config`]: PCI config space (ids per [`Profile`], 64-bit BAR0 with
//!   the sizing protocol, PCIe and MSI-X capabilities, FLR).
//! - [`initseg`]: BAR0 layout: the initialization segment, the MSI-X table
//!   and PBA, UAR pages.
//! - `cmdq`: the command engine (entry and mailbox checks, delivery status).
//! - `fw`: firmware, one file per mechanism (HCA state, ISSI, pages, caps,
//!   registers, UARs, EQs, vports, adapter).
//! - [`faults`]: fault injection.
//!
//! A worker thread notices the driver's stores by polling BAR0 (the driver
//! maps it as shared memory): the command doorbell, the command-queue
//! address, the EQ doorbells of UAR pages. It spins for a while after
//! activity and then backs off to sleeps of [`IDLE_SLEEP`].
//!
//! # Shared-memory doorbells
//!
//! A doorbell written into shared memory can be overwritten by the next one
//! before the worker sees it. The command doorbell (0x18) is treated as
//! write-1-to-ring: the worker reads it, clears it and ORs it into its
//! pending set; and once any doorbell has been seen, a slot whose entry has
//! ownership = HW is executed even if its doorbell bit was lost. Command
//! doorbells that arrive as trapped writes (UML's virt-pci) are ORed into
//! a pending mask instead, none is lost, and only rung slots run: Linux
//! sets an entry's ownership before it marks the command pending and rings. EQ
//! doorbells carry absolute consumer indexes: the worker acts on every change
//! of the last value seen per UAR doorbell; a write that repeats the
//! previous value exactly is idempotent and ignored.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::too_many_lines)]
// at most 120 lines: clippy.toml
// The module docs explain each mechanism by naming the private items that
// carry it out; `cargo doc --document-private-items -p mlx5-emu` renders
// those links, a plain `cargo doc` shows them as text.
#![allow(rustdoc::private_intra_doc_links)]

mod cmdq;
pub mod config;
pub mod fabric;
pub mod faults;
mod fw;
pub mod initseg;
mod profile;
pub mod transport;
pub mod vsc;
pub mod wire;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use vfio::clock::SharedClock;
use vfio::emulated::{Bus, DeviceModel, EmulatedFunction};
use vfio::{DmaBuffer, IrqKind, RegionInfo};

pub use fabric::Fabric;
pub use faults::Faults;
pub use fw::uctx::synd as devx_synd;
pub use fw::{HcaState, PortState};
pub use profile::{cap_type, CapPages, Profile};

/// The longest the worker sleeps when idle.
pub const IDLE_SLEEP: Duration = Duration::from_micros(50);
/// How often firmware is polled while the data path is busy.
pub const FW_POLL_WHILE_BUSY: Duration = Duration::from_micros(20);
/// How long the worker keeps spinning after the last activity.
pub const SPIN_AFTER_ACTIVITY: Duration = Duration::from_millis(2);
/// While spinning, the worker yields its CPU once every this many empty
/// passes: the driver's next doorbell usually comes within a few passes,
/// and a yield on a busy machine can cost a whole time slice.
pub const SPIN_PASSES_PER_YIELD: u32 = 8;
/// The MAC of a function built with the default configuration (a
/// Mellanox OUI); [`Fabric::cabled`] numbers its functions from it.
pub const DEFAULT_MAC: u64 = 0x248a_07a0_0001;
/// How many trapped EQ doorbell writes wait for the worker at most.
pub const TRAPPED_DOORBELLS_MAX: usize = 4096;
/// How many commands the command log keeps (oldest dropped first). Linux's
/// mlx5_ib fills its mkey cache with about 4000 CREATE_MKEYs at probe (and
/// destroys them at remove): a whole probe-and-remove run fits.
pub const CMD_LOG_CAPACITY: usize = 16384;

/// How the function is built.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Which card.
    pub profile: Profile,
    /// How long `initializing` (iseg 0x1FC bit 31) stays set after power-on or FLR.
    pub fw_start: Duration,
    /// Advertised command execution timeout (iseg 0xFF8), in milliseconds.
    pub cmd_exec_timeout_ms: u32,
    /// Advertised command-queue init timeout (iseg 0xFFC), in milliseconds.
    pub cmd_init_timeout_ms: u32,
    /// Replaces command outputs after the model executed them (see
    /// [`OutputOverride`]); `None`: the driver gets the model's outputs.
    pub output_override: Option<Arc<dyn OutputOverride>>,
    /// The port's MAC address (QUERY_NIC_VPORT_CONTEXT permanent_address).
    pub mac: u64,
    /// The clock firmware delays (`fw_start`), the internal timer, ACK
    /// timeouts and RNR retries are measured on. Default: the monotonic
    /// clock; tests hand a [`vfio::clock::ManualClock`] (the driver's, so
    /// both see one time) and move it themselves. The worker's polling
    /// pace and the health counter's heartbeat stay on real time: they say
    /// when the model looks and that it runs, and measure nothing.
    pub clock: SharedClock,
    /// Serve the init-segment page and the first UAR page (the one the
    /// first ALLOC_UAR gets: Linux's `dev->priv.uar`, where mlx5_core rings
    /// every EQ's doorbell, offset 0x40) trapped instead of mapped, so every
    /// write to the command doorbell and to the EQ doorbells is seen, as
    /// silicon sees every posted write; the other UAR pages (data-path
    /// doorbells) stay mapped. For clients that trap what is not mapped
    /// (QEMU); off by default because our own vfio-user client maps only
    /// the sparse areas and cannot reach a trapped page through `Mmio`.
    pub trap_control_pages: bool,
}

/// A hook on the command engine: after the model executed a delivered
/// command (so its state, pages, EQs, UARs, moved as the command says) and
/// before the output is written back, [`OutputOverride::answer`] may
/// replace the output the driver gets. Used to replay what real firmware
/// answered (the `tests` crate's trace replay) while the model keeps the
/// device alive underneath.
///
/// Commands failed at delivery (bad descriptor, lengths, mailboxes) and
/// injected faults ([`Faults`]) do not reach the hook.
pub trait OutputOverride: Send + Sync {
    /// `opcode` and `op_mod` of the command, its whole `input` (inline bytes
    /// and mailbox data, `inlen` bytes) and the output the model produced
    /// (a failure is its 16-byte status/syndrome output). `Some(out)`
    /// replaces the model's output; it is cut or zero-padded to the
    /// driver's `outlen`. `None` keeps the model's.
    fn answer(
        &self,
        opcode: u16,
        op_mod: u16,
        input: &[u8],
        model_output: &[u8],
    ) -> Option<Vec<u8>>;
}

impl std::fmt::Debug for dyn OutputOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputOverride")
    }
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            profile: Profile::ConnectX4Lx,
            fw_start: Duration::from_millis(2),
            cmd_exec_timeout_ms: 60_000,
            cmd_init_timeout_ms: 2_000,
            output_override: None,
            mac: DEFAULT_MAC,
            clock: vfio::clock::system(),
            trap_control_pages: false,
        }
    }
}

impl DeviceConfig {
    /// The default configuration for `profile`.
    pub fn for_profile(profile: Profile) -> Self {
        Self {
            profile,
            ..Self::default()
        }
    }
}

/// A function's data-path counts since it was made, its resets
/// included ([`Stats::lifetime`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifetime {
    /// Packets sent.
    pub packets_sent: u64,
    /// Packets received.
    pub packets_received: u64,
    /// CQEs written.
    pub cqes: u64,
    /// CQEs written in compressed sessions.
    pub cqes_compressed: u64,
    /// Compressed sessions written.
    pub compressed_sessions: u64,
    /// Error CQEs written.
    pub error_cqes: u64,
    /// Packets dropped.
    pub dropped: u64,
}

/// Counters for leak checks and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Pages the driver gave firmware and has not taken back.
    pub pages_held: u64,
    /// EQs alive.
    pub eqs: usize,
    /// UARs allocated.
    pub uars: usize,
    /// Commands executed (delivered to firmware), since power-on.
    pub commands: u64,
    /// Commands answered with a delivery-status error.
    pub delivery_errors: u64,
    /// EQEs written.
    pub eqes: u64,
    /// MSI-X messages sent.
    pub interrupts: u64,
    /// EQ overruns (an event found its EQ full).
    pub eq_overruns: u64,
    /// DMA accesses that faulted (unmapped IOVA).
    pub dma_faults: u64,
    /// HCA state.
    pub hca_state: HcaState,
    /// Function-level resets so far.
    pub resets: u64,
    /// Protection domains allocated.
    pub pds: usize,
    /// Transport domains allocated.
    pub tds: usize,
    /// XRC domains allocated.
    pub xrcds: usize,
    /// Q counter sets allocated.
    pub q_counters: usize,
    /// Memory keys alive.
    pub mkeys: usize,
    /// CQs alive.
    pub cqs: usize,
    /// QPs alive.
    pub qps: usize,
    /// SRQs alive.
    pub srqs: usize,
    /// Flow tables alive.
    pub flow_tables: usize,
    /// Flow groups alive.
    pub flow_groups: usize,
    /// Flow table entries alive.
    pub ftes: usize,
    /// Flow counters alive (every counter of every bulk).
    pub flow_counters: usize,
    /// Objects the driver left alive at TEARDOWN_HCA (or a fast teardown),
    /// which firmware then dropped: leaks, since power-on.
    pub leaked_at_teardown: u64,
    /// Packets sent on the port.
    pub packets_sent: u64,
    /// Packets that reached the port.
    pub packets_received: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Messages (send WQEs) completed by the requester.
    pub messages_sent: u64,
    /// Messages completed by the responder.
    pub messages_received: u64,
    /// CQEs written.
    pub cqes: u64,
    /// Error CQEs written (flushes excluded).
    pub error_cqes: u64,
    /// WQEs resent (RNR or timeout).
    pub retries: u64,
    /// Of the requester's go-backs, those its local ACK timeout started
    /// (measured on the model's clock; the rest came from NAKs or a
    /// link's loss notice).
    pub ack_timeouts: u64,
    /// RNR NAKs (sent or received by this function's QPs).
    pub rnr_naks: u64,
    /// NAKs received.
    pub naks: u64,
    /// Plain ACKs received (coalesced: one may complete many messages).
    pub acks: u64,
    /// Packets dropped (no QP, wrong state, Q_Key, lost on the fabric).
    pub dropped: u64,
    /// Send and CQ doorbells noticed.
    pub doorbells: u64,
    /// CQEs written in compressed sessions (`cqe_comp_en`).
    pub cqes_compressed: u64,
    /// Compressed sessions written (title and mini CQE arrays).
    pub compressed_sessions: u64,
    /// Data-path counts over the function's life, across its resets (the
    /// counts above restart at each; a guest's shutdown resets its
    /// functions).
    pub lifetime: Lifetime,
    /// DC targets alive.
    pub dcts: usize,
    /// DC connections open at this function's DCTs (one per connected DCI).
    pub dc_connections: usize,
    /// Bytes the model holds for its DCTs and their open connections.
    pub dc_bytes: usize,
    /// Bytes of the model's QP state (requester and responder, the queues
    /// themselves being the driver's memory).
    pub qp_state_bytes: usize,
}

/// Everything the model keeps that a client can change, as one comparable
/// value: after a reset (FLR, or a vfio-user client hanging up) it equals
/// the value right after power-on ([`Device::power_on_state`]).
///
/// Left out, with reasons: what time alone moves (the health counter, the
/// `initializing` bit, the HCA clock), the reset count, the command log
/// (a diagnostic record since the model was built), the fault-injection
/// settings and the fabric cabling (the operator's, not a client's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerOnState {
    /// Config space bytes and the vendor-specific gateway.
    pub config_space: String,
    /// Every non-zero 32-bit word of BAR0 as `(offset, value)`, the health
    /// counter and the internal timer left out and `initializing` masked.
    pub bar0: Vec<(usize, u32)>,
    /// Firmware state (HCA, pages, EQs, UARs, steering, port, vport).
    pub firmware: String,
    /// Data-path state (objects, GIDs, pending events, counters).
    pub data_path: String,
    /// Trapped EQ doorbells waiting, the trapped command doorbell bits, and
    /// whether the command doorbell arrived trapped.
    pub trapped: (Vec<(u64, u32)>, u32, bool),
    /// The counters, `resets` zeroed.
    pub stats: Stats,
}

/// One executed command, as the command log keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmdLogEntry {
    /// Command slot.
    pub slot: u8,
    /// Opcode (0 if the input could not be read).
    pub opcode: u16,
    /// op_mod.
    pub op_mod: u16,
    /// Delivery status written into `status_own` (0 = delivered).
    pub delivery: u8,
    /// Outbox status.
    pub status: u8,
    /// Outbox syndrome.
    pub syndrome: u32,
}

/// Everything the worker and the trapped accesses share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) cfg: DeviceConfig,
    pub(crate) bus: Bus,
    pub(crate) bar: Arc<DmaBuffer>,
    pub(crate) pci: Mutex<config::ConfigSpace>,
    pub(crate) fw: Mutex<fw::Firmware>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) stats: Mutex<Stats>,
    pub(crate) log: Mutex<VecDeque<CmdLogEntry>>,
    pub(crate) rdma: Arc<transport::Rdma>,
    /// EQ doorbell writes that reached the device as trapped accesses
    /// (vhost-user, vfio-user REGION_WRITE): `(BAR offset, value)`, each
    /// acted on exactly once, in order, even when it repeats the register's
    /// previous value or another EQ's write to the same register follows
    /// before the worker looks.
    pub(crate) trapped_doorbells: Mutex<Vec<(u64, u32)>>,
    /// Command doorbell bits written as trapped accesses, not yet taken by
    /// the worker (each write ORs in; none is lost).
    pub(crate) trapped_cmd_doorbell: AtomicU32,
    /// The command doorbell has arrived as a trapped access: the register's
    /// copy in shared memory is then stale and no doorbell can be lost.
    pub(crate) cmd_doorbell_trapped: AtomicBool,
    /// The MEMIC operation windows of BAR0 (fw/memic_op.rs), trapped.
    pub(crate) memic_ops: Option<(u64, u64)>,
    /// Worker passes so far (Device::worker_passes).
    passes: AtomicU64,
    stop: AtomicBool,
    worker: Mutex<Option<Thread>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    pub(crate) fn stats(&self) -> MutexGuard<'_, Stats> {
        lock(&self.stats)
    }

    pub(crate) fn wake(&self) {
        if let Some(t) = lock(&self.worker).as_ref() {
            t.unpark();
        }
    }

    /// Sends MSI-X `vector` if the function may: bus master, MSI-X enabled,
    /// function and vector unmasked; otherwise marks it pending in the PBA.
    pub(crate) fn msix_signal(&self, vector: u32) {
        let pci = lock(&self.pci);
        if pci.msix_deliverable(&self.bar, vector) {
            drop(pci);
            if self.bus.irqs.signal(IrqKind::MsiX, vector) {
                self.stats().interrupts += 1;
            }
        } else {
            initseg::set_pba(&self.bar, vector, true);
        }
    }

    /// Delivers every pending vector that became deliverable.
    pub(crate) fn msix_flush_pending(&self) {
        let count = self.cfg.profile.msix_vectors();
        for v in 0..count {
            if initseg::pba(&self.bar, v) {
                let ok = lock(&self.pci).msix_deliverable(&self.bar, v);
                if ok {
                    initseg::set_pba(&self.bar, v, false);
                    if self.bus.irqs.signal(IrqKind::MsiX, v) {
                        self.stats().interrupts += 1;
                    }
                }
            }
        }
    }

    pub(crate) fn bus_master(&self) -> bool {
        lock(&self.pci).bus_master()
    }

    /// Function-level reset: power-on state, firmware forgets everything.
    pub(crate) fn flr(&self) {
        tracing::info!(dev = %self.cfg.profile.name(), "function-level reset");
        let mut fw = lock(&self.fw);
        lock(&self.pci).reset_function();
        fw.power_on(&self.bar, &self.cfg);
        self.rdma.reset();
        *lock(&self.rdma.timer) = fw.timer();
        self.rdma
            .host_endian_atomics
            .store(false, Ordering::Release);
        // How the previous owner rang the command doorbell is its own: the
        // next one may map the BAR and ring through shared memory.
        lock(&self.trapped_doorbells).clear();
        self.trapped_cmd_doorbell.store(0, Ordering::Release);
        self.cmd_doorbell_trapped.store(false, Ordering::Release);
        let resets = self.stats().resets + 1;
        *self.stats() = Stats {
            resets,
            ..Stats::default()
        };
        drop(fw);
        self.wake();
    }

    /// One pass of the worker; true if it found something to do. While
    /// the data path keeps finding work, firmware (commands, EQ doorbells)
    /// is polled only every [`FW_POLL_WHILE_BUSY`] (`pace`: the data path's
    /// last result and the last firmware poll).
    fn poll_once(&self, pace: &mut (bool, Instant)) -> bool {
        if self.stop.load(Ordering::Acquire) {
            return false;
        }
        let mut busy = false;
        if !pace.0 || pace.1.elapsed() >= FW_POLL_WHILE_BUSY {
            busy = lock(&self.fw).poll(self);
            pace.1 = Instant::now();
        }
        if !self.bus_master() {
            pace.0 = false;
            return busy;
        }
        let dp = self.rdma.poll(&self.bar);
        pace.0 = dp;
        if !lock(&self.rdma.events).is_empty() {
            lock(&self.fw).poll(self);
            return true;
        }
        busy || dp
    }
}

/// The ConnectX function (implements [`DeviceModel`]).
#[derive(Debug)]
pub struct Device {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The firmware heartbeat's thread ([`fw::Firmware::heartbeat`]).
    health: Mutex<Option<JoinHandle<()>>>,
}

impl Device {
    /// A function on `bus`, built as `cfg` says; its worker starts now.
    pub fn new(cfg: DeviceConfig, bus: Bus) -> Self {
        let profile = cfg.profile;
        let bar = match DmaBuffer::new(profile.bar0_size() as usize) {
            Ok(b) => b,
            Err(e) => {
                // A memfd the size of the BAR is all the model needs from
                // the OS; without it there is no device to model.
                tracing::error!(error = %e, "cannot allocate BAR0 memory; using one page");
                #[allow(clippy::expect_used)]
                DmaBuffer::new(4096).expect("one page of memfd")
            }
        };
        let fw = fw::Firmware::new(&cfg);
        // Device memory (MEMIC) is BAR0's own: the DMA engine reaches it
        // at DEVMEM_IOVA + its BAR offset.
        if let Some((start, len)) = fw.memic_window() {
            if let Err(e) = bus.dma.map_device_memory(
                fw::memic::DEVMEM_IOVA + start,
                len,
                bar.file().clone(),
                start,
            ) {
                tracing::error!(error = %e, "MEMIC not reachable by DMA");
            }
        }
        let rdma = transport::Rdma::new(
            bus.dma.clone(),
            fw::RESD_LKEY,
            cfg.clock.clone(),
            cfg.trap_control_pages.then_some(initseg::FIRST_UAR),
            transport::UmrCaps::of(&profile.caps()),
        );
        rdma.eth_rx
            .local_lb
            .permanent
            .store(cfg.mac, std::sync::atomic::Ordering::Relaxed);
        let memic_ops = fw.memic_op_windows();
        let inner = Arc::new(Inner {
            memic_ops,
            rdma,
            pci: Mutex::new(config::ConfigSpace::new(profile)),
            fw: Mutex::new(fw),
            faults: Arc::new(Faults::default()),
            stats: Mutex::new(Stats::default()),
            log: Mutex::new(VecDeque::new()),
            trapped_doorbells: Mutex::new(Vec::new()),
            trapped_cmd_doorbell: AtomicU32::new(0),
            cmd_doorbell_trapped: AtomicBool::new(false),
            passes: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            worker: Mutex::new(None),
            bar,
            bus,
            cfg,
        });
        {
            let mut fw = lock(&inner.fw);
            fw.power_on(&inner.bar, &inner.cfg);
            *lock(&inner.rdma.timer) = fw.timer();
        }
        let dev = Self {
            inner,
            thread: Mutex::new(None),
            health: Mutex::new(None),
        };
        dev.start();
        dev
    }

    fn start(&self) {
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("mlx5-emu-{}", self.inner.cfg.profile.short()))
            .spawn(move || worker(inner));
        match spawned {
            Ok(h) => {
                *lock(&self.inner.worker) = Some(h.thread().clone());
                *lock(&self.inner.rdma.worker) = Some(h.thread().clone());
                *lock(&self.thread) = Some(h);
            }
            Err(e) => tracing::error!(error = %e, "cannot start the device worker"),
        }
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!(
                "mlx5-emu-health-{}",
                self.inner.cfg.profile.short()
            ))
            .spawn(move || health_thread(&inner));
        match spawned {
            Ok(h) => *lock(&self.health) = Some(h),
            Err(e) => tracing::error!(error = %e, "cannot start the firmware heartbeat"),
        }
    }

    /// The configuration the function was built with.
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.cfg
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> &Arc<Faults> {
        &self.inner.faults
    }

    /// A snapshot of the vendor-specific gateway (config space).
    pub fn vsc_gateway(&self) -> vsc::Gateway {
        lock(&self.inner.pci).vsc().clone()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let fw = lock(&self.inner.fw);
        let mut s = self.inner.stats().clone();
        fw.fill_stats(&mut s);
        drop(fw);
        let r = &self.inner.rdma;
        s.pds = lock(&r.pds).len();
        s.tds = lock(&r.tds).len();
        s.xrcds = lock(&r.xrcds).len();
        s.q_counters = lock(&r.q_counters).len();
        s.mkeys = transport::rlock(&r.mkeys).len();
        s.cqs = transport::rlock(&r.cqs).len();
        s.qps = transport::rlock(&r.qps).len();
        s.srqs = transport::rlock(&r.srqs).len();
        let c = &r.counters;
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        s.packets_sent = g(&c.packets_sent);
        s.packets_received = g(&c.packets_received);
        s.bytes_sent = g(&c.bytes_sent);
        s.messages_sent = g(&c.messages_sent);
        s.messages_received = g(&c.messages_received);
        s.cqes = g(&c.cqes);
        s.error_cqes = g(&c.error_cqes);
        s.retries = g(&c.retries);
        s.ack_timeouts = g(&c.ack_timeouts);
        s.rnr_naks = g(&c.rnr_naks);
        s.naks = g(&c.naks);
        s.acks = g(&c.acks);
        s.dropped = g(&c.dropped);
        s.doorbells = g(&c.doorbells);
        s.cqes_compressed = g(&c.cqes_compressed);
        s.compressed_sessions = g(&c.compressed_sessions);
        s.lifetime = Lifetime {
            packets_sent: c.lifetime(&c.packets_sent),
            packets_received: c.lifetime(&c.packets_received),
            cqes: c.lifetime(&c.cqes),
            cqes_compressed: c.lifetime(&c.cqes_compressed),
            compressed_sessions: c.lifetime(&c.compressed_sessions),
            error_cqes: c.lifetime(&c.error_cqes),
            dropped: c.lifetime(&c.dropped),
        };
        s.qp_state_bytes = s.qps * std::mem::size_of::<transport::qp::Qp>();
        for d in transport::rlock(&r.dcts).values() {
            let (dct, conns) = d.footprint();
            s.dcts += 1;
            s.dc_connections += lock(&d.conns).len();
            s.dc_bytes += dct + conns;
        }
        s
    }

    pub(crate) fn rdma(&self) -> &Arc<transport::Rdma> {
        &self.inner.rdma
    }

    /// The commands executed so far (oldest first; at most [`CMD_LOG_CAPACITY`]).
    pub fn command_log(&self) -> Vec<CmdLogEntry> {
        lock(&self.inner.log).iter().copied().collect()
    }

    /// Forgets the command log.
    pub fn clear_command_log(&self) {
        lock(&self.inner.log).clear();
    }

    /// The port as firmware models it.
    pub fn port(&self) -> PortState {
        lock(&self.inner.fw).port
    }

    /// How many passes the worker has made over the device (firmware, then
    /// the data path). A test that reads `n` here and waits for `n + 2`
    /// knows one whole pass began after it looked: what the model would
    /// have done by then, it has done (firmware is looked at on every pass
    /// while the data path is idle).
    pub fn worker_passes(&self) -> u64 {
        self.inner.passes.load(Ordering::Acquire)
    }

    /// How many sweeps of the doorbell records (the recovery of lost
    /// doorbells) the data path has made: a test that waits for `n + k`
    /// knows `k` sweeps ran after it looked.
    pub fn doorbell_sweeps(&self) -> u64 {
        self.inner.rdma.sweeps()
    }

    /// Whether firmware has raised an injected health failure (the health
    /// buffer and counter show it from then on).
    pub fn firmware_failed(&self) -> bool {
        lock(&self.inner.fw).dead
    }

    /// Firmware asks the driver for `npages` more pages (positive) or wants
    /// to return `-npages` (negative), through a PAGE_REQUEST EQE.
    pub fn request_pages(&self, npages: i32) {
        lock(&self.inner.fw).queue_page_request(npages);
        self.inner.wake();
    }

    /// Everything the model keeps that a client can change (see
    /// [`PowerOnState`]); take it right after power-on and after a reset
    /// and compare.
    pub fn power_on_state(&self) -> PowerOnState {
        let inner = &self.inner;
        let fw = lock(&inner.fw);
        let pci = lock(&inner.pci);
        let config_space = format!("{:?}", *pci);
        drop(pci);
        let firmware = fw.state_summary();
        let mut bar = vec![0u8; inner.bar.len()];
        if let Err(e) = inner.bar.read(0, &mut bar) {
            tracing::error!(error = %e, "cannot read BAR0");
        }
        drop(fw);
        let bar0 = bar
            .chunks_exact(4)
            .enumerate()
            .filter_map(|(i, w)| {
                let off = i * 4;
                let mut v = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
                if [
                    initseg::HEALTH_COUNTER,
                    initseg::INTERNAL_TIMER_H,
                    initseg::INTERNAL_TIMER_L,
                ]
                .contains(&off)
                {
                    v = 0;
                } else if off == initseg::INITIALIZING {
                    v &= !initseg::INITIALIZING_BIT;
                }
                (v != 0).then_some((off, v))
            })
            .collect();
        let trapped = (
            lock(&inner.trapped_doorbells).clone(),
            inner.trapped_cmd_doorbell.load(Ordering::Acquire),
            inner.cmd_doorbell_trapped.load(Ordering::Acquire),
        );
        let mut stats = self.stats();
        stats.resets = 0;
        PowerOnState {
            config_space,
            bar0,
            firmware,
            data_path: inner.rdma.state_summary(),
            trapped,
            stats,
        }
    }

    /// The BAR0 memory (as the driver maps it), for tests.
    pub fn bar0(&self) -> &Arc<DmaBuffer> {
        &self.inner.bar
    }
}

fn worker(inner: Arc<Inner>) {
    let mut last_activity = Instant::now();
    let mut pace = (false, last_activity);
    let mut empty: u32 = 0;
    while !inner.stop.load(Ordering::Acquire) {
        let busy = inner.poll_once(&mut pace);
        inner.passes.fetch_add(1, Ordering::Release);
        if busy {
            last_activity = Instant::now();
            empty = 0;
            continue;
        }
        empty = empty.wrapping_add(1);
        if last_activity.elapsed() < SPIN_AFTER_ACTIVITY {
            std::hint::spin_loop();
            if empty % SPIN_PASSES_PER_YIELD == 0 {
                std::thread::yield_now();
            }
        } else {
            inner.rdma.note_idle();
            std::thread::park_timeout(IDLE_SLEEP);
        }
    }
    tracing::debug!("device worker stopped");
}

/// The firmware's heartbeat, beside the worker: a beat every
/// [`fw::HEALTH_TICK`] of real time, whatever the data path is doing.
fn health_thread(inner: &Inner) {
    while !inner.stop.load(Ordering::Acquire) {
        std::thread::park_timeout(fw::HEALTH_TICK);
        lock(&inner.fw).heartbeat(inner);
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl DeviceModel for Device {
    fn name(&self) -> String {
        format!("emu:{}", self.inner.cfg.profile.short())
    }

    fn config_read(&self, offset: u64, buf: &mut [u8]) {
        lock(&self.inner.pci).read(offset, buf);
    }

    fn config_write(&self, offset: u64, data: &[u8]) {
        let effect = lock(&self.inner.pci).write(offset, data);
        if effect.flr {
            self.inner.flr();
        }
        if effect.msix_changed {
            self.inner.msix_flush_pending();
        }
        self.inner.wake();
    }

    fn region_info(&self, index: u32) -> Option<RegionInfo> {
        (index == 0).then(|| {
            let mut info =
                initseg::region_info(self.inner.cfg.profile, self.inner.cfg.trap_control_pages);
            if let Some(hole) = self.inner.memic_ops {
                info.mmap_areas = fw::memic_op::carve(&info.mmap_areas, hole);
            }
            info
        })
    }

    fn region_memory(&self, index: u32) -> Option<Arc<DmaBuffer>> {
        (index == 0).then(|| self.inner.bar.clone())
    }

    fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) {
        buf.fill(0xff);
        if index == 0 && self.inner.in_memic_op_windows(offset) {
            self.inner.memic_op_load(offset, buf);
            return;
        }
        if index == 0 && self.inner.bar.read(offset as usize, buf).is_err() {
            buf.fill(0xff);
        }
    }

    fn region_write(&self, index: u32, offset: u64, data: &[u8]) {
        if index != 0 {
            return;
        }
        if self.inner.in_memic_op_windows(offset) {
            self.inner.memic_op_store(offset, data);
            return;
        }
        if offset == initseg::CMD_DBELL as u64 && data.len() == 4 {
            // Trapped mode before the shared copy changes: a worker pass
            // between the two would otherwise take the copy's bit for a
            // shared-memory doorbell and run every slot handed to HW,
            // rung or not.
            self.inner
                .cmd_doorbell_trapped
                .store(true, Ordering::Release);
        }
        if let Err(e) = self.inner.bar.write(offset as usize, data) {
            tracing::warn!(offset, error = %e, "BAR0 write out of range");
            return;
        }
        if initseg::in_msix(self.inner.cfg.profile, offset, data.len()) {
            self.inner.msix_flush_pending();
        }
        if self.inner.rdma.trapped_write(offset, data) {
            return;
        }
        if let Ok(word) = <[u8; 4]>::try_from(data) {
            if offset == initseg::CMD_DBELL as u64 {
                self.inner
                    .trapped_cmd_doorbell
                    .fetch_or(u32::from_be_bytes(word), Ordering::AcqRel);
            }
            if offset >= u64::from(initseg::FIRST_UAR) << 12 {
                let mut q = lock(&self.inner.trapped_doorbells);
                // Bounded while firmware is not reading them (HCA disabled,
                // health failed): then only the register's last value counts.
                if q.len() < TRAPPED_DOORBELLS_MAX {
                    q.push((offset, u32::from_be_bytes(word)));
                }
            }
        }
        self.inner.wake();
    }

    fn irq_count(&self, kind: IrqKind) -> u32 {
        match kind {
            IrqKind::MsiX => self.inner.cfg.profile.msix_vectors(),
            _ => 0,
        }
    }

    fn reset(&self) {
        self.inner.flr();
    }

    fn shutdown(&self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake();
        let handle = lock(&self.thread).take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() && h.join().is_err() {
                tracing::error!("device worker panicked");
            }
        }
        let handle = lock(&self.health).take();
        if let Some(h) = handle {
            h.thread().unpark();
            if h.thread().id() != std::thread::current().id() && h.join().is_err() {
                tracing::error!("firmware heartbeat panicked");
            }
        }
    }
}

/// A ConnectX function of `profile` with the default configuration.
pub fn emulated(profile: Profile) -> EmulatedFunction<Device> {
    emulated_with(DeviceConfig::for_profile(profile))
}

/// A ConnectX function built as `config` says.
pub fn emulated_with(config: DeviceConfig) -> EmulatedFunction<Device> {
    EmulatedFunction::new(move |bus| Device::new(config, bus))
}

#[cfg(test)]
mod tests;
