//! UAR pages: the 4 KiB windows of BAR0 through which the driver rings
//! doorbells (EQ consumer index and arm at +0x40/+0x48, CQ, send doorbells
//! and BlueFlame at +0x800).
//!
//! ALLOC_UAR (0x802) returns a UAR index; the page is at BAR0 offset
//! `index * 4096` when the function runs with 4 KiB UAR pages
//! (`log_uar_page_sz = 0`; `uar_4k` on hosts with larger pages).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use mlx5_hw::ifc::{alloc_uar_in, alloc_uar_out, dealloc_uar_in, dealloc_uar_out};
use mlx5_hw::ifc::{AllocUarIn, AllocUarOut, DeallocUarIn};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use mlx5_hw::uar::{bfreg_offset, BFREGS_PER_UAR};
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

/// The BlueFlame register of each page that QPs share once no register is
/// free (rdma-core's low-latency-class bfreg): its users ring 8-byte
/// doorbells only, which do not tear, and never copy WQEs through it.
pub(crate) const SHARED_BFREG: usize = BFREGS_PER_UAR - 1;
/// The bfregs of a page a QP may hold alone.
const OWN_BFREGS: u8 = (1 << SHARED_BFREG) - 1;

/// A BlueFlame register (bfreg) a QP rings: one of the four of a UAR page
/// (`MLX5_BFREGS_PER_UAR`), each two BlueFlame buffers.
#[derive(Debug)]
pub(crate) struct Bfreg {
    /// The page it is in.
    pub(crate) uar: Arc<Uar>,
    /// Which of the page's bfregs.
    pub(crate) index: usize,
    /// Other QPs ring it too: doorbells only, no BlueFlame copies.
    pub(crate) shared: bool,
}

impl Bfreg {
    /// Its first BlueFlame buffer's offset in BAR0, for a device reporting
    /// `log_bf_reg_size`.
    pub(crate) fn offset(&self, log_bf_reg_size: u32) -> usize {
        self.uar.offset() + bfreg_offset(self.index, log_bf_reg_size)
    }
}

/// One page of the pool: which of its bfregs QPs hold alone (a bit each).
#[derive(Debug)]
struct PoolPage {
    uar: Weak<Uar>,
    held: u8,
}

/// The UAR pages of one context's CQs and QPs, as Linux's mlx5 bfreg
/// allocation hands them out. While firmware has pages, every CQ and
/// QP gets a page of its own (a model that notices doorbells by polling
/// BAR memory keeps only the last of two writes to one register). Once
/// ALLOC_UAR answers NO_RESOURCES, no ALLOC_UAR is sent again until one of
/// the pool's pages goes back: a QP takes a bfreg no QP holds (three per
/// page, as mlx5_ib hands out its medium-class bfregs), then shares the
/// [`SHARED_BFREG`] of the pages in turn, ringing doorbells only; a CQ
/// shares the pages in turn (its doorbell is one 8-byte store, as every
/// CQ of Linux's mlx5_core shares one page).
#[derive(Debug, Default)]
pub(crate) struct UarPool {
    pages: BTreeMap<u32, PoolPage>,
    /// Pages with a bfreg no QP holds.
    free_bfregs: BTreeSet<u32>,
    /// Firmware refused ALLOC_UAR and none of our pages went back since.
    exhausted: bool,
    /// The page handed out shared last (the next share is the one after).
    cursor: u32,
}

impl UarPool {
    /// A UAR page for a CQ's doorbells.
    pub(crate) fn page(&mut self, cmd: &Cmd, bar: &Arc<Mmio>) -> Result<Arc<Uar>> {
        match self.fresh(cmd, bar, 0)? {
            Some(u) => Ok(u),
            None => self.shared_page(),
        }
    }

    /// A bfreg for a QP's send doorbells and BlueFlame copies.
    pub(crate) fn bfreg(&mut self, cmd: &Cmd, bar: &Arc<Mmio>) -> Result<Bfreg> {
        if let Some(uar) = self.fresh(cmd, bar, 1)? {
            return Ok(Bfreg {
                uar,
                index: 0,
                shared: false,
            });
        }
        if let Some(b) = self.free_bfreg() {
            return Ok(b);
        }
        Ok(Bfreg {
            uar: self.shared_page()?,
            index: SHARED_BFREG,
            shared: true,
        })
    }

    /// ALLOC_UAR, unless firmware has refused it since the pool last gave
    /// a page back; `None` when firmware has no page. `held`: the bfregs the
    /// caller takes.
    fn fresh(&mut self, cmd: &Cmd, bar: &Arc<Mmio>, held: u8) -> Result<Option<Arc<Uar>>> {
        if self.exhausted {
            return Ok(None);
        }
        match Uar::alloc(cmd, bar.clone()) {
            Ok(u) => {
                let u = Arc::new(u);
                let uar = Arc::downgrade(&u);
                self.pages.insert(u.index(), PoolPage { uar, held });
                self.free_bfregs.insert(u.index());
                Ok(Some(u))
            }
            Err(Error::Cmd {
                status: CmdStatus::NoResources,
                ..
            }) => {
                tracing::debug!(
                    pages = self.pages.len(),
                    "UAR pages exhausted: sharing them"
                );
                self.exhausted = true;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A bfreg of a pool page that no QP holds, now held.
    fn free_bfreg(&mut self) -> Option<Bfreg> {
        while let Some(&index) = self.free_bfregs.first() {
            let Some(page) = self.pages.get_mut(&index) else {
                self.free_bfregs.remove(&index);
                continue;
            };
            let Some(uar) = page.uar.upgrade() else {
                self.forget(index);
                continue;
            };
            let free = !page.held & OWN_BFREGS;
            if free == 0 {
                self.free_bfregs.remove(&index);
                continue;
            }
            let bit = free.trailing_zeros() as usize;
            page.held |= 1 << bit;
            if page.held & OWN_BFREGS == OWN_BFREGS {
                self.free_bfregs.remove(&index);
            }
            return Some(Bfreg {
                uar,
                index: bit,
                shared: false,
            });
        }
        None
    }

    /// The pool page after the last one shared, in turn.
    fn shared_page(&mut self) -> Result<Arc<Uar>> {
        loop {
            let next = self.pages.range(self.cursor.saturating_add(1)..).next();
            let Some((&index, page)) = next.or_else(|| self.pages.iter().next()) else {
                return Err(Error::QueueFull("no UAR pages left"));
            };
            self.cursor = index;
            match page.uar.upgrade() {
                Some(u) => return Ok(u),
                // Dropped without going back through the pool.
                None => self.forget(index),
            }
        }
    }

    fn forget(&mut self, index: u32) {
        self.pages.remove(&index);
        self.free_bfregs.remove(&index);
    }

    /// Gives back a page a CQ held: DEALLOC_UAR when nothing else holds it
    /// (and ALLOC_UAR may succeed again).
    pub(crate) fn release(&mut self, cmd: &Cmd, uar: Arc<Uar>) {
        let index = uar.index();
        if let Ok(u) = Arc::try_unwrap(uar) {
            self.forget(index);
            self.exhausted = false;
            if let Err(e) = u.free(cmd) {
                tracing::warn!("DEALLOC_UAR: {e}");
            }
        }
    }

    /// Gives back a QP's bfreg.
    pub(crate) fn release_bfreg(&mut self, cmd: &Cmd, b: Bfreg) {
        let index = b.uar.index();
        if !b.shared {
            if let Some(p) = self.pages.get_mut(&index) {
                p.held &= !(1 << b.index);
                self.free_bfregs.insert(index);
            }
        }
        self.release(cmd, b.uar);
    }
}
