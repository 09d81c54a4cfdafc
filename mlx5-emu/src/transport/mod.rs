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
//! requester's worker ([`crate::fabric`]): the transport headers go typed
//! (what parsing their emitted bytes, [`packet`], gives; a wire-check
//! fabric emits and parses them), the payload as a slice or IOVA extents
//! of the sender's memory, copied once into the receiver's. Responses
//! (NAK, RNR NAK, read responses, atomic acknowledgements, and the ACK a
//! responder holds back until the requester's burst ends) come back the
//! same way, so a burst of RC messages completes in one pass, in order; a
//! NAK, an RNR NAK or a packet nobody answered leaves the first WQE not
//! acknowledged at the head of the send queue with a timer (the RNR
//! timer, or the ACK timeout) and its retry counter. Caches that last a
//! burst or until an object table changes ([`tables_gen`]) keep lookups
//! off the per-packet path.
//!
//! Doorbells: the worker reads the send doorbells (UAR 0x800-0xf00, the
//! first 8 bytes of the last WQE's control segment: its index and QP
//! number) and CQ arm doorbells (UAR 0x20) of every UAR page, and acts on
//! every change; because a store can overwrite another between two polls,
//! the QP's doorbell record (the producer counter) is the truth, and every
//! [`SWEEP_PASSES`] passes, and on the first pass after the worker slept
//! idle, the doorbell records of the next [`SWEEP_CHUNK`] objects (QPs,
//! Ethernet SQs, CQs, in rotation) are read again: every object's record is
//! read within `ceil(objects / SWEEP_CHUNK)` sweeps, and a pass costs the
//! same with ten objects or twenty thousand. The sweep counts passes, not
//! time, so no clock (real or a test's) decides what it finds.

pub(crate) mod cq;
pub(crate) mod cqe_comp;
pub(crate) mod dc;
pub(crate) mod eth_rx;
pub(crate) mod eth_sq;
pub(crate) mod lro;
pub(crate) mod lso;
pub(crate) mod mem;
pub(crate) mod odp;
pub mod packet;
pub(crate) mod qp;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod rss;
pub(crate) mod steer;
pub(crate) mod umr;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use vfio::clock::{Deadline, SharedClock};

use vfio::emulated::DmaSpace;
use vfio::DmaBuffer;
use zerocopy::FromZeros;

pub(crate) use cq::Cq;
pub(crate) use mem::Mkey;
pub(crate) use qp::{Qp, Srq};

use crate::lock;

/// Passes between two sweeps of the doorbell records (lost doorbells)
/// while the worker is busy or spinning; an idle worker sweeps on the
/// first pass after each sleep.
pub const SWEEP_PASSES: u32 = 256;
/// Objects (QPs, Ethernet SQs, CQs) whose doorbell records one sweep reads;
/// with fewer, every sweep reads them all.
pub const SWEEP_CHUNK: usize = 32;
/// GID table entries per port.
pub const GID_TABLE_LEN: usize = 16;

/// A hasher for object numbers (QPN, CQN, mkey index): the numbers are
/// dense small integers the model itself hands out, so a multiply spreads
/// them well enough, and the data path looks them up on every packet.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NumHasher(u64);

impl Hasher for NumHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A table of objects by number.
pub(crate) type Table<T> = HashMap<u32, Arc<T>, BuildHasherDefault<NumHasher>>;

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
    /// Payload octets received (PMA PortRcvData).
    pub bytes_received: AtomicU64,
    pub cqes: AtomicU64,
    pub error_cqes: AtomicU64,
    pub retries: AtomicU64,
    pub ack_timeouts: AtomicU64,
    pub rnr_naks: AtomicU64,
    pub naks: AtomicU64,
    pub acks: AtomicU64,
    pub dropped: AtomicU64,
    pub doorbells: AtomicU64,
    /// CQEs written in compressed sessions ([`cqe_comp`]).
    pub cqes_compressed: AtomicU64,
    /// Compressed sessions written.
    pub compressed_sessions: AtomicU64,
    /// What each counter of [`Counters::all`] had counted at the resets
    /// so far (a guest's shutdown resets its functions).
    earlier: [AtomicU64; COUNTERS],
}

/// Counters a reset zeroes ([`Counters::all`]).
const COUNTERS: usize = 16;

impl Counters {
    /// The counters a reset zeroes, in [`Counters::earlier`]'s order.
    fn all(&self) -> [&AtomicU64; COUNTERS] {
        [
            &self.packets_sent,
            &self.packets_received,
            &self.messages_sent,
            &self.messages_received,
            &self.bytes_sent,
            &self.cqes,
            &self.error_cqes,
            &self.retries,
            &self.ack_timeouts,
            &self.rnr_naks,
            &self.naks,
            &self.acks,
            &self.dropped,
            &self.doorbells,
            &self.cqes_compressed,
            &self.compressed_sessions,
        ]
    }

