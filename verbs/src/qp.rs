//! Queue pairs: CREATE_QP / the state-transition commands / DESTROY_QP, and
//! the data path (`ibv_create_qp`, `ibv_modify_qp`, `ibv_post_send`,
//! `ibv_post_recv`).
//!
//! One DMA buffer holds the receive queue at offset 0 and the send queue
//! after it (mlx5's layout); a separate doorbell record holds the receive
//! and send counters. Posting a send (PRM "Send Doorbell"):
//! 1. build the WQE in place: control segment (opcode, WQE index, QP
//!    number and size in 16-byte units, fence/completion/solicited bits,
//!    immediate), then remote-address, atomic, datagram, data or inline
//!    segments;
//! 2. [`dma_wmb`]: the WQE is visible before the doorbell record;
//! 3. doorbell record `snd_counter` = producer counter (in 64-byte basic
//!    blocks);
//! 4. [`wmb`]: the record is visible before the UAR write;
//! 5. the first 8 bytes of the last WQE's control segment to the UAR's
//!    BlueFlame register (alternating its two buffers), or, for a single
//!    one-block WQE, the whole WQE as a BlueFlame copy.
//!
//! Completions find their `wr_id` through the [`WqTrack`] the QP shares
//! with its CQs: the send slot's id and the counter after its WQE (so an
//! unsignaled run is freed by the next signaled completion), and the
//! receive ids in order.
//!
//! Thread safety: a [`Qp`] is `Send`; posting and modifying take
//! `&mut self` (no lock on the fast path). Share it behind a `Mutex`.
#![allow(unsafe_code)] // `post_send_unchecked`: raw SGEs the caller vouches for.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use mlx5_hw::ifc::*;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::*;
use mlx5_hw::uar::BF_BUF_SIZE;
use mlx5_hw::wqe::{self as w, WqeOpcode};
use vfio::mmio::{dma_wmb, wmb};
use vfio::{DmaBuffer, DmaRing, Mmio, MmioRing};

use crate::ah::Ah;
use crate::buf::DmaSlice;
use crate::cq::{Cq, CqShared};
use crate::dbrec::Dbrec;
use crate::device::Ctx;
use crate::mr::Sge;
use crate::pd::{Pd, PdInner};
use crate::srq::{Srq, SrqShared};
use crate::uar::Uar;
use crate::{Error, Result};

/// Most scatter/gather entries per work request.
pub const MAX_SGE: usize = 16;
/// Most inline bytes per send (fits one WQE of 16 blocks with room).
pub const MAX_INLINE: usize = 512;

/// QP transport (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// IBV_QPT_RC (2).
    Rc = 2,
    /// IBV_QPT_UC (3).
    Uc = 3,
    /// IBV_QPT_UD (4).
    Ud = 4,
}

impl QpType {
    /// qpc `st` (`MLX5_QP_ST_*`).
    fn st(self) -> u8 {
        match self {
            QpType::Rc => 0,
            QpType::Uc => 1,
            QpType::Ud => 2,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum QpState {
    /// IBV_QPS_RESET.
    Reset = 0,
    /// IBV_QPS_INIT.
    Init = 1,
    /// IBV_QPS_RTR.
    Rtr = 2,
    /// IBV_QPS_RTS.
    Rts = 3,
    /// IBV_QPS_SQD.
    Sqd = 4,
    /// IBV_QPS_SQE.
    Sqe = 5,
    /// IBV_QPS_ERR.
    Err = 6,
}

/// `IBV_QP_*` attribute-mask bits, with libibverbs' values.
pub mod attr_mask {
    /// IBV_QP_STATE.
    pub const STATE: u32 = 1;
    /// IBV_QP_CUR_STATE.
    pub const CUR_STATE: u32 = 1 << 1;
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// IBV_QP_ACCESS_FLAGS.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// IBV_QP_PKEY_INDEX.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// IBV_QP_PORT.
    pub const PORT: u32 = 1 << 5;
    /// IBV_QP_QKEY.
    pub const QKEY: u32 = 1 << 6;
    /// IBV_QP_AV.
    pub const AV: u32 = 1 << 7;
    /// IBV_QP_PATH_MTU.
    pub const PATH_MTU: u32 = 1 << 8;
    /// IBV_QP_TIMEOUT.
    pub const TIMEOUT: u32 = 1 << 9;
    /// IBV_QP_RETRY_CNT.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// IBV_QP_RNR_RETRY.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// IBV_QP_RQ_PSN.
    pub const RQ_PSN: u32 = 1 << 12;
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// IBV_QP_ALT_PATH.
    pub const ALT_PATH: u32 = 1 << 14;
    /// IBV_QP_MIN_RNR_TIMER.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// IBV_QP_SQ_PSN.
    pub const SQ_PSN: u32 = 1 << 16;
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// IBV_QP_PATH_MIG_STATE.
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// IBV_QP_CAP.
    pub const CAP: u32 = 1 << 19;
    /// IBV_QP_DEST_QPN.
    pub const DEST_QPN: u32 = 1 << 20;
}

/// `(required, optional)` attribute masks of a transition, as verbs checks
/// them (`ib_modify_qp_is_ok`); `None` if the transition does not exist.
pub fn transition_masks(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    use attr_mask::*;
    use QpState::*;
    let rcuc = matches!(t, QpType::Rc | QpType::Uc);
    Some(match (from, to) {
        (_, Reset) | (_, Err) => (0, 0),
        (Reset, Init) if rcuc => (PKEY_INDEX | PORT | ACCESS_FLAGS, 0),
        (Reset, Init) => (PKEY_INDEX | PORT | QKEY, 0),
        (Init, Init) if rcuc => (0, PKEY_INDEX | PORT | ACCESS_FLAGS),
        (Init, Init) => (0, PKEY_INDEX | PORT | QKEY),
        (Init, Rtr) => match t {
            QpType::Rc => (
                AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
            ),
            QpType::Uc => (
                AV | PATH_MTU | DEST_QPN | RQ_PSN,
                ALT_PATH | ACCESS_FLAGS | PKEY_INDEX,
            ),
            QpType::Ud => (0, PKEY_INDEX | QKEY),
        },
        (Rtr, Rts) => match t {
            QpType::Rc => (
                SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC,
                CUR_STATE | ALT_PATH | ACCESS_FLAGS | MIN_RNR_TIMER | PATH_MIG_STATE,
            ),
            QpType::Uc => (SQ_PSN, CUR_STATE | ALT_PATH | ACCESS_FLAGS | PATH_MIG_STATE),
            QpType::Ud => (SQ_PSN, CUR_STATE | QKEY),
        },
        (Rts, Rts) | (Sqd, Rts) => match t {
            QpType::Rc => (
                0,
                CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE | MIN_RNR_TIMER,
            ),
            QpType::Uc => (0, CUR_STATE | ACCESS_FLAGS | ALT_PATH | PATH_MIG_STATE),
            QpType::Ud => (0, CUR_STATE | QKEY),
        },
        (Rts, Sqd) => (0, EN_SQD_ASYNC_NOTIFY),
        (Sqe, Rts) if t != QpType::Rc => match t {
            QpType::Uc => (0, CUR_STATE | ACCESS_FLAGS),
            _ => (0, CUR_STATE | QKEY),
        },
        _ => return None,
    })
}

/// `STATE` and every attribute transition `from -> to` of a `t` QP requires:
/// the mask for a [`Qp::modify`] that sets exactly the required attributes
/// (`STATE` alone for a transition verbs does not know; `modify` refuses it).
pub fn required_mask(t: QpType, from: QpState, to: QpState) -> u32 {
    attr_mask::STATE | transition_masks(t, from, to).map_or(0, |(required, _)| required)
}

/// Capacities (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCap {
    /// Outstanding send WRs.
    pub max_send_wr: u32,
    /// Outstanding receive WRs.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send.
    pub max_inline_data: u32,
}

/// What to create (`struct ibv_qp_init_attr`).
#[derive(Debug)]
pub struct QpInitAttr<'a> {
    /// CQ for send completions.
    pub send_cq: &'a Cq,
    /// CQ for receive completions.
    pub recv_cq: &'a Cq,
    /// Shared receive queue, if any.
    pub srq: Option<&'a Srq>,
    /// Capacities.
    pub cap: QpCap,
    /// Transport.
    pub qp_type: QpType,
    /// Every send WR completes signaled.
    pub sq_sig_all: bool,
}

/// An address (`struct ibv_ah_attr` for RoCE): where the peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// Service level (Ethernet priority).
    pub sl: u8,
    /// Port (1).
    pub port_num: u8,
    /// Destination MAC; derived from a link-local GID when `None`.
    pub dmac: Option<[u8; 6]>,
}

