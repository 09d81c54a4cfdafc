//! Indirect memory keys in the shape of mlx5dv (`mlx5dv_create_mkey`,
//! `mlx5dv_wr_mkey_configure` and its setters, `mlx5dv_wr_mr_list`,
//! `mlx5dv_wr_mr_interleaved`).
//!
//! [`Pd::create_mkey`] makes a free KLM-mode key by CREATE_MKEY as
//! rdma-core's `mlx5dv_create_mkey` does (`umr_en`, local read, `qpn`
//! none, key byte 0, room for `max_entries` rounded up to 4 entries,
//! `en_rinval` on request). Its layout and rights are then set by a UMR
//! WQE posted in a [`WrBatch`]: [`WrBatch::mkey_configure`] opens it (the
//! UMR control segment with inline translation, the mask's free and key
//! bits; the WQE carries the initiator small fence, as libmlx5's
//! `fm_cache`), then as many setters as it was told:
//! [`WrBatch::set_mkey_access_flags`] (local write, remote read / write /
//! atomic; local read stays), [`WrBatch::set_mkey_layout_list`] (a KLM
//! entry per SGE, PRM "UMR: KLM") or [`WrBatch::set_mkey_layout_interleaved`]
//! (a repeat block, `struct mlx5_wqe_umr_repeat_block_seg` and its
//! entries). The key is zero-based: byte `o` of it is the layout's byte
//! `o`; its length is the layout's (set at post, as libmlx5 records it).
//! The WQE completes like any other, with `IBV_WC_DRIVER1`
//! ([`crate::cq::WcOpcode::Umr`]); the device refuses a bad one with an
//! error CQE, and checks the entries on every access through the key.
//!
//! What the driver refuses before the device sees it is libmlx5's: no
//! `IBV_SEND_INLINE` (EOPNOTSUPP: [`PostError::BadOp`]), a setter without
//! a configuration, one given twice or access flags beyond the four
//! (EINVAL: [`PostError::BadMkeyWr`]), more entries than the key has room
//! for or the QP's inline size allows (ENOMEM: [`PostError::TooLarge`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use mlx5_hw::ifc::{
    create_mkey_out, mkc, mkey_seg, wqe_data_seg, wqe_umr_ctrl_seg, wqe_umr_repeat_block_seg as rb,
    wqe_umr_repeat_ent_seg as re, CreateMkeyIn, CreateMkeyOut,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::wqe as w;

use crate::cq::WcOpcode;
use crate::mr::{access, Sge, MKC_QPN_NONE};
use crate::pd::{Pd, PdInner};
use crate::wqe::CTRL_SIZE;
use crate::wr::{send_flags, PostError, WrBatch};
use crate::{Error, Result};

/// `enum mlx5dv_mkey_init_attr_flags`, with rdma-core's values.
pub mod mkey_init_flags {
    /// MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT: a KLM-mode key.
    pub const INDIRECT: u32 = 1;
    /// MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE (not supported here).
    pub const BLOCK_SIGNATURE: u32 = 1 << 1;
    /// MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO (not supported here).
    pub const CRYPTO: u32 = 1 << 2;
    /// MLX5DV_MKEY_INIT_ATTR_FLAGS_UPDATE_TAG (not supported here).
    pub const UPDATE_TAG: u32 = 1 << 3;
    /// MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE: `mkc.en_rinval`.
    pub const REMOTE_INVALIDATE: u32 = 1 << 4;
}

/// `struct mlx5dv_mkey_init_attr` (the PD is the one `create_mkey` is
/// called on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MkeyInitAttr {
    /// [`mkey_init_flags`]; INDIRECT is required.
    pub create_flags: u32,
    /// Entries asked for; set to the room made (a multiple of 4).
    pub max_entries: u16,
}

/// `struct mlx5dv_mkey_conf_attr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MkeyConfAttr {
    /// `enum mlx5dv_mkey_conf_flags` (RESET_SIG_ATTR needs a signature
    /// key: refused).
    pub conf_flags: u32,
    /// Must be 0.
    pub comp_mask: u64,
}

