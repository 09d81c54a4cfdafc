//! UMR WQEs (`MLX5_OPCODE_UMR`): a memory key modified from a send queue,
//! as Linux's mlx5_ib posts them on its REG_UMR QP (`mlx5r_umr_*`) and
//! rdma-core's mlx5dv on an RC QP (PRM "User-Mode Memory Registration",
//! the UMR control segment, the mkey context segment and the translation
//! that follows them).
//!
//! The WQE is the control segment (its `imm` names the mkey), the UMR
//! control segment (`struct mlx5_wqe_umr_ctrl_seg`: check-free flags,
//! inline flag, translation octowords and offset, the mkey mask), the mkey
//! context segment (`struct mlx5_mkey_seg`, laid out as the `mkc`), then
//! the translation: inline (`MLX5_UMR_INLINE`) or one data segment pointing
//! at it in memory. Every check is made before anything changes, so a
//! refused UMR leaves the key as it was; the key is replaced in one write
//! of the table (a reader sees the old or the new key, never a mix).
//! Ordering: the requester completes every message before a UMR (it is
//! not coalesced), which is what the small fence and strong ordering ask.

use std::sync::Arc;

use mlx5_hw::cqe::CqeSyndrome;
use mlx5_hw::ifc::{
    klm, ksm, mkc, mkey_seg, wqe_ctrl_seg, wqe_data_seg, wqe_umr_ctrl_seg,
    wqe_umr_repeat_block_seg, wqe_umr_repeat_ent_seg, WqeDataSeg,
};
use mlx5_hw::wqe::{
    mkc_max_log_page_size, MKC_ACCESS_MODE_KLMS, MKC_ACCESS_MODE_KSM, MKC_ACCESS_MODE_MTT,
    MKC_MIN_LOG_PAGE_SIZE, MKEY_MASK_A, MKEY_MASK_EN_RINVAL, MKEY_MASK_FREE, MKEY_MASK_KEY,
    MKEY_MASK_LEN, MKEY_MASK_LR, MKEY_MASK_LW, MKEY_MASK_PAGE_SIZE, MKEY_MASK_PAGE_SIZE_5,
    MKEY_MASK_PD, MKEY_MASK_QPN, MKEY_MASK_RR, MKEY_MASK_RW, MKEY_MASK_START_ADDR, MTT_ENTRY_BYTES,
    UMR_CHECK_FREE, UMR_CHECK_NOT_FREE, UMR_CHECK_QPN, UMR_INLINE, UMR_OCTOWORD,
    UMR_REPEAT_BLOCK_OP, UMR_TRANSLATION_OFFSET_EN,
};
use vfio::IovaMemory;
use zerocopy::FromBytes;

use super::mem::{self, access, klm_entry, Mkey, QPN_ANY};
use super::{wlock, Rdma};

/// Vendor syndromes of a refused UMR (stable values of this model).
pub(crate) mod vendor {
    /// The WQE is shorter than its segments, or its translation is.
    pub const UMR_MALFORMED: u8 = 0x70;
    /// No such mkey, or its key byte differs.
    pub const UMR_BAD_MKEY: u8 = 0x71;
    /// The mkey was not created with `umr_en`.
    pub const UMR_NOT_ENABLED: u8 = 0x72;
    /// `MLX5_UMR_CHECK_FREE` / `CHECK_NOT_FREE` did not hold.
    pub const UMR_FREE_CHECK: u8 = 0x73;
    /// The mkey belongs to another PD than the (non-UMR) QP.
    pub const UMR_PD_MISMATCH: u8 = 0x74;
    /// The translation reaches past the entries the mkey has room for.
    pub const UMR_XLT_RANGE: u8 = 0x75;
    /// An mkey field out of range (page size), or a mode UMR cannot fill.
    pub const UMR_BAD_FIELD: u8 = 0x76;
    /// The translation pointer's key refused the read.
    pub const UMR_XLT_KEY: u8 = 0x77;
    /// `CHECK_QPN`: the key is bound to another QP than the posting one
    /// (a type-2 window bound elsewhere). A key bound to no QP (`qpn`
    /// 0xffffff: a free window, a type-1 window, an mlx5dv indirect key)
    /// passes: libmlx5's LOCAL_INV is this UMR, on mlx5dv keys too.
    pub const UMR_QPN_CHECK: u8 = 0x78;
    /// Bind: an entry names no usable region (unknown key, key byte,
    /// free).
    pub const BIND_BAD_MR: u8 = 0x79;
    /// Bind: the region belongs to another PD than the window.
    pub const BIND_PD: u8 = 0x7a;
    /// Bind: the window reaches outside the region.
    pub const BIND_RANGE: u8 = 0x7b;
    /// Bind: remote write or atomic on a region without local write.
    pub const BIND_ACCESS: u8 = 0x7c;
    /// Bind: a type-2 window bound to another QP than the posting one, or
    /// not free.
    pub const BIND_QP: u8 = 0x7d;
}

