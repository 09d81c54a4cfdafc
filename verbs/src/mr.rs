//! Memory regions: CREATE_MKEY with an MTT over memory the device may
//! touch (`ibv_reg_mr`, `ibv_dereg_mr`).
//!
//! An MR's memory is mapped for DMA at an IOVA of its own, chosen so that
//! one or two MTT entries of a single large page describe it whatever its
//! size (up to 1 GiB and beyond): with `P` the power of two at least as
//! large as the page-rounded region, the IOVA space reserved is `2P`
//! aligned to `2P`, and the mapping starts at the reservation plus the
//! region's offset inside its `P`-aligned window of virtual addresses. So
//! virtual address `v` of the MR sits at
//! `entry[(v >> log P) - (start >> log P)] + (v mod P)`, which is how the
//! device translates an MTT mkey whose `start_addr` is the virtual address.
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
use vfio::{DmaBuffer, Iova};

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
    pub const SUPPORTED: u32 =
        LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC | HUGETLB | RELAXED_ORDERING;
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

#[derive(Debug)]
enum Backing {
    Buffer(#[allow(dead_code)] Arc<DmaBuffer>),
    Host,
}

#[derive(Debug)]
struct MrInner {
    pd: Arc<PdInner>,
    mkey: u32,
    addr: u64,
    len: u64,
    access: u32,
    iova_res: Iova,
    iova_res_len: u64,
    map_iova: Iova,
    map_len: u64,
    backing: Backing,
    buf_offset: usize,
    done: std::sync::atomic::AtomicBool,
}

/// A registered memory region (`struct ibv_mr`).
#[derive(Debug, Clone)]
pub struct Mr {
    inner: Arc<MrInner>,
}

/// Where a region's memory gets mapped: `(P, reservation length, offset of
/// the mapping inside the reservation, MTT entries)` for a page-aligned
/// host range `page_start .. page_start + map_len`.
pub fn mtt_geometry(page_start: u64, map_len: u64) -> (u64, u64, u64, usize) {
    let p = map_len.max(4096).next_power_of_two();
    let off = page_start & (p - 1);
    let entries = if off + map_len > p { 2 } else { 1 };
    (p, 2 * p, off, entries)
}

impl Pd {
    /// `ibv_reg_mr` over `len` bytes of `buf` from `offset`; the MR holds
    /// the buffer. Its virtual address is the buffer's host address.
    pub fn reg_mr_buffer(
        &self,
        buf: &Arc<DmaBuffer>,
        offset: usize,
        len: usize,
        access: u32,
    ) -> Result<Mr> {
        if offset.checked_add(len).is_none_or(|e| e > buf.len()) || len == 0 {
            return Err(Error::Invalid("MR range outside the buffer"));
        }
        let addr = buf.host_addr() + offset as u64;
        // The whole buffer is mapped (a DmaBuffer maps as one piece).
        Mr::register(
            &self.inner,
            addr,
            len as u64,
            access,
            buf.host_addr(),
            buf.len() as u64,
            Backing::Buffer(buf.clone()),
            offset,
        )
    }

    /// `ibv_reg_mr` over process memory at `addr .. addr + len`.
    ///
    /// # Safety
    ///
    /// The memory is readable and writable, stays mapped and in place, and
    /// is touched by the program only through volatile or atomic accesses
    /// (the device reads and writes it concurrently), until the MR is
    /// deregistered and dropped. The backend must be able to map process
    /// memory ([`vfio::PciFunction::dma_map_host`]).
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: u32) -> Result<Mr> {
        if len == 0 {
            return Err(Error::Invalid("empty MR"));
        }
        let a = addr as u64;
        let page_start = a & !0xfff;
        let end = a
            .checked_add(len as u64)
            .ok_or(Error::Invalid("MR range wraps"))?;
        let map_len = end.next_multiple_of(4096) - page_start;
        Mr::register(
            &self.inner,
            a,
            len as u64,
            access,
            page_start,
            map_len,
            Backing::Host,
            0,
        )
    }
}

