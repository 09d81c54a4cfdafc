//! Memory keys as the data path uses them: an lkey or rkey checked against
//! the mkey table (state, PD, access rights, bounds, QP binding) and
//! translated through its MTT into IOVA extents, and copies between two
//! IOVA spaces without a bounce buffer.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use vfio::IovaMemory;
use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap,
    MemoryRegionAddress, VolatileMemory, VolatileSlice,
};

/// Access rights of an mkey (the `mkc` bits `lr`, `lw`, `rr`, `rw`, `a`).
pub(crate) mod access {
    /// Local read.
    pub const LR: u8 = 1 << 0;
    /// Local write.
    pub const LW: u8 = 1 << 1;
    /// Remote read.
    pub const RR: u8 = 1 << 2;
    /// Remote write.
    pub const RW: u8 = 1 << 3;
    /// Remote atomic.
    pub const A: u8 = 1 << 4;
}

pub(crate) use mlx5_hw::wqe::{
    MKC_ACCESS_MODE_KLMS, MKC_ACCESS_MODE_KSM, MKC_ACCESS_MODE_MEMIC, MKC_ACCESS_MODE_MTT,
    MKC_ACCESS_MODE_PA,
};
use mlx5_hw::wqe::{MTT_RD_EN, MTT_WR_EN};

/// One memory key.
#[derive(Debug, Clone)]
pub(crate) struct Mkey {
    /// Index (the mkey's upper 24 bits).
    pub index: u32,
    /// The variant byte (the mkey's lower 8 bits).
    pub key: u8,
    /// Protection domain.
    pub pd: u32,
    /// Access rights (`access::*`).
    pub access: u8,
    /// `MKC_ACCESS_MODE_*`.
    pub mode: u8,
    /// Start of the key's virtual range.
    pub start: u64,
    /// Length of the range in bytes (`u64::MAX` for length64).
    pub len: u64,
    /// log2 of the MTT page size, in bytes.
    pub log_page: u32,
    /// MTT: each page's entry as written (`mtt`: the IOVA in bits 63:12,
    /// `wr_en` and `rd_en` in bits 1 and 0; an entry with neither, or one
    /// never written, is not present: ODP). Entries a CREATE_MKEY without
    /// `pg_access` gave are present ([`MTT_PRESENT`] added).
    pub mtt: Vec<u64>,
    /// The key is free (UMR will fill it in); it grants nothing.
    pub free: bool,
    /// UMR may modify it.
    pub umr_en: bool,
    /// QP the key is bound to ([`QPN_ANY`]: any; a type-2 memory window
    /// bound on a QP carries that QP's number).
    pub qpn: u32,
    /// A SEND with Invalidate may free it (`mkc.en_rinval`: Linux sets it
    /// on type-2 memory windows).
    pub en_rinval: bool,
    /// Translation entries the key was created with room for (mkc
    /// `translations_octword_size`: 2 MTT or 1 KLM per octoword); a UMR
    /// translation update must stay inside.
    pub xlt_max: usize,
    /// KLM and KSM modes: the entries, and the function whose keys they
    /// name (KSM: each entry covers `1 << log_page` bytes).
    pub klm: Option<Indirect>,
    /// mkc `relaxed_ordering_write` / `relaxed_ordering_read`, as created
    /// (kept and reported; the model's DMA is ordered either way).
    pub relaxed: (bool, bool),
}

/// `mkc.qpn` of a key not bound to a QP.
pub(crate) const QPN_ANY: u32 = 0xff_ffff;

/// The local right a remote access needs of the key an indirect entry
/// names (a memory window's target region grants remote access through
/// the window's own rights: remote write and atomics need the region's
/// local write, remote read its local read, IBA 10.6.7.2).
pub(crate) fn local_need(need: u8) -> u8 {
    let mut n = need & (access::LR | access::LW);
    if need & access::RR != 0 {
        n |= access::LR;
    }
    if need & (access::RW | access::A) != 0 {
        n |= access::LW;
    }
    n
}

