//! The device's view of its IOVA space: the regions mapped for DMA, by
//! address, as one value a device model takes and keeps for a batch of
//! work ([`DmaSpace::memory`](crate::emulated::DmaSpace::memory)).
//!
//! vm-memory's `GuestMemoryMmap` keeps its regions in one sorted vector,
//! so every map or unmap copies and re-sorts all of them. A guest behind a
//! vIOMMU maps and unmaps one 4 KiB page per message, tens of thousands of
//! them: at 13,000 mappings each DMA_MAP cost milliseconds of copying, and
//! under load a vfio-user client waited more than 30 s for one reply.
//! Here the regions sit in sorted chunks of at most [`CHUNK`], shared
//! between snapshots: a map or an unmap copies one chunk and the list of
//! chunks (O(n / CHUNK + CHUNK) pointers), a snapshot is a pointer copy,
//! and a snapshot taken earlier is unchanged by later maps. A lookup is
//! two binary searches over flat arrays, as cheap as vm-memory's one (a
//! persistent B-tree's lookup went through a range iterator: 2-3 times
//! slower, on every DMA of the data path). Reads and writes go through
//! vm-memory's own `Bytes` for any `GuestMemoryBackend`.

use std::collections::BTreeSet;
use std::sync::Arc;

use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap};

/// Most regions in one chunk; a fuller one is split in two.
pub const CHUNK: usize = 64;

type Region = Arc<GuestRegionMmap>;

/// A region with its first and last address beside it, so that a lookup
/// reads one flat array.
#[derive(Clone, Debug)]
struct Entry {
    start: u64,
    last: u64,
    region: Region,
}

/// Sorted entries, never empty, with the first start beside them.
#[derive(Clone, Debug)]
struct Chunk {
    first: u64,
    entries: Arc<[Entry]>,
}

impl Chunk {
    fn of(entries: Vec<Entry>) -> Self {
        Self {
            first: entries[0].start,
            entries: entries.into(),
        }
    }
}

/// Regions of an IOVA space by start address; cheap to clone (shared
/// chunks), changed by copying only the chunk that changes.
#[derive(Clone, Debug, Default)]
pub struct IovaMemory {
    /// Sorted by first start address.
    chunks: Arc<[Chunk]>,
    len: usize,
}

impl IovaMemory {
    /// The chunk that holds (or would hold) a region starting at `at`.
    fn chunk_of(&self, at: u64) -> Option<usize> {
        self.chunks
            .partition_point(|c| c.first <= at)
            .checked_sub(1)
    }

    /// The entry whose start is the greatest at or below `at`.
    fn entry_at_or_below(&self, at: u64) -> Option<&Entry> {
        // A driver's few mappings are one chunk: skipping the chunk search
        // saves ~2 ns of a 64-byte read (`--bench dma_space`, 4 regions).
        let c = match &*self.chunks {
            [only] => &only.entries,
            _ => &self.chunks[self.chunk_of(at)?].entries,
        };
        c.get(c.partition_point(|e| e.start <= at).checked_sub(1)?)
    }

    /// The space with `region` added at its start address. The caller has
    /// checked that it overlaps nothing (the DMA space keeps the ranges).
    pub fn with(&self, region: Region) -> Self {
        let e = Entry {
            start: region.start_addr().raw_value(),
            last: region.last_addr().raw_value(),
            region,
        };
        let i = self.chunk_of(e.start).unwrap_or(0);
        let mut c: Vec<Entry> = self
            .chunks
            .get(i)
            .map_or_else(Vec::new, |c| c.entries.to_vec());
        let j = c.partition_point(|x| x.start < e.start);
        c.insert(j, e);
        let parts = if c.len() > CHUNK {
            let tail = c.split_off(c.len() / 2);
            vec![Chunk::of(c), Chunk::of(tail)]
        } else {
            vec![Chunk::of(c)]
        };
        let mut chunks = self.chunks.to_vec();
        let replaced = usize::from(!chunks.is_empty());
        chunks.splice(i..i + replaced, parts);
        Self {
            chunks: chunks.into(),
            len: self.len + 1,
        }
    }

    /// The space without the regions starting at `starts`.
    pub fn without(&self, starts: impl IntoIterator<Item = u64>) -> Self {
        let gone: BTreeSet<u64> = starts.into_iter().collect();
        if gone.len() * 4 <= self.chunks.len() {
            return gone
                .into_iter()
                .fold(self.clone(), |m, at| m.without_one(at));
        }
        // Many at once (a vIOMMU's whole space): one pass.
        let kept: Vec<Entry> = self
            .chunks
            .iter()
            .flat_map(|c| c.entries.iter())
            .filter(|e| !gone.contains(&e.start))
            .cloned()
            .collect();
        Self {
            len: kept.len(),
            chunks: kept
                .chunks(CHUNK / 2)
                .map(|c| Chunk::of(c.to_vec()))
                .collect(),
        }
    }

    fn without_one(&self, at: u64) -> Self {
        let Some(i) = self.chunk_of(at) else {
            return self.clone();
        };
        let Ok(j) = self.chunks[i]
            .entries
            .binary_search_by_key(&at, |e| e.start)
        else {
            return self.clone();
        };
        let mut c = self.chunks[i].entries.to_vec();
        c.remove(j);
        let mut chunks = self.chunks.to_vec();
        if c.is_empty() {
            chunks.remove(i);
        } else {
            chunks[i] = Chunk::of(c);
        }
        Self {
            chunks: chunks.into(),
            len: self.len - 1,
        }
    }

