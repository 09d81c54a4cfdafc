//! The data path: what the HCA executes between doorbells and completions.
//!
//! [`Rdma`] is one function's data-path state, shared by its firmware
//! (which creates and modifies objects under the firmware lock), its
//! worker (which notices doorbells and executes send queues) and the
//! workers of other functions (which deliver packets to its QPs). Object
//! tables map PRM numbers to `Arc`s; each QP has two locks, one for the
//! requester (send queue) and one for the responder (receive side), and a
//! requester may take a responder lock of any QP but never the reverse, so
//! two functions sending to each other cannot deadlock. CQs have a leaf
//! lock. No lock is held across a command.
//!
//! A packet goes from requester to responder as a function call on the
//! requester's worker ([`crate::fabric`]): the transport headers are
//! emitted as wire bytes ([`packet`]) and parsed by the responder, the
//! payload is passed as IOVA extents of the sender's memory and copied
//! once into the receiver's. Responses (ACK, NAK, RNR NAK, read responses,
//! atomic acknowledgements) come back the same way. So an RC message
//! completes in one pass, in order; a NAK, an RNR NAK or a packet nobody
//! answered leaves the WQE at the head of the send queue with a timer
//! (the RNR timer, or the ACK timeout) and its retry counter.
//!
//! Doorbells: the worker reads the send doorbells (UAR 0x800-0xf00, the
//! first 8 bytes of the last WQE's control segment: its index and QP
//! number) and CQ arm doorbells (UAR 0x20) of every UAR page, and acts on
//! every change; because a store can overwrite another between two polls,
//! the QP's doorbell record (the producer counter) is the truth, and every
//! [`SWEEP_INTERVAL`] all doorbell records are read again.

pub(crate) mod cq;
pub(crate) mod mem;
pub mod packet;
pub(crate) mod qp;
pub(crate) mod requester;
pub(crate) mod responder;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use vfio::emulated::DmaSpace;
use vfio::DmaBuffer;

pub(crate) use cq::Cq;
pub(crate) use mem::Mkey;
pub(crate) use qp::{Qp, Srq};

use crate::lock;

/// How often every doorbell record is read again (lost doorbells).
pub const SWEEP_INTERVAL: Duration = Duration::from_micros(200);
/// GID table entries per port.
pub const GID_TABLE_LEN: usize = 16;

/// One GID table entry (SET_ROCE_ADDRESS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GidEntry {
    /// The GID (an IPv4-mapped GID for IPv4).
    pub gid: [u8; 16],
    /// Source MAC.
    pub mac: [u8; 6],
    /// roce_version (2 = RoCEv2).
    pub version: u8,
    /// roce_l3_type (0 IPv4, 1 IPv6).
    pub l3_type: u8,
    /// VLAN id, if any.
    pub vlan: Option<u16>,
}

/// An event for an EQ, queued by the data path and posted by firmware.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingEvent {
    /// The EQ (completion events name it); `None`: the EQ subscribed to `ty`.
    pub eqn: Option<u8>,
    /// Event type.
    pub ty: u8,
    /// Sub type.
    pub sub: u8,
    /// EQE data.
    pub data: [u8; 28],
}

/// Per-function data-path counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub packets_sent: AtomicU64,
    pub packets_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_received: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub cqes: AtomicU64,
    pub error_cqes: AtomicU64,
    pub retries: AtomicU64,
    pub rnr_naks: AtomicU64,
    pub naks: AtomicU64,
    pub dropped: AtomicU64,
    pub doorbells: AtomicU64,
}

