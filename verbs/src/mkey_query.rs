//! QUERY_MKEY: a memory key's context as the device holds it (what
//! `mlx5dv_devx_obj_query` on an mkey gives; tests read access and
//! relaxed-ordering bits back with it).

use mlx5_hw::ifc::{klm, query_mkey_in, query_mkey_out, Mkc, QueryMkeyIn, QueryMkeyOut};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::wqe::{MKC_ACCESS_MODE_KLMS, MKC_ACCESS_MODE_KSM};

use crate::device::Ctx;
use crate::mr::Mr;
use crate::Result;

/// The fields of a memory key's context that verbs users reason about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MkeyAttr {
    /// `access_mode_4_2 << 2 | access_mode_1_0` (`MLX5_MKC_ACCESS_MODE_*`).
    pub access_mode: u8,
    /// Local read, local write, remote read, remote write, atomic (mkc
    /// `lr`, `lw`, `rr`, `rw`, `a`).
    pub lr: bool,
    /// mkc `lw`.
    pub lw: bool,
    /// mkc `rr`.
    pub rr: bool,
    /// mkc `rw`.
    pub rw: bool,
    /// mkc `a`.
    pub a: bool,
    /// mkc `relaxed_ordering_write`.
    pub relaxed_ordering_write: bool,
    /// mkc `relaxed_ordering_read`.
    pub relaxed_ordering_read: bool,
    /// mkc `free`.
    pub free: bool,
    /// Protection domain number.
    pub pd: u32,
    /// First address of the key's range.
    pub start_addr: u64,
    /// Length of the range (`u64::MAX` for `length64`).
    pub len: u64,
}

/// QUERY_MKEY of key `mkey` on the context, an outbox of `outlen` bytes.
fn exec_query_mkey(ctx: &Ctx, mkey: u32, outlen: usize) -> Result<Vec<u8>> {
    let mut inb = vec![0u8; query_mkey_in::SIZE_BYTES];
    QueryMkeyIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::QueryMkey.to_raw())
        .set_mkey_index(mkey >> 8);
    ctx.hca.cmd().exec(&inb, outlen)
}

/// QUERY_MKEY of key `mkey` on the context.
pub(crate) fn query_mkey(ctx: &Ctx, mkey: u32) -> Result<MkeyAttr> {
    let out = exec_query_mkey(ctx, mkey, query_mkey_out::SIZE_BYTES)?;
    let o = QueryMkeyOut::new_unchecked(&out[..]);
    let k: Mkc<&[u8]> = o.memory_key_mkey_entry();
    Ok(MkeyAttr {
        access_mode: k.access_mode_4_2() << 2 | k.access_mode_1_0(),
        lr: k.lr(),
        lw: k.lw(),
        rr: k.rr(),
        rw: k.rw(),
        a: k.a(),
        relaxed_ordering_write: k.relaxed_ordering_write(),
        relaxed_ordering_read: k.relaxed_ordering_read(),
        free: k.free(),
        pd: k.pd(),
        start_addr: k.start_addr(),
        len: if k.length64() { u64::MAX } else { k.len() },
    })
}

/// One entry of an indirect key's translation: `bcount` bytes of the
/// key's range (KSM: each entry covers the key's page) onto `[va, ...)` of
/// `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndirectEntry {
    pub bcount: u64,
    pub key: u32,
    pub va: u64,
}

/// An indirect (KLM or KSM) key's translation as the device holds it:
/// the first address of its range and its entries in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndirectList {
    pub start_addr: u64,
    pub entries: Vec<IndirectEntry>,
}

/// QUERY_MKEY of `mkey` with room for its translation list, as Linux's
/// page-fault handler reads a DevX indirect key (`query_mkey_out` then one
/// KLM per entry, from `bsf0_klm0_pas_mtt0_1`); `None` for a key that is
/// not KLM or KSM. A KSM entry covers `1 << log_page_size` bytes.
pub(crate) fn query_indirect(ctx: &Ctx, mkey: u32) -> Result<Option<IndirectList>> {
    let out = exec_query_mkey(ctx, mkey, query_mkey_out::SIZE_BYTES)?;
    let o = QueryMkeyOut::new_unchecked(&out[..]);
    let k: Mkc<&[u8]> = o.memory_key_mkey_entry();
    let mode = k.access_mode_4_2() << 2 | k.access_mode_1_0();
    if mode != MKC_ACCESS_MODE_KLMS && mode != MKC_ACCESS_MODE_KSM {
        return Ok(None);
    }
    let (start_addr, log_page) = (k.start_addr(), k.log_page_size());
    // One entry per octoword; bounded, so that a key claiming a huge list
    // cannot make the driver allocate without limit.
    let n = (k.translations_octword_size() as usize).min(1 << 16);
    let at = query_mkey_out::BSF0_KLM0_PAS_MTT0_1.off / 8;
    let outlen = (at + n * klm::SIZE_BYTES).max(query_mkey_out::SIZE_BYTES);
    let out = exec_query_mkey(ctx, mkey, outlen)?;
    let entries = out
        .get(at..)
        .unwrap_or_default()
        .chunks_exact(klm::SIZE_BYTES)
        .take(n)
        .map(|e| IndirectEntry {
            bcount: if mode == MKC_ACCESS_MODE_KSM {
                1u64.checked_shl(u32::from(log_page)).unwrap_or(0)
            } else {
                klm::BCOUNT.get(e)
            },
            key: klm::KEY.get(e) as u32,
            va: klm::VA.get(e),
        })
        .collect();
    Ok(Some(IndirectList {
        start_addr,
        entries,
    }))
}

impl Mr {
    /// QUERY_MKEY of this region's key: its context as the device holds it.
    pub fn query_mkey(&self) -> Result<MkeyAttr> {
        query_mkey(&self.inner.pd.ctx, self.inner.mkey)
    }
}
