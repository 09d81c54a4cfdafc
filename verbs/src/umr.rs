//! UMR work requests (`MLX5_OPCODE_UMR`): an mkey modified from a send
//! queue instead of by a firmware command, as mlx5dv posts them on an RC
//! QP and Linux's mlx5_ib on its UMR QP (`mlx5r_umr_*`). A WQE is the
//! control segment (its `imm` names the mkey), the UMR control segment
//! (check-free flags, the mkey mask) and the mkey context segment (the
//! new values of the fields the mask selects), PRM "User-Mode Memory
//! Registration". Every mkey this driver creates is UMR-enabled (`mkc.umr_en`).

use mlx5_hw::ifc::{mkc, mkey_seg, wqe_umr_ctrl_seg, Mkc};
use mlx5_hw::wqe::{self as w, WqeOpcode};

use crate::cq::WcOpcode;
use crate::mr::{access, Mr, MKC_QPN_NONE};
use crate::qp::{Qp, QpState, QpType};
use crate::wqe::CTRL_SIZE;
use crate::wr::PostError;

/// What the UMR checks of the key's state before changing it
/// (`MLX5_UMR_CHECK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UmrCheck {
    /// Nothing.
    None,
    /// The key must be free (`MLX5_UMR_CHECK_NOT_FREE`: fail if not free).
    Free,
    /// The key must be in use (`MLX5_UMR_CHECK_FREE`: fail if free).
    NotFree,
}

/// One UMR work request: which key, what to check, what to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UmrWr {
    /// The key (index and key byte).
    pub mkey: u32,
    /// The check made first.
    pub check: UmrCheck,
    /// New access rights (`mr::access` bits; local read is always on).
    pub access: Option<u32>,
    /// New protection domain number.
    pub pdn: Option<u32>,
    /// Make the key free (`Some(true)`: invalidate) or in use.
    pub free: Option<bool>,
}

impl UmrWr {
    /// A request that changes nothing of `mkey` yet.
    pub fn new(mkey: u32) -> Self {
        Self {
            mkey,
            check: UmrCheck::None,
            access: None,
            pdn: None,
            free: None,
        }
    }

    /// The UMR control and mkey context segments (after the control
    /// segment) into `wqe`; their length.
    fn write_segments(&self, wqe: &mut [u8]) -> usize {
        let flags = match self.check {
            UmrCheck::None => 0,
            UmrCheck::Free => w::UMR_CHECK_NOT_FREE,
            UmrCheck::NotFree => w::UMR_CHECK_FREE,
        };
        let mut mask = 0u64;
        let seg_at = wqe_umr_ctrl_seg::SIZE_BYTES;
        let seg = &mut wqe[seg_at..seg_at + mkey_seg::SIZE_BYTES];
        mkc::QPN.set(seg, u64::from(MKC_QPN_NONE));
        let mut m = Mkc::new_unchecked(&mut *seg);
        if let Some(a) = self.access {
            mask |= w::MKEY_MASK_LR
                | w::MKEY_MASK_LW
                | w::MKEY_MASK_RR
                | w::MKEY_MASK_RW
                | w::MKEY_MASK_A;
            m.set_lr(true)
                .set_lw(a & access::LOCAL_WRITE != 0)
                .set_rr(a & access::REMOTE_READ != 0)
                .set_rw(a & access::REMOTE_WRITE != 0)
                .set_a(a & access::REMOTE_ATOMIC != 0);
        }
        if let Some(pd) = self.pdn {
            mask |= w::MKEY_MASK_PD;
            m.set_pd(pd);
        }
        if let Some(f) = self.free {
            mask |= w::MKEY_MASK_FREE;
            m.set_free(f);
        }
        wqe_umr_ctrl_seg::FLAGS.set(&mut wqe[..], u64::from(flags));
        wqe_umr_ctrl_seg::MKEY_MASK.set(&mut wqe[..], mask);
        wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES
    }
}

impl Mr {
    /// The UMR that changes this region's access rights in place (the
    /// `IBV_REREG_MR_CHANGE_ACCESS` of `ibv_rereg_mr`, as mlx5 does it
    /// when the key is UMR-enabled), checked as registration checks them.
    pub fn rereg_access_wr(&self, new_access: u32) -> crate::Result<UmrWr> {
        if new_access & !access::SUPPORTED != 0 {
            return Err(crate::Error::Invalid("unsupported access flags"));
        }
        if new_access & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0
            && new_access & access::LOCAL_WRITE == 0
        {
            return Err(crate::Error::Invalid(
                "REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE",
            ));
        }
        Ok(UmrWr {
            check: UmrCheck::NotFree,
            access: Some(new_access),
            ..UmrWr::new(self.lkey())
        })
    }
}

impl Qp {
    /// Posts one UMR WQE (an RC QP, as mlx5dv's `wr_*` mkey operations);
    /// `flags` are `send_flags`. It completes like any WQE: a refused one
    /// with an error CQE (`LOC_PROT_ERR` for the key's state or PD,
    /// `LOC_QP_OP_ERR` for a malformed request).
    pub fn post_umr(&mut self, wr_id: u64, wr: &UmrWr, flags: u32) -> Result<(), PostError> {
        if self.device_failed() {
            return Err(PostError::DeviceFailed);
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return Err(PostError::BadState(self.state));
        }
        if self.qp_type != QpType::Rc {
            return Err(PostError::BadOp);
        }
        let mut wqe = [0u8; CTRL_SIZE + wqe_umr_ctrl_seg::SIZE_BYTES + mkey_seg::SIZE_BYTES];
        let n = wr.write_segments(&mut wqe[CTRL_SIZE..]);
        let pc = self.sq.pc();
        let r = self.sq.commit_with_ctrl(
            &mut wqe[..CTRL_SIZE + n],
            WqeOpcode::Umr,
            wr.mkey,
            flags,
            wr_id,
        );
        if r.is_ok() {
            self.sq.set_wc_opcode(pc, WcOpcode::Umr);
        }
        self.sq.ring();
        r
    }
}
