//! Firmware pages: host memory the device asks for and gives back.
//!
//! Firmware says how many 4 KiB pages it needs at boot (QUERY_PAGES op_mod
//! 1), before INIT_HCA (op_mod 2) and at run time through PAGE_REQUEST
//! events (a positive count: give; negative: take back; `release_all`: it
//! already dropped every page of that function). Pages reach firmware only
//! as IOVAs in MANAGE_PAGES (0x108; op_mod 1 GIVE, 2 TAKE).
//!
//! Pages come from 2 MiB DMA blocks, each mapped once at a 2 MiB-aligned
//! IOVA; a 512-bit bitmap per block hands out its 4 KiB pages, and a block
//! is unmapped as soon as its last page comes back. Teardown takes every
//! page back (TAKE until firmware holds none, with a deadline) and then
//! frees whatever is left locally, so nothing stays mapped.
//!
//! Run-time requests are served by a worker thread, never by the event
//! thread: MANAGE_PAGES itself completes through the command EQ, which the
//! event thread must stay free to drain. Closing the HCA interrupts the
//! worker between two MANAGE_PAGES.
//!
//! Firmware may hold at most a budget of pages ([`Pages::budget`], set by
//! `HcaOptions::max_fw_pages`, by default [`default_budget`]: an eighth of
//! the machine's memory). A request beyond it is refused whole, before any
//! page is allocated: at run time the kernel's way (MANAGE_PAGES op_mod 0,
//! [`MANAGE_PAGES_CANT_GIVE`], "allocation failed"), at boot as
//! [`Error::PageBudget`].
//!
//! Picking a block with a free page is amortized O(1): blocks with room
//! sit on a stack (pushed when one is made or stops being full, popped when
//! it fills or is gone).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vfio::clock::Deadline;

use mlx5_hw::ifc::{manage_pages_in, manage_pages_out, query_pages_in, query_pages_out};
use mlx5_hw::ifc::{ManagePagesIn, ManagePagesOut, QueryPagesIn, QueryPagesOut};
use mlx5_hw::init::{ManagePagesOpMod, QueryPagesOpMod};
use mlx5_hw::opcode::Opcode;

use crate::cmd::Cmd;
use crate::dma::{DmaCtx, DmaRegion};
use crate::{Error, Result};

/// Firmware page size.
pub const FW_PAGE: usize = mlx5_hw::init::FW_PAGE_SIZE;
/// DMA block size pages are carved from.
pub const BLOCK_BYTES: usize = 2 << 20;
/// Pages per block.
pub const PAGES_PER_BLOCK: usize = BLOCK_BYTES / FW_PAGE;
/// Pages per MANAGE_PAGES command (keeps one message at 8 mailbox blocks).
pub const PAGES_PER_CMD: usize = 512;
/// How long teardown keeps asking for pages back (kernel: MLX5_TO_RECLAIM_PAGES_MS).
pub const RECLAIM_TIMEOUT: Duration = Duration::from_secs(5);

/// QUERY_PAGES op_mod: boot pages.
pub const QUERY_PAGES_BOOT: u16 = QueryPagesOpMod::BootPages.to_raw();
/// QUERY_PAGES op_mod: init pages.
pub const QUERY_PAGES_INIT: u16 = QueryPagesOpMod::InitPages.to_raw();
/// MANAGE_PAGES op_mod: the driver cannot give the pages firmware asked
/// for (Linux: MLX5_PAGES_CANT_GIVE, `page_notify_fail`).
pub const MANAGE_PAGES_CANT_GIVE: u16 = ManagePagesOpMod::AllocationFail.to_raw();
/// MANAGE_PAGES op_mod: give pages.
pub const MANAGE_PAGES_GIVE: u16 = ManagePagesOpMod::AllocationSuccess.to_raw();
/// MANAGE_PAGES op_mod: take pages.
pub const MANAGE_PAGES_TAKE: u16 = ManagePagesOpMod::HcaReturnPages.to_raw();

/// A 512-page occupancy bitmap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageBitmap {
    words: [u64; PAGES_PER_BLOCK / 64],
    used: usize,
}

impl PageBitmap {
    /// Takes the lowest free page.
    pub fn alloc(&mut self) -> Option<usize> {
        for (i, w) in self.words.iter_mut().enumerate() {
            if *w != u64::MAX {
                let b = (!*w).trailing_zeros() as usize;
                *w |= 1 << b;
                self.used += 1;
                return Some(i * 64 + b);
            }
        }
        None
    }