    /// Whether any region holds a byte of `iova .. iova + len`.
    pub fn overlaps(&self, iova: u64, len: u64) -> bool {
        let Some(last) = len.checked_sub(1).and_then(|l| iova.checked_add(l)) else {
            return len != 0;
        };
        self.entry_at_or_below(last).is_some_and(|e| e.last >= iova)
    }
}

impl GuestMemoryBackend for IovaMemory {
    type R = GuestRegionMmap;

    fn num_regions(&self) -> usize {
        self.len
    }

    // Not #[inline]: inlined into vm-memory's slice iterator it made
    // `next` too large to inline into `read_slice`/`write_slice`, 11-14 ns
    // a 64-byte access (`--bench dma_space`).
    #[inline(never)]
    fn find_region(&self, addr: GuestAddress) -> Option<&GuestRegionMmap> {
        let e = self.entry_at_or_below(addr.raw_value())?;
        (addr.raw_value() <= e.last).then_some(&*e.region)
    }

    fn iter(&self) -> impl Iterator<Item = &GuestRegionMmap> {
        self.chunks
            .iter()
            .flat_map(|c| c.entries.iter())
            .map(|e| &*e.region)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vm_memory::mmap::MmapRegion;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, GuestRegionMmap};

    use super::IovaMemory;

    fn region(at: u64, len: usize) -> Arc<GuestRegionMmap> {
        Arc::new(GuestRegionMmap::new(MmapRegion::new(len).unwrap(), GuestAddress(at)).unwrap())
    }

    /// Lookups land in the right region or none (gaps, past the end);
    /// an access that spans two adjacent regions is split as vm-memory
    /// splits it.
    #[test]
    fn finds_regions_and_gaps() {
        let m = IovaMemory::default()
            .with(region(0x1000, 0x1000))
            .with(region(0x2000, 0x1000))
            .with(region(0x8000, 0x2000));
        assert_eq!(m.num_regions(), 3);
        assert!(m.find_region(GuestAddress(0xfff)).is_none());
        assert_eq!(
            m.find_region(GuestAddress(0x1fff)).unwrap().start_addr(),
            GuestAddress(0x1000)
        );
        assert!(m.find_region(GuestAddress(0x3000)).is_none());
        assert!(m.find_region(GuestAddress(0xa000)).is_none());
        m.write_slice(&[7; 16], GuestAddress(0x1ff8)).unwrap();
        let mut b = [0u8; 16];
        m.read_slice(&mut b, GuestAddress(0x1ff8)).unwrap();
        assert_eq!(b, [7; 16]);
        assert!(m.read_slice(&mut b, GuestAddress(0x2ff8)).is_err());
    }

    /// Hundreds of 4 KiB regions added out of order (chunks split) and
    /// removed one by one and in bulk (chunks emptied, rebuilt): every
    /// lookup agrees with a plain list, and the gaps stay gaps.
    #[test]
    fn agrees_with_a_list_across_chunks() {
        let n = 5 * super::CHUNK as u64;
        // Every third page, in a scrambled order.
        let order: Vec<u64> = (0..n).map(|i| (i * 37) % n).collect();
        let mut m = IovaMemory::default();
        for &i in &order {
            m = m.with(region(0x10_0000 + i * 0x3000, 0x1000));
        }
        assert_eq!(m.num_regions(), n as usize);
        let check = |m: &IovaMemory, present: &dyn Fn(u64) -> bool| {
            for i in 0..n {
                let at = 0x10_0000 + i * 0x3000;
                assert_eq!(
                    m.find_region(GuestAddress(at + 0xfff)).is_some(),
                    present(i),
                    "page {i}"
                );
                assert!(m.find_region(GuestAddress(at + 0x1000)).is_none());
                assert_eq!(m.overlaps(at + 0x800, 0x1000), present(i));
                assert!(!m.overlaps(at + 0x1000, 0x2000));
            }
            let starts: Vec<_> = m.iter().map(|r| r.start_addr().0).collect();
            assert!(starts.windows(2).all(|w| w[0] < w[1]));
            assert_eq!(starts.len(), m.num_regions());
        };
        check(&m, &|_| true);
        // A few at a time: one chunk copied each.
        let few = m.without([0x10_0000, 0x10_0000 + 7 * 0x3000]);
        check(&few, &|i| i != 0 && i != 7);
        // Most of them at once: one pass.
        let odd = m.without(
            (0..n)
                .filter(|i| i % 2 == 0)
                .map(|i| 0x10_0000 + i * 0x3000),
        );
        check(&odd, &|i| i % 2 == 1);
        let none = odd.without((0..n).map(|i| 0x10_0000 + i * 0x3000));
        check(&none, &|_| false);
        assert_eq!(none.num_regions(), 0);
        // The first snapshot still sees everything.
        check(&m, &|_| true);
    }

    /// A snapshot keeps what it saw: later additions and removals make new
    /// values.
    #[test]
    fn snapshots_do_not_change() {
        let a = IovaMemory::default().with(region(0x1000, 0x1000));
        let b = a.with(region(0x4000, 0x1000));
        let c = b.without([0x1000]);
        assert_eq!(
            (a.num_regions(), b.num_regions(), c.num_regions()),
            (1, 2, 1)
        );
        assert!(a.find_region(GuestAddress(0x4000)).is_none());
        assert!(c.find_region(GuestAddress(0x1000)).is_none());
        assert!(b.find_region(GuestAddress(0x1000)).is_some());
    }
}
