//! Memory regions: CREATE_MKEY with an MTT over memory the device may
//! touch (`ibv_reg_mr`, `ibv_dereg_mr`).
//!
//! An MR's memory is mapped for DMA as one piece: whole pages of the
//! memory's own page size (4 KiB, or the 2 MiB / 1 GiB of hugetlb memory,
//! which a file descriptor can only map whole), at an IOVA of its own
//! chosen so that a few MTT entries of one large page describe it. The
//! MTT page `P` is the power of two at least as large as the mapping,
//! capped by the largest mkc `log_page_size` the device takes
//! ([`mlx5_hw::wqe::mkc_max_log_page_size`]: 2 GiB unless
//! `umr_log_entity_size_5`); so it is never smaller than the memory's
//! pages. The IOVA reserved is the span of `P`-aligned windows the
//! mapping touches, aligned to `P`, and the mapping starts at the host
//! address's offset in its window, so IOVA and host address agree modulo
//! `P` (what lets an IOMMU use huge pages for it). Virtual address `v` of
//! the MR sits at `entry[(v >> log P) - (start >> log P)] + (v mod P)`,
//! which is how the device translates an MTT mkey whose `start_addr` is
//! the virtual address: one or two entries up to 2 GiB, one more per
//! 2 GiB beyond (see [`mtt_layout`]).
//!
//! Memory ownership: an MR over a [`DmaBuffer`] holds the buffer (safe); an
//! MR over any other memory of the process ([`Pd::reg_mr_raw`]) is
//! `unsafe`, the caller promising the memory stays put until deregistration,
//! exactly as `ibv_reg_mr`'s contract. Deregistration destroys the mkey
//! (the device refuses it from then on) before unmapping the memory.
//!
//! An [`Mr`] is `Send + Sync`; its [`sge`](Mr::sge) builds scatter/gather
//! entries that are checked against its bounds, so a WQE built from them
//! never names bytes outside the MR.
#![allow(unsafe_code)] // `reg_mr_raw`: process memory the caller vouches for.

use std::sync::Arc;

use mlx5_hw::ifc::{create_mkey_in, create_mkey_out, destroy_mkey_in, destroy_mkey_out};
use mlx5_hw::ifc::{CreateMkeyIn, CreateMkeyOut, DestroyMkeyIn};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::wqe::mkc_max_log_page_size;
use vfio::{DmaBuffer, Iova};

use crate::device::Ctx;
use crate::pd::{Pd, PdInner};
use crate::{Error, Result};

/// `IBV_ACCESS_*` bits, with libibverbs' values.
pub mod access {
    /// IBV_ACCESS_LOCAL_WRITE.
    pub const LOCAL_WRITE: u32 = 1;
    /// IBV_ACCESS_REMOTE_WRITE.
    pub const REMOTE_WRITE: u32 = 1 << 1;
    /// IBV_ACCESS_REMOTE_READ.
    pub const REMOTE_READ: u32 = 1 << 2;
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub const REMOTE_ATOMIC: u32 = 1 << 3;
    /// IBV_ACCESS_MW_BIND.
    pub const MW_BIND: u32 = 1 << 4;
    /// IBV_ACCESS_ZERO_BASED.
    pub const ZERO_BASED: u32 = 1 << 5;
    /// IBV_ACCESS_ON_DEMAND.
    pub const ON_DEMAND: u32 = 1 << 6;
    /// IBV_ACCESS_HUGETLB.
    pub const HUGETLB: u32 = 1 << 7;
    /// IBV_ACCESS_RELAXED_ORDERING (an optional flag: ignored where unsupported).
    pub const RELAXED_ORDERING: u32 = 1 << 20;
    /// What this driver accepts.
    pub const SUPPORTED: u32 = LOCAL_WRITE
        | REMOTE_WRITE
        | REMOTE_READ
        | REMOTE_ATOMIC
        | MW_BIND
        | HUGETLB
        | RELAXED_ORDERING;
}

/// MTT entry bits: read and write enable (`MLX5_MTT_READ | MLX5_MTT_WRITE`).
pub const MTT_RD_WR: u64 = 0x3;
/// mkc `qpn` when no QP owns the mkey.
pub const MKC_QPN_NONE: u32 = 0xff_ffff;

/// A scatter/gather entry (`struct ibv_sge`): address, length, lkey.
///
/// Made by [`Mr::sge`] (checked against the MR) or, for callers who manage
/// bounds themselves, by the `unsafe` [`Sge::new_unchecked`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

