//! The verbs data path over queues DevX created: a CQ or QP made by a raw
//! CREATE_CQ / CREATE_QP with its rings and doorbell records in UMEMs is
//! polled and posted to by the same code as a verbs [`crate::cq::Cq`] and
//! [`crate::qp::Qp`] ([`CqRing`], [`SendRing`], the receive ring,
//! [`cqe_to_wc`]), as a DPDK-style user mixes raw objects with the verbs
//! fast path (rdma-core's `mlx5dv_init_obj` hands the same rings out).
//!
//! The caller says where the rings are (what it put in the create
//! command); firmware's answer (the CQ or QP number) comes from the
//! [`DevxObj`]. Doorbells go through a UAR page of the context's
//! ([`DevxUar`]).

use std::collections::HashMap;
use std::sync::Arc;

use mlx5_hw::cqe::{self as c, CqeOpcode};
use mlx5_hw::ifc::{alloc_uar_in, alloc_uar_out, create_cq_out, create_qp_out, dealloc_uar_in};
use mlx5_hw::ifc::{general_obj_in_cmd_hdr, AllocUarOut};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::uar::{BF_OFFSET, UAR_PAGE_SIZE};
use mlx5_hw::wqe as w;
use vfio::{DmaBuffer, DmaRing, Mmio};

use super::{DevxCtx, DevxObj, DESTROY_OUT};
use crate::cq::{cqe_to_wc, CqRing, CqeFields, Wc, WcStatus};
use crate::device::Context;
use crate::qp::{QpType, MAX_INLINE};
use crate::rq::{RecvRing, DBREC_SIZE};
use crate::wq::WqTrack;
use crate::wqe::{SendRing, DATA_SIZE};
use crate::wr::{Payload, PostError, RecvWr, SendWr};
use crate::{Error, Result};

/// A UAR page allocated under a user context (`mlx5dv_devx_alloc_uar`):
/// `uar_page` of the queues created over it, and where their doorbells go.
#[derive(Debug)]
pub struct DevxUar {
    ctx: Context,
    uid: u16,
    index: u32,
}

impl DevxCtx {
    /// `mlx5dv_devx_alloc_uar`: ALLOC_UAR under the context's uid.
    pub fn alloc_uar(&self) -> Result<DevxUar> {
        let mut c = vec![0u8; alloc_uar_in::SIZE_BYTES];
        general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::AllocUar.to_raw()));
        let out = self.general_cmd(&c, alloc_uar_out::SIZE_BYTES)?;
        let index = AllocUarOut::new_unchecked(&out[..]).uar();
        let u = DevxUar {
            ctx: self.ctx.clone(),
            uid: self.uid,
            index,
        };
        if (index as usize + 1) * UAR_PAGE_SIZE > self.ctx.hca().bar().len() {
            return Err(Error::BadOutput {
                opcode: Opcode::AllocUar,
                what: "UAR index beyond BAR0",
            });
        }
        Ok(u)
    }
}

impl DevxUar {
    /// The UAR index (`cqc.uar_page`, `qpc.uar_page`).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The UAR page in this process (`mlx5dv_devx_uar.base_addr`; its
    /// doorbell register, `reg_addr`, is at `mlx5_hw::uar::BF_OFFSET`):
    /// for a program that rings the doorbells of queues it made by raw
    /// commands itself. Valid while this UAR and its context live.
    pub fn page_addr(&self) -> Result<*mut u8> {
        Ok(self.bar().addr_of(self.offset(), UAR_PAGE_SIZE)?)
    }

    fn bar(&self) -> Arc<Mmio> {
        self.ctx.hca().bar().clone()
    }

    fn offset(&self) -> usize {
        self.index as usize * UAR_PAGE_SIZE
    }
}

impl Drop for DevxUar {
    fn drop(&mut self) {
        let mut c = vec![0u8; dealloc_uar_in::SIZE_BYTES];
        general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::DeallocUar.to_raw()));
        general_obj_in_cmd_hdr::UID.set(&mut c, u64::from(self.uid));
        dealloc_uar_in::UAR.set(&mut c, u64::from(self.index));
        if let Err(e) = self.ctx.hca().cmd().exec(&c, DESTROY_OUT) {
            tracing::warn!(uar = self.index, "DEALLOC_UAR at drop: {e}");
        }
    }
}