/// The translation of an indirect key. KLM mode: each entry maps the
/// next `bcount` bytes of the key's range onto `[va, va + bcount)` of
/// `key`, or (`repeat`) a repeat block does. KSM mode: entry `i` maps
/// bytes `[i << log_page_size, (i + 1) << log_page_size)`, `bcount` unused.
/// The depth of a chain of indirect keys is limited by the device's
/// `cmd_hca_cap.max_indirection` ([`super::UmrCaps`]): an access through a
/// deeper chain is refused as an invalid key.
#[derive(Debug, Clone, Default)]
pub(crate) struct Indirect {
    /// The entries, in order of the range they cover.
    pub entries: Vec<Klm>,
    /// A repeat block (strided / interleaved pattern) instead of entries.
    pub repeat: Option<Repeat>,
    /// The mkey table the entries' keys live in.
    pub rdma: std::sync::Weak<super::Rdma>,
}

/// A repeat block (`struct mlx5_wqe_umr_repeat_block_seg` and its
/// entries): the entries' pieces one after the other make one repetition
/// of `block` bytes; repetition `r` takes entry `e`'s bytes at
/// `e.va + r * e.stride`; `count` repetitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repeat {
    /// Repetitions (`repeat_count`).
    pub count: u64,
    /// Bytes of one repetition (`byte_count`, the entries' sum).
    pub block: u64,
    /// The entries (`struct mlx5_wqe_umr_repeat_ent_seg`).
    pub ents: Vec<RepeatEnt>,
}

/// One repeat-block entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RepeatEnt {
    /// Distance between this entry's pieces of two repetitions.
    pub stride: u64,
    /// Bytes of the piece.
    pub bcount: u64,
    /// The key it points into.
    pub key: u32,
    /// Where its first piece starts in that key.
    pub va: u64,
}

/// One KLM entry (`struct mlx5_klm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Klm {
    /// Bytes this entry covers.
    pub bcount: u64,
    /// The key it points into.
    pub key: u32,
    /// Where in that key.
    pub va: u64,
}

/// A contiguous piece of IOVA space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    /// Start.
    pub iova: u64,
    /// Length in bytes.
    pub len: u32,
}

/// Why a key refused an access (mapped to a CQE syndrome by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No such key, key byte mismatch, or the key is free.
    Invalid,
    /// Wrong PD.
    Pd,
    /// Right missing.
    Access,
    /// Range outside the key.
    Bounds,
    /// A translation entry the access needs is not present (MTT entry
    /// without the `rd_en`/`wr_en` the access needs, a KSM/KLM entry
    /// naming the null mkey): a page fault (ODP).
    NotPresent,
}

/// The null mkey (QUERY_SPECIAL_CONTEXTS `null_mkey`): an indirect entry
/// naming it is not present (Linux's implicit ODP points every KSM
/// entry without a child at it).
pub(crate) const NULL_MKEY: u32 = crate::fw::NULL_MKEY;

/// The MTT entry bits an access needs: `wr_en` to write, `rd_en` to read.
fn mtt_need(need: u8) -> u64 {
    let mut b = 0;
    if need & (access::LW | access::RW | access::A) != 0 {
        b |= MTT_WR_EN;
    }
    if need & (access::LR | access::RR) != 0 {
        b |= MTT_RD_EN;
    }
    b
}

/// The page address of MTT entry `e` if the bits `want` are set.
#[inline]
fn mtt_page(e: u64, want: u64) -> Result<u64, KeyError> {
    if e & want != want {
        return Err(KeyError::NotPresent);
    }
    Ok(e & !0xfff)
}

impl Mkey {
    /// The key value (index << 8 | key byte).
    pub fn mkey(&self) -> u32 {
        self.index << 8 | u32::from(self.key)
    }

    /// Whether QP `qpn` may use the key (a type-2 window only on the QP
    /// it was bound on).
    pub fn usable_by(&self, qpn: u32) -> bool {
        self.qpn == QPN_ANY || self.qpn == qpn
    }

