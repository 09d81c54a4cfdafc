//! Scatter to CQE (inline receive): small received SENDs land in their
//! CQE rather than the receive buffer, and the poller copies them out.
//!
//! What it follows:
//! - which QPs ask (mlx5_ib `create_qp_common`, Linux 6.12 `qp.c`): RC and
//!   UC QPs set qpc `cs_res` when the user allows scatter to CQE
//!   (`MLX5_QP_FLAG_SCATTER_CQE`, which libmlx5 sets unless
//!   `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` or `MLX5_SCATTER_TO_CQE=0`),
//!   `RES_SCAT_DATA64_CQE` when the receive CQ has 128-byte CQEs, else
//!   `RES_SCAT_DATA32_CQE`, with or without an SRQ (Linux sets it for
//!   both; libmlx5's `mlx5_copy_to_recv_srq` copies into the SRQ's WQE);
//! - where the bytes are (rdma-core `providers/mlx5/cq.c`,
//!   `handle_responder`): CQE format 1 (`MLX5_INLINE_SCATTER_32`) in the
//!   first 32 bytes of the 64-byte CQE, format 2 (`MLX5_INLINE_SCATTER_64`)
//!   in the 64 bytes before it, the first half of a 128-byte entry;
//! - the copy (`mlx5_copy_to_recv_wqe`): into the receive WQE's data
//!   segments in order, read back from the ring, up to a segment with
//!   `MLX5_INVALID_LKEY` (for an SRQ, the data segments after the WQE's
//!   next segment); more bytes than the segments hold is
//!   `IBV_WC_LOC_LEN_ERR`. [`crate::cq::Cq::poll_inline`] hands the bytes
//!   out in place instead and leaves the receive buffer alone.
//!
//! - a DC target (mlx5_ib `create_dct`): `dctc.cs_res` is
//!   `RES_SCAT_DATA64_CQE` when its CQ has 128-byte CQEs and scatter to
//!   CQE is allowed, else nothing (Linux 6.12 sets no DATA32 for a DCT);
//!   its receives come from an SRQ, copied as for an RC QP's.
//!
//! - the requester side (mlx5_ib `configure_requester_scat_cqe`): RC QPs
//!   whose sends are all signaled, or created with
//!   `MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE`, set qpc `cs_req`
//!   (`REQ_SCAT_DATA64_CQE` when the send CQ has 128-byte CQEs, else
//!   `REQ_SCAT_DATA32_CQE`): READ responses and atomic results that fit
//!   come in the CQE, and the poller copies them into the send WQE's data
//!   segments, read back from the send queue (`mlx5_copy_to_send_wqe`:
//!   after the control and remote-address segments, and the atomic
//!   segment for atomics, as many as the control segment's DS count
//!   says, wrapping at the queue's end).
#![allow(unsafe_code)] // The copy into the receive buffer: memory the posted SGE names.

use mlx5_hw::cqe::{CQE_FORMAT_INLINE_DATA32_SEG, CQE_FORMAT_INLINE_DATA64_SEG};
use mlx5_hw::wqe::TERMINATE_SCATTER_LIST_LKEY;
use vfio::DmaRing;

use crate::cq::WcStatus;
use crate::qp::QpType;
use crate::wqe::DATA_SIZE;

/// `mlx5dv_qp_create_flags` that concern scatter to CQE (rdma-core's
/// values).
pub mod dv_flags {
    /// `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE`: received data always goes
    /// to the receive buffer.
    pub const DISABLE_SCATTER_TO_CQE: u32 = 1 << 3;
    /// `MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE`: allow it on the requester
    /// even when not every send is signaled (the device scatters only
    /// the responses of signaled WQEs).
    pub const ALLOW_SCATTER_TO_CQE: u32 = 1 << 4;
}

/// What a QP's creation says about scatter to CQE.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CsAsk {
    pub(crate) qp_type: QpType,
    /// The QPC's transport service: a DCI (`QPC_ST_DCI`, created as an RC
    /// QP here) asks for neither (its WQEs carry an address vector that
    /// `mlx5_copy_to_send_wqe` does not skip; libmlx5 refuses it too).
    pub(crate) st: u8,
    /// Bytes per CQE of the send CQ and of the receive CQ.
    pub(crate) scqe_bytes: usize,
    pub(crate) rcqe_bytes: usize,
    pub(crate) sq_sig_all: bool,
    /// `mlx5dv_qp_create_flags` ([`dv_flags`]).
    pub(crate) flags: u32,
}

