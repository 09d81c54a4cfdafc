//! Shared receive queues: CREATE_SRQ / DESTROY_SRQ, `ibv_post_srq_recv`.
//!
//! An SRQ is a ring of receive WQEs linked into a free list by their
//! next-WQE segments (`struct mlx5_wqe_srq_next_seg`), followed by data
//! segments. Posting takes the head of the list and bumps the doorbell
//! record's counter; a completion names the WQE by index (`wqe_counter`),
//! which goes back to the tail of the list. The SRQ is `Send + Sync`: its
//! state is behind a lock shared by posting and polling.

use std::sync::{Arc, Mutex};

use mlx5_hw::ifc::{arm_rq_in, arm_rq_out, ArmRqIn};
use mlx5_hw::ifc::{create_srq_in, create_srq_out, destroy_srq_in, destroy_srq_out};
use mlx5_hw::ifc::{query_srq_in, query_srq_out, srqc, QuerySrqIn};
use mlx5_hw::ifc::{wqe_srq_next_seg, CreateSrqIn, CreateSrqOut, DestroySrqIn};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::wqe as w;

use crate::buf::DmaSlice;
use crate::dbrec::Dbrec;
use crate::device::Ctx;
use crate::pd::{Pd, PdInner};
use crate::qp::{PostError, RecvWr};
use crate::{Error, Result};
use vfio::DmaRing;

const NEXT: usize = wqe_srq_next_seg::NEXT_WQE_INDEX.off / 8;
const SEG: usize = wqe_srq_next_seg::SIZE_BYTES;

#[derive(Debug)]
struct SrqState {
    head: u32,
    tail: u32,
    counter: u32,
    wrid: Vec<u64>,
    free: u32,
}

#[derive(Debug)]
pub(crate) struct SrqShared {
    pub(crate) srqn: u32,
    ctx: Arc<Ctx>,
    _pd: Arc<PdInner>,
    /// The queue's memory, written through `segs`; back to the arena after
    /// DESTROY_SRQ.
    region: DmaSlice,
    /// The doorbell record, written through `counter`.
    dbrec: Dbrec,
    /// The queue as 16-byte segments: WQE `n`'s next segment is entry
    /// `n << log_segs`, its data segments the entries after it.
    segs: DmaRing<SEG>,
    log_segs: u32,
    /// The doorbell record's receive counter.
    counter: DmaRing<4>,
    max_sge: usize,
    state: Mutex<SrqState>,
}

impl SrqShared {
    /// The WQE at `idx` completed: its wr_id; the WQE joins the free list.
    pub(crate) fn complete(&self, idx: u16) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let i = u32::from(idx) & (s.wrid.len() as u32 - 1);
        let id = s.wrid[i as usize];
        let tail = s.tail as usize;
        self.segs
            .store_u16_be_at::<NEXT>((tail as u32) << self.log_segs, i as u16);
        s.tail = i;
        s.free += 1;
        id
    }

    /// Copies bytes that came in a CQE (scatter to CQE) into the data
    /// segments of WQE `idx`, as libmlx5's `mlx5_copy_to_recv_srq`:
    /// success, or `IBV_WC_LOC_LEN_ERR` when they hold less.
    pub(crate) fn copy_to_wqe(&self, idx: u16, data: &[u8]) -> crate::cq::WcStatus {
        let n = self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .wrid
            .len() as u32;
        let first = (u32::from(idx) & (n - 1)) << self.log_segs;
        crate::scatter_cqe::copy_to_segments(&self.segs, first, 1..1 << self.log_segs, data)
    }

    fn post(&self, wr: &RecvWr<'_>) -> std::result::Result<(), PostError> {
        if wr.sg_list.len() > self.max_sge {
            return Err(PostError::TooLarge);
        }
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // One WQE stays in the list as its tail (mlx5: head == tail is full).
        if s.free <= 1 {
            return Err(PostError::QueueFull);
        }
        let i = s.head as usize;
        let base = s.head << self.log_segs;
        let next = self.segs.load_u16_be_at::<NEXT>(base);
        // Data segments after the next segment, two words each
        // (byte_count:lkey, addr); a short list ends with a zero-length
        // segment whose lkey is MLX5_INVALID_LKEY.
        for (k, g) in wr.sg_list.iter().enumerate() {
            let words = [
                ((u64::from(g.length) << 32) | u64::from(g.lkey)).to_be(),
                g.addr.to_be(),
            ];
            self.segs
                .store_words_at::<0, 2>(base.wrapping_add(1 + k as u32), &words);
        }
        if wr.sg_list.len() < self.max_sge {
            let words = [u64::from(w::TERMINATE_SCATTER_LIST_LKEY).to_be(), 0];
            let end = base.wrapping_add(1 + wr.sg_list.len() as u32);
            self.segs.store_words_at::<0, 2>(end, &words);
        }
        s.wrid[i] = wr.wr_id;
        s.head = u32::from(next) & (s.wrid.len() as u32 - 1);
        s.free -= 1;
        s.counter = s.counter.wrapping_add(1);
        vfio::mmio::dma_wmb();
        self.counter.store_u32_be_at::<0>(0, s.counter & 0xffff);
        Ok(())
    }
}