    /// Checks `[va, va + len)` for `need` under `pd` and appends its IOVA
    /// extents to `out`.
    pub fn resolve(
        &self,
        pd: u32,
        need: u8,
        va: u64,
        len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<(), KeyError> {
        self.resolve_at(pd, need, va, len, out, 0)
    }

    fn resolve_at(
        &self,
        pd: u32,
        need: u8,
        va: u64,
        len: u64,
        out: &mut Vec<Extent>,
        depth: u32,
    ) -> Result<(), KeyError> {
        if self.free {
            return Err(KeyError::Invalid);
        }
        if self.pd != pd {
            return Err(KeyError::Pd);
        }
        if self.access & need != need {
            return Err(KeyError::Access);
        }
        // A MEMIC key is zero-based (mlx5_ib's reg_dm_mr: IB_ZERO_BASED):
        // `va` is an offset into it, `start` the memory's BAR0 offset.
        let base = if self.mode == MKC_ACCESS_MODE_MEMIC {
            0
        } else {
            self.start
        };
        let off = va.wrapping_sub(base);
        if va < base || off > self.len || len > self.len - off {
            return Err(KeyError::Bounds);
        }
        if len == 0 {
            return Ok(());
        }
        match self.mode {
            MKC_ACCESS_MODE_PA => push(out, va, len),
            MKC_ACCESS_MODE_MTT => {
                let page = 1u64 << self.log_page;
                let want = mtt_need(need);
                let mut at = (self.start & (page - 1)) + off;
                let in_page = at & (page - 1);
                // An entry never written (past those given) reads as 0.
                let entry = |i: u64| self.mtt.get(i as usize).copied().unwrap_or(0);
                if len <= page - in_page {
                    // Within one page (most messages): one entry.
                    let base = mtt_page(entry(at >> self.log_page), want)?;
                    push(out, base + in_page, len);
                    return Ok(());
                }
                let mut left = len;
                while left > 0 {
                    let in_page = at & (page - 1);
                    let n = (page - in_page).min(left);
                    let base = mtt_page(entry(at >> self.log_page), want)?;
                    push(out, base + in_page, n);
                    at += n;
                    left -= n;
                }
            }
            MKC_ACCESS_MODE_KLMS => {
                let ind = self.klm.as_ref().ok_or(KeyError::Invalid)?;
                return ind.resolve(pd, need, off, len, out, depth);
            }
            MKC_ACCESS_MODE_KSM => {
                let ind = self.klm.as_ref().ok_or(KeyError::Invalid)?;
                let r = Reach { pd, need, depth };
                return ind.resolve_fixed(self.log_page, r, off, len, out);
            }
            MKC_ACCESS_MODE_MEMIC => {
                push(out, crate::fw::memic::DEVMEM_IOVA + self.start + off, len)
            }
            _ => return Err(KeyError::Invalid),
        }
        Ok(())
    }
}

impl Indirect {
    /// Resolves `len` bytes from `off` into the key's range through the
    /// entries: each piece through its entry's key, under the same PD and
    /// the local rights the access needs ([`local_need`]); a hole past the
    /// last entry is out of bounds.
    fn resolve(
        &self,
        pd: u32,
        need: u8,
        mut off: u64,
        mut len: u64,
        out: &mut Vec<Extent>,
        depth: u32,
    ) -> Result<(), KeyError> {
        let rdma = self.rdma.upgrade().ok_or(KeyError::Invalid)?;
        if depth >= rdma.umr_caps.max_indirection {
            return Err(KeyError::Invalid);
        }
        if let Some(rep) = &self.repeat {
            return rep.resolve(&rdma, Reach { pd, need, depth }, off, len, out);
        }
        for e in &self.entries {
            if len == 0 {
                break;
            }
            if off >= e.bcount {
                off -= e.bcount;
                continue;
            }
            let n = (e.bcount - off).min(len);
            if e.key == NULL_MKEY {
                return Err(KeyError::NotPresent);
            }
            let inner = rdma.mkey(e.key).ok_or(KeyError::Invalid)?;
            let va = e.va.checked_add(off).ok_or(KeyError::Bounds)?;
            inner.resolve_at(pd, local_need(need), va, n, out, depth + 1)?;
            off = 0;
            len -= n;
        }
        if len != 0 {
            return Err(KeyError::Bounds);
        }
        Ok(())
    }