impl Sge {
    /// An entry the caller vouches for.
    ///
    /// # Safety
    ///
    /// `addr .. addr + length` lies inside a live MR whose lkey is `lkey`,
    /// and its memory may be read or written by the device until the work
    /// request completes (the contract of `ibv_post_send`).
    pub unsafe fn new_unchecked(addr: u64, length: u32, lkey: u32) -> Self {
        Self { addr, length, lkey }
    }

    /// Virtual address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn length(&self) -> u32 {
        self.length
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Backing {
    Buffer(#[allow(dead_code)] Arc<DmaBuffer>),
    Host,
    /// A dma-buf mapped into the process (`crate::dmabuf`): mapped for DMA
    /// by address, the mapping kept while the MR lives.
    DmaBuf(#[allow(dead_code)] Arc<crate::dmabuf::DmaBufMap>),
}

#[derive(Debug)]
pub(crate) struct MrInner {
    pub(crate) pd: Arc<PdInner>,
    pub(crate) mkey: u32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    /// `IBV_ACCESS_*` as last changed (registration, re-registration, or
    /// a UMR posted by [`crate::qp::Qp::post_rereg_access`]).
    pub(crate) access: std::sync::atomic::AtomicU32,
    pub(crate) at: Placement,
    /// MTT entries the key has room for (`translations_octword_size`
    /// times 2): a new translation up to this many goes in by UMR.
    pub(crate) xlt_room: usize,
    pub(crate) backing: Backing,
    pub(crate) buf_offset: usize,
    /// The UMR QP, held once a re-registration (or the mkey cache) used it.
    pub(crate) umr: Option<Arc<crate::umr::UmrEngine>>,
    /// The mkey cache the key came from, and goes back to.
    pub(crate) cache: Option<Arc<crate::mkey_cache::MkeyCache>>,
    done: std::sync::atomic::AtomicBool,
}

/// Where an MR's memory is mapped for DMA and how its MTT describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    pub(crate) layout: MttLayout,
    /// The IOVA reservation (`layout.res_len` bytes).
    pub(crate) res: Iova,
    /// Where the mapping starts in it, the host address and length mapped.
    pub(crate) map_iova: Iova,
    pub(crate) map_start: u64,
    pub(crate) map_len: u64,
}

impl Placement {
    /// Reserves IOVA for the MR `addr .. addr + len` over mapping `m` and
    /// maps the memory there.
    pub(crate) fn map(ctx: &Ctx, addr: u64, len: u64, m: &Mapping) -> Result<Self> {
        let dma = ctx.hca.dma();
        let caps = ctx.hca.caps();
        let wide = caps.gen2().is_some_and(|g| g.umr_log_entity_size_5());
        let l = mtt_layout(addr, len, m.start, m.len, mkc_max_log_page_size(wide));
        let res = dma.alloc_iova(l.res_len, 1 << l.log_page)?;
        let map_iova = Iova(res.0 + l.map_off);
        let mapped = match &m.backing {
            Backing::Buffer(b) => dma.func.dma_map(map_iova, b),
            // SAFETY: `reg_mr_raw`'s caller vouches for the memory until
            // the MR is gone (a dma-buf's mapping is held by the MR); the
            // unmap happens in `Placement::unmap`, from `MrInner::drop` or
            // a re-registration.
            Backing::Host | Backing::DmaBuf(_) => unsafe {
                dma.func.dma_map_host(map_iova, m.start, m.len)
            },
        };
        if let Err(e) = mapped {
            dma.free_iova(res, l.res_len);
            return Err(e.into());
        }
        Ok(Self {
            layout: l,
            res,
            map_iova,
            map_start: m.start,
            map_len: m.len,
        })
    }

    /// MTT entry `i` (the page address with read/write enable).
    pub(crate) fn mtt(&self, i: usize) -> u64 {
        (self.res.0 + ((self.layout.first + i as u64) << self.layout.log_page)) | MTT_RD_WR
    }

    /// Unmaps the memory and gives the IOVA back.
    pub(crate) fn unmap(&self, ctx: &Ctx) {
        let dma = ctx.hca.dma();
        if let Err(e) = dma.func.dma_unmap(self.map_iova, self.map_len) {
            tracing::warn!("dma_unmap of an MR's memory: {e}");
        }
        dma.free_iova(self.res, self.layout.res_len);
    }
}

/// A registered memory region (`struct ibv_mr`).
#[derive(Debug, Clone)]
pub struct Mr {
    pub(crate) inner: Arc<MrInner>,
}

/// How an MR's memory sits in IOVA space and in its MTT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MttLayout {
    /// log2 of the MTT page, in bytes (mkc `log_page_size`).
    pub log_page: u32,
    /// IOVA space to reserve, aligned to the MTT page.
    pub res_len: u64,
    /// Offset of the mapping inside the reservation.
    pub map_off: u64,
    /// MTT page (counted from the reservation's start) holding the MR's
    /// first byte: entry `i` is `reservation + (first + i) << log_page`.
    pub first: u64,
    /// MTT entries.
    pub entries: usize,
}

/// The layout of an MR over `addr .. addr + len` whose memory is mapped
/// as `map_start .. map_start + map_len` (whole pages of the memory,
/// around the MR), with MTT pages of at most `2^max_log_page` bytes.
pub fn mtt_layout(
    addr: u64,
    len: u64,
    map_start: u64,
    map_len: u64,
    max_log_page: u32,
) -> MttLayout {
    let lp = map_len
        .max(vfio::dma::PAGE_SIZE as u64)
        .checked_next_power_of_two()
        .map_or(63, u64::trailing_zeros)
        .min(max_log_page);
    let w0 = map_start >> lp;
    let w1 = (map_start + (map_len - 1)) >> lp;
    MttLayout {
        log_page: lp,
        res_len: (w1 - w0 + 1) << lp,
        map_off: map_start - (w0 << lp),
        first: (addr >> lp) - w0,
        entries: (((addr + (len - 1)) >> lp) - (addr >> lp) + 1) as usize,
    }
}

/// What an MR maps for DMA: whole pages of its memory around it.
#[derive(Debug, Clone)]
pub(crate) struct Mapping {
    start: u64,
    len: u64,
    pub(crate) backing: Backing,
    pub(crate) buf_offset: usize,
}

impl Mapping {
    /// `len` bytes of process memory at `start` that a dma-buf mapping
    /// `map` holds.
    pub(crate) fn of_dmabuf(start: u64, len: u64, map: Arc<crate::dmabuf::DmaBufMap>) -> Self {
        Self {
            start,
            len,
            backing: Backing::DmaBuf(map),
            buf_offset: 0,
        }
    }

