//! The command queue: how the driver asks firmware to do things.
//!
//! One 4 KiB page holds `2^log_cmdq_size` entries, `2^log_cmdq_stride` bytes
//! apart (both read from init-segment 0x14 before the page's IOVA is written
//! there). An entry (`struct mlx5_cmd_layout`, 64 bytes) carries the first
//! 16 input and output bytes inline; longer messages continue in chains of
//! 576-byte mailbox blocks (512 data bytes, then `next`, `block_num`, the
//! command's token and two XOR signatures), each block 1 KiB aligned.
//!
//! Posting a command (PRM "Command Queue"):
//! 1. fill the mailboxes and the entry (type 7, lengths, pointers, token,
//!    signature) with the ownership bit still clear;
//! 2. [`dma_wmb`]: the entry and mailboxes are visible before ownership;
//! 3. set `status_own` bit 0 (ownership to hardware);
//! 4. [`wmb`]: ownership is visible before the doorbell;
//! 5. write `1 << slot` to the doorbell (init-segment 0x18).
//!
//! Firmware returns the entry by clearing the ownership bit, with the
//! delivery status in `status_own[7:1]`; the output's byte 0 is the command
//! status and bytes 4..8 the syndrome. Before an event queue exists the
//! waiter polls the ownership bit (yielding, until `cmd_exec_to`); in event
//! mode the CMD completion EQE wakes it, and it still has a deadline.
//!
//! Slots `0 .. n-1` form a pool any thread can take (blocking when all are
//! busy); the last slot is reserved for page commands (MANAGE_PAGES), so a
//! page request never waits behind commands that need the pages.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use mlx5_hw::ifc::{CmdLayout, CmdProtBlock};
use mlx5_hw::init as hw;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::{CmdStatus, DeliveryStatus};
use mlx5_hw::trace;
use vfio::clock::{Deadline, SharedClock};
use vfio::mmio::{dma_rmb, dma_wmb, wmb};
use vfio::Mmio;
use zerocopy::{FromZeros, IntoBytes};

use crate::dma::{DmaCtx, DmaRegion};
use crate::health::HealthEvent;
use crate::{Error, Result};

/// Size of a command queue entry (`struct mlx5_cmd_layout`).
pub const ENTRY_SIZE: usize = hw::CMD_ENTRY_SIZE;
/// Size of a mailbox block (`struct mlx5_cmd_prot_block`).
pub const BLOCK_SIZE: usize = hw::CMD_PROT_BLOCK_SIZE;
/// Distance between mailbox blocks in memory (blocks are 1 KiB aligned).
const BLOCK_STRIDE: usize = hw::CMD_PROT_BLOCK_ALIGN;
/// Message bytes carried inline in the entry.
const INLINE: usize = hw::CMD_INLINE_IN_SIZE;
/// The kernel's default command timeout when the init segment gives none.
pub const DEFAULT_CMD_TIMEOUT: Duration = Duration::from_millis(hw::CMD_TIMEOUT_MS);
/// Slack the kernel adds to the command timeout.
pub const CMD_TIMEOUT_SLACK: Duration = Duration::from_secs(1);
/// How often an event-mode waiter wakes to check health and ownership.
const EVENT_WAIT_SLICE: Duration = Duration::from_millis(50);
/// The pace of a polled waiter once yielding has not seen the entry back.
const POLL_PAUSE: Duration = Duration::from_micros(50);
/// Names the deadline of a command (a test's `ManualClock::wait_armed`).
pub const CMD_DEADLINE: &str = "command completion";

/// Byte offset of `status_own`, the byte ownership is handed over with.
const STATUS_OWN: usize = core::mem::offset_of!(CmdLayout, status_own);

/// A mailbox block as bytes, viewed as [`CmdProtBlock`].
fn block(b: &[u8; BLOCK_SIZE]) -> &CmdProtBlock {
    zerocopy::transmute_ref!(b)
}

/// A mailbox block as bytes, viewed mutably as [`CmdProtBlock`].
fn block_mut(b: &mut [u8; BLOCK_SIZE]) -> &mut CmdProtBlock {
    zerocopy::transmute_mut!(b)
}

/// Converts an init-segment timeout word (`[31:29]` unit, `[19:0]` value)
/// as `tout_convert_iseg_to_ms` does.
pub fn iseg_timeout(word: u32) -> Duration {
    Duration::from_millis(hw::iseg_timeout_ms(word))
}