/// Modify attributes (`struct ibv_qp_attr`, the fields that apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttr {
    /// Target state.
    pub qp_state: Option<QpState>,
    /// Current state, if asserted.
    pub cur_qp_state: Option<QpState>,
    /// Path MTU (IBV_MTU_*: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QP number.
    pub dest_qp_num: u32,
    /// `IBV_ACCESS_REMOTE_*` bits.
    pub qp_access_flags: u32,
    /// Primary path.
    pub ah_attr: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Outstanding RDMA reads/atomics as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding RDMA reads/atomics as responder.
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer (IB encoding).
    pub min_rnr_timer: u8,
    /// Port number.
    pub port_num: u8,
    /// Local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
}

/// `IBV_SEND_*` flags.
pub mod send_flags {
    /// IBV_SEND_FENCE.
    pub const FENCE: u32 = 1;
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: u32 = 1 << 1;
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: u32 = 1 << 2;
    /// IBV_SEND_INLINE.
    pub const INLINE: u32 = 1 << 3;
}

/// What a send work request does (`ibv_wr_opcode` and its fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// IBV_WR_SEND.
    Send,
    /// IBV_WR_SEND_WITH_IMM (immediate in host order).
    SendImm(u32),
    /// IBV_WR_RDMA_WRITE.
    RdmaWrite {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    RdmaWriteImm {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Immediate, host order.
        imm: u32,
    },
    /// IBV_WR_RDMA_READ.
    RdmaRead {
        /// Remote address.
        raddr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// IBV_WR_ATOMIC_CMP_AND_SWP: the old value lands in the (8-byte) SGE.
    AtomicCmpSwp {
        /// Remote address (8-byte aligned).
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Compared with the remote value.
        compare: u64,
        /// Written if equal.
        swap: u64,
    },
    /// IBV_WR_ATOMIC_FETCH_AND_ADD: the old value lands in the SGE.
    AtomicFetchAdd {
        /// Remote address (8-byte aligned).
        raddr: u64,
        /// Remote key.
        rkey: u32,
        /// Added to the remote value.
        add: u64,
    },
}

/// Where a UD send goes.
#[derive(Debug, Clone, Copy)]
pub struct UdDest<'a> {
    /// The address handle.
    pub ah: &'a Ah,
    /// Remote QP number.
    pub remote_qpn: u32,
    /// Remote Q_Key.
    pub remote_qkey: u32,
}

/// The payload of a send: gathered from MRs, or copied into the WQE.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Scatter/gather entries.
    Sges(&'a [Sge]),
    /// Inline bytes (IBV_SEND_INLINE).
    Inline(&'a [u8]),
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Payload.
    pub payload: Payload<'a>,
    /// `IBV_SEND_*` flags (INLINE is implied by [`Payload::Inline`]).
    pub flags: u32,
    /// Destination, for UD.
    pub ud: Option<UdDest<'a>>,
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the data goes.
    pub sg_list: &'a [Sge],
}

/// Why a post failed (the index of the failing WR is returned with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No room in the queue (ENOMEM).
    #[error("queue full")]
    QueueFull,
    /// The QP's state does not allow posting (EINVAL).
    #[error("QP in state {0:?}")]
    BadState(QpState),
    /// Too many SGEs, or too much inline data (EINVAL).
    #[error("too many SGEs or inline bytes")]
    TooLarge,
    /// The operation does not apply to this QP type, or lacks a UD address (EINVAL).
    #[error("operation not valid on this QP")]
    BadOp,
    /// The device failed (health) or vanished: nothing more is posted (EIO).
    #[error("the device failed")]
    DeviceFailed,
}

/// What a send WQE's completion needs: its wr_id and the producer counter
/// after it (the queue is free up to there once it completes). One slot per
/// first block, wr_id and end side by side (one cache line touched).
#[derive(Debug, Default)]
struct SqSlot {
    wrid: AtomicU64,
    end: AtomicU32,
}

impl SqSlot {
    #[inline(always)]
    fn set(&self, wrid: u64, end: u32) {
        self.wrid.store(wrid, Ordering::Relaxed);
        self.end.store(end, Ordering::Relaxed);
    }
}

/// Per-QP completion bookkeeping shared with the CQs.
#[derive(Debug)]
pub struct WqTrack {
    qpn: u32,
    sq: Arc<[SqSlot]>,
    sq_tail: AtomicU32,
    sq_mask: u32,
    rq_wrid: Box<[AtomicU64]>,
    rq_tail: AtomicU32,
    rq_mask: u32,
    srq: Option<Arc<SrqShared>>,
}

impl WqTrack {
    /// Tracking for a send queue of `sq_cnt` blocks and a receive queue of
    /// `rq_cnt` WQEs (powers of two; 0 for none).
    pub fn new(qpn: u32, sq_cnt: u32, rq_cnt: u32) -> Arc<Self> {
        Self::with_srq(qpn, sq_cnt, rq_cnt, None)
    }