/// Where a DevX CQ's rings are: what its CREATE_CQ put in `cq_umem_*`
/// and `dbr_umem_*`, as offsets in the buffers those UMEMs cover.
#[derive(Debug, Clone)]
pub struct DevxCqRings {
    /// The buffer the CQEs lie in.
    pub buf: Arc<DmaBuffer>,
    /// Where the first CQE is in `buf`.
    pub offset: usize,
    /// `cqc.log_cq_size` (64-byte CQEs).
    pub log_size: u8,
    /// The buffer the doorbell record lies in.
    pub dbr_buf: Arc<DmaBuffer>,
    /// Where the doorbell record is in `dbr_buf`.
    pub dbr_offset: usize,
}

/// A CQ created by a raw CREATE_CQ, polled as a verbs CQ is
/// (`ibv_poll_cq` over `mlx5dv_init_obj`'s `mlx5dv_cq`).
#[derive(Debug)]
pub struct DevxCq {
    ring: CqRing,
    qps: HashMap<u32, Arc<WqTrack>>,
}

impl DevxCq {
    /// The CQ `obj` (a CREATE_CQ's object) over `rings`, armed through
    /// `uar`: every CQE is set to INVALID and the doorbell record to zero,
    /// as software does before the device writes the first CQE.
    pub fn from_devx(obj: &DevxObj, rings: &DevxCqRings, uar: &DevxUar) -> Result<Self> {
        if obj.destroy_opcode() != Some(Opcode::DestroyCq) {
            return Err(Error::Invalid("not a CQ's DevX object"));
        }
        let cqn = create_cq_out::CQN.get(obj.create_out()) as u32;
        let n = 1u32 << rings.log_size.min(24);
        let ring = DmaRing::new(rings.buf.clone(), rings.offset, n)
            .map_err(|_| Error::Invalid("CQ ring outside its buffer"))?;
        let dbrec = DmaRing::new(rings.dbr_buf.clone(), rings.dbr_offset, 1)
            .map_err(|_| Error::Invalid("CQ doorbell record outside its buffer"))?;
        let invalid = [CqeOpcode::Invalid.to_raw() << c::CQE_OPCODE_SHIFT];
        for i in 0..n as usize {
            rings.buf.write(
                rings.offset + i * c::CQE_SIZE + c::CQE_OP_OWN_OFFSET,
                &invalid,
            )?;
        }
        rings.dbr_buf.write(rings.dbr_offset, &[0; 8])?;
        Ok(Self {
            ring: CqRing::from_rings(ring, dbrec, cqn, uar.bar(), uar.offset()),
            qps: HashMap::new(),
        })
    }

    /// Completions of `qp` are looked up here (a verbs CQ learns its QPs
    /// when they are created; a raw CREATE_QP names the CQ only to
    /// firmware).
    pub fn attach(&mut self, qp: &DevxQp) {
        self.qps.insert(qp.qpn, qp.track.clone());
    }

    /// `ibv_poll_cq`: up to `wc.len()` completions; one of a QP not
    /// attached comes back as a general error with its QP number.
    pub fn poll(&mut self, wc: &mut [Wc]) -> usize {
        let mut n = 0;
        while n < wc.len() {
            let Some(e) = self.ring.next_cqe() else {
                break;
            };
            let qpn = (e.tail() >> 32) as u32 & c::CQE_QPN_MASK;
            match self.qps.get(&qpn) {
                Some(t) => cqe_to_wc(&e, t, &mut wc[n]),
                None => {
                    tracing::warn!("CQE of QP {qpn:#x}, not attached to this DevX CQ");
                    wc[n] = Wc {
                        status: WcStatus::GeneralErr,
                        qp_num: qpn,
                        ..Wc::default()
                    };
                }
            }
            n += 1;
        }
        if n > 0 {
            self.ring.update_ci();
        }
        n
    }

    /// Arms the CQ for its next (or next solicited) completion.
    pub fn arm(&self, sn: u32, solicited_only: bool) -> Result<()> {
        let cmd = if solicited_only {
            crate::cq::CQ_DB_REQ_NOT_SOL
        } else {
            crate::cq::CQ_DB_REQ_NOT
        };
        self.ring.arm(sn, cmd)
    }
}