/// Sets an entry's signature: `~XOR` of the 64 bytes with `sig` zero, so
/// the XOR over the whole entry is 0xff.
pub fn sign_entry(entry: &mut [u8; ENTRY_SIZE]) {
    let e: &mut CmdLayout = zerocopy::transmute_mut!(entry);
    e.sign();
}

/// Sets a block's `ctrl_sig` and `sig` ([`CmdProtBlock::sign`]).
pub fn sign_block(b: &mut [u8; BLOCK_SIZE]) {
    block_mut(b).sign();
}

/// Whether a block's signatures check out.
pub fn block_sig_ok(b: &[u8; BLOCK_SIZE]) -> bool {
    block(b).sig_ok()
}

/// Builds the mailbox chain that carries `tail` (the message after its 16
/// inline bytes) in `nblocks` blocks placed `BLOCK_STRIDE` apart from
/// `base`: data, `next` (0 at the end), `block_num`, `token`, signatures.
/// `nblocks` may exceed what `tail` needs (an output chain has no data).
pub fn build_chain(tail: &[u8], nblocks: usize, base: u64, token: u8) -> Vec<[u8; BLOCK_SIZE]> {
    (0..nblocks)
        .map(|i| {
            let mut raw = [0u8; BLOCK_SIZE];
            let b = block_mut(&mut raw);
            let data = tail.chunks(hw::CMD_DATA_BLOCK_SIZE).nth(i).unwrap_or(&[]);
            b.data[..data.len()].copy_from_slice(data);
            let next = if i + 1 < nblocks {
                base + ((i + 1) * BLOCK_STRIDE) as u64
            } else {
                0
            };
            b.next.set(next);
            b.block_num.set(i as u32);
            b.token = token;
            b.sign();
            raw
        })
        .collect()
}

/// Reassembles a message: the 16 inline bytes, then each block's data, cut
/// to `len`. Missing bytes (a short chain) read as zero.
pub fn parse_chain(inline: &[u8], blocks: &[[u8; BLOCK_SIZE]], len: usize) -> Vec<u8> {
    let mut msg = Vec::with_capacity(len.max(INLINE));
    msg.extend_from_slice(&inline[..inline.len().min(INLINE)]);
    for b in blocks {
        msg.extend_from_slice(&block(b).data);
    }
    msg.resize(len, 0);
    msg
}

/// Checks that blocks are numbered `0, 1, ...` and carry `token`.
pub fn check_chain(
    blocks: &[[u8; BLOCK_SIZE]],
    token: u8,
) -> std::result::Result<(), &'static str> {
    for (i, b) in blocks.iter().enumerate() {
        let b = block(b);
        if b.block_num.get() as usize != i {
            return Err("mailbox block number out of sequence");
        }
        if b.token != token {
            return Err("mailbox token differs from the entry's");
        }
    }
    Ok(())
}

/// Builds a command entry (signed, ownership bit set in the signed image).
pub fn build_entry(
    input: &[u8],
    in_ptr: u64,
    out_ptr: u64,
    out_len: usize,
    token: u8,
) -> [u8; ENTRY_SIZE] {
    let mut e = CmdLayout::new_zeroed();
    e.r#type = hw::PCI_CMD_XPORT;
    e.inlen.set(input.len() as u32);
    e.in_ptr.set(in_ptr);
    let n = input.len().min(INLINE);
    e.r#in.as_mut_bytes()[..n].copy_from_slice(&input[..n]);
    e.out_ptr.set(out_ptr);
    e.outlen.set(out_len as u32);
    e.token = token;
    // The kernel signs the entry with the ownership bit already set.
    e.status_own = hw::CMD_OWNER_HW;
    e.sign();
    zerocopy::transmute!(e)
}

/// Decodes a completed command: delivery status first, then outbox status
/// and syndrome. `Ok(())` if both are OK.
pub fn check_status(opcode: u16, op_mod: u16, status_own: u8, output: &[u8]) -> Result<()> {
    let delivery = DeliveryStatus::from_status_own(status_own);
    if !delivery.is_ok() {
        return Err(Error::Delivery {
            opcode: Opcode::from_raw(opcode),
            op_mod,
            status: delivery,
        });
    }
    let status = CmdStatus::from_raw(output.first().copied().unwrap_or(0));
    if !status.is_ok() {
        let mut syn = [0u8; 4];
        for (i, s) in syn.iter_mut().enumerate() {
            *s = output.get(4 + i).copied().unwrap_or(0);
        }
        return Err(Error::Cmd {
            opcode: Opcode::from_raw(opcode),
            op_mod,
            status,
            syndrome: u32::from_be_bytes(syn),
        });
    }
    Ok(())
}

