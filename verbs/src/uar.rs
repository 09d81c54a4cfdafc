//! UAR pages: the 4 KiB windows of BAR0 through which the driver rings
//! doorbells (EQ consumer index and arm at +0x40/+0x48, CQ, send doorbells
//! and BlueFlame at +0x800).
//!
//! ALLOC_UAR (0x802) returns a UAR index; the page is at BAR0 offset
//! `index * 4096` when the function runs with 4 KiB UAR pages
//! (`log_uar_page_sz = 0`; `uar_4k` on hosts with larger pages).

use std::sync::Arc;

use mlx5_hw::ifc::{alloc_uar_in, alloc_uar_out, dealloc_uar_in, dealloc_uar_out};
use mlx5_hw::ifc::{AllocUarIn, AllocUarOut, DeallocUarIn};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::uar::{eq_doorbell, EQ_DOORBELL_ARM, EQ_DOORBELL_UPDATE_CI, UAR_PAGE_SIZE};
use vfio::mmio::mb;
use vfio::Mmio;

use crate::cmd::Cmd;
use crate::{Error, Result};

/// One allocated UAR page.
#[derive(Debug)]
pub struct Uar {
    index: u32,
    bar: Arc<Mmio>,
}

impl Uar {
    /// ALLOC_UAR.
    pub(crate) fn alloc(cmd: &Cmd, bar: Arc<Mmio>) -> Result<Self> {
        let mut inb = [0u8; alloc_uar_in::SIZE_BYTES];
        AllocUarIn::new_unchecked(&mut inb[..]).set_opcode(Opcode::AllocUar.to_raw());
        let out = cmd.exec(&inb, alloc_uar_out::SIZE_BYTES)?;
        let index = AllocUarOut::new_unchecked(&out[..]).uar();
        let end = (index as usize + 1) * UAR_PAGE_SIZE;
        if end > bar.len() {
            return Err(Error::BadOutput {
                opcode: Opcode::AllocUar,
                what: "UAR index beyond BAR0",
            });
        }
        Ok(Self { index, bar })
    }

    /// DEALLOC_UAR.
    pub(crate) fn free(self, cmd: &Cmd) -> Result<()> {
        let mut inb = [0u8; dealloc_uar_in::SIZE_BYTES];
        DeallocUarIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::DeallocUar.to_raw())
            .set_uar(self.index);
        cmd.exec(&inb, dealloc_uar_out::SIZE_BYTES).map(|_| ())
    }

    /// The UAR index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The page's offset in BAR0.
    pub fn offset(&self) -> usize {
        self.index as usize * UAR_PAGE_SIZE
    }

    /// Writes an EQ doorbell: consumer index `ci` of EQ `eqn`, arming it if
    /// `arm` (PRM "EQ Doorbell": UAR +0x40 arms, +0x48 only updates CI).
    pub fn eq_doorbell(&self, eqn: u8, ci: u32, arm: bool) -> Result<()> {
        let off = if arm {
            EQ_DOORBELL_ARM
        } else {
            EQ_DOORBELL_UPDATE_CI
        };
        // EQEs consumed (their reads done) before the device may reuse them.
        mb();
        self.bar
            .write32_be(self.offset() + off, eq_doorbell(ci, eqn))
            .map_err(Error::from)
    }
}
