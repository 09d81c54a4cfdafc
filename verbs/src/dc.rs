//! Dynamically Connected transport (mlx5dv's DC): the DC target [`Dct`]
//! and the DC initiator [`Dci`], with or without DCI streams.
//!
//! A DCT receives from any DCI that knows its number and DC access key:
//! CREATE_DCT on a PD, a CQ and an SRQ (its receives), with the key, the
//! remote access rights and the path's MTU, GID index, traffic class, flow
//! label and hop limit (mlx5_ib's `create_dct` and `mlx5_ib_modify_dct`
//! fill the same `dctc` fields over RST2INIT and INIT2RTR; here they are
//! given at once). QUERY_DCT, DRAIN_DCT, ARM_DCT_FOR_KEY_VIOLATION and
//! DESTROY_DCT (drained first, as `mlx5_core_destroy_dct`).
//!
//! A DCI is a QP of service type DCI (qpc `st` 5) with no receive queue,
//! moved to RTS as mlx5_ib's `modify_dci_qp_is_ok` allows (RST2INIT: port
//! and P_Key index; INIT2RTR: MTU; RTR2RTS: timeout, retries, send PSN).
//! Each WQE names its target: [`crate::wr::WrBatch::set_dc_addr`] /
//! `set_dc_addr_stream` (rdma-core's `mlx5dv_wr_set_dc_addr[_stream]`) or
//! [`Dci::post_send`] with a [`DcAv`]. With streams
//! (`log_num_dci_stream_channels`, `log_num_dci_errored_streams`, bounded
//! by the caps), an error on one stream errors only that stream until the
//! errored-stream limit; [`Dci::stream_id_reset`] is rdma-core's
//! `mlx5dv_dci_stream_id_reset` (RTS2RTS with the QPC extension).

use std::sync::Arc;

use mlx5_hw::ifc::*;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::*;
use mlx5_hw::wqe as w;

use crate::ah::Ah;
use crate::cq::{Cq, CqShared};
use crate::device::Ctx;
use crate::pd::{Pd, PdInner};
use crate::qp::{attr_mask, AhAttr, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};
use crate::srq::{Srq, SrqShared};
use crate::wq::WqTrack;
use crate::wr::{PostError, SendWr};
use crate::{Error, Result};

/// What a DCT is made with (`ibv_qp_init_attr` + `mlx5dv_dc_init_attr`
/// + the RST2INIT / INIT2RTR attributes mlx5_ib puts in the `dctc`).
#[derive(Debug)]
pub struct DctInitAttr<'a> {
    /// Receive completions.
    pub cq: &'a Cq,
    /// Where the receives come from.
    pub srq: &'a Srq,
    /// The DC access key a DCI must present.
    pub access_key: u64,
    /// `IBV_ACCESS_REMOTE_*` bits.
    pub access_flags: u32,
    /// Path MTU (IBV_MTU_*: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// Minimum RNR NAK timer (IB encoding).
    pub min_rnr_timer: u8,
    /// GID index, traffic class, flow label, hop limit, SL (the `ah_attr`).
    pub ah_attr: AhAttr,
    /// P_Key index.
    pub pkey_index: u16,
    /// `mlx5dv_qp_create_flags` ([`crate::scatter_cqe::dv_flags`]): with
    /// `DISABLE_SCATTER_TO_CQE` received SENDs always go to the SRQ's
    /// buffer; without it, on a CQ of 128-byte CQEs, up to 64 bytes come
    /// in the CQE (`crate::scatter_cqe`).
    pub create_flags: u32,
}

/// What QUERY_DCT reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DctAttr {
    /// `MLX5_DCTC_STATE_*`.
    pub state: u8,
    /// The DC access key.
    pub access_key: u64,
    /// DC access key violations seen.
    pub key_violations: u32,
    /// Path MTU (IBV_MTU_*).
    pub path_mtu: u8,
    /// The SRQ and CQ.
    pub srqn: u32,
    /// CQ number.
    pub cqn: u32,
}

/// A DC target.
#[derive(Debug)]
pub struct Dct {
    dctn: u32,
    ctx: Arc<Ctx>,
    _pd: Arc<PdInner>,
    cq: Arc<CqShared>,
    _srq: Arc<SrqShared>,
    destroyed: bool,
}