    /// KSM: `len` bytes from `at` into the key (its start is entry 0's),
    /// entry `i` covering `[i << log, (i + 1) << log)`; an entry not
    /// written (inside the key's length, checked before) is not present.
    fn resolve_fixed(
        &self,
        log: u32,
        r: Reach,
        mut at: u64,
        mut len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<(), KeyError> {
        let rdma = self.rdma.upgrade().ok_or(KeyError::Invalid)?;
        if r.depth >= rdma.umr_caps.max_indirection {
            return Err(KeyError::Invalid);
        }
        let size = 1u64 << log;
        while len > 0 {
            let idx = usize::try_from(at >> log).map_err(|_| KeyError::Bounds)?;
            // An entry naming the null mkey is not present (a page fault
            // on an ODP key; Linux's implicit ODP parent points every entry
            // without a child at the null mkey, writing all of them first).
            // One never written holds nothing firmware defines: an invalid
            // key here, so that a driver relying on it is caught.
            let e = self.entries.get(idx).ok_or(KeyError::Invalid)?;
            if e.key == NULL_MKEY {
                return Err(KeyError::NotPresent);
            }
            let within = at & (size - 1);
            let n = (size - within).min(len);
            let inner = rdma.mkey(e.key).ok_or(KeyError::Invalid)?;
            let va = e.va.checked_add(within).ok_or(KeyError::Bounds)?;
            inner.resolve_at(r.pd, local_need(r.need), va, n, out, r.depth + 1)?;
            at += n;
            len -= n;
        }
        Ok(())
    }
}

/// What an access through an indirect key asks of the keys it names.
#[derive(Debug, Clone, Copy)]
struct Reach {
    pd: u32,
    need: u8,
    depth: u32,
}

impl Repeat {
    /// `len` bytes from `off` into the key: repetition `off / block`, then
    /// the entry whose piece holds `off % block`; a byte past the last
    /// repetition is out of bounds.
    fn resolve(
        &self,
        rdma: &super::Rdma,
        r: Reach,
        mut off: u64,
        mut len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<(), KeyError> {
        if self.block == 0 {
            return Err(KeyError::Invalid);
        }
        while len > 0 {
            let rep = off / self.block;
            if rep >= self.count {
                return Err(KeyError::Bounds);
            }
            let mut within = off % self.block;
            let e = self
                .ents
                .iter()
                .find(|e| {
                    if within < e.bcount {
                        return true;
                    }
                    within -= e.bcount;
                    false
                })
                .ok_or(KeyError::Bounds)?;
            let n = (e.bcount - within).min(len);
            let va = rep
                .checked_mul(e.stride)
                .and_then(|s| e.va.checked_add(s))
                .and_then(|v| v.checked_add(within))
                .ok_or(KeyError::Bounds)?;
            let inner = rdma.mkey(e.key).ok_or(KeyError::Invalid)?;
            inner.resolve_at(r.pd, local_need(r.need), va, n, out, r.depth + 1)?;
            off += n;
            len -= n;
        }
        Ok(())
    }
}

/// One `struct mlx5_klm` (byte count, key, address; `b` is at least its
/// size); a byte count of 0 is 2^31 bytes, as in a data segment.
pub(crate) fn klm_entry(b: &[u8]) -> Klm {
    use zerocopy::FromBytes;
    let Ok((k, _)) = mlx5_hw::ifc::Klm::read_from_prefix(b) else {
        return Klm {
            bcount: 0,
            key: 0,
            va: 0,
        };
    };
    let bc = k.bcount.get();
    Klm {
        bcount: if bc == 0 { 1 << 31 } else { u64::from(bc) },
        key: k.key.get(),
        va: k.va.get(),
    }
}

/// Appends `[iova, iova + len)`, merging with the previous extent when
/// contiguous; extents never exceed `u32::MAX` bytes.
#[inline]
pub(crate) fn push(out: &mut Vec<Extent>, iova: u64, len: u64) {
    // The data path's common case (a key's one extent into an empty
    // list) without the merge loop.
    if out.is_empty() && len != 0 && len <= u64::from(u32::MAX) {
        out.push(Extent {
            iova,
            len: len as u32,
        });
        return;
    }
    push_merged(out, iova, len);
}

/// [`push`] in general.
fn push_merged(out: &mut Vec<Extent>, mut iova: u64, mut len: u64) {
    while len > 0 {
        if let Some(last) = out.last_mut() {
            if last.iova + u64::from(last.len) == iova && u64::from(last.len) < u64::from(u32::MAX)
            {
                let n = (u64::from(u32::MAX) - u64::from(last.len)).min(len);
                last.len += n as u32;
                iova += n;
                len -= n;
                continue;
            }
        }
        let n = len.min(u64::from(u32::MAX));
        out.push(Extent {
            iova,
            len: n as u32,
        });
        iova += n;
        len -= n;
    }
}

/// Total bytes of `ext`.
#[cfg(test)]
pub(crate) fn total(ext: &[Extent]) -> u64 {
    ext.iter().map(|e| u64::from(e.len)).sum()
}

/// A DMA access that hit unmapped IOVA space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault {
    /// The IOVA.
    pub iova: u64,
}

/// Walks `len` bytes of `ext` starting `skip` bytes in, calling `f` with
/// each contiguous piece.
pub(crate) fn walk(
    ext: &[Extent],
    mut skip: u64,
    mut len: u64,
    mut f: impl FnMut(u64, usize) -> Result<(), Fault>,
) -> Result<(), Fault> {
    for e in ext {
        if len == 0 {
            break;
        }
        let el = u64::from(e.len);
        if skip >= el {
            skip -= el;
            continue;
        }
        let n = (el - skip).min(len);
        f(e.iova + skip, n as usize)?;
        skip = 0;
        len -= n;
    }
    Ok(())
}

/// Copies `len` bytes from `src` (extents in `smem`, from `sskip`) to `dst`
/// (extents in `dmem`, from `dskip`), memory to memory.
pub(crate) fn copy(
    smem: &IovaMemory,
    src: &[Extent],
    sskip: u64,
    dmem: &IovaMemory,
    dst: &[Extent],
    dskip: u64,
    len: u64,
) -> Result<(), Fault> {
    let mut si = 0usize;
    let mut soff = sskip;
    // Skip whole source extents.
    while si < src.len() && soff >= u64::from(src[si].len) {
        soff -= u64::from(src[si].len);
        si += 1;
    }
    walk(dst, dskip, len, |diova, mut n| {
        let mut d = diova;
        while n > 0 {
            let Some(se) = src.get(si) else {
                return Err(Fault { iova: d });
            };
            let avail = u64::from(se.len) - soff;
            let k = (avail as usize).min(n);
            let s = se.iova + soff;
            let from = smem
                .get_slice(GuestAddress(s), k)
                .map_err(|_| Fault { iova: s })?;
            let to = dmem
                .get_slice(GuestAddress(d), k)
                .map_err(|_| Fault { iova: d })?;
            from.copy_to_volatile_slice(to);
            n -= k;
            d += k as u64;
            soff += k as u64;
            if soff == u64::from(se.len) {
                si += 1;
                soff = 0;
            }
        }
        Ok(())
    })
}

/// A memory snapshot and the region last used in it: the messages of a
/// burst touch the same few buffers, so most lookups skip the search
/// through every mapping.
#[derive(Debug)]
pub(crate) struct Hinted<'a> {
    pub mem: &'a IovaMemory,
    last: Cell<Option<&'a GuestRegionMmap>>,
}

impl<'a> Hinted<'a> {
    pub(crate) fn new(mem: &'a IovaMemory) -> Self {
        Self {
            mem,
            last: Cell::new(None),
        }
    }

