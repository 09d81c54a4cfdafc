//! The receive queue (mlx5_ib's `mlx5_ib_post_recv`, rdma-core's
//! `mlx5_post_recv`): each receive WQE is a list of data segments, a
//! short list ending with a segment whose lkey is
//! `MLX5_INVALID_LKEY`; the doorbell record's `rcv_counter` hands the
//! WQEs to the device. A QP with an SRQ has none (see [`crate::srq`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mlx5_hw::wqe as w;
use vfio::mmio::dma_wmb;
use vfio::{DmaBuffer, DmaRing};

use crate::wq::WqTrack;
use crate::wqe::DATA_SIZE;
use crate::wr::{PostError, RecvWr};
use crate::Result;

/// One doorbell-record counter (`__be32`), in bytes.
pub(crate) const DBREC_SIZE: usize = std::mem::size_of::<u32>();

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
    /// The receive queue at offset `base` of `buf`: `cnt` WQEs of `stride`
    /// bytes (both powers of two, the stride a multiple of a data
    /// segment); its counter at `MLX5_RCV_DBR` of the doorbell record at
    /// `dbrec_off` of `dbrec`.
    pub(crate) fn new(
        buf: Arc<DmaBuffer>,
        base: usize,
        stride: usize,
        cnt: u32,
        dbrec: Arc<DmaBuffer>,
        dbrec_off: usize,
        track: Arc<WqTrack>,
    ) -> Result<Self> {
        let per_wqe = (stride / DATA_SIZE) as u32;
        Ok(Self {
            segs: DmaRing::new(buf, base, cnt * per_wqe)?,
            log_segs: per_wqe.trailing_zeros(),
            max_sge: per_wqe as usize,
            mask: cnt - 1,
            pc: 0,
            dbrec: DmaRing::new(dbrec, dbrec_off + DBREC_SIZE * w::RCV_DBR, 1)?,
            track,
        })
    }

    /// Back to an empty queue at counter 0 (after a transition to RESET),
    /// the doorbell record's `rcv_counter` too.
    pub(crate) fn reset(&mut self) {
        self.pc = 0;
        self.track.rq_tail.store(0, Ordering::Release);
        self.dbrec.store_u32_be_at::<0>(0, 0);
    }

    #[inline]
    pub(crate) fn post(&mut self, wr: &RecvWr<'_>) -> std::result::Result<(), PostError> {
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
        // staging copy. An entry of length 0 is left out, as libmlx5's
        // `mlx5_post_recv` leaves it out: a byte count of 0 means 2 GiB to
        // the device. A short list ends with a zero-length segment whose
        // lkey is MLX5_INVALID_LKEY, as rdma-core writes it.
        let mut j = 0u32;
        for s in wr.sg_list.iter().filter(|s| s.length != 0) {
            let words = [
                ((u64::from(s.length) << 32) | u64::from(s.lkey)).to_be(),
                s.addr.to_be(),
            ];
            self.segs
                .store_words_at::<0, 2>(base.wrapping_add(j), &words);
            j += 1;
        }
        if (j as usize) < self.max_sge {
            let words = [u64::from(w::TERMINATE_SCATTER_LIST_LKEY).to_be(), 0];
            self.segs
                .store_words_at::<0, 2>(base.wrapping_add(j), &words);
        }
        self.track.rq_wrid[slot].store(wr.wr_id, Ordering::Relaxed);
        self.pc = self.pc.wrapping_add(1);
        Ok(())
    }

    #[inline]
    pub(crate) fn ring(&self) {
        // The WQEs are in memory before the record says so.
        dma_wmb();
        self.dbrec
            .store_u32_be_at::<0>(0, u32::from(self.pc as u16));
    }
}
