//! ALLOC_MEMIC / DEALLOC_MEMIC: device memory (MEMIC), the on-chip memory
//! ConnectX-5 and later expose at the top of BAR0 (`memic_bar_start_addr`,
//! `memic_bar_size` of the device-memory caps). An allocation is
//! `memic_size` bytes (a multiple of 2^`log_min_memic_alloc_size`) at an
//! offset aligned to 64 << `log_memic_addr_alignment` inside the range the
//! driver names (Linux's `mlx5_cmd_alloc_memic` walks the window a page at
//! a time and takes NO_RESOURCES, its -EAGAIN, as "try the next page"),
//! at most `max_memic_size` in all; the bytes start zeroed. The memory is
//! BAR0's own (the driver reads and writes it by MMIO) and is placed in
//! the DMA space at [`DEVMEM_IOVA`] + its BAR offset, so memory keys with
//! the MEMIC access mode reach it through the same DMA engine as host
//! memory.

use std::collections::{BTreeMap, BTreeSet};

use mlx5_hw::ifc::{
    alloc_memic_in, alloc_memic_out, dealloc_memic_in, dealloc_memic_out, device_mem_cap,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::profile::cap_type;
use crate::Inner;

/// Where BAR0 offset 0 sits in the device's DMA space (above the 48-bit
/// IOVAs a driver maps).
pub(crate) const DEVMEM_IOVA: u64 = 1 << 56;

/// Device memory state.
#[derive(Debug, Default)]
pub(crate) struct Memic {
    /// The live allocations: BAR0 offset -> size.
    pub(crate) allocs: BTreeMap<u64, u64>,
    /// The operation addresses mapped by MODIFY_MEMIC (fw/memic_op.rs):
    /// (allocation's BAR0 offset, `memic_operation_type`).
    pub(crate) ops: BTreeSet<(u64, u8)>,
}

impl Memic {
    /// Forgets every allocation and mapping (teardown, FLR).
    pub(crate) fn clear(&mut self) {
        self.allocs.clear();
        self.ops.clear();
    }
}

impl Firmware {
    pub(super) fn dm_cap(&self, f: mlx5_hw::bits::BitField) -> u64 {
        self.caps.get(cap_type::DEV_MEM, f)
    }

    /// The MEMIC window of BAR0: `(start, size)`; `None` without MEMIC.
    pub(crate) fn memic_window(&self) -> Option<(u64, u64)> {
        (self.dm_cap(device_mem_cap::MEMIC) != 0).then(|| {
            (
                self.dm_cap(device_mem_cap::MEMIC_BAR_START_ADDR),
                self.dm_cap(device_mem_cap::MEMIC_BAR_SIZE),
            )
        })
    }

    /// Whether a memory key of the MEMIC access mode may span `[start,
    /// start + len)`: inside one live allocation (a key past it would reach
    /// the next one's bytes, or no memory at all); a key of length 0
    /// reaches nothing and is taken anywhere (rdma-core's
    /// test_create_dm_mr registers one on the card).
    pub(crate) fn memic_key_fits(&self, start: u64, len: u64) -> bool {
        len == 0 || (len != u64::MAX && self.memic_covers(start, len))
    }

    /// Whether `[start, start + len)` lies inside one live allocation.
    pub(crate) fn memic_covers(&self, start: u64, len: u64) -> bool {
        self.memic
            .allocs
            .range(..=start)
            .next_back()
            .is_some_and(|(&s, &n)| start.checked_add(len).is_some_and(|e| e <= s + n))
    }

    pub(super) fn alloc_memic(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            alloc_memic_in::SIZE_BYTES,
            alloc_memic_out::SIZE_BYTES,
        )?;
        let Some((win, win_len)) = self.memic_window() else {
            return Err(fail(CmdStatus::BadOperation, synd::MEMIC_UNSUPPORTED));
        };
        let size = alloc_memic_in::MEMIC_SIZE.get(input);
        let min = 1u64
            << self
                .dm_cap(device_mem_cap::LOG_MIN_MEMIC_ALLOC_SIZE)
                .min(32);
        let align_log = alloc_memic_in::LOG_MEMIC_ADDR_ALIGNMENT.get(input);
        if size == 0
            || size % min != 0
            || align_log > self.dm_cap(device_mem_cap::LOG_MAX_MEMIC_ADDR_ALIGNMENT)
        {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_BAD_SIZE));
        }
        let r_start = alloc_memic_in::RANGE_START_ADDR.get(input);
        let r_len = alloc_memic_in::RANGE_SIZE.get(input);
        let r_end = r_start.checked_add(r_len);
        if r_start < win || r_end.is_none_or(|e| e > win + win_len) {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_BAD_RANGE));
        }
        let used: u64 = self.memic.allocs.values().sum();
        if used + size > self.dm_cap(device_mem_cap::MAX_MEMIC_SIZE) {
            return Err(fail(CmdStatus::NoResources, synd::MEMIC_EXHAUSTED));
        }
        let align = 64u64 << align_log.min(40);
        let end = r_start + r_len;
        let mut at = r_start.next_multiple_of(align);
        // Lowest aligned spot of the range that overlaps no allocation.
        for (&s, &n) in &self.memic.allocs {
            if at + size <= s || at >= end {
                break;
            }
            if s + n > at {
                at = (s + n).next_multiple_of(align);
            }
        }
        if at + size > end {
            return Err(fail(CmdStatus::NoResources, synd::MEMIC_EXHAUSTED));
        }
        let _ = inner.bar.fill(at as usize, size as usize, 0);
        self.memic.allocs.insert(at, size);
        tracing::debug!(start = format_args!("{at:#x}"), size, "ALLOC_MEMIC");
        let mut out = vec![0u8; alloc_memic_out::SIZE_BYTES];
        alloc_memic_out::MEMIC_START_ADDR.set(&mut out, at);
        Ok(out)
    }

    pub(super) fn dealloc_memic(
        &mut self,
        _inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            dealloc_memic_in::SIZE_BYTES,
            dealloc_memic_out::SIZE_BYTES,
        )?;
        if self.memic_window().is_none() {
            return Err(fail(CmdStatus::BadOperation, synd::MEMIC_UNSUPPORTED));
        }
        let start = dealloc_memic_in::MEMIC_START_ADDR.get(input);
        let size = dealloc_memic_in::MEMIC_SIZE.get(input);
        if self.memic.allocs.get(&start) != Some(&size) {
            return Err(fail(CmdStatus::BadParameter, synd::MEMIC_UNKNOWN));
        }
        self.memic.allocs.remove(&start);
        // Operation addresses go with their memory (Linux unmaps them first).
        self.memic.ops.retain(|&(s, _)| s != start);
        Ok(vec![0u8; dealloc_memic_out::SIZE_BYTES])
    }
}

#[cfg(test)]
mod tests {
    use crate::fw::Firmware;
    use crate::{DeviceConfig, Profile};

    #[test]
    fn a_memic_key_fits_one_allocation_or_reaches_nothing() {
        let mut fw = Firmware::new(&DeviceConfig::for_profile(Profile::ConnectX7));
        fw.memic.allocs.insert(0x3fc_0000, 64);
        assert!(fw.memic_key_fits(0x3fc_0000, 64));
        assert!(fw.memic_key_fits(0x3fc_0010, 0));
        assert!(fw.memic_key_fits(0x1000, 0));
        assert!(!fw.memic_key_fits(0x3fc_0000, 65));
        assert!(!fw.memic_key_fits(0x3fc_0000, u64::MAX));
        assert!(!fw.memic_key_fits(0x1000, 4));
    }
}