type Refusal = (CqeSyndrome, u8);

const CTRL_AT: usize = wqe_ctrl_seg::SIZE_BYTES;
const SEG_AT: usize = CTRL_AT + wqe_umr_ctrl_seg::SIZE_BYTES;
const XLT_AT: usize = SEG_AT + mkey_seg::SIZE_BYTES;

/// The send queue a UMR WQE was posted on, as the UMR's checks see it:
/// a QP (Linux's REG_UMR QP, or a user QP through mlx5dv) or an Ethernet
/// SQ made with `reg_umr` (mlx5e's internal control SQ, which maps its
/// striding RQs' pages by UMR).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Poster {
    /// Its number (a key bound to a QP must be bound to this one).
    pub qpn: u32,
    /// Its protection domain (the key's must match, unless privileged).
    pub pd: u32,
    /// A REG_UMR QP: no PD of its own, any key, no memory-window binds.
    pub privileged: bool,
}

fn malformed() -> Refusal {
    (CqeSyndrome::LocalQpOpErr, vendor::UMR_MALFORMED)
}

/// Executes the UMR WQE in `buf` (its first `end` bytes, control segment
/// included) whose control segment names `mkey`.
pub(crate) fn execute(
    rdma: &Rdma,
    qp: Poster,
    mem: &IovaMemory,
    mkey: u32,
    buf: &[u8],
    end: usize,
) -> Result<(), Refusal> {
    let wqe = buf.get(..end).ok_or_else(malformed)?;
    let ctrl = wqe.get(CTRL_AT..SEG_AT).ok_or_else(malformed)?;
    let flags = wqe_umr_ctrl_seg::FLAGS.get(ctrl) as u8;
    let mask = wqe_umr_ctrl_seg::MKEY_MASK.get(ctrl);
    let octs = wqe_umr_ctrl_seg::XLT_OCTOWORDS.get(ctrl) as usize;
    let offset = if flags & UMR_TRANSLATION_OFFSET_EN != 0 {
        wqe_umr_ctrl_seg::XLT_OFFSET.get(ctrl) | wqe_umr_ctrl_seg::XLT_OFFSET_47_16.get(ctrl) << 16
    } else {
        0
    };
    let seg = wqe.get(SEG_AT..XLT_AT);
    if seg.is_none() && mask != 0 {
        return Err(malformed());
    }
    let old = super::rlock(&rdma.mkeys)
        .get(&(mkey >> 8))
        .cloned()
        .ok_or((CqeSyndrome::LocalProtErr, vendor::UMR_BAD_MKEY))?;
    if mask & MKEY_MASK_KEY == 0 && old.key != mkey as u8 {
        return Err((CqeSyndrome::LocalProtErr, vendor::UMR_BAD_MKEY));
    }
    if !old.umr_en {
        return Err((CqeSyndrome::LocalProtErr, vendor::UMR_NOT_ENABLED));
    }
    let check = flags & (UMR_CHECK_FREE | UMR_CHECK_NOT_FREE);
    let holds = match check {
        0 => true,
        // Linux: CHECK_FREE "fail if free", CHECK_NOT_FREE "fail if not free".
        UMR_CHECK_FREE => !old.free,
        UMR_CHECK_NOT_FREE => old.free,
        _ => return Err(malformed()),
    };
    // A memory-window bind (libmlx5 `set_bind_wr`): KLM entries written
    // into an indirect key from a user QP at a translation offset; its
    // refusals are bind errors. (mlx5dv's mkey configuration writes a
    // KLM list or repeat block without the offset: no bind checks, the
    // entries are checked on access.)
    let bind = !qp.privileged
        && octs != 0
        && old.mode == MKC_ACCESS_MODE_KLMS
        && flags & UMR_TRANSLATION_OFFSET_EN != 0;
    if !holds {
        if bind {
            return Err((CqeSyndrome::MwBindErr, vendor::BIND_QP));
        }
        return Err((CqeSyndrome::LocalProtErr, vendor::UMR_FREE_CHECK));
    }
    if flags & UMR_CHECK_QPN != 0 && !old.usable_by(qp.qpn) {
        return Err((CqeSyndrome::LocalProtErr, vendor::UMR_QPN_CHECK));
    }
    if !qp.privileged && old.pd != qp.pd {
        return Err((CqeSyndrome::LocalProtErr, vendor::UMR_PD_MISMATCH));
    }
    let mut k = (*old).clone();
    if let Some(seg) = seg {
        apply_mask(&mut k, mask, seg)?;
    }
    if !qp.privileged && k.qpn != QPN_ANY && k.qpn != qp.qpn {
        return Err((CqeSyndrome::MwBindErr, vendor::BIND_QP));
    }
    if octs != 0 {
        // Octowords: 16 bytes each.
        let bytes = octs * klm::SIZE_BYTES;
        let xlt = if flags & UMR_INLINE != 0 {
            wqe.get(XLT_AT..XLT_AT + bytes)
                .ok_or_else(malformed)?
                .to_vec()
        } else {
            read_pointed(rdma, qp, mem, wqe, bytes)?
        };
        update_translation(rdma, &mut k, offset, &xlt)?;
        if bind {
            check_bind(rdma, &k)?;
        }
    }
    tracing::debug!(
        qpn = qp.qpn,
        mkey = format_args!("{:#x}", k.mkey()),
        mask = format_args!("{mask:#x}"),
        octs,
        offset,
        free = k.free,
        "UMR"
    );
    let mut t = wlock(&rdma.mkeys);
    // The key may have gone (DESTROY_MKEY) since it was looked up.
    match t.get_mut(&k.index) {
        Some(slot) if Arc::ptr_eq(slot, &old) => *slot = Arc::new(k),
        _ => return Err((CqeSyndrome::LocalProtErr, vendor::UMR_BAD_MKEY)),
    }
    Ok(())
}