    fn with_srq(qpn: u32, sq_cnt: u32, rq_cnt: u32, srq: Option<Arc<SrqShared>>) -> Arc<Self> {
        let v64 = |n: u32| (0..n.max(1)).map(|_| AtomicU64::new(0)).collect();
        Arc::new(Self {
            qpn,
            sq: (0..sq_cnt.max(1)).map(|_| SqSlot::default()).collect(),
            sq_tail: AtomicU32::new(0),
            sq_mask: sq_cnt.max(1) - 1,
            rq_wrid: v64(rq_cnt),
            rq_tail: AtomicU32::new(0),
            rq_mask: rq_cnt.max(1) - 1,
            srq,
        })
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// A send completion for WQE index `wqe_counter`: its wr_id; frees the
    /// queue up to the end of that WQE.
    #[inline(always)]
    pub fn sq_complete(&self, wqe_counter: u16) -> u64 {
        let i = (u32::from(wqe_counter) & self.sq_mask) as usize;
        let s = &self.sq[i];
        self.sq_tail
            .store(s.end.load(Ordering::Relaxed), Ordering::Release);
        s.wrid.load(Ordering::Relaxed)
    }

    /// A receive completion: its wr_id (in order, or by SRQ index).
    #[inline(always)]
    pub fn rq_complete(&self, wqe_counter: u16) -> u64 {
        if let Some(s) = &self.srq {
            return s.complete(wqe_counter);
        }
        let t = self.rq_tail.load(Ordering::Relaxed);
        self.rq_tail.store(t.wrapping_add(1), Ordering::Release);
        self.rq_wrid[(t & self.rq_mask) as usize].load(Ordering::Relaxed)
    }
}

// The fast path builds segments as words: the offsets it assumes.
const _: () = assert!(
    CTRL_OPMOD_IDX_OPCODE == 0
        && CTRL_QPN_DS == 4
        && CTRL_FM_CE_SE == 11
        && CTRL_SIZE == 16
        && RADDR == 0
        && RKEY == 8
        && RADDR_SIZE == 16
        && DATA_BYTE_COUNT == 0
        && DATA_LKEY == 4
        && DATA_ADDR == 8
);

// Control segment byte offsets, from the layout.
const CTRL_OPMOD_IDX_OPCODE: usize = wqe_ctrl_seg::OPMOD_IDX_OPCODE.off / 8;
const CTRL_QPN_DS: usize = wqe_ctrl_seg::QPN_DS.off / 8;
const CTRL_FM_CE_SE: usize = wqe_ctrl_seg::FM_CE_SE.off / 8;
const CTRL_IMM: usize = wqe_ctrl_seg::IMM.off / 8;
const RADDR: usize = wqe_raddr_seg::RADDR.off / 8;
const RKEY: usize = wqe_raddr_seg::RKEY.off / 8;
const DATA_BYTE_COUNT: usize = wqe_data_seg::BYTE_COUNT.off / 8;
const DATA_LKEY: usize = wqe_data_seg::LKEY.off / 8;
const DATA_ADDR: usize = wqe_data_seg::ADDR.off / 8;
const ATOMIC_SWAP_ADD: usize = wqe_atomic_seg::SWAP_ADD.off / 8;
const ATOMIC_COMPARE: usize = wqe_atomic_seg::COMPARE.off / 8;
const CTRL_SIZE: usize = wqe_ctrl_seg::SIZE_BYTES;
const RADDR_SIZE: usize = wqe_raddr_seg::SIZE_BYTES;
const DATA_SIZE: usize = wqe_data_seg::SIZE_BYTES;
const ATOMIC_SIZE: usize = wqe_atomic_seg::SIZE_BYTES;
const DGRAM_SIZE: usize = wqe_datagram_seg::SIZE_BYTES;
const BB: usize = w::SEND_WQE_BB;

#[inline(always)]
fn put32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
fn put64(b: &mut [u8], o: usize, v: u64) {
    b[o..o + 8].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
fn put_data_seg(b: &mut [u8], o: usize, s: &Sge) {
    put32(b, o + DATA_BYTE_COUNT, s.length);
    put32(b, o + DATA_LKEY, s.lkey);
    put64(b, o + DATA_ADDR, s.addr);
}

/// The send side of a QP: ring memory, producer counter, doorbell record
/// and BlueFlame register. Usable on its own (driver-alone benchmarks).
///
/// Everything the per-WQE path reads is here, by value: the ring's base
/// and mask ([`DmaRing`], checked once), the counter up to which the ring
/// is known to have room (the shared tail is read only when that runs
/// out), and the constant part of a 1-SGE RDMA WRITE's control segment.
#[derive(Debug)]
pub struct SendRing {
    ring: DmaRing<BB>,
    pc: u32,
    /// `pc` may grow to here: the tail when last read, plus the ring size.
    limit: u32,
    cnt: u32,
    /// `pc` at the last doorbell: the WQEs from here on are pending.
    rung: u32,
    /// `(start, end)` of the last multi-block WQE, while it is the last
    /// WQE written (else the last WQE is the one block at `pc - 1`).
    multi: Option<(u32, u32)>,
    dbrec: DmaRing<4>,
    /// The two BlueFlame buffers, rung in turn; `bf` the next one.
    bf_regs: MmioRing<BF_BUF_SIZE>,
    bf: u32,
    qpn8: u32,
    /// Word 0 of a 1-SGE RDMA WRITE's control segment, WQE index zero.
    rdma_write_ctrl: u64,
    /// `fm_ce_se` bits every WQE gets (CQ_UPDATE with `sq_sig_all`).
    ce_all: u8,
    /// The completion slots of `track`, one per block (held here too: one
    /// indirection less per WQE).
    slots: Arc<[SqSlot]>,
    track: Arc<WqTrack>,
    blueflame: bool,
}

/// A control segment's first word (`opmod_idx_opcode`, `qpn_ds`) in memory
/// order, WQE index zero: the index is OR-ed in by [`ctrl_idx`].
#[inline(always)]
fn ctrl_word0(opcode: WqeOpcode, qpn_ds: u32) -> u64 {
    let o = w::opmod_idx_opcode(0, 0, opcode).to_be_bytes();
    let q = qpn_ds.to_be_bytes();
    u64::from_ne_bytes([o[0], o[1], o[2], o[3], q[0], q[1], q[2], q[3]])
}

/// WQE index `idx` at its place (bytes 1-2, big-endian) of a control
/// segment's first word in memory order.
#[inline(always)]
fn ctrl_idx(idx: u16) -> u64 {
    let i = idx.to_be_bytes();
    u64::from_ne_bytes([0, i[0], i[1], 0, 0, 0, 0, 0])
}

impl SendRing {
    /// A send queue of `2^log_cnt` 64-byte blocks at `base` of `buf`, its
    /// counter at `dbrec_off` of `dbrec` (the `snd_counter` dword), ringing
    /// BlueFlame register `bf_off` of `uar`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        buf: Arc<DmaBuffer>,
        base: usize,
        log_cnt: u32,
        dbrec: Arc<DmaBuffer>,
        dbrec_off: usize,
        uar: Arc<Mmio>,
        bf_off: usize,
        track: Arc<WqTrack>,
    ) -> Result<Self> {
        let cnt = 1u32 << log_cnt;
        let (Ok(ring), Ok(dbrec)) = (
            DmaRing::new(buf, base, cnt),
            DmaRing::new(dbrec, dbrec_off, 1),
        ) else {
            return Err(Error::Invalid("send ring outside its buffers"));
        };
        if track.sq.len() < cnt as usize {
            return Err(Error::Invalid("tracking smaller than the ring"));
        }
        uar.write64_raw(bf_off, [0; 8])?;
        let Ok(bf_regs) = MmioRing::new(uar, bf_off & !BF_BUF_SIZE, 2) else {
            return Err(Error::Invalid("BlueFlame registers outside the UAR"));
        };
        let qpn8 = track.qpn << w::WQE_CTRL_QPN_SHIFT;
        Ok(Self {
            ring,
            pc: 0,
            limit: cnt,
            cnt,
            rung: 0,
            multi: None,
            dbrec,
            bf_regs,
            bf: u32::from(bf_off & BF_BUF_SIZE != 0),
            qpn8,
            rdma_write_ctrl: ctrl_word0(WqeOpcode::RdmaWrite, qpn8 | 3),
            ce_all: 0,
            slots: track.sq.clone(),
            track,
            blueflame: true,
        })
    }

    /// Whether a single one-block WQE goes by BlueFlame copy (default on,
    /// as rdma-core) rather than the 8-byte doorbell.
    pub fn set_blueflame(&mut self, on: bool) {
        self.blueflame = on;
    }

    /// Every WQE requests a completion.
    pub fn set_sig_all(&mut self, on: bool) {
        self.ce_all = if on { w::WQE_CTRL_CQ_UPDATE } else { 0 };
    }

    /// Blocks free now.
    #[inline(always)]
    pub fn free(&self) -> u32 {
        let tail = self.track.sq_tail.load(Ordering::Acquire);
        self.cnt - self.pc.wrapping_sub(tail)
    }

    /// Whether `nbb` blocks fit: first against the room known from the last
    /// look at the tail, then (rarely) by reading the tail again.
    #[inline(always)]
    fn room_for(&mut self, nbb: u32) -> bool {
        self.limit.wrapping_sub(self.pc) >= nbb || self.reload_limit(nbb)
    }

    #[cold]
    #[inline(never)]
    fn reload_limit(&mut self, nbb: u32) -> bool {
        // Acquire: the CQ freed these blocks after the device was done with them.
        let tail = self.track.sq_tail.load(Ordering::Acquire);
        self.limit = tail.wrapping_add(self.cnt);
        self.limit.wrapping_sub(self.pc) >= nbb
    }

    /// The producer counter (in blocks).
    pub fn pc(&self) -> u32 {
        self.pc
    }

    /// Forgets every WQE written since producer counter `pc` (not rung yet).
    pub fn rewind(&mut self, pc: u32) {
        self.pc = pc;
        self.rung = pc;
        self.multi = None;
    }

    #[inline(always)]
    fn fm_ce_se(&self, flags: u32) -> u8 {
        let mut f = self.ce_all;
        if flags & send_flags::SIGNALED != 0 {
            f |= w::WQE_CTRL_CQ_UPDATE;
        }
        if flags & send_flags::SOLICITED != 0 {
            f |= w::WQE_CTRL_SOLICITED;
        }
        if flags & send_flags::FENCE != 0 {
            f |= w::WQE_CTRL_FENCE;
        }
        f
    }

    /// Writes one 1-SGE RDMA WRITE (one block) and leaves the doorbell for
    /// [`ring`](Self::ring). The fast path: no state check.
    #[inline(always)]
    pub fn write_rdma_write(
        &mut self,
        wr_id: u64,
        raddr: u64,
        rkey: u32,
        sge: &Sge,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        if !self.room_for(1) {
            return Err(PostError::QueueFull);
        }
        // The three segments (ctrl, raddr, data: ds = 3) as six words in
        // memory order, written straight into the ring (the block's last
        // 16 bytes are beyond ds and left alone, as rdma-core does).
        let be2 = |hi: u32, lo: u32| ((u64::from(hi) << 32) | u64::from(lo)).to_be();
        let pc = self.pc;
        let ctrl = self.rdma_write_ctrl | ctrl_idx(pc as u16);
        let words = [
            ctrl,
            u64::from_ne_bytes([0, 0, 0, self.fm_ce_se(flags), 0, 0, 0, 0]),
            raddr.to_be(),
            be2(rkey, 0),
            be2(sge.length, sge.lkey),
            sge.addr.to_be(),
        ];
        self.ring.store_words_at::<0, 6>(pc, &words);
        self.pc = pc.wrapping_add(1);
        if let Some(s) = self.slots.get(self.ring.slot(pc) as usize) {
            s.set(wr_id, self.pc);
        }
        Ok(())
    }

    /// Writes a WQE of any size (`wqe.len()` a multiple of 16), wrapping
    /// around the ring end block by block.
    fn commit(&mut self, wqe: &[u8], wr_id: u64) -> std::result::Result<(), PostError> {
        let nbb = wqe.len().div_ceil(BB) as u32;
        if !self.room_for(nbb) {
            return Err(PostError::QueueFull);
        }
        let start = self.pc;
        for (i, c) in wqe.chunks_exact(16).enumerate() {
            let (a, b) = c.split_at(8);
            let words = [
                u64::from_ne_bytes(a.try_into().unwrap_or_default()),
                u64::from_ne_bytes(b.try_into().unwrap_or_default()),
            ];
            let bb = start.wrapping_add((i / 4) as u32);
            // The 16-byte chunk's place in its 64-byte block, each offset a
            // constant the store is checked against when compiled.
            match i % 4 {
                0 => self.ring.store_words_at::<0, 2>(bb, &words),
                1 => self.ring.store_words_at::<16, 2>(bb, &words),
                2 => self.ring.store_words_at::<32, 2>(bb, &words),
                _ => self.ring.store_words_at::<48, 2>(bb, &words),
            }
        }
        self.pc = self.pc.wrapping_add(nbb);
        if let Some(s) = self.slots.get(self.ring.slot(start) as usize) {
            s.set(wr_id, self.pc);
        }
        self.multi = (nbb > 1).then_some((start, self.pc));
        Ok(())
    }

    /// Rings the doorbell for everything written since the last ring
    /// (BlueFlame when it is a single one-block WQE).
    #[inline(always)]
    pub fn ring(&mut self) {
        let n = self.pc.wrapping_sub(self.rung);
        if n == 0 {
            return;
        }
        // 2. The WQEs are in memory before the record says so (a compiler
        // barrier on x86-64, where stores are not reordered with stores).
        dma_wmb();
        // 3. Doorbell record: the send counter (PRM "Send Doorbell").
        self.dbrec.store_u32_be_at::<0>(0, self.pc & 0xffff);
        // 4. The record before the UAR write (Linux `wmb()`, as mlx5e's
        // `mlx5e_notify_hw` and mlx5_ib's post_send).
        wmb();
        // 5. BlueFlame copy of a lone one-block WQE, else the 8-byte
        // doorbell: the first 8 bytes of the last WQE's control segment.
        // Both read back from the ring (as rdma-core copies them).
        if self.blueflame && n == 1 {
            let block = self.ring.load_words_at::<0, 8>(self.rung);
            self.bf_regs.write_block64_at::<0>(self.bf, &block);
        } else {
            let last = match self.multi {
                Some((start, end)) if end == self.pc => start,
                _ => self.pc.wrapping_sub(1),
            };
            let [ctrl] = self.ring.load_words_at::<0, 1>(last);
            self.bf_regs.write64_at::<0>(self.bf, ctrl.to_ne_bytes());
        }
        self.bf ^= 1;
        self.rung = self.pc;
        self.multi = None;
    }

    /// Builds and writes one WQE for `wr`; the doorbell is left for
    /// [`ring`](Self::ring).
    pub(crate) fn write_wr(
        &mut self,
        wr: &SendWr<'_>,
        qp_type: QpType,
        max_inline: usize,
    ) -> std::result::Result<(), PostError> {
        // The common case, a 1-SGE RDMA WRITE on a connected QP, is one
        // block built in registers (the same WQE as below builds).
        if let (SendOp::RdmaWrite { raddr, rkey }, Payload::Sges([s]), false) =
            (wr.op, wr.payload, qp_type == QpType::Ud)
        {
            if s.length != 0 {
                return self.write_rdma_write(wr.wr_id, raddr, rkey, s, wr.flags);
            }
        }
        self.write_wr_general(wr, qp_type, max_inline)
    }

    /// [`write_wr`](Self::write_wr) for any WR: the WQE built segment by
    /// segment, then copied into the ring.
    pub(crate) fn write_wr_general(
        &mut self,
        wr: &SendWr<'_>,
        qp_type: QpType,
        max_inline: usize,
    ) -> std::result::Result<(), PostError> {
        let mut wqe = [0u8; w::SEND_WQE_MAX_SIZE];
        let (opcode, imm, raddr, atomic) = match wr.op {
            SendOp::Send => (WqeOpcode::Send, None, None, None),
            SendOp::SendImm(i) => (WqeOpcode::SendImm, Some(i), None, None),
            SendOp::RdmaWrite { raddr, rkey } => {
                (WqeOpcode::RdmaWrite, None, Some((raddr, rkey)), None)
            }
            SendOp::RdmaWriteImm { raddr, rkey, imm } => (
                WqeOpcode::RdmaWriteImm,
                Some(imm),
                Some((raddr, rkey)),
                None,
            ),
            SendOp::RdmaRead { raddr, rkey } => {
                (WqeOpcode::RdmaRead, None, Some((raddr, rkey)), None)
            }
            SendOp::AtomicCmpSwp {
                raddr,
                rkey,
                compare,
                swap,
            } => (
                WqeOpcode::AtomicCs,
                None,
                Some((raddr, rkey)),
                Some((swap, compare)),
            ),
            SendOp::AtomicFetchAdd { raddr, rkey, add } => (
                WqeOpcode::AtomicFa,
                None,
                Some((raddr, rkey)),
                Some((add, 0)),
            ),
        };
        // What each transport may do (IB spec: UC has no reads or atomics,
        // UD only sends).
        let ok = match qp_type {
            QpType::Rc => true,
            QpType::Uc => !matches!(
                opcode,
                WqeOpcode::RdmaRead | WqeOpcode::AtomicCs | WqeOpcode::AtomicFa
            ),
            QpType::Ud => matches!(opcode, WqeOpcode::Send | WqeOpcode::SendImm),
        };
        if !ok || (qp_type == QpType::Ud && wr.ud.is_none()) {
            return Err(PostError::BadOp);
        }
        let mut at = CTRL_SIZE;
        if let (QpType::Ud, Some(d)) = (qp_type, wr.ud) {
            let seg = &mut wqe[at..at + DGRAM_SIZE];
            seg.copy_from_slice(&d.ah.av);
            put32(
                seg,
                av::DQP_DCT.off / 8,
                w::EXTENDED_UD_AV | (d.remote_qpn & 0xff_ffff),
            );
            // The UD Q_Key is the upper half of `dc_key`.
            put32(seg, av::DC_KEY.off / 8, d.remote_qkey);
            at += DGRAM_SIZE;
        }
        if let Some((ra, rk)) = raddr {
            put64(&mut wqe, at + RADDR, ra);
            put32(&mut wqe, at + RKEY, rk);
            at += RADDR_SIZE;
        }
        if let Some((sa, cmp)) = atomic {
            put64(&mut wqe, at + ATOMIC_SWAP_ADD, sa);
            put64(&mut wqe, at + ATOMIC_COMPARE, cmp);
            at += ATOMIC_SIZE;
            if let Payload::Sges(s) = wr.payload {
                if s.len() != 1 || s[0].length != 8 {
                    return Err(PostError::BadOp);
                }
            } else {
                return Err(PostError::BadOp);
            }
        }
        match wr.payload {
            Payload::Sges(sges) => {
                if sges.len() > MAX_SGE {
                    return Err(PostError::TooLarge);
                }
                for s in sges {
                    // Zero-length entries are skipped, as mlx5 does.
                    if s.length == 0 {
                        continue;
                    }
                    put_data_seg(&mut wqe, at, s);
                    at += DATA_SIZE;
                }
            }
            Payload::Inline(data) => {
                if data.len() > max_inline || opcode == WqeOpcode::RdmaRead || atomic.is_some() {
                    return Err(PostError::TooLarge);
                }
                if !data.is_empty() {
                    put32(&mut wqe, at, w::INLINE_SEG | data.len() as u32);
                    wqe[at + 4..at + 4 + data.len()].copy_from_slice(data);
                    at += (4 + data.len()).next_multiple_of(16);
                }
            }
        }
        if at > w::SEND_WQE_MAX_SIZE {
            return Err(PostError::TooLarge);
        }
        let ds = (at / 16) as u8;
        put32(
            &mut wqe,
            CTRL_OPMOD_IDX_OPCODE,
            w::opmod_idx_opcode(0, self.pc as u16, opcode),
        );
        put32(&mut wqe, CTRL_QPN_DS, self.qpn8 | u32::from(ds));
        wqe[CTRL_FM_CE_SE] = self.fm_ce_se(wr.flags);
        if let Some(i) = imm {
            put32(&mut wqe, CTRL_IMM, i);
        }
        self.commit(&wqe[..at.next_multiple_of(16)], wr.wr_id)
    }
}

/// The receive side of a QP (or nothing, with an SRQ).
#[derive(Debug)]
pub(crate) struct RecvRing {
    /// The receive queue as data segments: WQE `n`'s `i`th is entry
    /// `(n << log_segs) + i` (the ring masks it).
    segs: DmaRing<DATA_SIZE>,
    /// log2 of the data segments per WQE (the stride / 16).
    log_segs: u32,
    max_sge: usize,
    mask: u32,
    pc: u32,
    /// The `rcv_counter` dword of the doorbell record.
    dbrec: DmaRing<4>,
    track: Arc<WqTrack>,
}

impl RecvRing {
    /// The receive queue at offset 0 of `region`: `cnt` WQEs of `stride`
    /// bytes (both powers of two); its counter at `MLX5_RCV_DBR` of `dbrec`.
    fn new(
        region: &DmaSlice,
        stride: usize,
        cnt: u32,
        dbrec: &Dbrec,
        track: &Arc<WqTrack>,
    ) -> Result<Self> {
        let per_wqe = (stride / DATA_SIZE) as u32;
        Ok(Self {
            segs: region.ring(0, cnt * per_wqe)?,
            log_segs: per_wqe.trailing_zeros(),
            max_sge: per_wqe as usize,
            mask: cnt - 1,
            pc: 0,
            dbrec: dbrec.ring(4 * w::RCV_DBR)?,
            track: track.clone(),
        })
    }

