//! DevX user memory: CREATE_UMEM / DESTROY_UMEM register a range of the
//! function's DMA space as an MTT list of pages (`log_page_size`, the
//! range's offset in its first page, read/write access per entry), under
//! a uid. Queues and doorbell records placed in a UMEM (`cq_umem_*`,
//! `wq_umem_*`, `dbr_umem_*`) are resolved through that page list with the
//! checks a PAS list gets (pages mapped for DMA when registered, the range
//! inside what was registered), and keep the UMEM alive: destroying a UMEM
//! an object uses is refused (BAD_RES_STATE).

use mlx5_hw::devx::{MTT_FLAGS_MASK, MTT_WR_EN};
use mlx5_hw::ifc::{cmd_hca_cap, create_umem_in, create_umem_out, destroy_umem_in, mtt, umem};
use mlx5_hw::status::CmdStatus;

use super::uctx::{synd, uid_of, Kind};
use super::{fail, sized, CmdResult, Fail, Firmware};
use crate::transport::qp::Buf;
use crate::Inner;

/// The largest UMEM page firmware takes (log2 bytes; umem.log_page_size is
/// 5 bits of log2(page / 4 KiB)).
const MAX_LOG_PAGE: u32 = 12 + 31;

/// A registered UMEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Umem {
    /// The user context it was registered under.
    pub uid: u16,
    /// The IOVA of each page.
    pub pages: Vec<u64>,
    /// log2 of the page size in bytes.
    pub log_page: u32,
    /// Where the range starts in the first page.
    pub page_offset: u64,
    /// The range's length: the pages less the first page's offset.
    pub len: u64,
    /// Every entry lets the device write.
    pub write: bool,
}

impl Umem {
    /// The IOVA of byte `off` of the range.
    fn addr(&self, off: u64) -> Option<u64> {
        let o = off.checked_add(self.page_offset)?;
        let page = self.pages.get(usize::try_from(o >> self.log_page).ok()?)?;
        Some(page + (o & ((1u64 << self.log_page) - 1)))
    }
}

