//! On-demand paging (`IBV_ACCESS_ON_DEMAND`): memory registered without
//! being mapped for DMA; the device raises a page fault when it touches a
//! page that is not present, this driver maps it and resumes, as
//! `drivers/infiniband/hw/mlx5/odp.c` does in the kernel.
//!
//! - **Explicit** ([`Pd::reg_mr_odp`]): an MTT key of 4 KiB entries over the
//!   region, all absent at first (a free cache-style key made present by
//!   UMR, as `alloc_cacheable_mr`): nothing is mapped.
//! - **Implicit** ([`Pd::reg_mr_implicit`], `ibv_reg_mr(NULL, SIZE_MAX,
//!   ON_DEMAND)`): a KSM key over the whole user address space
//!   (`[0, 2^47)`), entries of [`IMR_MTT_SIZE`] (1 GiB, Linux's
//!   `MLX5_IMR_MTT_SIZE`) on the null mkey; the first fault in a GiB makes
//!   its child, an MTT key of [`IMR_MTT_ENTRIES`] absent entries, and
//!   points the parent's entry at it by UMR.
//! - **Faults**: the first ODP region creates the page-fault EQ (event type
//!   PAGE_FAULT on the control vector) and a handler thread that takes its
//!   events: an RDMA fault names the rkey and range; a WQE fault the QP and
//!   WQE index, whose data segments it reads from the QP's own memory (send
//!   WQE for the requester, receive WQE for `RESP`). For each range of an
//!   ODP region it checks the process still maps the memory
//!   ([`crate::vma::page_size_of`]), maps the missing pages for DMA (one
//!   IOMMU mapping per run of pages, `PciFunction::dma_map_host`), writes
//!   their MTT entries present by UMR on the context's UMR QP, then sends
//!   PAGE_FAULT_RESUME (with `error` when a range could not be mapped: the
//!   device then completes the work request with its error CQE).
//! - **Prefetch** ([`OdpMr::advise`], `ibv_advise_mr`): PREFETCH and
//!   PREFETCH_WRITE map the ranges as a fault would; PREFETCH_NO_FAULT only
//!   the pages the process has resident (`mincore`), as the kernel maps
//!   only pages already in its page tables. Always synchronous (FLUSH or
//!   not): when it returns, the first access does not fault.
//! - **Invalidation** ([`OdpMr::invalidate_range`]): what the kernel's MMU
//!   notifier does when memory is unmapped or changed: every run of
//!   mapped pages that meets the range is made absent by UMR (the device
//!   stops using it), then unmapped from the IOMMU; the next access faults
//!   again and maps whatever memory is there then. User space has no MMU
//!   notifier: the application calls it before `munmap`/`mremap`/
//!   `madvise(DONTNEED)`, or [`OdpMr::watch_unmaps`] calls it on the
//!   `userfaultfd` events of those (`crate::uffd`).
//! - **Statistics** ([`OdpStats`], the per-MR counters Linux reports with
//!   `rdma stat show mr`: page faults, pages faulted, invalidations,
//!   prefetches), per region and per context.
#![allow(unsafe_code)] // Process memory the caller vouches for; `mincore`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use mlx5_hw::event::{self as ev, EventType, PageFaultSubtype};
use mlx5_hw::ifc::{
    create_mkey_in, create_mkey_out, page_fault_resume_in, page_fault_resume_out,
    query_special_contexts_out, trans_page_fault_info, CreateMkeyIn, CreateMkeyOut,
    EqePageFaultRdma, EqePageFaultWqe,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::wqe::{
    MKC_ACCESS_MODE_KSM, MKC_ACCESS_MODE_MTT, MTT_ENTRY_BYTES, MTT_PRESENT, UMR_FLEX_ALIGNMENT,
    UMR_OCTOWORD,
};
use vfio::{DmaBuffer, Iova};
use zerocopy::FromBytes;

use crate::buf::DmaSlice;
use crate::device::Ctx;
use crate::eq::Eq;
use crate::mr::{access, check_access, MKC_QPN_NONE};
use crate::pd::{Pd, PdInner};
use crate::umr::{UmrEngine, UmrWr, UmrXlt};
use crate::{Error, Result};

/// Page size of ODP translations (4 KiB MTT entries).
pub const ODP_PAGE: u64 = 4096;
/// log2 of what one implicit child covers (`MLX5_IMR_MTT_SHIFT`).
pub const IMR_MTT_SHIFT: u32 = 30;
/// What one implicit child covers (`MLX5_IMR_MTT_SIZE`, 1 GiB).
pub const IMR_MTT_SIZE: u64 = 1 << IMR_MTT_SHIFT;
/// MTT entries of an implicit child (`MLX5_IMR_MTT_ENTRIES`).
pub const IMR_MTT_ENTRIES: u64 = IMR_MTT_SIZE / ODP_PAGE;
/// log2 of the address space an implicit key covers (x86-64 and aarch64
/// user space: 47 bits).
pub const IMR_SPAN_SHIFT: u32 = 47;
/// KSM entries of the implicit key.
pub const IMR_KSM_ENTRIES: u64 = 1 << (IMR_SPAN_SHIFT - IMR_MTT_SHIFT);
/// Entries of the page-fault EQ.
const PF_EQ_NENT: u32 = 1024;
/// How long the fault thread waits before looking whether to stop.
const PF_POLL: Duration = Duration::from_millis(20);

/// `ibv_advise_mr` advice, with libibverbs' values.
pub mod advice {
    /// IBV_ADVISE_MR_ADVICE_PREFETCH: map for reading.
    pub const PREFETCH: u32 = 0;
    /// IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE: map for writing.
    pub const PREFETCH_WRITE: u32 = 1;
    /// IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT: map only what is resident.
    pub const PREFETCH_NO_FAULT: u32 = 2;
    /// IBV_ADVISE_MR_FLAG_FLUSH: return when done (this driver always does).
    pub const FLAG_FLUSH: u32 = 1;
}

/// The advice and flags `ibv_advise_mr` takes: anything else is
/// `EOPNOTSUPP`, as `mlx5_ib_advise_mr` answers.
fn check_advice(advice: u32, flags: u32) -> Result<()> {
    if advice > advice::PREFETCH_NO_FAULT || flags & !advice::FLAG_FLUSH != 0 {
        return Err(Error::NotSupported("ibv_advise_mr advice or flags"));
    }
    Ok(())
}

/// One entry of [`Pd::advise_mr`]'s list (`struct ibv_sge`): a range of
/// the ODP region whose key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdviseSge {
    /// Start of the range.
    pub addr: u64,
    /// Its length in bytes.
    pub length: u32,
    /// The ODP region's lkey.
    pub lkey: u32,
}