    fn post(&mut self, wr: &RecvWr<'_>) -> std::result::Result<(), PostError> {
        if wr.sg_list.len() > self.max_sge {
            return Err(PostError::TooLarge);
        }
        let tail = self.track.rq_tail.load(Ordering::Acquire);
        if self.pc.wrapping_sub(tail) > self.mask {
            return Err(PostError::QueueFull);
        }
        let slot = (self.pc & self.mask) as usize;
        let base = self.pc << self.log_segs;
        // Data segments as two words each (byte_count:lkey, addr), no
        // staging copy; a short list ends with a zero-length segment whose
        // lkey is MLX5_INVALID_LKEY, as rdma-core writes it.
        for (i, s) in wr.sg_list.iter().enumerate() {
            let words = [
                ((u64::from(s.length) << 32) | u64::from(s.lkey)).to_be(),
                s.addr.to_be(),
            ];
            self.segs
                .store_words_at::<0, 2>(base.wrapping_add(i as u32), &words);
        }
        if wr.sg_list.len() < self.max_sge {
            let words = [u64::from(w::TERMINATE_SCATTER_LIST_LKEY).to_be(), 0];
            let end = base.wrapping_add(wr.sg_list.len() as u32);
            self.segs.store_words_at::<0, 2>(end, &words);
        }
        self.track.rq_wrid[slot].store(wr.wr_id, Ordering::Relaxed);
        self.pc = self.pc.wrapping_add(1);
        Ok(())
    }

