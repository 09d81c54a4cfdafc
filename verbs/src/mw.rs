//! Memory windows (`ibv_alloc_mw`, `ibv_bind_mw`, the BIND_MW and
//! LOCAL_INV work requests): a window is an indirect (KLM) mkey, created
//! free by CREATE_MKEY as Linux's `mlx5_ib_alloc_mw` does (`umr_en`, local
//! read, `qpn` none, `en_rinval` for type 2, room for 4 KLM entries), and
//! bound or invalidated by a UMR WQE as libmlx5's `set_bind_wr` builds it:
//! the UMR control segment (inline translation, translation offset, the
//! key and free bits in the mask; for type 2 the QPN bit and, on a bind,
//! CHECK_NOT_FREE, "fail if not free"; on an invalidation CHECK_QPN), the
//! mkey context segment (key byte, QPN, rights, start, length, free) and
//! one KLM entry naming the region's lkey (PRM "User-Mode Memory
//! Registration"). The device makes the bind checks (region, PD, range,
//! rights, QP) and reports a refusal as `MW_BIND_ERR`; the region's
//! `IBV_ACCESS_MW_BIND` has no mkey bit, so it is checked here.

use std::sync::Arc;

use mlx5_hw::ifc::{
    create_mkey_out, klm, mkc, mkey_seg, wqe_umr_ctrl_seg, CreateMkeyIn, CreateMkeyOut,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::wqe::{self as w, WqeOpcode};

use crate::cq::WcOpcode;
use crate::mr::{access, Mr, MKC_QPN_NONE};
use crate::pd::{Pd, PdInner};
use crate::qp::{Qp, QpType};
use crate::wqe::{SendRing, CTRL_SIZE};
use crate::wr::{Payload, PostError, SendOp, SendWr};
use crate::Result;

/// KLM entries a window is created with room for (`mlx5_ib_alloc_mw`:
/// one, rounded up to 4).
const MW_KLMS: u32 = 4;

/// `ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwType {
    /// IBV_MW_TYPE_1: bound by [`Qp::bind_mw`], PD-scoped, invalidated by
    /// a zero-length bind.
    Type1,
    /// IBV_MW_TYPE_2: bound by a BIND_MW work request, tied to that QP,
    /// invalidated by LOCAL_INV or a SEND with Invalidate.
    Type2,
}

/// A memory window (`struct ibv_mw`).
#[derive(Debug)]
pub struct Mw {
    pd: Arc<PdInner>,
    rkey: u32,
    ty: MwType,
}

/// What a bind makes the window cover (`struct ibv_mw_bind_info`); a
/// length of 0 unbinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MwBind {
    /// The region's lkey.
    pub lkey: u32,
    /// The region's access flags (`IBV_ACCESS_MW_BIND` is checked here).
    pub mr_access: u32,
    /// First address of the window, in the region's addresses.
    pub addr: u64,
    /// Length (0: unbind).
    pub length: u64,
    /// The window's rights (`IBV_ACCESS_*`, with `ZERO_BASED`).
    pub access: u32,
}

impl MwBind {
    /// A bind of `[addr, addr + length)` of `mr` with rights `access`.
    pub fn new(mr: &Mr, addr: u64, length: u64, access: u32) -> Self {
        Self {
            lkey: mr.lkey(),
            mr_access: mr.access(),
            addr,
            length,
            access,
        }
    }

    /// A zero-length bind: the window no longer grants anything.
    pub fn unbind() -> Self {
        Self {
            lkey: 0,
            mr_access: 0,
            addr: 0,
            length: 0,
            access: 0,
        }
    }
}

impl Pd {
    /// `ibv_alloc_mw`: CREATE_MKEY of a free indirect key, as
    /// `mlx5_ib_alloc_mw`.
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw> {
        let mut inb = vec![0u8; mlx5_hw::ifc::create_mkey_in::SIZE_BYTES];
        {
            let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateMkey.to_raw());
            c.memory_key_mkey_entry_mut()
                .set_free(true)
                .set_translations_octword_size(MW_KLMS)
                .set_pd(self.inner.pdn)
                .set_umr_en(true)
                .set_lr(true)
                .set_access_mode_1_0(w::MKC_ACCESS_MODE_KLMS)
                .set_en_rinval(ty == MwType::Type2)
                .set_qpn(MKC_QPN_NONE);
        }
        let out = self
            .inner
            .ctx
            .hca
            .cmd()
            .exec(&inb, create_mkey_out::SIZE_BYTES)?;
        let index = CreateMkeyOut::new_unchecked(&out[..]).mkey_index();
        Ok(Mw {
            pd: self.inner.clone(),
            rkey: index << 8,
            ty,
        })
    }
}