/// `IBV_ODP_SUPPORT*` (`enum ibv_odp_general_caps`) and the per-transport
/// bits (`enum ibv_odp_transport_cap_bits`).
pub mod odp_caps {
    /// IBV_ODP_SUPPORT.
    pub const SUPPORT: u64 = 1 << 0;
    /// IBV_ODP_SUPPORT_IMPLICIT.
    pub const SUPPORT_IMPLICIT: u64 = 1 << 1;
    /// IBV_ODP_SUPPORT_SEND.
    pub const SEND: u32 = 1 << 0;
    /// IBV_ODP_SUPPORT_RECV.
    pub const RECV: u32 = 1 << 1;
    /// IBV_ODP_SUPPORT_WRITE.
    pub const WRITE: u32 = 1 << 2;
    /// IBV_ODP_SUPPORT_READ.
    pub const READ: u32 = 1 << 3;
    /// IBV_ODP_SUPPORT_ATOMIC.
    pub const ATOMIC: u32 = 1 << 4;
    /// IBV_ODP_SUPPORT_SRQ_RECV.
    pub const SRQ_RECV: u32 = 1 << 5;
}

/// What on-demand paging the device offers this driver (`struct
/// ibv_odp_caps`, `xrc_odp_caps`, mlx5dv's `dc_odp_caps`), as
/// `mlx5_ib`'s `internal_fill_odp_caps` derives it from the HCA caps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OdpCaps {
    /// [`odp_caps::SUPPORT`], [`odp_caps::SUPPORT_IMPLICIT`].
    pub general_caps: u64,
    /// RC: [`odp_caps`]'s transport bits.
    pub rc_odp_caps: u32,
    /// UC (none: mlx5_ib reports none).
    pub uc_odp_caps: u32,
    /// UD.
    pub ud_odp_caps: u32,
    /// XRC.
    pub xrc_odp_caps: u32,
    /// DC (`mlx5dv_context.dc_odp_caps`).
    pub dc_odp_caps: u32,
}

impl crate::device::Context {
    /// The device's ODP caps as verbs reports them. None where the
    /// function has no page requests (`pg`), UMR cannot load translations
    /// (`umr_modify_entity_size_disabled`), or firmware reports faults by
    /// the memory scheme (`mem_page_fault`), whose events this driver does
    /// not handle; implicit ODP where `null_mkey`, `fixed_buffer_size`
    /// and `umr_extended_translation_offset` are set and indirect UMR is
    /// not disabled.
    pub fn odp_caps(&self) -> OdpCaps {
        let caps = self.ctx.hca.caps();
        let g = caps.gen();
        let Some(odp) = caps.odp() else {
            return OdpCaps::default();
        };
        if !g.pg() || g.umr_modify_entity_size_disabled() || odp.mem_page_fault() {
            return OdpCaps::default();
        }
        let scheme = odp.transport_page_fault_scheme_cap();
        let bits = |t: mlx5_hw::ifc::OdpPerTransportServiceCap<&[u8]>, mask: u32| {
            let mut b = 0;
            for (on, bit) in [
                (t.send(), odp_caps::SEND),
                (t.receive(), odp_caps::RECV),
                (t.write(), odp_caps::WRITE),
                (t.read(), odp_caps::READ),
                (t.atomic(), odp_caps::ATOMIC),
                (t.srq_receive(), odp_caps::SRQ_RECV),
            ] {
                if on {
                    b |= bit;
                }
            }
            b & mask
        };
        let all = !0;
        let mut general_caps = odp_caps::SUPPORT;
        if g.fixed_buffer_size()
            && g.null_mkey()
            && g.umr_extended_translation_offset()
            && !g.umr_indirect_mkey_disabled()
        {
            general_caps |= odp_caps::SUPPORT_IMPLICIT;
        }
        OdpCaps {
            general_caps,
            rc_odp_caps: bits(scheme.rc_odp_caps(), all),
            uc_odp_caps: 0,
            // mlx5_ib reports UD's SEND and SRQ_RECV only.
            ud_odp_caps: bits(scheme.ud_odp_caps(), odp_caps::SEND | odp_caps::SRQ_RECV),
            xrc_odp_caps: bits(scheme.xrc_odp_caps(), all),
            dc_odp_caps: bits(scheme.dc_odp_caps(), all),
        }
    }
}

/// On-demand paging counters (per region, or summed over a context).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OdpStats {
    /// Page-fault events handled (`page_faults`).
    pub page_faults: u64,
    /// Of those, the ones resolved and resumed without error (mlx5_ib's
    /// `page_faults_handled`): the device has taken the access up again.
    pub faults_handled: u64,
    /// Pages mapped by faults.
    pub pages_faulted: u64,
    /// Faults that could not be resolved (resumed with an error).
    pub fault_errors: u64,
    /// Invalidations (`page_invalidations`): ranges invalidated.
    pub invalidations: u64,
    /// Pages made absent by them.
    pub pages_invalidated: u64,
    /// Prefetch requests (`page_prefetch`), and pages they mapped.
    pub prefetches: u64,
    /// Pages mapped by prefetch.
    pub pages_prefetched: u64,
    /// IOMMU mappings the region holds now (one per run of pages).
    pub mappings: u64,
}

#[derive(Debug, Default)]
struct Counters {
    page_faults: AtomicU64,
    faults_handled: AtomicU64,
    pages_faulted: AtomicU64,
    fault_errors: AtomicU64,
    invalidations: AtomicU64,
    pages_invalidated: AtomicU64,
    prefetches: AtomicU64,
    pages_prefetched: AtomicU64,
    mappings: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> OdpStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OdpStats {
            page_faults: g(&self.page_faults),
            faults_handled: g(&self.faults_handled),
            pages_faulted: g(&self.pages_faulted),
            fault_errors: g(&self.fault_errors),
            invalidations: g(&self.invalidations),
            pages_invalidated: g(&self.pages_invalidated),
            prefetches: g(&self.prefetches),
            pages_prefetched: g(&self.pages_prefetched),
            mappings: g(&self.mappings),
        }
    }
}

/// Where a QP's WQEs live (read by the fault handler): `sq_cnt` send
/// WQE blocks at `sq_base` and `rq_cnt` receive WQEs of `rq_stride` bytes
/// at the start of `region`.
#[derive(Debug, Clone)]
pub(crate) struct QpMem {
    pub buf: Arc<DmaBuffer>,
    pub base: usize,
    pub sq_base: usize,
    pub sq_cnt: u32,
    pub rq_stride: usize,
    pub rq_cnt: u32,
    /// UD or DCI: its send WQEs carry an address vector after the
    /// control segment.
    pub datagram: bool,
}

impl QpMem {
    /// The queues of a QP whose buffer is `region`.
    pub(crate) fn new(
        region: &DmaSlice,
        sq_base: usize,
        sq_cnt: u32,
        rq_stride: usize,
        rq_cnt: u32,
        datagram: bool,
    ) -> Self {
        QpMem {
            buf: region.buf().clone(),
            base: region.offset(),
            sq_base,
            sq_cnt,
            rq_stride,
            rq_cnt,
            datagram,
        }
    }
}