    fn ring(&self) {
        dma_wmb();
        self.dbrec.store_u32_be_at::<0>(0, self.pc & 0xffff);
    }
}

/// A queue pair (`struct ibv_qp`).
#[derive(Debug)]
pub struct Qp {
    qpn: u32,
    qp_type: QpType,
    state: QpState,
    ctx: Arc<Ctx>,
    pd: Arc<PdInner>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    srq: Option<Arc<SrqShared>>,
    sq: SendRing,
    rq: Option<RecvRing>,
    cap: QpCap,
    uar: Option<Arc<Uar>>,
    region: DmaSlice,
    dbrec: Dbrec,
    destroyed: bool,
}

fn log2_ceil(n: u32) -> u32 {
    n.max(1).next_power_of_two().trailing_zeros()
}

impl Pd {
    /// `ibv_create_qp`.
    pub fn create_qp(&self, attr: &QpInitAttr<'_>) -> Result<Qp> {
        Qp::create(&self.inner, attr)
    }
}

impl Qp {
    #[allow(clippy::too_many_lines)] // Over clippy.toml's 120: to split (issue 13, point 3).
    fn create(pd: &Arc<PdInner>, a: &QpInitAttr<'_>) -> Result<Self> {
        let ctx = &pd.ctx;
        let cap = a.cap;
        if cap.max_send_sge as usize > MAX_SGE
            || cap.max_recv_sge as usize > MAX_SGE
            || cap.max_inline_data as usize > MAX_INLINE
        {
            return Err(Error::Invalid("QP capacities beyond the device's"));
        }
        // Send WQE size: ctrl + the largest of (datagram | raddr + atomic)
        // + SGEs or inline, rounded to a block.
        let hdr = CTRL_SIZE
            + if a.qp_type == QpType::Ud {
                DGRAM_SIZE
            } else {
                RADDR_SIZE + ATOMIC_SIZE
            };
        let body = (cap.max_send_sge.max(1) as usize * DATA_SIZE)
            .max((4 + cap.max_inline_data as usize).next_multiple_of(16));
        let wqe_bbs = (hdr + body).div_ceil(BB).next_power_of_two() as u32;
        let sq_cnt = (cap.max_send_wr.max(1) * wqe_bbs).next_power_of_two();
        let max_wqes = ctx.hca.caps().max_qp_sz()?;
        if sq_cnt > max_wqes {
            return Err(Error::Invalid("max_send_wr beyond the device's"));
        }
        let (rq_cnt, stride) = if a.srq.is_some() || cap.max_recv_wr == 0 {
            (0u32, 0usize)
        } else {
            let st = (cap.max_recv_sge.max(1) as usize * DATA_SIZE).next_power_of_two();
            // As mlx5_ib's set_rq_size: the RQ is at least one send basic
            // block, so the SQ (which the device finds right after the RQ)
            // starts on a block boundary.
            let bytes = (cap.max_recv_wr.next_power_of_two() as usize * st).max(BB);
            ((bytes / st) as u32, st)
        };
        if rq_cnt > max_wqes {
            return Err(Error::Invalid("max_recv_wr beyond the device's"));
        }
        let rq_bytes = rq_cnt as usize * stride;
        let sq_base = rq_bytes.next_multiple_of(BB);
        let total = sq_base + sq_cnt as usize * BB;
        let dma = ctx.hca.dma();
        let region = dma.alloc_buf(total)?;
        let dbrec = dma.alloc_dbrec()?;
        let uar = ctx.alloc_uar()?;
        let srq = a.srq.map(|s| s.shared.clone());
        let mut inb = vec![0u8; create_qp_in::SIZE_BYTES + 8];
        {
            let mut i = CreateQpIn::new_unchecked(&mut inb[..]);
            i.set_opcode(Opcode::CreateQp.to_raw());
            let mut q = i.qpc_mut();
            q.set_st(a.qp_type.st())
                .set_pm_state(3) // MLX5_QP_PM_MIGRATED
                .set_pd(pd.pdn)
                .set_uar_page(uar.index())
                .set_log_page_size((region.len().trailing_zeros() - 12) as u8)
                .set_log_sq_size(sq_cnt.trailing_zeros() as u8)
                .set_cqn_snd(a.send_cq.shared.cqn)
                .set_cqn_rcv(a.recv_cq.shared.cqn)
                .set_dbr_addr(dbrec.iova().0);
            match &srq {
                Some(s) => {
                    q.set_rq_type(1).set_srqn_rmpn_xrqn(s.srqn); // MLX5_SRQ_RQ
                }
                None if rq_cnt == 0 => {
                    q.set_rq_type(3); // MLX5_ZERO_LEN_RQ
                }
                None => {
                    q.set_log_rq_size(rq_cnt.trailing_zeros() as u8)
                        .set_log_rq_stride((stride.trailing_zeros() - 4) as u8);
                }
            }
            i.set_pas(0, region.iova().0);
        }
        let out = match ctx.hca.cmd().exec(&inb, create_qp_out::SIZE_BYTES) {
            Ok(o) => o,
            Err(e) => {
                ctx.release_uar(uar);
                return Err(e);
            }
        };
        let qpn = CreateQpOut::new_unchecked(&out[..]).qpn();
        let track = WqTrack::with_srq(qpn, sq_cnt, rq_cnt, srq.clone());
        let sq = SendRing::new(
            region.buf().clone(),
            region.offset() + sq_base,
            sq_cnt.trailing_zeros(),
            dbrec.buf().clone(),
            dbrec.offset() + 4 * w::SND_DBR,
            ctx.hca.bar().clone(),
            uar.offset() + mlx5_hw::uar::BF_OFFSET,
            track.clone(),
        );
        let mut sq = match sq {
            Ok(s) => s,
            Err(e) => {
                destroy_qp_cmd(ctx, qpn);
                ctx.release_uar(uar);
                return Err(e);
            }
        };
        sq.set_sig_all(a.sq_sig_all);
        let rq = match (rq_cnt > 0).then(|| RecvRing::new(&region, stride, rq_cnt, &dbrec, &track))
        {
            None => None,
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => {
                destroy_qp_cmd(ctx, qpn);
                ctx.release_uar(uar);
                return Err(e);
            }
        };
        a.send_cq.shared.attach(qpn, track.clone());
        a.recv_cq.shared.attach(qpn, track);
        let max_inline = (wqe_bbs as usize * BB - hdr - 4).min(MAX_INLINE);
        Ok(Qp {
            qpn,
            qp_type: a.qp_type,
            state: QpState::Reset,
            ctx: ctx.clone(),
            pd: pd.clone(),
            send_cq: a.send_cq.shared.clone(),
            recv_cq: a.recv_cq.shared.clone(),
            srq,
            sq,
            rq,
            cap: QpCap {
                max_send_wr: sq_cnt / wqe_bbs,
                max_recv_wr: rq_cnt,
                max_send_sge: cap.max_send_sge.max(1),
                max_recv_sge: (stride / DATA_SIZE) as u32,
                max_inline_data: max_inline as u32,
            },
            uar: Some(uar),
            region,
            dbrec,
            destroyed: false,
        })
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The state as last set.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The capacities granted (at least those asked for).
    pub fn cap(&self) -> QpCap {
        self.cap
    }

    /// The PD number.
    pub fn pdn(&self) -> u32 {
        self.pd.pdn
    }

    /// The send ring, for BlueFlame control.
    pub fn send_ring(&mut self) -> &mut SendRing {
        &mut self.sq
    }

    /// `ibv_modify_qp`: checks the transition and the attribute mask as
    /// verbs does, then issues the PRM transition command.
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        use attr_mask::*;
        let to = match (mask & STATE != 0, attr.qp_state) {
            (true, Some(s)) => s,
            (true, None) => return Err(Error::Invalid("IBV_QP_STATE without a state")),
            (false, _) => self.state,
        };
        let from = if mask & CUR_STATE != 0 {
            let c = attr
                .cur_qp_state
                .ok_or(Error::Invalid("IBV_QP_CUR_STATE without a state"))?;
            if c != self.state && !matches!(c, QpState::Sqd | QpState::Sqe | QpState::Rts) {
                return Err(Error::Invalid("cur_qp_state differs from the QP's state"));
            }
            c
        } else {
            self.state
        };
        let (req, opt) = transition_masks(self.qp_type, from, to)
            .ok_or(Error::Invalid("no such QP state transition"))?;
        let allowed = req | opt | STATE | CUR_STATE;
        if mask & req != req {
            return Err(Error::Invalid("attribute mask lacks a required attribute"));
        }
        if mask & !allowed != 0 {
            return Err(Error::Invalid(
                "attribute mask has an attribute this transition does not take",
            ));
        }
        if mask & PORT != 0 && attr.port_num != 1 {
            return Err(Error::Invalid("port number"));
        }
        if mask & PATH_MTU != 0 && !(1..=5).contains(&attr.path_mtu) {
            return Err(Error::Invalid("path MTU"));
        }
        let op = match (from, to) {
            (_, QpState::Reset) => Opcode::ToRstQp,
            (_, QpState::Err) => Opcode::ToErrQp,
            (QpState::Reset, QpState::Init) => Opcode::Rst2InitQp,
            (QpState::Init, QpState::Init) => Opcode::Init2InitQp,
            (QpState::Init, QpState::Rtr) => Opcode::Init2RtrQp,
            (QpState::Rtr, QpState::Rts) => Opcode::Rtr2RtsQp,
            (QpState::Rts, QpState::Rts) => Opcode::Rts2RtsQp,
            (QpState::Sqd, QpState::Rts) => Opcode::SqdRtsQp,
            (QpState::Sqe, QpState::Rts) => Opcode::Sqerr2RtsQp,
            // mlx5 has no RTS2SQD command in the PRM Linux uses.
            (QpState::Rts, QpState::Sqd) => {
                return Err(Error::NotSupported("RTS to SQD (no PRM command)"))
            }
            _ => return Err(Error::Invalid("no such QP state transition")),
        };
        let inb = self.transition_input(op, attr, mask, to)?;
        let out_len = 16;
        self.ctx.hca.cmd().exec(&inb, out_len)?;
        if to == QpState::Reset {
            self.reset_rings();
        }
        self.state = to;
        Ok(())
    }

