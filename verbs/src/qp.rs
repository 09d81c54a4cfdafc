//! Queue pairs, the object (mlx5_ib's `qp.c`, rdma-core's `mlx5_create_qp`
//! / `mlx5_modify_qp`): CREATE_QP, the state-transition commands and
//! DESTROY_QP (`ibv_create_qp`, `ibv_modify_qp`, `ibv_destroy_qp`), and the
//! verbs state machine they follow ([`transition_masks`]: which attributes
//! each transition requires and takes, `ib_modify_qp_is_ok`'s table).
//!
//! One DMA buffer holds the receive queue at offset 0 and the send queue
//! after it (mlx5's layout); a separate doorbell record holds the receive
//! and send counters. Creating a QP follows the PRM's steps, one function
//! each: size the queues (`QpSizes`), allocate the buffer, the doorbell
//! record and a UAR, build `create_qp_in`, execute it, and wire the rings
//! to the QP number firmware returned.
//!
//! The rest of a QP lives by mechanism, as Linux and rdma-core split it:
//!
//! - [`crate::wr`]: the work requests users build ([`SendWr`], [`RecvWr`],
//!   [`SendOp`], [`Payload`], [`send_flags`], [`UdDest`], [`PostError`]),
//!   `ibv_post_send` / `ibv_post_recv` and the `ibv_wr_*` batch API;
//! - [`crate::wqe`]: the send ring and WQE builder ([`SendRing`]: segments,
//!   doorbell record, BlueFlame);
//! - `crate::rq`: the receive ring;
//! - [`crate::wq`]: [`WqTrack`], the wr_id bookkeeping shared with the CQs.
//!
//! Those types are re-exported here, so `verbs::qp::SendWr` and the like
//! keep working. Every PRM number comes from `mlx5_hw` (`qp`, `wqe`, the
//! `ifc` views).
//!
//! Thread safety: a [`Qp`] is `Send`; posting and modifying take
//! `&mut self` (no lock on the fast path). Share it behind a `Mutex`.

use std::sync::Arc;

use mlx5_hw::ifc::*;
use mlx5_hw::init::FW_PAGE_SHIFT;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::*;
use mlx5_hw::wqe as w;

use crate::buf::DmaSlice;
use crate::cq::{Cq, CqShared};
use crate::dbrec::Dbrec;
use crate::device::Ctx;
use crate::pd::{Pd, PdInner};
use crate::rq::{RecvRing, DBREC_SIZE};
use crate::srq::{Srq, SrqShared};
use crate::uar::Bfreg;
use crate::wqe::{ATOMIC_SIZE, BB, CTRL_SIZE, DATA_SIZE, DGRAM_SIZE, INLINE_HDR_SIZE, RADDR_SIZE};
use crate::{Error, Result};