    /// Back to zero (power-on, FLR); what they had counted is kept in
    /// [`Counters::earlier`].
    fn reset(&self) {
        for (c, e) in self.all().into_iter().zip(&self.earlier) {
            e.fetch_add(c.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Counter `c` (one of [`Counters::all`]) over the function's life,
    /// across its resets.
    pub(crate) fn lifetime(&self, c: &AtomicU64) -> u64 {
        let now = c.load(Ordering::Relaxed);
        self.all()
            .iter()
            .position(|x| std::ptr::eq(*x, c))
            .map_or(now, |i| now + self.earlier[i].load(Ordering::Relaxed))
    }
}

/// A Q counter set: what QUERY_Q_COUNTER reports for the QPs bound to it
/// (qpc.counter_set_id). The model counts the events its transport knows.
#[derive(Debug, Default)]
pub(crate) struct QCounterSet {
    /// A responder found no receive WQE for an incoming message (it sent an
    /// RNR NAK).
    pub out_of_buffer: AtomicU64,
    /// A requester ran out of RNR retries (the WQE completed in error).
    pub rnr_nak_retry_err: AtomicU64,
}

/// One function's data-path state.
#[derive(Debug)]
pub(crate) struct Rdma {
    pub me: Weak<Rdma>,
    pub dma: Arc<DmaSpace>,
    /// The model's clock (DeviceConfig::clock): ACK timeouts and RNR
    /// retries are due on it. The poll pace (how long a UAR page stays
    /// hot) stays on real time; the sweep counts passes.
    pub clock: SharedClock,
    /// The HCA's free-running clock (the internal timer, in device clock
    /// cycles), as firmware set it at power-on: every CQE carries its
    /// reading (`timestamp_h`/`timestamp_l`).
    pub timer: Mutex<DeviceTimer>,
    pub mkeys: RwLock<Table<Mkey>>,
    pub cqs: RwLock<Table<Cq>>,
    pub qps: RwLock<Table<Qp>>,
    pub srqs: RwLock<Table<Srq>>,
    /// Ethernet send queues (fw/sq.rs, [`eth_sq`]), in the QP number space.
    pub eth_sqs: RwLock<Table<eth_sq::EthSq>>,
    /// DC targets (fw/dct.rs, [`dc`]), in the QP number space.
    pub dcts: RwLock<Table<dc::Dct>>,
    pub pds: Mutex<BTreeSet<u32>>,
    pub tds: Mutex<BTreeSet<u32>>,
    /// XRC domains (fw/xrcd.rs).
    pub xrcds: Mutex<BTreeSet<u32>>,
    /// Q counter sets (fw/counters.rs), by counter_set_id.
    pub q_counters: Mutex<BTreeMap<u32, Arc<QCounterSet>>>,
    pub gids: RwLock<[Option<GidEntry>; GID_TABLE_LEN]>,
    /// The GSI QP (st QP1), which packets to QP 1 reach.
    pub gsi: RwLock<Option<u32>>,
    /// The fabric the port is cabled to.
    pub fabric: RwLock<Option<Weak<crate::fabric::Wire>>>,
    pub events: Mutex<Vec<PendingEvent>>,
    pub attention: Mutex<BTreeSet<u32>>,
    /// UAR pages to watch.
    pub uars: Mutex<UarWatches>,
    /// Retry timers (ACK timeout, RNR timer) by QP, on the clock.
    pub timers: Mutex<HashMap<u32, Deadline>>,
    pub counters: Counters,
    pub worker: Mutex<Option<Thread>>,
    /// Reserved lkey (QUERY_SPECIAL_CONTEXTS): physical addressing.
    pub resd_lkey: u32,
    /// What UMR and indirect keys may do on this device (its caps).
    pub umr_caps: UmrCaps,
    /// The UAR page served trapped, if any (the configuration's: every
    /// write to it reaches [`Rdma::trapped_write`]). Its CQ doorbells are
    /// taken from those writes only, never from BAR memory or a CQ's
    /// doorbell record.
    trapped_uar: Option<u32>,
    /// CQ doorbells written to the trapped page, not yet acted on.
    trapped_cq: Mutex<TrappedCq>,
    poll: Mutex<PollState>,
    /// The worker slept idle since the last pass: the next pass sweeps.
    slept: AtomicBool,
    /// Sweeps made (for tests: "after N sweeps").
    sweeps: AtomicU64,
    /// Where the search for a free CQ number starts ([`lowest_free`]).
    pub cq_floor: AtomicU32,
    /// Where the search for a free number of the QP space (QPs, SQs, RQs)
    /// starts ([`lowest_free`]).
    pub qp_floor: AtomicU32,
    /// Page faults raised and held (on-demand paging).
    pub odp: odp::Odp,
    /// 8-byte atomics execute in host byte order (little-endian: the
    /// model's hosts are x86): the current atomic caps'
    /// `atomic_req_8B_endianness_mode` is 1, which a driver sets by
    /// SET_HCA_CAP where `supported_atomic_req_8B_endianness_mode_1` offers
    /// it (ConnectX-5 and later; Linux always does). Otherwise network
    /// order, as IBA specifies. Set with the caps (fw/caps.rs), cleared at
    /// function reset.
    pub host_endian_atomics: AtomicBool,
    /// Raw Ethernet receive: RQs, NIC RX steering, flow counters.
    pub eth_rx: eth_rx::EthRx,
    /// CQE compression sessions open on its CQs ([`cqe_comp`]; counted
    /// under each CQ's lock: opened +1, written or dropped -1).
    pub cq_sessions: AtomicU32,
    /// Armed CQs waiting for their moderation period ([`cq`]; counted
    /// under each CQ's lock: set +1, run out or dropped -1).
    pub cq_timers: AtomicU32,
    /// Multicast groups (ATTACH_TO_MCG): the UD QPs each multicast GID
    /// delivers to.
    pub mcgs: Mutex<BTreeMap<[u8; 16], BTreeSet<u32>>>,
}

/// The lowest number of `[first, end)` that `used` says is free, searched
/// from `floor` up (every number below it was in use when it was set, and
/// freeing a number lowers it: [`freed`]), then below it; `floor` moves
/// past the number found. So the n-th create does not walk the n - 1
/// numbers before it, and a floor left too high (tables emptied by a
/// reset) costs only the order, never a free number.
pub(crate) fn lowest_free(
    floor: &AtomicU32,
    first: u32,
    end: u32,
    used: impl Fn(u32) -> bool,
) -> Option<u32> {
    let from = floor.load(Ordering::Relaxed).clamp(first, end);
    let n = (from..end).chain(first..from).find(|&n| !used(n))?;
    floor.store(n + 1, Ordering::Relaxed);
    Some(n)
}

/// Number `n` is free again: the search under `floor` starts no higher.
pub(crate) fn freed(floor: &AtomicU32, n: u32) {
    floor.fetch_min(n, Ordering::Relaxed);
}

/// CQ doorbells (`[arm word, cqn]`) that arrived as trapped writes.
#[derive(Debug, Default)]
struct TrappedCq {
    /// Whole doorbells, in the order written.
    whole: Vec<u64>,
    /// The arm word of a doorbell written as two 32-bit writes, waiting
    /// for its CQ number.
    arm_word: Option<u32>,
}

/// How many trapped CQ doorbells wait for the worker at most (beyond, the
/// oldest are dropped: only while the worker is not polling the data path).
pub const TRAPPED_CQ_DOORBELLS_MAX: usize = 4096;

#[derive(Debug)]
struct PollState {
    /// Passes since the last sweep.
    since_sweep: u32,
    /// QPs whose send doorbell rang in this pass (kept for its capacity).
    hint: Vec<u32>,
    /// The first UAR page of the next pass's chunk.
    cursor: usize,
    /// The objects of the sweep's round not swept yet (the next sweep takes
    /// the last [`SWEEP_CHUNK`]); an empty round starts the next one with
    /// every object there is then.
    round: Vec<Swept>,
}

/// An object whose doorbell record the sweep reads.
#[derive(Debug, Clone, Copy)]
enum Swept {
    Qp(u32),
    EthSq(u32),
    Cq(u32),
}

/// Pages read on every pass besides the hot ones: with thousands of UAR
/// pages (one per QP and CQ) a pass stays short, so firmware commands
/// keep their latency, and a page's first doorbell is seen within
/// `pages / UAR_SCAN_CHUNK` passes.
const UAR_SCAN_CHUNK: usize = 64;
/// A page stays hot (read on every pass) this long after its last doorbell.
const HOT_FOR: Duration = Duration::from_millis(10);

/// The UAR pages whose doorbells the worker reads. Pages are only added
/// (a page stays watched until the tables are reset), so an index into
/// `pages` names one page for good.
#[derive(Debug, Default)]
pub(crate) struct UarWatches {
    pages: Vec<UarWatch>,
    /// Index into `pages` by UAR number.
    by_uar: HashMap<u32, usize, BuildHasherDefault<NumHasher>>,
    /// Indices of the hot pages (read on every pass), each once.
    hot: Vec<usize>,
}

impl UarWatches {
    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// A UAR page whose doorbells the worker reads.
#[derive(Debug)]
pub(crate) struct UarWatch {
    uar: u32,
    /// Send doorbells (a QP rings this page).
    sq: bool,
    /// The CQ arm doorbell (a CQ rings this page).
    cq: bool,
    /// The send doorbells (bits of [`SQ_DOORBELLS`]) that have rung: a
    /// hot pass reads only these (a QP with a page of its own uses two of
    /// the eight), the pass whose chunk holds the page reads all.
    used: u8,
    /// The last value seen at each of [`SQ_DOORBELLS`], then the CQ doorbell.
    last: [u64; SQ_DOORBELLS.len() + 1],
    /// Rang lately: read on every pass.
    hot: bool,
    /// When it last rang.
    rang: Instant,
}

/// Names a send queue's wait for its retry timer (ACK timeout, RNR timer),
/// for a test's `ManualClock::wait_armed`.
pub const RETRY_DEADLINE: &str = "transport retry";

/// Send doorbell offsets in a UAR page: the two BlueFlame buffers of each
/// of the four bfregs.
const SQ_DOORBELLS: [usize; 8] = [0x800, 0x900, 0xa00, 0xb00, 0xc00, 0xd00, 0xe00, 0xf00];

/// The capabilities the UMR engine and indirect keys follow
/// (`cmd_hca_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UmrCaps {
    /// `max_indirection`: indirect keys an access may go through in a
    /// chain (0 in a profile reads as 1: indirect keys work at all).
    pub max_indirection: u32,
    /// Repeat blocks are taken (`repeated_block_disabled` clear).
    pub repeat_block: bool,
}

impl UmrCaps {
    /// From the current general capability page.
    pub(crate) fn of(caps: &crate::profile::CapPages) -> Self {
        use mlx5_hw::ifc::cmd_hca_cap as c;
        let g = |f| caps.get(crate::profile::cap_type::GENERAL, f);
        Self {
            max_indirection: (g(c::MAX_INDIRECTION) as u32).max(1),
            repeat_block: g(c::REPEATED_BLOCK_DISABLED) == 0,
        }
    }
}

/// The HCA's free-running clock: cycles of `device_frequency_khz` since
/// power-on (or the last function-level reset).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceTimer {
    pub epoch: std::time::Instant,
    pub khz: u64,
}

impl DeviceTimer {
    /// Cycles at `now`.
    pub(crate) fn ticks(&self, now: std::time::Instant) -> u64 {
        let ns = now.saturating_duration_since(self.epoch).as_nanos();
        (ns * u128::from(self.khz) / 1_000_000) as u64
    }
}

impl Rdma {
    /// The internal timer now (what a CQE is stamped with).
    pub(crate) fn ticks(&self) -> u64 {
        lock(&self.timer).ticks(self.clock.now())
    }

    /// The data path; `trapped_uar`: the UAR page whose writes all arrive
    /// through [`Rdma::trapped_write`].
    pub(crate) fn new(
        dma: Arc<DmaSpace>,
        resd_lkey: u32,
        clock: SharedClock,
        trapped_uar: Option<u32>,
        umr_caps: UmrCaps,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            dma,
            timer: Mutex::new(DeviceTimer {
                epoch: clock.now(),
                khz: 0,
            }),
            clock,
            mkeys: RwLock::new(Table::default()),
            cqs: RwLock::new(Table::default()),
            qps: RwLock::new(Table::default()),
            srqs: RwLock::new(Table::default()),
            eth_sqs: RwLock::new(Table::default()),
            dcts: RwLock::new(Table::default()),
            pds: Mutex::new(BTreeSet::new()),
            tds: Mutex::new(BTreeSet::new()),
            xrcds: Mutex::new(BTreeSet::new()),
            q_counters: Mutex::new(BTreeMap::new()),
            gids: RwLock::new([None; GID_TABLE_LEN]),
            gsi: RwLock::new(None),
            fabric: RwLock::new(None),
            events: Mutex::new(Vec::new()),
            attention: Mutex::new(BTreeSet::new()),
            uars: Mutex::new(UarWatches::default()),
            timers: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            worker: Mutex::new(None),
            resd_lkey,
            umr_caps,
            trapped_uar,
            trapped_cq: Mutex::new(TrappedCq::default()),
            poll: Mutex::new(PollState {
                since_sweep: 0,
                hint: Vec::new(),
                cursor: 0,
                round: Vec::new(),
            }),
            slept: AtomicBool::new(false),
            sweeps: AtomicU64::new(0),
            cq_floor: AtomicU32::new(0),
            qp_floor: AtomicU32::new(0),
            odp: odp::Odp::default(),
            host_endian_atomics: AtomicBool::new(false),
            eth_rx: eth_rx::EthRx::default(),
            cq_sessions: AtomicU32::new(0),
            cq_timers: AtomicU32::new(0),
            mcgs: Mutex::new(BTreeMap::new()),
        })
    }