    fn reset_rings(&mut self) {
        // After 2RST the device starts the queues at 0 again.
        self.sq.pc = 0;
        self.sq.rung = 0;
        self.sq.multi = None;
        self.sq.track.sq_tail.store(0, Ordering::Release);
        self.sq.limit = self.sq.cnt;
        // Both doorbell-record counters back to 0 (without a receive queue
        // of its own the QP never writes the receive counter).
        self.sq.dbrec.store_u32_be_at::<0>(0, 0);
        if let Some(rq) = &mut self.rq {
            rq.pc = 0;
            rq.track.rq_tail.store(0, Ordering::Release);
            rq.dbrec.store_u32_be_at::<0>(0, 0);
        }
    }

    fn transition_input(&self, op: Opcode, a: &QpAttr, mask: u32, to: QpState) -> Result<Vec<u8>> {
        use attr_mask::*;
        if matches!(op, Opcode::ToRstQp | Opcode::ToErrQp) {
            let mut inb = vec![0u8; qp_2rst_in::SIZE_BYTES];
            Qp2rstIn::new_unchecked(&mut inb[..])
                .set_opcode(op.to_raw())
                .set_qpn(self.qpn);
            return Ok(inb);
        }
        // Every transition with a QP context shares rst2init_qp_in's shape
        // (opcode, qpn, opt_param_mask, qpc).
        let mut inb = vec![0u8; rst2init_qp_in::SIZE_BYTES];
        let mut opt = 0u32;
        {
            let mut i = Rst2initQpIn::new_unchecked(&mut inb[..]);
            i.set_opcode(op.to_raw()).set_qpn(self.qpn);
            let mut q = i.qpc_mut();
            if mask & ACCESS_FLAGS != 0 {
                use crate::mr::access::*;
                let f = a.qp_access_flags;
                q.set_rwe(f & REMOTE_WRITE != 0)
                    .set_rre(f & REMOTE_READ != 0)
                    .set_rae(f & REMOTE_ATOMIC != 0);
                if f & REMOTE_ATOMIC != 0 {
                    q.set_atomic_mode(1); // IB-compliant 8-byte atomics
                }
                opt |= QP_OPTPAR_RRE | QP_OPTPAR_RWE | QP_OPTPAR_RAE;
            }
            if mask & QKEY != 0 {
                q.set_q_key(a.qkey);
                opt |= QP_OPTPAR_Q_KEY;
            }
            if mask & PKEY_INDEX != 0 {
                q.primary_address_path_mut().set_pkey_index(a.pkey_index);
                opt |= QP_OPTPAR_PKEY_INDEX;
            }
            if mask & PORT != 0 || op == Opcode::Rst2InitQp {
                q.primary_address_path_mut().set_vhca_port_num(1);
            }
            if mask & PATH_MTU != 0 {
                q.set_mtu(a.path_mtu);
            }
            if op == Opcode::Init2RtrQp {
                q.set_log_msg_max(self.ctx.hca.caps().gen().log_max_msg());
            }
            if mask & DEST_QPN != 0 {
                q.set_remote_qpn(a.dest_qp_num & 0xff_ffff);
            }
            if mask & RQ_PSN != 0 {
                q.set_next_rcv_psn(a.rq_psn & 0xff_ffff);
            }
            if mask & SQ_PSN != 0 {
                q.set_next_send_psn(a.sq_psn & 0xff_ffff);
            }
            if mask & MAX_DEST_RD_ATOMIC != 0 {
                q.set_log_rra_max(log2_ceil(a.max_dest_rd_atomic.into()) as u8);
            }
            if mask & MAX_QP_RD_ATOMIC != 0 {
                q.set_log_sra_max(log2_ceil(a.max_rd_atomic.into()) as u8);
            }
            if mask & MIN_RNR_TIMER != 0 {
                q.set_min_rnr_nak(a.min_rnr_timer);
                opt |= QP_OPTPAR_RNR_TIMEOUT;
            }
            if mask & RETRY_CNT != 0 {
                q.set_retry_count(a.retry_cnt);
            }
            if mask & RNR_RETRY != 0 {
                q.set_rnr_retry(a.rnr_retry);
            }
            if mask & TIMEOUT != 0 {
                q.primary_address_path_mut().set_ack_timeout(a.timeout);
            }
            if mask & AV != 0 {
                let ah = &a.ah_attr;
                let sgid = self
                    .ctx
                    .gid(ah.sgid_index.into())
                    .ok_or(Error::Invalid("source GID index names no GID"))?;
                let _ = sgid;
                let dmac = match ah.dmac {
                    Some(m) => m,
                    None => crate::device::mac_of_link_local_gid(&ah.dgid)
                        .ok_or(Error::Invalid("no destination MAC for a routable GID"))?,
                };
                let mut p = q.primary_address_path_mut();
                p.set_grh(true)
                    .set_src_addr_index(ah.sgid_index)
                    .set_hop_limit(ah.hop_limit.max(1))
                    .set_tclass(ah.traffic_class)
                    .set_flow_label(ah.flow_label & 0xf_ffff)
                    .set_udp_sport(crate::ah::udp_sport(self.qpn, a.dest_qp_num))
                    .set_eth_prio(ah.sl & 7)
                    .set_vhca_port_num(1)
                    .set_rmac_47_32(u16::from_be_bytes([dmac[0], dmac[1]]))
                    .set_rmac_31_0(u32::from_be_bytes([dmac[2], dmac[3], dmac[4], dmac[5]]));
                p.rgid_rip_mut().copy_from_slice(&ah.dgid);
                opt |= QP_OPTPAR_PRIMARY_ADDR_PATH;
            }
            let _ = to;
            // Optional parameters only in transitions that take them.
            let opt_ok = !matches!(op, Opcode::Rst2InitQp);
            i.set_opt_param_mask(if opt_ok { opt } else { 0 });
        }
        Ok(inb)
    }