    /// Returns page `i`; false if it was not taken.
    pub fn free(&mut self, i: usize) -> bool {
        let (w, b) = (i / 64, i % 64);
        match self.words.get_mut(w) {
            Some(word) if *word & (1 << b) != 0 => {
                *word &= !(1 << b);
                self.used -= 1;
                true
            }
            _ => false,
        }
    }

    /// Pages taken.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Whether every page is taken.
    pub fn is_full(&self) -> bool {
        self.used == PAGES_PER_BLOCK
    }
}

#[derive(Debug)]
struct Block {
    region: DmaRegion,
    map: PageBitmap,
}

/// The page allocator: blocks keyed by IOVA, and which function holds each page.
#[derive(Debug)]
struct Allocator {
    dma: Arc<DmaCtx>,
    blocks: BTreeMap<u64, Block>,
    /// Bases of blocks that may have room (the top one is tried first;
    /// entries of blocks since filled or freed are dropped when met).
    room: Vec<u64>,
    /// IOVA of each page firmware holds -> (function id, ec_function).
    given: BTreeMap<u64, (u16, bool)>,
}

impl Allocator {
    fn new(dma: Arc<DmaCtx>) -> Self {
        Self {
            dma,
            blocks: BTreeMap::new(),
            room: Vec::new(),
            given: BTreeMap::new(),
        }
    }

    fn alloc_page(&mut self) -> Result<u64> {
        while let Some(&base) = self.room.last() {
            match self.blocks.get_mut(&base) {
                Some(b) if !b.map.is_full() => {
                    if let Some(i) = b.map.alloc() {
                        if b.map.is_full() {
                            self.room.pop();
                        }
                        return Ok(base + (i * FW_PAGE) as u64);
                    }
                    self.room.pop();
                }
                _ => {
                    self.room.pop();
                }
            }
        }
        let region = self.dma.alloc(BLOCK_BYTES)?;
        let base = region.iova.0;
        let mut map = PageBitmap::default();
        let i = map.alloc().unwrap_or(0);
        self.blocks.insert(base, Block { region, map });
        self.room.push(base);
        Ok(base + (i * FW_PAGE) as u64)
    }

    fn free_page(&mut self, iova: u64) -> bool {
        let Some((&base, b)) = self.blocks.range_mut(..=iova).next_back() else {
            return false;
        };
        if iova >= base + b.region.len() as u64 {
            return false;
        }
        let was_full = b.map.is_full();
        let ok = b.map.free(((iova - base) as usize) / FW_PAGE);
        if b.map.used() == 0 {
            // Dropping the region unmaps the block (its stale entry in
            // `room`, if any, is dropped when met).
            self.blocks.remove(&base);
        } else if ok && was_full {
            self.room.push(base);
        }
        ok
    }
}

/// A run-time page request (PAGE_REQUEST EQE data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    /// Function the pages are for.
    pub func_id: u16,
    /// Embedded-CPU function.
    pub ec_function: bool,
    /// Firmware already released every page of the function.
    pub release_all: bool,
    /// Pages to give (> 0) or take (< 0).
    pub num_pages: i32,
}

impl PageRequest {
    /// Decodes the 28-byte EQE data area of a PAGE_REQUEST event.
    pub fn from_eqe_data(d: &[u8]) -> Self {
        // A short buffer reads as zeros past its end.
        let mut raw = [0u8; mlx5_hw::ifc::eqe_page_req::SIZE_BYTES];
        let n = d.len().min(raw.len());
        raw[..n].copy_from_slice(&d[..n]);
        let r: mlx5_hw::ifc::EqePageReq = zerocopy::transmute!(raw);
        let ec = r.ec_function.get();
        Self {
            ec_function: ec & mlx5_hw::event::PAGE_REQ_EC_FUNCTION != 0,
            release_all: ec & mlx5_hw::event::PAGE_REQ_RELEASE_ALL_PAGES != 0,
            func_id: r.func_id.get(),
            num_pages: r.num_pages.get() as i32,
        }
    }
}

/// The default budget of pages firmware may hold: an eighth of the
/// machine's memory (`MemTotal` of /proc/meminfo), or 1 GiB where that
/// cannot be read; never less than [`MIN_BUDGET`].
pub fn default_budget() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kib| kib.saturating_mul(1024))
        .unwrap_or(8 << 30);
    ((total / 8) as usize / FW_PAGE).max(MIN_BUDGET)
}