/// Where an SRQ's WQEs live: `cnt` WQEs of `stride` bytes, each a next
/// segment and data segments.
#[derive(Debug, Clone)]
struct SrqMem {
    buf: Arc<DmaBuffer>,
    base: usize,
    stride: usize,
    cnt: u32,
}

/// A context's on-demand paging state.
#[derive(Debug, Default)]
pub(crate) struct CtxOdp {
    qps: Mutex<HashMap<u32, QpMem>>,
    srqs: Mutex<HashMap<u32, SrqMem>>,
    mrs: RwLock<HashMap<u32, Weak<OdpMrInner>>>,
    engine: Mutex<Weak<Engine>>,
    total: Counters,
}

impl CtxOdp {
    /// A QP was created: where its queues are.
    pub(crate) fn qp_created(&self, qpn: u32, m: QpMem) {
        lock(&self.qps).insert(qpn, m);
    }

    /// A QP is destroyed.
    pub(crate) fn qp_gone(&self, qpn: u32) {
        lock(&self.qps).remove(&qpn);
    }

    /// An SRQ was created: where its `cnt` WQEs of `stride` bytes are.
    pub(crate) fn srq_created(&self, srqn: u32, region: &DmaSlice, stride: usize, cnt: u32) {
        let m = SrqMem {
            buf: region.buf().clone(),
            base: region.offset(),
            stride,
            cnt,
        };
        lock(&self.srqs).insert(srqn, m);
    }

    /// An SRQ is destroyed.
    pub(crate) fn srq_gone(&self, srqn: u32) {
        lock(&self.srqs).remove(&srqn);
    }