    /// `ibv_post_send`: writes every WR, then one doorbell. On failure the
    /// WRs before the failing one are posted (and rung); the index and the
    /// reason come back.
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
        if self.ctx.hca.cmd().is_failed() {
            return Err((0, PostError::DeviceFailed));
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return Err((0, PostError::BadState(self.state)));
        }
        let max_inline = self.cap.max_inline_data as usize;
        for (i, wr) in wrs.iter().enumerate() {
            if let Payload::Sges(s) = wr.payload {
                if s.len() > self.cap.max_send_sge as usize {
                    self.sq.ring();
                    return Err((i, PostError::TooLarge));
                }
            }
            if let Err(e) = self.sq.write_wr(wr, self.qp_type, max_inline) {
                self.sq.ring();
                return Err((i, e));
            }
        }
        self.sq.ring();
        Ok(())
    }

    /// Whether the device failed (then nothing more is posted).
    pub(crate) fn device_failed(&self) -> bool {
        self.ctx.hca.cmd().is_failed()
    }

    /// Posts one 1-SGE RDMA WRITE with its doorbell: the fast path.
    #[inline]
    pub fn post_rdma_write(
        &mut self,
        wr_id: u64,
        sge: &Sge,
        raddr: u64,
        rkey: u32,
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        if self.ctx.hca.cmd().is_failed() {
            return Err(PostError::DeviceFailed);
        }
        if self.state != QpState::Rts || self.qp_type == QpType::Ud {
            return Err(PostError::BadState(self.state));
        }
        self.sq.write_rdma_write(wr_id, raddr, rkey, sge, flags)?;
        self.sq.ring();
        Ok(())
    }