/// One function's data-path state.
#[derive(Debug)]
pub(crate) struct Rdma {
    pub me: Weak<Rdma>,
    pub dma: Arc<DmaSpace>,
    pub mkeys: RwLock<HashMap<u32, Arc<Mkey>>>,
    pub cqs: RwLock<HashMap<u32, Arc<Cq>>>,
    pub qps: RwLock<HashMap<u32, Arc<Qp>>>,
    pub srqs: RwLock<HashMap<u32, Arc<Srq>>>,
    pub pds: Mutex<BTreeSet<u32>>,
    pub tds: Mutex<BTreeSet<u32>>,
    pub gids: RwLock<[Option<GidEntry>; GID_TABLE_LEN]>,
    /// The GSI QP (st QP1), which packets to QP 1 reach.
    pub gsi: RwLock<Option<u32>>,
    /// The fabric the port is cabled to.
    pub fabric: RwLock<Option<Weak<crate::fabric::Wire>>>,
    pub events: Mutex<Vec<PendingEvent>>,
    pub attention: Mutex<BTreeSet<u32>>,
    /// UAR pages to watch: `(uar, send doorbells, CQ doorbell)`.
    pub uars: Mutex<Vec<(u32, bool, bool)>>,
    pub timers: Mutex<HashMap<u32, Instant>>,
    pub counters: Counters,
    pub worker: Mutex<Option<Thread>>,
    /// Reserved lkey (QUERY_SPECIAL_CONTEXTS): physical addressing.
    pub resd_lkey: u32,
    poll: Mutex<PollState>,
}

#[derive(Debug)]
struct PollState {
    last_db: HashMap<(u32, usize), u64>,
    last_sweep: Instant,
}

/// Send doorbell offsets in a UAR page: the two BlueFlame buffers of each
/// of the four bfregs.
const SQ_DOORBELLS: [usize; 8] = [0x800, 0x900, 0xa00, 0xb00, 0xc00, 0xd00, 0xe00, 0xf00];

