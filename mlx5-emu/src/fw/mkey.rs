//! CREATE_MKEY / DESTROY_MKEY / QUERY_MKEY: memory keys with physical
//! (PA) or MTT translation, access rights, PD, range, and the free /
//! umr_en bits UMR uses. The mkey is `index << 8 | mkey_7_0`; firmware
//! hands out indexes lowest first from [`FIRST_MKEY_INDEX`] (the indexes
//! below are the special contexts' keys).

use std::sync::Arc;

use mlx5_hw::ifc::{
    cmd_hca_cap, cmd_hca_cap_2, create_mkey_in, create_mkey_out, destroy_mkey_in, mkc,
    query_mkey_in, query_mkey_out,
};
use mlx5_hw::status::CmdStatus;
use mlx5_hw::wqe::{mkc_max_log_page_size, MKC_MIN_LOG_PAGE_SIZE, MTT_PRESENT};

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::transport::mem::{
    access, klm_entry, Indirect, Mkey, MKC_ACCESS_MODE_KLMS, MKC_ACCESS_MODE_KSM,
    MKC_ACCESS_MODE_MEMIC, MKC_ACCESS_MODE_MTT, MKC_ACCESS_MODE_PA,
};
use crate::transport::{rlock, wlock};
use crate::{lock, Inner};

/// First mkey index firmware hands out.
pub(crate) const FIRST_MKEY_INDEX: u32 = 0x10;
const MKC_AT: usize = create_mkey_in::MEMORY_KEY_MKEY_ENTRY.off / 8;