    /// `len` bytes of `buf` from `offset`: their address, and the mapping
    /// of the whole buffer (a [`DmaBuffer`] maps as one piece).
    pub(crate) fn of_buffer(
        buf: &Arc<DmaBuffer>,
        offset: usize,
        len: usize,
    ) -> Result<(u64, Self)> {
        if offset.checked_add(len).is_none_or(|e| e > buf.len()) || len == 0 {
            return Err(Error::Invalid("MR range outside the buffer"));
        }
        let m = Mapping {
            start: buf.host_addr(),
            len: buf.len() as u64,
            backing: Backing::Buffer(buf.clone()),
            buf_offset: offset,
        };
        Ok((buf.host_addr() + offset as u64, m))
    }
}

impl Pd {
    /// `ibv_reg_mr` over `len` bytes of `buf` from `offset`; the MR holds
    /// the buffer. Its virtual address is the buffer's host address. The
    /// whole buffer is mapped, in its own pages (huge where
    /// [`DmaBuffer::page_size`] says so).
    pub fn reg_mr_buffer(
        &self,
        buf: &Arc<DmaBuffer>,
        offset: usize,
        len: usize,
        access: u32,
    ) -> Result<Mr> {
        let (addr, m) = Mapping::of_buffer(buf, offset, len)?;
        Mr::register(&self.inner, addr, len as u64, access, m)
    }

    /// `ibv_reg_mr` over process memory at `addr .. addr + len`.
    ///
    /// The memory's page size comes from the kernel (`/proc/self/maps`,
    /// and `smaps` for file-backed memory, see [`crate::vma`]): hugetlb
    /// memory is mapped in whole huge pages and described by huge MTT
    /// pages. A range that is not all mapped readable and writable is
    /// refused with `EFAULT` (as `ibv_reg_mr` is).
    ///
    /// # Safety
    ///
    /// The memory is readable and writable, stays mapped and in place, and
    /// is touched by the program only through volatile or atomic accesses
    /// (the device reads and writes it concurrently), until the MR is
    /// deregistered and dropped. The backend must be able to map process
    /// memory ([`vfio::PciFunction::dma_map_host`]). The rest of the pages
    /// around the range is mapped too, but the mkey's bounds keep the
    /// device off it.
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: u32) -> Result<Mr> {
        if len == 0 {
            return Err(Error::Invalid("empty MR"));
        }
        let page = crate::vma::page_size_of(addr as u64, len as u64)?;
        // SAFETY: this function's contract; `page` is the kernel's.
        unsafe { self.reg_mr_raw_paged(addr, len, access, page) }
    }