    /// Objects alive (PDs, transport domains, MKEYs, CQs, QPs, SRQs).
    pub(crate) fn objects(&self) -> usize {
        lock(&self.pds).len()
            + lock(&self.tds).len()
            + rlock(&self.mkeys).len()
            + rlock(&self.cqs).len()
            + rlock(&self.qps).len()
            + rlock(&self.srqs).len()
            + rlock(&self.dcts).len()
            + lock(&self.xrcds).len()
            + lock(&self.q_counters).len()
    }

    /// Forgets every object (power-on, FLR, fast teardown).
    pub(crate) fn reset(&self) {
        for qp in wlock(&self.qps).drain() {
            qp.1.destroyed();
        }
        wlock(&self.mkeys).clear();
        wlock(&self.cqs).clear();
        wlock(&self.srqs).clear();
        wlock(&self.eth_sqs).clear();
        for d in wlock(&self.dcts).drain() {
            d.1.close_all();
        }
        lock(&self.pds).clear();
        lock(&self.tds).clear();
        lock(&self.xrcds).clear();
        lock(&self.q_counters).clear();
        *wlock(&self.gids) = [None; GID_TABLE_LEN];
        *wlock(&self.gsi) = None;
        lock(&self.events).clear();
        lock(&self.attention).clear();
        lock(&self.uars).clear();
        lock(&self.poll).round.clear();
        self.cq_floor.store(0, Ordering::Relaxed);
        self.qp_floor.store(0, Ordering::Relaxed);
        self.odp.reset();
        self.eth_rx.reset();
        self.cq_sessions.store(0, Ordering::Release);
        self.cq_timers.store(0, Ordering::Release);
        lock(&self.mcgs).clear();
        *lock(&self.trapped_cq) = TrappedCq::default();
        lock(&self.timers).clear();
        self.counters.reset();
    }