impl Pd {
    /// A DCT (`mlx5dv_create_qp` with `MLX5DV_DCTYPE_DCT`, then moved to
    /// RTR, which is when mlx5_ib sends CREATE_DCT).
    pub fn create_dct(&self, a: &DctInitAttr<'_>) -> Result<Dct> {
        let ctx = &self.inner.ctx;
        if !ctx.hca.caps().gen().dct() {
            return Err(Error::Invalid("the device has no DCT (cap dct)"));
        }
        if !(1..=5).contains(&a.path_mtu) {
            return Err(Error::Invalid("path MTU"));
        }
        if ctx.gid(a.ah_attr.sgid_index.into()).is_none() {
            return Err(Error::Invalid("source GID index names no GID"));
        }
        let mut inb = vec![0u8; create_dct_in::SIZE_BYTES];
        create_dct_in::OPCODE.set(&mut inb, Opcode::CreateDct.to_raw().into());
        {
            use crate::mr::access::*;
            let c = &mut inb[create_dct_in::DCT_CONTEXT_ENTRY.off / 8..];
            let f = a.access_flags;
            dctc::PD.set(c, self.inner.pdn.into());
            dctc::SRQN_XRQN.set(c, a.srq.shared.srqn.into());
            dctc::CQN.set(c, a.cq.shared.cqn.into());
            dctc::DC_ACCESS_KEY.set(c, a.access_key);
            dctc::RRE.set(c, u64::from(f & REMOTE_READ != 0));
            dctc::RWE.set(c, u64::from(f & REMOTE_WRITE != 0));
            if f & REMOTE_ATOMIC != 0 {
                dctc::RAE.set(c, 1);
                dctc::ATOMIC_MODE.set(c, QPC_ATOMIC_MODE_IB_SPEC.into());
            }
            dctc::PKEY_INDEX.set(c, a.pkey_index.into());
            dctc::PORT.set(c, 1);
            dctc::MIN_RNR_NAK.set(c, a.min_rnr_timer.into());
            dctc::TCLASS.set(c, a.ah_attr.traffic_class.into());
            dctc::FLOW_LABEL.set(c, (a.ah_attr.flow_label & 0xf_ffff).into());
            dctc::MTU.set(c, a.path_mtu.into());
            dctc::MY_ADDR_INDEX.set(c, a.ah_attr.sgid_index.into());
            dctc::HOP_LIMIT.set(c, a.ah_attr.hop_limit.max(1).into());
            dctc::ETH_PRIO.set(c, (a.ah_attr.sl & 7).into());
            let cs_res = crate::scatter_cqe::dctc_cs_res(a.cq.shared.cqe_bytes, a.create_flags);
            dctc::CS_RES.set(c, cs_res.into());
        }
        let out = ctx.hca.cmd().exec(&inb, create_dct_out::SIZE_BYTES)?;
        let dctn = create_dct_out::DCTN.get(&out) as u32;
        // Receive completions name the DCT; their wr_ids are the SRQ's.
        let track = WqTrack::with_srq(dctn, 0, 0, Some(&a.srq.shared));
        a.cq.shared.attach(dctn, track);
        tracing::debug!(dctn, "CREATE_DCT");
        Ok(Dct {
            dctn,
            ctx: ctx.clone(),
            _pd: self.inner.clone(),
            cq: a.cq.shared.clone(),
            _srq: a.srq.shared.clone(),
            destroyed: false,
        })
    }
}

impl Dct {
    /// The DCT number a DCI addresses.
    pub fn dctn(&self) -> u32 {
        self.dctn
    }

    fn cmd(&self, op: Opcode, outlen: usize) -> Result<Vec<u8>> {
        let mut inb = vec![0u8; query_dct_in::SIZE_BYTES];
        query_dct_in::OPCODE.set(&mut inb, op.to_raw().into());
        query_dct_in::DCTN.set(&mut inb, self.dctn.into());
        self.ctx.hca.cmd().exec(&inb, outlen)
    }

    /// QUERY_DCT.
    pub fn query(&self) -> Result<DctAttr> {
        let out = self.cmd(Opcode::QueryDct, query_dct_out::SIZE_BYTES)?;
        let c = out
            .get(query_dct_out::DCT_CONTEXT_ENTRY.off / 8..)
            .ok_or(Error::Invalid("QUERY_DCT output"))?;
        Ok(DctAttr {
            state: dctc::STATE.get(c) as u8,
            access_key: dctc::DC_ACCESS_KEY.get(c),
            key_violations: dctc::DC_ACCESS_KEY_VIOLATION_COUNT.get(c) as u32,
            path_mtu: dctc::MTU.get(c) as u8,
            srqn: dctc::SRQN_XRQN.get(c) as u32,
            cqn: dctc::CQN.get(c) as u32,
        })
    }