    fn mr(&self, key: u32) -> Option<Arc<OdpMrInner>> {
        let m = self
            .mrs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(key >> 8))?
            .upgrade()?;
        (m.mkey == key).then_some(m)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The page-fault EQ and its handler thread, while an ODP region exists.
#[derive(Debug)]
struct Engine {
    ctx: Arc<Ctx>,
    eq: Arc<Eq>,
    umr: Arc<UmrEngine>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    fn get(ctx: &Arc<Ctx>) -> Result<Arc<Engine>> {
        let mut w = lock(&ctx.odp.engine);
        if let Some(e) = w.upgrade() {
            return Ok(e);
        }
        let g = ctx.hca.caps().gen();
        if !g.pg() {
            return Err(Error::NotSupported("on-demand paging (pg)"));
        }
        let umr = ctx.umr_engine()?;
        let rx = ctx.hca.subscribe_events();
        let uar = ctx.alloc_uar()?;
        let mask = ev::event_mask_bit(EventType::PageFault);
        let eq = ctx.hca.create_ctrl_eq(uar, PF_EQ_NENT, mask)?;
        let stop = Arc::new(AtomicBool::new(false));
        let weak = Arc::downgrade(ctx);
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mlx5-odp-faults".into())
            .spawn(move || fault_loop(&weak, &rx, &st))
            .map_err(|e| Error::os("spawn ODP fault thread", e))?;
        let e = Arc::new(Engine {
            ctx: ctx.clone(),
            eq,
            umr,
            stop,
            thread: Mutex::new(Some(thread)),
        });
        *w = Arc::downgrade(&e);
        Ok(e)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        if let Err(e) = self.eq.destroy(self.ctx.hca.cmd()) {
            tracing::warn!("DESTROY_EQ of the page-fault EQ: {e}");
        }
    }
}

/// The fault thread: page-fault events until the engine goes.
fn fault_loop(
    ctx: &Weak<Ctx>,
    rx: &std::sync::mpsc::Receiver<crate::eq::AsyncEvent>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) {
        let a = match rx.recv_timeout(PF_POLL) {
            Ok(a) => a,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if a.event_type != EventType::PageFault {
            continue;
        }
        let Some(ctx) = ctx.upgrade() else {
            return;
        };
        handle_fault(&ctx, a.sub_type, &a.data);
    }
}

/// A range a fault names: key, address, length, written or read.
#[derive(Debug, Clone, Copy)]
struct Range {
    key: u32,
    va: u64,
    len: u64,
}

/// Resolves one page fault and resumes it.
fn handle_fault(ctx: &Arc<Ctx>, sub: u8, data: &[u8; ev::EQE_DATA_SIZE]) {
    let (token, ty, wq, ranges) = match PageFaultSubtype::from_raw(sub) {
        PageFaultSubtype::Rdma => {
            let Ok(d) = EqePageFaultRdma::read_from_bytes(&data[..]) else {
                return;
            };
            let pt = d.pftype_token.get();
            let token = pt & 0xff_ffff;
            let r = Range {
                key: d.r_key.get(),
                va: d.rdma_va.get(),
                len: u64::from(d.rdma_op_len.get()).max(1),
            };
            (token, (pt >> ev::PFTYPE_SHIFT) as u8, token, Ok(vec![r]))
        }
        PageFaultSubtype::Wqe => {
            let Ok(d) = EqePageFaultWqe::read_from_bytes(&data[..]) else {
                return;
            };
            let pw = d.pftype_wq.get();
            let ty = ((pw >> ev::PFTYPE_SHIFT) & 7) as u8;
            let wq = pw & 0xff_ffff;
            let r = wqe_ranges(ctx, wq, d.wqe_index.get(), ty);
            (d.token.get() & 0xff_ffff, ty, wq, r)
        }
        other => {
            tracing::warn!("page fault of subtype {other}: not handled");
            return;
        }
    };
    let mut touched = Vec::new();
    let ok = ranges.and_then(|rs| {
        for r in rs {
            fault_in(ctx, r, 0, &mut touched)?;
        }
        Ok(())
    });
    let error = match ok {
        Ok(()) => false,
        Err(e) => {
            tracing::debug!("page fault (token {token:#x}, wq {wq:#x}) not resolved: {e}");
            ctx.odp.total.fault_errors.fetch_add(1, Ordering::Relaxed);
            true
        }
    };
    match resume(ctx, token, ty, wq, error) {
        Err(e) => tracing::warn!("PAGE_FAULT_RESUME of token {token:#x}: {e}"),
        Ok(()) if !error => {
            for mr in &touched {
                mr.counters.faults_handled.fetch_add(1, Ordering::Relaxed);
            }
            ctx.odp.total.faults_handled.fetch_add(1, Ordering::Relaxed);
        }
        Ok(()) => {}
    }
}

/// Maps the pages of one faulting range, as Linux's
/// `pagefault_single_data_segment`: in the ODP region its key names; for
/// an indirect (KLM or KSM) key, in the regions its entries name over the
/// range (the list read back by QUERY_MKEY, as for a DevX indirect key),
/// at most `max_indirection` deep; any other key is taken as present (the
/// kernel's "non-ODP MR": a WQE may mix ODP and pinned keys).
fn fault_in(
    ctx: &Arc<Ctx>,
    r: Range,
    depth: u32,
    touched: &mut Vec<Arc<OdpMrInner>>,
) -> Result<()> {
    if let Some(mr) = ctx.odp.mr(r.key) {
        touched.push(mr.clone());
        mr.counters.page_faults.fetch_add(1, Ordering::Relaxed);
        ctx.odp.total.page_faults.fetch_add(1, Ordering::Relaxed);
        let n = mr.map_range(r.va, r.len, MapWhy::Fault)?;
        mr.counters.pages_faulted.fetch_add(n, Ordering::Relaxed);
        ctx.odp.total.pages_faulted.fetch_add(n, Ordering::Relaxed);
        return Ok(());
    }
    let Some(list) = crate::mkey_query::query_indirect(ctx, r.key)? else {
        return Ok(());
    };
    if depth >= u32::from(ctx.hca.caps().gen().max_indirection()) {
        return Err(Error::Fault(
            "page fault through keys nested past max_indirection",
        ));
    }
    let mut skip =
        r.va.checked_sub(list.start_addr)
            .ok_or(Error::Fault("page fault below an indirect key's range"))?;
    let mut left = r.len;
    for e in &list.entries {
        if left == 0 {
            break;
        }
        if skip >= e.bcount {
            skip -= e.bcount;
            continue;
        }
        let len = (e.bcount - skip).min(left);
        let sub = Range {
            key: e.key,
            va: e.va.wrapping_add(skip),
            len,
        };
        fault_in(ctx, sub, depth + 1, touched)?;
        left -= len;
        skip = 0;
    }
    Ok(())
}

/// PAGE_FAULT_RESUME (transport scheme), as `mlx5_ib_page_fault_resume`.
fn resume(ctx: &Ctx, token: u32, ty: u8, wq: u32, error: bool) -> Result<()> {
    let mut inb = vec![0u8; page_fault_resume_in::SIZE_BYTES];
    page_fault_resume_in::OPCODE.set(&mut inb, u64::from(Opcode::PageFaultResume.to_raw()));
    let info = &mut inb[page_fault_resume_in::PAGE_FAULT_INFO.off / 8..];
    trans_page_fault_info::PAGE_FAULT_TYPE.set(info, u64::from(ty));
    trans_page_fault_info::FAULT_TOKEN.set(info, u64::from(token));
    trans_page_fault_info::WQ_NUMBER.set(info, u64::from(wq));
    trans_page_fault_info::ERROR.set(info, u64::from(error));
    ctx.hca
        .cmd()
        .exec(&inb, page_fault_resume_out::SIZE_BYTES)
        .map(|_| ())
}

/// The data segments of the WQE a WQE-subtype fault names (what
/// `mlx5_ib_mr_initiator_pfault_handler` / `..._responder_...` parse).
fn wqe_ranges(ctx: &Ctx, wq: u32, index: u16, ty: u8) -> Result<Vec<Range>> {
    if ty == ev::WQE_PF_TYPE_RMP {
        return srq_wqe_ranges(ctx, wq, index);
    }
    let q = lock(&ctx.odp.qps)
        .get(&wq)
        .cloned()
        .ok_or(Error::Invalid("page fault on an unknown work queue"))?;
    if ty & ev::PFAULT_REQUESTOR != 0 {
        send_wqe_ranges(&q, index)
    } else if ty == ev::WQE_PF_TYPE_RESP && q.rq_cnt > 0 {
        let i = usize::from(index) & (q.rq_cnt as usize - 1);
        let mut w = vec![0u8; q.rq_stride];
        q.buf.read(q.base + i * q.rq_stride, &mut w)?;
        Ok(data_segs(&w))
    } else {
        Err(Error::Invalid(
            "receive page fault on a QP without a receive queue",
        ))
    }
}

/// The data segments of SRQ `srqn`'s WQE `index`, after its next segment
/// (`mlx5_ib_mr_responder_pfault_handler_srq`).
fn srq_wqe_ranges(ctx: &Ctx, srqn: u32, index: u16) -> Result<Vec<Range>> {
    let q = lock(&ctx.odp.srqs)
        .get(&srqn)
        .cloned()
        .ok_or(Error::Invalid("page fault on an unknown SRQ"))?;
    let i = usize::from(index) & (q.cnt as usize - 1);
    let mut w = vec![0u8; q.stride];
    q.buf.read(q.base + i * q.stride, &mut w)?;
    let next = mlx5_hw::ifc::wqe_srq_next_seg::SIZE_BYTES;
    Ok(data_segs(w.get(next..).unwrap_or_default()))
}

/// The data segments of send WQE `index` (control segment, a UD or DCI
/// WQE's address vector, the remote address and atomic segments its
/// opcode carries, then data segments), as
/// `mlx5_ib_mr_initiator_pfault_handler` walks it.
fn send_wqe_ranges(q: &QpMem, index: u16) -> Result<Vec<Range>> {
    use mlx5_hw::wqe::WqeOpcode as W;
    let bb = |i: u16, out: &mut [u8]| {
        let n = usize::from(i) & (q.sq_cnt as usize - 1);
        q.buf.read(q.base + q.sq_base + n * 64, out)
    };
    let mut w = vec![0u8; 64];
    bb(index, &mut w)?;
    let ds = (u32::from_be_bytes([w[4], w[5], w[6], w[7]]) & 0x3f) as usize;
    let nbb = mlx5_hw::wqe::wqebbs_for_ds(ds).max(1);
    w.resize(nbb * 64, 0);
    for i in 1..nbb {
        bb(index.wrapping_add(i as u16), &mut w[i * 64..(i + 1) * 64])?;
    }
    w.truncate(ds * 16);
    let opcode = W::from(w[3]);
    let mut at = 16;
    if q.datagram {
        // The address vector: extended (48 bytes) or base (16).
        let d = at + mlx5_hw::ifc::av::DQP_DCT.off / 8;
        let dqp_dct = w
            .get(d..d + 4)
            .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        at += if dqp_dct & mlx5_hw::wqe::EXTENDED_UD_AV != 0 {
            mlx5_hw::ifc::av::SIZE_BYTES
        } else {
            mlx5_hw::wqe::BASE_AV_BYTES
        };
    }
    if matches!(
        opcode,
        W::RdmaWrite | W::RdmaWriteImm | W::RdmaRead | W::AtomicCs | W::AtomicFa
    ) {
        at += 16;
    }
    if matches!(opcode, W::AtomicCs | W::AtomicFa) {
        at += 16;
    }
    Ok(data_segs(w.get(at..).unwrap_or_default()))
}

/// Data segments (`mlx5_wqe_data_seg`) in `b` up to an inline segment or
/// the terminating lkey.
fn data_segs(b: &[u8]) -> Vec<Range> {
    let mut out = Vec::new();
    for s in b.chunks_exact(16) {
        let bc = u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
        let key = u32::from_be_bytes([s[4], s[5], s[6], s[7]]);
        if bc & mlx5_hw::wqe::INLINE_SEG != 0 || key == mlx5_hw::wqe::TERMINATE_SCATTER_LIST_LKEY {
            break;
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&s[8..16]);
        let len = if bc == 0 { 1 << 31 } else { u64::from(bc) };
        out.push(Range {
            key,
            va: u64::from_be_bytes(a),
            len,
        });
    }
    out
}

/// One run of mapped pages: its first page (index in its key's MTT),
/// length in pages, IOVA.
#[derive(Debug, Clone, Copy)]
struct Run {
    pages: u64,
    iova: Iova,
}

/// The translation of one MTT key of 4 KiB entries: the region's key
/// (explicit) or an implicit child.
#[derive(Debug)]
struct Space {
    mkey: u32,
    /// Virtual address of entry 0.
    base: u64,
    runs: BTreeMap<u64, Run>,
}

/// MTT entries a translation write covers at least, and aligns to: 64
/// bytes (`MLX5_UMR_MTT_NUM_ENTRIES_ALIGNMENT`, as `mlx5r_umr_update_xlt`
/// widens a write to it with the neighbours' current entries).
const XLT_ALIGN_ENTRIES: u64 = (UMR_FLEX_ALIGNMENT as u64) / MTT_ENTRY_BYTES;

impl Space {
    /// The MTT entry of page `p` as the runs have it (present with its
    /// IOVA, or 0).
    fn entry(&self, p: u64) -> u64 {
        match self.runs.range(..=p).next_back() {
            Some((&f, r)) if p < f + r.pages => (r.iova.0 + (p - f) * ODP_PAGE) | MTT_PRESENT,
            _ => 0,
        }
    }