    /// What a client left in the data path, for [`crate::PowerOnState`]:
    /// every table and queue (the fabric the port is cabled to is the
    /// operator's, not the client's, and stays out).
    pub(crate) fn state_summary(&self) -> String {
        format!(
            "mkeys {} cqs {} qps {} srqs {} pds {:?} tds {:?} xrcds {:?} q_counters {} \
             gids {:?} gsi {:?} events {} attention {:?} uars {} trapped cq doorbells {:?} \
             timers {} counters {:?}",
            rlock(&self.mkeys).len(),
            rlock(&self.cqs).len(),
            rlock(&self.qps).len(),
            rlock(&self.srqs).len(),
            lock(&self.pds),
            lock(&self.tds),
            lock(&self.xrcds),
            lock(&self.q_counters).len(),
            rlock(&self.gids),
            rlock(&self.gsi),
            lock(&self.events).len(),
            lock(&self.attention),
            lock(&self.uars).len(),
            *lock(&self.trapped_cq),
            lock(&self.timers).len(),
            self.counters,
        )
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
        let mut d = mlx5_hw::ifc::EqeQpSrq::new_zeroed();
        // MLX5_EVENT_QUEUE_TYPE_SRQ (1) or _QP (0).
        d.r#type = u8::from(is_srq);
        d.qp_srq_n
            .set(qpn & mlx5_hw::event::EQE_RESOURCE_NUMBER_MASK);
        let data = zerocopy::transmute!(d);
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
        if let Some(&i) = u.by_uar.get(&uar) {
            let e = &mut u.pages[i];
            e.sq |= sq;
            e.cq |= !sq;
            return;
        }
        let i = u.pages.len();
        u.pages.push(UarWatch {
            uar,
            sq,
            cq: !sq,
            used: 0,
            last: [0; SQ_DOORBELLS.len() + 1],
            hot: true,
            rang: Instant::now(),
        });
        u.by_uar.insert(uar, i);
        u.hot.push(i);
    }