    /// DRAIN_DCT: its connections close and it takes no new one; the
    /// device reports DCT_DRAINED (an async event).
    pub fn drain(&self) -> Result<()> {
        self.cmd(Opcode::DrainDct, drain_dct_out::SIZE_BYTES)
            .map(drop)
    }

    /// ARM_DCT_FOR_KEY_VIOLATION: the next DC access key violation raises
    /// one DCT_KEY_VIOLATION event.
    pub fn arm_key_violation(&self) -> Result<()> {
        let mut inb = vec![0u8; arm_dct_in::SIZE_BYTES];
        arm_dct_in::OPCODE.set(&mut inb, Opcode::ArmDctForKeyViolation.to_raw().into());
        arm_dct_in::DCT_NUMBER.set(&mut inb, self.dctn.into());
        self.ctx
            .hca
            .cmd()
            .exec(&inb, arm_dct_out::SIZE_BYTES)
            .map(drop)
    }

    /// Drains (unless draining) and destroys. `mlx5_core_destroy_dct`
    /// waits for DCT_DRAINED in between; this does not: connections still
    /// open end with the DCT (their DCIs' WQEs time out).
    pub fn destroy(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        if self.query().is_ok_and(|a| a.state == DCTC_STATE_ACTIVE) {
            self.drain()?;
        }
        self.cmd(Opcode::DestroyDct, destroy_dct_out::SIZE_BYTES)?;
        // Its receive CQEs still in the CQ go, their WQEs back to the SRQ.
        self.cq.clean(self.dctn, Some(self._srq.clone()));
        self.cq.detach(self.dctn);
        Ok(())
    }
}

impl Drop for Dct {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            tracing::warn!("DESTROY_DCT {:#x}: {e}", self.dctn);
        }
    }
}

/// DCI streams (`mlx5dv_dci_streams`): 2^`log_num_concurent` streams, the
/// DCI in error once 2^`log_num_errored` of them are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DciStreams {
    /// log2 of the streams.
    pub log_num_concurent: u8,
    /// log2 of the streams that may be in error at once.
    pub log_num_errored: u8,
}

/// What a DCI is made with.
#[derive(Debug)]
pub struct DciInitAttr<'a> {
    /// Send completions.
    pub send_cq: &'a Cq,
    /// Send capacities (no receive queue).
    pub cap: QpCap,
    /// Every send WR completes signaled.
    pub sq_sig_all: bool,
    /// Streams, if any.
    pub streams: Option<DciStreams>,
    /// `mlx5dv_qp_create_flags` ([`crate::scatter_cqe::dv_flags`]):
    /// `DISABLE_SCATTER_TO_CQE` keeps READ and atomic responses out of the
    /// CQE, as `Pd::create_qp_dv`.
    pub create_flags: u32,
}

/// How a DCI reaches RTS (its `ibv_modify_qp` attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DciPath {
    /// Path MTU (IBV_MTU_*).
    pub path_mtu: u8,
    /// Local ACK timeout (4.096 us * 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7: infinite).
    pub rnr_retry: u8,
    /// First send PSN.
    pub sq_psn: u32,
}

impl Qp {
    /// `mlx5dv_dci_stream_id_reset` on a DCI ([`Qp::is_dci`], in RTS):
    /// stream `stream_id` is out of error (RTS2RTS, `qpc_ext`,
    /// `opt_param_mask_95_32` naming `dci_stream_channel_id`). Any 16-bit
    /// id, as libmlx5 takes it: the device maps it to its channel and
    /// refuses a channel not in error, or a DCI made without streams.
    pub fn dci_stream_id_reset(&mut self, stream_id: u16) -> Result<()> {
        if !self.is_dci() {
            return Err(Error::Invalid("stream reset of a QP that is not a DCI"));
        }
        if self.state() != QpState::Rts {
            return Err(Error::Invalid("stream reset needs RTS"));
        }
        let mut inb = vec![0u8; rts2rts_qp_in::SIZE_BYTES];
        rts2rts_qp_in::OPCODE.set(&mut inb, Opcode::Rts2RtsQp.to_raw().into());
        rts2rts_qp_in::QPN.set(&mut inb, self.qp_num().into());
        rts2rts_qp_in::QPC_EXT.set(&mut inb, 1);
        rts2rts_qp_in::OPT_PARAM_MASK_95_32.set(&mut inb, QPC_OPT_MASK_32_DCI_STREAM_CHANNEL_ID);
        let at = rts2rts_qp_in::QPC_DATA_EXT.off / 8;
        qpc_ext::DCI_STREAM_CHANNEL_ID.set(&mut inb[at..], stream_id.into());
        self.ctx
            .hca
            .cmd()
            .exec(&inb, rts2rts_qp_out::SIZE_BYTES)
            .map(drop)
    }
}