impl Mr {
    #[allow(clippy::too_many_arguments)]
    fn register(
        pd: &Arc<PdInner>,
        addr: u64,
        len: u64,
        access: u32,
        page_start: u64,
        map_len: u64,
        backing: Backing,
        buf_offset: usize,
    ) -> Result<Mr> {
        use access::*;
        if access & !SUPPORTED != 0 {
            return Err(Error::Invalid("unsupported access flags"));
        }
        // Verbs: remote write or atomic needs local write.
        if access & (REMOTE_WRITE | REMOTE_ATOMIC) != 0 && access & LOCAL_WRITE == 0 {
            return Err(Error::Invalid(
                "REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE",
            ));
        }
        let ctx = &pd.ctx;
        let dma = ctx.hca.dma();
        let (p, res_len, off, _) = mtt_geometry(page_start, map_len);
        let lp = p.trailing_zeros();
        // Entries from the P-window of start_addr to that of the last byte;
        // entry k covers window (addr >> lp) + k.
        let first_win = (addr >> lp) - (page_start >> lp);
        let entries = (((addr + len - 1) >> lp) - (addr >> lp) + 1) as usize;
        let res = dma.alloc_iova(res_len, res_len)?;
        let map_iova = Iova(res.0 + off);
        let mapped = match &backing {
            Backing::Buffer(b) => dma.func.dma_map(map_iova, b),
            // SAFETY: `reg_mr_raw`'s caller vouches for the memory until
            // the MR is gone; the unmap happens in `MrInner::drop`.
            Backing::Host => unsafe { dma.func.dma_map_host(map_iova, page_start, map_len) },
        };
        if let Err(e) = mapped {
            dma.free_iova(res, res_len);
            return Err(e.into());
        }
        let g = ctx.hca.caps().gen();
        let ro = access & RELAXED_ORDERING != 0;
        let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES + 8 * entries];
        {
            let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateMkey.to_raw())
                .set_translations_octword_actual_size(entries.div_ceil(2) as u32);
            let mut m = c.memory_key_mkey_entry_mut();
            m.set_access_mode_1_0(mlx5_hw::wqe::MKC_ACCESS_MODE_MTT)
                .set_lr(true)
                .set_lw(access & LOCAL_WRITE != 0)
                .set_rr(access & REMOTE_READ != 0)
                .set_rw(access & REMOTE_WRITE != 0)
                .set_a(access & REMOTE_ATOMIC != 0)
                .set_relaxed_ordering_write(ro && g.relaxed_ordering_write())
                .set_relaxed_ordering_read(ro && g.relaxed_ordering_read())
                .set_qpn(MKC_QPN_NONE)
                .set_umr_en(true)
                .set_pd(pd.pdn)
                .set_start_addr(addr)
                .set_len(len)
                .set_translations_octword_size(entries.div_ceil(2) as u32)
                .set_log_page_size(p.trailing_zeros() as u8);
            for i in 0..entries {
                let e = (res.0 + (first_win + i as u64) * p) | MTT_RD_WR;
                c.set_klm_pas_mtt(2 * i, (e >> 32) as u32);
                c.set_klm_pas_mtt(2 * i + 1, e as u32);
            }
        }
        let out = match ctx.hca.cmd().exec(&inb, create_mkey_out::SIZE_BYTES) {
            Ok(o) => o,
            Err(e) => {
                if let Err(e2) = dma.func.dma_unmap(map_iova, map_len) {
                    tracing::warn!("dma_unmap after a failed CREATE_MKEY: {e2}");
                }
                dma.free_iova(res, res_len);
                return Err(e);
            }
        };
        let index = CreateMkeyOut::new_unchecked(&out[..]).mkey_index();
        // The key: index << 8 | mkey_7_0 (0 here).
        let mkey = index << 8;
        Ok(Mr {
            inner: Arc::new(MrInner {
                pd: pd.clone(),
                mkey,
                addr,
                len,
                access,
                iova_res: res,
                iova_res_len: res_len,
                map_iova,
                map_len,
                backing,
                buf_offset,
                done: Default::default(),
            }),
        })
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

    /// The access flags it was registered with.
    pub fn access(&self) -> u32 {
        self.inner.access
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
            Backing::Host => None,
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
        let mut inb = [0u8; destroy_mkey_in::SIZE_BYTES];
        DestroyMkeyIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DestroyMkey.to_raw())
            .set_mkey_index(self.mkey >> 8);
        let r = ctx
            .hca
            .cmd()
            .exec(&inb, destroy_mkey_out::SIZE_BYTES)
            .map(|_| ());
        if r.is_err() && ctx.hca.health_failure().is_none() {
            // The device may still hold the key: keep the memory mapped
            // (leaked) rather than let it reach memory that was given back.
            return r;
        }
        let dma = ctx.hca.dma();
        if let Err(e) = dma.func.dma_unmap(self.map_iova, self.map_len) {
            tracing::warn!("dma_unmap of MR {:#x}: {e}", self.mkey);
        }
        dma.free_iova(self.iova_res, self.iova_res_len);
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

    #[test]
    fn one_or_two_mtt_entries_cover_any_region() {
        // 4 KiB page-aligned: one entry.
        assert_eq!(mtt_geometry(0x10000, 0x1000), (0x1000, 0x2000, 0, 1));
        // 12 KiB starting mid-16K window: straddles → two entries.
        let (p, res, off, n) = mtt_geometry(0x7000, 0x3000);
        assert_eq!((p, res, off, n), (0x4000, 0x8000, 0x3000, 2));
        // 1 GiB aligned: one entry of 1 GiB.
        assert_eq!(mtt_geometry(0x4000_0000, 1 << 30), (1 << 30, 2 << 30, 0, 1));
        // 1 GiB at an odd page: two.
        let (p, _, off, n) = mtt_geometry(0x7fff_f000, 1 << 30);
        assert_eq!((p, off, n), (1 << 30, 0x3fff_f000, 2));
        // Every byte of a mapping falls inside the entries.
        for (start, len) in [
            (0x1000u64, 0x1000u64),
            (0x3000, 0x5000),
            (0x1234000, 0x9000),
        ] {
            let (p, res, off, n) = mtt_geometry(start, len);
            assert!(off + len <= n as u64 * p);
            assert!(n as u64 * p <= res);
        }
    }
}