pub use crate::wq::WqTrack;
pub use crate::wqe::SendRing;
pub use crate::wr::{send_flags, Payload, PostError, RecvWr, SendOp, SendWr, UdDest};

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
    /// qpc `st` (`MLX5_QPC_ST_*`).
    pub(crate) fn st(self) -> u8 {
        match self {
            QpType::Rc => QPC_ST_RC,
            QpType::Uc => QPC_ST_UC,
            QpType::Ud => QPC_ST_UD,
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

/// A queue pair (`struct ibv_qp`).
#[derive(Debug)]
pub struct Qp {
    qpn: u32,
    pub(crate) qp_type: QpType,
    /// qpc `st` (a DCI posts as RC with a datagram segment).
    pub(crate) st: u8,
    pub(crate) state: QpState,
    pub(crate) ctx: Arc<Ctx>,
    /// The device's command queue, for its failed flag: a post tests it
    /// with two loads (through `ctx`, three).
    pub(crate) cmd: crate::cmd::Cmd,
    pd: Arc<PdInner>,
    send_cq: Arc<CqShared>,
    recv_cq: Arc<CqShared>,
    /// Held so the SRQ outlives the QP that takes its receives.
    _srq: Option<Arc<SrqShared>>,
    pub(crate) sq: SendRing,
    pub(crate) rq: Option<RecvRing>,
    pub(crate) cap: QpCap,
    /// The bytes of a send WQE this QP is sized for (`wqe_bbs` blocks):
    /// what a UMR WQE's translation may fill (`crate::mkey`).
    pub(crate) wqe_bytes: u32,
    /// A 1-SGE RDMA WRITE goes straight to [`SendRing::write_rdma_write`]
    /// (a connected QP with send SGEs): [`Qp::write_rdma_write`]'s one test
    /// of the QP, fixed at creation.
    pub(crate) rdma_write_direct: bool,
    bfreg: Option<Bfreg>,
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

/// The segments of the largest memory-window bind WQE after its control
/// segment: UMR control, mkey context, one KLM padded to 64 bytes.
const BIND_WQE_SEGS: usize =
    mlx5_hw::ifc::wqe_umr_ctrl_seg::SIZE_BYTES + mlx5_hw::ifc::mkey_seg::SIZE_BYTES + 64;

/// The queue geometry of a QP, computed once from what was asked for
/// (mlx5_ib's `calc_sq_size` and `set_rq_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QpSizes {
    /// Bytes before the data in the largest send WQE: the control segment
    /// and the datagram segment (UD) or the remote-address and atomic ones.
    hdr: usize,
    /// 64-byte basic blocks per send WQE (a power of two).
    wqe_bbs: u32,
    /// Send queue size, in basic blocks (a power of two).
    sq_cnt: u32,
    /// Receive WQEs (a power of two; 0 with an SRQ or no receives).
    rq_cnt: u32,
    /// Bytes per receive WQE (a power of two; 0 without a receive queue).
    rq_stride: usize,
}

impl QpSizes {
    /// The sizes for `cap` on a `qp_type` QP (its receives from an SRQ
    /// when `srq`), or which capacity is beyond the device's (`max_wqes`:
    /// `log_max_qp_sz`).
    #[cfg(test)]
    fn new(cap: QpCap, qp_type: QpType, srq: bool, max_wqes: u32) -> Result<Self> {
        Self::for_st(cap, qp_type, srq, max_wqes, qp_type.st(), false)
    }

    /// [`new`](Self::new) for qpc `st`: a DCI's WQEs carry a datagram
    /// segment before the remote-address and atomic segments; with
    /// `bind`, an RC send WQE has room for a memory-window bind (the UMR
    /// control and mkey segments and one KLM), as mlx5_ib's `sq_overhead`
    /// and libmlx5 size every RC QP.
    fn for_st(
        cap: QpCap,
        qp_type: QpType,
        srq: bool,
        max_wqes: u32,
        st: u8,
        bind: bool,
    ) -> Result<Self> {
        if cap.max_send_sge as usize > MAX_SGE
            || cap.max_recv_sge as usize > MAX_SGE
            || cap.max_inline_data as usize > MAX_INLINE
        {
            return Err(Error::Invalid("QP capacities beyond the device's"));
        }
        // Send WQE size: ctrl + the largest of (datagram | raddr + atomic)
        // + SGEs or inline, rounded to a block.
        let hdr = CTRL_SIZE
            + if qp_type == QpType::Ud {
                DGRAM_SIZE
            } else if st == QPC_ST_DCI {
                DGRAM_SIZE + RADDR_SIZE + ATOMIC_SIZE
            } else if bind && qp_type == QpType::Rc {
                (RADDR_SIZE + ATOMIC_SIZE).max(BIND_WQE_SEGS)
            } else {
                RADDR_SIZE + ATOMIC_SIZE
            };
        let body = (cap.max_send_sge.max(1) as usize * DATA_SIZE)
            .max((INLINE_HDR_SIZE + cap.max_inline_data as usize).next_multiple_of(w::SEND_WQE_DS));
        let wqe_bbs = (hdr + body).div_ceil(BB).next_power_of_two() as u32;
        let sq_cnt = cap
            .max_send_wr
            .max(1)
            .checked_mul(wqe_bbs)
            .and_then(u32::checked_next_power_of_two)
            .filter(|&n| n <= max_wqes)
            .ok_or(Error::Invalid("max_send_wr beyond the device's"))?;
        let (rq_cnt, rq_stride) = if srq || cap.max_recv_wr == 0 {
            (0u32, 0usize)
        } else {
            let st = (cap.max_recv_sge.max(1) as usize * DATA_SIZE).next_power_of_two();
            let wqes = cap
                .max_recv_wr
                .checked_next_power_of_two()
                .ok_or(Error::Invalid("max_recv_wr beyond the device's"))?;
            // As mlx5_ib's set_rq_size: the RQ is at least one send basic
            // block, so the SQ (which the device finds right after the RQ)
            // starts on a block boundary.
            let bytes = (wqes as usize * st).max(BB);
            ((bytes / st) as u32, st)
        };
        if rq_cnt > max_wqes {
            return Err(Error::Invalid("max_recv_wr beyond the device's"));
        }
        Ok(Self {
            hdr,
            wqe_bbs,
            sq_cnt,
            rq_cnt,
            rq_stride,
        })
    }

    /// Where the send queue starts in the QP buffer: after the receive queue.
    fn sq_base(&self) -> usize {
        (self.rq_cnt as usize * self.rq_stride).next_multiple_of(BB)
    }

    /// The QP buffer's length: receive queue, then send queue.
    fn buf_len(&self) -> usize {
        self.sq_base() + self.sq_cnt as usize * BB
    }

    /// The capacities these sizes grant for a request of `asked`.
    fn granted(&self, asked: QpCap) -> QpCap {
        let max_inline = (self.wqe_bbs as usize * BB - self.hdr - INLINE_HDR_SIZE).min(MAX_INLINE);
        QpCap {
            max_send_wr: self.sq_cnt / self.wqe_bbs,
            max_recv_wr: self.rq_cnt,
            max_send_sge: asked.max_send_sge.max(1),
            max_recv_sge: (self.rq_stride / DATA_SIZE) as u32,
            max_inline_data: max_inline as u32,
        }
    }
}

/// The memory a QP owns: the queue buffer (RQ then SQ), the doorbell
/// record and the BlueFlame register it rings.
#[derive(Debug)]
struct QpBufs {
    region: DmaSlice,
    dbrec: Dbrec,
    bfreg: Bfreg,
}

impl QpBufs {
    fn alloc(ctx: &Ctx, sizes: &QpSizes) -> Result<Self> {
        let dma = ctx.hca.dma();
        let region = dma.alloc_buf(sizes.buf_len())?;
        let dbrec = dma.alloc_dbrec()?;
        let bfreg = ctx.alloc_bfreg()?;
        Ok(Self {
            region,
            dbrec,
            bfreg,
        })
    }
}

/// CREATE_QP's input (`create_qp_in`): the QPC of a QP in RESET over
/// `bufs`, its one PAS entry the whole buffer.
fn create_qp_input(
    pd: &PdInner,
    a: &QpInitAttr<'_>,
    sizes: &QpSizes,
    bufs: &QpBufs,
    srq: Option<&SrqShared>,
    st: u8,
    cs: (u8, u8),
) -> Vec<u8> {
    // The PAS array holds one entry (8 bytes) after the fixed part.
    let mut inb = vec![0u8; create_qp_in::SIZE_BYTES + std::mem::size_of::<u64>()];
    let mut i = CreateQpIn::new_unchecked(&mut inb[..]);
    i.set_opcode(Opcode::CreateQp.to_raw());
    let mut q = i.qpc_mut();
    q.set_st(st)
        .set_pm_state(QPC_PM_STATE_MIGRATED)
        .set_pd(pd.pdn)
        .set_uar_page(bufs.bfreg.uar.index())
        .set_log_page_size((bufs.region.len().trailing_zeros() - FW_PAGE_SHIFT) as u8)
        .set_log_sq_size(sizes.sq_cnt.trailing_zeros() as u8)
        .set_cqn_snd(a.send_cq.shared.cqn)
        .set_cqn_rcv(a.recv_cq.shared.cqn)
        .set_cs_req(cs.0)
        .set_cs_res(cs.1)
        .set_dbr_addr(bufs.dbrec.iova().0);
    match srq {
        Some(s) => {
            q.set_rq_type(SRQ_RQ).set_srqn_rmpn_xrqn(s.srqn);
        }
        None if sizes.rq_cnt == 0 => {
            q.set_rq_type(ZERO_LEN_RQ);
        }
        None => {
            // log_rq_stride counts 16-byte data segments.
            q.set_rq_type(NON_ZERO_RQ)
                .set_log_rq_size(sizes.rq_cnt.trailing_zeros() as u8)
                .set_log_rq_stride((sizes.rq_stride / DATA_SIZE).trailing_zeros() as u8);
        }
    }
    i.set_pas(0, bufs.region.iova().0);
    inb
}

/// The views of the rings the poller reads back for scatter to CQE
/// (`crate::scatter_cqe`): the receive ring when the QP asked for
/// `cs_res`, the send ring for `cs_req`.
fn scatter_views(sizes: &QpSizes, bufs: &QpBufs, track: &WqTrack, cs: (u8, u8)) -> Result<()> {
    if cs.1 != 0 && sizes.rq_cnt > 0 {
        let per_wqe = (sizes.rq_stride / DATA_SIZE) as u32;
        let segs = vfio::DmaRing::new(
            bufs.region.buf().clone(),
            bufs.region.offset(),
            sizes.rq_cnt * per_wqe,
        )?;
        let _ = track.recv_view.set(crate::scatter_cqe::RecvView {
            segs,
            log_segs: per_wqe.trailing_zeros(),
            mask: sizes.rq_cnt - 1,
        });
    }
    if cs.0 != 0 {
        let per_bb = (BB / DATA_SIZE) as u32;
        let segs = vfio::DmaRing::new(
            bufs.region.buf().clone(),
            bufs.region.offset() + sizes.sq_base(),
            sizes.sq_cnt * per_bb,
        )?;
        let _ = track.send_view.set(crate::scatter_cqe::SendView {
            segs,
            log_per_bb: per_bb.trailing_zeros(),
        });
    }
    Ok(())
}

/// The send ring and (without an SRQ) the receive ring of QP `track.qpn()`
/// over `bufs`: the SQ after the RQ, the counters at `MLX5_SND_DBR` and
/// `MLX5_RCV_DBR` of the doorbell record, doorbells on the UAR's first
/// BlueFlame register.
fn wire_rings(
    ctx: &Ctx,
    a: &QpInitAttr<'_>,
    sizes: &QpSizes,
    bufs: &QpBufs,
    track: &Arc<WqTrack>,
) -> Result<(SendRing, Option<RecvRing>)> {
    let mut sq = SendRing::new(
        bufs.region.buf().clone(),
        bufs.region.offset() + sizes.sq_base(),
        sizes.sq_cnt.trailing_zeros(),
        bufs.dbrec.buf().clone(),
        bufs.dbrec.offset() + DBREC_SIZE * w::SND_DBR,
        ctx.hca.bar().clone(),
        bufs.bfreg.offset(log_bf_reg_size(ctx)),
        track.clone(),
    )?;
    sq.set_sig_all(a.sq_sig_all);
    // A bfreg other QPs ring too takes 8-byte doorbells only: BlueFlame
    // copies from two QPs into one buffer would interleave.
    sq.set_blueflame(!bufs.bfreg.shared);
    let rq = if sizes.rq_cnt > 0 {
        Some(RecvRing::new(
            bufs.region.buf().clone(),
            bufs.region.offset(),
            sizes.rq_stride,
            sizes.rq_cnt,
            bufs.dbrec.buf().clone(),
            bufs.dbrec.offset(),
            track.clone(),
        )?)
    } else {
        None
    };
    Ok((sq, rq))
}

/// The size of a BlueFlame register, from the caps (`log_bf_reg_size`),
/// never less than the two 256-byte buffers each holds.
fn log_bf_reg_size(ctx: &Ctx) -> u32 {
    let floor = mlx5_hw::uar::BF_REG_SIZE_DEFAULT.trailing_zeros();
    u32::from(ctx.hca.caps().gen().log_bf_reg_size()).max(floor)
}

impl Qp {
    /// `ibv_create_qp` (mlx5_ib's `create_qp_common`), in the PRM's steps:
    /// size the queues, allocate their memory, CREATE_QP, then wire the
    /// rings to the QP number firmware returned and attach it to its CQs.
    fn create(pd: &Arc<PdInner>, a: &QpInitAttr<'_>) -> Result<Self> {
        Self::create_st(pd, a, a.qp_type.st())
    }

    /// [`create`](Self::create) with qpc `st` given: `QPC_ST_REG_UMR` for
    /// the driver's UMR QP (`crate::umr`), which posts like an RC QP.
    pub(crate) fn create_st(pd: &Arc<PdInner>, a: &QpInitAttr<'_>, st: u8) -> Result<Self> {
        Self::create_tuned(pd, a, st, 0, false, |_| {})
    }

    /// [`create_st`](Self::create_st) with `mlx5dv_qp_create_flags`
    /// ([`crate::scatter_cqe::dv_flags`]), RC send WQEs with room for a
    /// memory-window bind when `bind` (`Pd::create_qp_for_mw`,
    /// `Pd::create_qp_dv`), `tune`
    /// setting more of the QPC (a DCI's stream fields: `crate::dc`).
    pub(crate) fn create_tuned(
        pd: &Arc<PdInner>,
        a: &QpInitAttr<'_>,
        st: u8,
        flags: u32,
        bind: bool,
        tune: impl FnOnce(&mut [u8]),
    ) -> Result<Self> {
        let ctx = &pd.ctx;
        let cs = crate::scatter_cqe::qpc_cs(crate::scatter_cqe::CsAsk {
            qp_type: a.qp_type,
            st,
            scqe_bytes: a.send_cq.shared.cqe_bytes,
            rcqe_bytes: a.recv_cq.shared.cqe_bytes,
            sq_sig_all: a.sq_sig_all,
            flags,
        });
        let max_wqes = ctx.hca.caps().max_qp_sz()?;
        let sizes = QpSizes::for_st(a.cap, a.qp_type, a.srq.is_some(), max_wqes, st, bind)?;
        let bufs = QpBufs::alloc(ctx, &sizes)?;
        let srq = a.srq.map(|s| s.shared.clone());
        let mut inb = create_qp_input(pd, a, &sizes, &bufs, srq.as_deref(), st, cs);
        tune(&mut inb[create_qp_in::QPC.off / 8..]);
        let qpn = match ctx.hca.cmd().exec(&inb, create_qp_out::SIZE_BYTES) {
            Ok(out) => CreateQpOut::new_unchecked(&out[..]).qpn(),
            Err(e) => {
                ctx.release_bfreg(bufs.bfreg);
                return Err(e);
            }
        };
        let track = WqTrack::with_srq(qpn, sizes.sq_cnt, sizes.rq_cnt, srq.as_ref());
        let (sq, rq) = match wire_rings(ctx, a, &sizes, &bufs, &track) {
            Ok(rings) => rings,
            Err(e) => {
                destroy_qp_cmd(ctx, qpn);
                ctx.release_bfreg(bufs.bfreg);
                return Err(e);
            }
        };
        if let Err(e) = scatter_views(&sizes, &bufs, &track, cs) {
            destroy_qp_cmd(ctx, qpn);
            ctx.release_bfreg(bufs.bfreg);
            return Err(e);
        }
        a.send_cq.shared.attach(qpn, track.clone());
        a.recv_cq.shared.attach(qpn, track);
        let wqes = crate::odp::QpMem::new(
            &bufs.region,
            sizes.sq_base(),
            sizes.sq_cnt,
            sizes.rq_stride,
            sizes.rq_cnt,
            a.qp_type == QpType::Ud || st == QPC_ST_DCI,
        );
        ctx.odp.qp_created(qpn, wqes);
        let cap = sizes.granted(a.cap);
        Ok(Qp {
            qpn,
            qp_type: a.qp_type,
            // A DCI's WQEs name their target: never the direct WRITE.
            rdma_write_direct: a.qp_type != QpType::Ud && st != QPC_ST_DCI && cap.max_send_sge != 0,
            st,
            state: QpState::Reset,
            ctx: ctx.clone(),
            cmd: ctx.hca.cmd().clone(),
            pd: pd.clone(),
            send_cq: a.send_cq.shared.clone(),
            recv_cq: a.recv_cq.shared.clone(),
            _srq: srq,
            sq,
            rq,
            cap,
            wqe_bytes: sizes.wqe_bbs * BB as u32,
            bfreg: Some(bufs.bfreg),
            region: bufs.region,
            dbrec: bufs.dbrec,
            destroyed: false,
        })
    }

    /// Whether the QP is a DC initiator (made by [`Pd::create_dci`]):
    /// its WQEs name their target ([`crate::wr::WrBatch::set_dc_addr`],
    /// [`Qp::post_send_deferred_dc`]) and it moves between states as
    /// [`crate::dc::dci_transition_masks`] allows.
    ///
    /// [`Pd::create_dci`]: crate::pd::Pd::create_dci
    pub fn is_dci(&self) -> bool {
        self.st == QPC_ST_DCI
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
        let masks = if self.is_dci() {
            crate::dc::dci_transition_masks(from, to)
        } else {
            transition_masks(self.qp_type, from, to)
        };
        let (req, opt) = masks.ok_or(Error::Invalid("no such QP state transition"))?;
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
        let inb = self.transition_input(op, attr, mask)?;
        // Every transition's output is a bare status and syndrome.
        self.ctx.hca.cmd().exec(&inb, rst2init_qp_out::SIZE_BYTES)?;
        if to == QpState::Reset {
            self.reset_rings();
        }
        self.state = to;
        Ok(())
    }

    /// One transition command without verbs' mask checks (the UMR QP's
    /// RST2INIT / INIT2RTR / RTR2RTS, which verbs has no table for).
    pub(crate) fn transition_raw(
        &mut self,
        op: Opcode,
        to: QpState,
        attr: &QpAttr,
        mask: u32,
    ) -> Result<()> {
        let inb = self.transition_input(op, attr, mask)?;
        self.ctx.hca.cmd().exec(&inb, rst2init_qp_out::SIZE_BYTES)?;
        if to == QpState::Reset {
            self.reset_rings();
        }
        self.state = to;
        Ok(())
    }

    /// The device took the QP out of service (destroyed, or in RESET):
    /// its CQEs still in its CQs go before the poller returns them, as
    /// libmlx5's `mlx5_cq_clean` (`crate::cq`'s `clean`).
    fn clean_cqs(&self) {
        // A dropped receive CQE gives its WQE back to the SRQ (only
        // receive CQEs do, so one request serves a CQ for both).
        let srq = self._srq.clone();
        if Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.send_cq.clean(self.qpn, srq);
        } else {
            self.send_cq.clean(self.qpn, None);
            self.recv_cq.clean(self.qpn, srq);
        }
    }

    fn reset_rings(&mut self) {
        // After 2RST the device starts the queues at 0 again; both
        // doorbell-record counters go back to 0 (without a receive queue
        // of its own the QP never writes the receive counter). What the
        // old queues completed leaves the CQs.
        self.clean_cqs();
        self.sq.reset();
        if let Some(rq) = &mut self.rq {
            rq.reset();
        }
    }

    fn transition_input(&self, op: Opcode, a: &QpAttr, mask: u32) -> Result<Vec<u8>> {
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
                    q.set_atomic_mode(QPC_ATOMIC_MODE_IB_SPEC);
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
                if self.ctx.gid(ah.sgid_index.into()).is_none() {
                    return Err(Error::Invalid("source GID index names no GID"));
                }
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
            // Optional parameters only in transitions that take them.
            let opt_ok = !matches!(op, Opcode::Rst2InitQp);
            i.set_opt_param_mask(if opt_ok { opt } else { 0 });
        }
        Ok(inb)
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
        self.ctx.odp.qp_gone(self.qpn);
        if r.is_ok() {
            self.clean_cqs();
        }
        self.send_cq.detach(self.qpn);
        self.recv_cq.detach(self.qpn);
        if let Some(b) = self.bfreg.take() {
            self.ctx.release_bfreg(b);
        }
        r
    }
}

fn destroy_qp_cmd(ctx: &Ctx, qpn: u32) {
    ctx.odp.qp_gone(qpn);
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