/// `(required, optional)` attribute masks of a DCI's transition, as
/// mlx5_ib's `modify_dci_qp_is_ok` checks them (its `STATE` aside): no
/// access flags, destination QPN or PSN of a peer, since a DCI has none;
/// `None` if the transition does not exist.
pub fn dci_transition_masks(from: QpState, to: QpState) -> Option<(u32, u32)> {
    use attr_mask::*;
    use QpState::*;
    Some(match (from, to) {
        (_, Reset) => (0, 0),
        (Reset, Err) => return None,
        (_, Err) => (0, 0),
        (Reset, Init) => (PKEY_INDEX | PORT, 0),
        (Init, Init) => (0, PKEY_INDEX | PORT),
        (Init, Rtr) => (PATH_MTU, PKEY_INDEX | AV),
        (Rtr, Rts) => (
            TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC | SQ_PSN,
            MIN_RNR_TIMER,
        ),
        (Rts, Rts) => (0, MIN_RNR_TIMER),
        _ => return None,
    })
}

/// A DC initiator.
#[derive(Debug)]
pub struct Dci {
    qp: Qp,
    streams: Option<DciStreams>,
}

impl Pd {
    /// A DCI (`mlx5dv_create_qp` with `MLX5DV_DCTYPE_DCI`), in RESET.
    pub fn create_dci(&self, a: &DciInitAttr<'_>) -> Result<Dci> {
        let caps = self.inner.ctx.hca.caps().gen();
        if !caps.dct() {
            return Err(Error::Invalid("the device has no DC (cap dct)"));
        }
        if let Some(s) = a.streams {
            // Only the caps bound them, as libmlx5 checks: more errored
            // streams than streams is taken (the DCI then never leaves
            // RTS for its streams' errors; rdma-core's test_mlx5_dc makes
            // such DCIs).
            if s.log_num_concurent > caps.log_max_dci_stream_channels()
                || s.log_num_errored > caps.log_max_dci_errored_streams()
            {
                return Err(Error::Invalid(
                    "DCI streams beyond log_max_dci_stream_channels / log_max_dci_errored_streams",
                ));
            }
        }
        let init = QpInitAttr {
            send_cq: a.send_cq,
            recv_cq: a.send_cq,
            srq: None,
            cap: QpCap {
                max_recv_wr: 0,
                max_recv_sge: 0,
                ..a.cap
            },
            qp_type: QpType::Rc,
            sq_sig_all: a.sq_sig_all,
        };
        use crate::scatter_cqe::dv_flags::*;
        let f = a.create_flags;
        if f & !(DISABLE_SCATTER_TO_CQE | ALLOW_SCATTER_TO_CQE) != 0
            || (f & DISABLE_SCATTER_TO_CQE != 0 && f & ALLOW_SCATTER_TO_CQE != 0)
        {
            return Err(Error::Invalid(
                "unsupported mlx5dv QP create flags for a DCI",
            ));
        }
        let streams = a.streams;
        let qp = Qp::create_tuned(&self.inner, &init, QPC_ST_DCI, f, false, |q| {
            if let Some(s) = streams {
                qpc::LOG_NUM_DCI_STREAM_CHANNELS.set(q, s.log_num_concurent.into());
                qpc::LOG_NUM_DCI_ERRORED_STREAMS.set(q, s.log_num_errored.into());
            }
        })?;
        Ok(Dci { qp, streams })
    }
}

/// A DCI WQE's target: the address vector with the DCT number and DC
/// access key in place, and the stream.
#[derive(Debug, Clone)]
pub struct DcAv {
    pub(crate) av: [u8; 48],
    pub(crate) stream: u16,
}

impl DcAv {
    /// DCT `dctn` at `ah`, with key `dc_key`, on stream `stream`.
    pub fn new(ah: &Ah, dctn: u32, dc_key: u64, stream: u16) -> Self {
        let mut av = *ah.av();
        let k = av::DC_KEY.off / 8;
        av[k..k + 8].copy_from_slice(&dc_key.to_be_bytes());
        let d = av::DQP_DCT.off / 8;
        av[d..d + 4].copy_from_slice(&(w::EXTENDED_UD_AV | (dctn & 0xff_ffff)).to_be_bytes());
        Self { av, stream }
    }
}

impl Dci {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// The state as last set (or found by [`query_state`](Self::query_state)).
    pub fn state(&self) -> QpState {
        self.qp.state()
    }

    /// The streams it was made with.
    pub fn streams(&self) -> Option<DciStreams> {
        self.streams
    }