    /// `ibv_post_send` with SGEs given as raw `(addr, length, lkey)`.
    ///
    /// # Safety
    ///
    /// Every triple lies inside a live MR of this QP's PD with that lkey,
    /// and its memory stays registered until the WR completes.
    pub unsafe fn post_send_unchecked(
        &mut self,
        wr_id: u64,
        op: SendOp,
        sges: &[(u64, u32, u32)],
        flags: u32,
    ) -> std::result::Result<(), PostError> {
        let mut v = [Sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        if sges.len() > MAX_SGE {
            return Err(PostError::TooLarge);
        }
        for (d, &(addr, length, lkey)) in v.iter_mut().zip(sges) {
            // SAFETY: forwarded from this function's contract.
            *d = unsafe { Sge::new_unchecked(addr, length, lkey) };
        }
        let wr = SendWr {
            wr_id,
            op,
            payload: Payload::Sges(&v[..sges.len()]),
            flags,
            ud: None,
        };
        self.post_send(&[wr]).map_err(|(_, e)| e)
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
        if self.ctx.hca.cmd().is_failed() {
            return Err((0, PostError::DeviceFailed));
        }
        if self.state == QpState::Reset {
            return Err((0, PostError::BadState(self.state)));
        }
        let Some(rq) = &mut self.rq else {
            return Err((0, PostError::BadOp));
        };
        let mut r = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = rq.post(wr) {
                r = Err((i, e));
                break;
            }
        }
        rq.ring();
        r
    }

    /// `ibv_destroy_qp`.
    ///
    /// Takes the QP by value, so posting to a destroyed QP (libibverbs'
    /// use-after-free) does not compile:
    ///
    /// ```compile_fail,E0382
    /// fn post_after_destroy(mut qp: verbs::qp::Qp, wrs: &[verbs::qp::SendWr<'_>]) {
    ///     qp.destroy().unwrap();
    ///     let _ = qp.post_send(wrs); // use of moved value: `qp`
    /// }
    /// ```
    ///
    /// while the same calls in the other order do:
    ///
    /// ```
    /// fn post_then_destroy(mut qp: verbs::qp::Qp, wrs: &[verbs::qp::SendWr<'_>]) {
    ///     let _ = qp.post_send(wrs);
    ///     qp.destroy().unwrap();
    /// }
    /// ```
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        let mut inb = [0u8; destroy_qp_in::SIZE_BYTES];
        DestroyQpIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DestroyQp.to_raw())
            .set_qpn(self.qpn);
        let r = self
            .ctx
            .hca
            .cmd()
            .exec(&inb, destroy_qp_out::SIZE_BYTES)
            .map(|_| ());
        if r.is_err() {
            // The device may still use the queues: their memory stays out
            // of use until the function is closed.
            self.region.device_may_still_use();
            self.dbrec.device_may_still_use();
        }
        self.send_cq.detach(self.qpn);
        self.recv_cq.detach(self.qpn);
        if let Some(u) = self.uar.take() {
            self.ctx.release_uar(u);
        }
        let _ = &self.srq;
        r
    }
}

fn destroy_qp_cmd(ctx: &Ctx, qpn: u32) {
    let mut inb = [0u8; destroy_qp_in::SIZE_BYTES];
    DestroyQpIn::new_unchecked(&mut inb[..])
        .set_opcode(Opcode::DestroyQp.to_raw())
        .set_qpn(qpn);
    if let Err(e) = ctx.hca.cmd().exec(&inb, destroy_qp_out::SIZE_BYTES) {
        tracing::warn!("DESTROY_QP {qpn:#x}: {e}");
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!("DESTROY_QP {:#x}: {e}", self.qpn);
        }
    }
}

#[cfg(test)]
#[path = "qp_tests.rs"]
mod tests;
