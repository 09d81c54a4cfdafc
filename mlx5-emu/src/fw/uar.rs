//! ALLOC_UAR / DEALLOC_UAR: UAR pages are BAR0 pages `uarn * 4 KiB`,
//! handed out lowest first from [`initseg::FIRST_UAR`].

use mlx5_hw::ifc::{alloc_uar_out, dealloc_uar_in};
use mlx5_hw::status::CmdStatus;
use mlx5_hw::uar::{EQ_DOORBELL_ARM, EQ_DOORBELL_UPDATE_CI};

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::initseg;
use crate::Inner;

impl Firmware {
    fn uar_limit(&self) -> u32 {
        (self.profile.bar0_size() >> 12) as u32
    }

    pub(super) fn alloc_uar(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, alloc_uar_out::SIZE_BYTES)?;
        let Some(uar) = (initseg::FIRST_UAR..self.uar_limit()).find(|u| !self.uars.contains(u))
        else {
            return Err(fail(CmdStatus::NoResources, synd::UAR_EXHAUSTED));
        };
        self.uars.insert(uar);
        // A fresh UAR page: doorbells read as zero (no EQ is number 0).
        let _ = inner.bar.fill((uar as usize) << 12, 4096, 0);
        for off in [EQ_DOORBELL_ARM, EQ_DOORBELL_UPDATE_CI] {
            self.eq_db_last.insert((uar, off), 0);
        }
        let mut out = vec![0u8; alloc_uar_out::SIZE_BYTES];
        alloc_uar_out::UAR.set(&mut out, u64::from(uar));
        Ok(out)
    }

    pub(super) fn dealloc_uar(&mut self, _inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, dealloc_uar_in::SIZE_BYTES, 0x10)?;
        let uar = dealloc_uar_in::UAR.get(input) as u32;
        if !self.uars.contains(&uar) {
            return Err(fail(CmdStatus::BadResource, synd::UAR_UNKNOWN));
        }
        if self.eqs.values().any(|e| e.uar == uar) {
            return Err(fail(CmdStatus::ResourceBusy, synd::UAR_IN_USE));
        }
        self.uars.remove(&uar);
        self.eq_db_last.retain(|(u, _), _| *u != uar);
        Ok(vec![0; 0x10])
    }
}