impl Firmware {
    pub(super) fn create_mkey(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_mkey_in::SIZE_BYTES,
            create_mkey_out::SIZE_BYTES,
        )?;
        let c = &input[MKC_AT..MKC_AT + mkc::SIZE_BYTES];
        let pd = mkc::PD.get(c) as u32;
        if !lock(&inner.rdma.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::MKEY_BAD_PD));
        }
        let mode = (mkc::ACCESS_MODE_4_2.get(c) << 2 | mkc::ACCESS_MODE_1_0.get(c)) as u8;
        let memic = mode == MKC_ACCESS_MODE_MEMIC && self.memic_window().is_some();
        if !memic
            && !matches!(
                mode,
                MKC_ACCESS_MODE_PA
                    | MKC_ACCESS_MODE_MTT
                    | MKC_ACCESS_MODE_KLMS
                    | MKC_ACCESS_MODE_KSM
            )
        {
            return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_ACCESS_MODE));
        }
        let mut acc = 0;
        for (f, b) in [
            (mkc::LR, access::LR),
            (mkc::LW, access::LW),
            (mkc::RR, access::RR),
            (mkc::RW, access::RW),
            (mkc::A, access::A),
        ] {
            if f.get(c) != 0 {
                acc |= b;
            }
        }
        let relaxed = self.relaxed_bits(c)?;
        let start = mkc::START_ADDR.get(c);
        let len = if mkc::LENGTH64.get(c) != 0 {
            u64::MAX
        } else {
            mkc::LEN.get(c)
        };
        let mut log_page = mkc::LOG_PAGE_SIZE.get(c) as u32;
        let free = mkc::FREE.get(c) != 0;
        let mut mtt = Vec::new();
        let mut umem_id = None;
        let octs_max = mkc::TRANSLATIONS_OCTWORD_SIZE.get(c) as usize;
        let mut klm = None;
        if mode == MKC_ACCESS_MODE_KLMS {
            klm = Some(self.klm_entries(inner, input, octs_max, free)?);
        } else if mode == MKC_ACCESS_MODE_KSM {
            // KSM: fixed-size entries of 2^log_page_size bytes each.
            if !(MKC_MIN_LOG_PAGE_SIZE..=mkc_max_log_page_size(true)).contains(&log_page) {
                return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_PAGE_SIZE));
            }
            let mut ind = self.klm_entries(inner, input, octs_max, free)?;
            for e in &mut ind.entries {
                e.bcount = 1 << log_page;
            }
            klm = Some(ind);
        } else if mode == MKC_ACCESS_MODE_MTT {
            let (m, lp, umem) = self.mtt_of(input, c, start, len, free)?;
            mtt = m;
            log_page = lp;
            umem_id = umem;
        } else if memic {
            // Device memory: inside one allocation, or of length 0.
            if !self.memic_key_fits(start, len) {
                return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_RANGE));
            }
        } else if len != u64::MAX && start.checked_add(len).is_none() {
            return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_RANGE));
        }
        let max = 1u32 << self.cap(cmd_hca_cap::LOG_MAX_MKEY).clamp(8, 24);
        let mut t = wlock(&inner.rdma.mkeys);
        let Some(index) = (FIRST_MKEY_INDEX..max).find(|i| !t.contains_key(i)) else {
            return Err(fail(CmdStatus::NoResources, synd::MKEY_EXHAUSTED));
        };
        // MTT room comes in 64-byte units (MLX5_UMR_FLEX_ALIGNMENT): Linux
        // pads every UMR translation to 64 bytes, e.g. 8 entries into a
        // cache key of 4 (2 octowords), and the card takes them.
        let xlt_max = if matches!(mode, MKC_ACCESS_MODE_KLMS | MKC_ACCESS_MODE_KSM) {
            octs_max
        } else {
            (octs_max.next_multiple_of(4) * 2).max(mtt.len())
        };
        let k = Mkey {
            index,
            key: mkc::MKEY_7_0.get(c) as u8,
            pd,
            access: acc,
            mode,
            start,
            len,
            log_page,
            mtt,
            free,
            umr_en: mkc::UMR_EN.get(c) != 0,
            qpn: mkc::QPN.get(c) as u32,
            en_rinval: mkc::EN_RINVAL.get(c) != 0,
            xlt_max,
            klm,
            relaxed,
        };
        tracing::debug!(
            mkey = format_args!("{:#x}", k.mkey()),
            pd,
            start = format_args!("{start:#x}"),
            len,
            "CREATE_MKEY"
        );
        t.insert(index, Arc::new(k));
        drop(t);
        if let Some(id) = umem_id {
            self.umem_used_by(super::uctx::Kind::Mkey, index, &[id]);
        }
        let mut out = vec![0u8; create_mkey_out::SIZE_BYTES];
        create_mkey_out::MKEY_INDEX.set(&mut out, u64::from(index));
        Ok(out)
    }

    /// The mkc relaxed-ordering bits `(write, read)`, each only where the
    /// general caps offer it (`relaxed_ordering_write`;
    /// `relaxed_ordering_read` or `relaxed_ordering_read_pci_enabled`, the
    /// model's PCIe device control always enabling relaxed ordering).
    /// Linux and rdma-core set them only then; a bit the caps do not offer
    /// is BAD_PARAMETER (the model's choice: real firmware's answer is not
    /// traced).
    fn relaxed_bits(&self, c: &[u8]) -> Result<(bool, bool), super::Fail> {
        let w = mkc::RELAXED_ORDERING_WRITE.get(c) != 0;
        let r = mkc::RELAXED_ORDERING_READ.get(c) != 0;
        let can_w = self.cap(cmd_hca_cap::RELAXED_ORDERING_WRITE) != 0;
        let can_r = self.cap(cmd_hca_cap::RELAXED_ORDERING_READ) != 0
            || self.cap(cmd_hca_cap::RELAXED_ORDERING_READ_PCI_ENABLED) != 0;
        if (w && !can_w) || (r && !can_r) {
            return Err(fail(
                CmdStatus::BadParameter,
                synd::MKEY_BAD_RELAXED_ORDERING,
            ));
        }
        Ok((w, r))
    }

    /// An MTT key's translation entries and log2 page size: from the
    /// command's list (`klm_pas_mtt`), or (DevX, `mkey_umem_valid`) from
    /// UMEM `mkey_umem_id` at `mkey_umem_offset`, its pages and page size,
    /// `start` in the same place of its page as that offset (rdma-core's
    /// `mlx5dv_devx_umem_reg` keeps the buffer's page offset). The UMEM,
    /// when one is used.
    fn mtt_of(
        &self,
        input: &[u8],
        c: &[u8],
        start: u64,
        len: u64,
        free: bool,
    ) -> Result<(Vec<u64>, u32, Option<u32>), super::Fail> {
        let log_page = mkc::LOG_PAGE_SIZE.get(c) as u32;
        if create_mkey_in::MKEY_UMEM_VALID.get(input) != 0 {
            let id = create_mkey_in::MKEY_UMEM_ID.get(input) as u32;
            let off = create_mkey_in::MKEY_UMEM_OFFSET.get(input);
            if free || len == u64::MAX {
                return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_RANGE));
            }
            let write = mkc::LW.get(c) != 0 || mkc::RW.get(c) != 0 || mkc::A.get(c) != 0;
            let uid = super::uctx::uid_of(input);
            let (pages, lp, in_page) = self.umem_mtt(uid, id, off, len, write)?;
            if start & ((1u64 << lp) - 1) != in_page {
                return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_RANGE));
            }
            let pages = pages.into_iter().map(|p| p | MTT_PRESENT).collect();
            return Ok((pages, lp, Some(id)));
        }
        let mut mtt = Vec::new();
        let wide = self.caps.get(
            crate::profile::cap_type::GENERAL_2,
            cmd_hca_cap_2::UMR_LOG_ENTITY_SIZE_5,
        ) != 0;
        if !(MKC_MIN_LOG_PAGE_SIZE..=mkc_max_log_page_size(wide)).contains(&log_page) {
            return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_PAGE_SIZE));
        }
        let page = 1u64 << log_page;
        let octs = create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.get(input) as usize;
        let given = (input.len() - create_mkey_in::SIZE_BYTES) / 8;
        let needed = if free || len == u64::MAX || len == 0 {
            0
        } else {
            // Pages from the one holding `start` to the one holding
            // the last byte.
            let last = (start & (page - 1)).saturating_add(len - 1);
            usize::try_from((last >> log_page) + 1).unwrap_or(usize::MAX)
        };
        let n = given.min(octs.max(mkc::TRANSLATIONS_OCTWORD_SIZE.get(c) as usize) * 2);
        if n < needed {
            return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_MTT));
        }
        // With `pg_access` the entries' rd_en/wr_en count (an entry
        // without them is not present: ODP); without, every entry given is
        // present (Linux sets the bits only under pg_access).
        let pg_access = create_mkey_in::PG_ACCESS.get(input) != 0;
        for i in 0..n.max(needed) {
            let at = create_mkey_in::SIZE_BYTES + i * 8;
            let e = u64::from_be_bytes(input[at..at + 8].try_into().unwrap_or([0; 8]));
            mtt.push(if pg_access {
                e & !0xffc
            } else {
                (e & !0xfff) | MTT_PRESENT
            });
        }
        Ok((mtt, log_page, None))
    }

    /// The KLM entries of an indirect key's CREATE_MKEY (one per
    /// octoword after the input; none for a free key, which UMR fills).
    fn klm_entries(
        &self,
        inner: &Inner,
        input: &[u8],
        octs_max: usize,
        free: bool,
    ) -> Result<Indirect, super::Fail> {
        let octs = create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.get(input) as usize;
        let given = (input.len() - create_mkey_in::SIZE_BYTES) / mlx5_hw::ifc::klm::SIZE_BYTES;
        if octs > octs_max.max(octs) || octs > given {
            return Err(fail(CmdStatus::BadParameter, synd::MKEY_BAD_MTT));
        }
        let n = if free { 0 } else { octs };
        // A KSM entry is a KLM entry without its byte count (the caller
        // sets it): key and address sit at the same places.
        let entries = input[create_mkey_in::SIZE_BYTES..]
            .chunks_exact(mlx5_hw::ifc::klm::SIZE_BYTES)
            .take(n)
            .map(klm_entry)
            .collect();
        Ok(Indirect {
            entries,
            repeat: None,
            rdma: inner.rdma.me.clone(),
        })
    }

    pub(super) fn destroy_mkey(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_mkey_in::SIZE_BYTES, 0x10)?;
        let index = destroy_mkey_in::MKEY_INDEX.get(input) as u32;
        if wlock(&inner.rdma.mkeys).remove(&index).is_none() {
            return Err(fail(CmdStatus::BadResource, synd::MKEY_UNKNOWN));
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_mkey(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_mkey_in::SIZE_BYTES,
            query_mkey_out::MEMORY_KEY_MKEY_ENTRY.off / 8 + mkc::SIZE_BYTES,
        )?;
        let index = query_mkey_in::MKEY_INDEX.get(input) as u32;
        let Some(k) = rlock(&inner.rdma.mkeys).get(&index).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::MKEY_UNKNOWN));
        };
        // Room for the translation list when the caller sized the outbox
        // for it (Linux's DevX page-fault path: `query_mkey_out` plus one
        // KLM per entry past the first two).
        let list_at = query_mkey_out::BSF0_KLM0_PAS_MTT0_1.off / 8;
        let listed = k
            .klm
            .as_ref()
            .filter(|i| i.repeat.is_none())
            .map_or(0, |i| i.entries.len());
        let full =
            (list_at + listed * mlx5_hw::ifc::klm::SIZE_BYTES).max(query_mkey_out::SIZE_BYTES);
        let mut out = vec![0u8; full.min(outlen.max(0x50))];
        let at = query_mkey_out::MEMORY_KEY_MKEY_ENTRY.off / 8;
        let c = &mut out[at..at + mkc::SIZE_BYTES];
        mkc::FREE.set(c, u64::from(k.free));
        mkc::ACCESS_MODE_1_0.set(c, u64::from(k.mode & 3));
        mkc::ACCESS_MODE_4_2.set(c, u64::from(k.mode >> 2));
        mkc::UMR_EN.set(c, u64::from(k.umr_en));
        for (f, b) in [
            (mkc::LR, access::LR),
            (mkc::LW, access::LW),
            (mkc::RR, access::RR),
            (mkc::RW, access::RW),
            (mkc::A, access::A),
        ] {
            f.set(c, u64::from(k.access & b != 0));
        }
        mkc::QPN.set(c, u64::from(k.qpn));
        mkc::EN_RINVAL.set(c, u64::from(k.en_rinval));
        mkc::MKEY_7_0.set(c, u64::from(k.key));
        mkc::PD.set(c, u64::from(k.pd));
        mkc::START_ADDR.set(c, k.start);
        if k.len == u64::MAX {
            mkc::LENGTH64.set(c, 1);
        } else {
            mkc::LEN.set(c, k.len);
        }
        mkc::LOG_PAGE_SIZE.set(c, u64::from(k.log_page));
        mkc::RELAXED_ORDERING_WRITE.set(c, u64::from(k.relaxed.0));
        mkc::RELAXED_ORDERING_READ.set(c, u64::from(k.relaxed.1));
        // KLM and KSM keys: one entry per octoword, as many as the key was
        // made with room for (a free or repeat-block key has no list).
        let octs = match k.mode {
            MKC_ACCESS_MODE_KLMS | MKC_ACCESS_MODE_KSM => k.xlt_max,
            _ => k.mtt.len().div_ceil(2),
        };
        mkc::TRANSLATIONS_OCTWORD_SIZE.set(c, octs as u64);
        // The list itself from `bsf0_klm0_pas_mtt0_1` on, as firmware
        // returns it: KLM (byte count, key, address) or KSM (key,
        // address), as many as fit the outbox. A repeat block has none.
        if let Some(ind) = k.klm.as_ref().filter(|i| i.repeat.is_none()) {
            let ksm = k.mode == MKC_ACCESS_MODE_KSM;
            for (i, e) in ind.entries.iter().enumerate() {
                let at = list_at + i * mlx5_hw::ifc::klm::SIZE_BYTES;
                let Some(b) = out.get_mut(at..at + mlx5_hw::ifc::klm::SIZE_BYTES) else {
                    break;
                };
                if !ksm {
                    mlx5_hw::ifc::klm::BCOUNT.set(b, e.bcount);
                }
                mlx5_hw::ifc::klm::KEY.set(b, u64::from(e.key));
                mlx5_hw::ifc::klm::VA.set(b, e.va);
            }
        }
        Ok(out)
    }
}