/// `struct mlx5dv_mr_interleaved`: `bytes_count` bytes of `lkey` at
/// `addr`, then `bytes_skip` skipped, per repetition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInterleaved {
    /// First address, in the key's addresses.
    pub addr: u64,
    /// Bytes taken per repetition.
    pub bytes_count: u32,
    /// Bytes skipped after them.
    pub bytes_skip: u32,
    /// The key.
    pub lkey: u32,
}

/// An indirect mkey (`struct mlx5dv_mkey`).
#[derive(Debug)]
pub struct DvMkey {
    pd: Arc<PdInner>,
    shared: Arc<MkeyShared>,
    /// DESTROY_MKEY was sent ([`destroy`](Self::destroy)): the drop
    /// sends nothing.
    destroyed: bool,
}

/// What a posted configuration records of the key.
#[derive(Debug)]
pub(crate) struct MkeyShared {
    lkey: u32,
    max_entries: u16,
    length: AtomicU64,
    access: AtomicU32,
}

impl Pd {
    /// `mlx5dv_create_mkey`: CREATE_MKEY of a free, UMR-enabled KLM key
    /// with room for `attr.max_entries` rounded up to 4 (written back).
    pub fn create_mkey(&self, attr: &mut MkeyInitAttr) -> Result<DvMkey> {
        use mkey_init_flags::*;
        let f = attr.create_flags;
        if f & INDIRECT == 0 || f & !(INDIRECT | REMOTE_INVALIDATE) != 0 {
            return Err(Error::NotSupported(
                "mkey create flags (INDIRECT, REMOTE_INVALIDATE only)",
            ));
        }
        let num = attr.max_entries.max(1).next_multiple_of(4);
        let mut inb = vec![0u8; mlx5_hw::ifc::create_mkey_in::SIZE_BYTES];
        {
            let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateMkey.to_raw());
            c.memory_key_mkey_entry_mut()
                .set_access_mode_1_0(w::MKC_ACCESS_MODE_KLMS)
                .set_free(true)
                .set_umr_en(true)
                .set_pd(self.inner.pdn)
                .set_translations_octword_size(u32::from(num))
                .set_lr(true)
                .set_qpn(MKC_QPN_NONE)
                .set_en_rinval(f & REMOTE_INVALIDATE != 0);
        }
        let out = self
            .inner
            .ctx
            .hca
            .cmd()
            .exec(&inb, create_mkey_out::SIZE_BYTES)?;
        let index = CreateMkeyOut::new_unchecked(&out[..]).mkey_index();
        attr.max_entries = num;
        Ok(DvMkey {
            pd: self.inner.clone(),
            shared: Arc::new(MkeyShared {
                lkey: index << 8,
                max_entries: num,
                length: AtomicU64::new(0),
                access: AtomicU32::new(0),
            }),
            destroyed: false,
        })
    }
}

impl DvMkey {
    /// The local key.
    pub fn lkey(&self) -> u32 {
        self.shared.lkey
    }

    /// The remote key (the same).
    pub fn rkey(&self) -> u32 {
        self.shared.lkey
    }

    /// The entries the key has room for.
    pub fn max_entries(&self) -> u16 {
        self.shared.max_entries
    }

    /// The length of the layout last posted for it (0 before any).
    pub fn length(&self) -> u64 {
        self.shared.length.load(Ordering::Acquire)
    }

    /// The access flags last posted for it.
    pub fn access(&self) -> u32 {
        self.shared.access.load(Ordering::Acquire)
    }

    /// `mlx5dv_destroy_mkey`: DESTROY_MKEY now (dropping does the same,
    /// logging a failure).
    pub fn destroy(mut self) -> Result<()> {
        // Dropped after, not forgotten: the PD's and the key's references
        // go with it (a forgotten key kept its PD busy for good).
        self.destroyed = true;
        destroy(&self.pd, self.shared.lkey)
    }
}

fn destroy(pd: &PdInner, lkey: u32) -> Result<()> {
    crate::mr::destroy_mkey(&pd.ctx, lkey)
}