    /// Pages `first .. first + n` written as `new(p)` into the key, widened
    /// to [`XLT_ALIGN_ENTRIES`] with the other pages' current entries.
    fn write(&self, umr: &UmrEngine, first: u64, n: u64, new: impl Fn(u64) -> u64) -> Result<()> {
        let a0 = first - first % XLT_ALIGN_ENTRIES;
        let a1 = (first + n).next_multiple_of(XLT_ALIGN_ENTRIES);
        let words: Vec<u64> = (a0..a1)
            .map(|p| {
                if (first..first + n).contains(&p) {
                    new(p)
                } else {
                    self.entry(p)
                }
            })
            .collect();
        if words.len() <= crate::umr::UMR_INLINE_MTT_MAX {
            return umr.write_xlt(self.mkey, a0, &words, 1);
        }
        // More than one inline UMR holds: one UMR pointing at them all, as
        // `mlx5r_umr_update_xlt` writes a fault's pages.
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
        umr.write_xlt_pointed(self.mkey, a0 * MTT_ENTRY_BYTES / UMR_OCTOWORD, &bytes)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MapWhy {
    Fault,
    Prefetch,
    /// Only pages the process has resident.
    Resident,
}

#[derive(Debug)]
enum Kind {
    Explicit(Space),
    /// Children by GiB index.
    Implicit(BTreeMap<u64, Space>),
}

#[derive(Debug)]
pub(crate) struct OdpMrInner {
    engine: Arc<Engine>,
    pd: Arc<PdInner>,
    mkey: u32,
    addr: u64,
    len: u64,
    access: u32,
    kind: Mutex<Kind>,
    counters: Counters,
}

/// An ODP memory region (`ibv_reg_mr` with `IBV_ACCESS_ON_DEMAND`).
#[derive(Debug)]
pub struct OdpMr {
    pub(crate) inner: Arc<OdpMrInner>,
}

impl Pd {
    /// `ibv_reg_mr(addr, len, access | ON_DEMAND)`: an explicit ODP region
    /// over process memory; nothing is mapped for DMA until the device
    /// touches it (or [`OdpMr::advise`]).
    ///
    /// # Safety
    ///
    /// While the region exists, the memory the device reaches through it
    /// is touched by the program only through volatile or atomic accesses
    /// (the device writes it concurrently), and before the program unmaps
    /// or replaces pages of it, it calls [`OdpMr::invalidate_range`] on
    /// them (user space has no MMU notifier). Pages that are not mapped
    /// when the device touches them make its access fail, not the process.
    pub unsafe fn reg_mr_odp(&self, addr: *mut u8, len: usize, access: u32) -> Result<OdpMr> {
        if len == 0 {
            return Err(Error::Invalid("empty MR"));
        }
        check_access(access & !access::ON_DEMAND)?;
        let a = addr as u64;
        let first = a & !(ODP_PAGE - 1);
        let end = a
            .checked_add(len as u64)
            .and_then(|e| e.checked_next_multiple_of(ODP_PAGE))
            .ok_or(Error::Invalid("MR range wraps"))?;
        let pages = (end - first) / ODP_PAGE;
        let ctx = &self.inner.ctx;
        let engine = Engine::get(ctx)?;
        let mkey = create_free_mtt(&self.inner, pages)?;
        let wr = UmrWr {
            access: Some(access),
            pdn: Some(self.inner.pdn),
            free: Some(false),
            xlt: Some(UmrXlt {
                start: a,
                len: len as u64,
                log_page: ODP_PAGE.trailing_zeros(),
            }),
            ..UmrWr::new(mkey)
        };
        let enabled = zap_mtt(&engine.umr, mkey, pages).and_then(|()| engine.umr.post(&wr));
        if let Err(e) = enabled {
            destroy_mkey(ctx, mkey);
            return Err(e);
        }
        let space = Space {
            mkey,
            base: first,
            runs: BTreeMap::new(),
        };
        Ok(OdpMr::publish(
            engine,
            &self.inner,
            mkey,
            a,
            len as u64,
            access,
            Kind::Explicit(space),
        ))
    }

    /// `ibv_reg_mr(NULL, SIZE_MAX, access | ON_DEMAND)`: the implicit ODP
    /// region over the whole address space (Linux's
    /// `mlx5_ib_alloc_implicit_mr`); needs `null_mkey`,
    /// `fixed_buffer_size` and `umr_extended_translation_offset`.
    ///
    /// # Safety
    ///
    /// As [`Pd::reg_mr_odp`], for every address of the process.
    pub unsafe fn reg_mr_implicit(&self, access: u32) -> Result<OdpMr> {
        check_access(access & !access::ON_DEMAND)?;
        let ctx = &self.inner.ctx;
        let g = ctx.hca.caps().gen();
        if !(g.null_mkey() && g.fixed_buffer_size() && g.umr_extended_translation_offset())
            || g.umr_indirect_mkey_disabled()
        {
            return Err(Error::NotSupported("implicit ODP"));
        }
        let engine = Engine::get(ctx)?;
        let null = null_mkey(ctx)?;
        let mkey = create_implicit_ksm(&self.inner, &engine.umr, access, null)?;
        Ok(OdpMr::publish(
            engine,
            &self.inner,
            mkey,
            0,
            1 << IMR_SPAN_SHIFT,
            access,
            Kind::Implicit(BTreeMap::new()),
        ))
    }
}

impl Pd {
    /// `ibv_advise_mr` (`mlx5_ib_advise_mr`): prefetch each range of
    /// `sges` in the ODP region its lkey names. Each key must be an ODP
    /// region of the device (else `ENOENT`) on this PD (else `EPERM`), and
    /// writable for PREFETCH_WRITE (else `EPERM`). With
    /// [`advice::FLAG_FLUSH`] the ranges are mapped in order and the first
    /// failure is returned (a range outside its region is `EFAULT`);
    /// without it the kernel maps them later and reports nothing, so
    /// after the keys are checked a failure to map is only logged. Either
    /// way the mapping is done when this returns.
    pub fn advise_mr(&self, advice: u32, flags: u32, sges: &[AdviseSge]) -> Result<()> {
        check_advice(advice, flags)?;
        if sges.is_empty() {
            return Err(Error::Invalid("ibv_advise_mr with no SGE"));
        }
        let mrs = sges
            .iter()
            .map(|s| self.prefetchable(advice, s.lkey))
            .collect::<Result<Vec<_>>>()?;
        for (mr, s) in mrs.iter().zip(sges) {
            let r = mr.prefetch(advice, s.addr, u64::from(s.length));
            match r {
                Err(e) if flags & advice::FLAG_FLUSH != 0 => return Err(e),
                Err(e) => tracing::debug!("ibv_advise_mr of {:#x}: {e}", s.lkey),
                Ok(()) => {}
            }
        }
        Ok(())
    }

    /// The ODP region `lkey` names, if a prefetch with `advice` may use
    /// it (`get_prefetchable_mr`).
    fn prefetchable(&self, advice: u32, lkey: u32) -> Result<Arc<OdpMrInner>> {
        let mrs = self
            .inner
            .ctx
            .odp
            .mrs
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let mr = mrs
            .get(&(lkey >> 8))
            .and_then(Weak::upgrade)
            .filter(|m| m.mkey == lkey)
            .ok_or(Error::NotFound(
                "ibv_advise_mr: no ODP region has that lkey",
            ))?;
        if !Arc::ptr_eq(&mr.pd, &self.inner) {
            return Err(Error::Denied("ibv_advise_mr: the region is on another PD"));
        }
        // `ib_access_writable`.
        let writable =
            access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_ATOMIC | access::MW_BIND;
        if advice == advice::PREFETCH_WRITE && mr.access & writable == 0 {
            return Err(Error::Denied(
                "ibv_advise_mr: PREFETCH_WRITE of a read-only region",
            ));
        }
        Ok(mr)
    }
}

/// CREATE_MKEY of a free MTT key with room for `entries` (UMR-enabled,
/// `pg_access`: its entries' present bits count), as the mkey cache makes.
fn create_free_mtt(pd: &PdInner, entries: u64) -> Result<u32> {
    // Room in whole 64-byte units: a write widened to them (Space::write)
    // fits at the end too.
    let octs =
        u32::try_from(entries.next_multiple_of(XLT_ALIGN_ENTRIES) * MTT_ENTRY_BYTES / UMR_OCTOWORD)
            .map_err(|_| Error::Invalid("ODP region too large"))?;
    let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES];
    {
        let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
        c.set_opcode(Opcode::CreateMkey.to_raw())
            .set_pg_access(true);
        c.memory_key_mkey_entry_mut()
            .set_access_mode_1_0(MKC_ACCESS_MODE_MTT)
            .set_free(true)
            .set_umr_en(true)
            .set_lr(true)
            .set_qpn(MKC_QPN_NONE)
            .set_pd(pd.pdn)
            .set_translations_octword_size(octs)
            .set_log_page_size(ODP_PAGE.trailing_zeros() as u8);
    }
    let out = pd.ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
    Ok(CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8)
}

/// Writes every MTT entry of a free key made with room for `entries`
/// ([`create_free_mtt`]) not present (zero) before it is enabled, as Linux
/// writes a whole ODP key's translation (`MLX5_IB_UPD_XLT_ZAP`, or the
/// registration's snapshot of absent pages): what firmware holds in an
/// entry never written is not defined.
fn zap_mtt(umr: &UmrEngine, mkey: u32, entries: u64) -> Result<()> {
    let bytes = entries.next_multiple_of(XLT_ALIGN_ENTRIES) * MTT_ENTRY_BYTES;
    let zeros =
        vec![0u8; usize::try_from(bytes).map_err(|_| Error::Invalid("ODP region too large"))?];
    umr.write_xlt_pointed(mkey, 0, &zeros)
}

/// The implicit key: KSM over `[0, 2^47)`, 1 GiB entries, as Linux's
/// `mlx5_ib_alloc_implicit_mr` makes it: a free KSM key (CREATE_MKEY with
/// room for every entry and none given), every entry zapped onto the null
/// mkey by UMRs that point at the 2 MiB of entries
/// (`MLX5_IB_UPD_XLT_ZAP | INDIRECT`: what firmware holds in an entry never
/// written is not defined), then enabled by UMR.
fn create_implicit_ksm(pd: &PdInner, umr: &UmrEngine, acc: u32, null: u32) -> Result<u32> {
    let n = IMR_KSM_ENTRIES as usize;
    let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES];
    {
        let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
        c.set_opcode(Opcode::CreateMkey.to_raw());
        c.memory_key_mkey_entry_mut()
            .set_access_mode_1_0(MKC_ACCESS_MODE_KSM)
            .set_free(true)
            .set_umr_en(true)
            .set_lr(true)
            .set_lw(acc & access::LOCAL_WRITE != 0)
            .set_rr(acc & access::REMOTE_READ != 0)
            .set_rw(acc & access::REMOTE_WRITE != 0)
            .set_a(acc & access::REMOTE_ATOMIC != 0)
            .set_qpn(MKC_QPN_NONE)
            .set_pd(pd.pdn)
            .set_start_addr(0)
            .set_len(1 << IMR_SPAN_SHIFT)
            .set_translations_octword_size(n as u32)
            .set_log_page_size(IMR_MTT_SHIFT as u8);
    }
    let out = pd.ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
    let mkey = CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8;
    let ksm = mlx5_hw::ifc::ksm::SIZE_BYTES;
    let mut zap = vec![0u8; n * ksm];
    for e in zap.chunks_exact_mut(ksm) {
        mlx5_hw::ifc::ksm::KEY.set(e, u64::from(null));
    }
    let enabled = umr.write_xlt_pointed(mkey, 0, &zap).and_then(|()| {
        umr.post(&UmrWr {
            check: crate::umr::UmrCheck::Free,
            free: Some(false),
            ..UmrWr::new(mkey)
        })
    });
    if let Err(e) = enabled {
        destroy_mkey(&pd.ctx, mkey);
        return Err(e);
    }
    Ok(mkey)
}

/// QUERY_SPECIAL_CONTEXTS' `null_mkey`.
fn null_mkey(ctx: &Ctx) -> Result<u32> {
    let mut inb = [0u8; 0x10];
    inb[..2].copy_from_slice(&Opcode::QuerySpecialContexts.to_raw().to_be_bytes());
    let out = ctx
        .hca
        .cmd()
        .exec(&inb, query_special_contexts_out::SIZE_BYTES)?;
    Ok(query_special_contexts_out::NULL_MKEY.get(&out) as u32)
}

fn destroy_mkey(ctx: &Ctx, mkey: u32) {
    if let Err(e) = crate::mr::destroy_mkey(ctx, mkey) {
        tracing::warn!("DESTROY_MKEY {mkey:#x}: {e}");
    }
}

impl OdpMr {
    fn publish(
        engine: Arc<Engine>,
        pd: &Arc<PdInner>,
        mkey: u32,
        addr: u64,
        len: u64,
        access: u32,
        kind: Kind,
    ) -> OdpMr {
        let inner = Arc::new(OdpMrInner {
            engine,
            pd: pd.clone(),
            mkey,
            addr,
            len,
            access,
            kind: Mutex::new(kind),
            counters: Counters::default(),
        });
        pd.ctx
            .odp
            .mrs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mkey >> 8, Arc::downgrade(&inner));
        OdpMr { inner }
    }