impl Drop for SrqShared {
    fn drop(&mut self) {
        self.ctx.odp.srq_gone(self.srqn);
        let mut inb = [0u8; destroy_srq_in::SIZE_BYTES];
        DestroySrqIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DestroySrq.to_raw())
            .set_srqn(self.srqn);
        if let Err(e) = self.ctx.hca.cmd().exec(&inb, destroy_srq_out::SIZE_BYTES) {
            tracing::warn!("DESTROY_SRQ {:#x}: {e}", self.srqn);
            // The device may still read WQEs: the memory stays out of use.
            self.region.device_may_still_use();
            self.dbrec.device_may_still_use();
        }
    }
}

/// A shared receive queue (`struct ibv_srq`).
#[derive(Debug, Clone)]
pub struct Srq {
    pub(crate) shared: Arc<SrqShared>,
}

impl Pd {
    /// `ibv_create_srq` with at least `max_wr` WQEs of `max_sge` entries.
    ///
    /// `max_wr` and `max_sge` of 0 are taken, as libmlx5 and mlx5_ib take
    /// them: a queue of one WQE (the list's tail: no receive fits) and a
    /// WQE of one entry (`mlx5_alloc_srq_buf`'s 32-byte minimum).
    /// [`Srq::max_wr`] and [`Srq::max_sge`] say what was made.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let ctx = &self.inner.ctx;
        if max_sge as usize >= crate::qp::MAX_SGE {
            return Err(Error::Invalid("SRQ capacities"));
        }
        let n = max_wr
            .checked_add(1)
            .and_then(u32::checked_next_power_of_two)
            .ok_or(Error::Invalid("max_wr beyond the device's"))?;
        if n > ctx.hca.caps().max_srq_sz()? {
            return Err(Error::Invalid("max_wr beyond the device's"));
        }
        let stride = (SEG + 16 * max_sge.max(1) as usize).next_power_of_two();
        let dma = ctx.hca.dma();
        let region = dma.alloc_buf(n as usize * stride)?;
        let dbrec = dma.alloc_dbrec()?;
        for i in 0..n {
            let next = ((i + 1) % n) as u16;
            region.write(i as usize * stride + NEXT, &next.to_be_bytes())?;
        }
        let mut inb = vec![0u8; create_srq_in::SIZE_BYTES + 8];
        {
            let mut c = CreateSrqIn::new_unchecked(&mut inb[..]);
            c.set_opcode(Opcode::CreateSrq.to_raw());
            c.srq_context_entry_mut()
                .set_log_srq_size(n.trailing_zeros() as u8)
                .set_log_rq_stride((stride.trailing_zeros() - 4) as u8)
                .set_pd(self.inner.pdn)
                .set_log_page_size((region.len().trailing_zeros() - 12) as u8)
                .set_dbr_addr(dbrec.iova().0);
            c.set_pas(0, region.iova().0);
        }
        let segs = region.ring(0, n * (stride / SEG) as u32)?;
        let counter = dbrec.ring(4 * w::RCV_DBR)?;
        let out = ctx.hca.cmd().exec(&inb, create_srq_out::SIZE_BYTES)?;
        let srqn = CreateSrqOut::new_unchecked(&out[..]).srqn();
        // The page-fault handler reads its WQEs (ODP receive buffers).
        ctx.odp.srq_created(srqn, &region, stride, n);
        Ok(Srq {
            shared: Arc::new(SrqShared {
                srqn,
                ctx: ctx.clone(),
                _pd: self.inner.clone(),
                region,
                dbrec,
                segs,
                log_segs: (stride / SEG).trailing_zeros(),
                counter,
                max_sge: (stride - SEG) / 16,
                state: Mutex::new(SrqState {
                    head: 0,
                    tail: n - 1,
                    counter: 0,
                    wrid: vec![0; n as usize],
                    free: n,
                }),
            }),
        })
    }
}

