//! An allocator of naturally aligned IOVA ranges.
//!
//! Buffers get IOVA ranges aligned to their own size rounded up to a power of
//! two, so that one DMA mapping and one or two MTT/PAS entries of a large
//! page size describe a whole buffer.

use std::collections::BTreeMap;

use crate::{Error, Iova, IovaRange, Result};

/// Free IOVA space, as disjoint `[start, end)` intervals.
#[derive(Debug, Clone, Default)]
pub struct IovaAllocator {
    free: BTreeMap<u64, u64>,
}

/// The alignment a buffer of `len` bytes gets: `len` rounded up to a power of
/// two, at least 4 KiB.
pub fn natural_align(len: u64) -> u64 {
    len.max(4096).next_power_of_two()
}

impl IovaAllocator {
    /// An allocator over the usable `ranges` (inclusive ends, as reported by
    /// the IOMMU). Address 0 is never handed out.
    pub fn new(ranges: &[IovaRange]) -> Self {
        let mut a = Self::default();
        for r in ranges {
            let start = r.start.max(4096);
            let end = r.last.saturating_add(1);
            if start < end {
                a.insert_free(start, end);
            }
        }
        a
    }

    /// Allocates `len` bytes aligned to [`natural_align`]`(len)`.
    pub fn alloc(&mut self, len: u64) -> Result<Iova> {
        self.alloc_aligned(len, natural_align(len))
    }

    /// Allocates `len` bytes (rounded up to 4 KiB) aligned to `align` (a power of two).
    pub fn alloc_aligned(&mut self, len: u64, align: u64) -> Result<Iova> {
        let len = len.max(1).div_ceil(4096) * 4096;
        let align = align.max(4096);
        if !align.is_power_of_two() {
            return Err(Error::Iova {
                iova: 0,
                len,
                why: "alignment is not a power of two",
            });
        }
        let found = self.free.iter().find_map(|(&s, &e)| {
            let a = s.checked_add(align - 1)? & !(align - 1);
            (a.checked_add(len)? <= e).then_some((s, e, a))
        });
        let (s, e, a) = found.ok_or(Error::IovaExhausted { len, align })?;
        self.free.remove(&s);
        if s < a {
            self.free.insert(s, a);
        }
        if a + len < e {
            self.free.insert(a + len, e);
        }
        Ok(Iova(a))
    }

    /// Returns `len` bytes at `iova` (as allocated) to the free space.
    pub fn free(&mut self, iova: Iova, len: u64) -> Result<()> {
        let len = len.max(1).div_ceil(4096) * 4096;
        let (s, e) = (
            iova.0,
            iova.0.checked_add(len).ok_or(Error::Iova {
                iova: iova.0,
                len,
                why: "range wraps",
            })?,
        );
        let overlaps = self
            .free
            .range(..e)
            .next_back()
            .is_some_and(|(_, &fe)| fe > s);
        if overlaps {
            return Err(Error::Iova {
                iova: iova.0,
                len,
                why: "range is already free",
            });
        }
        self.insert_free(s, e);
        Ok(())
    }

    fn insert_free(&mut self, mut s: u64, mut e: u64) {
        if let Some((&ps, &pe)) = self.free.range(..=s).next_back() {
            if pe >= s {
                s = ps;
                e = e.max(pe);
                self.free.remove(&ps);
            }
        }
        while let Some((&ns, &ne)) = self.free.range(s..).next() {
            if ns > e {
                break;
            }
            e = e.max(ne);
            self.free.remove(&ns);
        }
        self.free.insert(s, e);
    }

    /// Bytes free in all.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).sum()
    }

    /// Number of disjoint free intervals (fragmentation).
    pub fn fragments(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc() -> IovaAllocator {
        IovaAllocator::new(&[IovaRange {
            start: 0,
            last: (1 << 30) - 1,
        }])
    }

    #[test]
    fn natural_alignment() {
        let mut a = alloc();
        let x = a.alloc(4096).unwrap();
        let y = a.alloc(3 << 20).unwrap();
        assert_eq!(x.0 % 4096, 0);
        assert_ne!(x.0, 0, "0 is never handed out");
        assert_eq!(y.0 % (4 << 20), 0);
    }

    #[test]
    fn free_coalesces_and_double_free_is_refused() {
        let mut a = alloc();
        let total = a.free_bytes();
        let xs: Vec<_> = (0..64).map(|_| a.alloc(8192).unwrap()).collect();
        for x in xs.iter().step_by(2) {
            a.free(*x, 8192).unwrap();
        }
        assert!(a.fragments() > 1);
        for x in xs.iter().skip(1).step_by(2) {
            a.free(*x, 8192).unwrap();
        }
        assert_eq!(a.free_bytes(), total);
        assert_eq!(a.fragments(), 1);
        assert!(a.free(xs[0], 8192).is_err());
    }

    #[test]
    fn exhaustion_and_ranges() {
        let mut a = IovaAllocator::new(&[
            IovaRange {
                start: 0x10000,
                last: 0x1ffff,
            },
            IovaRange {
                start: 0x100000,
                last: 0x1fffff,
            },
        ]);
        assert!(a.alloc(0x10000).is_ok());
        assert_eq!(a.alloc(0x100000).unwrap().0, 0x100000);
        assert!(matches!(a.alloc(0x1000), Err(Error::IovaExhausted { .. })));
        assert!(a.alloc_aligned(4096, 3).is_err());
    }
}