/// The mkey context fields the mask selects, taken from the segment.
fn apply_mask(k: &mut Mkey, mask: u64, seg: &[u8]) -> Result<(), Refusal> {
    if mask & MKEY_MASK_FREE != 0 {
        k.free = mkc::FREE.get(seg) != 0;
    }
    if mask & MKEY_MASK_KEY != 0 {
        k.key = mkc::MKEY_7_0.get(seg) as u8;
    }
    if mask & MKEY_MASK_QPN != 0 {
        k.qpn = mkc::QPN.get(seg) as u32;
    }
    if mask & MKEY_MASK_EN_RINVAL != 0 {
        k.en_rinval = mkc::EN_RINVAL.get(seg) != 0;
    }
    if mask & mlx5_hw::wqe::MKEY_MASK_RELAXED_ORDERING_WRITE != 0 {
        k.relaxed.0 = mkc::RELAXED_ORDERING_WRITE.get(seg) != 0;
    }
    if mask & mlx5_hw::wqe::MKEY_MASK_RELAXED_ORDERING_READ != 0 {
        k.relaxed.1 = mkc::RELAXED_ORDERING_READ.get(seg) != 0;
    }
    if mask & MKEY_MASK_PD != 0 {
        k.pd = mkc::PD.get(seg) as u32;
    }
    if mask & MKEY_MASK_START_ADDR != 0 {
        k.start = mkc::START_ADDR.get(seg);
    }
    if mask & MKEY_MASK_LEN != 0 {
        k.len = if mkc::LENGTH64.get(seg) != 0 {
            u64::MAX
        } else {
            mkc::LEN.get(seg)
        };
    }
    if mask & (MKEY_MASK_PAGE_SIZE | MKEY_MASK_PAGE_SIZE_5) != 0 {
        let log = mkc::LOG_PAGE_SIZE.get(seg) as u32;
        // The sixth bit of the page size only with its own mask bit.
        let wide = mask & MKEY_MASK_PAGE_SIZE_5 != 0;
        if matches!(k.mode, MKC_ACCESS_MODE_MTT | MKC_ACCESS_MODE_KSM)
            && !(MKC_MIN_LOG_PAGE_SIZE..=mkc_max_log_page_size(wide)).contains(&log)
        {
            return Err((CqeSyndrome::LocalQpOpErr, vendor::UMR_BAD_FIELD));
        }
        k.log_page = log;
    }
    for (m, f, b) in [
        (MKEY_MASK_LR, mkc::LR, access::LR),
        (MKEY_MASK_LW, mkc::LW, access::LW),
        (MKEY_MASK_RR, mkc::RR, access::RR),
        (MKEY_MASK_RW, mkc::RW, access::RW),
        (MKEY_MASK_A, mkc::A, access::A),
    ] {
        if mask & m != 0 {
            k.access = if f.get(seg) != 0 {
                k.access | b
            } else {
                k.access & !b
            };
        }
    }
    Ok(())
}

