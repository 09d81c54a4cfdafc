//! Queue memory: send and receive WQE buffers, CQE, SRQ and EQ rings
//! carved out of a few large DMA chunks.
//!
//! A buffer of its own per queue would cost one memfd and one IOMMU mapping
//! per queue: a few hundred QPs exhaust the default `ulimit -n` of 1024,
//! and thousands of QPs cost thousands of mappings (and `dma_entry_limit`
//! of the type1 IOMMU is 65535). As rdma-core's mlx5 provider and Linux's
//! mlx5 share pages among queues, the arena keeps chunks of at least
//! [`CHUNK_MIN`] (2 MiB huge pages when `HcaOptions::huge_queue_memory` asks and the system has them free), each one
//! [`DmaBuffer`] mapped once at an IOVA aligned to its size, and hands out
//! naturally aligned power-of-two pieces of them (at least 4 KiB: the PRM
//! takes a queue buffer as PAS entries of `log_page_size`, so one aligned
//! piece is one PAS entry, as before). A chunk grows the arena by as much as
//! it holds already (up to [`CHUNK_MAX`]), so ten thousand queues take a
//! handful of chunks.
//!
//! A piece is zeroed when it comes back and returns only when its owner
//! drops it, which every queue does after its DESTROY command succeeded
//! (the owners' `Drop` runs the command, then drops their fields). A piece
//! whose queue could not be destroyed is kept out of use
//! (`DmaSlice::device_may_still_use`) until the function is closed: the
//! device may still write it. An empty chunk is unmapped and closed at
//! once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vfio::{DmaBuffer, DmaRing, Iova, IovaAllocator, IovaRange};

use crate::dma::DmaCtx;
use crate::{Error, Result};

/// The smallest chunk: one 2 MiB huge page.
pub const CHUNK_MIN: usize = 2 << 20;
/// The largest chunk the arena grows by (a larger piece gets a chunk of its
/// own size).
pub const CHUNK_MAX: usize = 32 << 20;

/// What the driver's queue memory holds now: [`crate::hca::Hca::queue_memory`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Chunks: one memfd and one DMA mapping each.
    pub chunks: usize,
    /// Bytes the chunks hold.
    pub chunk_bytes: u64,
    /// Chunks backed by huge pages.
    pub huge_chunks: usize,
    /// Pieces handed out (queue buffers and doorbell-record pages).
    pub pieces: usize,
    /// Bytes of those pieces.
    pub piece_bytes: u64,
    /// Bytes kept out of use because the device may still touch them.
    pub quarantined_bytes: u64,
    /// Pages of doorbell records.
    pub dbrec_pages: usize,
    /// Doorbell records handed out.
    pub dbrecs: usize,
}

/// A piece of a chunk: `len` bytes at `offset` of `buf`, the device's `iova`.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub(crate) buf: Arc<DmaBuffer>,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) iova: Iova,
}

#[derive(Debug)]
struct Chunk {
    buf: Arc<DmaBuffer>,
    iova: Iova,
    free: IovaAllocator,
    pieces: usize,
    bytes: u64,
    quarantined: u64,
}

/// The chunks, by IOVA.
#[derive(Debug, Default)]
pub(crate) struct BufArena {
    chunks: Mutex<BTreeMap<u64, Chunk>>,
    /// Chunks of 2 MiB huge pages when the system has them free
    /// ([`crate::bringup::HcaOptions::huge_queue_memory`]).
    huge: std::sync::atomic::AtomicBool,
}

/// Zeroes `len` bytes at `offset` of `buf`, a page at a time.
pub(crate) fn zero(buf: &DmaBuffer, offset: usize, len: usize) -> Result<()> {
    const Z: [u8; 4096] = [0; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(Z.len());
        buf.write(offset + done, &Z[..n])?;
        done += n;
    }
    Ok(())
}