/// Where command dumps go: called with each dump (INPUT, then OUTPUT) in
/// the Linux `mlx5_core` `dump_command` format ([`mlx5_hw::trace`]).
#[derive(Clone)]
pub struct TraceSink(Arc<dyn Fn(&str) + Send + Sync>);

impl TraceSink {
    /// A sink that calls `f` with each dump's text.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// A sink that appends every dump to `w` (errors are logged, not fatal).
    pub fn writer(w: impl Write + Send + 'static) -> Self {
        let w = Mutex::new(w);
        Self::new(move |s| {
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = w.write_all(s.as_bytes()).and_then(|_| w.flush()) {
                tracing::warn!("command trace sink: {e}");
            }
        })
    }

    /// A sink that collects the dumps in memory (for tests and tools).
    pub fn memory() -> (Self, Arc<Mutex<String>>) {
        let buf = Arc::new(Mutex::new(String::new()));
        let b = buf.clone();
        let sink = Self::new(move |s| b.lock().unwrap_or_else(|p| p.into_inner()).push_str(s));
        (sink, buf)
    }
}

impl fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TraceSink")
    }
}

/// Counters of the command queue.
#[derive(Debug, Default)]
pub struct CmdStats {
    /// Commands posted.
    pub posted: AtomicU64,
    /// Commands that completed through a CMD event.
    pub by_event: AtomicU64,
    /// Event-mode commands found complete by the ownership bit before their event.
    pub event_fallbacks: AtomicU64,
}

/// One slot's mailbox memory, grown on demand.
#[derive(Debug, Default)]
struct SlotMem {
    region: Option<DmaRegion>,
}

impl SlotMem {
    fn ensure(&mut self, dma: &Arc<DmaCtx>, blocks: usize) -> Result<Option<&DmaRegion>> {
        if blocks == 0 {
            return Ok(None);
        }
        let need = blocks * BLOCK_STRIDE;
        if self.region.as_ref().is_none_or(|r| r.len() < need) {
            self.region = None;
            self.region = Some(dma.alloc(need)?);
        }
        Ok(self.region.as_ref())
    }
}

/// Geometry and timeouts the init segment gave.
#[derive(Debug, Clone, Copy)]
pub struct CmdGeometry {
    /// log2 of the number of entries.
    pub log_size: u8,
    /// log2 of the entry stride in bytes.
    pub log_stride: u8,
    /// Command execution timeout (`cmd_exec_to`, or the kernel's default).
    pub exec_timeout: Duration,
    /// Firmware init timeout (`cmd_q_init_to`, or the kernel's 2 s).
    pub init_timeout: Duration,
}

/// The command queue of one function. Shared through [`Cmd`].
#[derive(Debug)]
pub(crate) struct CmdQueue {
    dev: String,
    bar: Arc<Mmio>,
    dma: Arc<DmaCtx>,
    queue: Mutex<Option<DmaRegion>>,
    queue_buf: Arc<vfio::DmaBuffer>,
    queue_iova: u64,
    geo: CmdGeometry,
    clock: SharedClock,
    slots: Vec<Mutex<SlotMem>>,
    pool: Mutex<Vec<usize>>,
    pool_cv: Condvar,
    quarantine: Mutex<Vec<usize>>,
    page_slot: Option<usize>,
    page_lock: Mutex<()>,
    token: AtomicU8,
    event_mode: AtomicBool,
    done: Mutex<u64>,
    done_cv: Condvar,
    failed: Mutex<Option<HealthEvent>>,
    is_failed: AtomicBool,
    closed: AtomicBool,
    trace: Option<TraceSink>,
    stats: CmdStats,
    /// The process that set the queue up: a child forked with it shares
    /// the queue's memory and the BAR with its parent, and a command of
    /// its own would race the parent's for the same entries.
    owner: u32,
}