    /// QP `qpn` waits for a timer (RNR, ACK timeout) due at `at`.
    pub(crate) fn timer(&self, qpn: u32, at: Instant) {
        let mut t = lock(&self.timers);
        if t.get(&qpn).is_some_and(|d| d.at() == at) {
            return;
        }
        t.insert(qpn, Deadline::until(&self.clock, at, RETRY_DEADLINE));
    }

    /// Counts an event in the Q counter set the QP is bound to (none for
    /// set 0, the function's default set, which no command can read).
    pub(crate) fn q_count(&self, qp: &Qp, which: fn(&QCounterSet) -> &AtomicU64) {
        let id = qp.counter_set.load(Ordering::Relaxed);
        if id == 0 {
            return;
        }
        if let Some(s) = lock(&self.q_counters).get(&id) {
            which(s).fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn qp(&self, qpn: u32) -> Option<Arc<Qp>> {
        rlock(&self.qps).get(&qpn).cloned()
    }

    /// The QPs attached to multicast group `mgid`.
    pub(crate) fn mcg_members(&self, mgid: &[u8; 16]) -> Vec<u32> {
        lock(&self.mcgs)
            .get(mgid)
            .map_or_else(Vec::new, |m| m.iter().copied().collect())
    }

    pub(crate) fn eth_sq(&self, sqn: u32) -> Option<Arc<eth_sq::EthSq>> {
        rlock(&self.eth_sqs).get(&sqn).cloned()
    }

    pub(crate) fn mkey(&self, key: u32) -> Option<Arc<Mkey>> {
        let k = rlock(&self.mkeys).get(&(key >> 8)).cloned()?;
        (k.key == key as u8).then_some(k)
    }

    /// Checks `[va, va + len)` of `key` for `need` under `pd` and appends
    /// its extents to `out` ([`Mkey::resolve`]) through `cache`: the same
    /// range of the same key again, with no table changed, is not walked
    /// again.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn resolve_cached(
        &self,
        key: u32,
        cache: &mut KeyCache,
        pd: u32,
        need: u8,
        va: u64,
        len: u64,
        out: &mut Vec<mem::Extent>,
    ) -> Result<(), mem::KeyError> {
        let gen = tables_gen();
        if let Some(r) = cache.last {
            if (r.key, r.gen, r.pd, r.need, r.va, r.len) == (key, gen, pd, need, va, len) {
                mem::push(out, r.ext.iova, u64::from(r.ext.len));
                return Ok(());
            }
        }
        self.resolve_fresh(key, cache, gen, pd, need, va, len, out)
    }

    /// [`Rdma::resolve_cached`] past its cache (out of line: the hit is
    /// the data path's common case).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn resolve_fresh(
        &self,
        key: u32,
        cache: &mut KeyCache,
        gen: u64,
        pd: u32,
        need: u8,
        va: u64,
        len: u64,
        out: &mut Vec<mem::Extent>,
    ) -> Result<(), mem::KeyError> {
        let fresh = out.is_empty();
        let k = self.mkey_cached(key, cache).ok_or(mem::KeyError::Invalid)?;
        k.resolve(pd, need, va, len, out)?;
        cache.last = match out.as_slice() {
            [e] if fresh => Some(Resolved {
                key,
                gen,
                pd,
                need,
                va,
                len,
                ext: *e,
            }),
            _ => None,
        };
        Ok(())
    }