/// The `(cs_req, cs_res)` a QP asks for, as mlx5_ib sets them.
pub(crate) fn qpc_cs(a: CsAsk) -> (u8, u8) {
    use mlx5_hw::qp::{
        REQ_SCAT_DATA32_CQE, REQ_SCAT_DATA64_CQE, RES_SCAT_DATA32_CQE, RES_SCAT_DATA64_CQE,
    };
    if a.flags & dv_flags::DISABLE_SCATTER_TO_CQE != 0
        || !matches!(a.qp_type, QpType::Rc | QpType::Uc)
        || a.st == mlx5_hw::qp::QPC_ST_DCI
    {
        return (0, 0);
    }
    let req = match (
        a.qp_type,
        a.sq_sig_all || a.flags & dv_flags::ALLOW_SCATTER_TO_CQE != 0,
    ) {
        (QpType::Rc, true) if a.scqe_bytes == 128 => REQ_SCAT_DATA64_CQE,
        (QpType::Rc, true) => REQ_SCAT_DATA32_CQE,
        _ => 0,
    };
    let res = match a.rcqe_bytes {
        128 => RES_SCAT_DATA64_CQE,
        _ => RES_SCAT_DATA32_CQE,
    };
    (req, res)
}

/// The `dctc.cs_res` a DCT asks for, as mlx5_ib's `create_dct` sets it:
/// 64 bytes in a 128-byte CQE, nothing in a 64-byte one.
pub(crate) fn dctc_cs_res(rcqe_bytes: usize, flags: u32) -> u8 {
    if flags & dv_flags::DISABLE_SCATTER_TO_CQE == 0 && rcqe_bytes == 128 {
        mlx5_hw::qp::RES_SCAT_DATA64_CQE
    } else {
        0
    }
}

/// A QP's send queue as the poller reads it back, in 16-byte segments
/// (a view of the same memory the [`crate::wqe::SendRing`] writes).
#[derive(Debug)]
pub(crate) struct SendView {
    pub(crate) segs: DmaRing<DATA_SIZE>,
    /// Segments per basic block, as a shift (64-byte blocks: 2).
    pub(crate) log_per_bb: u32,
}

impl SendView {
    /// Copies `data` (a READ response or an atomic result that came in the
    /// CQE) into the data segments of send WQE `wqe_counter`, as libmlx5's
    /// `mlx5_copy_to_send_wqe`: success, `IBV_WC_LOC_LEN_ERR` when the
    /// segments hold less, `IBV_WC_GENERAL_ERR` for a WQE that is neither
    /// a READ nor an atomic.
    pub(crate) fn copy_to_wqe(&self, wqe_counter: u16, data: &[u8]) -> WcStatus {
        use mlx5_hw::ifc::{wqe_atomic_seg, wqe_ctrl_seg, wqe_raddr_seg};
        use mlx5_hw::wqe::{WqeOpcode, WQE_CTRL_DS_MASK, WQE_CTRL_OPCODE_MASK};
        let first = u32::from(wqe_counter) << self.log_per_bb;
        let Ok([opmod_idx_opcode_qpn_ds, _]) = self.segs.load_words::<2>(first, 0) else {
            return WcStatus::GeneralErr;
        };
        // The control segment's first two big-endian words.
        let ctrl = u64::from_be(opmod_idx_opcode_qpn_ds);
        let opcode = ((ctrl >> 32) as u32 & WQE_CTRL_OPCODE_MASK) as u8;
        let ds = ctrl as u32 & WQE_CTRL_DS_MASK;
        // Past the control and remote-address segments, and the atomic one.
        let segs = |bytes: usize| (bytes / DATA_SIZE) as u32;
        let skip = match WqeOpcode::from_raw(opcode) {
            WqeOpcode::RdmaRead => segs(wqe_ctrl_seg::SIZE_BYTES + wqe_raddr_seg::SIZE_BYTES),
            WqeOpcode::AtomicCs | WqeOpcode::AtomicFa => segs(
                wqe_ctrl_seg::SIZE_BYTES + wqe_raddr_seg::SIZE_BYTES + wqe_atomic_seg::SIZE_BYTES,
            ),
            _ => return WcStatus::GeneralErr,
        };
        copy_to_segments(&self.segs, first, skip..ds, data)
    }
}

/// A QP's receive ring as the poller reads it back (a view of the same
/// memory the [`crate::rq::RecvRing`] writes).
#[derive(Debug)]
pub(crate) struct RecvView {
    pub(crate) segs: DmaRing<DATA_SIZE>,
    pub(crate) log_segs: u32,
    pub(crate) mask: u32,
}

/// Received bytes handed out in place ([`crate::cq::Cq::poll_inline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineRecv {
    /// The bytes (the first `len` are valid).
    pub data: [u8; 64],
    /// How many bytes came in the CQE; 0 when the completion had none
    /// (its data, if any, is in the receive buffer).
    pub len: u8,
}

impl Default for InlineRecv {
    fn default() -> Self {
        Self {
            data: [0; 64],
            len: 0,
        }
    }
}