    /// `len` bytes at `iova`, within one mapping.
    pub(crate) fn slice(&self, iova: u64, len: usize) -> Result<VolatileSlice<'a>, Fault> {
        let within = |r: &GuestRegionMmap| {
            let start = r.start_addr().0;
            iova >= start && (len as u64) <= r.len() && iova - start <= r.len() - len as u64
        };
        let r = match self.last.get() {
            Some(r) if within(r) => r,
            _ => {
                let r = self
                    .mem
                    .find_region(GuestAddress(iova))
                    .ok_or(Fault { iova })?;
                self.last.set(Some(r));
                r
            }
        };
        r.get_slice(MemoryRegionAddress(iova - r.start_addr().0), len)
            .map_err(|_| Fault { iova })
    }
}

/// Copies a slice of another memory into extents of `mem`.
pub(crate) fn write_slice(
    mem: &Hinted<'_>,
    dst: &[Extent],
    dskip: u64,
    src: &VolatileSlice<'_>,
) -> Result<(), Fault> {
    let mut at = 0usize;
    walk(dst, dskip, src.len() as u64, |iova, n| {
        let to = mem.slice(iova, n)?;
        src.subslice(at, n)
            .map_err(|_| Fault { iova })?
            .copy_to_volatile_slice(to);
        at += n;
        Ok(())
    })
}