impl Drop for DvMkey {
    fn drop(&mut self) {
        if self.destroyed {
            return;
        }
        if let Err(e) = destroy(&self.pd, self.shared.lkey) {
            tracing::warn!("DESTROY_MKEY of mkey {:#x}: {e}", self.shared.lkey);
        }
    }
}

/// An mkey configuration being built: the UMR control and mkey context
/// segments, the translation, and how many setters are still due.
#[derive(Debug)]
pub(crate) struct PendingMkey {
    key: Arc<MkeyShared>,
    left: u8,
    mask: u64,
    seg: [u8; mkey_seg::SIZE_BYTES],
    xlt: Vec<u8>,
    /// Bytes of translation without the padding (`xlat_size`).
    xlt_len: usize,
    length: u64,
    access: u32,
}

/// Most translation entries one UMR WQE of `qp` carries: libmlx5's bound,
/// `(max_inline_data + 4) / 16` of the granted inline room (an RC QP of
/// `Pd::create_qp_dv` or `create_qp_for_mw` is sized for a bind WQE, as
/// libmlx5 sizes one made with `MLX5DV_QP_EX_WITH_MR_*`: 60 bytes of
/// inline room with one SGE, so 4 entries), capped by what the send WQE
/// the QP is sized for holds after the control, UMR control and mkey
/// context segments.
fn qp_xlt_max(batch: &WrBatch<'_>) -> usize {
    let inline = batch.qp.cap().max_inline_data as usize;
    let room = (batch.qp.wqe_bytes as usize)
        .saturating_sub(CTRL_SIZE + wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES);
    ((inline + crate::wqe::INLINE_HDR_SIZE) / 16).min(room / 16)
}

