//! ALLOC_UAR / DEALLOC_UAR: UAR pages are BAR0 pages `uarn * 4 KiB`,
//! handed out lowest first from [`initseg::FIRST_UAR`].

use std::collections::BTreeSet;

use mlx5_hw::ifc::{alloc_uar_out, dealloc_uar_in};
use mlx5_hw::status::CmdStatus;
use mlx5_hw::uar::{EQ_DOORBELL_ARM, EQ_DOORBELL_UPDATE_CI};

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::initseg;
use crate::Inner;

/// The UAR pages handed out. The lowest free page is found without a
/// search: it is the lowest hole below the highest page in use, or the
/// page above it (with every page taken, ALLOC_UAR costs a lookup, not a
/// walk over thousands of pages).
#[derive(Default, Clone, PartialEq, Eq)]
pub(crate) struct UarSet {
    used: BTreeSet<u32>,
    /// Free pages from [`initseg::FIRST_UAR`] up to the highest in use.
    holes: BTreeSet<u32>,
}

impl std::fmt::Debug for UarSet {
    /// The pages in use (the holes follow from them).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.used.fmt(f)
    }
}

impl UarSet {
    /// Whether page `uar` is handed out.
    pub(crate) fn contains(&self, uar: &u32) -> bool {
        self.used.contains(uar)
    }

    /// Pages handed out.
    pub(crate) fn len(&self) -> usize {
        self.used.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.used.is_empty()
    }

    /// Every page free again (teardown, power-on).
    pub(crate) fn clear(&mut self) {
        self.used.clear();
        self.holes.clear();
    }

    /// The lowest free page below `limit`, now in use.
    fn take_lowest(&mut self, limit: u32) -> Option<u32> {
        let uar = match self.holes.pop_first() {
            Some(h) => h,
            None => {
                let next = self.used.last().map_or(initseg::FIRST_UAR, |u| u + 1);
                (next < limit).then_some(next)?
            }
        };
        self.used.insert(uar);
        Some(uar)
    }

    /// Page `uar` is free again; false if it was not in use.
    fn give_back(&mut self, uar: u32) -> bool {
        if !self.used.remove(&uar) {
            return false;
        }
        let top = self.used.last().map_or(initseg::FIRST_UAR, |u| u + 1);
        if uar < top {
            self.holes.insert(uar);
        } else {
            // The highest page went: the holes above the new top are no
            // longer holes.
            let _ = self.holes.split_off(&top);
        }
        true
    }
}

impl Firmware {
    /// UAR pages end where the MEMIC operation windows (fw/memic_op.rs)
    /// or the MEMIC window start (BAR0's top).
    fn uar_limit(&self) -> u32 {
        let end = self
            .memic_op_windows()
            .or(self.memic_window())
            .map_or(self.profile.bar0_size(), |(start, _)| start);
        (end.min(self.profile.bar0_size()) >> 12) as u32
    }

    pub(super) fn alloc_uar(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, alloc_uar_out::SIZE_BYTES)?;
        let limit = self.uar_limit();
        let Some(uar) = self.uars.take_lowest(limit) else {
            return Err(fail(CmdStatus::NoResources, synd::UAR_EXHAUSTED));
        };
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
        self.uars.give_back(uar);
        // The only EQ doorbell registers remembered are these two.
        for off in [EQ_DOORBELL_ARM, EQ_DOORBELL_UPDATE_CI] {
            self.eq_db_last.remove(&(uar, off));
        }
        Ok(vec![0; 0x10])
    }
}

#[cfg(test)]
mod tests {
    use super::UarSet;
    use crate::initseg::FIRST_UAR;

    /// Lowest free first, as a walk from FIRST_UAR would find it.
    #[test]
    fn uar_set_hands_out_the_lowest_free_page() {
        let limit = FIRST_UAR + 5;
        let mut s = UarSet::default();
        let all: Vec<u32> = (0..5).map(|_| s.take_lowest(limit).unwrap()).collect();
        assert_eq!(all, (FIRST_UAR..limit).collect::<Vec<_>>());
        assert_eq!(s.take_lowest(limit), None, "every page taken");
        assert!(s.give_back(FIRST_UAR + 3));
        assert!(s.give_back(FIRST_UAR + 1));
        assert!(!s.give_back(FIRST_UAR + 1), "not in use");
        assert_eq!(s.take_lowest(limit), Some(FIRST_UAR + 1));
        // The top goes: the hole at +3 below it is above the new top.
        assert!(s.give_back(FIRST_UAR + 4));
        assert_eq!(s.holes.len(), 0, "{s:?}");
        assert!(s.give_back(FIRST_UAR));
        assert_eq!(s.holes.len(), 1);
        assert_eq!(s.take_lowest(limit), Some(FIRST_UAR));
        assert_eq!(s.take_lowest(limit), Some(FIRST_UAR + 3));
        assert_eq!(s.len(), 4);
        s.clear();
        assert!(s.is_empty());
        assert_eq!(s.take_lowest(limit), Some(FIRST_UAR));
    }
}