/// Copies bytes into extents.
pub(crate) fn write_bytes(
    mem: &IovaMemory,
    dst: &[Extent],
    dskip: u64,
    data: &[u8],
) -> Result<(), Fault> {
    let mut at = 0usize;
    walk(dst, dskip, data.len() as u64, |iova, n| {
        mem.write_slice(&data[at..at + n], GuestAddress(iova))
            .map_err(|_| Fault { iova })?;
        at += n;
        Ok(())
    })
}

/// [`write_bytes`] with the destination's region hint: a piece within
/// the hinted region (or the one found for it) is one copy; one that
/// reaches across regions goes through the search as before.
pub(crate) fn write_bytes_hinted(
    mem: &Hinted<'_>,
    dst: &[Extent],
    dskip: u64,
    data: &[u8],
) -> Result<(), Fault> {
    let mut at = 0usize;
    walk(dst, dskip, data.len() as u64, |iova, n| {
        let src = &data[at..at + n];
        match mem.slice(iova, n) {
            Ok(to) => to.copy_from(src),
            Err(_) => mem
                .mem
                .write_slice(src, GuestAddress(iova))
                .map_err(|_| Fault { iova })?,
        }
        at += n;
        Ok(())
    })
}

/// Copies bytes out of extents.
pub(crate) fn read_bytes(
    mem: &IovaMemory,
    src: &[Extent],
    sskip: u64,
    out: &mut [u8],
) -> Result<(), Fault> {
    let mut at = 0usize;
    let len = out.len() as u64;
    walk(src, sskip, len, |iova, n| {
        mem.read_slice(&mut out[at..at + n], GuestAddress(iova))
            .map_err(|_| Fault { iova })?;
        at += n;
        Ok(())
    })
}

/// Reads a big-endian u32 with acquire ordering (doorbell records).
pub(crate) fn load_be32(mem: &IovaMemory, iova: u64) -> Result<u32, Fault> {
    mem.load::<u32>(GuestAddress(iova), Ordering::Acquire)
        .map(u32::from_be)
        .map_err(|_| Fault { iova })
}

/// Reads `out.len()` bytes at `iova`.
pub(crate) fn read(mem: &IovaMemory, iova: u64, out: &mut [u8]) -> Result<(), Fault> {
    mem.read_slice(out, GuestAddress(iova))
        .map_err(|_| Fault { iova })
}

/// Writes `data` at `iova`.
pub(crate) fn write(mem: &IovaMemory, iova: u64, data: &[u8]) -> Result<(), Fault> {
    mem.write_slice(data, GuestAddress(iova))
        .map_err(|_| Fault { iova })
}