    /// The key (lkey and rkey).
    pub fn lkey(&self) -> u32 {
        self.inner.mkey
    }

    /// The key as an rkey.
    pub fn rkey(&self) -> u32 {
        self.inner.mkey
    }

    /// Start of the region (0 for the implicit one).
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// Length of the region.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Access flags as registered.
    pub fn access(&self) -> u32 {
        self.inner.access
    }

    /// A scatter/gather entry over `[addr, addr + len)` of the region
    /// (an address, not an offset: ODP regions take any address inside).
    pub fn sge(&self, addr: u64, len: u32) -> Result<crate::mr::Sge> {
        let end = addr.checked_add(u64::from(len));
        if addr < self.inner.addr || end.is_none_or(|e| e > self.inner.addr + self.inner.len) {
            return Err(Error::Invalid("SGE outside the ODP region"));
        }
        // SAFETY: inside the region (checked); the device touches it only
        // through the key, which faults pages in as it goes.
        Ok(unsafe { crate::mr::Sge::new_unchecked(addr, len, self.inner.mkey) })
    }

    /// This region's counters.
    pub fn stats(&self) -> OdpStats {
        self.inner.counters.snapshot()
    }

    /// `ibv_advise_mr`: prefetch `[addr, addr + len)` ranges
    /// ([`advice`]); synchronous: when it returns the ranges are mapped
    /// (PREFETCH_NO_FAULT: the resident pages of them). A range the
    /// process does not map is `EFAULT`, as the kernel answers.
    pub fn advise(&self, advice: u32, flags: u32, ranges: &[(u64, u64)]) -> Result<()> {
        check_advice(advice, flags)?;
        for &(addr, len) in ranges {
            self.inner.prefetch(advice, addr, len)?;
        }
        Ok(())
    }