impl Srq {
    /// The receives it holds at once (at least those asked for).
    pub fn max_wr(&self) -> u32 {
        let s = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        // One WQE stays in the list as its tail.
        s.wrid.len() as u32 - 1
    }

    /// The entries a receive WQE holds (at least those asked for).
    pub fn max_sge(&self) -> u32 {
        self.shared.max_sge as u32
    }

    /// The SRQ number.
    pub fn srqn(&self) -> u32 {
        self.shared.srqn
    }

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: ARM_RQ with the low watermark
    /// `limit`; the device raises SRQ_RQ_LIMIT
    /// ([`crate::device::AsyncEventKind::SrqLimitReached`]) once when fewer
    /// WQEs than that are posted, and disarms. 0 disarms; a limit of the
    /// SRQ's size or more is refused (the device's BAD_PARAMETER).
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let lwm = u16::try_from(limit).map_err(|_| Error::Invalid("SRQ limit"))?;
        let mut inb = [0u8; arm_rq_in::SIZE_BYTES];
        ArmRqIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::ArmRq.to_raw())
            .set_op_mod(mlx5_hw::qp::ARM_RQ_IN_OP_MOD_SRQ)
            .set_srq_number(self.shared.srqn)
            .set_lwm(lwm);
        self.shared
            .ctx
            .hca
            .cmd()
            .exec(&inb, arm_rq_out::SIZE_BYTES)
            .map(drop)
    }

    /// The armed limit as the device holds it (QUERY_SRQ's `lwm`, as
    /// `ibv_query_srq`'s `srq_limit` in mlx5): 0 once the limit event
    /// fired, which disarms it.
    pub fn limit(&self) -> Result<u32> {
        let mut inb = [0u8; query_srq_in::SIZE_BYTES];
        QuerySrqIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::QuerySrq.to_raw())
            .set_srqn(self.shared.srqn);
        let out = self
            .shared
            .ctx
            .hca
            .cmd()
            .exec(&inb, query_srq_out::SIZE_BYTES)?;
        let at = query_srq_out::SRQ_CONTEXT_ENTRY.off / 8;
        let c = out
            .get(at..at + srqc::SIZE_BYTES)
            .ok_or(Error::Invalid("QUERY_SRQ output"))?;
        Ok(srqc::LWM.get(c) as u32)
    }

    /// `ibv_post_srq_recv`.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), (usize, PostError)> {
        if self.shared.ctx.hca.cmd().is_failed() {
            return Err((0, PostError::DeviceFailed));
        }
        for (i, wr) in wrs.iter().enumerate() {
            self.shared.post(wr).map_err(|e| (i, e))?;
        }
        Ok(())
    }
}