impl Rdma {
    pub(crate) fn new(dma: Arc<DmaSpace>, resd_lkey: u32) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            dma,
            mkeys: RwLock::new(HashMap::new()),
            cqs: RwLock::new(HashMap::new()),
            qps: RwLock::new(HashMap::new()),
            srqs: RwLock::new(HashMap::new()),
            pds: Mutex::new(BTreeSet::new()),
            tds: Mutex::new(BTreeSet::new()),
            gids: RwLock::new([None; GID_TABLE_LEN]),
            gsi: RwLock::new(None),
            fabric: RwLock::new(None),
            events: Mutex::new(Vec::new()),
            attention: Mutex::new(BTreeSet::new()),
            uars: Mutex::new(Vec::new()),
            timers: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            worker: Mutex::new(None),
            resd_lkey,
            poll: Mutex::new(PollState {
                last_db: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        })
    }

    /// Forgets every object (power-on, FLR, fast teardown).
    pub(crate) fn reset(&self) {
        for qp in wlock(&self.qps).drain() {
            qp.1.destroyed();
        }
        wlock(&self.mkeys).clear();
        wlock(&self.cqs).clear();
        wlock(&self.srqs).clear();
        lock(&self.pds).clear();
        lock(&self.tds).clear();
        *wlock(&self.gids) = [None; GID_TABLE_LEN];
        *wlock(&self.gsi) = None;
        lock(&self.events).clear();
        lock(&self.attention).clear();
        lock(&self.uars).clear();
        lock(&self.timers).clear();
        lock(&self.poll).last_db.clear();
    }

    pub(crate) fn wake(&self) {
        if let Some(t) = lock(&self.worker).as_ref() {
            t.unpark();
        }
    }

    /// Queues an event for firmware to post, and wakes the worker.
    pub(crate) fn event(&self, e: PendingEvent) {
        lock(&self.events).push(e);
        self.wake();
    }

    /// Queues an affiliated QP/SRQ event (eqe_qp_srq).
    pub(crate) fn qp_event(&self, ty: mlx5_hw::event::EventType, qpn: u32, is_srq: bool) {
        let mut data = [0u8; 28];
        data[20] = if is_srq { 1 } else { 0 };
        data[24..28].copy_from_slice(&(qpn & 0xff_ffff).to_be_bytes());
        self.event(PendingEvent {
            eqn: None,
            ty: ty.to_raw(),
            sub: 0,
            data,
        });
    }

    /// A QP wants the worker (error flush, retry timer, doorbell).
    pub(crate) fn attend(&self, qpn: u32) {
        lock(&self.attention).insert(qpn);
        self.wake();
    }

    /// The worker reads the send doorbells (`sq`) or the CQ doorbell
    /// (`!sq`) of UAR page `uar` from now on.
    pub(crate) fn track_uar(&self, uar: u32, sq: bool) {
        let mut u = lock(&self.uars);
        match u.iter_mut().find(|e| e.0 == uar) {
            Some(e) => {
                e.1 |= sq;
                e.2 |= !sq;
            }
            None => u.push((uar, sq, !sq)),
        }
    }

    /// QP `qpn` waits for a timer (RNR, ACK timeout) due at `at`.
    pub(crate) fn timer(&self, qpn: u32, at: Instant) {
        lock(&self.timers).insert(qpn, at);
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<Qp>> {
        rlock(&self.qps).get(&qpn).cloned()
    }

    pub(crate) fn mkey(&self, key: u32) -> Option<Arc<Mkey>> {
        let k = rlock(&self.mkeys).get(&(key >> 8)).cloned()?;
        (k.key == key as u8).then_some(k)
    }

    /// Whether `gid` is in this port's GID table.
    pub(crate) fn has_gid(&self, gid: &[u8; 16]) -> bool {
        rlock(&self.gids).iter().flatten().any(|e| &e.gid == gid)
    }

    /// The function whose port answers to `gid`: this one (loopback) or one
    /// on the fabric.
    pub(crate) fn route(&self, gid: &[u8; 16]) -> Option<Arc<Rdma>> {
        if self.has_gid(gid) {
            return self.me.upgrade();
        }
        let wire = rlock(&self.fabric).as_ref()?.upgrade()?;
        wire.find(gid)
    }

    /// One pass of the data path: doorbells, timers, flushes, the sweep.
    pub(crate) fn poll(&self, bar: &DmaBuffer) -> bool {
        let mut busy = false;
        let mut hint: Vec<u32> = Vec::new();
        let uars = lock(&self.uars).clone();
        let sweep = {
            let mut ps = lock(&self.poll);
            for &(u, sq, cq) in &uars {
                let base = (u as usize) << 12;
                let sqs: &[usize] = if sq { &SQ_DOORBELLS } else { &[] };
                let cqs: &[usize] = if cq {
                    &[mlx5_hw::uar::CQ_DOORBELL]
                } else {
                    &[]
                };
                for &off in sqs.iter().chain(cqs) {
                    let Ok(v) = bar.read_u64_be(base + off) else {
                        continue;
                    };
                    let last = ps.last_db.entry((u, off)).or_insert(0);
                    if *last == v {
                        continue;
                    }
                    *last = v;
                    busy = true;
                    self.counters.doorbells.fetch_add(1, Ordering::Relaxed);
                    if off == mlx5_hw::uar::CQ_DOORBELL {
                        let cqn = (v & 0xff_ffff) as u32;
                        if let Some(cq) = rlock(&self.cqs).get(&cqn).cloned() {
                            cq.arm(self, (v >> 32) as u32);
                        }
                    } else {
                        // ctrl segment: opmod_idx_opcode, qpn_ds.
                        hint.push((v as u32) >> 8);
                    }
                }
            }
            let due = ps.last_sweep.elapsed() >= SWEEP_INTERVAL;
            if due {
                ps.last_sweep = Instant::now();
            }
            due
        };
        let mem = self.dma.memory();
        for qpn in hint {
            if let Some(qp) = self.qp(qpn) {
                busy |= requester::run(self, &qp, &mem);
            }
        }
        let mut attention: Vec<u32> = std::mem::take(&mut *lock(&self.attention))
            .into_iter()
            .collect();
        {
            let mut t = lock(&self.timers);
            if !t.is_empty() {
                let now = Instant::now();
                t.retain(|&q, &mut at| {
                    if at <= now {
                        attention.push(q);
                        false
                    } else {
                        true
                    }
                });
            }
        }
        for qpn in attention {
            if let Some(qp) = self.qp(qpn) {
                busy |= requester::run(self, &qp, &mem);
            }
        }
        if sweep {
            let qps: Vec<Arc<Qp>> = rlock(&self.qps).values().cloned().collect();
            for qp in qps {
                busy |= requester::run(self, &qp, &mem);
            }
            let cqs: Vec<Arc<Cq>> = rlock(&self.cqs).values().cloned().collect();
            for cq in cqs {
                cq.sweep_arm(self, &mem);
            }
        }
        busy
    }
}

pub(crate) fn rlock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn wlock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}