/// The smallest budget [`default_budget`] gives: 256 MiB of pages, more
/// than any ConnectX asks for at boot.
pub const MIN_BUDGET: usize = (256 << 20) / FW_PAGE;

/// The firmware page supply of one function.
#[derive(Debug)]
pub struct Pages {
    alloc: Mutex<Allocator>,
    budget: usize,
    /// Set by close: the worker gives no more.
    stop: AtomicBool,
}

impl Pages {
    pub(crate) fn new(dma: Arc<DmaCtx>, budget: usize) -> Self {
        Self {
            alloc: Mutex::new(Allocator::new(dma)),
            budget,
            stop: AtomicBool::new(false),
        }
    }

    /// The most pages firmware may hold at once.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Stops giving (the HCA is closing): a give in progress ends after
    /// the MANAGE_PAGES in flight, with [`Error::Closed`].
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether `n` more pages fit the budget; else [`Error::PageBudget`].
    fn within_budget(&self, n: usize) -> Result<()> {
        let held = self.given();
        if n > self.budget.saturating_sub(held) {
            return Err(Error::PageBudget {
                requested: n as u64,
                held: held as u64,
                budget: self.budget as u64,
            });
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Allocator> {
        self.alloc.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pages firmware holds now.
    pub fn given(&self) -> usize {
        self.lock().given.len()
    }

    /// 2 MiB blocks mapped now.
    pub fn blocks(&self) -> usize {
        self.lock().blocks.len()
    }

    /// QUERY_PAGES: how many pages firmware wants (`op_mod` boot or init)
    /// and for which function.
    pub(crate) fn query(cmd: &Cmd, op_mod: u16) -> Result<(u16, i32)> {
        let mut inb = [0u8; query_pages_in::SIZE_BYTES];
        QueryPagesIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::QueryPages.to_raw())
            .set_op_mod(op_mod);
        let out = cmd.exec(&inb, query_pages_out::SIZE_BYTES)?;
        let o = QueryPagesOut::new_checked(&out[..]).map_err(|_| Error::BadOutput {
            opcode: Opcode::QueryPages,
            what: "short outbox",
        })?;
        Ok((o.function_id(), o.num_pages() as i32))
    }

    /// Asks firmware how many pages it needs now and gives them.
    pub(crate) fn satisfy(&self, cmd: &Cmd, op_mod: u16) -> Result<()> {
        let (func, n) = Self::query(cmd, op_mod)?;
        tracing::debug!("QUERY_PAGES op_mod {op_mod}: function {func} wants {n} pages");
        if n > 0 {
            self.give(cmd, func, false, n as usize)?;
        } else if n < 0 {
            self.take(cmd, func, false, n.unsigned_abs() as usize)?;
        }
        Ok(())
    }

    /// Gives `n` pages to function `func` (MANAGE_PAGES GIVE), all or
    /// none of them past the budget ([`Error::PageBudget`]).
    pub(crate) fn give(&self, cmd: &Cmd, func: u16, ec: bool, n: usize) -> Result<()> {
        self.within_budget(n)?;
        let mut left = n;
        while left > 0 {
            if self.stop.load(Ordering::Acquire) {
                return Err(Error::Closed);
            }
            let k = left.min(PAGES_PER_CMD);
            let mut pages = Vec::with_capacity(k);
            {
                let mut a = self.lock();
                for _ in 0..k {
                    match a.alloc_page() {
                        Ok(p) => pages.push(p),
                        Err(e) => {
                            for p in pages {
                                a.free_page(p);
                            }
                            return Err(e);
                        }
                    }
                }
            }
            let mut inb = vec![0u8; manage_pages_in::SIZE_BYTES + 8 * k];
            {
                let mut m = ManagePagesIn::new_unchecked(&mut inb[..]);
                m.set_opcode(Opcode::ManagePages.to_raw())
                    .set_op_mod(MANAGE_PAGES_GIVE)
                    .set_embedded_cpu_function(ec)
                    .set_function_id(func)
                    .set_input_num_entries(k as u32);
                for (i, p) in pages.iter().enumerate() {
                    m.set_pas(i, *p);
                }
            }
            match cmd.exec_page(&inb, manage_pages_out::SIZE_BYTES) {
                Ok(_) => {
                    let mut a = self.lock();
                    for p in pages {
                        a.given.insert(p, (func, ec));
                    }
                }
                Err(e) => {
                    let mut a = self.lock();
                    for p in pages {
                        a.free_page(p);
                    }
                    return Err(e);
                }
            }
            left -= k;
        }
        Ok(())
    }

    /// Takes up to `n` pages back from `func` (MANAGE_PAGES TAKE); returns
    /// how many firmware returned.
    pub(crate) fn take(&self, cmd: &Cmd, func: u16, ec: bool, n: usize) -> Result<usize> {
        let mut total = 0;
        let mut left = n;
        while left > 0 {
            let k = left.min(PAGES_PER_CMD);
            let mut inb = [0u8; manage_pages_in::SIZE_BYTES];
            ManagePagesIn::new_unchecked(&mut inb[..])
                .set_opcode(Opcode::ManagePages.to_raw())
                .set_op_mod(MANAGE_PAGES_TAKE)
                .set_embedded_cpu_function(ec)
                .set_function_id(func)
                .set_input_num_entries(k as u32);
            let out = cmd.exec_page(&inb, manage_pages_out::SIZE_BYTES + 8 * k)?;
            let o = ManagePagesOut::new_unchecked(&out[..]);
            let got = (o.output_num_entries() as usize).min(k);
            let mut a = self.lock();
            for i in 0..got {
                let p = o.pas(i);
                if a.given.remove(&p).is_some() {
                    a.free_page(p);
                } else {
                    tracing::warn!(
                        "MANAGE_PAGES TAKE returned {p:#x}, which firmware did not hold"
                    );
                }
            }
            drop(a);
            total += got;
            if got == 0 {
                break;
            }
            left -= k.min(left);
        }
        Ok(total)
    }

    /// Firmware dropped every page of `func` (a `release_all` request):
    /// free them without a command.
    pub(crate) fn release_all(&self, func: u16, ec: bool) -> usize {
        let mut a = self.lock();
        let pages: Vec<u64> = a
            .given
            .iter()
            .filter(|(_, &(f, e))| f == func && e == ec)
            .map(|(&p, _)| p)
            .collect();
        for p in &pages {
            a.given.remove(p);
            a.free_page(*p);
        }
        pages.len()
    }

    /// Tells firmware the pages it asked `func` for will not come
    /// (MANAGE_PAGES op_mod 0), as the kernel's `page_notify_fail` does.
    fn cant_give(&self, cmd: &Cmd, func: u16, ec: bool) -> Result<()> {
        let mut inb = [0u8; manage_pages_in::SIZE_BYTES];
        ManagePagesIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::ManagePages.to_raw())
            .set_op_mod(MANAGE_PAGES_CANT_GIVE)
            .set_embedded_cpu_function(ec)
            .set_function_id(func);
        cmd.exec_page(&inb, manage_pages_out::SIZE_BYTES)
            .map(|_| ())
    }

    /// Serves one run-time request. A give that cannot be made (past the
    /// budget, or memory or mappings failed) is reported to firmware with
    /// MANAGE_PAGES op_mod 0, and the error returned.
    pub fn handle(&self, cmd: &Cmd, req: PageRequest) -> Result<()> {
        if req.release_all {
            let n = self.release_all(req.func_id, req.ec_function);
            tracing::debug!("release_all: freed {n} pages of function {}", req.func_id);
            Ok(())
        } else if req.num_pages > 0 {
            let r = self.give(cmd, req.func_id, req.ec_function, req.num_pages as usize);
            match r {
                Err(Error::Closed) | Ok(()) => r,
                Err(e) => {
                    if !matches!(
                        e,
                        Error::Cmd { .. } | Error::Timeout { .. } | Error::Health(_)
                    ) {
                        if let Err(n) = self.cant_give(cmd, req.func_id, req.ec_function) {
                            tracing::warn!(
                                "MANAGE_PAGES (cannot give) for function {}: {n}",
                                req.func_id
                            );
                        }
                    }
                    Err(e)
                }
            }
        } else if req.num_pages < 0 {
            // The kernel caps one reclaim at 50 000 pages.
            let n = req
                .num_pages
                .max(mlx5_hw::event::MAX_RECLAIM_NPAGES)
                .unsigned_abs() as usize;
            self.take(cmd, req.func_id, req.ec_function, n).map(|_| ())
        } else {
            Ok(())
        }
    }

    /// Teardown: takes every page back (until firmware holds none, firmware
    /// returns none, or [`RECLAIM_TIMEOUT`] passes), then frees what is left
    /// locally so nothing stays mapped. Returns the pages firmware kept.
    pub(crate) fn reclaim_all(&self, cmd: Option<&Cmd>) -> usize {
        if let Some(cmd) = cmd {
            let deadline = Deadline::after(cmd.0.clock(), RECLAIM_TIMEOUT, "page reclaim");
            loop {
                let funcs: Vec<(u16, bool)> = {
                    let a = self.lock();
                    let mut v: Vec<_> = a.given.values().copied().collect();
                    v.dedup();
                    v.sort();
                    v.dedup();
                    v
                };
                if funcs.is_empty() || deadline.passed() {
                    break;
                }
                let mut progress = false;
                for (f, ec) in funcs {
                    let held = self
                        .lock()
                        .given
                        .values()
                        .filter(|&&v| v == (f, ec))
                        .count();
                    match self.take(cmd, f, ec, held) {
                        Ok(n) => progress |= n > 0,
                        Err(e) => {
                            tracing::warn!("reclaiming pages of function {f}: {e}");
                        }
                    }
                }
                if !progress {
                    break;
                }
            }
        }
        let mut a = self.lock();
        let kept = a.given.len();
        if kept > 0 && cmd.is_some() {
            tracing::warn!("{kept} firmware pages not returned; freeing them locally");
        } else if kept > 0 {
            // After a fast teardown (firmware let go of them) or a failure.
            tracing::debug!("{kept} firmware pages freed locally");
        }
        a.given.clear();
        a.blocks.clear();
        kept
    }
}

/// The page worker: serves PAGE_REQUESTs off the event thread.
#[derive(Debug)]
pub(crate) struct PageWorker {
    pages: Arc<Pages>,
    tx: Option<Sender<PageRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl PageWorker {
    pub(crate) fn start(pages: Arc<Pages>, cmd: Cmd) -> Result<Self> {
        let (tx, rx): (Sender<PageRequest>, Receiver<PageRequest>) = mpsc::channel();
        let p = pages.clone();
        let thread = std::thread::Builder::new()
            .name("mlx5-pages".into())
            .spawn(move || {
                while let Ok(req) = rx.recv() {
                    if p.stop.load(Ordering::Acquire) {
                        break;
                    }
                    if let Err(e) = p.handle(&cmd, req) {
                        tracing::error!("page request {req:?}: {e}");
                    }
                }
            })
            .map_err(|e| Error::os("spawn page worker", e))?;
        Ok(Self {
            pages,
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    pub(crate) fn sender(&self) -> Option<Sender<PageRequest>> {
        self.tx.clone()
    }

    /// Interrupts a give in progress and waits for the worker to end.
    pub(crate) fn stop(&mut self) {
        self.pages.stop();
        self.tx.take();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("page worker panicked");
            }
        }
    }
}

impl Drop for PageWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn bitmap_allocates_lowest_free_and_fills() {
        let mut m = PageBitmap::default();
        for i in 0..PAGES_PER_BLOCK {
            assert_eq!(m.alloc(), Some(i));
        }
        assert!(m.is_full());
        assert_eq!(m.alloc(), None);
        assert!(m.free(130));
        assert!(!m.free(130));
        assert!(!m.free(100_000));
        assert_eq!(m.alloc(), Some(130));
        for i in 0..PAGES_PER_BLOCK {
            assert!(m.free(i));
        }
        assert_eq!(m.used(), 0);
    }

    #[test]
    fn page_request_decoding() {
        let mut d = [0u8; 28];
        d[0..2].copy_from_slice(&0xc000u16.to_be_bytes());
        d[2..4].copy_from_slice(&3u16.to_be_bytes());
        d[4..8].copy_from_slice(&(-7i32).to_be_bytes());
        let r = PageRequest::from_eqe_data(&d);
        assert!(r.ec_function && r.release_all);
        assert_eq!((r.func_id, r.num_pages), (3, -7));
        // Short data never panics.
        assert_eq!(PageRequest::from_eqe_data(&[]).num_pages, 0);
    }

    #[test]
    fn allocator_maps_blocks_once_and_frees_them_empty() {
        let f: Arc<dyn vfio::PciFunction> = Arc::new(NullFunction::default());
        let dma = DmaCtx::new(f.clone()).unwrap();
        let mut a = Allocator::new(dma);
        let pages: Vec<u64> = (0..PAGES_PER_BLOCK + 3)
            .map(|_| a.alloc_page().unwrap())
            .collect();
        assert_eq!(a.blocks.len(), 2);
        assert_eq!(f.dma_mappings(), 2);
        for w in pages.windows(2).take(PAGES_PER_BLOCK - 1) {
            assert_eq!(w[1] - w[0], FW_PAGE as u64);
        }
        assert_eq!(pages[0] % BLOCK_BYTES as u64, 0);
        for p in &pages[PAGES_PER_BLOCK..] {
            assert!(a.free_page(*p));
        }
        assert_eq!(f.dma_mappings(), 1);
        for p in &pages[..PAGES_PER_BLOCK] {
            assert!(a.free_page(*p));
        }
        assert_eq!(f.dma_mappings(), 0);
        assert!(!a.free_page(pages[0]));
    }

    #[test]
    fn a_page_freed_in_a_full_block_is_the_next_one_given() {
        let f: Arc<dyn vfio::PciFunction> = Arc::new(NullFunction::default());
        let mut a = Allocator::new(DmaCtx::new(f.clone()).unwrap());
        let pages: Vec<u64> = (0..3 * PAGES_PER_BLOCK)
            .map(|_| a.alloc_page().unwrap())
            .collect();
        assert_eq!(a.blocks.len(), 3);
        // Block 0 is full; a page freed there is reused before a new block.
        assert!(a.free_page(pages[7]));
        assert_eq!(a.alloc_page().unwrap(), pages[7]);
        // A block emptied and unmapped leaves no usable entry behind.
        for p in &pages[PAGES_PER_BLOCK..2 * PAGES_PER_BLOCK] {
            assert!(a.free_page(*p));
        }
        assert_eq!(a.blocks.len(), 2);
        let next = a.alloc_page().unwrap();
        assert!(a.blocks.len() == 3 && !pages[..PAGES_PER_BLOCK].contains(&next));
        assert!(a.room.len() <= 3, "the stack holds blocks with room only");
    }

    /// A function with DMA bookkeeping only.
    #[derive(Debug, Default)]
    pub(crate) struct NullFunction {
        maps: Mutex<BTreeMap<u64, u64>>,
    }

    impl vfio::PciFunction for NullFunction {
        fn name(&self) -> &str {
            "null"
        }
        fn config_read(&self, _: u64, _: &mut [u8]) -> vfio::Result<()> {
            Ok(())
        }
        fn config_write(&self, _: u64, _: &[u8]) -> vfio::Result<()> {
            Ok(())
        }
        fn region_info(&self, i: u32) -> vfio::Result<vfio::RegionInfo> {
            Err(vfio::Error::NoRegion(i))
        }
        fn region_read(&self, i: u32, _: u64, _: &mut [u8]) -> vfio::Result<()> {
            Err(vfio::Error::NoRegion(i))
        }
        fn region_write(&self, i: u32, _: u64, _: &[u8]) -> vfio::Result<()> {
            Err(vfio::Error::NoRegion(i))
        }
        fn map_region(&self, i: u32) -> vfio::Result<vfio::Mmio> {
            Err(vfio::Error::NoRegion(i))
        }
        fn irq_count(&self, _: vfio::IrqKind) -> vfio::Result<u32> {
            Ok(0)
        }
        fn set_irqs(
            &self,
            _: vfio::IrqKind,
            _: u32,
            _: &[Option<&vmm_sys_util::eventfd::EventFd>],
        ) -> vfio::Result<()> {
            Ok(())
        }
        fn iova_ranges(&self) -> vfio::Result<Vec<vfio::IovaRange>> {
            Ok(vec![vfio::IovaRange {
                start: 0x10000,
                last: (1 << 39) - 1,
            }])
        }
        fn dma_map(&self, iova: vfio::Iova, buf: &Arc<vfio::DmaBuffer>) -> vfio::Result<()> {
            self.maps.lock().unwrap().insert(iova.0, buf.len() as u64);
            Ok(())
        }
        fn dma_unmap(&self, iova: vfio::Iova, len: u64) -> vfio::Result<()> {
            match self.maps.lock().unwrap().remove(&iova.0) {
                Some(l) if l == len => Ok(()),
                _ => Err(vfio::Error::Iova {
                    iova: iova.0,
                    len,
                    why: "not mapped",
                }),
            }
        }
        fn dma_mappings(&self) -> usize {
            self.maps.lock().unwrap().len()
        }
        fn reset(&self) -> vfio::Result<()> {
            Ok(())
        }
    }
}
