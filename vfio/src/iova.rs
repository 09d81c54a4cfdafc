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

    #[test]
    fn ranges_are_inclusive_and_holes_are_never_used() {
        // Two ranges around the x86 MSI window, as an IOMMU reports them.
        let hole = 0xfee0_0000..0xfef0_0000u64;
        let mut a = IovaAllocator::new(&[
            IovaRange {
                start: 0xfe00_0000,
                last: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                last: 0xfeff_ffff,
            },
        ]);
        assert_eq!(a.free_bytes(), 0xe0_0000 + 0x10_0000);
        let mut got = Vec::new();
        while let Ok(x) = a.alloc(0x10_0000) {
            assert!(!hole.contains(&x.0), "{x:#x} lies in the hole");
            got.push(x.0);
        }
        // 14 MiB below the hole and 1 MiB above it, to the last byte.
        assert_eq!(got.len(), 15);
        assert_eq!(*got.last().unwrap(), 0xfef0_0000);
        assert_eq!(a.free_bytes(), 0);
        // The top of the address space does not overflow.
        let mut top = IovaAllocator::new(&[IovaRange {
            start: u64::MAX - 0xffff,
            last: u64::MAX,
        }]);
        assert!(top.alloc(0x1000).is_ok());
        // A range that is only page 0 gives nothing: 0 is never handed out.
        let mut zero = IovaAllocator::new(&[IovaRange {
            start: 0,
            last: 0xfff,
        }]);
        assert!(matches!(zero.alloc(1), Err(Error::IovaExhausted { .. })));
    }

    #[test]
    fn every_size_is_naturally_aligned() {
        let mut a = IovaAllocator::new(&[IovaRange {
            start: 0,
            last: (1 << 40) - 1,
        }]);
        for shift in 12..=28 {
            for len in [1u64 << shift, (1 << shift) - 4096 + 1] {
                let x = a.alloc(len).unwrap();
                let align = natural_align(len);
                assert_eq!(x.0 % align, 0, "{len:#x} at {:#x}", x.0);
            }
        }
        let x = a.alloc_aligned(4096, 1 << 20).unwrap();
        assert_eq!(x.0 % (1 << 20), 0);
        assert!(matches!(
            a.alloc_aligned(4096, 3 << 12),
            Err(Error::Iova { why, .. }) if why.contains("power of two")
        ));
    }

    #[test]
    fn exhaustion_names_the_request_and_a_free_makes_room() {
        let mut a = IovaAllocator::new(&[IovaRange {
            start: 0x10_0000,
            last: 0x13_ffff,
        }]);
        let pages: Vec<_> = (0..64).map(|_| a.alloc(4096).unwrap()).collect();
        assert_eq!(a.free_bytes(), 0);
        match a.alloc(4096) {
            Err(Error::IovaExhausted { len, align }) => assert_eq!((len, align), (4096, 4096)),
            other => panic!("{other:?}"),
        }
        a.free(pages[17], 4096).unwrap();
        assert_eq!(a.alloc(4096).unwrap(), pages[17]);
    }

    #[test]
    fn fragmentation_blocks_large_ranges_until_coalesced() {
        let mut a = IovaAllocator::new(&[IovaRange {
            start: 0x10_0000,
            last: 0x1f_ffff,
        }]);
        let pages: Vec<_> = (0..256).map(|_| a.alloc(4096).unwrap()).collect();
        for p in pages.iter().step_by(2) {
            a.free(*p, 4096).unwrap();
        }
        // Half the space is free, but in 128 single pages.
        assert_eq!(a.free_bytes(), 128 * 4096);
        assert_eq!(a.fragments(), 128);
        assert!(matches!(a.alloc(8192), Err(Error::IovaExhausted { .. })));
        for p in pages.iter().skip(1).step_by(2) {
            a.free(*p, 4096).unwrap();
        }
        assert_eq!(a.fragments(), 1);
        assert_eq!(a.alloc(1 << 20).unwrap(), Iova(0x10_0000));
    }

    #[test]
    fn frees_that_overlap_free_space_or_wrap_are_refused() {
        let mut a = alloc();
        let x = a.alloc(16384).unwrap();
        a.free(Iova(x.0 + 8192), 8192).unwrap();
        // The first half is still allocated; a free that reaches into the
        // freed half is refused and changes nothing.
        let before = a.free_bytes();
        assert!(a.free(x, 16384).is_err());
        assert_eq!(a.free_bytes(), before);
        a.free(x, 8192).unwrap();
        assert!(matches!(
            a.free(Iova(u64::MAX - 4095), 8192),
            Err(Error::Iova {
                why: "range wraps",
                ..
            })
        ));
    }
}