/// Where a DevX QP's rings are: what its CREATE_QP put in `wq_umem_*`,
/// `dbr_umem_*` and the QPC's queue sizes.
#[derive(Debug, Clone)]
pub struct DevxQpRings {
    /// The buffer the work queues lie in (receive queue first, then the
    /// send queue, as the device finds them).
    pub buf: Arc<DmaBuffer>,
    /// Where the receive queue starts in `buf`.
    pub offset: usize,
    /// `qpc.log_rq_size` (0 receive WQEs: `None`).
    pub log_rq_size: Option<u8>,
    /// `qpc.log_rq_stride` (16-byte units, log2).
    pub log_rq_stride: u8,
    /// `qpc.log_sq_size` (64-byte blocks).
    pub log_sq_size: u8,
    /// The buffer the doorbell record lies in.
    pub dbr_buf: Arc<DmaBuffer>,
    /// Where the doorbell record is in `dbr_buf`.
    pub dbr_offset: usize,
    /// Bytes of inline data a send WQE may carry (the SQ's WQEs wrap
    /// across blocks as needed).
    pub max_inline: usize,
}

/// An RC QP created by a raw CREATE_QP (and moved through its states by
/// raw commands), posted to as a verbs QP is.
#[derive(Debug)]
pub struct DevxQp {
    qpn: u32,
    sq: SendRing,
    rq: Option<RecvRing>,
    track: Arc<WqTrack>,
    max_inline: usize,
}

impl DevxQp {
    /// The QP `obj` (a CREATE_QP's object) over `rings`, ringing send
    /// doorbells on `uar`'s first BlueFlame register; the doorbell record
    /// starts at zero.
    pub fn from_devx(obj: &DevxObj, rings: &DevxQpRings, uar: &DevxUar) -> Result<Self> {
        if obj.destroy_opcode() != Some(Opcode::DestroyQp) {
            return Err(Error::Invalid("not a QP's DevX object"));
        }
        if rings.max_inline > MAX_INLINE || rings.log_sq_size > 16 || rings.log_rq_stride > 16 {
            return Err(Error::Invalid("DevX QP geometry beyond the driver's"));
        }
        let qpn = create_qp_out::QPN.get(obj.create_out()) as u32;
        let stride = DATA_SIZE << rings.log_rq_stride;
        let rq_cnt = rings.log_rq_size.map_or(0, |l| 1u32 << l.min(16));
        let sq_cnt = 1u32 << rings.log_sq_size;
        let track = WqTrack::new(qpn, sq_cnt, rq_cnt);
        rings.dbr_buf.write(rings.dbr_offset, &[0; 8])?;
        let rq_bytes = rq_cnt as usize * stride;
        let sq = SendRing::new(
            rings.buf.clone(),
            rings.offset + rq_bytes,
            rings.log_sq_size.into(),
            rings.dbr_buf.clone(),
            rings.dbr_offset + DBREC_SIZE * w::SND_DBR,
            uar.bar(),
            uar.offset() + BF_OFFSET,
            track.clone(),
        )?;
        let rq = if rq_cnt > 0 {
            Some(RecvRing::new(
                rings.buf.clone(),
                rings.offset,
                stride,
                rq_cnt,
                rings.dbr_buf.clone(),
                rings.dbr_offset,
                track.clone(),
            )?)
        } else {
            None
        };
        Ok(Self {
            qpn,
            sq,
            rq,
            track,
            max_inline: rings.max_inline,
        })
    }

    /// The QP number firmware gave.
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// `ibv_post_send` (the QP's state is the caller's: raw MODIFY
    /// commands moved it): every WR written, then one doorbell.
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
        for (i, wr) in wrs.iter().enumerate() {
            let r = match wr.payload {
                Payload::Sges(s) if s.len() > crate::qp::MAX_SGE => Err(PostError::TooLarge),
                _ => self.sq.write_wr(wr, QpType::Rc, self.max_inline),
            };
            if let Err(e) = r {
                self.sq.ring();
                return Err((i, e));
            }
        }
        self.sq.ring();
        Ok(())
    }

    /// `ibv_post_recv`.
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
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
}