impl Mw {
    /// The rkey (type 1: of the last bind [`Qp::bind_mw`] posted; type 2:
    /// as allocated, the binds name their own).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The type.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// The BIND_MW work request binding this window with key `rkey`
    /// (`wr.bind_mw`; `ibv_inc_rkey(mw.rkey())` is the usual new key).
    pub fn bind_op(&self, rkey: u32, bind: MwBind) -> SendOp {
        SendOp::BindMw {
            mw_rkey: self.rkey,
            rkey,
            ty: self.ty,
            bind,
        }
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        if let Err(e) = crate::mr::destroy_mkey(&self.pd.ctx, self.rkey) {
            tracing::warn!("DESTROY_MKEY of MW {:#x}: {e}", self.rkey);
        }
    }
}

/// `ibv_inc_rkey`: the next key byte, same index.
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl Qp {
    /// `ibv_bind_mw` for a type-1 window: a BIND_MW WQE with the next key
    /// byte; the window's rkey becomes it once posted (as libmlx5), and is
    /// returned. Zero-based type-1 windows are refused (libmlx5's EINVAL).
    pub fn bind_mw(
        &mut self,
        wr_id: u64,
        mw: &mut Mw,
        bind: MwBind,
        flags: u32,
    ) -> std::result::Result<u32, PostError> {
        if mw.ty != MwType::Type1 {
            return Err(PostError::BadOp);
        }
        if bind.access & access::ZERO_BASED != 0 {
            return Err(PostError::BadBind("zero-based type-1 window"));
        }
        let rkey = inc_rkey(mw.rkey);
        let wr = SendWr {
            wr_id,
            op: mw.bind_op(rkey, bind),
            payload: Payload::Sges(&[]),
            flags,
            ud: None,
        };
        self.post_send(&[wr]).map_err(|(_, e)| e)?;
        mw.rkey = rkey;
        Ok(rkey)
    }
}

impl SendRing {
    /// The UMR WQE of a BIND_MW or LOCAL_INV work request (libmlx5
    /// `set_bind_wr`); the doorbell is left for `ring`.
    pub(crate) fn write_mw_wr(
        &mut self,
        wr: &SendWr<'_>,
        qp_type: QpType,
    ) -> std::result::Result<(), PostError> {
        if qp_type == QpType::Ud {
            return Err(PostError::BadOp);
        }
        let (imm, rkey, ty, bind) = match wr.op {
            SendOp::BindMw {
                mw_rkey,
                rkey,
                ty,
                bind,
            } => (mw_rkey, rkey, ty, bind),
            SendOp::LocalInv { rkey } => (rkey, 0, MwType::Type2, MwBind::unbind()),
            _ => return Err(PostError::BadOp),
        };
        if bind.length != 0 && bind.mr_access & access::MW_BIND == 0 {
            return Err(PostError::BadBind("the region lacks IBV_ACCESS_MW_BIND"));
        }
        // KLM entries cover at most 2 GiB (libmlx5's EOPNOTSUPP).
        if bind.length > 1 << 31 {
            return Err(PostError::BadBind("window over 2 GiB"));
        }
        let mut wqe = [0u8; CTRL_SIZE + wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES + 64];
        let n = bind_segments(&mut wqe[CTRL_SIZE..], self.qpn(), rkey, ty, &bind);
        let pc = self.pc();
        self.commit_with_ctrl(
            &mut wqe[..CTRL_SIZE + n],
            WqeOpcode::Umr,
            imm,
            wr.flags,
            wr.wr_id,
        )?;
        let wc = match wr.op {
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
            _ => WcOpcode::BindMw,
        };
        self.set_wc_opcode(pc, wc);
        Ok(())
    }
}