/// The bytes a CQE of format `format` carries (`byte_len` of them, at
/// most 32 or 64) into `out`: how many, or `None` for a format without
/// data. `first`: the 64-byte CQE's bytes (format 1), `before`: the 64
/// bytes before it (format 2).
pub(crate) fn inline_bytes(
    format: u8,
    byte_len: u32,
    first: impl FnOnce() -> [u64; 8],
    before: impl FnOnce() -> [u64; 8],
    out: &mut [u8; 64],
) -> Option<usize> {
    let (words, max) = match format {
        CQE_FORMAT_INLINE_DATA32_SEG => (first(), 32),
        CQE_FORMAT_INLINE_DATA64_SEG => (before(), 64),
        _ => return None,
    };
    for (i, w) in words.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_ne_bytes());
    }
    Some((byte_len as usize).min(max))
}

impl RecvView {
    /// Copies `data` into the data segments of receive WQE `wqe_counter`,
    /// as libmlx5's `mlx5_copy_to_recv_wqe`: success, or
    /// `IBV_WC_LOC_LEN_ERR` when the segments hold less.
    pub(crate) fn copy_to_wqe(&self, wqe_counter: u16, data: &[u8]) -> WcStatus {
        let base = (u32::from(wqe_counter) & self.mask) << self.log_segs;
        copy_to_segments(&self.segs, base, 0..1u32 << self.log_segs, data)
    }
}

/// Copies `data` into the data segments `range` after entry `first` of
/// `segs` (a WQE's, read back from its ring, which it may wrap), in order,
/// up to a segment with `MLX5_INVALID_LKEY`: success, or
/// `IBV_WC_LOC_LEN_ERR` when the segments hold less (libmlx5's
/// `copy_to_scat`).
pub(crate) fn copy_to_segments(
    segs: &DmaRing<DATA_SIZE>,
    first: u32,
    range: std::ops::Range<u32>,
    data: &[u8],
) -> WcStatus {
    let mut left = data;
    for i in range {
        if left.is_empty() {
            break;
        }
        let Ok([bc_lkey, addr]) = segs.load_words::<2>(first.wrapping_add(i), 0) else {
            break;
        };
        let bc_lkey = u64::from_be(bc_lkey);
        if bc_lkey as u32 == TERMINATE_SCATTER_LIST_LKEY {
            break;
        }
        let n = left.len().min((bc_lkey >> 32) as usize);
        let p = u64::from_be(addr) as *mut u8;
        for (j, b) in left[..n].iter().enumerate() {
            // The segment's memory is the device's too: volatile bytes.
            // SAFETY: `addr .. addr + n` lies in the segment posted for this
            // WR, memory of a live MR (`Mr::sge`) or vouched for by
            // `Sge::new_unchecked`, writable until the WR completes (now).
            unsafe { p.wrapping_add(j).write_volatile(*b) };
        }
        left = &left[n..];
    }
    if left.is_empty() {
        WcStatus::Success
    } else {
        WcStatus::LocLenErr
    }
}

impl crate::pd::Pd {
    /// `mlx5dv_create_qp` with `create_flags` ([`dv_flags`]):
    /// `DISABLE_SCATTER_TO_CQE` keeps every received byte in the receive
    /// buffer. An RC QP's send WQEs have room for a memory-window bind
    /// or a UMR of a few entries (`crate::mkey`), as libmlx5 makes them.
    pub fn create_qp_dv(
        &self,
        attr: &crate::qp::QpInitAttr<'_>,
        create_flags: u32,
    ) -> crate::Result<crate::qp::Qp> {
        if create_flags & !(dv_flags::DISABLE_SCATTER_TO_CQE | dv_flags::ALLOW_SCATTER_TO_CQE) != 0
        {
            return Err(crate::Error::Invalid("unsupported mlx5dv QP create flags"));
        }
        if create_flags & dv_flags::DISABLE_SCATTER_TO_CQE != 0
            && create_flags & dv_flags::ALLOW_SCATTER_TO_CQE != 0
        {
            // libmlx5 refuses both at once (EINVAL).
            return Err(crate::Error::Invalid(
                "DISABLE and ALLOW_SCATTER_TO_CQE together",
            ));
        }
        // RC send WQEs with room for a bind (or a small UMR), as libmlx5
        // sizes an RC QP (`_sq_overhead`'s bind/UMR size).
        crate::qp::Qp::create_tuned(
            &self.inner,
            attr,
            attr.qp_type.st(),
            create_flags,
            true,
            |_| {},
        )
    }

    /// [`create_qp`](crate::pd::Pd::create_qp) whose RC send WQEs have
    /// room for a memory-window bind (`ibv_bind_mw`, BIND_MW work
    /// requests), as mlx5_ib and libmlx5 size every RC QP; the C library
    /// makes its RC QPs so. Other transports as `create_qp`.
    pub fn create_qp_for_mw(
        &self,
        attr: &crate::qp::QpInitAttr<'_>,
    ) -> crate::Result<crate::qp::Qp> {
        crate::qp::Qp::create_tuned(&self.inner, attr, attr.qp_type.st(), 0, true, |_| {})
    }
}