impl Firmware {
    pub(super) fn create_umem(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_umem_in::SIZE_BYTES,
            create_umem_out::SIZE_BYTES,
        )?;
        if self.cap(cmd_hca_cap::LOG_MAX_UMEM) == 0 {
            return Err(fail(CmdStatus::BadOperation, super::synd::BAD_OPCODE));
        }
        let uid = uid_of(input);
        if uid == 0 && self.cap(cmd_hca_cap::UMEM_UID_0) == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_UID));
        }
        let at = create_umem_in::UMEM.off / 8;
        let u = &input[at..];
        let bad = || fail(CmdStatus::BadParameter, synd::UMEM_BAD_PARAM);
        let log_page = 12 + umem::LOG_PAGE_SIZE.get(u) as u32;
        let page_offset = umem::PAGE_OFFSET.get(u);
        let n = umem::NUM_OF_MTT.get(u);
        if log_page > MAX_LOG_PAGE || page_offset >= 1 << log_page || n == 0 || n > 1 << 24 {
            return Err(bad());
        }
        let n = n as usize;
        let first = umem::MTT.off / 8;
        if u.len() < first + n * mtt::SIZE_BYTES {
            return Err(fail(
                CmdStatus::BadInputLength,
                super::synd::BAD_INPUT_LENGTH,
            ));
        }
        let mut pages = Vec::with_capacity(n);
        let mut write = true;
        for e in u[first..first + n * mtt::SIZE_BYTES].chunks_exact(mtt::SIZE_BYTES) {
            let v = u64::from_be_bytes(e.try_into().map_err(|_| bad())?);
            let page = v & !MTT_FLAGS_MASK;
            if page & ((1u64 << log_page) - 1) != 0 {
                return Err(bad());
            }
            if !inner.bus.dma.is_mapped(page, 1u64 << log_page) {
                return Err(fail(CmdStatus::BadParameter, synd::UMEM_NOT_MAPPED));
            }
            write &= v & MTT_WR_EN != 0;
            pages.push(page);
        }
        let max = 1u32 << self.cap(cmd_hca_cap::LOG_MAX_UMEM).min(24);
        let Some(id) = (1..max).find(|i| !self.devx.umems.contains_key(i)) else {
            return Err(fail(CmdStatus::NoResources, synd::UMEM_EXHAUSTED));
        };
        let len = ((n as u64) << log_page) - page_offset;
        tracing::debug!(id, uid, n, log_page, page_offset, "CREATE_UMEM");
        self.devx.umems.insert(
            id,
            Umem {
                uid,
                pages,
                log_page,
                page_offset,
                len,
                write,
            },
        );
        let mut out = vec![0u8; create_umem_out::SIZE_BYTES];
        create_umem_out::UMEM_ID.set(&mut out, u64::from(id));
        Ok(out)
    }

    pub(super) fn destroy_umem(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_umem_in::SIZE_BYTES, 0x10)?;
        let id = destroy_umem_in::UMEM_ID.get(input) as u32;
        let Some(m) = self.devx.umems.get(&id) else {
            return Err(fail(CmdStatus::BadResource, synd::UMEM_UNKNOWN));
        };
        if m.uid != uid_of(input) {
            return Err(fail(CmdStatus::BadParameter, synd::UID_MISMATCH));
        }
        if self.devx.umem_in_use(id) {
            return Err(fail(CmdStatus::BadResourceState, synd::UMEM_IN_USE));
        }
        self.devx.umems.remove(&id);
        Ok(vec![0; 0x10])
    }

    /// UMEM `id` for bytes `off .. off + len` of a queue or doorbell
    /// record the device writes, created under `uid`.
    fn umem_range(&self, uid: u16, id: u32, off: u64, len: u64) -> Result<&Umem, Fail> {
        self.umem_span(uid, id, off, len, true)
    }

    /// UMEM `id` for bytes `off .. off + len`, created under `uid`, its
    /// entries letting the device write where `write`.
    fn umem_span(&self, uid: u16, id: u32, off: u64, len: u64, write: bool) -> Result<&Umem, Fail> {
        let Some(m) = self.devx.umems.get(&id) else {
            return Err(fail(CmdStatus::BadResource, synd::UMEM_UNKNOWN));
        };
        if m.uid != uid {
            return Err(fail(CmdStatus::BadParameter, synd::UID_MISMATCH));
        }
        if write && !m.write {
            return Err(fail(CmdStatus::BadParameter, synd::UMEM_NO_WRITE));
        }
        if off.checked_add(len).is_none_or(|end| end > m.len) {
            return Err(fail(CmdStatus::BadParameter, synd::UMEM_OUT_OF_RANGE));
        }
        Ok(m)
    }

    /// A queue buffer of `len` bytes at `off` in UMEM `id`, which the
    /// device writes (a CQ's, a QP's).
    pub(super) fn umem_buf(&self, uid: u16, id: u32, off: u64, len: u64) -> Result<Buf, Fail> {
        let m = self.umem_range(uid, id, off, len)?;
        Ok(Buf::new(m.pages.clone(), m.log_page, m.page_offset + off))
    }

    /// An SQ's or RQ's ring of `len` bytes at `off` in UMEM `id`, or
    /// (`len` 0) its doorbell record's IOVA at `off`: the device only reads
    /// them, so the UMEM need not let it write (DPDK's mlx5 PMD registers
    /// its queues' UMEMs with no access flags, and mlx5_ib then sets no
    /// `wr_en` in their entries).
    pub(super) fn umem_wq_ring(&self, uid: u16, id: u32, off: u64, len: u64) -> Result<Buf, Fail> {
        let m = self.umem_span(uid, id, off, len, false)?;
        Ok(Buf::new(m.pages.clone(), m.log_page, m.page_offset + off))
    }

    /// [`Self::umem_wq_ring`]'s doorbell record: its IOVA.
    pub(super) fn umem_wq_dbr(&self, uid: u16, id: u32, off: u64) -> Result<u64, Fail> {
        self.dbr_in(self.umem_span(uid, id, off, 8, false)?, off)
    }

    /// An MTT memory key's translation from UMEM `id` (CREATE_MKEY with
    /// `mkey_umem_valid`): the pages from the one holding byte `off` on,
    /// their log2 size, and where byte `off` lies in its page; `write` when
    /// the key grants local or remote write.
    pub(super) fn umem_mtt(
        &self,
        uid: u16,
        id: u32,
        off: u64,
        len: u64,
        write: bool,
    ) -> Result<(Vec<u64>, u32, u64), Fail> {
        let m = self.umem_span(uid, id, off, len, write)?;
        let at = m.page_offset + off;
        let first = usize::try_from(at >> m.log_page).unwrap_or(usize::MAX);
        let pages = m.pages.get(first..).unwrap_or_default().to_vec();
        Ok((pages, m.log_page, at & ((1u64 << m.log_page) - 1)))
    }

    /// The IOVA of a doorbell record at `off` in UMEM `id`.
    pub(super) fn umem_dbr(&self, uid: u16, id: u32, off: u64) -> Result<u64, Fail> {
        self.dbr_in(self.umem_range(uid, id, off, 8)?, off)
    }

    /// The IOVA of the 8-byte-aligned doorbell record at `off` in `m`.
    fn dbr_in(&self, m: &Umem, off: u64) -> Result<u64, Fail> {
        if off % 8 != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::UMEM_OUT_OF_RANGE));
        }
        m.addr(off)
            .ok_or(fail(CmdStatus::BadParameter, synd::UMEM_OUT_OF_RANGE))
    }

    /// Object `n` of `kind` uses the UMEMs `ids` (from now until it is
    /// destroyed).
    pub(super) fn umem_used_by(&mut self, kind: Kind, n: u32, ids: &[u32]) {
        if !ids.is_empty() {
            self.devx
                .uses
                .entry((kind, n))
                .or_default()
                .extend(ids.iter().copied());
        }
    }
}