impl BufArena {
    /// Whether new chunks take 2 MiB huge pages when the system has them.
    pub(crate) fn set_huge(&self, on: bool) {
        self.huge.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Chunk>> {
        self.chunks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A zeroed piece of at least `len` bytes: a power of two of at least
    /// 4 KiB, at an IOVA aligned to its size.
    pub(crate) fn alloc(&self, dma: &DmaCtx, len: usize) -> Result<Piece> {
        let len = vfio::iova::natural_align(len as u64);
        let mut chunks = self.lock();
        for c in chunks.values_mut() {
            if let Ok(iova) = c.free.alloc_aligned(len, len) {
                return Ok(c.take(iova, len));
            }
        }
        let held: u64 = chunks.values().map(|c| c.buf.len() as u64).sum();
        let size = (held as usize)
            .clamp(CHUNK_MIN, CHUNK_MAX)
            .next_power_of_two()
            .max(len as usize);
        let mut c = Chunk::new(dma, size)?;
        let iova = c.free.alloc_aligned(len, len)?;
        let p = c.take(iova, len);
        chunks.insert(c.iova.0, c);
        Ok(p)
    }

    /// Gives `p` back (zeroed for its next user), or keeps it out of use
    /// for good when `quarantine` (the device may still touch it). The
    /// chunk goes when nothing of it is in use.
    pub(crate) fn free(&self, dma: &DmaCtx, p: &Piece, quarantine: bool) {
        let mut chunks = self.lock();
        let Some((&start, c)) = chunks.range_mut(..=p.iova.0).next_back() else {
            tracing::warn!("freeing DMA piece {:#x}: no chunk holds it", p.iova);
            return;
        };
        if p.iova.0 - start >= c.buf.len() as u64 {
            tracing::warn!("freeing DMA piece {:#x}: no chunk holds it", p.iova);
            return;
        }
        if quarantine {
            c.quarantined += p.len as u64;
            return;
        }
        c.pieces -= 1;
        c.bytes -= p.len as u64;
        if c.pieces == 0 {
            if let Some(c) = chunks.remove(&start) {
                drop(chunks);
                c.release(dma);
            }
            return;
        }
        if let Err(e) = zero(&c.buf, p.offset, p.len) {
            tracing::warn!("zeroing DMA piece {:#x}: {e}", p.iova);
        }
        if let Err(e) = c.free.free(p.iova, p.len as u64) {
            tracing::warn!("freeing DMA piece {:#x}: {e}", p.iova);
        }
    }

    /// Unmaps every chunk left (pieces kept out of use): the function is
    /// closed, the device touches nothing any more.
    pub(crate) fn release_all(&self, dma: &DmaCtx) {
        let chunks = std::mem::take(&mut *self.lock());
        for c in chunks.into_values() {
            c.release(dma);
        }
    }

    pub(crate) fn stats(&self) -> ArenaStats {
        let chunks = self.lock();
        ArenaStats {
            chunks: chunks.len(),
            chunk_bytes: chunks.values().map(|c| c.buf.len() as u64).sum(),
            huge_chunks: chunks.values().filter(|c| c.buf.is_huge()).count(),
            pieces: chunks.values().map(|c| c.pieces).sum(),
            piece_bytes: chunks.values().map(|c| c.bytes).sum(),
            quarantined_bytes: chunks.values().map(|c| c.quarantined).sum(),
            ..ArenaStats::default()
        }
    }
}

impl Chunk {
    /// A chunk of `size` bytes (a power of two), mapped at an IOVA aligned
    /// to its size.
    fn new(dma: &DmaCtx, size: usize) -> Result<Self> {
        // Huge pages when asked for and the system has them free, else
        // 4 KiB pages.
        let huge = dma.bufs.huge.load(std::sync::atomic::Ordering::Relaxed);
        let buf = DmaBuffer::with_hugepages(size, huge)?;
        let iova = dma.alloc_iova(size as u64, size as u64)?;
        if let Err(e) = dma.func.dma_map(iova, &buf) {
            dma.free_iova(iova, size as u64);
            return Err(e.into());
        }
        tracing::debug!(
            iova = iova.0,
            size,
            huge = buf.is_huge(),
            "queue memory chunk"
        );
        Ok(Self {
            free: IovaAllocator::new(&[IovaRange {
                start: iova.0,
                last: iova.0 + size as u64 - 1,
            }]),
            buf,
            iova,
            pieces: 0,
            bytes: 0,
            quarantined: 0,
        })
    }

    fn take(&mut self, iova: Iova, len: u64) -> Piece {
        self.pieces += 1;
        self.bytes += len;
        Piece {
            buf: self.buf.clone(),
            offset: (iova.0 - self.iova.0) as usize,
            len: len as usize,
            iova,
        }
    }

    fn release(self, dma: &DmaCtx) {
        let len = self.buf.len() as u64;
        if let Err(e) = dma.func.dma_unmap(self.iova, len) {
            tracing::warn!("dma_unmap({:#x}, {len:#x}): {e}", self.iova);
        }
        dma.free_iova(self.iova, len);
    }
}

/// A queue's buffer: a piece of the arena, given back on drop.
#[derive(Debug)]
pub(crate) struct DmaSlice {
    dma: Arc<DmaCtx>,
    piece: Piece,
    keep: AtomicBool,
}

impl DmaSlice {
    pub(crate) fn new(dma: Arc<DmaCtx>, piece: Piece) -> Self {
        Self {
            dma,
            piece,
            keep: AtomicBool::new(false),
        }
    }

    /// The device's address of the first byte (aligned to [`len`](Self::len)).
    pub(crate) fn iova(&self) -> Iova {
        self.piece.iova
    }

    /// Length in bytes: a power of two, at least 4 KiB.
    pub(crate) fn len(&self) -> usize {
        self.piece.len
    }

    /// The chunk's buffer the slice lies in.
    pub(crate) fn buf(&self) -> &Arc<DmaBuffer> {
        &self.piece.buf
    }

    /// Where the slice starts in [`buf`](Self::buf).
    pub(crate) fn offset(&self) -> usize {
        self.piece.offset
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.piece.len) {
            return Err(Error::Vfio(vfio::Error::OutOfBounds {
                what: "queue buffer",
                offset: off as u64,
                len: len as u64,
                size: self.piece.len as u64,
            }));
        }
        Ok(())
    }

    /// Copies `data` in at `off` of the slice.
    pub(crate) fn write(&self, off: usize, data: &[u8]) -> Result<()> {
        self.check(off, data.len())?;
        Ok(self.piece.buf.write(self.piece.offset + off, data)?)
    }

    /// A ring of `entries` `S`-byte entries from `off` of the slice, which
    /// must hold them all.
    pub(crate) fn ring<const S: usize>(&self, off: usize, entries: u32) -> Result<DmaRing<S>> {
        self.check(off, (entries as usize).saturating_mul(S))?;
        Ok(DmaRing::new(
            self.piece.buf.clone(),
            self.piece.offset + off,
            entries,
        )?)
    }

    /// The queue's DESTROY failed: the device may still write the slice, so
    /// it never goes back to the arena (its chunk stays mapped until the
    /// function is closed).
    pub(crate) fn device_may_still_use(&self) {
        self.keep.store(true, Ordering::Relaxed);
    }
}

impl Drop for DmaSlice {
    fn drop(&mut self) {
        let keep = self.keep.load(Ordering::Relaxed);
        self.dma.bufs.free(&self.dma, &self.piece, keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagealloc::tests::NullFunction;
    use vfio::PciFunction;

    fn ctx() -> (Arc<dyn PciFunction>, Arc<DmaCtx>) {
        let f: Arc<dyn PciFunction> = Arc::new(NullFunction::default());
        let dma = DmaCtx::new(f.clone()).unwrap();
        (f, dma)
    }

    #[test]
    fn pieces_are_aligned_disjoint_and_share_a_few_chunks() {
        let (f, dma) = ctx();
        let sizes = [4096usize, 100, 8192, 64 << 10, 5000, 1 << 20];
        let mut v: Vec<DmaSlice> = (0..3000)
            .map(|i| dma.alloc_buf(sizes[i % sizes.len()]).unwrap())
            .collect();
        let mut spans: Vec<(u64, u64)> = v
            .iter()
            .map(|s| {
                assert!(s.len().is_power_of_two() && s.len() >= 4096);
                assert_eq!(s.iova().0 % s.len() as u64, 0, "naturally aligned");
                (s.iova().0, s.iova().0 + s.len() as u64)
            })
            .collect();
        spans.sort_unstable();
        assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "disjoint");
        let st = dma.queue_memory();
        assert_eq!(st.pieces, 3000);
        assert_eq!(f.dma_mappings(), st.chunks);
        assert!(st.chunks <= 48, "{st:?}");
        assert!(st.chunk_bytes >= st.piece_bytes);
        // A piece is zero when handed out, whoever used the memory before.
        v[7].write(0, &[0xaa; 64]).unwrap();
        let off = (v[7].iova(), v[7].len());
        v.swap_remove(7);
        let again = (0..200)
            .map(|_| dma.alloc_buf(off.1).unwrap())
            .find(|s| s.iova() == off.0)
            .expect("the freed piece is handed out again");
        let mut b = [0xffu8; 64];
        again.buf().read(again.offset(), &mut b).unwrap();
        assert_eq!(b, [0; 64]);
        drop(again);
        v.clear();
        let st = dma.queue_memory();
        assert_eq!((st.chunks, st.pieces, st.piece_bytes), (0, 0, 0), "{st:?}");
        assert_eq!(f.dma_mappings(), 0);
    }

    #[test]
    fn doorbell_records_pack_64_to_a_page() {
        let (f, dma) = ctx();
        let recs: Vec<_> = (0..130).map(|_| dma.alloc_dbrec().unwrap()).collect();
        let st = dma.queue_memory();
        assert_eq!((st.dbrec_pages, st.dbrecs, st.pieces), (3, 130, 3));
        assert_eq!(f.dma_mappings(), 1);
        let mut at: Vec<u64> = recs.iter().map(|r| r.iova().0).collect();
        at.sort_unstable();
        at.dedup();
        assert_eq!(at.len(), 130);
        assert!(at.iter().all(|a| a % 64 == 0));
        // Inside the record, or refused.
        assert!(recs[0].ring::<8>(0).is_ok());
        assert!(recs[0].ring::<4>(60).is_ok());
        assert!(recs[0].ring::<8>(60).is_err());
        drop(recs);
        assert_eq!(dma.queue_memory(), ArenaStats::default());
        assert_eq!(f.dma_mappings(), 0);
    }

    #[test]
    fn a_slice_is_bounded_by_its_piece() {
        let (_f, dma) = ctx();
        let s = dma.alloc_buf(4096).unwrap();
        assert!(s.ring::<64>(0, 64).is_ok());
        assert!(s.ring::<64>(64, 64).is_err(), "past the piece");
        assert!(s.ring::<64>(0, 128).is_err(), "past the piece");
        assert!(s.write(4095, &[1]).is_ok());
        assert!(s.write(4095, &[1, 2]).is_err());
    }

    #[test]
    fn memory_the_device_may_still_use_is_never_reused() {
        let (f, dma) = ctx();
        let a = dma.alloc_buf(4096).unwrap();
        let r = dma.alloc_dbrec().unwrap();
        let kept = (a.iova(), r.iova());
        a.device_may_still_use();
        r.device_may_still_use();
        drop((a, r));
        let st = dma.queue_memory();
        assert_eq!((st.quarantined_bytes, st.dbrecs), (4096, 1));
        let others: Vec<_> = (0..600).map(|_| dma.alloc_buf(4096).unwrap()).collect();
        let recs: Vec<_> = (0..100).map(|_| dma.alloc_dbrec().unwrap()).collect();
        assert!(others.iter().all(|s| s.iova() != kept.0));
        assert!(recs.iter().all(|r| r.iova() != kept.1));
        drop((others, recs));
        assert_eq!(f.dma_mappings(), 1, "the chunk stays mapped");
        // Closing the function (the last user of the context) unmaps it.
        drop(dma);
        assert_eq!(f.dma_mappings(), 0);
    }

    #[test]
    fn zero_clears_across_pages() {
        let b = DmaBuffer::new(3 * 4096).unwrap();
        b.fill(0, 3 * 4096, 0xaa).unwrap();
        zero(&b, 100, 9000).unwrap();
        let mut got = vec![0u8; 3 * 4096];
        b.read(0, &mut got).unwrap();
        assert!(got[..100].iter().all(|&x| x == 0xaa));
        assert!(got[100..9100].iter().all(|&x| x == 0));
        assert!(got[9100..].iter().all(|&x| x == 0xaa));
    }
}