/// The checks of a memory-window bind (IBA 10.6.7.2, bind errors): every
/// entry names a live region (not a free key) of the window's PD, the
/// window stays inside it, and remote write or atomic rights need the
/// region's local write.
fn check_bind(rdma: &Rdma, k: &Mkey) -> Result<(), Refusal> {
    let err = |v| (CqeSyndrome::MwBindErr, v);
    let Some(ind) = &k.klm else {
        return Ok(());
    };
    for e in &ind.entries {
        let t = rdma
            .mkey(e.key)
            .filter(|t| !t.free)
            .ok_or(err(vendor::BIND_BAD_MR))?;
        if t.pd != k.pd {
            return Err(err(vendor::BIND_PD));
        }
        let end = e.va.checked_add(e.bcount);
        let t_end = t.start.saturating_add(t.len);
        if e.va < t.start || end.is_none_or(|end| end > t_end) {
            return Err(err(vendor::BIND_RANGE));
        }
        if k.access & (access::RW | access::A) != 0 && t.access & access::LW == 0 {
            return Err(err(vendor::BIND_ACCESS));
        }
    }
    Ok(())
}

/// The translation a UMR's data segment points at (`bytes` of it),
/// through that segment's key (the reserved lkey: IOVAs as they are).
fn read_pointed(
    rdma: &Rdma,
    qp: Poster,
    mem: &IovaMemory,
    wqe: &[u8],
    bytes: usize,
) -> Result<Vec<u8>, Refusal> {
    let d = wqe
        .get(XLT_AT..XLT_AT + wqe_data_seg::SIZE_BYTES)
        .and_then(|b| WqeDataSeg::read_from_bytes(b).ok())
        .ok_or_else(malformed)?;
    let (key, addr) = (d.lkey.get(), d.addr.get());
    let mut ext = Vec::new();
    if key == rdma.resd_lkey {
        mem::push(&mut ext, addr, bytes as u64);
    } else {
        let k = rdma
            .mkey(key)
            .ok_or((CqeSyndrome::LocalProtErr, vendor::UMR_XLT_KEY))?;
        // A UMR QP has no PD (fw/qp.rs): Linux points it at the
        // translation through its UMR PD's DMA key (`local_dma_lkey`, a PA
        // key, mlx5 having no reserved one), any PD's key being usable.
        let pd = if qp.privileged { k.pd } else { qp.pd };
        k.resolve(pd, access::LR, addr, bytes as u64, &mut ext)
            .map_err(|_| (CqeSyndrome::LocalProtErr, vendor::UMR_XLT_KEY))?;
    }
    let mut out = vec![0u8; bytes];
    mem::read_bytes(mem, &ext, 0, &mut out).map_err(|_| {
        (
            CqeSyndrome::LocalProtErr,
            super::requester::vendor::DMA_FAULT,
        )
    })?;
    Ok(out)
}