    /// [`reg_mr_raw`](Self::reg_mr_raw) over memory whose page size the
    /// caller knows (a hugetlb pool it allocated): no look-up in `/proc`.
    ///
    /// # Safety
    ///
    /// As [`reg_mr_raw`](Self::reg_mr_raw), and the memory is made of
    /// pages of `page_size` bytes: every whole page of that size around
    /// the range is mapped memory of the process.
    pub unsafe fn reg_mr_raw_paged(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
        page_size: u64,
    ) -> Result<Mr> {
        if len == 0 {
            return Err(Error::Invalid("empty MR"));
        }
        if !page_size.is_power_of_two() || page_size < vfio::dma::PAGE_SIZE as u64 {
            return Err(Error::Invalid(
                "page size not a power of two of 4 KiB or more",
            ));
        }
        let a = addr as u64;
        let start = a & !(page_size - 1);
        let end = a
            .checked_add(len as u64)
            .and_then(|e| e.checked_next_multiple_of(page_size))
            .ok_or(Error::Invalid("MR range wraps"))?;
        let m = Mapping {
            start,
            len: end - start,
            backing: Backing::Host,
            buf_offset: 0,
        };
        Mr::register(&self.inner, a, len as u64, access, m)
    }
}

/// Verbs' rules for access flags (`ibv_reg_mr`'s EINVAL cases).
/// DESTROY_MKEY of `key` (any mkey this context made: MR, window, mlx5dv
/// or ODP key, the UMR engine's PA key).
pub(crate) fn destroy_mkey(ctx: &Ctx, key: u32) -> Result<()> {
    let mut inb = [0u8; destroy_mkey_in::SIZE_BYTES];
    DestroyMkeyIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::DestroyMkey.to_raw())
        .set_mkey_index(key >> 8);
    ctx.hca
        .cmd()
        .exec(&inb, destroy_mkey_out::SIZE_BYTES)
        .map(drop)
}

pub(crate) fn check_access(a: u32) -> Result<()> {
    use access::*;
    if a & !SUPPORTED != 0 {
        return Err(Error::Invalid("unsupported access flags"));
    }
    // Verbs: remote write or atomic needs local write.
    if a & (REMOTE_WRITE | REMOTE_ATOMIC) != 0 && a & LOCAL_WRITE == 0 {
        return Err(Error::Invalid(
            "REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE",
        ));
    }
    Ok(())
}

/// CREATE_MKEY of an MTT key over `at`, UMR-enabled: the key.
fn create_mkey(pd: &PdInner, addr: u64, len: u64, access: u32, at: &Placement) -> Result<u32> {
    use access::*;
    let ctx = &pd.ctx;
    let (ro_write, ro_read) = crate::ordering::mkc_relaxed_bits(ctx, access);
    let n = at.layout.entries;
    let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES + 8 * n.next_multiple_of(2)];
    {
        let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
        c.set_opcode(Opcode::CreateMkey.to_raw())
            .set_translations_octword_actual_size(n.div_ceil(2) as u32);
        let mut k = c.memory_key_mkey_entry_mut();
        k.set_access_mode_1_0(mlx5_hw::wqe::MKC_ACCESS_MODE_MTT)
            .set_lr(true)
            .set_lw(access & LOCAL_WRITE != 0)
            .set_rr(access & REMOTE_READ != 0)
            .set_rw(access & REMOTE_WRITE != 0)
            .set_a(access & REMOTE_ATOMIC != 0)
            .set_relaxed_ordering_write(ro_write)
            .set_relaxed_ordering_read(ro_read)
            .set_qpn(MKC_QPN_NONE)
            .set_umr_en(true)
            .set_pd(pd.pdn)
            .set_start_addr(addr)
            .set_len(len)
            .set_translations_octword_size(n.div_ceil(2) as u32)
            .set_log_page_size(at.layout.log_page as u8);
        for i in 0..n {
            let e = at.mtt(i);
            c.set_klm_pas_mtt(2 * i, (e >> 32) as u32);
            c.set_klm_pas_mtt(2 * i + 1, e as u32);
        }
    }
    let out = ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
    // The key: index << 8 | mkey_7_0 (0 here).
    Ok(CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8)
}