    /// RESET to RTS, with the transitions mlx5_ib allows a DCI.
    pub fn to_rts(&mut self, p: &DciPath) -> Result<()> {
        use attr_mask::*;
        let a = QpAttr {
            path_mtu: p.path_mtu,
            timeout: p.timeout,
            retry_cnt: p.retry_cnt,
            rnr_retry: p.rnr_retry,
            sq_psn: p.sq_psn,
            port_num: 1,
            max_rd_atomic: 1,
            ..QpAttr::default()
        };
        self.qp
            .transition_raw(Opcode::Rst2InitQp, QpState::Init, &a, PKEY_INDEX | PORT)?;
        self.qp
            .transition_raw(Opcode::Init2RtrQp, QpState::Rtr, &a, PATH_MTU)?;
        let rts = TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC;
        self.qp
            .transition_raw(Opcode::Rtr2RtsQp, QpState::Rts, &a, rts)
    }

    /// The state the device holds (QUERY_QP): a DCI an error moved to ERR
    /// reads ERR; one whose stream failed stays RTS. The state is kept.
    pub fn query_state(&mut self) -> Result<QpState> {
        let mut inb = vec![0u8; query_qp_in::SIZE_BYTES];
        query_qp_in::OPCODE.set(&mut inb, Opcode::QueryQp.to_raw().into());
        query_qp_in::QPN.set(&mut inb, self.qp.qp_num().into());
        let outlen = query_qp_out::QPC.off / 8 + qpc::SIZE_BYTES;
        let out = self.qp.ctx.hca.cmd().exec(&inb, outlen)?;
        let c = out
            .get(query_qp_out::QPC.off / 8..)
            .ok_or(Error::Invalid("QUERY_QP output"))?;
        let s = match qpc::STATE.get(c) as u8 {
            QPC_STATE_RST => QpState::Reset,
            QPC_STATE_INIT => QpState::Init,
            QPC_STATE_RTR => QpState::Rtr,
            QPC_STATE_RTS => QpState::Rts,
            QPC_STATE_SQD => QpState::Sqd,
            QPC_STATE_SQER => QpState::Sqe,
            _ => QpState::Err,
        };
        self.qp.state = s;
        Ok(s)
    }

    /// `mlx5dv_dci_stream_id_reset`: stream `stream_id` is out of error
    /// ([`Qp::dci_stream_id_reset`]); a DCI made without streams is
    /// refused here.
    pub fn stream_id_reset(&mut self, stream_id: u16) -> Result<()> {
        if self.streams.is_none() {
            return Err(Error::Invalid("a DCI without streams"));
        }
        self.qp.dci_stream_id_reset(stream_id)
    }

    /// `ibv_post_send` on a DCI: each WR with its target; one doorbell.
    /// On failure the WRs before the failing one are posted.
    pub fn post_send(
        &mut self,
        wrs: &[(SendWr<'_>, DcAv)],
    ) -> std::result::Result<(), (usize, PostError)> {
        if self.qp.device_failed() {
            return Err((0, PostError::DeviceFailed));
        }
        if !matches!(self.qp.state(), QpState::Rts | QpState::Sqd) {
            return Err((0, PostError::BadState(self.qp.state())));
        }
        let max_inline = self.qp.cap().max_inline_data as usize;
        for (i, (wr, dc)) in wrs.iter().enumerate() {
            if let Err(e) = self.qp.send_ring().write_wr_dc(wr, max_inline, dc) {
                self.qp.send_ring().ring();
                return Err((i, e));
            }
        }
        self.qp.send_ring().ring();
        Ok(())
    }

    /// `ibv_wr_start` (then `set_dc_addr[_stream]` per WR).
    pub fn wr_start(&mut self) -> crate::wr::WrBatch<'_> {
        self.qp.wr_start()
    }

    /// Moves the DCI to ERR (its posted WRs flush).
    pub fn to_error(&mut self) -> Result<()> {
        let a = QpAttr::default();
        self.qp.transition_raw(Opcode::ToErrQp, QpState::Err, &a, 0)
    }

    /// `ibv_destroy_qp`.
    pub fn destroy(self) -> Result<()> {
        self.qp.destroy()
    }

    /// The DCI as a plain [`Qp`] (the C library holds every QP so):
    /// [`Qp::modify`] takes a DCI's transitions
    /// ([`dci_transition_masks`]), the `wr_*` batch and
    /// [`Qp::post_send_deferred_dc`] its WRs with their targets;
    /// [`Qp::post_send`] refuses them (a WR without a target). Stream
    /// resets need the `Dci`.
    pub fn into_qp(self) -> Qp {
        self.qp
    }
}