/// Writes the translation entries `xlt` at translation offset `offset`
/// (in octowords, [`UMR_OCTOWORD`]) of the key: 8 bytes per MTT entry (the
/// page address and, in bits 1:0, `wr_en` and `rd_en`: an entry without
/// them is not present; entry `2 * offset` first), 16 per KLM or KSM
/// (entry `offset` first; a KSM entry keeps its place: entry `i` covers
/// the `i`-th 2^log_page_size bytes).
fn update_translation(rdma: &Rdma, k: &mut Mkey, offset: u64, xlt: &[u8]) -> Result<(), Refusal> {
    let range = (CqeSyndrome::LocalQpOpErr, vendor::UMR_XLT_RANGE);
    let entry_bytes = if k.mode == MKC_ACCESS_MODE_MTT {
        MTT_ENTRY_BYTES
    } else {
        klm::SIZE_BYTES as u64
    };
    let off = offset
        .checked_mul(UMR_OCTOWORD / entry_bytes)
        .and_then(|o| usize::try_from(o).ok())
        .ok_or(range)?;
    match k.mode {
        MKC_ACCESS_MODE_MTT => {
            let n = xlt.len() / 8;
            if off.checked_add(n).is_none_or(|e| e > k.xlt_max) {
                tracing::debug!(
                    off,
                    n,
                    max = k.xlt_max,
                    "UMR: MTT entries past the key's room"
                );
                return Err(range);
            }
            if k.mtt.len() < off + n {
                k.mtt.resize(off + n, 0);
            }
            for (i, e) in xlt.chunks_exact(8).enumerate() {
                let v = u64::from_be_bytes(e.try_into().unwrap_or([0; 8]));
                k.mtt[off + i] = v & !0xffc;
            }
        }
        MKC_ACCESS_MODE_KLMS if is_repeat_block(xlt) => {
            let rep = repeat_block(rdma, k, off, xlt)?;
            k.klm = Some(mem::Indirect {
                entries: Vec::new(),
                repeat: Some(rep),
                rdma: rdma.me.clone(),
            });
        }
        MKC_ACCESS_MODE_KLMS | MKC_ACCESS_MODE_KSM => {
            let n = xlt.len() / klm::SIZE_BYTES;
            if off.checked_add(n).is_none_or(|e| e > k.xlt_max) {
                return Err(range);
            }
            let ind = k.klm.get_or_insert_with(|| mem::Indirect {
                entries: Vec::new(),
                repeat: None,
                rdma: rdma.me.clone(),
            });
            ind.repeat = None;
            if k.mode == MKC_ACCESS_MODE_KSM {
                ksm_update(ind, off, xlt, k.log_page).map_err(|()| range)?;
                return Ok(());
            }
            // Entries past the last one written end the list (the
            // translation is rewritten from `off` on).
            ind.entries.truncate(off);
            if ind.entries.len() < off {
                return Err(range);
            }
            ind.entries.extend(
                xlt.chunks_exact(klm::SIZE_BYTES)
                    .map(klm_entry)
                    .filter(|e| e.key != 0),
            );
        }
        _ => return Err((CqeSyndrome::LocalQpOpErr, vendor::UMR_BAD_FIELD)),
    }
    Ok(())
}