/// A handle to the command queue: cheap to clone, usable from any thread.
#[derive(Debug, Clone)]
pub struct Cmd(pub(crate) Arc<CmdQueue>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CmdQueue {
    /// Reads the geometry from init-segment 0x14 and the timeouts from
    /// 0xff8/0xffc, and checks the interface revision.
    pub(crate) fn read_geometry(bar: &Mmio) -> Result<CmdGeometry> {
        let rev = hw::cmdif_rev(bar.read32_be(hw::ISEG_CMDIF_REV_FW_SUB)?);
        if rev != hw::CMDIF_REV {
            return Err(Error::CmdifRevision(rev));
        }
        let l = bar.read32_be(hw::ISEG_CMDQ_ADDR_L_SZ)?;
        let log_size = hw::log_cmdq_size(l);
        let log_stride = hw::log_cmdq_stride(l);
        if log_size > 5 || u32::from(log_size) + u32::from(log_stride) > 12 || log_stride < 6 {
            return Err(Error::NotSupported(
                "command queue geometry (need 2^size <= 32, stride >= 64, size*stride <= 4 KiB)",
            ));
        }
        let (mut exec_timeout, mut init_timeout) = (
            DEFAULT_CMD_TIMEOUT,
            Duration::from_millis(hw::FW_INIT_TIMEOUT_MS),
        );
        // As mlx5_tout_query_iseg: a zero cmd_q_init_to means "not supported".
        if bar.read32_be(hw::ISEG_CMD_Q_INIT_TO)? != 0 {
            init_timeout = iseg_timeout(bar.read32_be(hw::ISEG_CMD_Q_INIT_TO)?);
            exec_timeout = iseg_timeout(bar.read32_be(hw::ISEG_CMD_EXEC_TO)?);
        }
        Ok(CmdGeometry {
            log_size,
            log_stride,
            exec_timeout,
            init_timeout,
        })
    }

    /// Allocates the queue page and writes its address (high word, then low
    /// word with nic_interface 0). The caller waits for `initializing` after.
    pub(crate) fn new(
        dev: String,
        bar: Arc<Mmio>,
        dma: Arc<DmaCtx>,
        geo: CmdGeometry,
        clock: SharedClock,
        trace: Option<TraceSink>,
    ) -> Result<Arc<Self>> {
        let queue = dma.alloc(4096)?;
        let n = 1usize << geo.log_size;
        let (pool, page_slot) = if n >= 2 {
            ((0..n - 1).rev().collect(), Some(n - 1))
        } else {
            (vec![0], None)
        };
        let queue_buf = queue.buf.clone();
        let queue_iova = queue.iova.0;
        let q = Arc::new(Self {
            dev,
            bar,
            dma,
            queue: Mutex::new(Some(queue)),
            queue_buf,
            queue_iova,
            geo,
            clock,
            slots: (0..n).map(|_| Mutex::new(SlotMem::default())).collect(),
            pool: Mutex::new(pool),
            pool_cv: Condvar::new(),
            quarantine: Mutex::new(Vec::new()),
            page_slot,
            page_lock: Mutex::new(()),
            token: AtomicU8::new(0),
            event_mode: AtomicBool::new(false),
            done: Mutex::new(0),
            done_cv: Condvar::new(),
            failed: Mutex::new(None),
            is_failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            trace,
            stats: CmdStats::default(),
            owner: std::process::id(),
        });
        let iova = q.queue_iova;
        q.bar
            .write32_be(hw::ISEG_CMDQ_ADDR_H, (iova >> 32) as u32)?;
        q.bar.write32_be(
            hw::ISEG_CMDQ_ADDR_L_SZ,
            hw::cmdq_addr_l_sz(iova as u32, hw::NicInterface::FullDriver),
        )?;
        wmb();
        Ok(q)
    }

    pub(crate) fn queue_iova(&self) -> u64 {
        self.queue_iova
    }

    /// Unmaps the queue page and every mailbox (after [`Self::close`], once
    /// the device no longer owns any entry).
    pub(crate) fn release_memory(&self) {
        for s in &self.slots {
            lock(s).region = None;
        }
        lock(&self.queue).take();
    }

    fn next_token(&self) -> u8 {
        loop {
            let t = self.token.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if t != 0 {
                return t;
            }
        }
    }

    fn health_error(&self) -> Option<Error> {
        if self.is_failed.load(Ordering::Acquire) {
            lock(&self.failed).clone().map(Error::Health)
        } else {
            None
        }
    }

    /// The failure, if the device was declared failed.
    pub(crate) fn health_event(&self) -> Option<HealthEvent> {
        lock(&self.failed).clone()
    }

    /// Marks the device failed: every waiter wakes, every later command
    /// fails with [`Error::Health`]. Whether this was the first failure
    /// (only the first is kept).
    pub(crate) fn fail(&self, ev: HealthEvent) -> bool {
        let first = {
            let mut f = lock(&self.failed);
            let first = f.is_none();
            if first {
                *f = Some(ev);
            }
            first
        };
        self.is_failed.store(true, Ordering::Release);
        let _d = lock(&self.done);
        self.done_cv.notify_all();
        drop(_d);
        let _p = lock(&self.pool);
        self.pool_cv.notify_all();
        first
    }

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _p = lock(&self.pool);
        self.pool_cv.notify_all();
    }

    /// Wakes waiters of the slots in `vector` (a CMD EQE's bitmask).
    pub(crate) fn complete(&self, vector: u32) {
        let mut d = lock(&self.done);
        *d |= u64::from(vector);
        self.done_cv.notify_all();
    }

    /// The clock the queue's deadlines are on (the driver's clock).
    pub(crate) fn clock(&self) -> &SharedClock {
        &self.clock
    }

    pub(crate) fn set_event_mode(&self, on: bool) {
        self.event_mode.store(on, Ordering::Release);
    }

    fn acquire_slot(&self, deadline: &Deadline) -> Result<usize> {
        let mut pool = lock(&self.pool);
        loop {
            if let Some(e) = self.health_error() {
                return Err(e);
            }
            if self.closed.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            if let Some(s) = pool.pop() {
                return Ok(s);
            }
            if deadline.passed() {
                return Err(Error::Timeout {
                    what: "a free command slot",
                    after: deadline.waited(),
                });
            }
            pool = self
                .pool_cv
                .wait_timeout(pool, deadline.slice(Duration::MAX))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn release_slot(&self, slot: usize) {
        lock(&self.pool).push(slot);
        self.pool_cv.notify_one();
    }

    /// Whether firmware still owns the entry of `slot`.
    fn hw_owned(&self, slot: usize) -> bool {
        let off = (slot << self.geo.log_stride) + STATUS_OWN;
        self.queue_buf
            .load_u8_acquire(off)
            .map_or(true, |b| b & hw::CMD_OWNER_MASK == hw::CMD_OWNER_HW)
    }

    /// Slots given up on while firmware still owned them go back to the
    /// pool once firmware has returned them.
    fn unquarantine(&self) {
        let mut q = lock(&self.quarantine);
        if q.is_empty() {
            return;
        }
        let back: Vec<usize> = q.iter().copied().filter(|&s| !self.hw_owned(s)).collect();
        q.retain(|s| !back.contains(s));
        drop(q);
        for s in back {
            tracing::debug!("command slot {s} returned by firmware after its timeout");
            self.release_slot(s);
        }
    }

    /// Runs a command on a pool slot; returns the whole output (even a
    /// failing one: the status is checked by the caller).
    pub(crate) fn exec_raw(&self, input: &[u8], out_len: usize) -> Result<(u8, Vec<u8>)> {
        let deadline = self.deadline();
        self.unquarantine();
        let slot = self.acquire_slot(&deadline)?;
        let r = self.run(slot, input, out_len, &deadline);
        if matches!(r, Err(Error::Timeout { .. })) && self.hw_owned(slot) {
            // As the kernel keeps a timed-out entry until firmware's real
            // completion: reusing the slot would hand firmware a second
            // command in an entry it still owns.
            tracing::warn!("command slot {slot} timed out while owned by firmware; set aside");
            lock(&self.quarantine).push(slot);
        } else {
            self.release_slot(slot);
        }
        r
    }

    /// Runs a page command on the reserved last slot.
    pub(crate) fn exec_page_raw(&self, input: &[u8], out_len: usize) -> Result<(u8, Vec<u8>)> {
        let Some(slot) = self.page_slot else {
            return self.exec_raw(input, out_len);
        };
        let deadline = self.deadline();
        let _g = lock(&self.page_lock);
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.run(slot, input, out_len, &deadline)
    }

    /// A command's deadline: the advertised execution timeout and the
    /// kernel's slack, on the queue's clock.
    fn deadline(&self) -> Deadline {
        Deadline::after(
            &self.clock,
            self.geo.exec_timeout + CMD_TIMEOUT_SLACK,
            CMD_DEADLINE,
        )
    }

    fn run(
        &self,
        slot: usize,
        input: &[u8],
        out_len: usize,
        deadline: &Deadline,
    ) -> Result<(u8, Vec<u8>)> {
        if input.len() < 8 {
            return Err(Error::Invalid("a command input is at least 8 bytes"));
        }
        if std::process::id() != self.owner {
            // A forked child: the queue is its parent's (Linux's
            // ib_uverbs serialises processes in the kernel; here nothing
            // would).
            return Err(Error::NotSupported(
                "commands from a forked child on its parent's device",
            ));
        }
        let out_len = out_len.max(INLINE);
        if let Some(e) = self.health_error() {
            return Err(e);
        }
        let token = self.next_token();
        let nin = hw::mailbox_blocks(input.len());
        let nout = hw::mailbox_blocks(out_len);
        let mut mem = lock(&self.slots[slot]);
        let region = mem.ensure(&self.dma, nin + nout)?;
        let (in_ptr, out_ptr, in_blocks, out_blocks) = match region {
            Some(r) => {
                let base = r.iova.0;
                let out_base = base + (nin * BLOCK_STRIDE) as u64;
                let ib = build_chain(&input[INLINE.min(input.len())..], nin, base, token);
                let ob = build_chain(&[], nout, out_base, token);
                for (i, b) in ib.iter().chain(ob.iter()).enumerate() {
                    r.buf.write(i * BLOCK_STRIDE, b)?;
                }
                (
                    if nin > 0 { base } else { 0 },
                    if nout > 0 { out_base } else { 0 },
                    ib,
                    ob,
                )
            }
            None => (0, 0, Vec::new(), Vec::new()),
        };
        let entry = build_entry(input, in_ptr, out_ptr, out_len, token);
        if let Some(t) = &self.trace {
            let mut s = String::new();
            trace::write_dump(
                &mut s,
                &self.dev,
                trace::Direction::Input,
                &entry,
                &in_blocks,
            );
            t.0(&s);
        }
        let off = slot << self.geo.log_stride;
        let buf = &self.queue_buf;
        // The entry with ownership still with software, then the bit.
        buf.write(off, &entry[..STATUS_OWN])?;
        {
            let mut d = lock(&self.done);
            *d &= !(1u64 << slot);
        }
        // Entry and mailboxes visible before the ownership bit.
        dma_wmb();
        buf.store_u8_release(off + STATUS_OWN, entry[STATUS_OWN])?;
        // Ownership visible before the doorbell (kernel: wmb() then iowrite32be).
        wmb();
        self.stats.posted.fetch_add(1, Ordering::Relaxed);
        self.bar.write32_be(hw::ISEG_CMD_DBELL, 1u32 << slot)?;

        let waited = if self.event_mode.load(Ordering::Acquire) {
            self.wait_event(slot, off, deadline)
        } else {
            self.wait_poll(off, deadline)
        };
        // A timeout names the command that did not complete.
        waited.map_err(|e| match e {
            Error::Timeout { after, .. } => Error::Timeout {
                what: Opcode::from_raw(opcode_of(input)).name(),
                after,
            },
            e => e,
        })?;
        // The ownership bit was seen clear: read what it guards.
        dma_rmb();
        let mut done = [0u8; ENTRY_SIZE];
        buf.read(off, &mut done)?;
        let mut ob = out_blocks;
        if let Some(r) = region {
            for (i, b) in ob.iter_mut().enumerate() {
                r.buf.read((nin + i) * BLOCK_STRIDE, b)?;
            }
        }
        if let Some(t) = &self.trace {
            let mut s = String::new();
            trace::write_dump(&mut s, &self.dev, trace::Direction::Output, &done, &ob);
            t.0(&s);
        }
        let done: &CmdLayout = zerocopy::transmute_ref!(&done);
        let output = parse_chain(done.out.as_bytes(), &ob, out_len);
        Ok((done.status_own, output))
    }

    fn wait_poll(&self, off: usize, deadline: &Deadline) -> Result<()> {
        let mut spins = 0u32;
        loop {
            if self.queue_buf.load_u8_acquire(off + STATUS_OWN)? & hw::CMD_OWNER_MASK
                == hw::CMD_OWNER_SW
            {
                return Ok(());
            }
            if let Some(e) = self.health_error() {
                return Err(e);
            }
            if deadline.passed() {
                return Err(Error::Timeout {
                    what: "command completion (polling)",
                    after: deadline.waited(),
                });
            }
            spins += 1;
            if spins < 1000 {
                std::thread::yield_now();
            } else {
                deadline.pause(POLL_PAUSE);
            }
        }
    }

    fn wait_event(&self, slot: usize, off: usize, deadline: &Deadline) -> Result<()> {
        let bit = 1u64 << slot;
        let mut d = lock(&self.done);
        loop {
            if *d & bit != 0 {
                *d &= !bit;
                drop(d);
                // A stale event of an earlier command on this slot can
                // arrive late: ownership is the truth.
                if self.queue_buf.load_u8_acquire(off + STATUS_OWN)? & hw::CMD_OWNER_MASK
                    == hw::CMD_OWNER_SW
                {
                    self.stats.by_event.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                d = lock(&self.done);
                continue;
            }
            if let Some(e) = self.health_error() {
                return Err(e);
            }
            if deadline.passed() {
                return Err(Error::Timeout {
                    what: "command completion event",
                    after: deadline.waited(),
                });
            }
            let (g, to) = self
                .done_cv
                .wait_timeout(d, deadline.slice(EVENT_WAIT_SLICE))
                .unwrap_or_else(|p| p.into_inner());
            d = g;
            if to.timed_out()
                && *d & bit == 0
                && self.queue_buf.load_u8_acquire(off + STATUS_OWN)? & hw::CMD_OWNER_MASK
                    == hw::CMD_OWNER_SW
            {
                // Firmware returned the entry but no event came (yet).
                self.stats.event_fallbacks.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("command slot {slot} complete without its CMD event");
                return Ok(());
            }
        }
    }
}

impl Cmd {
    /// Whether the device was declared failed (health): one atomic load,
    /// cheap enough for the data path.
    #[inline]
    pub fn is_failed(&self) -> bool {
        self.0.is_failed.load(Ordering::Acquire)
    }

    /// The failure as an error, if the device failed.
    pub fn failure(&self) -> Option<Error> {
        self.0.health_error()
    }

    /// Executes a command: `input` is the whole inbox (opcode first),
    /// `out_len` the outbox length. Returns the outbox; a failing delivery
    /// or command status becomes [`Error::Delivery`] / [`Error::Cmd`].
    pub fn exec(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>> {
        let (status_own, out) = self.0.exec_raw(input, out_len)?;
        check_status(opcode_of(input), op_mod_of(input), status_own, &out)?;
        Ok(out)
    }

    /// Executes a command and returns its outbox whatever the command
    /// status (DevX style); only a delivery failure is an error.
    pub fn exec_unchecked(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>> {
        let (status_own, out) = self.0.exec_raw(input, out_len)?;
        check_status(opcode_of(input), op_mod_of(input), status_own, &[])?;
        Ok(out)
    }

    /// Executes a page command on the slot reserved for them.
    pub(crate) fn exec_page(&self, input: &[u8], out_len: usize) -> Result<Vec<u8>> {
        let (status_own, out) = self.0.exec_page_raw(input, out_len)?;
        check_status(opcode_of(input), op_mod_of(input), status_own, &out)?;
        Ok(out)
    }

    /// Sends NOP (0x80d), the command that does nothing: a round trip.
    pub fn nop(&self) -> Result<()> {
        let mut inb = [0u8; 16];
        inb[..2].copy_from_slice(&Opcode::Nop.to_raw().to_be_bytes());
        self.exec(&inb, 16).map(|_| ())
    }

    /// Whether commands complete through events now.
    pub fn event_mode(&self) -> bool {
        self.0.event_mode.load(Ordering::Acquire)
    }

    /// Number of slots (`2^log_cmdq_size`), the page slot included.
    pub fn slots(&self) -> usize {
        self.0.slots.len()
    }

    /// The geometry and timeouts read from the init segment.
    pub fn geometry(&self) -> CmdGeometry {
        self.0.geo
    }

    /// The command queue's counters.
    pub fn stats(&self) -> &CmdStats {
        &self.0.stats
    }

    /// The health failure commands fail with, if any.
    pub fn health_failure(&self) -> Option<HealthEvent> {
        self.0.health_event()
    }
}

pub(crate) fn opcode_of(input: &[u8]) -> u16 {
    u16::from_be_bytes([
        input.first().copied().unwrap_or(0),
        input.get(1).copied().unwrap_or(0),
    ])
}

pub(crate) fn op_mod_of(input: &[u8]) -> u16 {
    u16::from_be_bytes([
        input.get(6).copied().unwrap_or(0),
        input.get(7).copied().unwrap_or(0),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn chains_of_any_length_round_trip() {
        for &len in &[
            16usize,
            100,
            16 + 512,
            16 + 1000,
            16 + 512 * 10 + 5,
            16 + 512 * 16,
        ] {
            let m = msg(len);
            let n = hw::mailbox_blocks(len);
            let base = 0x1234_0000u64;
            let chain = build_chain(&m[INLINE..], n, base, 0x5a);
            assert_eq!(chain.len(), n);
            for (i, b) in chain.iter().enumerate() {
                let next = block(b).next.get();
                if i + 1 < n {
                    assert_eq!(next, base + ((i + 1) * BLOCK_STRIDE) as u64);
                } else {
                    assert_eq!(next, 0);
                }
                assert!(block_sig_ok(b), "block {i} signature");
            }
            check_chain(&chain, 0x5a).unwrap();
            assert_eq!(parse_chain(&m[..INLINE], &chain, len), m);
        }
    }

    #[test]
    fn chain_checks_catch_bad_numbering_and_tokens() {
        let m = msg(16 + 1500);
        let mut chain = build_chain(&m[16..], 3, 0x1000, 9);
        assert_eq!(
            check_chain(&chain, 8),
            Err("mailbox token differs from the entry's")
        );
        block_mut(&mut chain[1]).block_num.set(5);
        assert!(check_chain(&chain, 9).is_err());
        assert!(!block_sig_ok(&chain[1]));
    }

    #[test]
    fn entry_layout_and_signature() {
        let m = msg(40);
        let raw = build_entry(&m, 0xaa000, 0xbb000, 0x100, 0x33);
        let e: &CmdLayout = zerocopy::transmute_ref!(&raw);
        assert_eq!(e.r#type, 7);
        assert_eq!(e.inlen.get(), 40);
        assert_eq!(e.r#in.as_bytes(), &m[..16]);
        assert_eq!(e.in_ptr.get(), 0xaa000);
        assert_eq!(e.out_ptr.get(), 0xbb000);
        assert_eq!(e.outlen.get(), 0x100);
        assert_eq!(e.token, 0x33);
        assert!(e.hw_owned() && e.sig_ok());
        // A short input: the rest of the inline area stays zero.
        let raw = build_entry(&m[..8], 0, 0, 16, 1);
        let e: &CmdLayout = zerocopy::transmute_ref!(&raw);
        assert_eq!(&e.r#in.as_bytes()[8..], &[0u8; 8]);
    }

    #[test]
    fn kernel_enable_hca_entry_matches() {
        // The kernel's ENABLE_HCA entry from a real trace (mlx5_hw::trace
        // docs): `030: 00000000 00000000 00000010 01fd0001`, i.e. outlen
        // 0x10, token 1, signature 0xfd, owned by hardware.
        let mut input = [0u8; 16];
        input[..2].copy_from_slice(&[0x01, 0x04]);
        let e = build_entry(&input, 0, 0, 0x10, 0x01);
        assert_eq!(&e[0x00..0x08], &[7, 0, 0, 0, 0, 0, 0, 0x10]);
        assert_eq!(&e[0x38..0x40], &[0, 0, 0, 0x10, 0x01, 0xfd, 0, 1]);
    }

    #[test]
    fn status_decoding() {
        let mut out = [0u8; 16];
        assert!(check_status(0x104, 0, 0, &out).is_ok());
        out[0] = 0x03;
        out[4..8].copy_from_slice(&0x1a2b_3c4du32.to_be_bytes());
        let e = check_status(0x301, 0, 0, &out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "CREATE_EQ (0x301) op_mod 0: bad parameter (0x3), syndrome 0x1a2b3c4d"
        );
        // Delivery status wins over the outbox.
        let e = check_status(0x301, 1, 0x10 << 1, &out).unwrap_err();
        assert!(matches!(
            e,
            Error::Delivery {
                status: DeliveryStatus::BadDescriptor,
                op_mod: 1,
                ..
            }
        ));
        let e = check_status(0x999, 0, 0, &[0x77, 0, 0, 0, 0, 0, 0, 1]).unwrap_err();
        assert!(e.to_string().contains("unknown"), "{e}");
        // A truncated outbox never panics.
        assert!(check_status(0x100, 0, 0, &[0x05]).is_err());
    }

    #[test]
    fn iseg_timeouts() {
        assert_eq!(iseg_timeout(0), Duration::ZERO);
        assert_eq!(iseg_timeout(1500), Duration::from_millis(1500));
        assert_eq!(iseg_timeout((1 << 29) | 60), Duration::from_secs(60));
        assert_eq!(iseg_timeout((2 << 29) | 2), Duration::from_secs(120));
    }
}