impl Mr {
    pub(crate) fn register(
        pd: &Arc<PdInner>,
        addr: u64,
        len: u64,
        access: u32,
        m: Mapping,
    ) -> Result<Mr> {
        check_access(access)?;
        let at = Placement::map(&pd.ctx, addr, len, &m)?;
        Self::with_placement(pd, addr, len, access, at, m)
    }

    /// CREATE_MKEY over memory mapped at `at` (unmapped again if refused).
    pub(crate) fn with_placement(
        pd: &Arc<PdInner>,
        addr: u64,
        len: u64,
        access: u32,
        at: Placement,
        m: Mapping,
    ) -> Result<Mr> {
        let cache = pd
            .ctx
            .mkey_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upgrade()
            .filter(|c| c.fits(access, &at));
        let made = match &cache {
            Some(c) => c
                .take(pd, addr, len, access, &at)
                .map(|(k, room, umr)| (k, room, Some(umr))),
            None => create_mkey(pd, addr, len, access, &at)
                .map(|k| (k, at.layout.entries.next_multiple_of(2), None)),
        };
        let (mkey, xlt_room, umr) = match made {
            Ok(m) => m,
            Err(e) => {
                at.unmap(&pd.ctx);
                return Err(e);
            }
        };
        Ok(Mr {
            inner: Arc::new(MrInner {
                pd: pd.clone(),
                mkey,
                addr,
                len,
                access: access.into(),
                xlt_room,
                at,
                backing: m.backing,
                buf_offset: m.buf_offset,
                umr,
                cache,
                done: Default::default(),
            }),
        })
    }

    /// The memory under the MR as [`Mr::register`] maps it again.
    pub(crate) fn mapping(&self) -> Mapping {
        let i = &self.inner;
        Mapping {
            start: i.at.map_start,
            len: i.at.map_len,
            backing: i.backing.clone(),
            buf_offset: i.buf_offset,
        }
    }

    /// log2 of the MTT page size the mkey was made with (mkc
    /// `log_page_size`).
    pub fn log_page_size(&self) -> u32 {
        self.inner.at.layout.log_page
    }

    /// How many MTT entries describe the MR.
    pub fn mtt_entries(&self) -> usize {
        self.inner.at.layout.entries
    }

    /// How many bytes are mapped for DMA under the MR (its memory's whole
    /// pages around it; a [`DmaBuffer`] MR maps the whole buffer).
    pub fn mapped_len(&self) -> u64 {
        self.inner.at.map_len
    }

    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.inner.mkey
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.inner.mkey
    }

    /// The first virtual address.
    pub fn addr(&self) -> u64 {
        self.inner.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the MR is empty (never: MRs have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Its access flags: as registered, or as last changed by a
    /// re-registration or a posted access UMR.
    pub fn access(&self) -> u32 {
        self.inner.access.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.inner.pd.pdn
    }

    /// A scatter/gather entry for `len` bytes at `offset` into the MR,
    /// refused if it reaches outside.
    pub fn sge(&self, offset: u64, len: u32) -> Result<Sge> {
        if offset
            .checked_add(u64::from(len))
            .is_none_or(|e| e > self.inner.len)
        {
            return Err(Error::Invalid("SGE outside its MR"));
        }
        Ok(Sge {
            addr: self.inner.addr + offset,
            length: len,
            lkey: self.inner.mkey,
        })
    }

    /// The buffer under a [`Pd::reg_mr_buffer`] MR, and the MR's offset in it.
    pub fn buffer(&self) -> Option<(&Arc<DmaBuffer>, usize)> {
        match &self.inner.backing {
            Backing::Buffer(b) => Some((b, self.inner.buf_offset)),
            Backing::Host | Backing::DmaBuf(_) => None,
        }
    }

    /// `ibv_dereg_mr`: DESTROY_MKEY and unmap now, or `Busy` while clones
    /// of this handle exist (then it happens when the last one goes).
    pub fn dereg(self) -> Result<()> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => inner.destroy(),
            Err(_) => Err(Error::Busy("other handles of the MR exist")),
        }
    }
}