/// Whether a KLM-mode translation is a repeat block (its header's `op`).
fn is_repeat_block(xlt: &[u8]) -> bool {
    xlt.len() >= wqe_umr_repeat_block_seg::SIZE_BYTES
        && wqe_umr_repeat_block_seg::OP.get(xlt) == u64::from(UMR_REPEAT_BLOCK_OP)
}

/// The repeat block in `xlt` (rdma-core's `umr_strided_seg_create`
/// layout): written whole, at translation offset 0, `num_ent` entries the
/// key has room for, `byte_count` their sum, at least one repetition; on
/// a device that takes them (`repeated_block_disabled` clear).
fn repeat_block(rdma: &Rdma, k: &Mkey, off: usize, xlt: &[u8]) -> Result<mem::Repeat, Refusal> {
    let bad = (CqeSyndrome::LocalQpOpErr, vendor::UMR_BAD_FIELD);
    if !rdma.umr_caps.repeat_block {
        return Err(bad);
    }
    if off != 0 {
        return Err((CqeSyndrome::LocalQpOpErr, vendor::UMR_XLT_RANGE));
    }
    let n = wqe_umr_repeat_block_seg::NUM_ENT.get(xlt) as usize;
    if n > k.xlt_max {
        return Err((CqeSyndrome::LocalQpOpErr, vendor::UMR_XLT_RANGE));
    }
    let at = wqe_umr_repeat_block_seg::SIZE_BYTES;
    let ents_bytes = xlt.get(at..at + n * wqe_umr_repeat_ent_seg::SIZE_BYTES);
    let ents: Vec<mem::RepeatEnt> = ents_bytes
        .ok_or_else(malformed)?
        .chunks_exact(wqe_umr_repeat_ent_seg::SIZE_BYTES)
        .map(|e| mem::RepeatEnt {
            stride: wqe_umr_repeat_ent_seg::STRIDE.get(e),
            bcount: wqe_umr_repeat_ent_seg::BYTE_COUNT.get(e),
            key: wqe_umr_repeat_ent_seg::MEMKEY.get(e) as u32,
            va: wqe_umr_repeat_ent_seg::VA.get(e),
        })
        .collect();
    let block = wqe_umr_repeat_block_seg::BYTE_COUNT.get(xlt);
    let count = wqe_umr_repeat_block_seg::REPEAT_COUNT.get(xlt);
    if n == 0 || count == 0 || block != ents.iter().map(|e| e.bcount).sum::<u64>() {
        return Err(bad);
    }
    Ok(mem::Repeat { count, block, ents })
}

/// KSM entries (`struct mlx5_ksm`, 16 bytes each) written at entry `off`
/// of the key: each covers `2^log` bytes; refused when `off` leaves a hole
/// after the entries written so far.
fn ksm_update(ind: &mut mem::Indirect, off: usize, xlt: &[u8], log: u32) -> Result<(), ()> {
    if ind.entries.len() < off {
        ind.entries.resize(
            off,
            mem::Klm {
                bcount: 0,
                key: 0,
                va: 0,
            },
        );
    }
    let size = 1u64.checked_shl(log).ok_or(())?;
    for (i, e) in xlt.chunks_exact(ksm::SIZE_BYTES).enumerate() {
        let entry = mem::Klm {
            bcount: size,
            key: ksm::KEY.get(e) as u32,
            va: ksm::VA.get(e),
        };
        match ind.entries.get_mut(off + i) {
            Some(slot) => *slot = entry,
            None => ind.entries.push(entry),
        }
    }
    Ok(())
}
