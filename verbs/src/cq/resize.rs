//! CQ resize (`ibv_resize_cq`): MODIFY_CQ with `op_mod` RESIZE, as
//! libmlx5's `mlx5_resize_cq` and mlx5_ib's `mlx5_ib_resize_cq` do it.
//!
//! 1. A new ring (every CQE INVALID), the same doorbell record.
//! 2. MODIFY_CQ names it (`log_cq_size`, `cqe_sz`, page size and offset,
//!    the PAS list). The device writes a RESIZE_CQ CQE into the old ring at
//!    its producer index, and every later CQE into the new ring, from the
//!    next index on.
//! 3. The CQEs not yet polled are copied from the old ring into the new
//!    one up to that RESIZE_CQ CQE, each one index later (so that the
//!    RESIZE_CQ CQE's index is the one skipped), with the new ring's owner
//!    bit for the place it lands in (libmlx5's `mlx5_cq_resize_copy_cqes`);
//!    the consumer index steps past the RESIZE_CQ CQE.
//! 4. The old ring is freed: the device writes no more to it.
//!
//! The poller owns the consumer index, so a resize takes `&mut Cq`; cleanings
//! filed by QPs (`clean`) are carried out first, since their stop indexes
//! are in the old ring's counting.

use std::sync::atomic::Ordering;

use mlx5_hw::cqe::{self as c, CqeOpcode};
use mlx5_hw::ifc::{modify_cq_out, ModifyCqIn};
use mlx5_hw::opcode::Opcode;

use super::{Cq, CqRing, OP_OWN};
use crate::{Error, Result};

impl Cq {
    /// `ibv_resize_cq`: room for at least `cqe` completions (rounded as at
    /// creation: the next power of two above `cqe`). A size that rounds to
    /// the current one changes nothing. Refused (`Invalid`) for 0, past the
    /// device's maximum, or fewer entries than completions not yet polled
    /// plus the send blocks of the CQ's QPs rung and not yet completed (an
    /// upper bound of the send completions to come; receives are not
    /// counted: they complete only when a peer sends).
    pub fn resize(&mut self, cqe: u32) -> Result<()> {
        let ctx = self.shared.ctx.clone();
        let max = ctx.hca.caps().max_cq_sz()?;
        if cqe == 0 || cqe >= max {
            return Err(Error::Invalid("CQ size out of range"));
        }
        let n = (cqe + 1).next_power_of_two();
        if n - 1 == self.cqe() {
            return Ok(());
        }
        // The QPs' cleanings first: they count in the old ring. The view
        // the QPs' cleaning requests scan stays locked until it shows the
        // new ring, so that no request is filed against the old ring's
        // counting after this (`clean::CqPeek::request`).
        let shared = self.shared.clone();
        let mut view = shared.peek.hold();
        let cleans = shared.peek.take();
        if !cleans.is_empty() {
            self.ring.clean(&cleans);
        }
        // What is written and not polled, and what the sends already rung
        // will still write (on a card they complete within microseconds;
        // the model may lag): a ring smaller than that would overrun.
        let in_flight: u32 = self
            .shared
            .qps
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|t| t.sends_in_flight())
            .sum();
        if self.ring.outstanding() + in_flight >= n {
            return Err(Error::Invalid(
                "CQ resize below its outstanding completions and sends in flight",
            ));
        }
        let bytes = self.shared.cqe_bytes;
        let per = (bytes / c::CQE_SIZE) as u32;
        let region = super::alloc_ring(&ctx, n, bytes)?;
        let mut ring = CqRing::from_rings(
            region.ring(0, n * per)?,
            self.ring.dbrec.clone(),
            self.ring.cqn,
            self.ring.uar.clone(),
            self.ring.uar_off,
        );
        if per == 2 {
            ring.set_cqe_128();
        }
        if let Err(e) = self.modify_cq_resize(&ring, &region) {
            if matches!(e, Error::Timeout { .. }) {
                // The device may have switched to the new ring: its memory
                // stays out of use.
                region.device_may_still_use();
            }
            return Err(e);
        }
        // The device writes the new ring from now on: switch whatever the
        // copy found, as libmlx5 does.
        ring.ci = self.copy_to_resized(&ring);
        self.ring = ring;
        self.ring.update_ci();
        view.set_ring(&self.ring);
        drop(view);
        *self.shared.region.lock().unwrap_or_else(|p| p.into_inner()) = region;
        self.shared.cqe.store(n - 1, Ordering::Relaxed);
        Ok(())
    }

    /// MODIFY_CQ, `op_mod` RESIZE, to `ring` in `region`.
    fn modify_cq_resize(&self, ring: &CqRing, region: &crate::buf::DmaSlice) -> Result<()> {
        let log_page = region.len().trailing_zeros() - 12;
        let mut inb = vec![0u8; mlx5_hw::ifc::modify_cq_in::SIZE_BYTES + 8];
        {
            let mut i = ModifyCqIn::new_unchecked(&mut inb[..]);
            i.set_opcode(Opcode::ModifyCq.to_raw())
                .set_op_mod(c::CQ_OPMOD_RESIZE)
                .set_cqn(self.shared.cqn);
            i.modify_field_select_resize_field_select_mut()
                .resize_field_select_mut()
                .set_resize_field_select(
                    c::MODIFY_CQ_MASK_LOG_SIZE
                        | c::MODIFY_CQ_MASK_PG_OFFSET
                        | c::MODIFY_CQ_MASK_PG_SIZE,
                );
            i.cq_context_mut()
                .set_cqe_sz(if ring.shift == 1 {
                    c::CQE_STRIDE_128
                } else {
                    c::CQE_STRIDE_64
                })
                .set_log_cq_size(ring.log_size)
                .set_log_page_size(log_page as u8);
            i.set_pas(0, region.iova().0);
        }
        self.shared
            .ctx
            .hca
            .cmd()
            .exec(&inb, modify_cq_out::SIZE_BYTES)
            .map(drop)
    }

    /// Copies the CQEs not yet polled into `to` up to the RESIZE_CQ CQE
    /// the device wrote, each one index later (at most what `to` holds);
    /// the new consumer index: the old one plus one, the first copy. A
    /// missing RESIZE_CQ CQE (a device bug) is logged, and what was copied
    /// is kept.
    fn copy_to_resized(&self, to: &CqRing) -> u32 {
        let from = &self.ring;
        let limit = (1u32 << from.log_size).min((1u32 << to.log_size) - 1);
        let mut i = from.ci;
        for _ in 0..=limit {
            if !from.sw_owned(i) {
                break;
            }
            let op_own = from
                .ring
                .entry(from.cqe_index(i))
                .load_u8_acquire(OP_OWN)
                .unwrap_or(0);
            if op_own >> c::CQE_OPCODE_SHIFT == CqeOpcode::ResizeCq.to_raw() {
                return from.ci.wrapping_add(1);
            }
            let j = i.wrapping_add(1);
            // The new ring's software owner bit for index `j`.
            from.copy_cqe(i, to, j, ((j >> to.log_size) & 1) as u8);
            i = i.wrapping_add(1);
        }
        tracing::error!(
            cqn = self.shared.cqn,
            "resize: no RESIZE_CQ CQE in the old ring; the new ring used as it is"
        );
        from.ci.wrapping_add(1)
    }
}

impl CqRing {
    /// Completions written and not yet polled.
    fn outstanding(&self) -> u32 {
        let mut p = self.ci;
        while p.wrapping_sub(self.ci) < 1 << self.log_size && self.sw_owned(p) {
            p = p.wrapping_add(1);
        }
        p.wrapping_sub(self.ci)
    }
}
