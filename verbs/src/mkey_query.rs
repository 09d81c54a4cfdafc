//! QUERY_MKEY: a memory key's context as the device holds it (what
//! `mlx5dv_devx_obj_query` on an mkey gives; tests read access and
//! relaxed-ordering bits back with it).

use mlx5_hw::ifc::{query_mkey_in, query_mkey_out, Mkc, QueryMkeyIn, QueryMkeyOut};
use mlx5_hw::opcode::Opcode;

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

/// QUERY_MKEY of key `mkey` on the context.
pub(crate) fn query_mkey(ctx: &Ctx, mkey: u32) -> Result<MkeyAttr> {
    let mut inb = vec![0u8; query_mkey_in::SIZE_BYTES];
    QueryMkeyIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::QueryMkey.to_raw())
        .set_mkey_index(mkey >> 8);
    let out = ctx.hca.cmd().exec(&inb, query_mkey_out::SIZE_BYTES)?;
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

impl Mr {
    /// QUERY_MKEY of this region's key: its context as the device holds it.
    pub fn query_mkey(&self) -> Result<MkeyAttr> {
        query_mkey(&self.inner.pd.ctx, self.inner.mkey)
    }
}