    /// Invalidates `[addr, addr + len)` (what an MMU notifier does before
    /// memory is unmapped or changed): every mapped run that meets it is
    /// made absent by UMR, then unmapped from the IOMMU; the next access
    /// faults again. Returns the pages made absent (runs are invalidated
    /// whole, so it may be more than the range).
    pub fn invalidate_range(&self, addr: u64, len: u64) -> Result<u64> {
        self.inner.invalidate_counted(addr, len)
    }
}

impl OdpMrInner {
    /// [`OdpMr::invalidate_range`].
    pub(crate) fn invalidate_counted(&self, addr: u64, len: u64) -> Result<u64> {
        let n = self.invalidate(addr, len)?;
        let c = &self.counters;
        let t = &self.pd.ctx.odp.total;
        c.invalidations.fetch_add(1, Ordering::Relaxed);
        t.invalidations.fetch_add(1, Ordering::Relaxed);
        c.pages_invalidated.fetch_add(n, Ordering::Relaxed);
        t.pages_invalidated.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// One range of `ibv_advise_mr` (`pagefault_mr` of a prefetch):
    /// mapped as a fault would map it (PREFETCH_NO_FAULT: its resident
    /// pages), counted as a prefetch. A range outside the region is
    /// `EFAULT`.
    fn prefetch(&self, advice: u32, addr: u64, len: u64) -> Result<()> {
        let inside = addr
            .checked_add(len)
            .is_some_and(|end| addr >= self.addr && end <= self.addr + self.len);
        if !inside {
            return Err(Error::Fault("prefetch range outside the ODP region"));
        }
        let why = if advice == advice::PREFETCH_NO_FAULT {
            MapWhy::Resident
        } else {
            MapWhy::Prefetch
        };
        let c = &self.counters;
        let t = &self.pd.ctx.odp.total;
        c.prefetches.fetch_add(1, Ordering::Relaxed);
        t.prefetches.fetch_add(1, Ordering::Relaxed);
        let n = self.map_range(addr, len, why)?;
        c.pages_prefetched.fetch_add(n, Ordering::Relaxed);
        t.pages_prefetched.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Maps the pages of `[va, va + len)` not mapped yet; the pages mapped.
    fn map_range(&self, va: u64, len: u64, why: MapWhy) -> Result<u64> {
        let end = va.checked_add(len).ok_or(Error::Invalid("range wraps"))?;
        if va < self.addr || end > self.addr + self.len {
            return Err(Error::Invalid("range outside the ODP region"));
        }
        let mut kind = lock(&self.kind);
        match &mut *kind {
            Kind::Explicit(s) => self.map_space(s, va, end, why),
            Kind::Implicit(children) => {
                let mut n = 0;
                let mut at = va;
                while at < end {
                    let idx = at >> IMR_MTT_SHIFT;
                    let stop = ((idx + 1) << IMR_MTT_SHIFT).min(end);
                    let s = match children.entry(idx) {
                        std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::btree_map::Entry::Vacant(v) => {
                            v.insert(self.make_child(idx)?)
                        }
                    };
                    n += self.map_space(s, at, stop, why)?;
                    at = stop;
                }
                Ok(n)
            }
        }
    }

    /// An implicit child: a free MTT key of [`IMR_MTT_ENTRIES`] made
    /// present over GiB `idx` by UMR, then the parent's KSM entry `idx`
    /// pointed at it (`implicit_get_child_mr`).
    fn make_child(&self, idx: u64) -> Result<Space> {
        let ctx = &self.pd.ctx;
        let key = create_free_mtt(&self.pd, IMR_MTT_ENTRIES)?;
        let wr = UmrWr {
            access: Some(self.access),
            pdn: Some(self.pd.pdn),
            free: Some(false),
            xlt: Some(UmrXlt {
                start: idx << IMR_MTT_SHIFT,
                len: IMR_MTT_SIZE,
                log_page: ODP_PAGE.trailing_zeros(),
            }),
            ..UmrWr::new(key)
        };
        let r = zap_mtt(&self.engine.umr, key, IMR_MTT_ENTRIES)
            .and_then(|()| self.engine.umr.post(&wr))
            .and_then(|()| {
                self.engine.umr.write_xlt(
                    self.mkey,
                    idx,
                    &[u64::from(key), idx << IMR_MTT_SHIFT],
                    2,
                )
            });
        if let Err(e) = r {
            destroy_mkey(ctx, key);
            return Err(e);
        }
        Ok(Space {
            mkey: key,
            base: idx << IMR_MTT_SHIFT,
            runs: BTreeMap::new(),
        })
    }

    /// Maps the missing pages of `[va, end)` in `s`: per run of missing
    /// pages, the memory checked, mapped for DMA as one piece, its MTT
    /// entries written present by UMR.
    fn map_space(&self, s: &mut Space, va: u64, end: u64, why: MapWhy) -> Result<u64> {
        let p0 = (va - s.base) / ODP_PAGE;
        let p1 = (end - s.base).div_ceil(ODP_PAGE);
        let mut p = p0;
        let mut mapped = 0;
        while p < p1 {
            // A run covering p?
            if let Some((&f, r)) = s.runs.range(..=p).next_back() {
                if p < f + r.pages {
                    p = f + r.pages;
                    continue;
                }
            }
            let next = s.runs.range(p..).next().map_or(p1, |(&f, _)| f.min(p1));
            let host = s.base + p * ODP_PAGE;
            let bytes = (next - p) * ODP_PAGE;
            crate::vma::page_size_of(host, bytes)?;
            let runs = if why == MapWhy::Resident {
                resident_runs(host, next - p)?
            } else {
                vec![(0, next - p)]
            };
            for (off, n) in runs {
                self.map_run(s, p + off, n)?;
                mapped += n;
            }
            p = next;
        }
        Ok(mapped)
    }

    fn map_run(&self, s: &mut Space, first: u64, n: u64) -> Result<()> {
        let ctx = &self.pd.ctx;
        let dma = ctx.hca.dma();
        let bytes = n * ODP_PAGE;
        let iova = dma.alloc_iova(bytes, ODP_PAGE)?;
        let host = s.base + first * ODP_PAGE;
        // SAFETY: `reg_mr_odp`'s caller keeps the memory mapped while the
        // region may reach it, and invalidates before unmapping it; the
        // mapping is undone in `invalidate` or when the region goes.
        if let Err(e) = unsafe { dma.func.dma_map_host(iova, host, bytes) } {
            dma.free_iova(iova, bytes);
            return Err(e.into());
        }
        let present = |p: u64| (iova.0 + (p - first) * ODP_PAGE) | MTT_PRESENT;
        if let Err(e) = s.write(&self.engine.umr, first, n, present) {
            let _ = dma.func.dma_unmap(iova, bytes);
            dma.free_iova(iova, bytes);
            return Err(e);
        }
        s.runs.insert(first, Run { pages: n, iova });
        self.counters.mappings.fetch_add(1, Ordering::Relaxed);
        ctx.odp.total.mappings.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn invalidate(&self, addr: u64, len: u64) -> Result<u64> {
        let end = addr.saturating_add(len);
        let mut kind = lock(&self.kind);
        let spaces: Vec<&mut Space> = match &mut *kind {
            Kind::Explicit(s) => vec![s],
            Kind::Implicit(c) => c.values_mut().collect(),
        };
        let mut n = 0;
        for s in spaces {
            let hit: Vec<u64> = s
                .runs
                .iter()
                .filter(|(&f, r)| {
                    let a = s.base + f * ODP_PAGE;
                    a < end && addr < a + r.pages * ODP_PAGE
                })
                .map(|(&f, _)| f)
                .collect();
            for f in hit {
                n += self.unmap_run(s, f)?;
            }
        }
        Ok(n)
    }

    /// Makes run `first` of `s` absent (UMR), then unmaps it.
    fn unmap_run(&self, s: &mut Space, first: u64) -> Result<u64> {
        let Some(r) = s.runs.get(&first).copied() else {
            return Ok(0);
        };
        s.write(&self.engine.umr, first, r.pages, |_| 0)?;
        s.runs.remove(&first);
        let ctx = &self.pd.ctx;
        let dma = ctx.hca.dma();
        let bytes = r.pages * ODP_PAGE;
        if let Err(e) = dma.func.dma_unmap(r.iova, bytes) {
            tracing::warn!("dma_unmap of ODP pages: {e}");
        }
        dma.free_iova(r.iova, bytes);
        self.counters.mappings.fetch_sub(1, Ordering::Relaxed);
        ctx.odp.total.mappings.fetch_sub(1, Ordering::Relaxed);
        Ok(r.pages)
    }
}

/// The runs `(offset, pages)` of the `n` pages at `host` the process has
/// resident (`mincore`).
fn resident_runs(host: u64, n: u64) -> Result<Vec<(u64, u64)>> {
    let mut vec = vec![0u8; n as usize];
    // SAFETY: `host` is page aligned and the range mapped (checked by the
    // caller through /proc/self/maps); `vec` has one byte per page.
    let r = unsafe {
        libc::mincore(
            host as *mut libc::c_void,
            (n * ODP_PAGE) as usize,
            vec.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(Error::os("mincore", std::io::Error::last_os_error()));
    }
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, b) in vec.iter().enumerate() {
        if b & 1 == 0 {
            continue;
        }
        match out.last_mut() {
            Some((o, k)) if *o + *k == i as u64 => *k += 1,
            _ => out.push((i as u64, 1)),
        }
    }
    Ok(out)
}

impl Drop for OdpMrInner {
    fn drop(&mut self) {
        let ctx = self.pd.ctx.clone();
        ctx.odp
            .mrs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(self.mkey >> 8));
        // The key first (the device stops), then the children, then the
        // mappings.
        destroy_mkey(&ctx, self.mkey);
        let kind = std::mem::replace(
            self.kind.get_mut().unwrap_or_else(|p| p.into_inner()),
            Kind::Implicit(BTreeMap::new()),
        );
        let spaces: Vec<Space> = match kind {
            Kind::Explicit(s) => vec![s],
            Kind::Implicit(c) => {
                let v: Vec<Space> = c.into_values().collect();
                for s in &v {
                    destroy_mkey(&ctx, s.mkey);
                }
                v
            }
        };
        let dma = ctx.hca.dma();
        for s in spaces {
            for r in s.runs.values() {
                let bytes = r.pages * ODP_PAGE;
                if let Err(e) = dma.func.dma_unmap(r.iova, bytes) {
                    tracing::warn!("dma_unmap of ODP pages: {e}");
                }
                dma.free_iova(r.iova, bytes);
                ctx.odp.total.mappings.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

impl crate::device::Context {
    /// On-demand paging counters summed over the context's regions.
    pub fn odp_stats(&self) -> OdpStats {
        self.ctx.odp.total.snapshot()
    }
}