    /// [`Rdma::mkey`] through `cache`.
    #[inline]
    pub(crate) fn mkey_cached<'c>(&self, key: u32, cache: &'c mut KeyCache) -> Option<&'c Mkey> {
        let gen = tables_gen();
        if cache.mkey.is_none() || cache.key != key || cache.gen != gen {
            self.mkey_refresh(key, cache, gen);
        }
        cache.mkey.as_deref()
    }

    /// Looks `key` up again into `cache` (out of line: the hit is the
    /// data path's common case).
    #[inline(never)]
    fn mkey_refresh(&self, key: u32, cache: &mut KeyCache, gen: u64) {
        cache.mkey = self.mkey(key);
        cache.key = key;
        cache.gen = gen;
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

    /// A write to BAR0 that arrived trapped (vfio-user REGION_WRITE,
    /// vhost-user): a CQ doorbell of the trapped UAR page is queued whole,
    /// `[arm word, cqn]`, as the card takes it. Linux writes it with one
    /// 64-bit store; a client may split it into the arm word (0x20) and
    /// then the CQ number (0x24), and the doorbell is complete with the
    /// second. True if it was a CQ doorbell.
    pub(crate) fn trapped_write(&self, offset: u64, data: &[u8]) -> bool {
        let (uar, off) = ((offset >> 12) as u32, (offset & 0xfff) as usize);
        if Some(uar) != self.trapped_uar {
            return false;
        }
        const DB: usize = mlx5_hw::uar::CQ_DOORBELL;
        let mut t = lock(&self.trapped_cq);
        let whole = match (off, data.len()) {
            (DB, 8) => {
                let mut b = [0u8; 8];
                b.copy_from_slice(data);
                t.arm_word = None;
                u64::from_be_bytes(b)
            }
            (DB, 4) => {
                t.arm_word = Some(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
                return true;
            }
            (o, 4) if o == DB + 4 => {
                let Some(arm) = t.arm_word.take() else {
                    tracing::debug!(uar, "CQ number written with no arm word before it");
                    return true;
                };
                u64::from(arm) << 32
                    | u64::from(u32::from_be_bytes([data[0], data[1], data[2], data[3]]))
            }
            _ => return false,
        };
        if t.whole.len() >= TRAPPED_CQ_DOORBELLS_MAX {
            t.whole.remove(0);
        }
        tracing::trace!(
            uar,
            doorbell = format_args!("{whole:#018x}"),
            "trapped CQ doorbell"
        );
        t.whole.push(whole);
        drop(t);
        self.wake();
        true
    }

    /// Acts on the trapped CQ doorbells, in the order written.
    fn trapped_cq_doorbells(&self) -> bool {
        let whole = std::mem::take(&mut lock(&self.trapped_cq).whole);
        for &v in &whole {
            self.counters.doorbells.fetch_add(1, Ordering::Relaxed);
            let cqn = (v & 0xff_ffff) as u32;
            if let Some(cq) = rlock(&self.cqs).get(&cqn).cloned() {
                cq.arm(self, (v >> 32) as u32);
            }
        }
        !whole.is_empty()
    }

    /// The worker is about to sleep idle: its next pass sweeps.
    pub(crate) fn note_idle(&self) {
        self.slept.store(true, Ordering::Release);
    }

    /// Sweeps of the doorbell records made so far.
    pub(crate) fn sweeps(&self) -> u64 {
        self.sweeps.load(Ordering::Relaxed)
    }

    /// One pass of the data path: doorbells, timers, flushes, the sweep.
    pub(crate) fn poll(&self, bar: &DmaBuffer) -> bool {
        let mut busy = self.trapped_cq_doorbells();
        let mut ps = lock(&self.poll);
        let mut hint = std::mem::take(&mut ps.hint);
        hint.clear();
        busy |= self.poll_uars(bar, &mut ps.cursor, &mut hint);
        ps.since_sweep = ps.since_sweep.saturating_add(1);
        let due = if ps.since_sweep >= SWEEP_PASSES || self.slept.swap(false, Ordering::AcqRel) {
            ps.since_sweep = 0;
            self.sweeps.fetch_add(1, Ordering::Relaxed);
            self.sweep_chunk(&mut ps.round)
        } else {
            Vec::new()
        };
        drop(ps);
        let mem = self.dma.memory();
        for &qpn in &hint {
            if let Some(qp) = self.qp(qpn) {
                busy |= requester::run(self, &qp, &mem);
            } else if let Some(sq) = self.eth_sq(qpn) {
                busy |= eth_sq::run(self, &sq, &mem, true);
            }
        }
        lock(&self.poll).hint = hint;
        // LRO and CQE compression sessions idle since the last pass end
        // (the device's timeouts).
        busy |= eth_rx::flush_held(self, &mem, None);
        // Completion events whose moderation period has run.
        cq::Cq::moderation_timers(self);
        let mut attention: Vec<u32> = std::mem::take(&mut *lock(&self.attention))
            .into_iter()
            .collect();
        {
            let mut t = lock(&self.timers);
            if !t.is_empty() {
                let now = self.clock.now();
                t.retain(|&q, d| {
                    if d.at() <= now {
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
        for s in due {
            busy |= self.sweep_one(s, &mem);
        }
        busy
    }

    /// Reads the doorbells of the hot UAR pages and of the chunk of the
    /// others at `cursor` (which moves on); the QPs whose send doorbell
    /// rang go to `hint`. True if a doorbell rang.
    fn poll_uars(&self, bar: &DmaBuffer, cursor: &mut usize, hint: &mut Vec<u32>) -> bool {
        let now = Instant::now();
        let mut u = lock(&self.uars);
        let n = u.pages.len();
        let (from, to) = ((*cursor).min(n), (*cursor + UAR_SCAN_CHUNK).min(n));
        *cursor = if to >= n { 0 } else { to };
        let UarWatches { pages, hot, .. } = &mut *u;
        // The pages hot as the pass starts, then the chunk's cold ones.
        hot.extend((from..to).filter(|&i| !pages[i].hot));
        let mut busy = false;
        for &i in hot.iter() {
            let w = &mut pages[i];
            if w.hot && now.duration_since(w.rang) > HOT_FOR {
                w.hot = false;
            }
            busy |= self.read_uar(bar, w, (from..to).contains(&i), now, hint);
        }
        hot.retain(|&i| pages[i].hot);
        busy
    }

    /// Reads one UAR page's send doorbells (those that have rung, or all
    /// when `cold`) and its CQ doorbell, acting on every change.
    fn read_uar(
        &self,
        bar: &DmaBuffer,
        w: &mut UarWatch,
        cold: bool,
        now: Instant,
        hint: &mut Vec<u32>,
    ) -> bool {
        let mut busy = false;
        let base = (w.uar as usize) << 12;
        if w.sq {
            let slots = if cold || w.used == 0 { u8::MAX } else { w.used };
            for (i, &off) in SQ_DOORBELLS.iter().enumerate() {
                if slots & (1 << i) == 0 {
                    continue;
                }
                let Ok(v) = bar.read_u64_be(base + off) else {
                    continue;
                };
                if w.last[i] != v {
                    w.last[i] = v;
                    w.used |= 1 << i;
                    (w.hot, w.rang) = (true, now);
                    busy = true;
                    self.counters.doorbells.fetch_add(1, Ordering::Relaxed);
                    // ctrl segment: opmod_idx_opcode, qpn_ds.
                    let qpn = (v as u32) >> 8;
                    if !hint.contains(&qpn) {
                        hint.push(qpn);
                    }
                }
            }
        }
        // A trapped page's CQ doorbells came whole from its writes.
        if w.cq && Some(w.uar) != self.trapped_uar {
            let Ok(v) = bar.read_u64_be(base + mlx5_hw::uar::CQ_DOORBELL) else {
                return busy;
            };
            let i = SQ_DOORBELLS.len();
            if w.last[i] != v {
                w.last[i] = v;
                (w.hot, w.rang) = (true, now);
                busy = true;
                self.counters.doorbells.fetch_add(1, Ordering::Relaxed);
                let cqn = (v & 0xff_ffff) as u32;
                if let Some(cq) = rlock(&self.cqs).get(&cqn).cloned() {
                    cq.arm(self, (v >> 32) as u32);
                }
            }
        }
        busy
    }

    /// The objects this sweep reads: the next [`SWEEP_CHUNK`] of `round`,
    /// which starts again with every object there is when it runs out.
    fn sweep_chunk(&self, round: &mut Vec<Swept>) -> Vec<Swept> {
        if round.is_empty() {
            round.extend(rlock(&self.cqs).keys().map(|&n| Swept::Cq(n)));
            round.extend(rlock(&self.eth_sqs).keys().map(|&n| Swept::EthSq(n)));
            round.extend(rlock(&self.qps).keys().map(|&n| Swept::Qp(n)));
        }
        round.split_off(round.len().saturating_sub(SWEEP_CHUNK))
    }

    /// Reads one object's doorbell record again: a send queue's producer
    /// counter (for a doorbell overwritten before the worker saw it), a
    /// CQ's arm word. An object gone since the round started is skipped.
    fn sweep_one(&self, s: Swept, mem: &vfio::IovaMemory) -> bool {
        match s {
            Swept::Qp(n) => {
                let Some(qp) = self.qp(n) else {
                    return false;
                };
                // Only these states have send-side work (execute or flush).
                matches!(
                    qp.state(),
                    qp::state::RTS | qp::state::ERR | qp::state::SQER
                ) && requester::run(self, &qp, mem)
            }
            Swept::EthSq(n) => self
                .eth_sq(n)
                .is_some_and(|sq| eth_sq::run(self, &sq, mem, false)),
            Swept::Cq(n) => {
                let Some(cq) = rlock(&self.cqs).get(&n).cloned() else {
                    return false;
                };
                // A card arms a CQ on its UAR doorbell only; the record's
                // arm word is read for doorbells lost in shared memory,
                // which a trapped page does not lose (Linux's
                // write-combining test CQ on the trapped page is never
                // armed, whatever its record says).
                if Some(cq.uar) != self.trapped_uar {
                    cq.sweep_arm(self, mem);
                }
                false
            }
        }
    }
}

pub(crate) fn rlock<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// Counts write locks taken on any table ([`wlock`]): a cached lookup
/// ([`KeyCache`]) is good while it has not moved.
static TABLES_GEN: AtomicU64 = AtomicU64::new(0);

/// Takes a write lock (every change to an object table goes through here,
/// and invalidates cached lookups).
pub(crate) fn wlock<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    let g = l.write().unwrap_or_else(|p| p.into_inner());
    // Bumped while the lock is held, before the change: a reader that
    // still sees the old count looked the key up before the change.
    TABLES_GEN.fetch_add(1, Ordering::AcqRel);
    g
}

/// The count of table changes so far ([`wlock`]).
pub(crate) fn tables_gen() -> u64 {
    TABLES_GEN.load(Ordering::Acquire)
}

/// The last mkey a queue looked up, kept while no table changed (a WQE's
/// lkey, a WRITE's rkey: usually the same from one message to the next).
#[derive(Debug, Default)]
pub(crate) struct KeyCache {
    key: u32,
    gen: u64,
    mkey: Option<Arc<Mkey>>,
    /// The last range resolved through it, when one extent.
    last: Option<Resolved>,
}

/// A key check and translation that gave one extent.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    key: u32,
    gen: u64,
    pd: u32,
    need: u8,
    va: u64,
    len: u64,
    ext: mem::Extent,
}

#[cfg(test)]
mod number_tests {
    use std::collections::BTreeSet;
    use std::sync::atomic::AtomicU32;

    use super::{freed, lowest_free};

    /// The floor finds what a walk from the first number finds, and a
    /// floor left too high still finds a free number.
    #[test]
    fn lowest_free_is_the_lowest_free_number() {
        let floor = AtomicU32::new(0);
        let mut used = BTreeSet::new();
        let take = |used: &mut BTreeSet<u32>| {
            let n = lowest_free(&floor, 1, 6, |n| used.contains(&n));
            if let Some(n) = n {
                used.insert(n);
            }
            n
        };
        let got: Vec<_> = (0..6).map(|_| take(&mut used)).collect();
        assert_eq!(got, [Some(1), Some(2), Some(3), Some(4), Some(5), None]);
        for n in [4, 2] {
            used.remove(&n);
            freed(&floor, n);
        }
        assert_eq!(take(&mut used), Some(2));
        assert_eq!(take(&mut used), Some(4));
        // Every number freed behind the floor's back: the search still
        // finds free ones, up from the floor, then below it.
        used.clear();
        assert_eq!(take(&mut used), Some(5));
        assert_eq!(take(&mut used), Some(1), "below a floor left high");
    }
}