/// The UMR control segment, mkey context segment and (for a bind) the
/// KLM entry, padded to 64 bytes, into `seg`; their length.
fn bind_segments(seg: &mut [u8], qpn: u32, rkey: u32, ty: MwType, b: &MwBind) -> usize {
    let t2 = ty == MwType::Type2;
    let mut flags = w::UMR_TRANSLATION_OFFSET_EN | w::UMR_INLINE;
    let mut mask = w::MKEY_MASK_FREE | w::MKEY_MASK_KEY;
    if t2 {
        mask |= w::MKEY_MASK_QPN;
    }
    let (ctrl, rest) = seg.split_at_mut(wqe_umr_ctrl_seg::SIZE_BYTES);
    let (m, xlt) = rest.split_at_mut(mkey_seg::SIZE_BYTES);
    mkc::MKEY_7_0.set(m, u64::from(rkey & 0xff));
    let bound_qpn = if t2 && b.length != 0 {
        qpn
    } else {
        MKC_QPN_NONE
    };
    mkc::QPN.set(m, u64::from(bound_qpn));
    if b.length == 0 {
        if t2 {
            flags |= w::UMR_CHECK_QPN;
        }
        mkc::FREE.set(m, 1);
        wqe_umr_ctrl_seg::FLAGS.set(ctrl, u64::from(flags));
        wqe_umr_ctrl_seg::MKEY_MASK.set(ctrl, mask);
        return wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES;
    }
    if t2 {
        // libmlx5's "CHECK_FREE": the window must be free.
        flags |= w::UMR_CHECK_NOT_FREE;
    }
    mask |= w::MKEY_MASK_LEN
        | w::MKEY_MASK_START_ADDR
        | w::MKEY_MASK_LW
        | w::MKEY_MASK_RR
        | w::MKEY_MASK_RW
        | w::MKEY_MASK_A;
    mkc::LW.set(m, u64::from(b.access & access::LOCAL_WRITE != 0));
    mkc::RR.set(m, u64::from(b.access & access::REMOTE_READ != 0));
    mkc::RW.set(m, u64::from(b.access & access::REMOTE_WRITE != 0));
    mkc::A.set(m, u64::from(b.access & access::REMOTE_ATOMIC != 0));
    let start = if b.access & access::ZERO_BASED != 0 {
        0
    } else {
        b.addr
    };
    mkc::START_ADDR.set(m, start);
    mkc::LEN.set(m, b.length);
    klm::BCOUNT.set(xlt, b.length);
    klm::KEY.set(xlt, u64::from(b.lkey));
    klm::VA.set(xlt, b.addr);
    // One KLM entry, the octowords rounded to 64 bytes (`get_klm_octo`).
    wqe_umr_ctrl_seg::XLT_OCTOWORDS.set(ctrl, 4);
    wqe_umr_ctrl_seg::FLAGS.set(ctrl, u64::from(flags));
    wqe_umr_ctrl_seg::MKEY_MASK.set(ctrl, mask);
    wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES + 64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_wraps_the_key_byte_only() {
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(0x1234_5601), 0x1234_5602);
    }

    #[test]
    fn type2_bind_and_local_invalidate_segments_as_libmlx5() {
        let mut s = [0u8; 176];
        let b = MwBind {
            lkey: 0x1200,
            mr_access: access::MW_BIND | access::LOCAL_WRITE,
            addr: 0x7f00_0000_1000,
            length: 0x100,
            access: access::REMOTE_WRITE,
        };
        assert_eq!(bind_segments(&mut s, 0x55, 0x3401, MwType::Type2, &b), 176);
        let ctrl = &s[..48];
        assert_eq!(
            wqe_umr_ctrl_seg::FLAGS.get(ctrl) as u8,
            w::UMR_TRANSLATION_OFFSET_EN | w::UMR_INLINE | w::UMR_CHECK_NOT_FREE
        );
        assert_eq!(wqe_umr_ctrl_seg::XLT_OCTOWORDS.get(ctrl), 4);
        let m = &s[48..112];
        assert_eq!((mkc::QPN.get(m), mkc::MKEY_7_0.get(m)), (0x55, 1));
        assert_eq!((mkc::RW.get(m), mkc::FREE.get(m)), (1, 0));
        assert_eq!(klm::KEY.get(&s[112..]), 0x1200);
        let mut s = [0u8; 176];
        let n = bind_segments(&mut s, 0x55, 0, MwType::Type2, &MwBind::unbind());
        assert_eq!(n, 112);
        let f = wqe_umr_ctrl_seg::FLAGS.get(&s[..48]) as u8;
        assert_ne!(f & w::UMR_CHECK_QPN, 0);
        assert_eq!(mkc::FREE.get(&s[48..112]), 1);
        assert_eq!(mkc::QPN.get(&s[48..112]), u64::from(MKC_QPN_NONE));
    }
}