impl MrInner {
    fn destroy(&self) -> Result<()> {
        if self.done.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let ctx = &self.pd.ctx;
        if let Some(c) = &self.cache {
            // Revoked (or destroyed) before the memory goes; if neither
            // worked the mapping stays (leaked), as below.
            let r = c.give_back(self.mkey, self.xlt_room);
            if r.is_ok() || ctx.hca.health_failure().is_some() {
                self.at.unmap(ctx);
            }
            return r;
        }
        let r = destroy_mkey(ctx, self.mkey);
        if r.is_err() && ctx.hca.health_failure().is_none() {
            // The device may still hold the key: keep the memory mapped
            // (leaked) rather than let it reach memory that was given back.
            return r;
        }
        self.at.unmap(ctx);
        r
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            tracing::warn!("deregistering MR {:#x}: {e}", self.mkey);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K4: u64 = 4 << 10;
    const M2: u64 = 2 << 20;
    const G1: u64 = 1 << 30;

    /// Every byte of the MR falls in its entries, the entries in the
    /// reservation, and IOVA agrees with the host address modulo the page.
    fn check(addr: u64, len: u64, start: u64, map_len: u64, max: u32) -> MttLayout {
        let l = mtt_layout(addr, len, start, map_len, max);
        let p = 1u64 << l.log_page;
        assert!(l.log_page <= max && l.log_page >= 12);
        assert_eq!(l.map_off % p, start % p, "IOVA = host mod P");
        assert!(l.map_off + map_len <= l.res_len);
        assert!((l.first + l.entries as u64) * p <= l.res_len);
        // The device's view: entry index of the MR's first and last byte.
        let first_in_res = l.map_off + (addr - start);
        let last_in_res = first_in_res + len - 1;
        assert_eq!(first_in_res >> l.log_page, l.first);
        assert_eq!((last_in_res >> l.log_page) - l.first + 1, l.entries as u64);
        l
    }

    #[test]
    fn one_or_two_mtt_entries_up_to_the_largest_page() {
        // 4 KiB of heap: one 4 KiB entry.
        let l = check(0x10000, K4, 0x10000, K4, 31);
        assert_eq!((l.log_page, l.entries, l.res_len), (12, 1, K4));
        // 12 KiB straddling a 16 KiB window: two entries.
        let l = check(0x7000, 0x3000, 0x7000, 0x3000, 31);
        assert_eq!((l.log_page, l.entries, l.map_off), (14, 2, 0x3000));
        // 100 bytes in a 2 MiB huge page: the whole page is mapped, one
        // 2 MiB entry.
        let l = check(0x7f00_0020_0100, 100, 0x7f00_0020_0000, M2, 31);
        assert_eq!((l.log_page, l.entries), (21, 1));
        // 2 MiB pages, 6 MiB starting at an odd page: an 8 MiB MTT page,
        // two entries, one IOVA range.
        let l = check(0x7f00_0060_0000, 3 * M2, 0x7f00_0060_0000, 3 * M2, 31);
        assert_eq!((l.log_page, l.entries), (23, 2));
        // 1 GiB: one 1 GiB entry, aligned or not to 1 GiB (then two).
        assert_eq!(check(G1, G1, G1, G1, 31).entries, 1);
        assert_eq!(check(0x7fff_f000, G1, 0x7fff_f000, G1, 31).entries, 2);
        // A 1 GiB page: the same.
        let l = check(0x40_4000_0000, G1, 0x40_4000_0000, G1, 31);
        assert_eq!((l.log_page, l.entries, l.map_off), (30, 1, 0));
    }

    #[test]
    fn pages_beyond_the_caps_limit_take_more_entries() {
        // 8 GiB of 1 GiB pages: 2 GiB MTT pages without
        // umr_log_entity_size_5 (4 entries), one 8 GiB page with it.
        let l = check(0x80_0000_0000, 8 * G1, 0x80_0000_0000, 8 * G1, 31);
        assert_eq!((l.log_page, l.entries), (31, 4));
        let l = check(0x80_0000_0000, 8 * G1, 0x80_0000_0000, 8 * G1, 63);
        assert_eq!((l.log_page, l.entries), (33, 1));
        // Odd starts and lengths stay covered.
        for (addr, len, page) in [
            (0x1234_5000u64, 5 * G1 + 0x1000, K4),
            (0x7f12_3460_0000, 9 * M2 + 7, M2),
            (0x7f12_0000_0000 - 17, 4 * G1, G1),
        ] {
            let start = addr & !(page - 1);
            let end = (addr + len).next_multiple_of(page);
            for max in [21, 31, 63] {
                check(addr, len, start, end - start, max);
            }
        }
    }
}