impl WrBatch<'_> {
    fn refuse(&mut self, e: PostError) -> &mut Self {
        if self.err.is_none() {
            self.err = Some(e);
        }
        self.mkey = None;
        self
    }

    /// `mlx5dv_wr_mkey_configure`: opens the UMR WQE of `mkey`; the next
    /// `num_setters` setters complete it (0: posted now, no change but
    /// the key made valid). Needs `IBV_SEND_INLINE` in the WR's flags.
    pub fn mkey_configure(
        &mut self,
        mkey: &DvMkey,
        num_setters: u8,
        attr: &MkeyConfAttr,
    ) -> &mut Self {
        if self.mkey.is_some() {
            return self.refuse(PostError::BadMkeyWr("mkey configuration missing setters"));
        }
        if self.err.is_some() {
            return self;
        }
        if self.flags & send_flags::INLINE == 0 || attr.conf_flags != 0 || attr.comp_mask != 0 {
            return self.refuse(PostError::BadOp);
        }
        if self.qp.qp_type() != crate::qp::QpType::Rc {
            return self.refuse(PostError::BadOp);
        }
        let mut seg = [0u8; mkey_seg::SIZE_BYTES];
        // qpn none, key byte as created (0): `0xffffff00 | key`.
        mkc::QPN.set(&mut seg, u64::from(MKC_QPN_NONE));
        mkc::MKEY_7_0.set(&mut seg, u64::from(mkey.shared.lkey & 0xff));
        self.mkey = Some(Box::new(PendingMkey {
            key: mkey.shared.clone(),
            left: num_setters,
            mask: w::MKEY_MASK_FREE | w::MKEY_MASK_KEY,
            seg,
            xlt: Vec::new(),
            xlt_len: 0,
            length: mkey.length(),
            access: mkey.access(),
        }));
        if num_setters == 0 {
            self.finish_mkey();
        }
        self
    }

    /// `mlx5dv_wr_set_mkey_access_flags`: local write, remote read,
    /// remote write, remote atomic (local read stays on).
    pub fn set_mkey_access_flags(&mut self, flags: u32) -> &mut Self {
        let all = access::LOCAL_WRITE
            | access::REMOTE_WRITE
            | access::REMOTE_READ
            | access::REMOTE_ATOMIC;
        let Some(p) = self.mkey.as_mut() else {
            return self.refuse(PostError::BadMkeyWr("setter without wr_mkey_configure"));
        };
        let mask = w::MKEY_MASK_LW | w::MKEY_MASK_RR | w::MKEY_MASK_RW | w::MKEY_MASK_A;
        if p.mask & mask != 0 {
            return self.refuse(PostError::BadMkeyWr("access flags set twice"));
        }
        if flags & !all != 0 {
            return self.refuse(PostError::BadMkeyWr("access flags beyond the mkey's four"));
        }
        p.mask |= mask;
        mkc::LW.set(&mut p.seg, u64::from(flags & access::LOCAL_WRITE != 0));
        mkc::RR.set(&mut p.seg, u64::from(flags & access::REMOTE_READ != 0));
        mkc::RW.set(&mut p.seg, u64::from(flags & access::REMOTE_WRITE != 0));
        mkc::A.set(&mut p.seg, u64::from(flags & access::REMOTE_ATOMIC != 0));
        p.access = flags;
        self.setter_done()
    }

    /// `mlx5dv_wr_set_mkey_layout_list`: the key is the SGEs one after
    /// the other (a KLM entry each).
    pub fn set_mkey_layout_list(&mut self, sges: &[Sge]) -> &mut Self {
        let max = qp_xlt_max(self);
        let Some(p) = self.mkey.as_mut() else {
            return self.refuse(PostError::BadMkeyWr("setter without wr_mkey_configure"));
        };
        if sges.len() > max.min(usize::from(p.key.max_entries)) {
            return self.refuse(PostError::TooLarge);
        }
        if p.xlt_len != 0 {
            return self.refuse(PostError::BadMkeyWr("layout set twice"));
        }
        let n = wqe_data_seg::SIZE_BYTES;
        let mut xlt = vec![0u8; (sges.len() * n).next_multiple_of(w::UMR_FLEX_ALIGNMENT)];
        for (e, s) in xlt.chunks_exact_mut(n).zip(sges) {
            wqe_data_seg::BYTE_COUNT.set(e, u64::from(s.length()));
            wqe_data_seg::LKEY.set(e, u64::from(s.lkey()));
            wqe_data_seg::ADDR.set(e, s.addr());
        }
        let len = sges.iter().map(|s| u64::from(s.length())).sum();
        p.set_layout(xlt, sges.len() * n, len);
        self.setter_done()
    }

    /// `mlx5dv_wr_set_mkey_layout_interleaved`: `repeat_count` repetitions
    /// of the entries' pieces (a repeat block).
    pub fn set_mkey_layout_interleaved(
        &mut self,
        repeat_count: u32,
        data: &[MrInterleaved],
    ) -> &mut Self {
        let max = qp_xlt_max(self).saturating_sub(1);
        let Some(p) = self.mkey.as_mut() else {
            return self.refuse(PostError::BadMkeyWr("setter without wr_mkey_configure"));
        };
        if data.len() > max.min(usize::from(p.key.max_entries)) {
            return self.refuse(PostError::TooLarge);
        }
        if p.xlt_len != 0 {
            return self.refuse(PostError::BadMkeyWr("layout set twice"));
        }
        let (h, n) = (rb::SIZE_BYTES, re::SIZE_BYTES);
        let used = h + data.len() * n;
        let mut xlt = vec![0u8; used.next_multiple_of(w::UMR_FLEX_ALIGNMENT)];
        let mut block = 0u64;
        for (e, d) in xlt[h..].chunks_exact_mut(n).zip(data) {
            // Pieces of 16-bit sizes, as the entry's fields (libmlx5
            // truncates the same way).
            re::STRIDE.set(e, u64::from(d.bytes_count + d.bytes_skip) & 0xffff);
            re::BYTE_COUNT.set(e, u64::from(d.bytes_count) & 0xffff);
            re::MEMKEY.set(e, u64::from(d.lkey));
            re::VA.set(e, d.addr);
            block += u64::from(d.bytes_count);
        }
        rb::BYTE_COUNT.set(&mut xlt, block);
        rb::OP.set(&mut xlt, u64::from(w::UMR_REPEAT_BLOCK_OP));
        rb::REPEAT_COUNT.set(&mut xlt, u64::from(repeat_count));
        rb::NUM_ENT.set(&mut xlt, data.len() as u64);
        p.set_layout(xlt, used, block * u64::from(repeat_count));
        self.setter_done()
    }

    /// `mlx5dv_wr_mr_list`: configure, access flags, KLM list.
    pub fn mr_list(&mut self, mkey: &DvMkey, access_flags: u32, sges: &[Sge]) -> &mut Self {
        self.mkey_configure(mkey, 2, &MkeyConfAttr::default())
            .set_mkey_access_flags(access_flags)
            .set_mkey_layout_list(sges)
    }

    /// `mlx5dv_wr_mr_interleaved`: configure, access flags, repeat block.
    pub fn mr_interleaved(
        &mut self,
        mkey: &DvMkey,
        access_flags: u32,
        repeat_count: u32,
        data: &[MrInterleaved],
    ) -> &mut Self {
        self.mkey_configure(mkey, 2, &MkeyConfAttr::default())
            .set_mkey_access_flags(access_flags)
            .set_mkey_layout_interleaved(repeat_count, data)
    }

    fn setter_done(&mut self) -> &mut Self {
        if let Some(p) = self.mkey.as_mut() {
            p.left = p.left.saturating_sub(1);
            if p.left == 0 {
                self.finish_mkey();
            }
        }
        self
    }

    /// Writes the UMR WQE of the configuration (`umr_wqe_finalize`) and
    /// records the key's new length and access.
    fn finish_mkey(&mut self) {
        let Some(p) = self.mkey.take() else {
            return;
        };
        let mut wqe = vec![0u8; CTRL_SIZE + wqe_umr_ctrl_seg::SIZE_BYTES];
        {
            let c = &mut wqe[CTRL_SIZE..];
            wqe_umr_ctrl_seg::FLAGS.set(c, u64::from(w::UMR_INLINE));
            wqe_umr_ctrl_seg::XLT_OCTOWORDS.set(c, (p.xlt.len() / 16) as u64);
            wqe_umr_ctrl_seg::MKEY_MASK.set(c, p.mask);
        }
        wqe.extend_from_slice(&p.seg);
        wqe.extend_from_slice(&p.xlt);
        let (wr_id, flags) = (self.wr_id, self.flags);
        let sq = self.qp.send_ring();
        let pc = sq.pc();
        match sq.commit_umr(&mut wqe, p.key.lkey, flags, wr_id) {
            Ok(()) => {
                sq.set_wc_opcode(pc, WcOpcode::Umr);
                p.key.length.store(p.length, Ordering::Release);
                p.key.access.store(p.access, Ordering::Release);
            }
            Err(e) => {
                self.refuse(e);
            }
        }
    }
}

impl PendingMkey {
    /// The translation (padded to 64 bytes, `used` of it meaningful) and
    /// the key's length it gives (mkc `len`, masked in).
    fn set_layout(&mut self, xlt: Vec<u8>, used: usize, len: u64) {
        self.xlt = xlt;
        self.xlt_len = used.max(1);
        self.length = len;
        self.mask |= w::MKEY_MASK_LEN;
        mkc::LEN.set(&mut self.seg, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeat_block_and_entry_layouts_are_rdma_cores() {
        // mlx5dv.h: the header's byte_count, op, repeat_count, num_ent;
        // an entry's stride, byte_count, memkey, va.
        assert_eq!((rb::SIZE_BYTES, re::SIZE_BYTES), (16, 16));
        assert_eq!(
            (rb::OP.off, rb::REPEAT_COUNT.off, rb::NUM_ENT.off),
            (32, 64, 112)
        );
        assert_eq!(
            (re::BYTE_COUNT.off, re::MEMKEY.off, re::VA.off),
            (16, 32, 64)
        );
    }
}