/// Stores one byte with release ordering: everything written before it
/// (a CQE's body) is visible to whoever sees it (the owner bit).
pub(crate) fn store_u8_release(mem: &IovaMemory, iova: u64, v: u8) -> Result<(), Fault> {
    mem.store(v, GuestAddress(iova), Ordering::Release)
        .map_err(|_| Fault { iova })
}

/// A 64-bit atomic on 8 aligned bytes at `iova`, big-endian in memory as
/// IBA specifies, or little-endian (`host`: the host byte order the driver
/// chose, `atomic_req_8B_endianness_mode` 1): `op(old) -> Some(new)` stores
/// `new` if the memory still holds `old`. Returns the original value.
pub(crate) fn atomic64(
    mem: &IovaMemory,
    iova: u64,
    host: bool,
    op: impl Fn(u64) -> u64,
) -> Result<u64, Fault> {
    let slice = mem
        .get_slice(GuestAddress(iova), 8)
        .map_err(|_| Fault { iova })?;
    let a = slice
        .get_atomic_ref::<std::sync::atomic::AtomicU64>(0)
        .map_err(|_| Fault { iova })?;
    // Memory order <-> value: a byte swap either way (x86 hosts).
    let from = |raw: u64| {
        if host {
            u64::from_le(raw)
        } else {
            u64::from_be(raw)
        }
    };
    let to = |v: u64| if host { v.to_le() } else { v.to_be() };
    let r = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |raw| {
        Some(to(op(from(raw))))
    });
    let raw = match r {
        Ok(v) | Err(v) => v,
    };
    Ok(from(raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn present(pages: &[u64]) -> Vec<u64> {
        pages
            .iter()
            .map(|p| p | mlx5_hw::wqe::MTT_PRESENT)
            .collect()
    }

    #[test]
    fn absent_and_read_only_mtt_entries_fault() {
        let mut k = mtt_key();
        // Page 1 absent, page 2 read only.
        k.mtt[1] = 0;
        k.mtt[2] = 0x20_0000 | MTT_RD_EN;
        let mut out = vec![];
        assert_eq!(
            k.resolve(7, access::LR, 0x7f00_0000_2000, 8, &mut out),
            Err(KeyError::NotPresent)
        );
        // Across pages 0 and 1: the absent one faults.
        assert_eq!(
            k.resolve(7, access::LR, 0x7f00_0000_1800, 0x1000, &mut out),
            Err(KeyError::NotPresent)
        );
        out.clear();
        k.resolve(7, access::LR, 0x7f00_0000_3000, 8, &mut out)
            .unwrap();
        assert_eq!(out[0].iova, 0x20_0000);
        k.access |= access::LW;
        assert_eq!(
            k.resolve(7, access::LW, 0x7f00_0000_3000, 8, &mut out),
            Err(KeyError::NotPresent)
        );
        // An entry never written (past the list) is absent too.
        k.mtt.truncate(3);
        assert_eq!(
            k.resolve(7, access::LR, 0x7f00_0000_4000, 8, &mut out),
            Err(KeyError::NotPresent)
        );
    }

    fn mtt_key() -> Mkey {
        Mkey {
            index: 3,
            key: 0x42,
            pd: 7,
            access: access::LR | access::LW | access::RR,
            mode: MKC_ACCESS_MODE_MTT,
            start: 0x7f00_0000_1800,
            len: 0x3000,
            log_page: 12,
            mtt: present(&[0x10_0000, 0x50_0000, 0x20_0000, 0x30_0000]),
            free: false,
            umr_en: false,
            qpn: 0xff_ffff,
            en_rinval: false,
            xlt_max: 4,
            klm: None,
            relaxed: (false, false),
        }
    }

    #[test]
    fn mtt_translation_and_checks() {
        let k = mtt_key();
        assert_eq!(k.mkey(), 0x342);
        let mut out = vec![];
        // Starts 0x800 into the first page, runs 0x1000: two pages.
        k.resolve(7, access::LR, 0x7f00_0000_1800, 0x1000, &mut out)
            .unwrap();
        assert_eq!(
            out,
            vec![
                Extent {
                    iova: 0x10_0800,
                    len: 0x800
                },
                Extent {
                    iova: 0x50_0000,
                    len: 0x800
                }
            ]
        );
        out.clear();
        // The last byte of the key.
        k.resolve(7, access::RR, 0x7f00_0000_47ff, 1, &mut out)
            .unwrap();
        assert_eq!(out[0].iova, 0x30_07ff);
        assert_eq!(
            k.resolve(7, access::LR, 0x7f00_0000_47ff, 2, &mut out),
            Err(KeyError::Bounds)
        );
        assert_eq!(
            k.resolve(7, access::LR, 0x7f00_0000_17ff, 1, &mut out),
            Err(KeyError::Bounds)
        );
        assert_eq!(
            k.resolve(8, access::LR, 0x7f00_0000_1800, 1, &mut out),
            Err(KeyError::Pd)
        );
        assert_eq!(
            k.resolve(7, access::RW, 0x7f00_0000_1800, 1, &mut out),
            Err(KeyError::Access)
        );
        assert_eq!(
            k.resolve(7, access::A, 0x7f00_0000_1800, 1, &mut out),
            Err(KeyError::Access)
        );
        // Contiguous pages merge.
        let mut c = mtt_key();
        c.mtt = present(&[0x10_0000, 0x10_1000, 0x10_2000, 0x10_3000]);
        out.clear();
        c.resolve(7, access::LR, 0x7f00_0000_1800, 0x3000, &mut out)
            .unwrap();
        assert_eq!(
            out,
            vec![Extent {
                iova: 0x10_0800,
                len: 0x3000
            }]
        );
    }

    #[test]
    fn mtt_of_2m_pages_translates_across_page_boundaries() {
        const M2: u64 = 2 << 20;
        // Three 2 MiB pages, out of order in IOVA space; the key starts
        // 0x1000 before the end of its first page.
        let k = Mkey {
            log_page: 21,
            start: 0x7f00_001f_f000,
            len: 2 * M2,
            mtt: present(&[0x4000_0000, 0x1000_0000, 0x2000_0000]),
            ..mtt_key()
        };
        let mut out = vec![];
        // 0x2000 bytes from the key's start: 0x1000 in page 0, 0x1000 in page 1.
        k.resolve(7, access::LR, k.start, 0x2000, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                Extent {
                    iova: 0x4000_0000 + M2 - 0x1000,
                    len: 0x1000
                },
                Extent {
                    iova: 0x1000_0000,
                    len: 0x1000
                }
            ]
        );
        // All of page 1 and into page 2: crosses the second boundary.
        out.clear();
        let va = k.start + 0x1000 + M2 - 8;
        k.resolve(7, access::LR, va, 16, &mut out).unwrap();
        assert_eq!(
            out,
            vec![
                Extent {
                    iova: 0x1000_0000 + M2 - 8,
                    len: 8
                },
                Extent {
                    iova: 0x2000_0000,
                    len: 8
                }
            ]
        );
        // The last byte is in page 2; one past it is out of bounds.
        out.clear();
        k.resolve(7, access::LR, k.start + 2 * M2 - 1, 1, &mut out)
            .unwrap();
        assert_eq!(out[0].iova, 0x2000_0000 + M2 - 0x1000 - 1);
        assert_eq!(
            k.resolve(7, access::LR, k.start + 2 * M2 - 1, 2, &mut out),
            Err(KeyError::Bounds)
        );
    }

    #[test]
    fn walk_skips_and_cuts() {
        let ext = [Extent { iova: 0, len: 10 }, Extent { iova: 100, len: 10 }];
        let mut seen = vec![];
        walk(&ext, 5, 10, |a, n| {
            seen.push((a, n));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(5, 5), (100, 5)]);
        assert_eq!(total(&ext), 20);
    }
}
